// LayerNorm and RMSNorm kernels, each instantiated for bf16 and fp16 (P). One group of threads per
// row, the row held in registers (8 16-bit values per 16-byte load), so the input is read once;
// the weight gradients accumulate per thread over the rows a block visits (each thread always owns
// the same columns) and are summed in a fixed order afterwards.
#include "executor/kernels/cuda/norms.h"

#include <string>
#include <type_traits>

#include "executor/kernels/cuda/device_common.cuh"
#include "executor/kernels/cuda/dropout.h"

namespace megaplan::exec::cuda {

namespace {

using namespace detail;

constexpr int kBlockThreads = 256;
constexpr int kForwardVecs = 4;   // 8-value vectors per thread for rows up to 8192 values
constexpr int kBackwardVecs = 2;  // fewer in the backward, whose accumulators need registers too
constexpr int64_t kMaxCols = 32768;
constexpr int64_t kBackwardBlocks = 256;  // fixed, so the partial sums depend on the shape alone (~2 per H100 SM)
constexpr int kReduceColumns = 32, kReduceSlices = 8;

// --- 8-value vectors of 16-bit values: held raw (half the registers of floats) and unpacked by
// device_common.cuh's unpack8 when used; one 16-byte access when aligned, else scalar accesses
// with zeros past `end`.

template <bool kAligned>
__device__ __forceinline__ uint4 load_raw8(const Half* p, int64_t start, int64_t end) {
  if (kAligned && start + 8 <= end) return *reinterpret_cast<const uint4*>(p + start);
  uint16_t bits[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) bits[e] = start + e < end ? p[start + e] : uint16_t{0};
  uint4 raw;
  raw.x = bits[0] | (uint32_t{bits[1]} << 16);
  raw.y = bits[2] | (uint32_t{bits[3]} << 16);
  raw.z = bits[4] | (uint32_t{bits[5]} << 16);
  raw.w = bits[6] | (uint32_t{bits[7]} << 16);
  return raw;
}

// Rounds v to 16 bits and stores the values before `end`; returns the rounded bits (values past
// `end` stay as computed, which callers never read).
template <DType P, bool kAligned>
__device__ __forceinline__ uint4 store_rounded8(Half* p, int64_t start, int64_t end, const float (&v)[8]) {
  const uint4 raw = pack8<P>(v);
  if (kAligned && start + 8 <= end) {
    *reinterpret_cast<uint4*>(p + start) = raw;
  } else {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (start + e < end) p[start + e] = static_cast<uint16_t>(words[e / 2] >> (16 * (e % 2)));
    }
  }
  return raw;
}

// Sum over the `width` consecutive lanes (a power of two up to 32) of the calling thread's group
// within its warp.
__device__ __forceinline__ float lanes_sum(float v, int width) {
  for (int offset = 16; offset > 0; offset /= 2) {
    if (offset < width) v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// Sum over one row's group of threads: part of a warp (warps_per_row 0: threads_per_row lanes), or
// warps_per_row consecutive warps. Every thread of the block must call it (it may synchronise the
// block); the order is fixed by the thread layout alone.
__device__ __forceinline__ float row_sum(float v, float* shared, int warps_per_row, int threads_per_row) {
  v = lanes_sum(v, threads_per_row < 32 ? threads_per_row : 32);
  if (warps_per_row <= 1) return v;
  const int warp = threadIdx.x / 32;
  __syncthreads();  // the previous call's readers are done with `shared`
  if (threadIdx.x % 32 == 0) shared[warp] = v;
  __syncthreads();
  const int first = warp / warps_per_row * warps_per_row;
  float total = 0;
  for (int w = 0; w < warps_per_row; ++w) total += shared[first + w];
  return total;
}

// Two sums over the row's group at once: one shuffle tree, one trip through shared memory.
__device__ __forceinline__ float2 row_sum2(float a, float b, float2* shared, int warps_per_row, int threads_per_row) {
  for (int offset = 16; offset > 0; offset /= 2) {
    if (offset >= threads_per_row) continue;  // a row of fewer lanes than a warp sums within its own
    a += __shfl_xor_sync(0xffffffffu, a, offset);
    b += __shfl_xor_sync(0xffffffffu, b, offset);
  }
  if (warps_per_row <= 1) return make_float2(a, b);
  const int warp = threadIdx.x / 32;
  __syncthreads();  // the previous call's readers are done with `shared`
  if (threadIdx.x % 32 == 0) shared[warp] = make_float2(a, b);
  __syncthreads();
  const int first = warp / warps_per_row * warps_per_row;
  float2 total = make_float2(0.0f, 0.0f);
  for (int w = 0; w < warps_per_row; ++w) {
    total.x += shared[first + w].x;
    total.y += shared[first + w].y;
  }
  return total;
}

// How a row maps onto threads: threads_per_row (a power of two up to a block) threads, each holding
// `vecs` 8-value vectors at v = lane + k * threads_per_row; rows_per_block rows per 256-thread
// block. vecs is the smallest of base, 2 base, 4 base... that keeps a row in one block, and a row
// of a warp's vectors or fewer (an attention head's: 128 values, 16 vectors) takes one vector a
// thread over as many lanes as it has vectors: more rows a block, every lane loading (a warp of four
// vectors each left 7 in 8 of its lanes idle, and the query and key norms ran at a fifth of the
// stream norms' bandwidth).
struct RowLayout {
  int threads_per_row, rows_per_block, vecs;
};

RowLayout layout_for(int64_t cols, int base_vecs) {
  const int64_t vectors = (cols + 7) / 8;
  if (vectors <= 32) {
    int lanes = 1;
    while (lanes < vectors) lanes *= 2;
    return {lanes, kBlockThreads / lanes, 1};
  }
  int vecs = base_vecs;
  while (static_cast<int64_t>(vecs) * kBlockThreads < vectors) vecs *= 2;
  int threads = 32;
  while (static_cast<int64_t>(threads) * vecs < vectors) threads *= 2;
  return {threads, kBlockThreads / threads, vecs};
}

void check_cols(int64_t rows, int64_t cols, const char* what) {
  if (rows < 0 || cols < 1 || cols > kMaxCols) {
    throw SpecError("--device", std::string(what) + ": needs 1 <= cols <= " + std::to_string(kMaxCols) +
                                    " and rows >= 0, got rows " + std::to_string(rows) + ", cols " +
                                    std::to_string(cols));
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// One row group per row. The row is held raw (the fused sum is rounded to 16 bits anyway, so the
// registers hold exactly the values the statistics are taken of). kDropout: the residual's values
// pass through residual_dropout's mask (drawn here, 8 keep bits per vector) before the add.
// kHeads (RMSNorm's query and key norms, head_rmsnorm_forward): the rows are a fused qkv's heads,
// `period` a query group's rows (its queries, its key, its value): a key row's weight is `beta`, a
// value row is copied as it is and its rstd set to 0.
template <DType P, bool kRms, bool kAligned, int kVecs, bool kDropout, bool kHeads = false>
__global__ void __launch_bounds__(kBlockThreads)
    norm_forward_kernel(const Half* x, const Half* residual, DropoutMask residual_dropout, Half* sum_out,
                        const Half* gamma, const Half* beta, int64_t rows, int cols, float eps, Half* y, float* mean,
                        float* rstd, int threads_per_row, int period = 0) {
  __shared__ float shared[32];
  const int group = threadIdx.x / threads_per_row, lane = threadIdx.x % threads_per_row;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / threads_per_row) + group;
  const bool active = row < rows;
  const int64_t offset = active ? row * cols : 0;
  const int end = active ? cols : 0;  // an inactive row's thread loads nothing and holds zeros
  uint4 raw[kVecs];
  float sum = 0;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int col = (lane + k * threads_per_row) * 8;
    raw[k] = load_raw8<kAligned>(x + offset, col, end);
    float v[8];
    unpack8<P>(raw[k], v);
    if (residual) {
      float r[8];
      load8<P, kAligned>(residual + offset, col, end, r);
      if (kDropout && col < end) {
        drop_token_values(residual_dropout, row, cols, col, end - col < 8 ? end - col : 8, r);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] += r[e];
      raw[k] = store_rounded8<P, kAligned>(sum_out + offset, col, end, v);
      unpack8<P>(raw[k], v);  // the statistics are those of the rounded sum, as the backward sees it
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += v[e];
  }
  const int warps_per_row = threads_per_row / 32;
  const float n = static_cast<float>(cols);
  const float mu = kRms ? 0.0f : row_sum(sum, shared, warps_per_row, threads_per_row) / n;
  // Squares about the mean from the registers: two passes, no cancellation, one read of memory.
  float squares = 0;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int col = (lane + k * threads_per_row) * 8;
    float v[8];
    unpack8<P>(raw[k], v);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float d = v[e] - mu;
      if (col + e < cols) squares += d * d;
    }
  }
  const float inverse = rsqrtf(row_sum(squares, shared, warps_per_row, threads_per_row) / n + eps);
  const int role = kHeads ? static_cast<int>(row % period) : 0;
  const bool passed = kHeads && role == period - 1;  // a value head
  const Half* weight = kHeads && role == period - 2 ? beta : gamma;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int col = (lane + k * threads_per_row) * 8;
    if (!active || col >= cols) continue;
    float v[8], scale[8], shift[8];
    unpack8<P>(raw[k], v);
    if (!passed) {
      load8<P, kAligned>(weight, col, cols, scale);
      if (!kRms) load8<P, kAligned>(beta, col, cols, shift);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = (v[e] - mu) * inverse * scale[e] + (kRms ? 0.0f : shift[e]);
    }
    store8<P, kAligned>(y + offset, col, cols, v);
  }
  if (active && lane == 0) {
    if (!kRms) mean[row] = mu;
    rstd[row] = passed ? 0.0f : inverse;
  }
}

// dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) with g = dy * gamma, x_hat = (x - mean) * rstd
// (RMSNorm: no mean terms). Each block walks rows blockIdx.x * rows_per_block + group, then
// gridDim.x * rows_per_block further on, so a thread's columns never change and it accumulates
// dy * x_hat and dy for them in registers, row after row; the block's row groups are then added
// in group order and written as the block's partial column sums [blocks][cols] (gamma, then beta).
// kHeads (head_rmsnorm_backward), as the forward's: a key row reads `key_gamma` and its weight
// gradient accumulates in the bias's place; a value row's dx is its dy and adds to neither.
template <DType P, bool kRms, bool kAligned, int kVecs, bool kHeads = false>
__global__ void __launch_bounds__(kBlockThreads, kVecs <= 2 ? 2 : 1)
    norm_backward_kernel(const Half* dy, const Half* x, const Half* gamma, const float* mean, const float* rstd,
                         int64_t rows, int cols, const Half* residual_grad, Half* dx, float* partial_gamma,
                         float* partial_beta, int threads_per_row, const Half* key_gamma = nullptr, int period = 0) {
  __shared__ float2 pair_shared[32];
  extern __shared__ float column_buffer[];  // 2 * threads_per_row * kVecs * 8 floats when rows_per_block > 1
  const int rows_per_block = blockDim.x / threads_per_row;
  const int group = threadIdx.x / threads_per_row, lane = threadIdx.x % threads_per_row;
  const int warps_per_row = threads_per_row / 32;
  const float n = static_cast<float>(cols);
  float acc_gamma[kVecs][8], acc_beta[kVecs][8];
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc_gamma[k][e] = acc_beta[k][e] = 0.0f;
  }
  // The thread's columns never change: its gamma is fetched once.
  uint4 gamma_raw[kVecs], key_gamma_raw[kVecs];
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    gamma_raw[k] = load_raw8<kAligned>(gamma, (lane + k * threads_per_row) * 8, cols);
    key_gamma_raw[k] = kHeads ? load_raw8<kAligned>(key_gamma, (lane + k * threads_per_row) * 8, cols) : uint4{};
  }
  // Raw 16-bit values in registers (half the registers of floats), the next row's fetched before the
  // current one is worked on; a row past the end loads nothing and holds zeros.
  const auto fetch = [&](int64_t row, uint4(&dy_raw)[kVecs], uint4(&x_raw)[kVecs], uint4(&around_raw)[kVecs], float& mu,
                         float& inverse) {
    const int64_t offset = row < rows ? row * cols : 0;
    const int end = row < rows ? cols : 0;
    mu = row < rows && !kRms ? mean[row] : 0.0f;
    inverse = row < rows ? rstd[row] : 0.0f;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int col = (lane + k * threads_per_row) * 8;
      dy_raw[k] = load_raw8<kAligned>(dy + offset, col, end);
      x_raw[k] = load_raw8<kAligned>(x + offset, col, end);
      around_raw[k] = residual_grad ? load_raw8<kAligned>(residual_grad + offset, col, end) : uint4{0, 0, 0, 0};
    }
  };
  const int64_t stride = static_cast<int64_t>(gridDim.x) * rows_per_block;
  uint4 dy_raw[kVecs], x_raw[kVecs], around_raw[kVecs];
  float mu, inverse;
  fetch(static_cast<int64_t>(blockIdx.x) * rows_per_block + group, dy_raw, x_raw, around_raw, mu, inverse);
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block; first < rows; first += stride) {
    const int64_t row = first + group;
    const bool active = row < rows;
    const int64_t offset = active ? row * cols : 0;
    uint4 next_dy[kVecs], next_x[kVecs], next_around[kVecs];
    float next_mu, next_inverse;
    fetch(row + stride, next_dy, next_x, next_around, next_mu, next_inverse);
    // Padding and inactive rows hold dy = 0, so they add nothing below.
    const int role = kHeads ? static_cast<int>(row % period) : 0;
    const bool key = kHeads && role == period - 2, passed = kHeads && role == period - 1;
    float g_sum = 0, gx_sum = 0;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      float d[8], xv[8], scale[8];
      unpack8<P>(dy_raw[k], d);
      unpack8<P>(x_raw[k], xv);
      unpack8<P>(key ? key_gamma_raw[k] : gamma_raw[k], scale);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float x_hat = (xv[e] - mu) * inverse;
        const float g = d[e] * scale[e];
        g_sum += g;
        gx_sum += g * x_hat;
        if (!kHeads) {
          acc_gamma[k][e] += d[e] * x_hat;
          acc_beta[k][e] += d[e];
        } else if (key) {
          acc_beta[k][e] += d[e] * x_hat;
        } else if (!passed) {
          acc_gamma[k][e] += d[e] * x_hat;
        }
      }
    }
    const float2 sums = row_sum2(g_sum, gx_sum, pair_shared, warps_per_row, threads_per_row);
    const float g_mean = kRms ? 0.0f : sums.x / n, gx_mean = sums.y / n;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int col = (lane + k * threads_per_row) * 8;
      if (!active || col >= cols) continue;
      float d[8], xv[8], scale[8], around[8];
      unpack8<P>(dy_raw[k], d);
      unpack8<P>(x_raw[k], xv);
      unpack8<P>(key ? key_gamma_raw[k] : gamma_raw[k], scale);
      unpack8<P>(around_raw[k], around);
      if (!passed) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float x_hat = (xv[e] - mu) * inverse;
          d[e] = inverse * (d[e] * scale[e] - g_mean - x_hat * gx_mean) + (residual_grad ? around[e] : 0.0f);
        }
      }
      store8<P, kAligned>(dx + offset, col, cols, d);
    }
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      dy_raw[k] = next_dy[k];
      x_raw[k] = next_x[k];
      around_raw[k] = next_around[k];
    }
    mu = next_mu;
    inverse = next_inverse;
  }
  // Row groups 1, 2, ... add into group 0 in that order, through shared memory laid out so that
  // consecutive lanes touch consecutive words.
  const int slots = threads_per_row * kVecs * 8;
  for (int from = 1; from < rows_per_block; ++from) {
    __syncthreads();
    if (group == from) {
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          column_buffer[(k * 8 + e) * threads_per_row + lane] = acc_gamma[k][e];
          column_buffer[slots + (k * 8 + e) * threads_per_row + lane] = acc_beta[k][e];
        }
      }
    }
    __syncthreads();
    if (group == 0) {
#pragma unroll
      for (int k = 0; k < kVecs; ++k) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          acc_gamma[k][e] += column_buffer[(k * 8 + e) * threads_per_row + lane];
          acc_beta[k][e] += column_buffer[slots + (k * 8 + e) * threads_per_row + lane];
        }
      }
    }
  }
  if (group != 0) return;
  float* out_gamma = partial_gamma + static_cast<int64_t>(blockIdx.x) * cols;
  constexpr bool kSecond = !kRms || kHeads;  // the bias's sums, or the key norm's
  float* out_beta = kSecond ? partial_beta + static_cast<int64_t>(blockIdx.x) * cols : nullptr;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int col = (lane + k * threads_per_row) * 8;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (col + e < cols) {
        out_gamma[col + e] = acc_gamma[k][e];
        if (kSecond) out_beta[col + e] = acc_beta[k][e];
      }
    }
  }
}

