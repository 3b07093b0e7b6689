// Mixture-of-experts routing kernels. The router's kernels give each token one warp: expert i of a
// row lives in lane i % 32, register slot i / 32 (kSlots slots, picked once per call from the
// expert count), so the top k is k rounds of a warp arg-max (ties to the lower expert) and every
// sum over a row is a warp butterfly, the same order every run. The dispatch is a stable counting
// sort of the routes by expert (chunk counts, one scan, each chunk's routes placed in order), then,
// with a capacity, one block per expert that keeps, compacts and pads its routes. Floating-point
// sums over tokens go to per-token values summed by one block in a fixed order; only integer
// counts use atomics.
#include "executor/kernels/cuda/moe_routing.h"

#include <algorithm>
#include <string>

#include "executor/kernels/cuda/device_common.cuh"

namespace megaplan::exec::cuda {

namespace {

using namespace detail;

constexpr unsigned kMoeFullMask = 0xffffffffu;
constexpr int kMoeMaxExperts = 1024;
constexpr int kMoeMaxTopk = 32;
constexpr int kMoeRowWarps = 4;  // tokens (warps) per block of the router's kernels
constexpr int kMoeRowThreads = kMoeRowWarps * 32;
constexpr int kMoeThreads = 256;  // element-wise kernels, histograms, the loss's final sum
constexpr int kMoeDispatchSteps = 8;
constexpr int kMoeDispatchChunk = kMoeThreads * kMoeDispatchSteps;  // routes per block of the sort
constexpr int kMoeScanThreads = 1024;
constexpr int kMoeCapacityThreads = 512;

// Sub-buffers of one workspace, each 256-byte aligned; with a null base it only counts the bytes.
class MoeCarver {
 public:
  explicit MoeCarver(void* base) : base_(static_cast<unsigned char*>(base)) {}
  template <typename T>
  T* take(int64_t n) {
    used_ = (used_ + 255) / 256 * 256;
    T* pointer = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += static_cast<std::size_t>(std::max<int64_t>(n, 1)) * sizeof(T);
    return pointer;
  }
  std::size_t used() const { return used_; }

 private:
  unsigned char* base_;
  std::size_t used_ = 0;
};

int64_t moe_dispatch_chunks(int64_t routes) { return (routes + kMoeDispatchChunk - 1) / kMoeDispatchChunk; }

// The dispatch's scratch: each chunk's count of each expert's routes (expert-major, scanned in place
// into where they go), each expert's first sorted route, routes and first row, the routes sorted by
// expert, and the kept routes the probs policy compacts.
struct MoeDispatchScratch {
  int32_t* chunk_offsets;
  int32_t* expert_start;
  int32_t* expert_routes;
  int32_t* row_start;
  int32_t* sorted;
  int32_t* kept;
};
MoeDispatchScratch carve_dispatch(MoeCarver& carver, int64_t routes, int64_t experts) {
  MoeDispatchScratch scratch{};
  scratch.chunk_offsets = carver.take<int32_t>(experts * moe_dispatch_chunks(routes));
  scratch.expert_start = carver.take<int32_t>(experts);
  scratch.expert_routes = carver.take<int32_t>(experts);
  scratch.row_start = carver.take<int32_t>(experts);
  scratch.sorted = carver.take<int32_t>(routes);
  scratch.kept = carver.take<int32_t>(routes);
  return scratch;
}

// The losses' scratch: each token's term, the aux loss's top k, integer counts and their fp32 copy
// ([groups x experts], a group a sequence of the sequence-level loss).
struct MoeLossScratch {
  double* token_loss;
  int32_t* aux_experts;
  int32_t* histogram;
  float* group_counts;
};
MoeLossScratch carve_loss(MoeCarver& carver, int64_t tokens, int64_t topk, int64_t experts, int64_t groups) {
  MoeLossScratch scratch{};
  scratch.token_loss = carver.take<double>(tokens);
  scratch.aux_experts = carver.take<int32_t>(tokens * topk);
  scratch.histogram = carver.take<int32_t>(groups * experts);
  scratch.group_counts = carver.take<float>(groups * experts);
  return scratch;
}

void check_moe_router(const char* what, int64_t tokens, int64_t experts, int64_t topk) {
  if (tokens < 0 || experts < 1 || experts > kMoeMaxExperts || topk < 1 ||
      topk > std::min<int64_t>(experts, kMoeMaxTopk) || tokens * topk > 0x7fffffff) {
    throw SpecError("--device", std::string(what) +
                                    ": needs 1 <= topk <= min(experts, 32), experts <= 1024 and tokens x topk < 2^31, "
                                    "got tokens " +
                                    std::to_string(tokens) + ", experts " + std::to_string(experts) + ", topk " +
                                    std::to_string(topk));
  }
}

// Runs body(std::integral_constant<int, kSlots>{}) with enough register slots for `experts`.
template <typename Body>
void with_moe_slots(int64_t experts, Body&& body) {
  if (experts <= 64) return body(std::integral_constant<int, 2>{});
  if (experts <= 256) return body(std::integral_constant<int, 8>{});
  return body(std::integral_constant<int, 32>{});
}

unsigned moe_row_blocks(int64_t tokens) { return blocks_for(tokens, kMoeRowWarps); }

__device__ __forceinline__ int64_t moe_min(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ float moe_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

__device__ __forceinline__ int64_t moe_warp_token() {
  return static_cast<int64_t>(blockIdx.x) * kMoeRowWarps + threadIdx.x / 32;
}

// Lane `lane`'s logits of one row: expert s * 32 + lane in slot s, -inf past the row.
template <DType P, int kSlots>
__device__ __forceinline__ void moe_load_row(const Half* row, int experts, int lane, float (&z)[kSlots]) {
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int i = s * 32 + lane;
    z[s] = i < experts ? load<P>(row, i) : -INFINITY;
  }
}

// The warp's best (score, index) of the lanes' candidates, with the candidate's logit: the highest
// score, ties to the lower index; index -1 is no candidate. Every lane gets the same winner (the
// order is total).
__device__ __forceinline__ void moe_warp_best(float& score, int& index, float& logit) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other_score = __shfl_xor_sync(kMoeFullMask, score, offset);
    const int other_index = __shfl_xor_sync(kMoeFullMask, index, offset);
    const float other_logit = __shfl_xor_sync(kMoeFullMask, logit, offset);
    if (other_index >= 0 && (index < 0 || other_score > score || (other_score == score && other_index < index))) {
      score = other_score;
      index = other_index;
      logit = other_logit;
    }
  }
}

