// The NCCL communicator on one GPU: a world of one process (NCCL cannot put two ranks of a world on
// one GPU, and one process drives one GPU), through its real bootstrap, split, streams and events.
// With one member every collective is a copy, so what is checked is the plumbing: each call moves
// exactly `count` elements of its type (sentinels around the output stay), runs after the work
// already issued on the compute stream and before the work issued after wait(); then failure: an
// abort, a timeout the watchdog finds, and a process the watchdog ends because its thread is blocked
// on the GPU behind the hung operation. send/recv need a peer: megaplan launch with two GPUs
// covers them (bench/nccl_world_one.sh runs the launchers); all_to_all runs here on two GPUs too,
// as two processes of this program, where two are present.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/comm/nccl_comm.h"
#include "executor/comm/tcp_rendezvous.h"

namespace {

namespace exec = megaplan::exec;
using exec::ReduceOp;
using megaplan::DType;
using namespace std::chrono_literals;

// A world of one has no peer to reach, so the rendezvous opens no socket and the port is unused.
constexpr int kUnusedPort = 29500;
// The compute stream of most tests here: their copies, memsets and host functions use it.
const exec::ComputeStream kLegacyStream = [] { return static_cast<void*>(nullptr); };

std::unique_ptr<exec::NcclWorld> world_of_one(std::chrono::milliseconds timeout = 1min) {
  const exec::IdBroadcast through_tcp = [timeout](const std::vector<uint8_t>& blob) {
    return exec::tcp_broadcast_from_rank0(0, 1, "127.0.0.1", kUnusedPort, blob, timeout);
  };
  return exec::make_nccl_world(0, 1, 0, through_tcp, timeout);
}

// A world whose operations time out after 1 s. The timeout bounds NCCL's host calls as well, and
// the first world of a process pays NCCL's one-time start (about a second): a world made and
// dropped before takes that cost out of the timed one.
std::unique_ptr<exec::NcclWorld> world_timing_out_after_1s() {
  (void)world_of_one();
  return world_of_one(1s);
}

// Device memory holding `bytes`, freed at scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<uint8_t>& bytes) : size_(bytes.size()) {
    REQUIRE(cudaMalloc(&data_, size_) == cudaSuccess);
    REQUIRE(cudaMemcpy(data_, bytes.data(), size_, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return data_; }
  // Read on the legacy default stream, so after whatever the compute stream was ordered after.
  std::vector<uint8_t> read() const {
    std::vector<uint8_t> bytes(size_);
    REQUIRE(cudaMemcpy(bytes.data(), data_, size_, cudaMemcpyDeviceToHost) == cudaSuccess);
    return bytes;
  }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

// `count` elements of `type` with distinct bit patterns (any bits are fine: one member copies).
std::vector<uint8_t> pattern(std::size_t count, DType type, uint8_t seed) {
  std::vector<uint8_t> bytes(count * dtype_bytes(type));
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(seed + 7 * i + (i >> 8));
  return bytes;
}

std::vector<uint8_t> filled(std::size_t bytes, uint8_t value) { return std::vector<uint8_t>(bytes, value); }

std::vector<uint8_t> concat(std::vector<uint8_t> a, const std::vector<uint8_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST_CASE("NCCL: a world of one splits a group and names it", "[gpu][nccl]") {
  const auto world = world_of_one();
  CHECK(world->rank() == 0);
  CHECK(world->world_size() == 1);
  CHECK(world->split(-1, 0, {}, "embedding", kLegacyStream) == nullptr);
  const std::unique_ptr<exec::Comm> comm = world->split(0, 0, {0}, "world", kLegacyStream);
  REQUIRE(comm);
  CHECK(comm->name() == "nccl");
  CHECK(comm->rank() == 0);
  CHECK(comm->size() == 1);
  CHECK(comm->global_ranks() == std::vector<int64_t>{0});
  CHECK_THROWS_AS(world->split(0, 1, {0}, "tp", kLegacyStream), std::invalid_argument);
  DeviceBuffer buffer(filled(4, 0));
  CHECK_THROWS_AS(comm->send(buffer.get(), 1, DType::kFloat32, 0), std::invalid_argument);
  CHECK_THROWS_AS(comm->broadcast(buffer.get(), 1, DType::kFloat32, 1), std::invalid_argument);
}

TEST_CASE("NCCL: every collective moves exactly its elements, fp32 and bf16", "[gpu][nccl]") {
  const auto world = world_of_one();
  const std::unique_ptr<exec::Comm> comm = world->split(0, 0, {0}, "dp", kLegacyStream);
  constexpr std::size_t kCount = 1000;  // not a multiple of anything NCCL likes
  for (const DType type : {DType::kFloat32, DType::kBFloat16}) {
    INFO(to_string(type));
    const std::size_t bytes = kCount * dtype_bytes(type);
    const std::vector<uint8_t> input = pattern(kCount, type, 3);
    const std::vector<uint8_t> sentinel = filled(64, 0xAB);

    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      // In place, with the sentinel behind the data: a reduction of one member leaves the data as it
      // was (bit for bit, NaN patterns included) and touches nothing after it.
      DeviceBuffer data(concat(input, sentinel));
      comm->all_reduce(data.get(), kCount, type, op)->wait();
      CHECK(data.read() == concat(input, sentinel));

      DeviceBuffer source(input);
      DeviceBuffer output(concat(filled(bytes, 0), sentinel));
      comm->reduce_scatter(source.get(), output.get(), kCount, type, op)->wait();
      CHECK(output.read() == concat(input, sentinel));
    }
    DeviceBuffer source(input);
    DeviceBuffer gathered(concat(filled(bytes, 0), sentinel));
    comm->all_gather(source.get(), gathered.get(), kCount, type)->wait();
    CHECK(gathered.read() == concat(input, sentinel));

    DeviceBuffer data(concat(input, sentinel));
    comm->broadcast(data.get(), kCount, type, 0)->wait();
    CHECK(data.read() == concat(input, sentinel));
  }
  comm->barrier();
}

TEST_CASE("NCCL: all_to_all of a world of one moves exactly its own segment", "[gpu][nccl]") {
  const auto world = world_of_one();
  const std::unique_ptr<exec::Comm> comm = world->split(0, 0, {0}, "ep", kLegacyStream);
  for (const std::size_t count : {std::size_t{0}, std::size_t{777}}) {
    INFO(count << " elements");
    const std::vector<uint8_t> input = pattern(count, DType::kBFloat16, 5);
    const std::vector<uint8_t> sentinel = filled(64, 0xCD);
    DeviceBuffer source(concat(input, sentinel));
    DeviceBuffer output(concat(filled(count * 2, 0), sentinel));
    comm->all_to_all(source.get(), {count}, output.get(), {count}, DType::kBFloat16)->wait();
    CHECK(output.read() == concat(input, sentinel));
  }
  DeviceBuffer buffer(filled(8, 0));
  CHECK_THROWS_AS(comm->all_to_all(buffer.get(), {1, 1}, buffer.get(), {1}, DType::kFloat32), std::invalid_argument);
}

namespace {

// Segment sizes of the two-GPU all_to_all: rank `from` sends rank `to` 1000 (from + 2 to) + 3
// elements; element i of it is valued 100 from + 10 to + i mod 7, exact in bf16.
std::size_t two_gpu_segment(int64_t from, int64_t to) { return static_cast<std::size_t>(1000 * (from + 2 * to) + 3); }
std::vector<uint8_t> two_gpu_values(int64_t from, int64_t to) {
  std::vector<uint8_t> bytes(2 * two_gpu_segment(from, to));
  for (std::size_t i = 0; i < two_gpu_segment(from, to); ++i) {
    const uint16_t bits =
        megaplan::float_to_bf16(static_cast<float>(100 * from + 10 * to + static_cast<int64_t>(i % 7)));
    std::memcpy(bytes.data() + 2 * i, &bits, 2);
  }
  return bytes;
}

}  // namespace

// Run by the next test as two processes, one per GPU, ranks of one world over a TCP rendezvous.
TEST_CASE("NCCL: (child process) one rank of a two-GPU all_to_all", "[.][nccl-two-gpu-child]") {
  const char* rank_text = std::getenv("MEGAPLAN_TEST_RANK");
  REQUIRE(rank_text != nullptr);
  const int64_t rank = std::atoi(rank_text);
  const exec::IdBroadcast through_tcp = [rank](const std::vector<uint8_t>& blob) {
    return exec::tcp_broadcast_from_rank0(rank, 2, "127.0.0.1", 29517, blob, 1min);
  };
  const auto world = exec::make_nccl_world(rank, 2, static_cast<int>(rank), through_tcp, 1min);
  const std::unique_ptr<exec::Comm> comm = world->split(0, rank, {0, 1}, "ep", kLegacyStream);
  std::vector<uint8_t> input, expected;
  std::vector<std::size_t> send_counts, recv_counts;
  for (int64_t peer = 0; peer < 2; ++peer) {
    const std::vector<uint8_t> out = two_gpu_values(rank, peer), in = two_gpu_values(peer, rank);
    input.insert(input.end(), out.begin(), out.end());
    expected.insert(expected.end(), in.begin(), in.end());
    send_counts.push_back(two_gpu_segment(rank, peer));
    recv_counts.push_back(two_gpu_segment(peer, rank));
  }
  DeviceBuffer source(input);
  DeviceBuffer output(concat(filled(expected.size(), 0), filled(64, 0xEF)));
  comm->all_to_all(source.get(), send_counts, output.get(), recv_counts, DType::kBFloat16)->wait();
  REQUIRE(output.read() == concat(expected, filled(64, 0xEF)));
}

TEST_CASE("NCCL: all_to_all between two GPUs delivers each uneven segment", "[gpu][nccl]") {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    WARN("fewer than two GPUs: the two-GPU all_to_all is not run");
    return;
  }
  std::vector<pid_t> children;
  for (const char* rank : {"0", "1"}) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    // --warn NoTests: a filter that matched nothing fails the child rather than passing it.
    std::string self = "/proc/self/exe", filter = "[nccl-two-gpu-child]", warn = "--warn", no_tests = "NoTests";
    char* argv[] = {self.data(), filter.data(), warn.data(), no_tests.data(), nullptr};
    std::vector<std::string> variables = {std::string("MEGAPLAN_TEST_RANK=") + rank};
    for (char** variable = environ; *variable != nullptr; ++variable) variables.emplace_back(*variable);
    std::vector<char*> environment;
    for (std::string& variable : variables) environment.push_back(variable.data());
    environment.push_back(nullptr);
    pid_t child = -1;
    const int spawned = ::posix_spawn(&child, "/proc/self/exe", &actions, nullptr, argv, environment.data());
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE(spawned == 0);
    children.push_back(child);
  }
  const auto deadline = std::chrono::steady_clock::now() + 90s;
  for (const pid_t child : children) {
    int status = 0;
    while (::waitpid(child, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (const pid_t other : children) ::kill(other, SIGKILL);
        FAIL("a rank still ran after 90 s");
      }
      std::this_thread::sleep_for(50ms);
    }
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);  // its assertions held
  }
}

