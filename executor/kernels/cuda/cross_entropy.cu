#include "executor/kernels/cuda/cross_entropy.h"

#include <string>

#include "executor/kernels/cuda/device_common.cuh"

namespace megaplan::exec::cuda {

namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // independent row loads in flight per thread before the first use
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// A running softmax denominator in base 2: sum = sum_i 2^(y_i - max) over the values seen.
struct Partial {
  float max;
  float sum;
};

__device__ __forceinline__ Partial combine(Partial a, Partial b) {
  const float top = fmaxf(a.max, b.max);
  if (top == -INFINITY) return {top, 0.0f};  // neither has seen a value: 2^(-inf - -inf) is NaN
  return {top, a.sum * exp2f(a.max - top) + b.sum * exp2f(b.max - top)};
}

// kWidth 16-bit values of one row from column `first`: one 16-byte access when kWidth is 8.
template <DType P, int kWidth>
__device__ __forceinline__ void load_values(const Half* row, int64_t first, float (&out)[kWidth]) {
  if constexpr (kWidth == 8) {
    unpack8<P>(*reinterpret_cast<const uint4*>(row + first), out);
  } else {
    out[0] = load<P>(row, first);
  }
}

template <DType P, int kWidth>
__device__ __forceinline__ void store_values(Half* row, int64_t first, const float (&values)[kWidth]) {
  if constexpr (kWidth == 8) {
    *reinterpret_cast<uint4*>(row + first) = pack8<P>(values);
  } else {
    store<P>(row, first, values[0]);
  }
}

// One pass over the row: each thread keeps an online (max, sum) over its columns in base 2, one
// rescale per kUnroll * kWidth values; the block combines the partials in a fixed order.
template <DType P, int kWidth>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_statistics_kernel(const Half* logits, int64_t vocab, int64_t row_stride, const int32_t* targets,
                                    float* lse, float* target_logit, float* peak) {
  __shared__ Partial warp_partials[kThreads / 32];
  const int64_t row = blockIdx.x;
  const Half* in = logits + row * row_stride;
  const int64_t groups = (vocab + kWidth - 1) / kWidth;  // the last may hold padded columns
  Partial mine{-INFINITY, 0.0f};
  for (int64_t base = threadIdx.x; base < groups; base += kThreads * kUnroll) {
    float y[kUnroll][kWidth];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t group = base + u * kThreads;
      if (group < groups) {
        load_values<P, kWidth>(in, group * kWidth, y[u]);
      } else {
#pragma unroll
        for (int i = 0; i < kWidth; ++i) y[u][i] = -INFINITY;
      }
    }
    float top = mine.max;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t first = (base + u * kThreads) * kWidth;
#pragma unroll
      for (int i = 0; i < kWidth; ++i) {
        y[u][i] = first + i < vocab ? y[u][i] * kLog2e : -INFINITY;
        top = fmaxf(top, y[u][i]);
      }
    }
    if (top == -INFINITY) continue;  // only possible past the row's end
    float sum = mine.sum * exp2f(mine.max - top);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int i = 0; i < kWidth; ++i) sum += exp2f(y[u][i] - top);
    }
    mine = {top, sum};
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const Partial other{__shfl_xor_sync(0xffffffffu, mine.max, offset), __shfl_xor_sync(0xffffffffu, mine.sum, offset)};
    mine = combine(mine, other);
  }
  if (threadIdx.x % 32 == 0) warp_partials[threadIdx.x / 32] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    Partial total = warp_partials[0];
    for (int w = 1; w < kThreads / 32; ++w) total = combine(total, warp_partials[w]);
    lse[row] = (total.max + log2f(total.sum)) * kLn2;
    if (peak) peak[row] = lse[row];
    const int32_t target = targets[row];
    target_logit[row] = target >= 0 ? load<P>(in, target) : 0.0f;  // -1: another shard's column
  }
}

// exp in double, as the CPU reference: the shards' terms are summed across ranks.
__global__ void cross_entropy_shift_kernel(const float* peak, int64_t tokens, float* shard_lse) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < tokens)
    shard_lse[t] = static_cast<float>(exp(static_cast<double>(shard_lse[t]) - static_cast<double>(peak[t])));
}

constexpr int kFinishThreads = 256;