// The k best experts of a row by `choose` (descending, ties to the lower expert): lane j < k gets
// the j-th one's index and logit. REQUIRES: k <= experts, k <= 32.
template <int kSlots>
__device__ __forceinline__ void moe_choose(const float (&choose)[kSlots], const float (&z)[kSlots], int experts, int k,
                                           int lane, int& chosen, float& chosen_logit) {
  uint32_t taken = 0;  // bit s: slot s of this lane is chosen already
  chosen = -1;
  chosen_logit = 0.0f;
  for (int j = 0; j < k; ++j) {
    float score = 0.0f, logit = 0.0f;
    int index = -1;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int i = s * 32 + lane;  // ascending: a tie keeps the lower expert
      if (i < experts && !((taken >> s) & 1u) && (index < 0 || choose[s] > score)) {
        score = choose[s];
        index = i;
        logit = z[s];
      }
    }
    moe_warp_best(score, index, logit);
    if (index >= 0 && index % 32 == lane) taken |= 1u << (index / 32);
    if (lane == j) {
      chosen = index;
      chosen_logit = logit;
    }
  }
}

template <DType P, int kSlots>
__global__ void __launch_bounds__(kMoeRowThreads)
    moe_top_k_kernel(const Half* logits, int64_t tokens, int experts, int k, bool sigmoid, bool pre_softmax,
                     float scaling, const float* expert_bias, int32_t* out_experts, float* out_probs) {
  const int lane = threadIdx.x % 32;
  const int64_t t = moe_warp_token();
  if (t >= tokens) return;  // the whole warp
  float z[kSlots], choose[kSlots];
  moe_load_row<P>(logits + t * experts, experts, lane, z);
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int i = s * 32 + lane;
    choose[s] = z[s];
    if (sigmoid && expert_bias) choose[s] = i < experts ? moe_sigmoid(z[s]) + expert_bias[i] : -INFINITY;
  }
  int chosen;
  float logit;
  moe_choose(choose, z, experts, k, lane, chosen, logit);
  float prob;
  if (!sigmoid && pre_softmax) {
    float top = -INFINITY;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) top = fmaxf(top, z[s]);
    top = warp_max(top);
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) sum += s * 32 + lane < experts ? expf(z[s] - top) : 0.0f;
    sum = warp_sum(sum);
    prob = expf(logit - top) / sum;
  } else if (!sigmoid) {
    const float top = warp_max(lane < k ? logit : -INFINITY);
    const float term = lane < k ? expf(logit - top) : 0.0f;
    prob = term / warp_sum(term);
  } else {
    const float s = lane < k ? moe_sigmoid(logit) : 0.0f;
    const float sum = warp_sum(s);
    prob = k > 1 ? s / (sum + 1e-20f) : s;
  }
  if (lane < k) {
    out_experts[t * k + lane] = chosen;
    out_probs[t * k + lane] = prob * scaling;
  }
}

template <DType P, int kSlots>
__global__ void __launch_bounds__(kMoeRowThreads)
    moe_top_k_backward_kernel(const Half* logits, int64_t tokens, int experts, int k, bool sigmoid, bool pre_softmax,
                              float scaling, const int32_t* chosen_experts, const float* d_probs, float* d_logits) {
  const int lane = threadIdx.x % 32;
  const int64_t t = moe_warp_token();
  if (t >= tokens) return;
  const Half* row = logits + t * experts;
  float* d_row = d_logits + t * experts;
  int chosen = -1;
  float g = 0.0f, logit = 0.0f;
  if (lane < k) {
    chosen = chosen_experts[t * k + lane];
    g = d_probs[t * k + lane] * scaling;
    logit = load<P>(row, chosen);
  }
  if (!sigmoid && pre_softmax) {
    // p_j = s_(chosen j) of s = softmax(z): dz_m = s_m (g_m [m chosen] - Σ_j g_j s_(chosen j)).
    float z[kSlots];
    moe_load_row<P>(row, experts, lane, z);
    float top = -INFINITY;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) top = fmaxf(top, z[s]);
    top = warp_max(top);
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) sum += s * 32 + lane < experts ? expf(z[s] - top) : 0.0f;
    sum = warp_sum(sum);
    const float dot = warp_sum(lane < k ? g * (expf(logit - top) / sum) : 0.0f);
    float chosen_g[kSlots];
    uint32_t is_chosen = 0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) chosen_g[s] = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int expert = __shfl_sync(kMoeFullMask, chosen, j);
      const float gradient = __shfl_sync(kMoeFullMask, g, j);
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        if (s * 32 + lane == expert) {
          chosen_g[s] = gradient;
          is_chosen |= 1u << s;
        }
      }
    }
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int i = s * 32 + lane;
      if (i >= experts) continue;
      const float score = expf(z[s] - top) / sum;
      float d = d_row[i] - score * dot;
      if ((is_chosen >> s) & 1u) d += score * chosen_g[s];
      d_row[i] = d;
    }
  } else if (!sigmoid) {
    // p = softmax over the chosen logits: dz_j = p_j (g_j - Σ p g).
    const float top = warp_max(lane < k ? logit : -INFINITY);
    const float term = lane < k ? expf(logit - top) : 0.0f;
    const float p = term / warp_sum(term);
    const float dot = warp_sum(p * g);
    if (lane < k) d_row[chosen] += p * (g - dot);
  } else {
    // p_j = σ_j / (Σ_chosen σ + 1e-20) for k > 1, else σ_j; dσ/dz = σ (1 - σ).
    const float s = lane < k ? moe_sigmoid(logit) : 0.0f;
    const float sum = warp_sum(s);
    const float dot = warp_sum(g * s);
    const float denominator = sum + 1e-20f;
    if (lane < k) {
      const float d_sigmoid = k > 1 ? g / denominator - dot / (denominator * denominator) : g;
      d_row[chosen] += d_sigmoid * s * (1.0f - s);
    }
  }
}

// The aux loss's top k of each token into aux_experts [tokens x k]: by the logits (the softmax over
// every expert and the normalised sigmoids are both monotonic in them).
template <DType P, int kSlots>
__global__ void __launch_bounds__(kMoeRowThreads)
    moe_aux_top_k_kernel(const Half* logits, int64_t tokens, int experts, int k, int32_t* aux_experts) {
  const int lane = threadIdx.x % 32;
  const int64_t t = moe_warp_token();
  if (t >= tokens) return;
  float z[kSlots];
  moe_load_row<P>(logits + t * experts, experts, lane, z);
  int chosen;
  float logit;
  moe_choose(z, z, experts, k, lane, chosen, logit);
  if (lane < k) aux_experts[t * k + lane] = chosen;
}

