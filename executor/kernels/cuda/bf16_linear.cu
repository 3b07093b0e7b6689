#include "executor/kernels/cuda/bf16_linear.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "core/error.h"
#include "core/fnv1a.h"

namespace megaplan::exec::cuda {

namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw SpecError("--device", std::string(what) + ": " + cudaGetErrorString(status));
}
void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw SpecError("--device", std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(status)));
  }
}

cudaDataType_t cuda_half_type(bool fp16) { return fp16 ? CUDA_R_16F : CUDA_R_16BF; }

// One column-major GEMM D = op(A) op(B) (+ C = D when accumulating) with an epilogue.
struct Gemm {
  cublasOperation_t transa, transb;
  uint64_t rows, cols, inner;  // D is rows x cols, the product's inner dimension `inner`
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  void* d;
  int64_t ldd;
  cudaDataType_t d_type;
  bool accumulate;
  cublasLtEpilogue_t epilogue;
  const void* bias;
  cudaDataType_t bias_type;
  void* aux;
  int64_t aux_ld;
  cudaDataType_t half_type;  // the 16-bit operands' type: bf16 or fp16
};

// The heuristic's choice for each GEMM shape and epilogue: asking cuBLASLt costs tens of
// microseconds of host time, and a training step runs the same few hundred GEMMs every iteration.
// One choice per shape also keeps results reproducible run to run.
struct GemmKey {
  int transa, transb;
  uint64_t rows, cols, inner;
  int64_t lda, ldb, ldd, aux_ld;
  int d_type, epilogue, bias_type, half_type;
  bool accumulate, bias, aux;
  bool operator==(const GemmKey&) const = default;
};
struct GemmKeyHash {
  std::size_t operator()(const GemmKey& k) const {
    Fnv1a64 hash;
    for (uint64_t v :
         {uint64_t(k.transa), uint64_t(k.transb), k.rows, k.cols, k.inner, uint64_t(k.lda), uint64_t(k.ldb),
          uint64_t(k.ldd), uint64_t(k.aux_ld), uint64_t(k.d_type), uint64_t(k.epilogue), uint64_t(k.bias_type),
          uint64_t(k.half_type), uint64_t(k.accumulate), uint64_t(k.bias), uint64_t(k.aux)}) {
      hash.add_word(v);
    }
    return hash.value();
  }
};
using AlgorithmCache = std::unordered_map<GemmKey, cublasLtMatmulAlgo_t, GemmKeyHash>;

void run(cublasLtHandle_t handle, void* workspace, AlgorithmCache& cache, Gemm g, cudaStream_t stream) {
  // The 16-bit output and bias take the operands' type.
  if (g.d_type == CUDA_R_16BF) g.d_type = g.half_type;
  if (g.bias_type == CUDA_R_16BF) g.bias_type = g.half_type;
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  const auto cleanup = [&] {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (operation) cublasLtMatmulDescDestroy(operation);
  };
  try {
    check(cublasLtMatmulDescCreate(&operation, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    check(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_TRANSA, &g.transa, sizeof g.transa), "TRANSA");
    check(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_TRANSB, &g.transb, sizeof g.transb), "TRANSB");
    check(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epilogue, sizeof g.epilogue),
          "EPILOGUE");
    if (g.bias) {
      check(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias),
            "BIAS_POINTER");
      const int32_t type = g.bias_type;
      check(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type),
            "BIAS_DATA_TYPE");
    }
    if (g.aux) {
      check(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g.aux, sizeof g.aux),
            "EPILOGUE_AUX_POINTER");
      check(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &g.aux_ld, sizeof g.aux_ld),
            "EPILOGUE_AUX_LD");
    }
    const bool a_transposed = g.transa == CUBLAS_OP_T;
    const bool b_transposed = g.transb == CUBLAS_OP_T;
    check(cublasLtMatrixLayoutCreate(&a, g.half_type, a_transposed ? g.inner : g.rows, a_transposed ? g.rows : g.inner,
                                     g.lda),
          "layout A");
    check(cublasLtMatrixLayoutCreate(&b, g.half_type, b_transposed ? g.cols : g.inner, b_transposed ? g.inner : g.cols,
                                     g.ldb),
          "layout B");
    check(cublasLtMatrixLayoutCreate(&d, g.d_type, g.rows, g.cols, g.ldd), "layout D");
    const GemmKey key{g.transa,        g.transb,    g.rows,      g.cols,       g.inner,
                      g.lda,           g.ldb,       g.ldd,       g.aux_ld,     g.d_type,
                      g.epilogue,      g.bias_type, g.half_type, g.accumulate, g.bias != nullptr,
                      g.aux != nullptr};
    auto found_algorithm = cache.find(key);
    if (found_algorithm == cache.end()) {
      check(cublasLtMatmulPreferenceCreate(&preference), "preference");
      const std::size_t workspace_bytes = kWorkspaceBytes;
      check(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                 sizeof workspace_bytes),
            "workspace preference");
      cublasLtMatmulHeuristicResult_t heuristic{};
      int found = 0;
      check(cublasLtMatmulAlgoGetHeuristic(handle, operation, a, b, d, d, preference, 1, &heuristic, &found),
            "cublasLtMatmulAlgoGetHeuristic");
      if (found == 0) throw SpecError("--device", "cuBLASLt has no algorithm for this GEMM and epilogue");
      found_algorithm = cache.emplace(key, heuristic.algo).first;
    }
    const float alpha = 1.0f;
    const float beta = g.accumulate ? 1.0f : 0.0f;
    check(cublasLtMatmul(handle, operation, &alpha, g.a, a, g.b, b, &beta, g.d, d, g.d, d, &found_algorithm->second,
                         workspace, kWorkspaceBytes, stream),
          "cublasLtMatmul");
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
}