// total[c] += the sum over blocks of partial[b][c]: kReduceSlices threads per column each add
// every kReduceSlices-th block in order, then the slices are added in order.
__global__ void sum_partials_kernel(const float* partial, int64_t blocks, int64_t cols, float* total) {
  __shared__ float slices[kReduceSlices][kReduceColumns + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kReduceColumns + threadIdx.x;
  float sum = 0;
  if (c < cols) {
#pragma unroll 8
    for (int64_t b = threadIdx.y; b < blocks; b += kReduceSlices) sum += partial[b * cols + c];
  }
  slices[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float column = 0;
  for (int s = 0; s < kReduceSlices; ++s) column += slices[s][threadIdx.x];
  total[c] += column;
}

int64_t backward_blocks(int64_t rows, int64_t cols) {
  const RowLayout layout = layout_for(cols, kBackwardVecs);
  const int64_t needed = (rows + layout.rows_per_block - 1) / layout.rows_per_block;
  return needed < kBackwardBlocks ? (needed > 0 ? needed : 1) : kBackwardBlocks;
}

// Runs body(std::integral_constant<int, V>{}) for the layout's vecs, V a power of two up to 16.
template <typename Body>
void with_vecs(int vecs, Body&& body) {
  switch (vecs) {
    case 1: return body(std::integral_constant<int, 1>{});
    case 2: return body(std::integral_constant<int, 2>{});
    case 4: return body(std::integral_constant<int, 4>{});
    case 8: return body(std::integral_constant<int, 8>{});
    default: return body(std::integral_constant<int, 16>{});
  }
}

// kHeads: the query and key norms, `period` rows a query group (norm_forward_kernel).
template <bool kRms, bool kHeads = false>
void norm_forward(const Half* x, const Half* residual, const DropoutMask& residual_dropout, Half* sum_out,
                  const Half* gamma, const Half* beta, int64_t rows, int64_t cols, float eps, Half* y, float* mean,
                  float* rstd, const char* what, DType precision, cudaStream_t stream, int period = 0) {
  check_cols(rows, cols, what);
  if (residual && !sum_out) throw SpecError("--device", std::string(what) + ": a residual needs sum_out");
  const bool dropout = residual && residual_dropout.active();
  if (dropout) require_drawable(residual_dropout, what);
  if (rows == 0) return;
  const RowLayout layout = layout_for(cols, kForwardVecs);
  const bool aligned = cols % 8 == 0 && aligned16(x) && aligned16(residual) && aligned16(sum_out) && aligned16(gamma) &&
                       aligned16(beta) && aligned16(y);
  const unsigned grid = static_cast<unsigned>((rows + layout.rows_per_block - 1) / layout.rows_per_block);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    with_vecs(layout.vecs, [&](auto vecs) {
      constexpr int kVecs = decltype(vecs)::value;
      auto kernel = aligned ? (dropout ? norm_forward_kernel<P, kRms, true, kVecs, true, kHeads>
                                       : norm_forward_kernel<P, kRms, true, kVecs, false, kHeads>)
                            : (dropout ? norm_forward_kernel<P, kRms, false, kVecs, true, kHeads>
                                       : norm_forward_kernel<P, kRms, false, kVecs, false, kHeads>);
      kernel<<<grid, kBlockThreads, 0, stream>>>(x, residual, residual_dropout, sum_out, gamma, beta, rows,
                                                 static_cast<int>(cols), eps, y, mean, rstd, layout.threads_per_row,
                                                 period);
    });
  });
  check_launch(what);
}