// histogram[(r / routes_per_group) * expert_count + experts[r]] += 1 for each route in range:
// integer atomics (their sum does not depend on their order), one per warp and bin.
__global__ void __launch_bounds__(kMoeThreads)
    moe_histogram_kernel(const int32_t* experts, int64_t routes, int expert_count, int64_t routes_per_group,
                         int32_t* histogram) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int bin = -1;
  if (r < routes) {
    const int expert = experts[r];
    if (expert >= 0 && expert < expert_count) bin = static_cast<int>(r / routes_per_group) * expert_count + expert;
  }
  const unsigned peers = __match_any_sync(kMoeFullMask, bin);
  if (bin >= 0 && static_cast<int>(threadIdx.x % 32) == __ffs(static_cast<int>(peers)) - 1) {
    atomicAdd(&histogram[bin], __popc(peers));
  }
}

// counts = (counts where accumulate, else 0) + histogram, exact below 2^24.
__global__ void moe_counts_kernel(const int32_t* histogram, int64_t n, bool accumulate, float* counts) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) counts[i] = (accumulate ? counts[i] : 0.0f) + static_cast<float>(histogram[i]);
}

// The switch loss's term of each token, Σ_i w_i q_i with w_i = scale · counts of its group, into
// token_loss (unless null), and d_logits += gradient_scale · its gradient (unless null).
template <DType P, int kSlots>
__global__ void __launch_bounds__(kMoeRowThreads)
    moe_switch_loss_kernel(const Half* logits, int64_t tokens, int experts, bool sigmoid, const float* counts,
                           int64_t group_tokens, double scale, float gradient_scale, double* token_loss,
                           float* d_logits) {
  const int lane = threadIdx.x % 32;
  const int64_t t = moe_warp_token();
  if (t >= tokens) return;
  float z[kSlots], q[kSlots], w[kSlots];
  moe_load_row<P>(logits + t * experts, experts, lane, z);
  const float* group_counts = counts + (t / group_tokens) * experts;
  float denominator;
  if (!sigmoid) {
    float top = -INFINITY;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) top = fmaxf(top, z[s]);
    top = warp_max(top);
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      q[s] = s * 32 + lane < experts ? expf(z[s] - top) : 0.0f;
      sum += q[s];
    }
    denominator = warp_sum(sum);
  } else {
    float sum = 0.0f;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      q[s] = s * 32 + lane < experts ? moe_sigmoid(z[s]) : 0.0f;
      sum += q[s];
    }
    denominator = warp_sum(sum) + 1e-20f;
  }
  float dot = 0.0f;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int i = s * 32 + lane;
    w[s] = i < experts ? static_cast<float>(scale * static_cast<double>(group_counts[i])) : 0.0f;
    dot += w[s] * (q[s] / denominator);
  }
  dot = warp_sum(dot);
  if (token_loss && lane == 0) token_loss[t] = dot;
  if (!d_logits) return;
  float* d_row = d_logits + t * experts;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int i = s * 32 + lane;
    if (i >= experts) continue;
    // softmax: dz_m = q_m (w_m - dot); normalised sigmoids: (w_m - dot) / (Σσ + 1e-20) · σ (1 - σ).
    const float gradient =
        sigmoid ? (w[s] - dot) / denominator * q[s] * (1.0f - q[s]) : q[s] / denominator * (w[s] - dot);
    d_row[i] += gradient_scale * gradient;
  }
}

// The z loss's term of each token, logsumexp², into token_loss (unless null), and d_logits +=
// gradient_scale · gradient_factor · lse · softmax (unless null).
template <DType P, int kSlots>
__global__ void __launch_bounds__(kMoeRowThreads)
    moe_z_loss_kernel(const Half* logits, int64_t tokens, int experts, double gradient_factor, float gradient_scale,
                      double* token_loss, float* d_logits) {
  const int lane = threadIdx.x % 32;
  const int64_t t = moe_warp_token();
  if (t >= tokens) return;
  float z[kSlots];
  moe_load_row<P>(logits + t * experts, experts, lane, z);
  float top = -INFINITY;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) top = fmaxf(top, z[s]);
  top = warp_max(top);
  float sum = 0.0f;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) sum += s * 32 + lane < experts ? expf(z[s] - top) : 0.0f;
  sum = warp_sum(sum);
  const float lse = top + logf(sum);
  if (token_loss && lane == 0) token_loss[t] = static_cast<double>(lse) * lse;
  if (!d_logits) return;
  const float factor = static_cast<float>(gradient_factor * lse);
  float* d_row = d_logits + t * experts;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int i = s * 32 + lane;
    if (i < experts) d_row[i] += gradient_scale * (factor * (expf(z[s] - top) / sum));
  }
}

// *loss_sum += factor · Σ token_loss, one block: each thread's tokens in double, then a fixed tree.
__global__ void __launch_bounds__(kMoeThreads)
    moe_loss_finish_kernel(const double* token_loss, int64_t tokens, double factor, double* loss_sum) {
  __shared__ double partial[kMoeThreads];
  double sum = 0;
  for (int64_t t = threadIdx.x; t < tokens; t += kMoeThreads) sum += token_loss[t];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kMoeThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) *loss_sum += factor * partial[0];
}

// One block: the mean count in double (the counts are whole numbers, as the reference's int64s),
// then each bias moved by ±rate in double.
__global__ void __launch_bounds__(kMoeThreads)
    moe_update_expert_bias_kernel(const float* counts, int64_t experts, float rate, float* expert_bias) {
  __shared__ double partial[kMoeThreads];
  double sum = 0;
  for (int64_t i = threadIdx.x; i < experts; i += kMoeThreads)
    sum += static_cast<double>(static_cast<long long>(counts[i]));
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kMoeThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const double mean = partial[0] / static_cast<double>(experts);
  for (int64_t i = threadIdx.x; i < experts; i += kMoeThreads) {
    const double offset = mean - static_cast<double>(static_cast<long long>(counts[i]));
    const double sign = offset > 0 ? 1.0 : offset < 0 ? -1.0 : 0.0;
    expert_bias[i] = static_cast<float>(static_cast<double>(expert_bias[i]) + sign * static_cast<double>(rate));
  }
}

// --- The dispatch.