// dX[m x k] = dY W: column-major dX^T (k x m) = W^T (the buffer as is) dY^T (the buffer as is).
Gemm input_gradient(const Half* dy, const Half* w, int64_t m, int64_t k, int64_t n, Half* dx) {
  Gemm g{};
  g.transa = CUBLAS_OP_N;
  g.transb = CUBLAS_OP_N;
  g.rows = static_cast<uint64_t>(k);
  g.cols = static_cast<uint64_t>(m);
  g.inner = static_cast<uint64_t>(n);
  g.a = w;
  g.lda = k;
  g.b = dy;
  g.ldb = n;
  g.d = dx;
  g.ldd = k;
  g.d_type = CUDA_R_16BF;
  g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  return g;
}

}  // namespace

struct GemmAlgorithms {
  AlgorithmCache cache;
};

Bf16Linear::Bf16Linear() {
  cublasLtHandle_t handle = nullptr;
  check(cublasLtCreate(&handle), "cublasLtCreate");
  handle_ = handle;
  check(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc (cuBLASLt workspace)");
  algorithms_ = std::make_unique<GemmAlgorithms>();
}

Bf16Linear::~Bf16Linear() {
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

void Bf16Linear::forward(const Half* x, const Half* w, const Half* bias, int64_t m, int64_t k, int64_t n,
                         GemmEpilogue epilogue, Half* y, Half* pre_activation, cudaStream_t stream) {
  if (!is_forward_epilogue(epilogue)) {
    throw std::logic_error("Bf16Linear::forward: " + to_string(epilogue) + " is not a forward epilogue");
  }
  // Row-major Y = X W^T is column-major Y^T (n x m) = W (n x k, the buffer read transposed) X^T.
  Gemm g{};
  g.transa = CUBLAS_OP_T;
  g.transb = CUBLAS_OP_N;
  g.rows = static_cast<uint64_t>(n);
  g.cols = static_cast<uint64_t>(m);
  g.inner = static_cast<uint64_t>(k);
  g.a = w;
  g.lda = k;
  g.b = x;
  g.ldb = k;
  g.d = y;
  g.ldd = n;
  g.d_type = CUDA_R_16BF;
  g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (epilogue != GemmEpilogue::kNone) {
    g.bias = bias;
    g.bias_type = CUDA_R_16BF;
    g.epilogue = CUBLASLT_EPILOGUE_BIAS;
  }
  if (epilogue == GemmEpilogue::kBiasGelu) {
    g.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    g.aux = pre_activation;
    g.aux_ld = n;
  }
  g.half_type = cuda_half_type(fp16_);
  run(static_cast<cublasLtHandle_t>(handle_), workspace_, algorithms_->cache, g, stream);
}

void Bf16Linear::backward(const Half* dy, const Half* x, const Half* w, int64_t m, int64_t k, int64_t n, Half* dx,
                          float* dw, float* bias_gradient, cudaStream_t stream) {
  if (dx) {
    Gemm g = input_gradient(dy, w, m, k, n, dx);
    g.half_type = cuda_half_type(fp16_);
    run(static_cast<cublasLtHandle_t>(handle_), workspace_, algorithms_->cache, g, stream);
  }
  if (!dw) return;
  // dW += dY^T X: column-major dW^T (k x n) += X^T (the buffer as is) dY (the buffer transposed);
  // reducing B = dY over the inner (token) dimension gives the bias gradient (BGRADB).
  Gemm g{};
  g.transa = CUBLAS_OP_N;
  g.transb = CUBLAS_OP_T;
  g.rows = static_cast<uint64_t>(k);
  g.cols = static_cast<uint64_t>(n);
  g.inner = static_cast<uint64_t>(m);
  g.a = x;
  g.lda = k;
  g.b = dy;
  g.ldb = n;
  g.d = dw;
  g.ldd = k;
  g.d_type = CUDA_R_32F;
  g.accumulate = true;
  g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (bias_gradient) {
    g.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    g.bias = bias_gradient;
    g.bias_type = CUDA_R_32F;
  }
  g.half_type = cuda_half_type(fp16_);
  run(static_cast<cublasLtHandle_t>(handle_), workspace_, algorithms_->cache, g, stream);
}

void Bf16Linear::backward_data_through_gelu(const Half* dy, const Half* w, int64_t m, int64_t k, int64_t n,
                                            const Half* pre_activation, Half* d_pre, cudaStream_t stream) {
  // backward's dX GEMM with the DGELU epilogue, which multiplies by GELU' of the auxiliary
  // pre-activation: k x m column-major, the row-major [m x k] buffer.
  Gemm g = input_gradient(dy, w, m, k, n, d_pre);
  g.epilogue = CUBLASLT_EPILOGUE_DGELU;
  g.aux = const_cast<Half*>(pre_activation);  // read only: DGELU reads the auxiliary buffer
  g.aux_ld = k;
  g.half_type = cuda_half_type(fp16_);
  run(static_cast<cublasLtHandle_t>(handle_), workspace_, algorithms_->cache, g, stream);
}

Half to_half(float value, DType precision) { return float_to_half(value, precision); }

float from_half(Half value, DType precision) { return half_to_float(value, precision); }

// The uploads copy from pageable memory, which cudaMemcpyAsync stages before it returns: the host
// vectors (`converted` a temporary) may go at once.
Half* upload_half(const std::vector<float>& host, DType precision, cudaStream_t stream) {
  std::vector<Half> converted(host.size());
  for (std::size_t i = 0; i < host.size(); ++i) converted[i] = to_half(host[i], precision);
  void* device = nullptr;
  check(cudaMalloc(&device, std::max<std::size_t>(1, converted.size()) * sizeof(Half)), "cudaMalloc");
  check(cudaMemcpyAsync(device, converted.data(), converted.size() * sizeof(Half), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
  return static_cast<Half*>(device);
}

float* upload_floats(const std::vector<float>& host, cudaStream_t stream) {
  void* device = nullptr;
  check(cudaMalloc(&device, std::max<std::size_t>(1, host.size()) * sizeof(float)), "cudaMalloc");
  check(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
  return static_cast<float*>(device);
}

std::vector<float> download_half(const Half* device, std::size_t n, DType precision, cudaStream_t stream) {
  std::vector<Half> raw(n);
  check(cudaMemcpyAsync(raw.data(), device, n * sizeof(Half), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = from_half(raw[i], precision);
  return values;
}

std::vector<float> download_floats(const float* device, std::size_t n, cudaStream_t stream) {
  std::vector<float> values(n);
  check(cudaMemcpyAsync(values.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return values;
}

void free_device(void* device) { cudaFree(device); }

}  // namespace megaplan::exec::cuda