TEST_CASE("NCCL: a call runs after its compute stream's earlier work, and wait() orders the stream current then",
          "[gpu][nccl]") {
  const auto world = world_of_one();
  // Non-blocking streams, as the CUDA backend's: nothing orders them against the legacy stream or
  // the communicator's own streams except the communicator's events. The communicator asks which
  // one computes at each call and each wait (a backend's run_pair switches streams in between).
  cudaStream_t streams[2] = {nullptr, nullptr};
  for (cudaStream_t& stream : streams) {
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  }
  cudaStream_t current = streams[0];
  const std::unique_ptr<exec::Comm> comm =
      world->split(0, 0, {0}, "dp", [&current] { return static_cast<void*>(current); });
  // Enough bytes that the first stream's memsets take milliseconds, while the communicator's
  // stream (a stream of its own) would start at once if nothing ordered it.
  constexpr std::size_t kCount = std::size_t{64} << 20;
  const std::size_t bytes = kCount * sizeof(float);
  DeviceBuffer source(filled(bytes, 0));
  DeviceBuffer output(filled(bytes, 0));
  for (int round = 0; round < 20; ++round) {
    REQUIRE(cudaMemsetAsync(source.get(), round, bytes, streams[0]) == cudaSuccess);
  }
  REQUIRE(cudaMemsetAsync(source.get(), 0x3C, bytes, streams[0]) == cudaSuccess);
  const exec::Request scattered =
      comm->reduce_scatter(source.get(), output.get(), kCount, DType::kFloat32, ReduceOp::kSum);
  current = streams[1];
  scattered->wait();
  // A copy on the second stream after wait(): it sees the reduce_scatter's result.
  std::vector<uint8_t> tail(4096);
  REQUIRE(cudaMemcpyAsync(tail.data(), static_cast<uint8_t*>(output.get()) + bytes - tail.size(), tail.size(),
                          cudaMemcpyDeviceToHost, streams[1]) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(streams[1]) == cudaSuccess);
  CHECK(tail == filled(tail.size(), 0x3C));
  REQUIRE(cudaStreamSynchronize(streams[0]) == cudaSuccess);
  for (cudaStream_t stream : streams) REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("NCCL: after abort every call and wait throws CommAborted with the first reason", "[gpu][nccl]") {
  const auto world = world_of_one();
  const std::unique_ptr<exec::Comm> comm = world->split(0, 0, {0}, "dp", kLegacyStream);
  DeviceBuffer data(filled(64, 0));
  const exec::Request issued = comm->all_reduce(data.get(), 16, DType::kFloat32, ReduceOp::kSum);
  world->abort("rank 0: test: the data path failed");
  world->abort("a second reason changes nothing");
  CHECK(world->aborted());
  const auto aborted = Catch::Message("rank 0: test: the data path failed");
  CHECK_THROWS_MATCHES(issued->wait(), exec::CommAborted, aborted);
  CHECK_THROWS_MATCHES(comm->all_reduce(data.get(), 16, DType::kFloat32, ReduceOp::kSum), exec::CommAborted, aborted);
  CHECK_THROWS_MATCHES(comm->all_gather(data.get(), data.get(), 16, DType::kFloat32), exec::CommAborted, aborted);
  CHECK_THROWS_MATCHES(comm->barrier(), exec::CommAborted, aborted);
  CHECK_THROWS_MATCHES(world->split(0, 0, {0}, "tp", kLegacyStream), exec::CommAborted, aborted);
}

TEST_CASE("NCCL: an operation unfinished after the timeout fails the world, naming it", "[gpu][nccl]") {
  {
    const auto world = world_timing_out_after_1s();
    const std::unique_ptr<exec::Comm> comm = world->split(0, 0, {0}, "dp", kLegacyStream);
    DeviceBuffer data(filled(16, 0));
    // The compute stream is held for 3 s by a host function; the all_reduce, ordered after it,
    // cannot finish within the world's 1 s.
    REQUIRE(cudaLaunchHostFunc(
                nullptr, [](void*) { std::this_thread::sleep_for(3s); }, nullptr) == cudaSuccess);
    comm->all_reduce(data.get(), 4, DType::kFloat32, ReduceOp::kSum)->wait();
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    while (!world->aborted() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
    REQUIRE(world->aborted());
    CHECK_THROWS_MATCHES(comm->barrier(), exec::CommAborted,
                         Catch::Message("rank 0: timed out after 1 s in all_reduce(4 fp32, sum) on group dp [0]"));
    // The world ends here, well within the watchdog's grace: the process goes on.
  }
  // The GPU is still usable: nothing was left broken.
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const auto world = world_of_one();
  const std::unique_ptr<exec::Comm> comm = world->split(0, 0, {0}, "dp", kLegacyStream);
  comm->barrier();
}

// Run by the next test in a process of its own, which the watchdog must end: the compute stream is
// held for a minute, and the thread waits for the device behind an operation that cannot finish.
TEST_CASE("NCCL: (child process) blocked on the GPU behind a hung operation", "[.][nccl-watchdog-child]") {
  const auto world = world_timing_out_after_1s();
  const std::unique_ptr<exec::Comm> comm = world->split(0, 0, {0}, "dp", kLegacyStream);
  DeviceBuffer data(filled(16, 0));
  REQUIRE(cudaLaunchHostFunc(
              nullptr, [](void*) { std::this_thread::sleep_for(60s); }, nullptr) == cudaSuccess);
  comm->all_reduce(data.get(), 4, DType::kFloat32, ReduceOp::kSum)->wait();
  (void)cudaDeviceSynchronize();  // no exception reaches this thread for a minute
  FAIL("the watchdog did not end the process");
}

TEST_CASE("NCCL: the watchdog ends a process blocked where no exception reaches it, in one line", "[gpu][nccl]") {
  char stderr_path[] = "/tmp/megaplan-nccl-watchdog-XXXXXX";
  const int stderr_fd = ::mkstemp(stderr_path);
  REQUIRE(stderr_fd >= 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, stderr_fd, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  std::string self = "/proc/self/exe", filter = "[nccl-watchdog-child]";
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t child = -1;
  const int spawned = ::posix_spawn(&child, "/proc/self/exe", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(stderr_fd);
  REQUIRE(spawned == 0);
  // 1 s to find the timeout, 10 s of grace, and the start of a process with a GPU.
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + 40s;
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      FAIL("the child still ran after 40 s");
    }
    std::this_thread::sleep_for(50ms);
  }
  std::ostringstream written;
  written << std::ifstream(stderr_path).rdbuf();
  ::unlink(stderr_path);
  INFO("child's stderr: " << written.str());
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(written.str().find("megaplan: rank 0: timed out after 1 s in all_reduce(4 fp32, sum) on group dp [0]\n") !=
        std::string::npos);
}
