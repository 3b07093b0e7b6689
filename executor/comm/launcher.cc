// Spawns one node's ranks with posix_spawn and supervises them (`megaplan launch`). Signals are
// taken synchronously (blocked, then read from a signalfd) rather than by handlers, so there is no
// global flag, and a child's exit, a forwarded Ctrl-C, the SIGKILL deadline and the ranks' stderr
// are handled in one poll() loop, on one thread.
#include "executor/comm/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "core/input_limits.h"
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
    // ignoring them: blocking an ignored signal would queue it for the signalfd instead.
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

// posix_spawn's file actions (one rank's), destroyed on every way out.
struct SpawnFileActions {
  SpawnFileActions() { ::posix_spawn_file_actions_init(&value); }
  ~SpawnFileActions() { ::posix_spawn_file_actions_destroy(&value); }
  SpawnFileActions(const SpawnFileActions&) = delete;
  SpawnFileActions& operator=(const SpawnFileActions&) = delete;
  posix_spawn_file_actions_t value{};
};

// A file descriptor, closed on every way out.
class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  ~OwnedFd() { reset(); }
  OwnedFd(OwnedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  OwnedFd& operator=(OwnedFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// Forwards the ranks' stderr to the launcher's a whole line at a time, so that ranks writing at
// once never cut into each other's lines, and forwards an error line that several ranks print alike
// (every rank failing the same argument check) once. Reads never block: the supervision loop polls
// the pipes with its signals, so a rank writing a lot never waits on a launcher that waits on it.
class StderrForwarder {
 public:
  explicit StderrForwarder(std::ostream& err) : err_(err), buffer_(kReadBytes) {}
  StderrForwarder(const StderrForwarder&) = delete;
  StderrForwarder& operator=(const StderrForwarder&) = delete;

  // A pipe for `rank`'s stderr. Returns its write end, which the caller puts on the rank's fd 2 and
  // closes once the rank is spawned; both ends are close-on-exec, so no rank holds another's pipe
  // (and a rank's pipe ends when the rank and what it started have exited). Empty, with errno
  // set, when no pipe can be opened.
  OwnedFd open(int64_t rank) {
    int ends[2] = {-1, -1};
    if (::pipe2(ends, O_CLOEXEC) != 0) return OwnedFd();
    OwnedFd read_end(ends[0]);
    OwnedFd write_end(ends[1]);
    // Non-blocking on the read end only (pipe2's O_NONBLOCK would set both): the rank's fd 2 shares
    // the write end's flags, and a rank writing to a full pipe must wait, not fail.
    const int flags = ::fcntl(read_end.get(), F_GETFL);
    if (flags < 0 || ::fcntl(read_end.get(), F_SETFL, flags | O_NONBLOCK) != 0) return OwnedFd();
    streams_.push_back(Stream{rank, std::move(read_end), {}});
    return write_end;
  }

  // The read ends still open, to poll for input.
  void add_poll_entries(std::vector<pollfd>& entries) const {
    for (const Stream& stream : streams_) {
      if (stream.read_end.get() >= 0) entries.push_back(pollfd{stream.read_end.get(), POLLIN, 0});
    }
  }

  // Forwards the complete lines the pipes hold, without blocking; a pipe at its end has its last
  // line forwarded and is closed.
  void forward_available() {
    for (Stream& stream : streams_) read_stream(stream);
    write_out();
  }

  // After the last rank exited: forwards what is left, a last line without a newline included, and
  // closes every pipe. What a process a rank left behind writes later is not forwarded.
  void finish() {
    for (Stream& stream : streams_) {
      read_stream(stream);
      close_stream(stream);
    }
    write_out();
  }

 private:
  struct Stream {
    int64_t rank = 0;
    OwnedFd read_end;
    std::string pending;  // the start of a line whose newline has not arrived
  };

  static constexpr size_t kReadBytes = size_t{1} << 16;
  // Bounds what one call takes from a rank that writes without pause, so the loop still reaps and
  // forwards signals; more than a pipe holds, so a rank that exited is read to its end in one call.
  static constexpr size_t kMostBytesPerCall = size_t{4} << 20;
  // A line without a newline (binary, a progress bar redrawn with carriage returns) would grow
  // without bound: past this length it is forwarded in pieces.
  static constexpr size_t kLongestLine = size_t{1} << 20;
  static constexpr std::string_view kErrorPrefix = "megaplan: error: ";

  void read_stream(Stream& stream) {
    size_t taken = 0;
    while (stream.read_end.get() >= 0 && taken < kMostBytesPerCall) {
      const ssize_t got = ::read(stream.read_end.get(), buffer_.data(), buffer_.size());
      if (got > 0) {
        take(stream, std::string_view(buffer_.data(), static_cast<size_t>(got)));
        taken += static_cast<size_t>(got);
      } else if (got < 0 && errno == EINTR) {
        continue;
      } else if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        break;
      } else {
        close_stream(stream);  // the end of the pipe, or an error no later read would get past
      }
    }
  }

  // Appends `data` to the stream's pending line and forwards every line it completes.
  void take(Stream& stream, std::string_view data) {
    std::string& pending = stream.pending;
    size_t search_from = pending.size();
    pending.append(data);
    size_t line_start = 0;
    for (size_t newline = pending.find('\n', search_from); newline != std::string::npos;
         newline = pending.find('\n', search_from)) {
      forward_line(stream, std::string_view(pending).substr(line_start, newline - line_start));
      line_start = search_from = newline + 1;
    }
    while (pending.size() - line_start >= kLongestLine) {
      forward_line(stream, std::string_view(pending).substr(line_start, kLongestLine));
      line_start += kLongestLine;
    }
    pending.erase(0, line_start);
  }

  // Forwards the unterminated last line, ended with a newline so that the next rank's line starts
  // on a line of its own, and closes the pipe.
  void close_stream(Stream& stream) {
    if (!stream.pending.empty() && !cuts_short_a_forwarded_error(stream)) forward_line(stream, stream.pending);
    stream.pending.clear();
    stream.read_end.reset();
  }

  // Whether the unterminated last line is the start of an error line another rank's stderr
  // brought: the same error, cut short by the SIGTERM that followed that rank's failure (the CLI
  // writes an error line in several pieces), so a copy.
  bool cuts_short_a_forwarded_error(const Stream& stream) const {
    const std::string& start = stream.pending;
    for (auto line = error_lines_.lower_bound(start);
         line != error_lines_.end() && line->first.compare(0, start.size(), start) == 0; ++line) {
      if (line->second != stream.rank) return true;
    }
    return false;
  }

  // `line` without its newline.
  void forward_line(const Stream& stream, std::string_view line) {
    if (line.substr(0, kErrorPrefix.size()) == kErrorPrefix) {
      const auto [first, inserted] = error_lines_.try_emplace(std::string(line), stream.rank);
      if (!inserted && first->second != stream.rank) return;
    }
    out_.append(line);
    out_.push_back('\n');
  }

  // One write for everything one call forwards: an unbuffered stream (std::cerr) would otherwise
  // write a line and its newline apart.
  void write_out() {
    if (out_.empty()) return;
    err_.write(out_.data(), static_cast<std::streamsize>(out_.size()));
    err_.flush();
    out_.clear();
  }

  std::ostream& err_;
  std::vector<char> buffer_;
  std::vector<Stream> streams_;
  std::map<std::string, int64_t, std::less<>> error_lines_;  // forwarded error line -> its rank
  std::string out_;
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
    return "was killed by signal " + std::to_string(signal_number) + " (" + ::strsignal(signal_number) + ")";
  }
  return "stopped with wait status " + std::to_string(status);
}