// One block: each thread's rows in double, then a fixed-order tree, so the sum is the same bits
// every run; one thread adds the microbatch's loss to the running sum (stream order, no atomics).
__global__ void __launch_bounds__(kFinishThreads)
    cross_entropy_finish_kernel(const float* peak, const float* term_sum, const float* target, const float* weights,
                                int64_t tokens, float* lse, double* loss_sum) {
  __shared__ double losses[kFinishThreads];
  double loss = 0;
  for (int64_t t = threadIdx.x; t < tokens; t += kFinishThreads) {
    const double row = static_cast<double>(peak[t]) + (term_sum ? log(static_cast<double>(term_sum[t])) : 0.0);
    lse[t] = static_cast<float>(row);
    loss += static_cast<double>(weights[t]) * (row - static_cast<double>(target[t]));
  }
  losses[threadIdx.x] = loss;
  __syncthreads();
  for (int stride = kFinishThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) losses[threadIdx.x] += losses[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss_sum += losses[0];
}

// Element-wise given the row's lse: in place is safe, each value is read by the thread that then
// overwrites it (so no __restrict__ on logits and dlogits).
template <DType P, int kWidth>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_backward_kernel(const Half* logits, int64_t vocab, int64_t row_stride, const int32_t* targets,
                                  const float* mask, const float* lse, float scale, Half* dlogits) {
  const int64_t row = blockIdx.x;
  const Half* in = logits + row * row_stride;
  Half* out = dlogits + row * row_stride;
  const int64_t groups = row_stride / kWidth;  // row_stride % kWidth == 0: padded columns too
  const float weight = scale * mask[row];
  if (weight == 0.0f) {
    const float zeros[kWidth] = {};
    for (int64_t group = threadIdx.x; group < groups; group += kThreads) {
      store_values<P, kWidth>(out, group * kWidth, zeros);
    }
    return;
  }
  const int64_t target = targets[row];  // -1 (another shard's column) matches no column: no onehot
  const float offset = lse[row] * kLog2e;
  for (int64_t base = threadIdx.x; base < groups; base += kThreads * kUnroll) {
    float x[kUnroll][kWidth];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t group = base + u * kThreads;
      if (group < groups && group * kWidth < vocab) {
        load_values<P, kWidth>(in, group * kWidth, x[u]);
      } else {  // only padded columns (or past the row): never read, written as 0 below
#pragma unroll
        for (int i = 0; i < kWidth; ++i) x[u][i] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t group = base + u * kThreads;
      if (group >= groups) continue;
      const int64_t first = group * kWidth;
      float gradient[kWidth];
#pragma unroll
      for (int i = 0; i < kWidth; ++i) {
        const int64_t column = first + i;
        const float probability = exp2f(fmaf(x[u][i], kLog2e, -offset));
        gradient[i] = column < vocab ? weight * (probability - (column == target ? 1.0f : 0.0f)) : 0.0f;
      }
      store_values<P, kWidth>(out, first, gradient);
    }
  }
}

void check_shape(const char* what, int64_t tokens, int64_t vocab, int64_t row_stride) {
  if (tokens < 0 || tokens > 0x7fffffff || vocab <= 0 || row_stride < vocab) {
    throw SpecError("--device", std::string(what) +
                                    ": needs 0 <= tokens < 2^31 and 0 < vocab <= row_stride, got tokens " +
                                    std::to_string(tokens) + ", vocab " + std::to_string(vocab) + ", row_stride " +
                                    std::to_string(row_stride));
  }
}

// 16-byte loads need every row to start on a 16-byte boundary.
bool rows_aligned(const void* pointer, int64_t row_stride) {
  return row_stride % 8 == 0 && reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

}  // namespace

void cross_entropy_statistics(const Half* logits, int64_t tokens, int64_t vocab, int64_t row_stride,
                              const int32_t* targets, float* lse, float* target_logit, float* peak, DType precision,
                              cudaStream_t stream) {
  check_shape("cross_entropy_statistics", tokens, vocab, row_stride);
  if (tokens == 0) return;
  const unsigned blocks = static_cast<unsigned>(tokens);
  const bool aligned = rows_aligned(logits, row_stride);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    const auto kernel = aligned ? cross_entropy_statistics_kernel<P, 8> : cross_entropy_statistics_kernel<P, 1>;
    kernel<<<blocks, kThreads, 0, stream>>>(logits, vocab, row_stride, targets, lse, target_logit, peak);
  });
  check_launch("cross_entropy_statistics_kernel");
}

void cross_entropy_backward(const Half* logits, int64_t tokens, int64_t vocab, int64_t row_stride,
                            const int32_t* targets, const float* mask, const float* lse, float scale, Half* dlogits,
                            DType precision, cudaStream_t stream) {
  check_shape("cross_entropy_backward", tokens, vocab, row_stride);
  if (tokens == 0) return;
  const unsigned blocks = static_cast<unsigned>(tokens);
  const bool aligned = rows_aligned(logits, row_stride) && rows_aligned(dlogits, row_stride);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    const auto kernel = aligned ? cross_entropy_backward_kernel<P, 8> : cross_entropy_backward_kernel<P, 1>;
    kernel<<<blocks, kThreads, 0, stream>>>(logits, vocab, row_stride, targets, mask, lse, scale, dlogits);
  });
  check_launch("cross_entropy_backward_kernel");
}

void cross_entropy_shift(const float* peak, int64_t tokens, float* shard_lse, cudaStream_t stream) {
  if (tokens == 0) return;
  cross_entropy_shift_kernel<<<static_cast<unsigned>((tokens + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      peak, tokens, shard_lse);
  check_launch("cross_entropy_shift_kernel");
}

void cross_entropy_finish(const float* peak, const float* term_sum, const float* target, const float* weights,
                          int64_t tokens, float* lse, double* loss_sum, cudaStream_t stream) {
  cross_entropy_finish_kernel<<<1, kFinishThreads, 0, stream>>>(peak, term_sum, target, weights, tokens, lse, loss_sum);
  check_launch("cross_entropy_finish_kernel");
}

}  // namespace megaplan::exec::cuda
