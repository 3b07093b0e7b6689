// The CUDA backend: bf16 or fp16 activations and compute weights (the precision it is made with,
// passed to every kernel and set on every lane's GEMMs), fp32 master weights, gradients and
// optimizer state. Linear layers run on cuBLASLt with fused epilogues, attention on the flash
// kernels, the rest on the kernels of executor/kernels/cuda. Every reduction runs in a fixed order
// (no atomics), so a resumed run repeats an uninterrupted one bit for bit on the same GPU.
//
// All of the backend's device work — launches, GEMMs, memsets, copies, uploads, downloads, timing
// events — goes to one non-blocking stream of its own, in the order of the calls; communicators
// order themselves against it through compute_stream(). run_pair's second part alone goes to a
// second stream (a Lane of its own, made at the first pair), forked from and joined back to the
// first with events.
#include "executor/runtime/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/device_gpu.h"
#include "core/error.h"
#include "executor/cuda_module.h"
#include "executor/kernels/cuda/adamw.h"
#include "executor/kernels/cuda/bf16_linear.h"
#include "executor/kernels/cuda/cross_entropy.h"
#include "executor/kernels/cuda/device_common.cuh"
#include "executor/kernels/cuda/dropout.h"
#include "executor/kernels/cuda/elementwise.h"
#include "executor/kernels/cuda/embedding.h"
#include "executor/kernels/cuda/flash_attention.h"
#include "executor/kernels/cuda/moe_routing.h"
#include "executor/kernels/cuda/normal_draws.h"
#include "executor/kernels/cuda/norms.h"
#include "executor/kernels/cuda/reductions.h"
#include "executor/kernels/cuda/sigmoid_gate.h"
#include "executor/kernels/cuda/stream.h"

namespace megaplan::exec {

namespace {

using cuda::Half;

constexpr float kLayerNormEps = 1e-5f;

// An activation's 16-bit elements, bf16 or fp16 as precision_ says.
Half* h16(Activation a) { return reinterpret_cast<Half*>(a); }
const Half* h16(ConstActivation a) { return reinterpret_cast<const Half*>(a); }
int64_t i64(std::size_t n) { return static_cast<int64_t>(n); }

// db += partial, both fp32 (bias gradients accumulate over microbatches; cuBLASLt's bias-gradient
// epilogue overwrites).
__global__ void accumulate_kernel(const float* partial, int64_t n, float* db) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) db[i] += partial[i];
}

__global__ void fill_kernel(float* x, int64_t n, float value) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = value;
}

using cuda::detail::blocks_for;
using cuda::detail::check;
using cuda::detail::check_launch;