// The block's exclusive prefix sum of `value` in thread order, and its total. `shared` holds 33
// ints; blockDim.x a multiple of 32. Every thread of the block calls it.
__device__ __forceinline__ int32_t moe_block_exclusive_scan(int32_t value, int32_t* shared, int32_t& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  int32_t inclusive = value;
  for (int offset = 1; offset < 32; offset *= 2) {
    const int32_t lower = __shfl_up_sync(kMoeFullMask, inclusive, offset);
    if (lane >= offset) inclusive += lower;
  }
  __syncthreads();  // the previous call's readers are done with `shared`
  if (lane == 31) shared[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int32_t mine = lane < warps ? shared[lane] : 0;
    int32_t running = mine;
    for (int offset = 1; offset < 32; offset *= 2) {
      const int32_t lower = __shfl_up_sync(kMoeFullMask, running, offset);
      if (lane >= offset) running += lower;
    }
    if (lane < warps) shared[lane] = running - mine;
    if (lane == 31) shared[32] = running;
  }
  __syncthreads();
  total = shared[32];
  return shared[warp] + inclusive - value;
}

// Each chunk's count of each expert's routes: chunk_counts[e * chunks + chunk].
__global__ void __launch_bounds__(kMoeThreads)
    moe_chunk_counts_kernel(const int32_t* experts, int64_t routes, int expert_count, int64_t chunks,
                            int32_t* chunk_counts) {
  extern __shared__ int32_t moe_chunk_shared[];
  for (int e = threadIdx.x; e < expert_count; e += blockDim.x) moe_chunk_shared[e] = 0;
  __syncthreads();
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kMoeDispatchChunk;
  for (int step = 0; step < kMoeDispatchSteps; ++step) {
    const int64_t r = first + step * kMoeThreads + threadIdx.x;
    if (r < routes) {
      const int expert = experts[r];
      if (expert >= 0 && expert < expert_count) atomicAdd(&moe_chunk_shared[expert], 1);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < expert_count; e += blockDim.x)
    chunk_counts[e * chunks + blockIdx.x] = moe_chunk_shared[e];
}

// One block: the chunk counts scanned in place (expert-major: where each chunk's routes of each
// expert start among the routes sorted by expert), each expert's first sorted route and route
// count, and its rows (every route dropless; at most `capacity`; min(capacity, tokens) padded) and
// first row. REQUIRES: expert_count <= blockDim.x.
__global__ void __launch_bounds__(kMoeScanThreads)
    moe_dispatch_scan_kernel(int32_t* chunk_offsets, int expert_count, int64_t chunks, int64_t tokens, int64_t capacity,
                             bool pad, int32_t* expert_start, int32_t* expert_routes, int32_t* row_start,
                             int64_t* rows_per_expert) {
  __shared__ int32_t scan_shared[33];
  const int64_t n = expert_count * chunks;
  const int64_t per_thread = (n + kMoeScanThreads - 1) / kMoeScanThreads;
  const int64_t begin = moe_min(n, threadIdx.x * per_thread);
  const int64_t end = moe_min(n, begin + per_thread);
  int32_t sum = 0;
  for (int64_t i = begin; i < end; ++i) sum += chunk_offsets[i];
  int32_t total;
  int32_t running = moe_block_exclusive_scan(sum, scan_shared, total);
  for (int64_t i = begin; i < end; ++i) {
    const int32_t count = chunk_offsets[i];
    chunk_offsets[i] = running;
    running += count;
  }
  __syncthreads();  // the block sees the offsets
  const int e = threadIdx.x;
  int32_t start = 0, routes = 0, rows = 0;
  if (e < expert_count) {
    start = chunk_offsets[e * chunks];
    routes = (e + 1 < expert_count ? chunk_offsets[(e + 1) * chunks] : total) - start;
    if (capacity == 0) {
      rows = routes;
    } else if (pad) {
      rows = static_cast<int32_t>(moe_min(capacity, tokens));
    } else {
      rows = static_cast<int32_t>(moe_min(routes, capacity));
    }
  }
  int32_t all_rows;
  const int32_t first_row = moe_block_exclusive_scan(rows, scan_shared, all_rows);
  if (e < expert_count) {
    expert_start[e] = start;
    expert_routes[e] = routes;
    row_start[e] = first_row;
    rows_per_expert[e] = rows;
  }
}

// Each chunk's routes into their places in the sort by expert, in route order: a route's place is
// its chunk's start for its expert, plus the routes of that expert in the chunk's earlier steps
// (running), in this step's earlier warps, and in its own warp's lower lanes (a warp match).
// Dropless, the places are the rows: token_rows and row_tokens are written here (else null).
__global__ void __launch_bounds__(kMoeThreads)
    moe_dispatch_scatter_kernel(const int32_t* experts, int64_t routes, int expert_count, int64_t chunks, int topk,
                                const int32_t* chunk_offsets, int32_t* sorted, int32_t* token_rows,
                                int32_t* row_tokens) {
  constexpr int kWarps = kMoeThreads / 32;
  extern __shared__ int32_t moe_scatter_shared[];
  int32_t* running = moe_scatter_shared;                     // [experts]: this chunk's routes placed so far
  int32_t* warp_counts = moe_scatter_shared + expert_count;  // [warps x experts]: this step's, by warp
  for (int i = threadIdx.x; i < (kWarps + 1) * expert_count; i += blockDim.x) moe_scatter_shared[i] = 0;
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned lower_lanes = (1u << lane) - 1u;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kMoeDispatchChunk;
  for (int step = 0; step < kMoeDispatchSteps; ++step) {
    const int64_t r = first + step * kMoeThreads + threadIdx.x;
    int expert = -1;
    if (r < routes) {
      expert = experts[r];
      if (expert < 0 || expert >= expert_count) expert = -1;
    }
    const unsigned peers = __match_any_sync(kMoeFullMask, expert);
    const int rank = __popc(peers & lower_lanes);
    if (expert >= 0 && rank == 0) warp_counts[warp * expert_count + expert] = __popc(peers);
    __syncthreads();
    if (expert >= 0) {
      int32_t place = chunk_offsets[expert * chunks + blockIdx.x] + running[expert] + rank;
      for (int w = 0; w < warp; ++w) place += warp_counts[w * expert_count + expert];
      sorted[place] = static_cast<int32_t>(r);
      if (token_rows) {
        token_rows[r] = place;
        row_tokens[place] = static_cast<int32_t>(r / topk);
      }
    }
    __syncthreads();
    if (expert >= 0 && rank == 0) {
      atomicAdd(&running[expert], __popc(peers));  // integer: warps of one expert, any order
      warp_counts[warp * expert_count + expert] = 0;
    }
    __syncthreads();
  }
}

// A probability's order as an unsigned key (larger float, larger key; -0 as +0, as the CPU compares).
__device__ __forceinline__ uint32_t moe_prob_key(float p) {
  const uint32_t bits = __float_as_uint(p == 0.0f ? 0.0f : p);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// One block per expert, with a capacity: its kept routes (all of them within the capacity; over it
// the earliest, or by probs the `capacity` highest probabilities, ties to the earlier token, found
// by a radix select on the keys and compacted in token order), then its rows: with `pad`, the
// earliest P = min(capacity, tokens) - kept tokens not routed here are merged in token order. With
// c the kept routes before the P-th unrouted token (those whose token - index < P), rows 0 .. P + c
// - 1 are tokens 0 .. P + c - 1, and kept route i >= c is row i + P.
__global__ void __launch_bounds__(kMoeCapacityThreads)
    moe_dispatch_capacity_kernel(const int32_t* sorted, const float* probs, int64_t tokens, int topk, int64_t capacity,
                                 bool by_probs, bool pad, const int32_t* expert_start, const int32_t* expert_routes,
                                 const int32_t* row_start, int32_t* kept, int32_t* token_rows, int32_t* row_tokens) {
  __shared__ int32_t scan_shared[33];
  __shared__ int32_t digits[256];
  __shared__ int32_t selected[2];  // the digit chosen, the keys still to take among those matching
  const int e = blockIdx.x;
  const int32_t start = expert_start[e], routes = expert_routes[e], first_row = row_start[e];
  const int32_t* segment = sorted + start;
  const auto kept_routes = static_cast<int32_t>(moe_min(routes, capacity));
  if (routes > capacity && by_probs) {
    uint32_t prefix = 0, prefix_mask = 0;
    int32_t remaining = kept_routes;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += blockDim.x) digits[i] = 0;
      __syncthreads();
      for (int32_t i = threadIdx.x; i < routes; i += blockDim.x) {
        const uint32_t key = moe_prob_key(probs[segment[i]]);
        if ((key & prefix_mask) == prefix) atomicAdd(&digits[(key >> shift) & 255u], 1);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int32_t left = remaining;
        int digit = 255;
        for (; digit > 0; --digit) {
          if (digits[digit] >= left) break;
          left -= digits[digit];
        }
        selected[0] = digit;
        selected[1] = left;
      }
      __syncthreads();
      prefix |= static_cast<uint32_t>(selected[0]) << shift;
      prefix_mask |= 255u << shift;
      remaining = selected[1];
      __syncthreads();
    }
    // Keys above `prefix` are kept, and the first `remaining` equal to it.
    int32_t kept_before = 0, ties_before = 0;
    for (int32_t base = 0; base < routes; base += blockDim.x) {
      const int32_t i = base + threadIdx.x;
      int32_t route = -1;
      uint32_t key = 0;
      if (i < routes) {
        route = segment[i];
        key = moe_prob_key(probs[route]);
      }
      const bool tie = i < routes && key == prefix;
      int32_t ties_here, kept_here;
      const int32_t tie_rank = ties_before + moe_block_exclusive_scan(tie ? 1 : 0, scan_shared, ties_here);
      const bool keep = i < routes && (key > prefix || (tie && tie_rank < remaining));
      const int32_t place = kept_before + moe_block_exclusive_scan(keep ? 1 : 0, scan_shared, kept_here);
      if (keep) kept[start + place] = route;
      ties_before += ties_here;
      kept_before += kept_here;
    }
    __syncthreads();  // the block sees the kept routes
    segment = kept + start;
  }
  const int32_t padding = pad ? static_cast<int32_t>(moe_min(capacity, tokens) - kept_routes) : 0;
  int32_t before = 0;
  if (padding > 0) {
    for (int32_t base = 0; base < kept_routes; base += blockDim.x) {
      const int32_t i = base + threadIdx.x;
      const bool early = i < kept_routes && segment[i] / topk - i < padding;
      int32_t here;
      moe_block_exclusive_scan(early ? 1 : 0, scan_shared, here);
      before += here;
    }
  }
  const int32_t leading = padding + before;  // rows 0 .. leading - 1: tokens 0 .. leading - 1
  for (int32_t m = threadIdx.x; m < kept_routes + padding; m += blockDim.x) {
    row_tokens[first_row + m] = m < leading ? m : segment[m - padding] / topk;
  }
  for (int32_t i = threadIdx.x; i < kept_routes; i += blockDim.x) {
    const int32_t route = segment[i];
    token_rows[route] = first_row + (i < before ? route / topk : i + padding);
  }
}

