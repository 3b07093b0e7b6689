#include "executor/kernels/cuda/adamw.h"

#include <cmath>
#include <string>

#include "executor/kernels/cuda/device_common.cuh"

namespace megaplan::exec::cuda {

namespace {

using namespace detail;

constexpr int kThreads = 256;
constexpr int kVectorsPerThread = 4;                          // float4 groups in flight per thread
constexpr int64_t kChunk = kThreads * kVectorsPerThread * 4;  // values one block updates

struct Descriptor {
  float* master;
  const float* gradient;
  float* exp_avg;
  float* exp_avg_sq;
  uint16_t* compute;
  int64_t n;
  int64_t first_chunk;  // the block index of this tensor's first chunk
  float weight_decay;
  int vectorized;  // every buffer 16-byte aligned (compute 8-byte): float4 loads
};

// Per step, the same for every tensor; bias corrections from double on the host, as the reference.
struct StepConstants {
  float lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, grad_scale, correction1, correction2;
};

__device__ __forceinline__ void update(float& w, float g, float& m, float& v, float weight_decay,
                                       const StepConstants& k) {
  g *= k.grad_scale;
  m = k.beta1 * m + k.one_minus_beta1 * g;
  v = k.beta2 * v + k.one_minus_beta2 * g * g;
  const float step = (m / k.correction1) / (sqrtf(v / k.correction2) + k.eps) + weight_decay * w;
  w = w - k.lr * step;
}

template <DType P>
__device__ __forceinline__ void update_one(const Descriptor& d, int64_t i, const StepConstants& k) {
  float w = d.master[i], m = d.exp_avg[i], v = d.exp_avg_sq[i];
  update(w, d.gradient[i], m, v, d.weight_decay, k);
  d.master[i] = w;
  d.exp_avg[i] = m;
  d.exp_avg_sq[i] = v;
  if (d.compute) store<P>(d.compute, i, w);
}

// One block per chunk, its tensor found by owner_of_chunk.
template <DType P>
__global__ void __launch_bounds__(kThreads) adamw_kernel(const Descriptor* tensors, int count, StepConstants k) {
  const int64_t chunk = blockIdx.x;
  const Descriptor d = tensors[owner_of_chunk(tensors, count, chunk)];
  const int64_t start = (chunk - d.first_chunk) * kChunk;
  const int64_t end = min(start + kChunk, d.n);
  if (!d.vectorized) {
    for (int64_t i = start + threadIdx.x; i < end; i += kThreads) update_one<P>(d, i, k);
    return;
  }
  // All loads first, then the arithmetic and stores: the stores could alias the later loads as
  // far as the compiler knows, so it would not hoist them itself.
  float4 w[kVectorsPerThread], g[kVectorsPerThread], m[kVectorsPerThread], v[kVectorsPerThread];
#pragma unroll
  for (int u = 0; u < kVectorsPerThread; ++u) {
    const int64_t i = start + (u * kThreads + threadIdx.x) * 4;
    if (i + 4 <= end) {
      w[u] = *reinterpret_cast<const float4*>(d.master + i);
      g[u] = *reinterpret_cast<const float4*>(d.gradient + i);
      m[u] = *reinterpret_cast<const float4*>(d.exp_avg + i);
      v[u] = *reinterpret_cast<const float4*>(d.exp_avg_sq + i);
    }
  }
#pragma unroll
  for (int u = 0; u < kVectorsPerThread; ++u) {
    const int64_t i = start + (u * kThreads + threadIdx.x) * 4;
    if (i + 4 <= end) {
      update(w[u].x, g[u].x, m[u].x, v[u].x, d.weight_decay, k);
      update(w[u].y, g[u].y, m[u].y, v[u].y, d.weight_decay, k);
      update(w[u].z, g[u].z, m[u].z, v[u].z, d.weight_decay, k);
      update(w[u].w, g[u].w, m[u].w, v[u].w, d.weight_decay, k);
      *reinterpret_cast<float4*>(d.master + i) = w[u];
      *reinterpret_cast<float4*>(d.exp_avg + i) = m[u];
      *reinterpret_cast<float4*>(d.exp_avg_sq + i) = v[u];
      if (d.compute) {
        *reinterpret_cast<uint2*>(d.compute + i) = make_uint2(pack2<P>(w[u].x, w[u].y), pack2<P>(w[u].z, w[u].w));
      }
    } else {
      for (int64_t j = i; j < end; ++j) update_one<P>(d, j, k);  // the tensor's last n % 4 values
    }
  }
}

bool aligned(const void* pointer, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(pointer) % bytes == 0; }

}  // namespace

MultiTensorAdamw::MultiTensorAdamw(const std::vector<AdamwTensor>& tensors, DType precision, cudaStream_t stream)
    : precision_(precision) {
  std::vector<Descriptor> descriptors;
  for (const AdamwTensor& t : tensors) {
    if (t.n < 0) throw SpecError("--device", "MultiTensorAdamw: a tensor has n = " + std::to_string(t.n));
    if (t.n == 0) continue;  // no chunk: keeps first_chunk strictly increasing for the search
    if (!t.master || !t.gradient || !t.exp_avg || !t.exp_avg_sq) {
      throw SpecError("--device", "MultiTensorAdamw: a tensor of " + std::to_string(t.n) + " values has a null buffer");
    }
    Descriptor d{};
    d.master = t.master;
    d.gradient = t.gradient;
    d.exp_avg = t.exp_avg;
    d.exp_avg_sq = t.exp_avg_sq;
    d.compute = t.compute;
    d.n = t.n;
    d.first_chunk = chunk_count_;
    d.weight_decay = t.weight_decay;
    d.vectorized = aligned(t.master, 16) && aligned(t.gradient, 16) && aligned(t.exp_avg, 16) &&
                   aligned(t.exp_avg_sq, 16) && aligned(t.compute, 8);
    descriptors.push_back(d);
    chunk_count_ += (t.n + kChunk - 1) / kChunk;
  }
  if (chunk_count_ > 0x7fffffff) throw SpecError("--device", "MultiTensorAdamw: more than 2^31 chunks");
  tensor_count_ = static_cast<int>(descriptors.size());
  if (descriptors.empty()) return;
  const std::size_t bytes = descriptors.size() * sizeof(Descriptor);
  check(cudaMalloc(&descriptors_, bytes), "cudaMalloc (AdamW descriptors)");
  // From pageable memory the copy returns once the bytes are staged: `descriptors` may go.
  check(cudaMemcpyAsync(descriptors_, descriptors.data(), bytes, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (AdamW descriptors)");
}

MultiTensorAdamw::~MultiTensorAdamw() {
  if (descriptors_) cudaFree(descriptors_);
}

void MultiTensorAdamw::step(int64_t step, float lr, float beta1, float beta2, float eps, float grad_scale,
                            cudaStream_t stream) {
  if (step < 1) throw SpecError("--device", "MultiTensorAdamw::step: steps count from 1, got " + std::to_string(step));
  if (tensor_count_ == 0) return;
  StepConstants k{};
  k.lr = lr;
  k.beta1 = beta1;
  k.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(beta1));
  k.beta2 = beta2;
  k.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(beta2));
  k.eps = eps;
  k.grad_scale = grad_scale;
  k.correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step)));
  k.correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step)));
  with_precision(precision_, [&](auto p) {
    adamw_kernel<decltype(p)::value><<<static_cast<unsigned>(chunk_count_), kThreads, 0, stream>>>(
        static_cast<const Descriptor*>(descriptors_), tensor_count_, k);
  });
  check_launch("adamw_kernel");
}

}  // namespace megaplan::exec::cuda