// A device buffer that grows on demand (scratch whose size depends on the call), allocated and
// freed in `stream`'s order: the old buffer goes after the work queued on it, with no wait.
// REQUIRES: `stream` outlives the scratch.
template <typename T>
class Scratch {
 public:
  explicit Scratch(cudaStream_t stream) : stream_(stream) {}
  ~Scratch() {
    if (data_) (void)cudaFreeAsync(data_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get(std::size_t n) {
    if (n > capacity_) {
      if (data_) check(cudaFreeAsync(data_, stream_), "cudaFreeAsync (scratch)");
      data_ = nullptr;
      capacity_ = 0;
      check(cudaMallocAsync(&data_, std::max<std::size_t>(n, 1) * sizeof(T), stream_), "cudaMallocAsync (scratch)");
      capacity_ = n;
    }
    return data_;
  }

 private:
  cudaStream_t stream_;
  T* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// What issuing work on one stream needs to itself: the stream, cuBLASLt's handle and workspace
// (shared by every GEMM on the stream), and the scratch whose size depends on the call (token and
// mask uploads, bias-gradient partials, norm and attention workspaces). Members go in reverse
// order: the scratch frees on the stream, then the GEMMs' workspace, then the stream.
struct Lane {
  cuda::Stream stream;
  cuda::Bf16Linear linear;
  Scratch<int32_t> tokens{stream}, targets{stream}, row_ids{stream}, row_starts{stream}, positions{stream};
  Scratch<float> mask{stream}, bias{stream};
  Scratch<unsigned char> workspace{stream};
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(DType precision)
      : lanes_{std::make_unique<Lane>(), nullptr},
        lane_(lanes_[0].get()),
        precision_(precision),
        gemm_fp16_(precision == DType::kFloat16) {
    lanes_[0]->linear.set_fp16(gemm_fp16_);
  }
  // After this body the members go in reverse order: the kernels' objects with cudaFree, then the
  // lanes, declared first.
  ~CudaBackend() override {
    for (const auto& lane : lanes_) {
      if (lane) (void)cudaStreamSynchronize(lane->stream);
    }
    for (auto& [pointer, bytes] : sizes_) cudaFree(pointer);
    for (auto& [bytes, pointer] : released_) cudaFree(pointer);
    for (auto& [bytes, pointer] : released_in_pair_) cudaFree(pointer);
    for (cudaEvent_t event : events_) cudaEventDestroy(event);
    for (cudaEvent_t event : {fork_, join_}) {
      if (event) cudaEventDestroy(event);
    }
  }

  std::string name() const override { return "cuda"; }
  DType activation_type() const override { return precision_; }
  int64_t available_bytes() const override {
    std::size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return static_cast<int64_t>(free);
  }

  float* allocate(std::size_t n) override { return static_cast<float*>(allocate_bytes(n * sizeof(float))); }
  void release(float* buffer) override { release_bytes(buffer); }
  Activation allocate_activation(std::size_t n) override {
    return static_cast<Activation>(allocate_bytes(n * sizeof(Half)));
  }
  void release(Activation buffer) override { release_bytes(buffer); }
  Activation compute_copy(float*, std::size_t n) override { return allocate_activation(n); }
  void release_compute_copy(Activation copy, float*) override { release(copy); }
  void refresh_compute_copy(const float* value, std::size_t n, Activation copy) override {
    cuda::cast_to_half(value, i64(n), h16(copy), precision_, lane_->stream);
  }
  int64_t peak_bytes() const override { return peak_; }
  // Uploads are queued on the current lane. Their sources are pageable host memory, which cudaMemcpyAsync
  // stages before it returns, so the caller's buffer and the temporaries here may change or go at
  // once. Downloads come after everything queued before them and return with the bytes.
  void upload(float* device, const float* host, std::size_t n) override {
    check(cudaMemcpyAsync(device, host, n * sizeof(float), cudaMemcpyHostToDevice, lane_->stream),
          "cudaMemcpyAsync to device");
  }
  void download(float* host, const float* device, std::size_t n) override {
    check(cudaMemcpyAsync(host, device, n * sizeof(float), cudaMemcpyDeviceToHost, lane_->stream),
          "cudaMemcpyAsync to host");
    synchronize();
  }
  // Registered memory: cudaMemcpyAsync then moves it by DMA, without staging through a bounce
  // buffer; an upload from it is no longer staged before upload() returns (checkpoints only
  // download into theirs).
  void pin_host(void* host, std::size_t bytes) override {
    check(cudaHostRegister(host, bytes, cudaHostRegisterDefault), "cudaHostRegister");
  }
  void unpin_host(void* host) override { check(cudaHostUnregister(host), "cudaHostUnregister"); }
  void upload(Activation device, const float* host, std::size_t n) override {
    std::vector<Half> rounded(n);
    for (std::size_t i = 0; i < n; ++i) rounded[i] = cuda::to_half(host[i], precision_);
    check(cudaMemcpyAsync(device, rounded.data(), n * sizeof(Half), cudaMemcpyHostToDevice, lane_->stream),
          "cudaMemcpyAsync to device");
  }
  void download(float* host, ConstActivation device, std::size_t n) override {
    std::vector<Half> values(n);
    check(cudaMemcpyAsync(values.data(), device, n * sizeof(Half), cudaMemcpyDeviceToHost, lane_->stream),
          "cudaMemcpyAsync to host");
    synchronize();
    for (std::size_t i = 0; i < n; ++i) host[i] = cuda::from_half(values[i], precision_);
  }
  void fill(float* x, std::size_t n, float value) override {
    if (n == 0) return;
    if (value == 0.0f) {
      check(cudaMemsetAsync(x, 0, n * sizeof(float), lane_->stream), "cudaMemsetAsync");
      return;
    }
    fill_kernel<<<blocks_for(i64(n), 256), 256, 0, lane_->stream>>>(x, i64(n), value);
    check_launch("fill");
  }
  void draw_normal(float* x, std::size_t n, const NormalDraws& draws) override {
    cuda::draw_normal(x, i64(n), draws, lane_->stream);
  }

  bool runs_fp16_gemms() const override { return true; }
  // The GEMMs alone: the profiler times fp16 GEMMs on a bf16 backend. The other kernels keep
  // precision_.
  void set_gemm_precision(DType precision) override {
    gemm_fp16_ = precision == DType::kFloat16;
    for (const auto& lane : lanes_) {
      if (lane) lane->linear.set_fp16(gemm_fp16_);
    }
  }

  void linear_forward(ConstActivation x, ConstActivation w, ConstActivation b, std::size_t m, std::size_t k,
                      std::size_t n, GemmEpilogue epilogue, Activation y, Activation pre_activation) override {
    lane_->linear.forward(h16(x), h16(w), epilogue == GemmEpilogue::kNone ? nullptr : h16(b), i64(m), i64(k), i64(n),
                          epilogue, h16(y), h16(pre_activation), lane_->stream);
  }
  void linear_backward(ConstActivation dy, ConstActivation x, ConstActivation w, std::size_t m, std::size_t k,
                       std::size_t n, Activation dx, float* dw, float* db) override {
    float* bias_partial = db ? lane_->bias.get(n) : nullptr;
    lane_->linear.backward(h16(dy), h16(x), h16(w), i64(m), i64(k), i64(n), h16(dx), dw, bias_partial, lane_->stream);
    if (db) accumulate(bias_partial, n, db);
  }

  void linear_backward_through_gelu(ConstActivation dy, ConstActivation w, std::size_t m, std::size_t k, std::size_t n,
                                    ConstActivation pre_activation, Activation d_pre) override {
    lane_->linear.backward_data_through_gelu(h16(dy), h16(w), i64(m), i64(k), i64(n), h16(pre_activation), h16(d_pre),
                                             lane_->stream);
  }

  void embedding_forward(const int64_t* tokens, std::size_t count, std::size_t seq, ConstActivation word,
                         std::size_t vocab_start, std::size_t vocab_rows, ConstActivation position, std::size_t hidden,
                         Activation y, const TokenPlaces& places) override {
    const int32_t* rows = upload_ints(shard_indices(tokens, count, vocab_start, vocab_rows), lane_->tokens);
    cuda::embedding_forward(rows, i64(count), i64(seq), h16(word), h16(position), i64(hidden), h16(y), precision_,
                            lane_->stream, places);
  }
  void embedding_backward(ConstActivation dy, const int64_t* tokens, std::size_t count, std::size_t seq,
                          std::size_t hidden, std::size_t vocab_start, std::size_t vocab_rows, float* dword,
                          float* dposition, const TokenPlaces& places) override {
    const std::vector<int32_t>& local = shard_indices(tokens, count, vocab_start, vocab_rows);
    const cuda::TokenRows rows = cuda::build_token_rows(local.data(), i64(count));
    int32_t* row_ids = upload_ints(rows.row_ids, lane_->row_ids);
    int32_t* row_starts = upload_ints(rows.row_starts, lane_->row_starts);
    int32_t* positions = upload_ints(rows.positions, lane_->positions);
    cuda::embedding_backward(h16(dy), row_ids, row_starts, positions, i64(rows.row_ids.size()), i64(count), i64(seq),
                             i64(hidden), dword, dposition, precision_, lane_->stream, places);
  }

  void layernorm_forward(ConstActivation x, ConstActivation residual, const DropoutMask& residual_dropout,
                         Activation sum_out, ConstActivation gamma, ConstActivation beta, std::size_t rows,
                         std::size_t cols, Activation y, float* mean, float* rstd) override {
    cuda::layernorm_forward(h16(x), h16(residual), residual_dropout, h16(sum_out), h16(gamma), h16(beta), i64(rows),
                            i64(cols), kLayerNormEps, h16(y), mean, rstd, precision_, lane_->stream);
  }
  void layernorm_backward(ConstActivation dy, ConstActivation x, ConstActivation gamma, const float* mean,
                          const float* rstd, std::size_t rows, std::size_t cols, ConstActivation residual_grad,
                          Activation dx, float* dgamma, float* dbeta) override {
    void* workspace = lane_->workspace.get(cuda::norm_backward_workspace_bytes(i64(rows), i64(cols)));
    cuda::layernorm_backward(h16(dy), h16(x), h16(gamma), mean, rstd, i64(rows), i64(cols), h16(residual_grad), h16(dx),
                             dgamma, dbeta, workspace, precision_, lane_->stream);
  }

  void rmsnorm_forward(ConstActivation x, ConstActivation residual, const DropoutMask& residual_dropout,
                       Activation sum_out, ConstActivation gamma, std::size_t rows, std::size_t cols, float eps,
                       Activation y, float* rstd) override {
    cuda::rmsnorm_forward(h16(x), h16(residual), residual_dropout, h16(sum_out), h16(gamma), i64(rows), i64(cols), eps,
                          h16(y), rstd, precision_, lane_->stream);
  }
  void rmsnorm_backward(ConstActivation dy, ConstActivation x, ConstActivation gamma, const float* rstd,
                        std::size_t rows, std::size_t cols, ConstActivation residual_grad, Activation dx,
                        float* dgamma) override {
    void* workspace = lane_->workspace.get(cuda::norm_backward_workspace_bytes(i64(rows), i64(cols)));
    cuda::rmsnorm_backward(h16(dy), h16(x), h16(gamma), rstd, i64(rows), i64(cols), h16(residual_grad), h16(dx), dgamma,
                           workspace, precision_, lane_->stream);
  }
  void head_rmsnorm_forward(ConstActivation qkv, ConstActivation q_gamma, ConstActivation k_gamma, std::size_t tokens,
                            std::size_t groups, std::size_t group, std::size_t dim, float eps, Activation y,
                            float* rstd) override {
    cuda::head_rmsnorm_forward(h16(qkv), h16(q_gamma), h16(k_gamma), i64(tokens * groups), i64(group), i64(dim), eps,
                               h16(y), rstd, precision_, lane_->stream);
  }
  void head_rmsnorm_backward(ConstActivation dy, ConstActivation qkv, ConstActivation q_gamma, ConstActivation k_gamma,
                             const float* rstd, std::size_t tokens, std::size_t groups, std::size_t group,
                             std::size_t dim, Activation dx, float* dq_gamma, float* dk_gamma) override {
    const int64_t rows = i64(tokens * groups * (group + 2));
    void* workspace = lane_->workspace.get(cuda::norm_backward_workspace_bytes(rows, i64(dim)));
    cuda::head_rmsnorm_backward(h16(dy), h16(qkv), h16(q_gamma), h16(k_gamma), rstd, i64(tokens * groups), i64(group),
                                i64(dim), h16(dx), dq_gamma, dk_gamma, workspace, precision_, lane_->stream);
  }
  void swiglu_forward(ConstActivation x, std::size_t rows, std::size_t width, Activation y) override {
    cuda::swiglu_forward(h16(x), i64(rows), i64(width), h16(y), precision_, lane_->stream);
  }
  void swiglu_backward(ConstActivation dy, ConstActivation x, std::size_t rows, std::size_t width,
                       Activation dx) override {
    cuda::swiglu_backward(h16(dy), h16(x), i64(rows), i64(width), h16(dx), precision_, lane_->stream);
  }
  void rotary(Activation qkv, std::size_t batch, std::size_t seq, std::size_t groups, std::size_t group,
              std::size_t dim, std::size_t rotary_dim, const RotaryFrequencies& frequencies, bool inverse,
              const TokenPlaces& places) override {
    const std::size_t group_stride = (group + 2) * dim;
    cuda::rope_apply(h16(qkv), i64(batch), i64(seq), i64(groups), i64(group + 1), i64(dim), i64(groups * group_stride),
                     i64(group_stride), i64(rotary_dim), frequencies, inverse, precision_, lane_->stream, places);
  }

  std::size_t attention_saved_size(std::size_t batch, std::size_t seq, std::size_t heads, std::size_t) const override {
    return batch * heads * seq;  // the log-sum-exp of each query row
  }
  // Megatron's fused qkv [batch, seq, groups, group + 2, dim]: a group's queries, then its key and value.
  static cuda::AttentionShape attention_shape(std::size_t batch, std::size_t seq, std::size_t heads, std::size_t groups,
                                              std::size_t dim, const DropoutMask& dropout) {
    cuda::AttentionShape shape{};
    shape.dropout = dropout;
    shape.batch = i64(batch);
    shape.seq = i64(seq);
    shape.heads = i64(heads);
    shape.kv_heads = i64(groups);
    shape.head_dim = i64(dim);
    shape.qkv_head_stride = i64((heads / groups + 2) * dim);
    shape.qkv_token_stride = i64(groups) * shape.qkv_head_stride;
    shape.softmax_scale = 1.0f / std::sqrt(static_cast<float>(dim));
    return shape;
  }
  void attention_forward(ConstActivation qkv, std::size_t batch, std::size_t seq, std::size_t heads, std::size_t groups,
                         std::size_t dim, const DropoutMask& dropout, Activation out, float* saved) override {
    const cuda::AttentionShape shape = attention_shape(batch, seq, heads, groups, dim, dropout);
    const Half* q = h16(qkv);
    const std::size_t group = heads / groups;
    cuda::flash_attention_forward(shape, q, q + group * dim, q + (group + 1) * dim, h16(out), saved, precision_,
                                  lane_->stream);
  }
  void attention_backward(ConstActivation dout, ConstActivation qkv, ConstActivation out, const float* saved,
                          std::size_t batch, std::size_t seq, std::size_t heads, std::size_t groups, std::size_t dim,
                          const DropoutMask& dropout, Activation dqkv) override {
    const cuda::AttentionShape shape = attention_shape(batch, seq, heads, groups, dim, dropout);
    const Half* q = h16(qkv);
    Half* dq = h16(dqkv);
    const std::size_t group = heads / groups;
    void* workspace = lane_->workspace.get(cuda::flash_attention_backward_workspace_bytes(shape));
    cuda::flash_attention_backward(shape, h16(dout), q, q + group * dim, q + (group + 1) * dim, h16(out), saved,
                                   shape.qkv_token_stride, dq, dq + group * dim, dq + (group + 1) * dim, workspace,
                                   precision_, lane_->stream);
  }

  // Ring attention's blocks (context parallelism) on the flash kernels' block form: the rank's
  // `seq` rows are its two chunks of seq / 2 tokens.
  static cuda::AttentionBlockShape attention_block_shape(const AttentionDims& dims, const AttentionChunkBlock& block,
                                                         const DropoutMask& dropout) {
    cuda::AttentionBlockShape shape{};
    shape.shape = attention_shape(dims.batch, dims.seq, dims.heads, dims.groups, dims.dim, dropout);
    shape.rows = i64(dims.seq / 2);
    shape.query_row0 = i64(block.query_chunk) * shape.rows;
    shape.key_row0 = i64(block.key_chunk) * shape.rows;
    shape.query_first = block.query_first;
    shape.key_first = block.key_first;
    return shape;
  }
  void pack_key_values(ConstActivation qkv, const AttentionDims& dims, Activation kv) override {
    cuda::copy_key_values(h16(qkv), h16(kv), i64(dims.batch), i64(dims.seq), i64(dims.groups),
                          i64(dims.heads / dims.groups), i64(dims.dim), false, lane_->stream);
  }
  void unpack_key_value_gradients(ConstActivation dkv, const AttentionDims& dims, Activation dqkv) override {
    cuda::copy_key_values(h16(dkv), h16(dqkv), i64(dims.batch), i64(dims.seq), i64(dims.groups),
                          i64(dims.heads / dims.groups), i64(dims.dim), true, lane_->stream);
  }
  void attention_block_forward(ConstActivation qkv, ConstActivation kv, const AttentionDims& dims,
                               const AttentionChunkBlock& block, const DropoutMask& dropout, float* out,
                               float* lse) override {
    cuda::flash_attention_block_forward(attention_block_shape(dims, block, dropout), h16(qkv), h16(kv), out, lse,
                                        precision_, lane_->stream);
  }
  void attention_block_backward(ConstActivation dout, ConstActivation qkv, ConstActivation out, const float* lse,
                                ConstActivation kv, const AttentionDims& dims, const AttentionChunkBlock& block,
                                const DropoutMask& dropout, Activation dqkv, Activation dkv) override {
    const cuda::AttentionBlockShape shape = attention_block_shape(dims, block, dropout);
    void* workspace = lane_->workspace.get(cuda::flash_attention_block_backward_workspace_bytes(shape));
    cuda::flash_attention_block_backward(shape, h16(dout), h16(qkv), h16(kv), h16(out), lse, h16(dqkv), h16(dkv),
                                         workspace, precision_, lane_->stream);
  }
  void convert(const float* x, std::size_t n, Activation y) override {
    cuda::cast_to_half(x, i64(n), h16(y), precision_, lane_->stream);
  }
  void zero(Activation x, std::size_t n) override {
    if (n == 0) return;
    check(cudaMemsetAsync(x, 0, n * sizeof(Half), lane_->stream), "cudaMemsetAsync");
  }

  void dropout(ConstActivation x, ConstActivation residual, std::size_t rows, std::size_t cols, const DropoutMask& mask,
               Activation y) override {
    cuda::dropout(h16(x), h16(residual), i64(rows), i64(cols), mask, h16(y), precision_, lane_->stream);
  }

  void cross_entropy_statistics(ConstActivation logits, const int64_t* targets, std::size_t tokens, std::size_t vocab,
                                std::size_t vocab_start, float* lse, float* target_logit, float* peak) override {
    const int32_t* columns = upload_ints(shard_indices(targets, tokens, vocab_start, vocab), lane_->targets);
    cuda::cross_entropy_statistics(h16(logits), i64(tokens), i64(vocab), i64(vocab), columns, lse, target_logit, peak,
                                   precision_, lane_->stream);
  }
  void cross_entropy_shift(const float* peak, std::size_t tokens, float* shard_lse) override {
    cuda::cross_entropy_shift(peak, i64(tokens), shard_lse, lane_->stream);
  }
  void cross_entropy_finish(const float* peak, const float* term_sum, const float* target, const float* weights,
                            std::size_t tokens, float* lse, double* loss_sum) override {
    cuda::cross_entropy_finish(peak, term_sum, target, upload_mask(weights, tokens), i64(tokens), lse, loss_sum,
                               lane_->stream);
  }
  void cross_entropy_backward(ConstActivation logits, const float* lse, const int64_t* targets, const float* weights,
                              std::size_t tokens, std::size_t vocab, std::size_t vocab_start, float scale,
                              Activation dlogits) override {
    const int32_t* columns = upload_ints(shard_indices(targets, tokens, vocab_start, vocab), lane_->targets);
    cuda::cross_entropy_backward(h16(logits), i64(tokens), i64(vocab), i64(vocab), columns,
                                 upload_mask(weights, tokens), lse, scale, h16(dlogits), precision_, lane_->stream);
  }
  void add(ConstActivation a, ConstActivation b, std::size_t n, Activation y) override {
    cuda::add(h16(a), h16(b), i64(n), h16(y), precision_, lane_->stream);
  }
  void copy(ConstActivation from, std::size_t n, Activation to) override {
    check(cudaMemcpyAsync(h16(to), h16(from), n * sizeof(Half), cudaMemcpyDeviceToDevice, lane_->stream),
          "cudaMemcpyAsync (copy)");
  }
  Activation offset(Activation a, std::size_t elements) override {
    return reinterpret_cast<Activation>(h16(a) + elements);
  }

  // Mixture of experts (kernels/cuda/moe_routing.h): index buffers are tracked and zeroed as the
  // others; the scratch is the lane's workspace.
  int32_t* allocate_indices(std::size_t n) override {
    return static_cast<int32_t*>(allocate_bytes(n * sizeof(int32_t)));
  }
  void release(int32_t* buffer) override { release_bytes(buffer); }
  void moe_top_k(ConstActivation logits, std::size_t tokens, const MoeRouter& router, const float* expert_bias,
                 int32_t* experts, float* probs) override {
    cuda::moe_top_k(h16(logits), i64(tokens), router, expert_bias, experts, probs, precision_, lane_->stream);
  }
  void moe_top_k_backward(ConstActivation logits, std::size_t tokens, const MoeRouter& router, const int32_t* experts,
                          const float* d_probs, float* d_logits) override {
    cuda::moe_top_k_backward(h16(logits), i64(tokens), router, experts, d_probs, d_logits, precision_, lane_->stream);
  }
  void moe_count_routes(const int32_t* experts, std::size_t routes, std::size_t expert_count, float* counts) override {
    void* workspace = lane_->workspace.get(cuda::moe_workspace_bytes(0, 0, i64(expert_count)));
    cuda::moe_count_routes(experts, i64(routes), i64(expert_count), counts, workspace, lane_->stream);
  }
  // The rows per expert come back to the host: the stream is waited for, as Megatron waits for its
  // tokens-per-expert before the experts' GEMMs.
  std::vector<int64_t> moe_dispatch(const int32_t* experts, const float* probs, std::size_t tokens,
                                    const MoeRouter& router, const MoeCapacity& capacity,
                                    MoeDispatchMaps maps) override {
    const std::size_t counts_bytes = (router.experts * sizeof(int64_t) + 255) / 256 * 256;
    auto* workspace = static_cast<unsigned char*>(lane_->workspace.get(
        counts_bytes + cuda::moe_workspace_bytes(i64(tokens), i64(router.topk), i64(router.experts))));
    auto* rows_per_expert = reinterpret_cast<int64_t*>(workspace);
    cuda::moe_dispatch(experts, probs, i64(tokens), i64(router.topk), i64(router.experts), capacity, maps,
                       rows_per_expert, workspace + counts_bytes, lane_->stream);
    std::vector<int64_t> rows(router.experts);
    check(cudaMemcpyAsync(rows.data(), rows_per_expert, rows.size() * sizeof(int64_t), cudaMemcpyDeviceToHost,
                          lane_->stream),
          "cudaMemcpyAsync (moe_dispatch)");
    synchronize();
    return rows;
  }
  void moe_permute(ConstActivation x, std::size_t hidden, const int32_t* row_tokens, std::size_t rows,
                   Activation out) override {
    cuda::moe_permute(h16(x), i64(hidden), row_tokens, i64(rows), h16(out), lane_->stream);
  }
  void moe_permute_backward(ConstActivation d_rows, std::size_t hidden, const int32_t* token_rows, std::size_t tokens,
                            std::size_t topk, Activation dx) override {
    cuda::moe_permute_backward(h16(d_rows), i64(hidden), token_rows, i64(tokens), i64(topk), h16(dx), precision_,
                               lane_->stream);
  }
  void moe_combine(ConstActivation rows, std::size_t hidden, const int32_t* token_rows, const float* probs,
                   std::size_t tokens, std::size_t topk, Activation y) override {
    cuda::moe_combine(h16(rows), i64(hidden), token_rows, probs, i64(tokens), i64(topk), h16(y), precision_,
                      lane_->stream);
  }
  void moe_combine_backward(ConstActivation dy, ConstActivation rows, std::size_t hidden, ConstMoeDispatchMaps maps,
                            const float* probs, std::size_t tokens, std::size_t topk, std::size_t rows_count,
                            Activation d_rows, float* d_probs) override {
    cuda::moe_combine_backward(h16(dy), h16(rows), i64(hidden), maps, probs, i64(tokens), i64(topk), i64(rows_count),
                               h16(d_rows), d_probs, precision_, lane_->stream);
  }
  void moe_aux_loss_counts(ConstActivation logits, std::size_t tokens, const MoeRouter& router,
                           float* counts) override {
    void* workspace =
        lane_->workspace.get(cuda::moe_workspace_bytes(i64(tokens), i64(router.topk), i64(router.experts)));
    cuda::moe_aux_loss_counts(h16(logits), i64(tokens), router, counts, workspace, precision_, lane_->stream);
  }
  void moe_switch_loss(ConstActivation logits, std::size_t tokens, const MoeRouter& router, const float* counts,
                       std::size_t total_tokens, double coeff, double* loss_sum, float* d_logits,
                       float gradient_scale) override {
    void* workspace =
        lane_->workspace.get(cuda::moe_workspace_bytes(i64(tokens), i64(router.topk), i64(router.experts)));
    cuda::moe_switch_loss(h16(logits), i64(tokens), router, counts, i64(total_tokens), coeff, loss_sum, d_logits,
                          gradient_scale, workspace, precision_, lane_->stream);
  }
  void moe_sequence_aux_loss(ConstActivation logits, std::size_t tokens, std::size_t sequences, const MoeRouter& router,
                             double coeff, double* loss_sum, float* d_logits, float gradient_scale) override {
    void* workspace = lane_->workspace.get(
        cuda::moe_workspace_bytes(i64(tokens), i64(router.topk), i64(router.experts), i64(sequences)));
    cuda::moe_sequence_aux_loss(h16(logits), i64(tokens), i64(sequences), router, coeff, loss_sum, d_logits,
                                gradient_scale, workspace, precision_, lane_->stream);
  }
  void moe_z_loss(ConstActivation logits, std::size_t tokens, std::size_t experts, double coeff, double* loss_sum,
                  float* d_logits, float gradient_scale) override {
    void* workspace = lane_->workspace.get(cuda::moe_workspace_bytes(i64(tokens), 1, i64(experts)));
    cuda::moe_z_loss(h16(logits), i64(tokens), i64(experts), coeff, loss_sum, d_logits, gradient_scale, workspace,
                     precision_, lane_->stream);
  }
  void moe_update_expert_bias(const float* counts, std::size_t experts, float rate, float* expert_bias) override {
    cuda::moe_update_expert_bias(counts, i64(experts), rate, expert_bias, lane_->stream);
  }
  void sigmoid_gated_add(ConstActivation x, ConstActivation gate, std::size_t rows, std::size_t cols,
                         Activation y) override {
    cuda::sigmoid_gated_add(h16(x), h16(gate), i64(rows), i64(cols), h16(y), precision_, lane_->stream);
  }
  void sigmoid_gated_add_backward(ConstActivation dy, ConstActivation x, ConstActivation gate, std::size_t rows,
                                  std::size_t cols, Activation dx, float* d_gate) override {
    cuda::sigmoid_gated_add_backward(h16(dy), h16(x), h16(gate), i64(rows), i64(cols), h16(dx), d_gate, precision_,
                                     lane_->stream);
  }

  double gradient_sum_of_squares(const std::vector<OptimizerTensor>& tensors) override {
    std::vector<cuda::TensorSpan> spans;
    spans.reserve(tensors.size());
    for (const OptimizerTensor& t : tensors) spans.push_back({t.gradient, i64(t.size)});
    return reducer_.sum_of_squares(spans, lane_->stream);
  }
  void adamw_step(const std::vector<OptimizerTensor>& tensors, const AdamwSettings& s) override {
    optimizer_for(tensors).step(s.step, s.lr, s.beta1, s.beta2, s.eps, s.gradient_scale, lane_->stream);
  }
  // The current lane's stream, not the device: a device-wide wait would also wait for work on other
  // streams, such as a posted NCCL receive whose send needs this rank to go on (see allocate_bytes).
  // Outside run_pair that is the first lane, which has waited for the second.
  void synchronize() override { check(cudaStreamSynchronize(lane_->stream), "cudaStreamSynchronize"); }
  void* compute_stream() const override { return lane_->stream; }

  void run_pair(const std::function<void()>& first, const std::function<void()>& second) override {
    if (paired_) throw std::logic_error("CudaBackend: run_pair inside run_pair");
    if (!lanes_[1]) {
      lanes_[1] = std::make_unique<Lane>();
      lanes_[1]->linear.set_fp16(gemm_fp16_);
      check(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "cudaEventCreate (pair)");
      check(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming), "cudaEventCreate (pair)");
    }
    Lane& main = *lanes_[0];
    Lane& side = *lanes_[1];
    check(cudaEventRecord(fork_, main.stream), "cudaEventRecord (pair fork)");
    check(cudaStreamWaitEvent(side.stream, fork_, 0), "cudaStreamWaitEvent (pair fork)");
    paired_ = true;
    try {
      first();
      lane_ = &side;
      second();
    } catch (...) {
      lane_ = &main;
      end_pair(false);
      throw;
    }
    lane_ = &main;
    end_pair(true);
  }

  // An event recorded on the first lane's stream, where every launch and copy above is issued
  // outside run_pair (whose end that stream waits for). Events are created the first time that many
  // marks are live and reused after release_marks().
  TimingMark mark() override {
    if (marks_ == events_.size()) {
      cudaEvent_t event = nullptr;
      check(cudaEventCreate(&event), "cudaEventCreate (timing mark)");
      events_.push_back(event);
    }
    check(cudaEventRecord(events_[marks_], lanes_[0]->stream), "cudaEventRecord (timing mark)");
    return {marks_++};
  }
  double seconds_between(TimingMark from, TimingMark to) override {
    // `from` precedes `to` on the first lane's stream, so it is complete once `to` is.
    check(cudaEventSynchronize(event_of(to)), "cudaEventSynchronize (timing mark)");
    float milliseconds = 0;
    check(cudaEventElapsedTime(&milliseconds, event_of(from), event_of(to)), "cudaEventElapsedTime");
    return milliseconds * 1e-3;
  }
  void release_marks() override { marks_ = 0; }

 private:
  cudaEvent_t event_of(TimingMark mark) const {
    if (mark.index >= marks_) throw std::logic_error("CudaBackend: a timing mark used after release_marks()");
    return events_[mark.index];
  }
  // The first lane waits for the second's part of the pair; buffers released during the pair become
  // reusable only now, when neither lane's queued work can still touch them.
  void end_pair(bool checked) {
    paired_ = false;
    const cudaError_t recorded = cudaEventRecord(join_, lanes_[1]->stream);
    const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(lanes_[0]->stream, join_, 0) : recorded;
    released_.insert(released_in_pair_.begin(), released_in_pair_.end());
    released_in_pair_.clear();
    if (checked) check(waited, "cudaEventRecord/cudaStreamWaitEvent (pair join)");
  }
  void accumulate(const float* partial, std::size_t n, float* total) {
    accumulate_kernel<<<blocks_for(i64(n), 256), 256, 0, lane_->stream>>>(partial, i64(n), total);
    check_launch("accumulate (bias gradient)");
  }
  // Released buffers are kept by size and handed out again rather than freed: cudaFree waits for
  // the whole device, and with NCCL operations pending on other streams (a posted receive whose
  // send the peer issues only after its own cudaFree returns) that wait could never end. A
  // training step asks for the same sizes every iteration, so the cache stops growing after the
  // first; it is freed when the GPU runs out, and with the backend.
  void* allocate_bytes(std::size_t bytes) {
    bytes = std::max<std::size_t>(bytes, 16);
    void* pointer = nullptr;
    if (const auto cached = released_.find(bytes); cached != released_.end()) {
      pointer = cached->second;
      released_.erase(cached);
    } else {
      pointer = fresh_device_memory(bytes);
    }
    check(cudaMemsetAsync(pointer, 0, bytes, lane_->stream), "cudaMemsetAsync");
    sizes_[pointer] = bytes;
    bytes_ += static_cast<int64_t>(bytes);
    peak_ = std::max(peak_, bytes_);
    return pointer;
  }
  void* fresh_device_memory(std::size_t bytes) {
    void* pointer = nullptr;
    cudaError_t status = cudaMalloc(&pointer, bytes);
    if (status == cudaErrorMemoryAllocation && !released_.empty()) {
      (void)cudaGetLastError();  // clears the failed allocation's error
      for (const auto& [size, buffer] : released_) cudaFree(buffer);
      released_.clear();
      status = cudaMalloc(&pointer, bytes);
    }
    if (status != cudaSuccess) {
      std::size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      throw SpecError("--micro-batch-size", "the GPU is out of memory: " + std::to_string(bytes) +
                                                " more bytes requested with " + std::to_string(bytes_) + " held and " +
                                                std::to_string(free) + " free");
    }
    return pointer;
  }
  void release_bytes(void* buffer) {
    const auto found = sizes_.find(buffer);
    if (found == sizes_.end()) return;
    bytes_ -= static_cast<int64_t>(found->second);
    // Inside run_pair the other lane may still be reading it: reusable after the join (end_pair).
    if (paired_) {
      released_in_pair_.emplace_back(found->second, buffer);
    } else {
      released_.emplace(found->second, buffer);
    }
    sizes_.erase(found);
  }
  // The kernels' int32 indices into a vocabulary shard [start, start + size): each id's row (or
  // column) in the shard, or -1 where another shard holds it.
  const std::vector<int32_t>& shard_indices(const int64_t* ids, std::size_t count, std::size_t start,
                                            std::size_t size) {
    host_ints_.resize(count);
    for (std::size_t i = 0; i < count; ++i) {
      const int64_t local = ids[i] - i64(start);
      host_ints_[i] = local >= 0 && local < i64(size) ? static_cast<int32_t>(local) : -1;
    }
    return host_ints_;
  }
  // Staged before cudaMemcpyAsync returns (see upload), so host_ints_ may be refilled at once.
  int32_t* upload_ints(const std::vector<int32_t>& host, Scratch<int32_t>& device) {
    int32_t* pointer = device.get(host.size());
    if (host.empty()) return pointer;  // a shard none of the tokens falls in has no rows to list
    check(cudaMemcpyAsync(pointer, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice, lane_->stream),
          "cudaMemcpyAsync");
    return pointer;
  }
  const float* upload_mask(const float* mask, std::size_t count) {
    float* pointer = lane_->mask.get(count);
    check(cudaMemcpyAsync(pointer, mask, count * sizeof(float), cudaMemcpyHostToDevice, lane_->stream),
          "cudaMemcpyAsync");
    return pointer;
  }
  // The multi-tensor optimizer uploads its descriptors once per list of tensors.
  cuda::MultiTensorAdamw& optimizer_for(const std::vector<OptimizerTensor>& tensors) {
    std::vector<const void*> key;
    key.reserve(tensors.size());
    for (const OptimizerTensor& t : tensors) key.push_back(t.value);
    if (!adamw_ || key != adamw_key_) {
      std::vector<cuda::AdamwTensor> list;
      list.reserve(tensors.size());
      for (const OptimizerTensor& t : tensors) {
        list.push_back({t.value, t.gradient, t.first_moment, t.second_moment, h16(t.compute), i64(t.size),
                        static_cast<float>(t.weight_decay)});
      }
      adamw_ = std::make_unique<cuda::MultiTensorAdamw>(list, precision_, lane_->stream);
      adamw_key_ = std::move(key);
    }
    return *adamw_;
  }

  std::unique_ptr<Lane> lanes_[2];  // first: created before the members that use them, destroyed after
  Lane* lane_;                      // where work goes now: lanes_[0], or lanes_[1] in run_pair's second part
  const DType precision_;           // of activations and compute weights: every kernel's 16-bit values
  cudaEvent_t fork_ = nullptr, join_ = nullptr;  // made with lanes_[1]
  bool gemm_fp16_;  // the GEMMs' 16-bit type: precision_'s unless set_gemm_precision changed it
  bool paired_ = false;
  std::vector<std::pair<std::size_t, void*>> released_in_pair_;  // by size, reusable after the pair's join
  cuda::DeviceReducer reducer_;
  std::unique_ptr<cuda::MultiTensorAdamw> adamw_;
  std::vector<const void*> adamw_key_;
  std::unordered_map<void*, std::size_t> sizes_;          // live buffers
  std::unordered_multimap<std::size_t, void*> released_;  // by size, for reuse
  int64_t bytes_ = 0;
  int64_t peak_ = 0;
  std::vector<int32_t> host_ints_;
  std::vector<cudaEvent_t> events_;  // by TimingMark::index; the first marks_ are live
  std::size_t marks_ = 0;
};

}  // namespace
}  // namespace megaplan::exec