// --- Permutation and combination: one thread per 8 consecutive values of one row.

bool moe_aligned(const void* pointer, int64_t hidden) {
  return hidden % 8 == 0 && reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

template <bool kAligned>
__global__ void moe_permute_kernel(const Half* x, int64_t hidden, int64_t vectors_per_row, const int32_t* row_tokens,
                                   int64_t rows, Half* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * vectors_per_row) return;
  const int64_t row = i / vectors_per_row, start = (i % vectors_per_row) * 8;
  const Half* from = x + static_cast<int64_t>(row_tokens[row]) * hidden;
  Half* to = out + row * hidden;
  if (kAligned && start + 8 <= hidden) {
    *reinterpret_cast<uint4*>(to + start) = *reinterpret_cast<const uint4*>(from + start);
    return;
  }
  for (int e = 0; e < 8 && start + e < hidden; ++e) to[start + e] = from[start + e];
}

// y[token] = Σ over its routes in slot order of (probs ? prob : 1) · its row, fp32.
template <DType P, bool kAligned>
__global__ void moe_gather_sum_kernel(const Half* rows, int64_t hidden, int64_t vectors_per_row,
                                      const int32_t* token_rows, const float* probs, int64_t tokens, int topk,
                                      Half* y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * vectors_per_row) return;
  const int64_t token = i / vectors_per_row, start = (i % vectors_per_row) * 8;
  float sum[8] = {};
  for (int j = 0; j < topk; ++j) {
    const int32_t row = token_rows[token * topk + j];
    if (row < 0) continue;
    float values[8];
    load8<P, kAligned>(rows + static_cast<int64_t>(row) * hidden, start, hidden, values);
    const float prob = probs ? probs[token * topk + j] : 1.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) sum[e] += prob * values[e];
  }
  store8<P, kAligned>(y + token * hidden, start, hidden, sum);
}

