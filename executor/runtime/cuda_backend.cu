// The CUDA backend's kernels and cuBLAS calls. Conventions: row-major buffers; one thread per
// output element where the work is element-wise; one block per row where a row reduces; sums over
// rows for weight gradients run in a loop per column, in row order, so results never depend on
// scheduling.
#include "executor/runtime/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"

namespace megaplan::exec {

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw SpecError("--device", std::string(what) + ": " + cudaGetErrorString(status));
}
void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }
void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw SpecError("--device", std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(status)));
  }
}

constexpr int kThreads = 256;
unsigned blocks_for(std::size_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__device__ float block_sum(float value, float* shared) {
  // Fixed-order tree reduction over the block: deterministic.
  shared[threadIdx.x] = value;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  const float total = shared[0];
  __syncthreads();
  return total;
}

__device__ float block_max(float value, float* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + stride]);
    __syncthreads();
  }
  const float total = shared[0];
  __syncthreads();
  return total;
}

__global__ void fill_kernel(float* x, std::size_t n, float value) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = value;
}

__global__ void add_bias_kernel(float* y, const float* b, std::size_t m, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < m * n) y[i] += b[i % n];
}

// db[j] += sum over rows of dy[i][j], one thread per column, rows in order.
__global__ void column_sum_kernel(const float* dy, std::size_t m, std::size_t n, float* db) {
  const std::size_t j = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (j >= n) return;
  float sum = 0;
  for (std::size_t i = 0; i < m; ++i) sum += dy[i * n + j];
  db[j] += sum;
}

__global__ void embedding_forward_kernel(const int64_t* tokens, std::size_t count, std::size_t seq, const float* word,
                                         const float* position, std::size_t hidden, float* y) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= count * hidden) return;
  const std::size_t t = i / hidden, c = i % hidden;
  y[i] = word[static_cast<std::size_t>(tokens[t]) * hidden + c] + position[(t % seq) * hidden + c];
}

// One thread per (used table row, column): it adds its row's token gradients in token order, from
// a host-built list of each used row's token positions (CSR). Deterministic, and O(tokens x hidden).
__global__ void embedding_backward_kernel(const float* dy, const int64_t* row_ids, const int64_t* row_starts,
                                          const int64_t* positions, std::size_t used_rows, std::size_t hidden,
                                          float* table) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= used_rows * hidden) return;
  const std::size_t r = i / hidden, c = i % hidden;
  float sum = 0;
  for (int64_t p = row_starts[r]; p < row_starts[r + 1]; ++p) sum += dy[static_cast<std::size_t>(positions[p]) * hidden + c];
  table[static_cast<std::size_t>(row_ids[r]) * hidden + c] += sum;
}

__global__ void layernorm_forward_kernel(const float* x, const float* gamma, const float* beta, std::size_t cols,
                                         float eps, float* y, float* mean, float* rstd) {
  __shared__ float shared[kThreads];
  const float* row = x + blockIdx.x * cols;
  float sum = 0;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) sum += row[c];
  const float mu = block_sum(sum, shared) / static_cast<float>(cols);
  float squares = 0;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) squares += (row[c] - mu) * (row[c] - mu);
  const float inverse = rsqrtf(block_sum(squares, shared) / static_cast<float>(cols) + eps);
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {
    y[blockIdx.x * cols + c] = (row[c] - mu) * inverse * gamma[c] + beta[c];
  }
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = mu;
    rstd[blockIdx.x] = inverse;
  }
}