// The next SIGINT or SIGTERM waiting in `signal_fd`, if any (SIGCHLDs before it are consumed: the
// supervision loop reaps by polling every child anyway).
std::optional<int> stop_signal(int signal_fd) {
  signalfd_siginfo received{};
  while (::read(signal_fd, &received, sizeof received) == static_cast<ssize_t>(sizeof received)) {
    const int signal_number = static_cast<int>(received.ssi_signo);
    if (signal_number == SIGINT || signal_number == SIGTERM) return signal_number;
  }
  return std::nullopt;
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

int64_t count_visible_gpus(const std::string& devices) {
  int64_t nodes = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(devices, error)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
        name.find_first_not_of("0123456789", 6) == std::string::npos) {
      ++nodes;
    }
  }
  const char* listed = ::getenv("CUDA_VISIBLE_DEVICES");
  if (!listed) return nodes;
  // CUDA reads the list up to its first invalid entry; an empty list hides every device.
  int64_t entries = 0;
  std::string_view rest(listed);
  while (!rest.empty()) {
    const std::string_view entry = rest.substr(0, rest.find(','));
    if (entry.empty() || entry == "-1") break;
    ++entries;
    rest.remove_prefix(std::min(rest.size(), entry.size() + 1));
  }
  return std::min(nodes, entries);
}

