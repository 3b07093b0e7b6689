// Reading nccl-tests' text output (see nccl_tests.h).
#include "simulator/nccl_tests.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"

namespace megaplan::sim {

namespace {

constexpr const char* kFlag = "--import-nccl-tests";

std::vector<std::string> words(const std::string& line) {
  std::istringstream stream(line);
  std::vector<std::string> result;
  for (std::string word; stream >> word;) result.push_back(word);
  return result;
}

template <typename Number>
bool parse_number(const std::string& text, Number& value) {
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  return error == std::errc() && stop == end;
}

int64_t dtype_bytes(const std::string& type) {
  static const std::map<std::string, int64_t> kBytes = {
      {"int8", 1}, {"uint8", 1}, {"int32", 4},  {"uint32", 4},   {"int64", 8},    {"uint64", 8},
      {"half", 2}, {"float", 4}, {"double", 8}, {"bfloat16", 2}, {"fp8_e4m3", 1}, {"fp8_e5m2", 1}};
  const auto found = kBytes.find(type);
  return found == kBytes.end() ? 0 : found->second;
}

// The column positions the header line gives.
struct Columns {
  std::size_t redop = 0, root = 0, time = 0, busbw = 0;
  bool has_root = false;
  std::size_t needed() const { return std::max({redop, root, time, busbw}) + 1; }
};

bool read_header(const std::vector<std::string>& header, Columns& columns) {
  // "#", then the names; positions in a row are one less.
  bool redop = false, time = false, busbw = false;
  for (std::size_t i = 1; i < header.size(); ++i) {
    const std::string& name = header[i];
    const std::size_t at = i - 1;
    if (name == "redop") {
      redop = true;
      columns.redop = at;
    } else if (name == "root") {
      columns.has_root = true;
      columns.root = at;
    } else if (name == "time" && !time) {  // the first is out of place
      time = true;
      columns.time = at;
    } else if (name == "busbw" && !busbw) {
      busbw = true;
      columns.busbw = at;
    }
  }
  return redop && time && busbw && header.size() > 2 && header[1] == "size" && header[2] == "count";
}

}  // namespace

NcclTestsRun read_nccl_tests(const std::string& text, const std::string& file) {
  const auto fail = [&](const std::string& why) -> SpecError { return SpecError(kFlag, file + ": " + why); };
  NcclTestsRun run;
  run.file = file;
  std::set<std::string> hosts, devices;
  Columns columns;
  bool header = false;
  std::istringstream lines(text);
  int64_t line_number = 0;
  for (std::string line; std::getline(lines, line);) {
    ++line_number;
    const std::vector<std::string> w = words(line);
    if (w.empty()) continue;
    if (w[0] == "#") {
      if (w.size() > 1 && w[1] == "Rank") {
        // "#  Rank  0 Group  0 Pid 6899 on HOST device  0 [0000:04:00] NVIDIA H100 80GB HBM3"
        const auto on = std::find(w.begin(), w.end(), "on");
        const auto bus = std::find_if(w.begin(), w.end(), [](const std::string& s) { return s.front() == '['; });
        if (on == w.end() || on + 1 == w.end() || bus == w.end() || bus + 1 == w.end()) {
          throw fail("line " + std::to_string(line_number) + ": a rank line without its host and device");
        }
        hosts.insert(*(on + 1));
        std::string device;
        for (auto word = bus + 1; word != w.end(); ++word) device += (device.empty() ? "" : " ") + *word;
        devices.insert(device);
        ++run.group_size;
      } else if (read_header(w, columns)) {
        header = true;
      }
      continue;
    }
    if (!header) continue;  // nccl-tests prints nothing else unmarked before its table
    const std::string where = "line " + std::to_string(line_number) + ": ";
    if (w.size() < columns.needed()) throw fail(where + "a row with fewer columns than its header");
    int64_t size = 0, count = 0;
    double microseconds = 0, busbw = 0;
    if (!parse_number(w[0], size) || !parse_number(w[1], count) || !parse_number(w[columns.time], microseconds) ||
        !parse_number(w[columns.busbw], busbw) || size < 0 || count < 0 || !(microseconds >= 0) || !(busbw >= 0)) {
      throw fail(where + "size, count, time and busbw must be non-negative numbers");
    }
    int64_t root = -1;
    if (columns.has_root && !parse_number(w[columns.root], root)) throw fail(where + "root must be an integer");
    if (root >= 0) throw fail("a rooted test (reduce, broadcast): megaplan models none");
    const int64_t bytes = dtype_bytes(w[2]);
    if (bytes == 0) throw fail(where + "unknown data type \"" + w[2] + "\"");
    if (size == 0 || count == 0) continue;
    if (run.group_size < 2) throw fail("no \"# Rank\" lines for at least 2 ranks before the table");
    const bool reduces = w[columns.redop] != "none";
    CollectiveOp op;
    if (size == count * bytes) {
      op = reduces ? CollectiveOp::kAllReduce : CollectiveOp::kSendRecv;
    } else if (size == count * bytes * run.group_size) {
      const bool all_to_all =
          file.find("alltoall") != std::string::npos || file.find("all_to_all") != std::string::npos;
      op = reduces ? CollectiveOp::kReduceScatter : all_to_all ? CollectiveOp::kAllToAll : CollectiveOp::kAllGather;
    } else {
      throw fail(where + "size " + std::to_string(size) + " is neither count x type nor count x type x " +
                 std::to_string(run.group_size) + " ranks");
    }
    if (run.op && op != *run.op) {
      throw fail(where + "a " + to_string(op) + " row in a " + to_string(*run.op) + " table");
    }
    run.op = op;
    if (op == CollectiveOp::kSendRecv) {
      if (microseconds > 0) run.seconds.emplace_back(size, microseconds * 1e-6);
    } else if (busbw > 0) {
      run.bus_bandwidth.emplace_back(size, busbw * 1e9);
    }
  }
  if (!header) throw fail("no nccl-tests table (a \"#  size  count  type  redop ...\" header)");
  if (!run.op || (run.bus_bandwidth.empty() && run.seconds.empty())) throw fail("no rows with bytes and a time");
  if (devices.size() != 1) throw fail("ranks on " + std::to_string(devices.size()) + " GPU types; one type per file");
  run.device = *devices.begin();
  run.link = hosts.size() == 1 ? "nvlink" : "network";
  return run;
}

void replace_link_entries(nlohmann::json& profile, const std::string& table, const nlohmann::json& fresh) {
  const bool by_link_only = table == "p2p";
  const auto same = [&](const nlohmann::json& a, const nlohmann::json& b) {
    return a.value("link", "") == b.value("link", "") &&
           (by_link_only || (a.value("op", "") == b.value("op", "") &&
                             a.value("group_size", int64_t{0}) == b.value("group_size", int64_t{0})));
  };
  nlohmann::json kept = nlohmann::json::array();
  if (profile.contains(table) && profile[table].is_array()) {
    for (const nlohmann::json& entry : profile[table]) {
      if (std::none_of(fresh.begin(), fresh.end(), [&](const nlohmann::json& added) { return same(entry, added); })) {
        kept.push_back(entry);
      }
    }
  }
  for (const nlohmann::json& entry : fresh) kept.push_back(entry);
  profile[table] = std::move(kept);
}

nlohmann::json with_link_tables(nlohmann::json profile, const std::vector<NcclTestsRun>& runs) {
  for (const char* key : {"collectives", "p2p"}) replace_link_entries(profile, key, nlohmann::json::array());
  for (const NcclTestsRun& run : runs) {
    nlohmann::json fresh = nlohmann::json::array();
    if (run.op == CollectiveOp::kSendRecv) {
      for (const auto& [bytes, seconds] : run.seconds)
        fresh.push_back({{"link", run.link}, {"bytes", bytes}, {"seconds", seconds}});
      replace_link_entries(profile, "p2p", fresh);
    } else {
      for (const auto& [bytes, rate] : run.bus_bandwidth) {
        fresh.push_back({{"op", to_string(*run.op)},
                         {"group_size", run.group_size},
                         {"link", run.link},
                         {"bytes", bytes},
                         {"bus_bandwidth_bytes_per_s", rate}});
      }
      replace_link_entries(profile, "collectives", fresh);
    }
  }
  return profile;
}

}  // namespace megaplan::sim
