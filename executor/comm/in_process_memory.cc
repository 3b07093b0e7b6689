// The in-process CPU memory: host buffers moved with memcpy and reduced in float, in input order.
#include "executor/comm/in_process_memory.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace megaplan::exec {

namespace {

// Elements [offset, offset + count) of a buffer of `type`, as floats (bf16 and fp16 widen exactly).
void load(const void* base, DType type, std::size_t offset, std::size_t count, float* out) {
  if (type == DType::kFloat32) {
    std::memcpy(out, static_cast<const float*>(base) + offset, count * sizeof(float));
    return;
  }
  const uint16_t* bits = static_cast<const uint16_t*>(base) + offset;
  for (std::size_t i = 0; i < count; ++i) out[i] = half_to_float(bits[i], type);
}

// The one rounding of a 16-bit reduction happens here.
void store(const float* values, DType type, std::size_t offset, std::size_t count, void* base) {
  if (type == DType::kFloat32) {
    std::memcpy(static_cast<float*>(base) + offset, values, count * sizeof(float));
    return;
  }
  uint16_t* bits = static_cast<uint16_t*>(base) + offset;
  for (std::size_t i = 0; i < count; ++i) bits[i] = float_to_half(values[i], type);
}

// Work is done when the call returns, so there is nothing to order: points are null.
class CpuLane final : public Lane {
 public:
  void wait(const StreamPoint&) override {}
  StreamPoint record() override { return nullptr; }

  // memmove: an overlap the contract rules out still copies as if through a temporary on the host.
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes > 0) std::memmove(dst, src, bytes);
  }

  void reduce(void* dst, const std::vector<const void*>& inputs, std::size_t count, DType type, ReduceOp op) override {
    if (inputs.empty()) throw std::invalid_argument("Lane::reduce: no inputs");
    // Block by block, on the stack: every element sees the same sequence of float operations as
    // an element-at-a-time loop, the inputs stream through the cache, and since a block is
    // stored only after every input's part of it was read, dst may be one of the inputs.
    constexpr std::size_t kBlock = 1024;
    float accumulator[kBlock], incoming[kBlock];
    for (std::size_t offset = 0; offset < count; offset += kBlock) {
      const std::size_t n = std::min(kBlock, count - offset);
      load(inputs[0], type, offset, n, accumulator);
      for (std::size_t member = 1; member < inputs.size(); ++member) {
        load(inputs[member], type, offset, n, incoming);
        if (op == ReduceOp::kSum) {
          for (std::size_t i = 0; i < n; ++i) accumulator[i] += incoming[i];
        } else {
          // NaN wins (torch.max propagates it); of equal values the earlier input's stays.
          for (std::size_t i = 0; i < n; ++i) {
            if (std::isnan(incoming[i]) || incoming[i] > accumulator[i]) accumulator[i] = incoming[i];
          }
        }
      }
      store(accumulator, type, offset, n, dst);
    }
  }

  void* allocate_staging(std::size_t bytes) override { return ::operator new(bytes); }
  void release_staging(void* staging) noexcept override { ::operator delete(staging); }
};

class CpuMemory final : public InProcessMemory {
 public:
  std::string name() const override { return "cpu"; }
  std::unique_ptr<Lane> make_lane() override { return std::make_unique<CpuLane>(); }
  StreamPoint record(void*) override { return nullptr; }
  void wait(void*, const StreamPoint&) override {}
};

}  // namespace

std::unique_ptr<InProcessMemory> make_in_process_cpu_memory() { return std::make_unique<CpuMemory>(); }

}  // namespace megaplan::exec