// d_rows[row] = prob · dy[its token] for a route's row, 0 for a pad row.
template <DType P, bool kAligned>
__global__ void moe_combine_backward_rows_kernel(const Half* dy, int64_t hidden, int64_t vectors_per_row,
                                                 const int32_t* token_rows, const int32_t* row_tokens,
                                                 const float* probs, int topk, int64_t rows, Half* d_rows) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * vectors_per_row) return;
  const int64_t row = i / vectors_per_row, start = (i % vectors_per_row) * 8;
  const int64_t token = row_tokens[row];
  int slot = -1;
  for (int j = 0; j < topk; ++j) {
    if (token_rows[token * topk + j] == row) slot = j;
  }
  float values[8] = {};
  if (slot >= 0) {
    load8<P, kAligned>(dy + token * hidden, start, hidden, values);
    const float prob = probs[token * topk + slot];
#pragma unroll
    for (int e = 0; e < 8; ++e) values[e] = prob * values[e];
  }
  store8<P, kAligned>(d_rows + row * hidden, start, hidden, values);
}

// d_probs[route] = dy[token] · rows[its row] (a warp's fixed-order sum), 0 where dropped.
template <DType P, bool kAligned>
__global__ void __launch_bounds__(kMoeRowThreads)
    moe_combine_backward_probs_kernel(const Half* dy, const Half* rows, int64_t hidden, const int32_t* token_rows,
                                      int64_t routes, int topk, float* d_probs) {
  const int lane = threadIdx.x % 32;
  const int64_t route = moe_warp_token();
  if (route >= routes) return;
  const int32_t row = token_rows[route];
  float sum = 0.0f;
  if (row >= 0) {
    const Half* dy_row = dy + (route / topk) * hidden;
    const Half* expert_row = rows + static_cast<int64_t>(row) * hidden;
    for (int64_t start = lane * 8; start < hidden; start += 32 * 8) {
      float a[8], b[8];
      load8<P, kAligned>(dy_row, start, hidden, a);
      load8<P, kAligned>(expert_row, start, hidden, b);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += a[e] * b[e];
    }
    sum = warp_sum(sum);
  }
  if (lane == 0) d_probs[route] = sum;
}

void moe_histogram(const int32_t* experts, int64_t routes, int64_t expert_count, int64_t routes_per_group,
                   int32_t* histogram, cudaStream_t stream) {
  if (routes == 0) return;
  moe_histogram_kernel<<<blocks_for(routes, kMoeThreads), kMoeThreads, 0, stream>>>(
      experts, routes, static_cast<int>(expert_count), routes_per_group, histogram);
  check_launch("moe_histogram_kernel");
}

void moe_counts(const int32_t* histogram, int64_t n, bool accumulate, float* counts, cudaStream_t stream) {
  moe_counts_kernel<<<blocks_for(n, kMoeThreads), kMoeThreads, 0, stream>>>(histogram, n, accumulate, counts);
  check_launch("moe_counts_kernel");
}

void moe_aux_top_k(const Half* logits, int64_t tokens, int64_t experts, int64_t topk, int32_t* aux_experts,
                   DType precision, cudaStream_t stream) {
  if (tokens == 0) return;
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    with_moe_slots(experts, [&](auto slots) {
      constexpr int kSlots = decltype(slots)::value;
      moe_aux_top_k_kernel<P, kSlots><<<moe_row_blocks(tokens), kMoeRowThreads, 0, stream>>>(
          logits, tokens, static_cast<int>(experts), static_cast<int>(topk), aux_experts);
    });
  });
  check_launch("moe_aux_top_k_kernel");
}

// The switch loss of `tokens` tokens in groups of group_tokens with counts [groups x experts].
void moe_switch_terms(const Half* logits, int64_t tokens, int64_t experts, bool sigmoid, const float* counts,
                      int64_t group_tokens, double scale, double* loss_sum, float* d_logits, float gradient_scale,
                      double* token_loss, DType precision, cudaStream_t stream) {
  if (tokens == 0 || (!loss_sum && !d_logits)) return;
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    with_moe_slots(experts, [&](auto slots) {
      constexpr int kSlots = decltype(slots)::value;
      moe_switch_loss_kernel<P, kSlots><<<moe_row_blocks(tokens), kMoeRowThreads, 0, stream>>>(
          logits, tokens, static_cast<int>(experts), sigmoid, counts, group_tokens, scale, gradient_scale,
          loss_sum ? token_loss : nullptr, d_logits);
    });
  });
  check_launch("moe_switch_loss_kernel");
  if (!loss_sum) return;
  moe_loss_finish_kernel<<<1, kMoeThreads, 0, stream>>>(token_loss, tokens, 1.0, loss_sum);
  check_launch("moe_loss_finish_kernel");
}

}  // namespace

std::size_t moe_workspace_bytes(int64_t tokens, int64_t topk, int64_t experts, int64_t sequences) {
  MoeCarver dispatch(nullptr), loss(nullptr), count(nullptr);
  carve_dispatch(dispatch, tokens * topk, experts);
  carve_loss(loss, tokens, topk, experts, std::max<int64_t>(sequences, 1));
  count.take<int32_t>(experts);
  return std::max({dispatch.used(), loss.used(), count.used()});
}

void moe_top_k(const Half* logits, int64_t tokens, const MoeRouter& router, const float* expert_bias, int32_t* experts,
               float* probs, DType precision, cudaStream_t stream) {
  const auto e = static_cast<int64_t>(router.experts), k = static_cast<int64_t>(router.topk);
  check_moe_router("moe_top_k", tokens, e, k);
  if (tokens == 0) return;
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    with_moe_slots(e, [&](auto slots) {
      constexpr int kSlots = decltype(slots)::value;
      moe_top_k_kernel<P, kSlots><<<moe_row_blocks(tokens), kMoeRowThreads, 0, stream>>>(
          logits, tokens, static_cast<int>(e), static_cast<int>(k), router.sigmoid, router.pre_softmax,
          router.scaling_factor, expert_bias, experts, probs);
    });
  });
  check_launch("moe_top_k_kernel");
}

void moe_top_k_backward(const Half* logits, int64_t tokens, const MoeRouter& router, const int32_t* experts,
                        const float* d_probs, float* d_logits, DType precision, cudaStream_t stream) {
  const auto e = static_cast<int64_t>(router.experts), k = static_cast<int64_t>(router.topk);
  check_moe_router("moe_top_k_backward", tokens, e, k);
  if (tokens == 0) return;
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    with_moe_slots(e, [&](auto slots) {
      constexpr int kSlots = decltype(slots)::value;
      moe_top_k_backward_kernel<P, kSlots><<<moe_row_blocks(tokens), kMoeRowThreads, 0, stream>>>(
          logits, tokens, static_cast<int>(e), static_cast<int>(k), router.sigmoid, router.pre_softmax,
          router.scaling_factor, experts, d_probs, d_logits);
    });
  });
  check_launch("moe_top_k_backward_kernel");
}