// kHeads: the query and key norms (norm_backward_kernel), the key norm's weight gradient in dbeta.
template <bool kRms, bool kHeads = false>
void norm_backward(const Half* dy, const Half* x, const Half* gamma, const float* mean, const float* rstd, int64_t rows,
                   int64_t cols, const Half* residual_grad, Half* dx, float* dgamma, float* dbeta, void* workspace,
                   const char* what, DType precision, cudaStream_t stream, const Half* key_gamma = nullptr,
                   int period = 0) {
  check_cols(rows, cols, what);
  if (rows == 0) return;
  const RowLayout layout = layout_for(cols, kBackwardVecs);
  const int64_t blocks = backward_blocks(rows, cols);
  float* partial_gamma = static_cast<float*>(workspace);
  float* partial_beta = partial_gamma + blocks * cols;
  const bool aligned = cols % 8 == 0 && aligned16(dy) && aligned16(x) && aligned16(gamma) && aligned16(key_gamma) &&
                       aligned16(residual_grad) && aligned16(dx);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    with_vecs(layout.vecs, [&](auto vecs) {
      constexpr int kVecs = decltype(vecs)::value;
      const std::size_t buffer = layout.rows_per_block > 1 ? 2 * sizeof(float) * layout.threads_per_row * kVecs * 8 : 0;
      auto kernel = aligned ? norm_backward_kernel<P, kRms, true, kVecs, kHeads>
                            : norm_backward_kernel<P, kRms, false, kVecs, kHeads>;
      kernel<<<static_cast<unsigned>(blocks), kBlockThreads, buffer, stream>>>(
          dy, x, gamma, mean, rstd, rows, static_cast<int>(cols), residual_grad, dx, partial_gamma, partial_beta,
          layout.threads_per_row, key_gamma, period);
    });
  });
  check_launch(what);
  const dim3 reduce_grid(static_cast<unsigned>((cols + kReduceColumns - 1) / kReduceColumns));
  const dim3 reduce_block(kReduceColumns, kReduceSlices);
  sum_partials_kernel<<<reduce_grid, reduce_block, 0, stream>>>(partial_gamma, blocks, cols, dgamma);
  check_launch("norm weight gradient sum");
  if (!kRms || kHeads) {
    sum_partials_kernel<<<reduce_grid, reduce_block, 0, stream>>>(partial_beta, blocks, cols, dbeta);
    check_launch("norm bias gradient sum");
  }
}

}  // namespace

