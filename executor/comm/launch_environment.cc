// Reads the launcher's variables into a LaunchEnvironment, refusing anything ambiguous: a rank that
// is guessed wrong joins the wrong world and hangs there, far from the cause.
#include "executor/comm/launch_environment.h"

#include <charconv>
#include <cstdlib>
#include <system_error>

#include "core/error.h"

namespace megaplan::exec {
namespace {

// One launcher's variable names. Slurm has no local-size variable of its own (it is derived from
// the tasks-per-node layout), hence the empty local_size there.
struct VariableSet {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

constexpr VariableSet kOpenMpi{"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                               "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr VariableSet kSlurm{"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", ""};
constexpr VariableSet kTorchrun{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};

// A launcher whose set was present, with the names its values came from (for messages).
struct Found {
  VariableSet names;
  std::string local_size_name;  // for Slurm: the variable the local size was read from
  int64_t rank = 0;
  int64_t world_size = 0;
  int64_t local_rank = 0;
  int64_t local_world_size = 0;
};

// Decimal only: "010" would be 8 to strtol with base 0 and 10 to a human; " 1", "+1" and "1e3" are
// typos as often as not. Refusing them all keeps one reading.
int64_t parse_decimal(const std::string& variable, const std::string& text) {
  bool digits_only = !text.empty();
  for (const char c : text) digits_only = digits_only && c >= '0' && c <= '9';
  if (!digits_only || (text.size() > 1 && text[0] == '0')) {
    throw SpecError(variable, "must be a decimal integer (digits only, no sign or leading zero), got \"" + text + "\"");
  }
  int64_t value = 0;
  const std::from_chars_result result = std::from_chars(text.data(), text.data() + text.size(), value);
  if (result.ec == std::errc::result_out_of_range) {
    throw SpecError(variable, "\"" + text + "\" overflows 64 bits");
  }
  return value;
}

std::string value_of(const EnvironmentLookup& getenv, const char* name) { return getenv(name).value_or(""); }

// The number of tasks on node `node` in Slurm's compressed layout, e.g. "4(x2),3": nodes 0 and 1
// run 4 tasks, node 2 runs 3.
std::optional<int64_t> tasks_on_node(const std::string& variable, const std::string& layout,
                                     std::optional<int64_t> node) {
  const std::string rule_prefix = "want Slurm's layout such as \"4(x2),3\", got \"" + layout + "\"";
  std::vector<std::pair<int64_t, int64_t>> entries;  // (tasks, nodes)
  size_t start = 0;
  while (start <= layout.size()) {
    size_t comma = layout.find(',', start);
    if (comma == std::string::npos) comma = layout.size();
    const std::string entry = layout.substr(start, comma - start);
    int64_t tasks = 0;
    int64_t repeat = 1;
    const size_t open = entry.find("(x");
    try {
      if (open == std::string::npos) {
        tasks = parse_decimal(variable, entry);
      } else {
        if (entry.back() != ')') throw SpecError(variable, rule_prefix);
        tasks = parse_decimal(variable, entry.substr(0, open));
        repeat = parse_decimal(variable, entry.substr(open + 2, entry.size() - open - 3));
      }
    } catch (const SpecError&) {
      throw SpecError(variable, rule_prefix);
    }
    entries.emplace_back(tasks, repeat);
    start = comma + 1;
  }
  if (!node) {
    // Without SLURM_NODEID only a uniform layout answers.
    for (const auto& entry : entries) {
      if (entry.first != entries.front().first) return std::nullopt;
    }
    return entries.front().first;
  }
  int64_t first_node = 0;
  for (const auto& [tasks, repeat] : entries) {
    if (*node - first_node < repeat) return tasks;
    first_node += repeat;
  }
  throw SpecError("SLURM_NODEID", std::to_string(*node) + " is beyond the " + std::to_string(first_node) +
                                      " node(s) of " + variable + "=" + layout);
}

int64_t slurm_local_size(const EnvironmentLookup& getenv, std::string& source) {
  std::optional<int64_t> node;
  if (const auto node_text = getenv("SLURM_NODEID")) node = parse_decimal("SLURM_NODEID", *node_text);
  if (const auto layout = getenv("SLURM_TASKS_PER_NODE")) {
    source = "SLURM_TASKS_PER_NODE";
    if (const auto tasks = tasks_on_node(source, *layout, node)) return *tasks;
    if (!getenv("SLURM_NTASKS_PER_NODE")) {
      throw SpecError("SLURM_NODEID",
                      "needed to pick this node's entry of SLURM_TASKS_PER_NODE=" + *layout + ", but not set");
    }
  }
  if (const auto per_node = getenv("SLURM_NTASKS_PER_NODE")) {
    source = "SLURM_NTASKS_PER_NODE";
    return parse_decimal(source, *per_node);
  }
  throw SpecError("SLURM_TASKS_PER_NODE",
                  "srun sets it (or SLURM_NTASKS_PER_NODE) for the number of ranks on this node; "
                  "neither is set beside SLURM_PROCID");
}

// The launcher's set, or nullopt when none of its variables is present.
std::optional<Found> read_set(const EnvironmentLookup& getenv, const VariableSet& names) {
  std::vector<const char*> all = {names.rank, names.size, names.local_rank};
  if (*names.local_size != '\0') all.push_back(names.local_size);
  const char* present = nullptr;
  const char* missing = nullptr;
  for (const char* name : all) {
    if (getenv(name)) {
      if (!present) present = name;
    } else if (!missing) {
      missing = name;
    }
  }
  if (!present) return std::nullopt;
  if (missing) {
    std::string set;
    for (const char* name : all) set += std::string(set.empty() ? "" : ", ") + name;
    throw SpecError(missing, std::string(names.launcher) + " sets " + set + " together; " + present + " is set but " +
                                 missing + " is not");
  }

  Found found;
  found.names = names;
  found.rank = parse_decimal(names.rank, value_of(getenv, names.rank));
  found.world_size = parse_decimal(names.size, value_of(getenv, names.size));
  found.local_rank = parse_decimal(names.local_rank, value_of(getenv, names.local_rank));
  if (*names.local_size != '\0') {
    found.local_size_name = names.local_size;
    found.local_world_size = parse_decimal(names.local_size, value_of(getenv, names.local_size));
  } else {
    found.local_world_size = slurm_local_size(getenv, found.local_size_name);
  }

  auto text = [](const std::string& name, int64_t value) { return name + "=" + std::to_string(value); };
  if (found.world_size < 1) {
    throw SpecError(names.size, "must be at least 1, got " + std::to_string(found.world_size));
  }
  if (found.rank >= found.world_size) {
    throw SpecError(names.rank,
                    "must be below " + text(names.size, found.world_size) + ", got " + std::to_string(found.rank));
  }
  if (found.local_world_size < 1 || found.local_world_size > found.world_size) {
    throw SpecError(found.local_size_name, "must be between 1 and " + text(names.size, found.world_size) + ", got " +
                                               std::to_string(found.local_world_size));
  }
  if (found.local_rank >= found.local_world_size) {
    throw SpecError(names.local_rank, "must be below " + text(found.local_size_name, found.local_world_size) +
                                          ", got " + std::to_string(found.local_rank));
  }
  return found;
}

}  // namespace

LaunchEnvironment detect_launch_environment(const EnvironmentLookup& getenv) {
  // Outermost first: mpirun or srun may start torchrun (or `megaplan launch`), never the reverse.
  std::vector<Found> found;
  for (const VariableSet& names : {kSlurm, kOpenMpi, kTorchrun}) {
    if (auto set = read_set(getenv, names)) found.push_back(std::move(*set));
  }
  for (size_t i = 0; i < found.size(); ++i) {
    for (size_t j = i + 1; j < found.size(); ++j) {
      const Found& outer = found[i];
      const Found& inner = found[j];
      const bool rank_differs = outer.rank != inner.rank;
      if (rank_differs || outer.world_size != inner.world_size) {
        const char* outer_name = rank_differs ? outer.names.rank : outer.names.size;
        const char* inner_name = rank_differs ? inner.names.rank : inner.names.size;
        const int64_t outer_value = rank_differs ? outer.rank : outer.world_size;
        const int64_t inner_value = rank_differs ? inner.rank : inner.world_size;
        throw SpecError(outer_name, "started by two launchers at once: " + std::string(outer_name) + "=" +
                                        std::to_string(outer_value) + " but " + inner_name + "=" +
                                        std::to_string(inner_value) + "; unset one set");
      }
    }
  }

  LaunchEnvironment environment;
  if (!found.empty()) {
    // The sets agree on rank and world size; the innermost launcher (torchrun when present) also
    // knows the node layout it created, so its local rank and size are the ones to trust.
    const Found& chosen = found.back();
    environment.launcher = chosen.names.launcher;
    environment.rank = chosen.rank;
    environment.world_size = chosen.world_size;
    environment.local_rank = chosen.local_rank;
    environment.local_world_size = chosen.local_world_size;
  }

  if (const auto address = getenv("MASTER_ADDR")) {
    if (address->empty()) throw SpecError("MASTER_ADDR", "is set but empty; want rank 0's host name or address");
    environment.master_addr = *address;
  }
  if (const auto port_text = getenv("MASTER_PORT")) {
    const int64_t port = parse_decimal("MASTER_PORT", *port_text);
    if (port < 1 || port > 65535) {
      throw SpecError("MASTER_PORT", "must be a TCP port in 1..65535, got " + *port_text);
    }
    environment.master_port = static_cast<int>(port);
  }
  return environment;
}

LaunchEnvironment detect_launch_environment() {
  return detect_launch_environment([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

const std::vector<std::string>& launch_environment_variables() {
  static const std::vector<std::string> kVariables = [] {
    std::vector<std::string> names;
    for (const VariableSet& set : {kOpenMpi, kSlurm, kTorchrun}) {
      for (const char* name : {set.rank, set.size, set.local_rank, set.local_size}) {
        if (*name != '\0') names.emplace_back(name);
      }
    }
    for (const char* name :
         {"SLURM_NODEID", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "MASTER_ADDR", "MASTER_PORT"}) {
      names.emplace_back(name);
    }
    return names;
  }();
  return kVariables;
}

}  // namespace megaplan::exec