__global__ void layernorm_backward_input_kernel(const float* dy, const float* x, const float* gamma, const float* mean,
                                                const float* rstd, std::size_t cols, float* dx) {
  __shared__ float shared[kThreads];
  const std::size_t r = blockIdx.x;
  float g_sum = 0, gx_sum = 0;
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float x_hat = (x[r * cols + c] - mean[r]) * rstd[r];
    const float g = dy[r * cols + c] * gamma[c];
    g_sum += g;
    gx_sum += g * x_hat;
  }
  g_sum = block_sum(g_sum, shared);
  gx_sum = block_sum(gx_sum, shared);
  const float n = static_cast<float>(cols);
  for (std::size_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float x_hat = (x[r * cols + c] - mean[r]) * rstd[r];
    const float g = dy[r * cols + c] * gamma[c];
    dx[r * cols + c] = rstd[r] * (g - g_sum / n - x_hat * gx_sum / n);
  }
}

__global__ void layernorm_backward_weights_kernel(const float* dy, const float* x, const float* mean, const float* rstd,
                                                  std::size_t rows, std::size_t cols, float* dgamma, float* dbeta) {
  const std::size_t c = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  float gamma_sum = 0, beta_sum = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const float x_hat = (x[r * cols + c] - mean[r]) * rstd[r];
    gamma_sum += dy[r * cols + c] * x_hat;
    beta_sum += dy[r * cols + c];
  }
  dgamma[c] += gamma_sum;
  dbeta[c] += beta_sum;
}

__device__ constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
__device__ constexpr float kGeluCubic = 0.044715f;

__global__ void gelu_forward_kernel(const float* x, std::size_t n, float* y) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  y[i] = 0.5f * v * (1.0f + tanhf(kGeluScale * (v + kGeluCubic * v * v * v)));
}

__global__ void gelu_backward_kernel(const float* dy, const float* x, std::size_t n, float* dx) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  const float t = tanhf(kGeluScale * (v + kGeluCubic * v * v * v));
  dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v));
}

// qkv element (b, s, head, part, d) at ((b * seq + s) * heads + head) * 3 * dim + part * dim + d.
__device__ std::size_t qkv_at(std::size_t b, std::size_t s, std::size_t h, std::size_t part, std::size_t seq,
                              std::size_t heads, std::size_t dim) {
  return ((b * seq + s) * heads + h) * 3 * dim + part * dim;
}

// One block per (batch x head, query row i): scores against keys 0..i in shared memory (seq floats).
__global__ void attention_forward_kernel(const float* qkv, std::size_t seq, std::size_t heads, std::size_t dim,
                                         float scale, float* out, float* probs) {
  extern __shared__ float scores[];
  __shared__ float reduce[kThreads];
  const std::size_t bh = blockIdx.x / seq, i = blockIdx.x % seq;
  const std::size_t b = bh / heads, h = bh % heads;
  const float* q = qkv + qkv_at(b, i, h, 0, seq, heads, dim);
  float peak = -INFINITY;
  for (std::size_t j = threadIdx.x; j <= i; j += blockDim.x) {
    const float* k = qkv + qkv_at(b, j, h, 1, seq, heads, dim);
    float dot = 0;
    for (std::size_t d = 0; d < dim; ++d) dot += q[d] * k[d];
    scores[j] = dot * scale;
    peak = fmaxf(peak, scores[j]);
  }
  peak = block_max(peak, reduce);
  float sum = 0;
  for (std::size_t j = threadIdx.x; j <= i; j += blockDim.x) {
    scores[j] = expf(scores[j] - peak);
    sum += scores[j];
  }
  sum = block_sum(sum, reduce);
  float* p = probs + (bh * seq + i) * seq;
  for (std::size_t j = threadIdx.x; j < seq; j += blockDim.x) p[j] = j <= i ? scores[j] / sum : 0.0f;
  __syncthreads();
  for (std::size_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float value = 0;
    for (std::size_t j = 0; j <= i; ++j) value += p[j] * qkv[qkv_at(b, j, h, 2, seq, heads, dim) + d];
    out[((b * seq + i) * heads + h) * dim + d] = value;
  }
}

