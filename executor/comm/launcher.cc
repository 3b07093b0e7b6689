// Spawns one node's ranks with posix_spawn and supervises them (`megaplan launch`). Signals are
// taken synchronously (blocked, then sigtimedwait) rather than by handlers, so there is no global
// flag and a child's exit, a forwarded Ctrl-C and the SIGKILL deadline are handled in one loop.
#include "executor/comm/launcher.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <string_view>

#include "core/error.h"
#include "executor/comm/launch_environment.h"

extern char** environ;

namespace megaplan::exec {
namespace {

using Clock = std::chrono::steady_clock;

struct Child {
  pid_t pid = -1;
  int64_t rank = 0;
  bool running = false;
};

// Kills and reaps whatever is still running when run_launch leaves early (a spawn that failed, an
// exception), so no rank outlives the launcher.
class ChildGroup {
 public:
  ChildGroup() = default;
  ChildGroup(const ChildGroup&) = delete;
  ChildGroup& operator=(const ChildGroup&) = delete;
  ~ChildGroup() {
    for (Child& child : children) {
      if (!child.running) continue;
      ::kill(child.pid, SIGKILL);
      int status = 0;
      while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }
  void signal_running(int signal_number) const {
    for (const Child& child : children) {
      if (child.running) ::kill(child.pid, signal_number);
    }
  }
  int64_t running_count() const {
    return std::count_if(children.begin(), children.end(), [](const Child& c) { return c.running; });
  }
  std::vector<Child> children;
};

// Blocks the signals run_launch waits for and restores the caller's mask (and a SIGCHLD the
// caller ignored) on the way out.
class SignalScope {
 public:
  SignalScope() {
    sigemptyset(&waited_);
    sigaddset(&waited_, SIGCHLD);
    // A launcher started with SIGINT or SIGTERM ignored (a background job of a script) keeps
    // ignoring them: blocking an ignored signal would queue it for sigtimedwait instead.
    for (const int signal_number : {SIGINT, SIGTERM}) {
      struct sigaction current {};
      if (::sigaction(signal_number, nullptr, &current) == 0 && current.sa_handler != SIG_IGN) {
        sigaddset(&waited_, signal_number);
      }
    }
    // With SIGCHLD ignored the kernel reaps children itself and their exit codes are lost.
    struct sigaction child_action {};
    ::sigaction(SIGCHLD, nullptr, &child_action);
    if (child_action.sa_handler == SIG_IGN) {
      saved_child_action_ = child_action;
      struct sigaction default_action {};
      default_action.sa_handler = SIG_DFL;
      sigemptyset(&default_action.sa_mask);
      ::sigaction(SIGCHLD, &default_action, nullptr);
    }
    ::pthread_sigmask(SIG_BLOCK, &waited_, &caller_mask_);
  }
  ~SignalScope() {
    ::pthread_sigmask(SIG_SETMASK, &caller_mask_, nullptr);
    if (saved_child_action_) ::sigaction(SIGCHLD, &*saved_child_action_, nullptr);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

  const sigset_t& waited() const { return waited_; }
  const sigset_t& caller_mask() const { return caller_mask_; }

 private:
  sigset_t waited_{};
  sigset_t caller_mask_{};
  std::optional<struct sigaction> saved_child_action_;
};

// posix_spawn's attributes, destroyed on every way out.
struct SpawnAttributes {
  SpawnAttributes() { ::posix_spawnattr_init(&value); }
  ~SpawnAttributes() { ::posix_spawnattr_destroy(&value); }
  SpawnAttributes(const SpawnAttributes&) = delete;
  SpawnAttributes& operator=(const SpawnAttributes&) = delete;
  posix_spawnattr_t value{};
};

bool is_stripped(std::string_view name) {
  // The Open MPI prefix covers the variables detect_launch_environment does not read as well
  // (OMPI_COMM_WORLD_NODE_RANK, ...): all describe the launcher's process, not its children.
  if (name.rfind("OMPI_COMM_WORLD_", 0) == 0) return true;
  const auto& names = launch_environment_variables();
  return std::find(names.begin(), names.end(), name) != names.end();
}

// This process's environment without any launcher's rank variables.
std::vector<std::string> inherited_environment() {
  std::vector<std::string> environment;
  bool nvls_set = false;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const std::string_view name = text.substr(0, text.find('='));
    if (is_stripped(name)) continue;
    nvls_set = nvls_set || name == "NCCL_NVLS_ENABLE";
    environment.emplace_back(text);
  }
  // NVLink SHARP multicast stays off on our machines unless the user asks for it explicitly.
  if (!nvls_set) environment.emplace_back("NCCL_NVLS_ENABLE=0");
  return environment;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> result;
  for (std::string& text : strings) result.push_back(text.data());
  result.push_back(nullptr);
  return result;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int signal_number = WTERMSIG(status);
    return "was killed by signal " + std::to_string(signal_number) + " (" +
           ::strsignal(signal_number) + ")";
  }
  return "stopped with wait status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

void validate_launch_options(const LaunchOptions& options) {
  if (options.nproc_per_node < 1) {
    throw SpecError("--nproc-per-node", "must be at least 1, got " + std::to_string(options.nproc_per_node));
  }
  if (options.nnodes < 1) {
    throw SpecError("--nnodes", "must be at least 1, got " + std::to_string(options.nnodes));
  }
  if (options.nproc_per_node > std::numeric_limits<int64_t>::max() / options.nnodes) {
    throw SpecError("--nnodes", "--nproc-per-node " + std::to_string(options.nproc_per_node) +
                                    " times --nnodes " + std::to_string(options.nnodes) +
                                    " overflows 64 bits");
  }
  if (options.node_rank < 0 || options.node_rank >= options.nnodes) {
    throw SpecError("--node-rank", "must be in 0.." + std::to_string(options.nnodes - 1) +
                                       " for --nnodes " + std::to_string(options.nnodes) + ", got " +
                                       std::to_string(options.node_rank));
  }
  if (options.master_port < 1 || options.master_port > 65535) {
    throw SpecError("--master-port", "must be a TCP port in 1..65535, got " + std::to_string(options.master_port));
  }
  if (options.master_addr && options.master_addr->empty()) {
    throw SpecError("--master-addr", "must name rank 0's host, got an empty string");
  }
  if (options.nnodes > 1 && !options.master_addr) {
    throw SpecError("--master-addr", "--nnodes " + std::to_string(options.nnodes) +
                                         " needs rank 0's host name or address, the same on every node");
  }
  if (options.command.empty()) {
    throw SpecError("command", "nothing after `--`; name the megaplan command every rank runs, "
                               "e.g. megaplan launch --nproc-per-node 2 -- train ...");
  }
  if (options.command.front() == "launch") {
    throw SpecError("command", "`launch` would start launchers; name the command every rank runs");
  }
}

int run_launch(const LaunchOptions& options, const std::string& program, std::ostream& err) {
  validate_launch_options(options);
  const std::string master_addr = options.master_addr.value_or("127.0.0.1");
  const int64_t world_size = options.nproc_per_node * options.nnodes;

  std::vector<std::string> arguments = {program};
  arguments.insert(arguments.end(), options.command.begin(), options.command.end());
  std::vector<char*> argv = pointers(arguments);
  const std::vector<std::string> inherited = inherited_environment();

  const SignalScope signals;
  SpawnAttributes attributes;
  // Children start with the caller's mask, not the blocked one this loop needs.
  ::posix_spawnattr_setsigmask(&attributes.value, &signals.caller_mask());
  ::posix_spawnattr_setflags(&attributes.value, POSIX_SPAWN_SETSIGMASK);

  ChildGroup group;
  for (int64_t local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
    const int64_t rank = options.node_rank * options.nproc_per_node + local_rank;
    std::vector<std::string> environment = inherited;
    environment.push_back("RANK=" + std::to_string(rank));
    environment.push_back("WORLD_SIZE=" + std::to_string(world_size));
    environment.push_back("LOCAL_RANK=" + std::to_string(local_rank));
    environment.push_back("LOCAL_WORLD_SIZE=" + std::to_string(options.nproc_per_node));
    environment.push_back("MASTER_ADDR=" + master_addr);
    environment.push_back("MASTER_PORT=" + std::to_string(options.master_port));
    std::vector<char*> envp = pointers(environment);
    pid_t pid = -1;
    const int spawned = ::posix_spawn(&pid, program.c_str(), nullptr, &attributes.value, argv.data(), envp.data());
    if (spawned != 0) {
      // ChildGroup's destructor kills and reaps the ranks already started.
      throw SpecError(program, "cannot start rank " + std::to_string(rank) + ": " + std::strerror(spawned));
    }
    group.children.push_back(Child{pid, rank, true});
  }

  std::optional<int> first_failure_code;
  Clock::time_point kill_at = Clock::time_point::max();
  bool killed = false;
  while (group.running_count() > 0) {
    // Reap everything that exited before reporting, so the line counts only ranks still running
    // and, of ranks failing together, names the lowest.
    const Child* failed_child = nullptr;
    int failed_status = 0;
    for (Child& child : group.children) {
      if (!child.running) continue;
      int status = 0;
      const pid_t reaped = ::waitpid(child.pid, &status, WNOHANG);
      if (reaped == 0 || (reaped < 0 && errno == EINTR)) continue;
      child.running = false;
      if (reaped < 0) status = 0xff00;  // cannot happen with SIGCHLD not ignored; counts as exit 255
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && !failed_child) {
        failed_child = &child;
        failed_status = status;
      }
    }
    if (failed_child && !first_failure_code) {
      first_failure_code = exit_code_of(failed_status);
      const int64_t others = group.running_count();
      err << "megaplan: launch: rank " << failed_child->rank << " (pid " << failed_child->pid << ") "
          << describe_status(failed_status);
      if (others > 0) err << "; stopping the other " << others << " rank(s)";
      err << '\n' << std::flush;
      group.signal_running(SIGTERM);
      kill_at = Clock::now() + options.stop_grace;
    }
    if (group.running_count() == 0) break;
    const Clock::time_point now = Clock::now();
    if (!killed && now >= kill_at) {
      group.signal_running(SIGKILL);  // they had their grace period
      killed = true;
    }

    // Wake on a child's exit or a signal to forward; at most every 200 ms regardless, so a SIGCHLD
    // taken by another thread only delays the loop.
    auto wait_for = std::chrono::nanoseconds(std::chrono::milliseconds(200));
    if (!killed && kill_at != Clock::time_point::max()) {
      wait_for = std::clamp<std::chrono::nanoseconds>(kill_at - now, std::chrono::nanoseconds(0), wait_for);
    }
    timespec timeout{};
    timeout.tv_sec = static_cast<time_t>(wait_for.count() / 1'000'000'000);
    timeout.tv_nsec = static_cast<long>(wait_for.count() % 1'000'000'000);
    const int received = ::sigtimedwait(&signals.waited(), nullptr, &timeout);
    // Ctrl-C in a terminal reaches the ranks directly too (they share the launcher's process
    // group); the forwarded copy is what reaches them when only the launcher is signalled, as a
    // scheduler's kill does.
    if (received == SIGINT || received == SIGTERM) group.signal_running(received);
  }
  return first_failure_code.value_or(0);
}

}  // namespace megaplan::exec