namespace megaplan::cuda_module {

std::unique_ptr<exec::Backend> make_cuda_backend(DType precision) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    throw SpecError("--device", std::string("no usable CUDA GPU: ") +
                                    (status != cudaSuccess ? cudaGetErrorString(status) : "none present"));
  }
  // The kernels are built for sm_90a (flash attention uses Hopper's wgmma), which runs on compute
  // capability 9.0 alone: refuse anything else here rather than fail at the first launch.
  int device = 0;
  exec::check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, device) != cudaSuccess || properties.major != 9 || properties.minor != 0) {
    throw SpecError("--device", "the CUDA backend needs a Hopper GPU (compute capability 9.0, H100 or H200); GPU " +
                                    std::to_string(device) + " is " + std::string(properties.name) + " (" +
                                    std::to_string(properties.major) + "." + std::to_string(properties.minor) + ")");
  }
  return std::make_unique<exec::CudaBackend>(precision);
}

double cuda_dense_bf16_peak_flops() {
  int device = 0;
  cudaDeviceProp properties{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&properties, device) != cudaSuccess) return 0;
  const std::optional<GpuSpec> gpu = gpu_preset_for_device(properties.name);
  return gpu ? gpu->dense_bf16_flops_per_s : 0;
}

}  // namespace megaplan::cuda_module