// Per query row i: row_dot[i] = sum_j p_ij (dO_i . V_j), and dQ_i = scale sum_j p_ij (dO_i . V_j - row_dot) K_j.
__global__ void attention_backward_query_kernel(const float* dout, const float* qkv, const float* probs,
                                                std::size_t seq, std::size_t heads, std::size_t dim, float scale,
                                                float* row_dots, float* dqkv) {
  extern __shared__ float dp[];
  __shared__ float reduce[kThreads];
  const std::size_t bh = blockIdx.x / seq, i = blockIdx.x % seq;
  const std::size_t b = bh / heads, h = bh % heads;
  const float* g = dout + ((b * seq + i) * heads + h) * dim;
  const float* p = probs + (bh * seq + i) * seq;
  float partial = 0;
  for (std::size_t j = threadIdx.x; j <= i; j += blockDim.x) {
    const float* v = qkv + qkv_at(b, j, h, 2, seq, heads, dim);
    float dot = 0;
    for (std::size_t d = 0; d < dim; ++d) dot += g[d] * v[d];
    dp[j] = dot;
    partial += p[j] * dot;
  }
  const float row_dot = block_sum(partial, reduce);
  if (threadIdx.x == 0) row_dots[bh * seq + i] = row_dot;
  for (std::size_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float value = 0;
    for (std::size_t j = 0; j <= i; ++j) value += p[j] * (dp[j] - row_dot) * qkv[qkv_at(b, j, h, 1, seq, heads, dim) + d];
    dqkv[qkv_at(b, i, h, 0, seq, heads, dim) + d] = value * scale;
  }
}

// Per key row j (one thread per dimension d): dV_j = sum_{i>=j} p_ij dO_i and
// dK_j = scale sum_{i>=j} p_ij (dO_i . V_j - row_dot_i) Q_i.
__global__ void attention_backward_key_kernel(const float* dout, const float* qkv, const float* probs,
                                              const float* row_dots, std::size_t seq, std::size_t heads,
                                              std::size_t dim, float scale, float* dqkv) {
  extern __shared__ float ds[];  // per i >= j: p_ij, then p_ij (dO_i . V_j - row_dot_i)
  __shared__ float reduce[kThreads];
  const std::size_t bh = blockIdx.x / seq, j = blockIdx.x % seq;
  const std::size_t b = bh / heads, h = bh % heads;
  const float* v = qkv + qkv_at(b, j, h, 2, seq, heads, dim);
  for (std::size_t i = j; i < seq; ++i) {
    const float* g = dout + ((b * seq + i) * heads + h) * dim;
    float partial = 0;
    for (std::size_t d = threadIdx.x; d < dim; d += blockDim.x) partial += g[d] * v[d];
    const float dot = block_sum(partial, reduce);
    if (threadIdx.x == 0) ds[i] = probs[(bh * seq + i) * seq + j] * (dot - row_dots[bh * seq + i]);
  }
  __syncthreads();
  for (std::size_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float dk = 0, dv = 0;
    for (std::size_t i = j; i < seq; ++i) {
      dk += ds[i] * qkv[qkv_at(b, i, h, 0, seq, heads, dim) + d];
      dv += probs[(bh * seq + i) * seq + j] * dout[((b * seq + i) * heads + h) * dim + d];
    }
    dqkv[qkv_at(b, j, h, 1, seq, heads, dim) + d] = dk * scale;
    dqkv[qkv_at(b, j, h, 2, seq, heads, dim) + d] = dv;
  }
}

__global__ void cross_entropy_forward_kernel(const float* logits, const int64_t* targets, const float* mask,
                                             std::size_t vocab, float* probs, float* losses) {
  __shared__ float reduce[kThreads];
  const std::size_t t = blockIdx.x;
  const float* row = logits + t * vocab;
  float peak = -INFINITY;
  for (std::size_t v = threadIdx.x; v < vocab; v += blockDim.x) peak = fmaxf(peak, row[v]);
  peak = block_max(peak, reduce);
  float sum = 0;
  for (std::size_t v = threadIdx.x; v < vocab; v += blockDim.x) sum += expf(row[v] - peak);
  sum = block_sum(sum, reduce);
  for (std::size_t v = threadIdx.x; v < vocab; v += blockDim.x) probs[t * vocab + v] = expf(row[v] - peak) / sum;
  if (threadIdx.x == 0) losses[t] = (logf(sum) + peak - row[static_cast<std::size_t>(targets[t])]) * mask[t];
}