void layernorm_forward(const Half* x, const Half* residual, const DropoutMask& residual_dropout, Half* sum_out,
                       const Half* gamma, const Half* beta, int64_t rows, int64_t cols, float eps, Half* y, float* mean,
                       float* rstd, DType precision, cudaStream_t stream) {
  norm_forward<false>(x, residual, residual_dropout, sum_out, gamma, beta, rows, cols, eps, y, mean, rstd,
                      "layernorm_forward", precision, stream);
}

std::size_t norm_backward_workspace_bytes(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<std::size_t>(2 * backward_blocks(rows, cols) * cols) * sizeof(float);
}

void layernorm_backward(const Half* dy, const Half* x, const Half* gamma, const float* mean, const float* rstd,
                        int64_t rows, int64_t cols, const Half* residual_grad, Half* dx, float* dgamma, float* dbeta,
                        void* workspace, DType precision, cudaStream_t stream) {
  norm_backward<false>(dy, x, gamma, mean, rstd, rows, cols, residual_grad, dx, dgamma, dbeta, workspace,
                       "layernorm_backward", precision, stream);
}

void rmsnorm_forward(const Half* x, const Half* residual, const DropoutMask& residual_dropout, Half* sum_out,
                     const Half* gamma, int64_t rows, int64_t cols, float eps, Half* y, float* rstd, DType precision,
                     cudaStream_t stream) {
  norm_forward<true>(x, residual, residual_dropout, sum_out, gamma, nullptr, rows, cols, eps, y, nullptr, rstd,
                     "rmsnorm_forward", precision, stream);
}