namespace {

// Whether `command` (what follows `--`) runs its ranks on GPUs: train on --device cuda, its
// default, and profile.
bool runs_on_gpus(const std::vector<std::string>& command) {
  if (command.front() == "profile") return true;
  if (command.front() != "train") return false;
  std::string device = "cuda";
  for (std::size_t i = 1; i < command.size(); ++i) {
    if (command[i] == "--device" && i + 1 < command.size()) device = command[i + 1];
    if (command[i].rfind("--device=", 0) == 0) device = command[i].substr(9);
  }
  return device == "cuda";
}

}  // namespace

void validate_launch_options(const LaunchOptions& options) {
  if (options.nproc_per_node < 1) {
    throw SpecError("--nproc-per-node", "must be at least 1, got " + std::to_string(options.nproc_per_node));
  }
  if (options.nnodes < 1) {
    throw SpecError("--nnodes", "must be at least 1, got " + std::to_string(options.nnodes));
  }
  require_at_most(options.nproc_per_node, kMaxGpusPerNode, "--nproc-per-node");
  require_at_most(options.nnodes, kMaxWorldSize, "--nnodes");
  if (options.nproc_per_node * options.nnodes > kMaxWorldSize.most) {
    throw SpecError("--nnodes", "--nproc-per-node " + std::to_string(options.nproc_per_node) + " times --nnodes " +
                                    std::to_string(options.nnodes) + " ranks: must be at most " +
                                    std::to_string(kMaxWorldSize.most) + " (" + kMaxWorldSize.why + ")");
  }
  if (options.node_rank < 0 || options.node_rank >= options.nnodes) {
    throw SpecError("--node-rank", "must be in 0.." + std::to_string(options.nnodes - 1) + " for --nnodes " +
                                       std::to_string(options.nnodes) + ", got " + std::to_string(options.node_rank));
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
    throw SpecError("command",
                    "nothing after `--`; name the megaplan command every rank runs, "
                    "e.g. megaplan launch --nproc-per-node 2 -- train ...");
  }
  if (options.command.front() == "launch") {
    throw SpecError("command", "`launch` would start launchers; name the command every rank runs");
  }
  if (runs_on_gpus(options.command)) {
    const int64_t gpus = options.visible_gpus.value_or(count_visible_gpus());
    if (options.nproc_per_node > gpus) {
      const char* listed = ::getenv("CUDA_VISIBLE_DEVICES");
      throw SpecError("--nproc-per-node",
                      std::to_string(options.nproc_per_node) + " ranks of `" + options.command.front() +
                          "` on GPUs take one each, and this node shows " + std::to_string(gpus) +
                          (listed ? " (CUDA_VISIBLE_DEVICES=" + std::string(listed).substr(0, 80) + ")" : "") +
                          (options.command.front() == "train" ? "; --device cpu trains on the CPU" : ""));
    }
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

  // Reads SIGCHLD, SIGINT and SIGTERM, which SignalScope keeps blocked, in the poll() loop.
  const OwnedFd signal_fd(::signalfd(-1, &signals.waited(), SFD_NONBLOCK | SFD_CLOEXEC));
  if (signal_fd.get() < 0) {
    throw SpecError(program, std::string("cannot start the ranks: no signalfd: ") + std::strerror(errno));
  }

  // Declared before the children, so that on an early way out they are killed and reaped before
  // their pipes close.
  StderrForwarder forwarder(err);
  ChildGroup group;
  std::optional<int> first_failure_code;
  Clock::time_point kill_at = Clock::time_point::max();
  for (int64_t local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
    // A Ctrl-C or a scheduler's SIGTERM while the ranks start: start no more, stop those started.
    if (const std::optional<int> signal_number = local_rank > 0 ? stop_signal(signal_fd.get()) : std::nullopt) {
      err << "megaplan: launch: " << ::strsignal(*signal_number) << " while starting the ranks (" << local_rank
          << " of " << options.nproc_per_node << " started); stopping them\n"
          << std::flush;
      first_failure_code = 128 + *signal_number;
      group.signal_running(*signal_number);
      kill_at = Clock::now() + options.stop_grace;
      break;
    }
    const int64_t rank = options.node_rank * options.nproc_per_node + local_rank;
    std::vector<std::string> environment = inherited;
    environment.push_back("RANK=" + std::to_string(rank));
    environment.push_back("WORLD_SIZE=" + std::to_string(world_size));
    environment.push_back("LOCAL_RANK=" + std::to_string(local_rank));
    environment.push_back("LOCAL_WORLD_SIZE=" + std::to_string(options.nproc_per_node));
    environment.push_back("MASTER_ADDR=" + master_addr);
    environment.push_back("MASTER_PORT=" + std::to_string(options.master_port));
    std::vector<char*> envp = pointers(environment);
    OwnedFd stderr_write_end = forwarder.open(rank);
    if (stderr_write_end.get() < 0) {
      throw SpecError(
          program, "cannot start rank " + std::to_string(rank) + ": no pipe for its stderr: " + std::strerror(errno));
    }
    SpawnFileActions file_actions;
    ::posix_spawn_file_actions_adddup2(&file_actions.value, stderr_write_end.get(), STDERR_FILENO);
    pid_t pid = -1;
    const int spawned =
        ::posix_spawn(&pid, program.c_str(), &file_actions.value, &attributes.value, argv.data(), envp.data());
    stderr_write_end.reset();  // the rank holds it now; the pipe ends when the rank's copies close
    if (spawned != 0) {
      // ChildGroup's destructor kills and reaps the ranks already started.
      throw SpecError(program, "cannot start rank " + std::to_string(rank) + ": " + std::strerror(spawned));
    }
    group.children.push_back(Child{pid, rank, true});
  }

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
    // The lines a rank wrote before it exited go out before the line that says it failed.
    forwarder.forward_available();
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

    // Wake on a child's exit, a signal to forward or a rank's stderr; at most every 200 ms
    // regardless, so a SIGCHLD taken by another thread only delays the loop.
    auto wait_for = std::chrono::nanoseconds(std::chrono::milliseconds(200));
    if (!killed && kill_at != Clock::time_point::max()) {
      wait_for = std::clamp<std::chrono::nanoseconds>(kill_at - now, std::chrono::nanoseconds(0), wait_for);
    }
    // Rounded up, so that poll() does not spin through the last fraction of a millisecond.
    const int timeout_ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(wait_for).count());
    std::vector<pollfd> entries = {pollfd{signal_fd.get(), POLLIN, 0}};
    forwarder.add_poll_entries(entries);
    ::poll(entries.data(), entries.size(), timeout_ms);  // EINTR or an error: the loop looks again
    // Ctrl-C in a terminal reaches the ranks directly too (they share the launcher's process
    // group); the forwarded copy is what reaches them when only the launcher is signalled, as a
    // scheduler's kill does.
    while (const std::optional<int> signal_number = stop_signal(signal_fd.get())) {
      group.signal_running(*signal_number);
    }
  }
  forwarder.finish();
  return first_failure_code.value_or(0);
}

}  // namespace megaplan::exec
