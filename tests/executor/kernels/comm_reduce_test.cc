// The in-process one-GPU communicator against the CPU one. First its reduction kernel
// (executor/kernels/cuda/comm_reduce.h) against a CPU InProcessMemory lane's reduce on random data:
// the same bits for fp32, bf16 and fp16, sum and max, 1 to 5 inputs, odd sizes, in place, with NaNs,
// infinities and signed zeros (a NaN may differ only in its payload). Then one program of every
// collective and of sends and receives, run by ranks as threads on a world of each memory (device
// buffers, and a compute stream of each rank's own, for the GPU one), each step reading the last
// one's result (all_to_all's uneven segments among them): every rank ends with the CPU world's bytes.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <list>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "executor/comm/in_process_comm.h"
#include "executor/comm/in_process_gpu_memory.h"
#include "executor/comm/rank_threads.h"
#include "executor/kernels/cuda/bf16_linear.h"
#include "executor/kernels/cuda/comm_reduce.h"
#include "executor/kernels/cuda/stream.h"

namespace {

namespace exec = megaplan::exec;
namespace cu = megaplan::exec::cuda;
using exec::ReduceOp;
using megaplan::DType;
using Bytes = std::vector<std::byte>;

// Values as a buffer of `type` (bf16 and fp16 round to nearest even) and back.
Bytes encode(const std::vector<float>& values, DType type) {
  Bytes bytes(values.size() * dtype_bytes(type));
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (type == DType::kFloat32) {
      std::memcpy(bytes.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t bits = megaplan::float_to_half(values[i], type);
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    }
  }
  return bytes;
}

std::vector<float> decode(const Bytes& bytes, DType type) {
  const std::size_t count = bytes.size() / dtype_bytes(type);
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (type == DType::kFloat32) {
      std::memcpy(&values[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, bytes.data() + 2 * i, 2);
      values[i] = megaplan::half_to_float(bits, type);
    }
  }
  return values;
}

// Device copies of raw bytes, through the float upload (padded to whole floats).
void* upload(const Bytes& bytes, cudaStream_t stream) {
  std::vector<float> words((bytes.size() + 3) / 4, 0.0f);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  return cu::upload_floats(words, stream);
}

Bytes download(const void* device, std::size_t bytes, cudaStream_t stream) {
  const std::vector<float> words = cu::download_floats(static_cast<const float*>(device), (bytes + 3) / 4, stream);
  Bytes result(bytes);
  std::memcpy(result.data(), words.data(), bytes);
  return result;
}

// How many elements differ: bits differ, unless both are NaN.
std::size_t mismatches(const Bytes& got, const Bytes& want, DType type) {
  REQUIRE(got.size() == want.size());
  const std::vector<float> a = decode(got, type), b = decode(want, type);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const bool same = std::isnan(a[i]) ? std::isnan(b[i]) : std::memcmp(&a[i], &b[i], 4) == 0;
    bad += same ? 0 : 1;
  }
  return bad;
}

// Element i of input r: magnitudes over 2^-20 .. 2^20, so a sum's float value depends on its order
// of terms; a few special values where there is room.
std::vector<float> random_input(std::size_t count, std::size_t r, std::mt19937& generator) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<float> values(count);
  for (float& value : values) value = std::ldexp(normal(generator), exponent(generator));
  if (count >= 16) {
    values[3] = r == 1 ? std::numeric_limits<float>::quiet_NaN() : values[3];
    values[5] = r % 2 ? -0.0f : 0.0f;
    values[7] = r == 0 ? std::numeric_limits<float>::infinity() : values[7];
    values[9] = r == 0 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
    values[11] = std::numeric_limits<float>::max();  // the sum overflows to infinity
  }
  return values;
}

}  // namespace

TEST_CASE("comm_reduce gives the CPU memory's reduction, bit for bit", "[gpu][comm]") {
  const std::unique_ptr<exec::InProcessMemory> cpu_memory = exec::make_in_process_cpu_memory();
  const std::unique_ptr<exec::Lane> cpu = cpu_memory->make_lane();
  std::mt19937 generator(11);
  const cu::Stream stream;
  // fp16's range ends at 65504: its inputs hold infinities and zeros where the others do not.
  for (const DType type : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      for (const std::size_t ranks : {1, 2, 3, 5}) {
        for (const std::size_t count : {1, 37, 1000, 4099}) {
          INFO(to_string(type) << (op == ReduceOp::kSum ? " sum" : " max") << ", " << ranks << " inputs, " << count
                               << " elements");
          std::vector<Bytes> inputs;
          std::vector<const void*> host_inputs, device_inputs;
          for (std::size_t r = 0; r < ranks; ++r) inputs.push_back(encode(random_input(count, r, generator), type));
          for (const Bytes& input : inputs) {
            host_inputs.push_back(input.data());
            device_inputs.push_back(upload(input, stream));
          }
          const std::size_t bytes = inputs[0].size();
          Bytes want(bytes);
          cpu->reduce(want.data(), host_inputs, count, type, op);

          void* device_output = upload(Bytes(bytes, std::byte{0x7f}), stream);  // poisoned
          cu::comm_reduce(device_output, device_inputs, count, type, op, stream);
          CHECK(mismatches(download(device_output, bytes, stream), want, type) == 0);
          // In place, into the last input.
          void* last = const_cast<void*>(device_inputs.back());
          cu::comm_reduce(last, device_inputs, count, type, op, stream);
          CHECK(mismatches(download(last, bytes, stream), want, type) == 0);

          cu::free_device(device_output);
          for (const void* input : device_inputs) cu::free_device(const_cast<void*>(input));
        }
      }
    }
  }
  CHECK_THROWS_AS(cu::comm_reduce(nullptr, {}, 1, DType::kFloat32, ReduceOp::kSum, stream), std::invalid_argument);
}