void rmsnorm_backward(const Half* dy, const Half* x, const Half* gamma, const float* rstd, int64_t rows, int64_t cols,
                      const Half* residual_grad, Half* dx, float* dgamma, void* workspace, DType precision,
                      cudaStream_t stream) {
  norm_backward<true>(dy, x, gamma, nullptr, rstd, rows, cols, residual_grad, dx, dgamma, nullptr, workspace,
                      "rmsnorm_backward", precision, stream);
}

void head_rmsnorm_forward(const Half* qkv, const Half* q_gamma, const Half* k_gamma, int64_t query_groups,
                          int64_t group, int64_t dim, float eps, Half* y, float* rstd, DType precision,
                          cudaStream_t stream) {
  norm_forward<true, true>(qkv, nullptr, DropoutMask{}, nullptr, q_gamma, k_gamma, query_groups * (group + 2), dim, eps,
                           y, nullptr, rstd, "head_rmsnorm_forward", precision, stream, static_cast<int>(group + 2));
}

void head_rmsnorm_backward(const Half* dy, const Half* qkv, const Half* q_gamma, const Half* k_gamma, const float* rstd,
                           int64_t query_groups, int64_t group, int64_t dim, Half* dx, float* dq_gamma, float* dk_gamma,
                           void* workspace, DType precision, cudaStream_t stream) {
  norm_backward<true, true>(dy, qkv, q_gamma, nullptr, rstd, query_groups * (group + 2), dim, nullptr, dx, dq_gamma,
                            dk_gamma, workspace, "head_rmsnorm_backward", precision, stream, k_gamma,
                            static_cast<int>(group + 2));
}

}  // namespace megaplan::exec::cuda