__global__ void cross_entropy_backward_kernel(const float* probs, const int64_t* targets, const float* mask,
                                              std::size_t tokens, std::size_t vocab, float scale, float* dlogits) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= tokens * vocab) return;
  const std::size_t t = i / vocab, v = i % vocab;
  const float onehot = v == static_cast<std::size_t>(targets[t]) ? 1.0f : 0.0f;
  dlogits[i] = (probs[i] - onehot) * mask[t] * scale;
}

__global__ void add_kernel(const float* a, const float* b, std::size_t n, float* y) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = a[i] + b[i];
}

__global__ void accumulate_kernel(const float* a, std::size_t n, float* y) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += a[i];
}

__global__ void scale_kernel(float* x, std::size_t n, float factor) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] *= factor;
}

// Per-block partial sums of squares (in double), summed on the host in block order.
__global__ void sum_of_squares_kernel(const float* x, std::size_t n, double* partial) {
  __shared__ double shared[kThreads];
  double sum = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    sum += static_cast<double>(x[i]) * x[i];
  }
  shared[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = shared[0];
}

__global__ void adamw_kernel(float* w, const float* g, float* m, float* v, std::size_t n, double correction1,
                             double correction2, double lr, double beta1, double beta2, double eps, double weight_decay) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const double grad = g[i];
  const double first = beta1 * m[i] + (1.0 - beta1) * grad;
  const double second = beta2 * v[i] + (1.0 - beta2) * grad * grad;
  m[i] = static_cast<float>(first);
  v[i] = static_cast<float>(second);
  const double update = (first / correction1) / (sqrt(second / correction2) + eps) + weight_decay * w[i];
  w[i] = static_cast<float>(w[i] - lr * update);
}