void moe_count_routes(const int32_t* experts, int64_t routes, int64_t expert_count, float* counts, void* workspace,
                      cudaStream_t stream) {
  if (expert_count <= 0 || routes < 0 || routes > 0x7fffffff) {
    throw SpecError("--device", "moe_count_routes: needs experts > 0 and 0 <= routes < 2^31, got experts " +
                                    std::to_string(expert_count) + ", routes " + std::to_string(routes));
  }
  if (routes == 0) return;
  MoeCarver carver(workspace);
  int32_t* histogram = carver.take<int32_t>(expert_count);
  check(cudaMemsetAsync(histogram, 0, static_cast<std::size_t>(expert_count) * sizeof(int32_t), stream),
        "cudaMemsetAsync (moe_count_routes)");
  moe_histogram(experts, routes, expert_count, routes, histogram, stream);
  moe_counts(histogram, expert_count, true, counts, stream);
}

void moe_dispatch(const int32_t* experts, const float* probs, int64_t tokens, int64_t topk, int64_t expert_count,
                  const MoeCapacity& capacity, MoeDispatchMaps maps, int64_t* rows_per_expert, void* workspace,
                  cudaStream_t stream) {
  check_moe_router("moe_dispatch", tokens, expert_count, topk);
  const auto cap = static_cast<int64_t>(std::min<std::size_t>(capacity.capacity, 0x7fffffff));
  const bool by_probs = cap > 0 && capacity.policy == MoeDropPolicy::kProbs;
  if (by_probs && !probs) throw SpecError("--device", "moe_dispatch: the probs drop policy needs the probabilities");
  if (cap > 0 && capacity.pad && expert_count * std::min(cap, tokens) > 0x7fffffff) {
    throw SpecError("--device", "moe_dispatch: experts x capacity must stay below 2^31 rows");
  }
  const int64_t routes = tokens * topk;
  const auto e = static_cast<int>(expert_count);
  if (routes == 0) {
    check(cudaMemsetAsync(rows_per_expert, 0, static_cast<std::size_t>(expert_count) * sizeof(int64_t), stream),
          "cudaMemsetAsync (moe_dispatch)");
    return;
  }
  check(cudaMemsetAsync(maps.token_rows, 0xff, static_cast<std::size_t>(routes) * sizeof(int32_t), stream),
        "cudaMemsetAsync (moe_dispatch)");  // -1: dropped, until placed
  MoeCarver carver(workspace);
  const MoeDispatchScratch scratch = carve_dispatch(carver, routes, expert_count);
  const int64_t chunks = moe_dispatch_chunks(routes);
  const auto blocks = static_cast<unsigned>(chunks);
  moe_chunk_counts_kernel<<<blocks, kMoeThreads, static_cast<std::size_t>(e) * sizeof(int32_t), stream>>>(
      experts, routes, e, chunks, scratch.chunk_offsets);
  check_launch("moe_chunk_counts_kernel");
  moe_dispatch_scan_kernel<<<1, kMoeScanThreads, 0, stream>>>(scratch.chunk_offsets, e, chunks, tokens, cap,
                                                              capacity.pad, scratch.expert_start, scratch.expert_routes,
                                                              scratch.row_start, rows_per_expert);
  check_launch("moe_dispatch_scan_kernel");
  const bool dropless = cap == 0;
  const std::size_t scatter_shared = static_cast<std::size_t>(kMoeThreads / 32 + 1) * e * sizeof(int32_t);
  moe_dispatch_scatter_kernel<<<blocks, kMoeThreads, scatter_shared, stream>>>(
      experts, routes, e, chunks, static_cast<int>(topk), scratch.chunk_offsets, scratch.sorted,
      dropless ? maps.token_rows : nullptr, dropless ? maps.row_tokens : nullptr);
  check_launch("moe_dispatch_scatter_kernel");
  if (dropless) return;
  moe_dispatch_capacity_kernel<<<static_cast<unsigned>(e), kMoeCapacityThreads, 0, stream>>>(
      scratch.sorted, probs, tokens, static_cast<int>(topk), cap, by_probs, capacity.pad, scratch.expert_start,
      scratch.expert_routes, scratch.row_start, scratch.kept, maps.token_rows, maps.row_tokens);
  check_launch("moe_dispatch_capacity_kernel");
}

void moe_permute(const Half* x, int64_t hidden, const int32_t* row_tokens, int64_t rows, Half* out,
                 cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return;
  const int64_t vectors = (hidden + 7) / 8;
  const unsigned blocks = blocks_for(rows * vectors, kMoeThreads);
  if (moe_aligned(x, hidden) && moe_aligned(out, hidden)) {
    moe_permute_kernel<true><<<blocks, kMoeThreads, 0, stream>>>(x, hidden, vectors, row_tokens, rows, out);
  } else {
    moe_permute_kernel<false><<<blocks, kMoeThreads, 0, stream>>>(x, hidden, vectors, row_tokens, rows, out);
  }
  check_launch("moe_permute_kernel");
}

namespace {

void moe_gather_sum(const Half* rows, int64_t hidden, const int32_t* token_rows, const float* probs, int64_t tokens,
                    int64_t topk, Half* y, DType precision, cudaStream_t stream) {
  if (tokens == 0 || hidden == 0) return;
  const int64_t vectors = (hidden + 7) / 8;
  const unsigned blocks = blocks_for(tokens * vectors, kMoeThreads);
  const bool aligned = moe_aligned(rows, hidden) && moe_aligned(y, hidden);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    const auto kernel = aligned ? moe_gather_sum_kernel<P, true> : moe_gather_sum_kernel<P, false>;
    kernel<<<blocks, kMoeThreads, 0, stream>>>(rows, hidden, vectors, token_rows, probs, tokens, static_cast<int>(topk),
                                               y);
  });
  check_launch("moe_gather_sum_kernel");
}

}  // namespace

void moe_permute_backward(const Half* d_rows, int64_t hidden, const int32_t* token_rows, int64_t tokens, int64_t topk,
                          Half* dx, DType precision, cudaStream_t stream) {
  moe_gather_sum(d_rows, hidden, token_rows, nullptr, tokens, topk, dx, precision, stream);
}

void moe_combine(const Half* rows, int64_t hidden, const int32_t* token_rows, const float* probs, int64_t tokens,
                 int64_t topk, Half* y, DType precision, cudaStream_t stream) {
  moe_gather_sum(rows, hidden, token_rows, probs, tokens, topk, y, precision, stream);
}

