// Embedding kernels, each instantiated for bf16 and fp16 (P): one thread per token (or table row)
// and 8 consecutive columns, one 16-byte access per 8 16-bit values when the rows are 16-byte
// aligned, scalar accesses otherwise.
#include "executor/kernels/cuda/embedding.h"

#include <algorithm>
#include <string>

#include "executor/kernels/cuda/device_common.cuh"

namespace megaplan::exec::cuda {

namespace {

using namespace detail;

constexpr int kThreads = 256;
// The word gradient: a block of kColumnVectors x kPositionSlices threads per (used row, 256
// columns); each slice sums every kPositionSlices-th position of the row in order, then the
// slices are added in order. Frequent tokens (a space, a newline) are split 8 ways that way.
constexpr int kColumnVectors = 32, kPositionSlices = 8;

// --- 8-value vectors: the fp32 accumulation here, the 16-bit loads and stores in device_common.cuh.
using detail::load8;
using detail::store8;

// p[start..] += v, fp32.
template <bool kAligned>
__device__ __forceinline__ void accumulate8(float* p, int64_t start, int64_t end, const float (&v)[8]) {
  if (kAligned && start + 8 <= end) {
    float4* q = reinterpret_cast<float4*>(p + start);
    float4 low = q[0], high = q[1];
    low.x += v[0], low.y += v[1], low.z += v[2], low.w += v[3];
    high.x += v[4], high.y += v[5], high.z += v[6], high.w += v[7];
    q[0] = low;
    q[1] = high;
    return;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (start + e < end) p[start + e] += v[e];
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <DType P, bool kAligned>
__global__ void embedding_forward_kernel(const int32_t* tokens, int64_t count, int64_t seq, const Half* word,
                                         const Half* position, int64_t hidden, int64_t vectors_per_row, Half* y,
                                         TokenPlaces places) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count * vectors_per_row) return;
  const int64_t t = i / vectors_per_row, start = (i % vectors_per_row) * 8;
  const int32_t token = tokens[t];
  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // -1: another shard's token, no word row
  if (token >= 0) load8<P, kAligned>(word + static_cast<int64_t>(token) * hidden, start, hidden, v);
  if (position) {
    float p[8];
    load8<P, kAligned>(position + places.place(t % seq) * hidden, start, hidden, p);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] += p[e];
  }
  store8<P, kAligned>(y + t * hidden, start, hidden, v);
}

// Grid (used rows, column blocks); block (kColumnVectors, kPositionSlices).
template <DType P, bool kAligned>
__global__ void word_gradient_kernel(const Half* dy, const int32_t* row_ids, const int32_t* row_starts,
                                     const int32_t* positions, int64_t hidden, float* dword) {
  __shared__ float slices[kPositionSlices][kColumnVectors * 8 + 1];
  const int64_t r = blockIdx.x;
  const int64_t start = (static_cast<int64_t>(blockIdx.y) * kColumnVectors + threadIdx.x) * 8;
  float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (start < hidden) {
    for (int32_t p = row_starts[r] + static_cast<int32_t>(threadIdx.y); p < row_starts[r + 1]; p += kPositionSlices) {
      float v[8];
      load8<P, kAligned>(dy + static_cast<int64_t>(positions[p]) * hidden, start, hidden, v);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum[e] += v[e];
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) slices[threadIdx.y][threadIdx.x * 8 + e] = sum[e];
  __syncthreads();
  if (threadIdx.y != 0 || start >= hidden) return;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    float total = 0;
    for (int s = 0; s < kPositionSlices; ++s) total += slices[s][threadIdx.x * 8 + e];
    sum[e] = total;
  }
  accumulate8<kAligned>(dword + static_cast<int64_t>(row_ids[r]) * hidden, start, hidden, sum);
}

template <DType P, bool kAligned>
__global__ void position_gradient_kernel(const Half* dy, int64_t batch, int64_t seq, int64_t hidden,
                                         int64_t vectors_per_row, float* dposition, TokenPlaces places) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= seq * vectors_per_row) return;
  const int64_t t = i / vectors_per_row, start = (i % vectors_per_row) * 8;
  float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t b = 0; b < batch; ++b) {
    float v[8];
    load8<P, kAligned>(dy + (b * seq + t) * hidden, start, hidden, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum[e] += v[e];
  }
  accumulate8<kAligned>(dposition + places.place(t) * hidden, start, hidden, sum);
}

