// Tests for run_launch (executor/comm/launcher.h, what `megaplan launch` runs) with /bin/sh ranks:
// their environment, their stderr forwarded in whole lines, the stop of every rank when one fails,
// the exit code, and the validation of its options.
#include "executor/comm/launcher.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "core/error.h"

namespace megaplan::exec {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// A scratch folder, removed with everything in it.
class TemporaryFolder {
 public:
  TemporaryFolder() {
    std::string pattern = (fs::temp_directory_path() / "megaplan-launch-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TemporaryFolder() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Sets (or unsets) a variable of this process for one test, and puts the old value back.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedVariable() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

LaunchOptions shell_ranks(int64_t ranks, const std::string& script) {
  LaunchOptions options;
  options.nproc_per_node = ranks;
  options.command = {"-c", script};
  return options;
}

// What a rank wrote with `env > folder/rank-$LOCAL_RANK.env`, as a map.
std::map<std::string, std::string> read_environment(const fs::path& file) {
  std::map<std::string, std::string> variables;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    const auto equals = line.find('=');
    if (equals != std::string::npos) variables[line.substr(0, equals)] = line.substr(equals + 1);
  }
  return variables;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// What every file descriptor of this process points to ("pipe:[1234]", "/dev/null", ...).
std::set<std::string> descriptor_targets_of_this_process() {
  std::set<std::string> targets;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const fs::path target = fs::read_symlink(entry.path(), error);
    if (!error) targets.insert(target.string());
  }
  return targets;
}

std::string error_of(const LaunchOptions& options) {
  std::ostringstream err;
  try {
    run_launch(options, "/bin/sh", err);
  } catch (const SpecError& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("launch: every rank gets torchrun's variables and no other launcher's", "[launch_command]") {
  TemporaryFolder folder;
  // Variables an outer launcher left behind; the ranks must not see them ("two launchers at once").
  const ScopedVariable mpi_rank("OMPI_COMM_WORLD_RANK", "5");
  const ScopedVariable mpi_node_rank("OMPI_COMM_WORLD_NODE_RANK", "1");
  const ScopedVariable slurm_rank("SLURM_PROCID", "5");
  const ScopedVariable stale_rank("RANK", "7");
  const ScopedVariable nvls("NCCL_NVLS_ENABLE", nullptr);
  const ScopedVariable kept("MEGAPLAN_LAUNCH_TEST_KEPT", "yes");

  LaunchOptions options = shell_ranks(2, "env > \"$0/rank-$LOCAL_RANK.env\"");
  options.command.push_back(folder.path().string());  // $0 of the script
  options.nnodes = 3;
  options.node_rank = 1;
  options.master_addr = "node-0.cluster";
  options.master_port = 1234;
  std::ostringstream err;
  CHECK(run_launch(options, "/bin/sh", err) == 0);
  CHECK(err.str().empty());

  for (int local_rank = 0; local_rank < 2; ++local_rank) {
    INFO("local rank " << local_rank);
    const auto variables = read_environment(folder.path() / ("rank-" + std::to_string(local_rank) + ".env"));
    CHECK(variables.at("RANK") == std::to_string(2 + local_rank));
    CHECK(variables.at("WORLD_SIZE") == "6");
    CHECK(variables.at("LOCAL_RANK") == std::to_string(local_rank));
    CHECK(variables.at("LOCAL_WORLD_SIZE") == "2");
    CHECK(variables.at("MASTER_ADDR") == "node-0.cluster");
    CHECK(variables.at("MASTER_PORT") == "1234");
    CHECK(variables.at("NCCL_NVLS_ENABLE") == "0");
    CHECK(variables.at("MEGAPLAN_LAUNCH_TEST_KEPT") == "yes");
    CHECK(variables.count("OMPI_COMM_WORLD_RANK") == 0);
    CHECK(variables.count("OMPI_COMM_WORLD_NODE_RANK") == 0);
    CHECK(variables.count("SLURM_PROCID") == 0);
  }
}

TEST_CASE("launch: defaults, and a NCCL_NVLS_ENABLE the user set is kept", "[launch_command]") {
  TemporaryFolder folder;
  const ScopedVariable nvls("NCCL_NVLS_ENABLE", "1");
  LaunchOptions options = shell_ranks(1, "env > \"$0/rank.env\"");
  options.command.push_back(folder.path().string());
  std::ostringstream err;
  CHECK(run_launch(options, "/bin/sh", err) == 0);
  const auto variables = read_environment(folder.path() / "rank.env");
  CHECK(variables.at("RANK") == "0");
  CHECK(variables.at("WORLD_SIZE") == "1");
  CHECK(variables.at("MASTER_ADDR") == "127.0.0.1");
  CHECK(variables.at("MASTER_PORT") == "29500");
  CHECK(variables.at("NCCL_NVLS_ENABLE") == "1");
}

TEST_CASE("launch: one failing rank stops a sleeping sibling at once", "[launch_command]") {
  LaunchOptions options = shell_ranks(3, "if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 3; fi; exec sleep 30");
  std::ostringstream err;
  const auto start = std::chrono::steady_clock::now();
  CHECK(run_launch(options, "/bin/sh", err) == 3);
  CHECK(std::chrono::steady_clock::now() - start < 4s);
  CHECK_THAT(err.str(), Catch::Matchers::Matches("megaplan: launch: rank 1 \\(pid [0-9]+\\) exited with status 3; "
                                                 "stopping the other 2 rank\\(s\\)\n"));
}

TEST_CASE("launch: a rank that ignores SIGTERM is killed after the grace period", "[launch_command]") {
  LaunchOptions options = shell_ranks(2, "if [ \"$RANK\" = 0 ]; then kill -9 $$; fi; trap '' TERM; exec sleep 30");
  options.stop_grace = 300ms;
  std::ostringstream err;
  const auto start = std::chrono::steady_clock::now();
  CHECK(run_launch(options, "/bin/sh", err) == 128 + SIGKILL);
  CHECK(std::chrono::steady_clock::now() - start < 4s);
  CHECK_THAT(err.str(), Catch::Matchers::StartsWith("megaplan: launch: rank 0 (pid ") &&
                            Catch::Matchers::Contains("was killed by signal 9"));
}

TEST_CASE("launch: all ranks succeed, exit 0; a program that cannot run is named", "[launch_command]") {
  std::ostringstream err;
  CHECK(run_launch(shell_ranks(4, "exit 0"), "/bin/sh", err) == 0);
  CHECK(err.str().empty());
  LaunchOptions options = shell_ranks(2, "exit 0");
  CHECK_THROWS_WITH(run_launch(options, "/no/such/program", err),
                    "/no/such/program: cannot start rank 0: No such file or directory");
}

TEST_CASE("launch: SIGTERM to the launcher reaches the ranks", "[launch_command]") {
  // The ranks stand in for the launcher's signaller: rank 0 signals the launcher (its parent).
  LaunchOptions options = shell_ranks(2, "if [ \"$RANK\" = 0 ]; then kill -TERM $PPID; fi; exec sleep 30");
  std::ostringstream err;
  const auto start = std::chrono::steady_clock::now();
  CHECK(run_launch(options, "/bin/sh", err) == 128 + SIGTERM);
  CHECK(std::chrono::steady_clock::now() - start < 4s);
  // Rank 0 may signal before rank 1 has started: then rank 1 never is.
  CHECK_THAT(err.str(), Catch::Matchers::Contains("was killed by signal 15") ||
                            Catch::Matchers::Contains("Terminated while starting the ranks (1 of 2 started)"));
}

TEST_CASE("launch: SIGTERM while the ranks start stops the starting, and every rank started is reaped",
          "[launch_command]") {
  // A SIGTERM already pending when the launcher starts arrives, at the latest, right after its
  // first rank: blocked here and raised, it waits for the launcher's signalfd.
  sigset_t term, caller;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  REQUIRE(::pthread_sigmask(SIG_BLOCK, &term, &caller) == 0);
  ::raise(SIGTERM);
  LaunchOptions options = shell_ranks(8, "exec sleep 30");
  options.stop_grace = 300ms;  // the rank inherits this thread's mask, SIGTERM blocked: SIGKILL ends it
  std::ostringstream err;
  const auto start = std::chrono::steady_clock::now();
  const int code = run_launch(options, "/bin/sh", err);
  ::pthread_sigmask(SIG_SETMASK, &caller, nullptr);
  CHECK(code == 128 + SIGTERM);
  CHECK(std::chrono::steady_clock::now() - start < 4s);
  CHECK(err.str() == "megaplan: launch: Terminated while starting the ranks (1 of 8 started); stopping them\n");
  CHECK(::waitpid(-1, nullptr, WNOHANG) == -1);  // no child left, running or unreaped
  CHECK(errno == ECHILD);
}

TEST_CASE("launch: an error line every rank prints is shown once, whole", "[launch_command]") {
  // Every rank fails the same argument check, as `launch -- train` with a bad flag does. So that
  // each writes its lines whatever the timing, the ranks ignore the launcher's SIGTERM and none
  // writes before all of them do.
  TemporaryFolder folder;
  const std::string error = "megaplan: error: --context-length: must be at least 1, got 0";
  LaunchOptions options = shell_ranks(4,
                                      "trap '' TERM; touch \"$0/ready-$RANK\"; "
                                      "while [ \"$(ls \"$0\" | wc -l)\" -lt 4 ]; do sleep 0.01; done; "
                                      "echo 'note: the same on every rank' >&2; echo '" +
                                          error + "' >&2; exit 2");
  options.command.push_back(folder.path().string());
  std::ostringstream err;
  CHECK(run_launch(options, "/bin/sh", err) == 2);
  std::multiset<std::string> lines;
  std::string launcher_line;
  for (const std::string& line : lines_of(err.str())) {
    if (line.rfind("megaplan: launch: ", 0) == 0) {
      CHECK(launcher_line.empty());
      launcher_line = line;
    } else {
      lines.insert(line);
    }
  }
  CHECK(lines == std::multiset<std::string>{error, "note: the same on every rank", "note: the same on every rank",
                                            "note: the same on every rank", "note: the same on every rank"});
  CHECK_THAT(launcher_line, Catch::Matchers::Matches("megaplan: launch: rank [0-3] \\(pid [0-9]+\\) exited with "
                                                     "status 2(; stopping the other [1-3] rank\\(s\\))?"));
  // The failing rank's error comes before the launcher's line about it.
  CHECK(err.str().find(error) < err.str().find("megaplan: launch: "));
}

TEST_CASE("launch: ranks stopped halfway through the same error line add nothing", "[launch_command]") {
  // The CLI writes an error line in pieces; the SIGTERM that follows the first failure can stop the
  // other ranks between two of them. Here ranks 1 to 3 have written the start of the line before
  // rank 0 writes all of it and fails.
  TemporaryFolder folder;
  LaunchOptions options = shell_ranks(4,
                                      "if [ \"$RANK\" != 0 ]; then printf 'megaplan: error: ' >&2; "
                                      "[ \"$RANK\" = 1 ] || printf %s '--context-length: must' >&2; "
                                      "touch \"$0/started-$RANK\"; exec sleep 30; fi; "
                                      "while [ \"$(ls \"$0\" | wc -l)\" -lt 3 ]; do sleep 0.01; done; "
                                      "echo 'megaplan: error: --context-length: must be at least 1, got 0' >&2; "
                                      "exit 2");
  options.command.push_back(folder.path().string());
  std::ostringstream err;
  CHECK(run_launch(options, "/bin/sh", err) == 2);
  CHECK_THAT(err.str(), Catch::Matchers::Matches("megaplan: error: --context-length: must be at least 1, got 0\n"
                                                 "megaplan: launch: rank 0 \\(pid [0-9]+\\) exited with status 2; "
                                                 "stopping the other 3 rank\\(s\\)\n"));
}

TEST_CASE("launch: long lines of ranks writing at once arrive whole, none lost", "[launch_command]") {
  // Eight lines of 64 KiB a rank: the shell writes each in several pieces, and a rank's lines are
  // more than a pipe holds, so a launcher that read only after the ranks exited would never return.
  constexpr int kRanks = 4;
  constexpr int kLines = 8;
  constexpr size_t kLineBytes = size_t{1} << 16;
  LaunchOptions options = shell_ranks(kRanks,
                                      "fill=$(head -c 65536 /dev/zero | tr '\\0' \"$RANK\"); "
                                      "for line in 1 2 3 4 5 6 7 8; do echo \"rank $RANK line $line $fill\" >&2; done");
  std::ostringstream err;
  REQUIRE(run_launch(options, "/bin/sh", err) == 0);

  // Each line by name where it is whole, so that a failure prints names rather than 64 KiB lines.
  std::vector<std::string> names;
  std::map<std::string, int> last_line_of_rank;
  for (const std::string& line : lines_of(err.str())) {
    std::string word;
    std::string rank = "?";
    int number = 0;
    std::istringstream(line.substr(0, 40)) >> word >> rank >> word >> number;  // "rank R line N ..."
    const std::string whole =
        "rank " + rank + " line " + std::to_string(number) + " " + std::string(kLineBytes, rank[0]);
    if (line == whole) {
      names.push_back("rank " + rank + " line " + std::to_string(number));
      CHECK(number == last_line_of_rank[rank] + 1);  // a rank's lines in the order it wrote them
      last_line_of_rank[rank] = number;
    } else {
      names.push_back("cut: " + line.substr(0, 40) + "... (" + std::to_string(line.size()) + " bytes)");
    }
  }
  std::vector<std::string> expected;
  for (int rank = 0; rank < kRanks; ++rank) {
    for (int line = 1; line <= kLines; ++line) {
      expected.push_back("rank " + std::to_string(rank) + " line " + std::to_string(line));
    }
  }
  std::sort(names.begin(), names.end());
  CHECK(names == expected);
}

TEST_CASE("launch: a last line without a newline still arrives, as a line", "[launch_command]") {
  LaunchOptions options = shell_ranks(3,
                                      "printf 'rank %s: whole\\n' \"$RANK\" >&2; "
                                      "if [ \"$RANK\" = 0 ]; then printf 'rank 0: no newline' >&2; "
                                      "else printf 'megaplan: error: the same, without a newline' >&2; fi");
  std::ostringstream err;
  CHECK(run_launch(options, "/bin/sh", err) == 0);
  std::vector<std::string> lines = lines_of(err.str());
  std::sort(lines.begin(), lines.end());
  CHECK(lines == std::vector<std::string>{"megaplan: error: the same, without a newline", "rank 0: no newline",
                                          "rank 0: whole", "rank 1: whole", "rank 2: whole"});
  CHECK_THAT(err.str(), Catch::Matchers::EndsWith("\n"));
  CHECK(err.str().find("rank 0: whole") < err.str().find("rank 0: no newline"));
}

TEST_CASE("launch: a rank holds its own stderr pipe and no other", "[launch_command]") {
  // Pipes this process had before the launch may reach the ranks; the launcher's own (the ranks'
  // pipes, its signalfd) must not, or a rank's stderr would not end with the rank.
  TemporaryFolder folder;
  const std::set<std::string> allowed = descriptor_targets_of_this_process();
  LaunchOptions options = shell_ranks(3,
                                      "exec > \"$0/rank-$RANK.fds\"; for fd in /proc/$$/fd/*; do "
                                      "printf '%s ' \"${fd##*/}\"; readlink \"$fd\" || echo closed; done");
  options.command.push_back(folder.path().string());
  std::ostringstream err;
  REQUIRE(run_launch(options, "/bin/sh", err) == 0);
  CHECK(err.str().empty());
  std::set<std::string> stderr_pipes;
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank);
    std::ifstream in(folder.path() / ("rank-" + std::to_string(rank) + ".fds"));
    int listed = 0;
    for (std::string line; std::getline(in, line); ++listed) {
      const int fd = std::stoi(line.substr(0, line.find(' ')));
      const std::string target = line.substr(line.find(' ') + 1);
      INFO("fd " << fd << " -> " << target);
      if (fd == 2) {
        CHECK(target.rfind("pipe:", 0) == 0);
        stderr_pipes.insert(target);
      } else if (fd > 2 && (target.rfind("pipe:", 0) == 0 || target.rfind("anon_inode:", 0) == 0)) {
        CHECK(allowed.count(target) == 1);
      }
    }
    CHECK(listed >= 3);
  }
  CHECK(stderr_pipes.size() == 3);  // a pipe of its own for each rank
}

TEST_CASE("launch: bad options name the flag", "[launch_command]") {
  LaunchOptions options = shell_ranks(0, "exit 0");
  CHECK(error_of(options) == "--nproc-per-node: must be at least 1, got 0");
  options = shell_ranks(1, "exit 0");
  options.nnodes = 0;
  CHECK(error_of(options) == "--nnodes: must be at least 1, got 0");
  options.nnodes = 2;
  options.node_rank = 2;
  options.master_addr = "10.0.0.1";
  CHECK(error_of(options) == "--node-rank: must be in 0..1 for --nnodes 2, got 2");
  options.node_rank = 1;
  options.master_port = 65536;
  CHECK(error_of(options) == "--master-port: must be a TCP port in 1..65535, got 65536");
  options.master_port = 29500;
  options.master_addr.reset();
  CHECK(error_of(options) == "--master-addr: --nnodes 2 needs rank 0's host name or address, the same on every node");
  options = shell_ranks(1, "");
  options.command.clear();
  CHECK_THAT(error_of(options), Catch::Matchers::StartsWith("command: nothing after `--`"));
  options.command = {"launch", "--", "train"};
  CHECK_THAT(error_of(options), Catch::Matchers::StartsWith("command: `launch` would start launchers"));
  // Within core's input limits, and a GPU each for ranks that train on one.
  options = shell_ranks(100000, "exit 0");
  CHECK(error_of(options) == "--nproc-per-node: must be at most 1024 (more than any node), got 100000");
  options = shell_ranks(1024, "exit 0");
  options.nnodes = 1024;
  options.master_addr = "10.0.0.1";
  CHECK_THAT(error_of(options), Catch::Matchers::StartsWith("--nnodes: --nproc-per-node 1024 times --nnodes 1024 "
                                                            "ranks: must be at most 262144"));
  options = shell_ranks(4, "");
  options.visible_gpus = 2;
  const ScopedVariable unlisted("CUDA_VISIBLE_DEVICES", nullptr);
  for (const std::vector<std::string>& command : std::vector<std::vector<std::string>>{
           {"train", "--plan", "job.json"}, {"train", "--device", "cuda"}, {"train", "--device=cuda"}}) {
    options.command = command;
    CHECK(error_of(options) ==
          "--nproc-per-node: 4 ranks of `train` on GPUs take one each, and this node shows 2; --device cpu trains "
          "on the CPU");
  }
  options.command = {"profile"};
  CHECK(error_of(options) == "--nproc-per-node: 4 ranks of `profile` on GPUs take one each, and this node shows 2");
  options.command = {"train", "--device", "cpu"};
  CHECK_NOTHROW(validate_launch_options(options));
}

TEST_CASE("launch: the GPUs a node shows are its device nodes, as many as CUDA_VISIBLE_DEVICES lists",
          "[launch_command]") {
  TemporaryFolder devices;
  for (const char* name : {"nvidia0", "nvidia1", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-caps", "null"}) {
    std::ofstream(devices.path() / name);
  }
  const std::string dev = devices.path().string();
  {
    const ScopedVariable unlisted("CUDA_VISIBLE_DEVICES", nullptr);
    CHECK(count_visible_gpus(dev) == 3);
  }
  const std::pair<const char*, int64_t> lists[] = {
      {"", 0}, {"1", 1}, {"0,-1,1", 1}, {"GPU-8d1f,GPU-77aa", 2}, {"0,1,2,3,4,5,6,7", 3}};
  for (const auto& [list, visible] : lists) {
    const ScopedVariable listed("CUDA_VISIBLE_DEVICES", list);
    INFO("CUDA_VISIBLE_DEVICES=" << list);
    CHECK(count_visible_gpus(dev) == visible);
  }
}

}  // namespace megaplan::exec