constexpr unsigned kSquareBlocks = 256;

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cublasCreate(&cublas_), "cublasCreate");
    check(cublasSetMathMode(cublas_, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");  // fp32, no TF32
    check(cudaMalloc(&partials_, kSquareBlocks * sizeof(double)), "cudaMalloc");
  }
  ~CudaBackend() override {
    for (auto& [pointer, size] : sizes_) cudaFree(pointer);
    if (tokens_) cudaFree(tokens_);
    if (targets_) cudaFree(targets_);
    cudaFree(partials_);
    cublasDestroy(cublas_);
  }

  std::string name() const override { return "cuda"; }

  float* allocate(std::size_t n) override {
    float* pointer = nullptr;
    check(cudaMalloc(&pointer, std::max<std::size_t>(n, 1) * sizeof(float)), "cudaMalloc");
    check(cudaMemset(pointer, 0, std::max<std::size_t>(n, 1) * sizeof(float)), "cudaMemset");
    sizes_[pointer] = n;
    bytes_ += static_cast<int64_t>(n * sizeof(float));
    peak_ = std::max(peak_, bytes_);
    return pointer;
  }
  void release(float* buffer) override {
    const auto found = sizes_.find(buffer);
    if (found == sizes_.end()) return;
    bytes_ -= static_cast<int64_t>(found->second * sizeof(float));
    sizes_.erase(found);
    check(cudaFree(buffer), "cudaFree");
  }
  int64_t peak_bytes() const override { return peak_; }
  void upload(float* device, const float* host, std::size_t n) override {
    check(cudaMemcpy(device, host, n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  void download(float* host, const float* device, std::size_t n) override {
    check(cudaMemcpy(host, device, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  }
  void fill(float* x, std::size_t n, float value) override {
    if (n == 0) return;
    fill_kernel<<<blocks_for(n), kThreads>>>(x, n, value);
    check_launch("fill");
  }

  void linear_forward(const float* x, const float* w, const float* b, std::size_t m, std::size_t k, std::size_t n,
                      float* y) override {
    const float one = 1, zero = 0;
    // Row-major Y = X W^T is column-major Y^T = W X^T.
    check(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                      &one, w, static_cast<int>(k), x, static_cast<int>(k), &zero, y, static_cast<int>(n)),
          "cublasSgemm (linear forward)");
    if (b) {
      add_bias_kernel<<<blocks_for(m * n), kThreads>>>(y, b, m, n);
      check_launch("add_bias");
    }
  }
  void linear_backward(const float* dy, const float* x, const float* w, std::size_t m, std::size_t k, std::size_t n,
                       float* dx, float* dw, float* db) override {
    const float one = 1, zero = 0;
    if (dx) {  // dX = dY W: column-major dX^T = W^T dY^T
      check(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(k), static_cast<int>(m), static_cast<int>(n),
                        &one, w, static_cast<int>(k), dy, static_cast<int>(n), &zero, dx, static_cast<int>(k)),
            "cublasSgemm (input gradient)");
    }
    // dW += dY^T X: column-major dW^T += X^T dY.
    check(cublasSgemm(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(k), static_cast<int>(n), static_cast<int>(m),
                      &one, x, static_cast<int>(k), dy, static_cast<int>(n), &one, dw, static_cast<int>(k)),
          "cublasSgemm (weight gradient)");
    if (db) {
      column_sum_kernel<<<blocks_for(n), kThreads>>>(dy, m, n, db);
      check_launch("column_sum");
    }
  }

  void embedding_forward(const int64_t* tokens, std::size_t count, std::size_t seq, const float* word,
                         const float* position, std::size_t hidden, float* y) override {
    const int64_t* device_tokens = upload_tokens(tokens, count, tokens_, tokens_capacity_);
    embedding_forward_kernel<<<blocks_for(count * hidden), kThreads>>>(device_tokens, count, seq, word, position,
                                                                       hidden, y);
    check_launch("embedding_forward");
  }
  void embedding_backward(const float* dy, const int64_t* tokens, std::size_t count, std::size_t seq,
                          std::size_t hidden, float* dword, float* dposition) override {
    // The word table's rows by token id, then the position table's by position.
    std::vector<int64_t> word_rows(count);
    for (std::size_t t = 0; t < count; ++t) word_rows[t] = tokens[t];
    scatter_rows(dy, word_rows, hidden, dword);
    std::vector<int64_t> position_rows(count);
    for (std::size_t t = 0; t < count; ++t) position_rows[t] = static_cast<int64_t>(t % seq);
    scatter_rows(dy, position_rows, hidden, dposition);
  }

  void layernorm_forward(const float* x, const float* gamma, const float* beta, std::size_t rows, std::size_t cols,
                         float* y, float* mean, float* rstd) override {
    layernorm_forward_kernel<<<static_cast<unsigned>(rows), kThreads>>>(x, gamma, beta, cols, 1e-5f, y, mean, rstd);
    check_launch("layernorm_forward");
  }
  void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                          std::size_t rows, std::size_t cols, float* dx, float* dgamma, float* dbeta) override {
    layernorm_backward_input_kernel<<<static_cast<unsigned>(rows), kThreads>>>(dy, x, gamma, mean, rstd, cols, dx);
    check_launch("layernorm_backward_input");
    layernorm_backward_weights_kernel<<<blocks_for(cols), kThreads>>>(dy, x, mean, rstd, rows, cols, dgamma, dbeta);
    check_launch("layernorm_backward_weights");
  }

  void gelu_forward(const float* x, std::size_t n, float* y) override {
    gelu_forward_kernel<<<blocks_for(n), kThreads>>>(x, n, y);
    check_launch("gelu_forward");
  }
  void gelu_backward(const float* dy, const float* x, std::size_t n, float* dx) override {
    gelu_backward_kernel<<<blocks_for(n), kThreads>>>(dy, x, n, dx);
    check_launch("gelu_backward");
  }

  std::size_t attention_saved_size(std::size_t batch, std::size_t seq, std::size_t heads, std::size_t) const override {
    return batch * heads * seq * seq + batch * heads * seq;  // probabilities, then the backward's row dots
  }
  void attention_forward(const float* qkv, std::size_t batch, std::size_t seq, std::size_t heads, std::size_t dim,
                         float* out, float* saved) override {
    const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
    attention_forward_kernel<<<static_cast<unsigned>(batch * heads * seq), kThreads, seq * sizeof(float)>>>(
        qkv, seq, heads, dim, scale, out, saved);
    check_launch("attention_forward");
  }
  void attention_backward(const float* dout, const float* qkv, const float* saved, std::size_t batch, std::size_t seq,
                          std::size_t heads, std::size_t dim, float* dqkv) override {
    const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
    float* row_dots = const_cast<float*>(saved) + batch * heads * seq * seq;
    const auto blocks = static_cast<unsigned>(batch * heads * seq);
    attention_backward_query_kernel<<<blocks, kThreads, seq * sizeof(float)>>>(dout, qkv, saved, seq, heads, dim, scale,
                                                                               row_dots, dqkv);
    check_launch("attention_backward_query");
    attention_backward_key_kernel<<<blocks, kThreads, seq * sizeof(float)>>>(dout, qkv, saved, row_dots, seq, heads,
                                                                             dim, scale, dqkv);
    check_launch("attention_backward_key");
  }

  double cross_entropy_forward(const float* logits, const int64_t* targets, const float* mask, std::size_t tokens,
                               std::size_t vocab, float* probs) override {
    const int64_t* device_targets = upload_tokens(targets, tokens, targets_, targets_capacity_);
    float* device_mask = scratch(mask_, mask_capacity_, tokens);
    upload(device_mask, mask, tokens);
    float* losses = scratch(losses_, losses_capacity_, tokens);
    cross_entropy_forward_kernel<<<static_cast<unsigned>(tokens), kThreads>>>(logits, device_targets, device_mask, vocab,
                                                                              probs, losses);
    check_launch("cross_entropy_forward");
    std::vector<float> host(tokens);
    download(host.data(), losses, tokens);
    double loss = 0, total = 0;
    for (std::size_t t = 0; t < tokens; ++t) {
      loss += host[t];
      total += mask[t];
    }
    return total > 0 ? loss / total : 0.0;
  }
  void cross_entropy_backward(const float* probs, const int64_t* targets, const float* mask, std::size_t tokens,
                              std::size_t vocab, float scale_factor, float* dlogits) override {
    const int64_t* device_targets = upload_tokens(targets, tokens, targets_, targets_capacity_);
    float* device_mask = scratch(mask_, mask_capacity_, tokens);
    upload(device_mask, mask, tokens);
    double total = 0;
    for (std::size_t t = 0; t < tokens; ++t) total += mask[t];
    const float factor = total > 0 ? static_cast<float>(scale_factor / total) : 0.0f;
    cross_entropy_backward_kernel<<<blocks_for(tokens * vocab), kThreads>>>(probs, device_targets, device_mask, tokens,
                                                                            vocab, factor, dlogits);
    check_launch("cross_entropy_backward");
  }

  void add(const float* a, const float* b, std::size_t n, float* y) override {
    add_kernel<<<blocks_for(n), kThreads>>>(a, b, n, y);
    check_launch("add");
  }
  void accumulate(const float* a, std::size_t n, float* y) override {
    accumulate_kernel<<<blocks_for(n), kThreads>>>(a, n, y);
    check_launch("accumulate");
  }
  void scale(float* x, std::size_t n, float factor) override {
    scale_kernel<<<blocks_for(n), kThreads>>>(x, n, factor);
    check_launch("scale");
  }
  double sum_of_squares(const float* x, std::size_t n) override {
    sum_of_squares_kernel<<<kSquareBlocks, kThreads>>>(x, n, partials_);
    check_launch("sum_of_squares");
    double host[kSquareBlocks];
    check(cudaMemcpy(host, partials_, sizeof host, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    double sum = 0;
    for (double partial : host) sum += partial;
    return sum;
  }
  void adamw_step(float* w, const float* g, float* m, float* v, std::size_t n, int64_t step, double lr, double beta1,
                  double beta2, double eps, double weight_decay) override {
    const double correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
    const double correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
    adamw_kernel<<<blocks_for(n), kThreads>>>(w, g, m, v, n, correction1, correction2, lr, beta1, beta2, eps,
                                              weight_decay);
    check_launch("adamw");
  }

 private:
  // table[row_of[t]] += dy[t] for every t, grouped on the host into a CSR list per used row.
  void scatter_rows(const float* dy, const std::vector<int64_t>& row_of, std::size_t hidden, float* table) {
    std::vector<int64_t> order(row_of.size());
    for (std::size_t t = 0; t < order.size(); ++t) order[t] = static_cast<int64_t>(t);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return row_of[a] < row_of[b]; });
    std::vector<int64_t> ids, starts;
    for (std::size_t p = 0; p < order.size(); ++p) {
      if (p == 0 || row_of[order[p]] != row_of[order[p - 1]]) {
        ids.push_back(row_of[order[p]]);
        starts.push_back(static_cast<int64_t>(p));
      }
    }
    starts.push_back(static_cast<int64_t>(order.size()));
    // One upload: ids, then starts, then positions.
    std::vector<int64_t> packed(ids);
    packed.insert(packed.end(), starts.begin(), starts.end());
    packed.insert(packed.end(), order.begin(), order.end());
    const int64_t* device = upload_tokens(packed.data(), packed.size(), tokens_, tokens_capacity_);
    embedding_backward_kernel<<<blocks_for(ids.size() * hidden), kThreads>>>(
        dy, device, device + ids.size(), device + ids.size() + starts.size(), ids.size(), hidden, table);
    check_launch("embedding_backward");
  }

  const int64_t* upload_tokens(const int64_t* host, std::size_t count, int64_t*& device, std::size_t& capacity) {
    if (count > capacity) {
      if (device) check(cudaFree(device), "cudaFree");
      check(cudaMalloc(&device, count * sizeof(int64_t)), "cudaMalloc");
      capacity = count;
    }
    check(cudaMemcpy(device, host, count * sizeof(int64_t), cudaMemcpyHostToDevice), "cudaMemcpy to device");
    return device;
  }
  float* scratch(float*& buffer, std::size_t& capacity, std::size_t n) {
    if (n > capacity) {
      if (buffer) release(buffer);
      buffer = allocate(n);
      capacity = n;
    }
    return buffer;
  }

  cublasHandle_t cublas_ = nullptr;
  std::unordered_map<float*, std::size_t> sizes_;
  int64_t bytes_ = 0;
  int64_t peak_ = 0;
  int64_t* tokens_ = nullptr;
  std::size_t tokens_capacity_ = 0;
  int64_t* targets_ = nullptr;
  std::size_t targets_capacity_ = 0;
  float* mask_ = nullptr;
  std::size_t mask_capacity_ = 0;
  float* losses_ = nullptr;
  std::size_t losses_capacity_ = 0;
  double* partials_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    throw SpecError("--device", std::string("no usable CUDA GPU: ") +
                                    (status != cudaSuccess ? cudaGetErrorString(status) : "none present"));
  }
  return std::make_unique<CudaBackend>();
}

double cuda_dense_bf16_peak_flops() {
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, 0) != cudaSuccess) return 0;
  const std::string name = properties.name;
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) return 989.4e12;
  if (name.find("A100") != std::string::npos) return 312e12;
  return 0;
}

}  // namespace megaplan::exec