void moe_combine_backward(const Half* dy, const Half* rows, int64_t hidden, ConstMoeDispatchMaps maps,
                          const float* probs, int64_t tokens, int64_t topk, int64_t rows_count, Half* d_rows,
                          float* d_probs, DType precision, cudaStream_t stream) {
  const int64_t vectors = (hidden + 7) / 8;
  const bool aligned = moe_aligned(dy, hidden) && moe_aligned(rows, hidden) && moe_aligned(d_rows, hidden);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    if (rows_count > 0 && hidden > 0) {
      const auto kernel =
          aligned ? moe_combine_backward_rows_kernel<P, true> : moe_combine_backward_rows_kernel<P, false>;
      kernel<<<blocks_for(rows_count * vectors, kMoeThreads), kMoeThreads, 0, stream>>>(
          dy, hidden, vectors, maps.token_rows, maps.row_tokens, probs, static_cast<int>(topk), rows_count, d_rows);
      check_launch("moe_combine_backward_rows_kernel");
    }
    if (tokens > 0) {
      const auto kernel =
          aligned ? moe_combine_backward_probs_kernel<P, true> : moe_combine_backward_probs_kernel<P, false>;
      kernel<<<moe_row_blocks(tokens * topk), kMoeRowThreads, 0, stream>>>(
          dy, rows, hidden, maps.token_rows, tokens * topk, static_cast<int>(topk), d_probs);
      check_launch("moe_combine_backward_probs_kernel");
    }
  });
}

void moe_aux_loss_counts(const Half* logits, int64_t tokens, const MoeRouter& router, float* counts, void* workspace,
                         DType precision, cudaStream_t stream) {
  const auto e = static_cast<int64_t>(router.experts), k = static_cast<int64_t>(router.topk);
  check_moe_router("moe_aux_loss_counts", tokens, e, k);
  MoeCarver carver(workspace);
  const MoeLossScratch scratch = carve_loss(carver, tokens, k, e, 1);
  check(cudaMemsetAsync(scratch.histogram, 0, static_cast<std::size_t>(e) * sizeof(int32_t), stream),
        "cudaMemsetAsync (moe_aux_loss_counts)");
  moe_aux_top_k(logits, tokens, e, k, scratch.aux_experts, precision, stream);
  moe_histogram(scratch.aux_experts, tokens * k, e, std::max<int64_t>(tokens * k, 1), scratch.histogram, stream);
  moe_counts(scratch.histogram, e, false, counts, stream);
}

void moe_switch_loss(const Half* logits, int64_t tokens, const MoeRouter& router, const float* counts,
                     int64_t total_tokens, double coeff, double* loss_sum, float* d_logits, float gradient_scale,
                     void* workspace, DType precision, cudaStream_t stream) {
  const auto e = static_cast<int64_t>(router.experts), k = static_cast<int64_t>(router.topk);
  check_moe_router("moe_switch_loss", tokens, e, k);
  const auto whole = static_cast<double>(total_tokens);
  const double scale = static_cast<double>(e) * coeff / (static_cast<double>(k) * whole * whole);
  MoeCarver carver(workspace);
  const MoeLossScratch scratch = carve_loss(carver, tokens, k, e, 1);
  moe_switch_terms(logits, tokens, e, router.sigmoid, counts, std::max<int64_t>(tokens, 1), scale, loss_sum, d_logits,
                   gradient_scale, scratch.token_loss, precision, stream);
}

void moe_sequence_aux_loss(const Half* logits, int64_t tokens, int64_t sequences, const MoeRouter& router, double coeff,
                           double* loss_sum, float* d_logits, float gradient_scale, void* workspace, DType precision,
                           cudaStream_t stream) {
  const auto e = static_cast<int64_t>(router.experts), k = static_cast<int64_t>(router.topk);
  check_moe_router("moe_sequence_aux_loss", tokens, e, k);
  if (sequences <= 0) throw SpecError("--device", "moe_sequence_aux_loss: needs at least one sequence");
  const int64_t length = tokens / sequences;
  if (length == 0) return;
  const int64_t used = length * sequences;  // the rows past the last whole sequence count for nothing
  MoeCarver carver(workspace);
  const MoeLossScratch scratch = carve_loss(carver, tokens, k, e, sequences);
  check(cudaMemsetAsync(scratch.histogram, 0, static_cast<std::size_t>(sequences * e) * sizeof(int32_t), stream),
        "cudaMemsetAsync (moe_sequence_aux_loss)");
  moe_aux_top_k(logits, used, e, k, scratch.aux_experts, precision, stream);
  moe_histogram(scratch.aux_experts, used * k, e, length * k, scratch.histogram, stream);
  moe_counts(scratch.histogram, sequences * e, false, scratch.group_counts, stream);
  const auto rows = static_cast<double>(length);
  const double scale =
      static_cast<double>(e) * (coeff / static_cast<double>(sequences)) / (static_cast<double>(k) * rows * rows);
  moe_switch_terms(logits, used, e, router.sigmoid, scratch.group_counts, length, scale, loss_sum, d_logits,
                   gradient_scale, scratch.token_loss, precision, stream);
}

void moe_z_loss(const Half* logits, int64_t tokens, int64_t experts, double coeff, double* loss_sum, float* d_logits,
                float gradient_scale, void* workspace, DType precision, cudaStream_t stream) {
  check_moe_router("moe_z_loss", tokens, experts, 1);
  if (tokens == 0 || (!loss_sum && !d_logits)) return;
  MoeCarver carver(workspace);
  const MoeLossScratch scratch = carve_loss(carver, tokens, 1, experts, 1);
  const double count = static_cast<double>(tokens);
  with_precision(precision, [&](auto p) {
    constexpr DType P = decltype(p)::value;
    with_moe_slots(experts, [&](auto slots) {
      constexpr int kSlots = decltype(slots)::value;
      moe_z_loss_kernel<P, kSlots><<<moe_row_blocks(tokens), kMoeRowThreads, 0, stream>>>(
          logits, tokens, static_cast<int>(experts), coeff * 2 / count, gradient_scale,
          loss_sum ? scratch.token_loss : nullptr, d_logits);
    });
  });
  check_launch("moe_z_loss_kernel");
  if (!loss_sum) return;
  moe_loss_finish_kernel<<<1, kMoeThreads, 0, stream>>>(scratch.token_loss, tokens, coeff / count, loss_sum);
  check_launch("moe_loss_finish_kernel");
}

void moe_update_expert_bias(const float* counts, int64_t experts, float rate, float* expert_bias, cudaStream_t stream) {
  if (experts <= 0) return;
  moe_update_expert_bias_kernel<<<1, kMoeThreads, 0, stream>>>(counts, experts, rate, expert_bias);
  check_launch("moe_update_expert_bias_kernel");
}

}  // namespace megaplan::exec::cuda