namespace {

// One rank's buffers, on the host or on the device, and what it saw. On the device the rank has a
// compute stream of its own, as a rank's backend does: its uploads and downloads run there, and
// its communicator orders the world's work against it.
class RankSpace {
 public:
  explicit RankSpace(bool on_gpu) {
    if (on_gpu) stream_.emplace();
  }
  ~RankSpace() {
    for (void* device : device_) cu::free_device(device);
  }
  RankSpace(const RankSpace&) = delete;
  RankSpace& operator=(const RankSpace&) = delete;
  // On the device the bytes land a few milliseconds late, behind a host function holding the
  // stream: a collective or send that did not wait for the rank's stream would read the buffer
  // before they arrive.
  void* put(const Bytes& bytes) {
    if (stream_) {
      // (Catch's assertions are not for rank threads: a failure throws, and the rank's exception
      // reaches the test.)
      const auto hold = [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(3)); };
      if (cudaLaunchHostFunc(*stream_, hold, nullptr) != cudaSuccess) throw std::runtime_error("cudaLaunchHostFunc");
      return device_.emplace_back(upload(bytes, *stream_));
    }
    return host_.emplace_back(bytes).data();
  }
  Bytes get(const void* buffer, std::size_t bytes) const {
    if (stream_) return download(buffer, bytes, *stream_);
    const auto* begin = static_cast<const std::byte*>(buffer);
    return Bytes(begin, begin + bytes);
  }
  // What world.group takes: the rank's stream, or null on the host.
  void* compute_stream() const { return stream_ ? static_cast<cudaStream_t>(*stream_) : nullptr; }
  std::vector<Bytes> seen;

 private:
  std::optional<cu::Stream> stream_;
  std::list<Bytes> host_;  // stable addresses
  std::vector<void*> device_;
};

Bytes values_of(int64_t rank, std::size_t salt, std::size_t count, DType type) {
  std::mt19937 generator(static_cast<unsigned>(1000 * rank + salt));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<float> values(count);
  for (float& value : values) value = std::ldexp(normal(generator), exponent(generator));
  return encode(values, type);
}