void check_shape(int64_t count, int64_t seq, int64_t hidden, const char* what) {
  if (count < 0 || seq <= 0 || hidden <= 0 || count % seq != 0) {
    throw SpecError("--device",
                    std::string(what) + ": needs seq > 0, hidden > 0 and count a multiple of seq; got count " +
                        std::to_string(count) + ", seq " + std::to_string(seq) + ", hidden " + std::to_string(hidden));
  }
}

}  // namespace

void embedding_forward(const int32_t* tokens, int64_t count, int64_t seq, const Half* word, const Half* position,
                       int64_t hidden, Half* y, DType precision, cudaStream_t stream, TokenPlaces places) {
  if (count == 0) return;
  if (seq <= 0 || hidden <= 0) check_shape(count, seq, hidden, "embedding_forward");
  const int64_t vectors_per_row = (hidden + 7) / 8;
  const unsigned grid = blocks_for(count * vectors_per_row, kThreads);
  const bool aligned = hidden % 8 == 0 && aligned16(word) && aligned16(position) && aligned16(y);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    const auto kernel = aligned ? embedding_forward_kernel<P, true> : embedding_forward_kernel<P, false>;
    kernel<<<grid, kThreads, 0, stream>>>(tokens, count, seq, word, position, hidden, vectors_per_row, y, places);
  });
  check_launch("embedding_forward");
}

TokenRows build_token_rows(const int32_t* host_tokens, int64_t count) {
  std::vector<int32_t> order;  // the positions of the shard's tokens
  order.reserve(static_cast<std::size_t>(count));
  for (int32_t t = 0; t < static_cast<int32_t>(count); ++t) {
    if (host_tokens[t] >= 0) order.push_back(t);
  }
  // Stable: a row's positions stay ascending, so its sum runs in token order.
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return host_tokens[a] < host_tokens[b]; });
  TokenRows rows;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const int32_t token = host_tokens[order[i]];
    if (rows.row_ids.empty() || rows.row_ids.back() != token) {
      rows.row_ids.push_back(token);
      rows.row_starts.push_back(static_cast<int32_t>(i));
    }
  }
  rows.row_starts.push_back(static_cast<int32_t>(order.size()));
  rows.positions = std::move(order);
  return rows;
}

void embedding_backward(const Half* dy, const int32_t* row_ids, const int32_t* row_starts, const int32_t* positions,
                        int64_t used_rows, int64_t count, int64_t seq, int64_t hidden, float* dword, float* dposition,
                        DType precision, cudaStream_t stream, TokenPlaces places) {
  check_shape(count, seq, hidden, "embedding_backward");
  if (count == 0) return;
  const bool aligned = hidden % 8 == 0 && aligned16(dy) && aligned16(dword) && aligned16(dposition);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    if (used_rows > 0) {
      const dim3 grid(static_cast<unsigned>(used_rows),
                      static_cast<unsigned>((hidden + kColumnVectors * 8 - 1) / (kColumnVectors * 8)));
      const dim3 block(kColumnVectors, kPositionSlices);
      const auto kernel = aligned ? word_gradient_kernel<P, true> : word_gradient_kernel<P, false>;
      kernel<<<grid, block, 0, stream>>>(dy, row_ids, row_starts, positions, hidden, dword);
      check_launch("embedding word gradient");
    }
    if (dposition) {
      const int64_t vectors_per_row = (hidden + 7) / 8;
      const unsigned grid = blocks_for(seq * vectors_per_row, kThreads);
      const auto kernel = aligned ? position_gradient_kernel<P, true> : position_gradient_kernel<P, false>;
      kernel<<<grid, kThreads, 0, stream>>>(dy, count / seq, seq, hidden, vectors_per_row, dposition, places);
      check_launch("embedding position gradient");
    }
  });
}

}  // namespace megaplan::exec::cuda