// Every collective and a ring of sends, each step reading the previous step's output. Records the
// bytes of every result.
void program(exec::InProcessWorld& world, int64_t rank, int64_t ranks, RankSpace& space) {
  std::vector<int64_t> members;
  for (int64_t r = 0; r < ranks; ++r) members.push_back(r);
  const std::unique_ptr<exec::Comm> comm =
      world.group(rank, members, "test", [&space] { return space.compute_stream(); });
  space.seen.push_back(
      encode({static_cast<float>(comm->name() == "in-process-" + world.memory().name())}, DType::kFloat32));
  const auto n = static_cast<std::size_t>(ranks);
  const auto me = static_cast<std::size_t>(rank);
  constexpr std::size_t kCount = 1000;

  // all_reduce in place (fp32 sum), then bf16 max, then fp16 sum.
  void* reduced = space.put(values_of(rank, 1, kCount, DType::kFloat32));
  comm->all_reduce(reduced, kCount, DType::kFloat32, ReduceOp::kSum)->wait();
  space.seen.push_back(space.get(reduced, kCount * 4));
  void* maximum = space.put(values_of(rank, 2, 37, DType::kBFloat16));
  comm->all_reduce(maximum, 37, DType::kBFloat16, ReduceOp::kMax)->wait();
  space.seen.push_back(space.get(maximum, 37 * 2));
  void* half_sum = space.put(values_of(rank, 4, 37, DType::kFloat16));
  comm->all_reduce(half_sum, 37, DType::kFloat16, ReduceOp::kSum)->wait();
  space.seen.push_back(space.get(half_sum, 37 * 2));

  // reduce_scatter of the all_reduce's result plus this rank's values, out of place (fp32 sum):
  // the input is `reduced` itself, so it must already hold the all_reduce's sum.
  const std::size_t shard = kCount / n;
  void* scattered = space.put(Bytes(shard * 4));
  comm->reduce_scatter(reduced, scattered, shard, DType::kFloat32, ReduceOp::kSum)->wait();
  space.seen.push_back(space.get(scattered, shard * 4));
  // In place, bf16 sum: the output is this rank's own chunk of the input.
  void* in_place = space.put(values_of(rank, 3, n * 64, DType::kBFloat16));
  void* own_chunk = static_cast<std::byte*>(in_place) + me * 64 * 2;
  comm->reduce_scatter(in_place, own_chunk, 64, DType::kBFloat16, ReduceOp::kSum)->wait();
  space.seen.push_back(space.get(own_chunk, 64 * 2));

  // all_gather of the scattered shards (out of place), then in place in bf16.
  void* gathered = space.put(Bytes(n * shard * 4));
  comm->all_gather(scattered, gathered, shard, DType::kFloat32)->wait();
  space.seen.push_back(space.get(gathered, n * shard * 4));
  comm->all_gather(own_chunk, in_place, 64, DType::kBFloat16)->wait();
  space.seen.push_back(space.get(in_place, n * 64 * 2));

  // broadcast from the last rank, of its gathered buffer.
  comm->broadcast(gathered, n * shard, DType::kFloat32, ranks - 1)->wait();
  space.seen.push_back(space.get(gathered, n * shard * 4));

  // all_to_all of uneven segments, some empty, the rank's own among them (bf16), before the ring
  // below leaves a message unreceived on each pair it uses.
  std::vector<std::size_t> send_counts, recv_counts;
  std::size_t outgoing = 0, incoming = 0;
  for (int64_t peer = 0; peer < ranks; ++peer) {
    send_counts.push_back(static_cast<std::size_t>(16 * ((rank + 2 * peer) % 4)));
    recv_counts.push_back(static_cast<std::size_t>(16 * ((peer + 2 * rank) % 4)));
    outgoing += send_counts.back();
    incoming += recv_counts.back();
  }
  void* dispatched = space.put(values_of(rank, 5, outgoing, DType::kBFloat16));
  void* arrived = space.put(Bytes(incoming * 2));
  comm->all_to_all(dispatched, send_counts, arrived, recv_counts, DType::kBFloat16)->wait();
  space.seen.push_back(space.get(arrived, incoming * 2));

  // A ring: recvs posted first, sends of the broadcast result and of the bf16 buffer, then waits
  // in the other order; a third message to the next rank is never received (its staging goes
  // back with the world).
  const int64_t next = (rank + 1) % ranks, previous = (rank + ranks - 1) % ranks;
  void* from_previous = space.put(Bytes(n * shard * 4));
  void* bf16_from_previous = space.put(Bytes(n * 64 * 2));
  exec::Request first = comm->recv(from_previous, n * shard, DType::kFloat32, previous);
  exec::Request second = comm->recv(bf16_from_previous, n * 64, DType::kBFloat16, previous);
  comm->send(gathered, n * shard, DType::kFloat32, next)->wait();
  comm->send(in_place, n * 64, DType::kBFloat16, next)->wait();
  comm->send(reduced, kCount, DType::kFloat32, next)->wait();
  // Overwrite the sent buffer right away: the message holds the bytes of the send's time.
  comm->all_reduce(gathered, n * shard, DType::kFloat32, ReduceOp::kSum)->wait();
  second->wait();
  first->wait();
  space.seen.push_back(space.get(from_previous, n * shard * 4));
  space.seen.push_back(space.get(bf16_from_previous, n * 64 * 2));
  space.seen.push_back(space.get(gathered, n * shard * 4));
  comm->barrier();
}

std::vector<std::vector<Bytes>> run_program(int64_t ranks, std::unique_ptr<exec::InProcessMemory> memory, bool on_gpu) {
  exec::InProcessWorld world(ranks, std::chrono::seconds(60), std::move(memory));
  std::vector<std::unique_ptr<RankSpace>> spaces;
  for (int64_t r = 0; r < ranks; ++r) spaces.push_back(std::make_unique<RankSpace>(on_gpu));
  exec::run_rank_threads(world, ranks,
                         [&](int64_t rank) { program(world, rank, ranks, *spaces[static_cast<std::size_t>(rank)]); });
  std::vector<std::vector<Bytes>> seen;
  for (const auto& space : spaces) seen.push_back(space->seen);
  return seen;
}

}  // namespace

TEST_CASE("a world on the GPU memory gives the CPU world's bytes, collective by collective", "[gpu][comm]") {
  for (const int64_t ranks : {2, 3, 4}) {
    INFO(ranks << " ranks");
    const auto cpu = run_program(ranks, exec::make_in_process_cpu_memory(), false);
    const auto gpu = run_program(ranks, exec::make_in_process_gpu_memory(), true);
    REQUIRE(gpu.size() == cpu.size());
    for (std::size_t r = 0; r < cpu.size(); ++r) {
      REQUIRE(gpu[r].size() == cpu[r].size());
      CHECK(decode(gpu[r][0], DType::kFloat32)[0] == 1.0f);  // named "in-process-gpu"
      for (std::size_t step = 0; step < cpu[r].size(); ++step) {
        INFO("rank " << r << ", result " << step);
        CHECK(gpu[r][step] == cpu[r][step]);
      }
    }
  }
}
