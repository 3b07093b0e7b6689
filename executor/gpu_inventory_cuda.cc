// The GPU inventory and device probe of a CUDA build (in the CUDA module, cuda_module.h): asks the
// CUDA runtime, cuBLAS, cuBLASLt and NCCL what this process can use, and runs a kernel plus a
// cuBLASLt GEMM on a device.
//
// Every failure here is the environment (no driver, a device this binary has no kernel image
// for, a broken library install) rather than a bug, and the person who hits it must act on one
// line: so each one becomes SpecError("gpu", ...) that names the call, the device and the reason.
#include <cstdlib>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <library_types.h>
#include <nccl.h>

#include "core/error.h"
#include "executor/cuda_module.h"
#include "executor/device_probe.h"
#include "executor/gpu_inventory.h"

namespace megaplan {
namespace {

[[noreturn]] void fail(const std::string& rule) { throw SpecError("gpu", rule); }

// "13000" (1000 x major + 10 x minor) as the CUDA runtime and driver report versions.
LibraryVersion cuda_version(int encoded) { return LibraryVersion{encoded / 1000, (encoded % 1000) / 10, 0}; }

std::string visible_devices_note() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr) return "";
  return "; CUDA_VISIBLE_DEVICES=\"" + std::string(visible) + "\"";
}

// What to do about the errors that mean "this build does not fit this machine".
std::string hint_for(cudaError_t status) {
  switch (status) {
    case cudaErrorNoKernelImageForDevice:
      return " (this binary holds device code for " + cuda_module::built_cuda_architectures() +
             " only: rebuild with CMAKE_CUDA_ARCHITECTURES set to this device's architecture)";
    case cudaErrorUnsupportedPtxVersion:
      return " (the driver is older than the CUDA toolkit that compiled this binary: update the "
             "driver or build with an older toolkit)";
    case cudaErrorInsufficientDriver:
      return " (the installed driver is older than the CUDA runtime this binary loaded)";
    default: return "";
  }
}

// Throws SpecError("gpu", "<where><call> failed: <reason> (<cudaErrorName>)") unless success.
void check_cuda(cudaError_t status, const char* call, const std::string& where) {
  if (status == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so that later calls start clean
  fail(where + call + " failed: " + cudaGetErrorString(status) + " (" + cudaGetErrorName(status) + ")" +
       hint_for(status));
}

void check_cublas(cublasStatus_t status, const char* call, const std::string& where) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  fail(where + call + " failed: " + cublasGetStatusString(status) + " (" + cublasGetStatusName(status) + ")");
}

void check_nccl(ncclResult_t status, const char* call, const std::string& where) {
  if (status == ncclSuccess) return;
  fail(where + call + " failed: " + ncclGetErrorString(status));
}

// A CUDA/cuBLAS object destroyed on scope exit. The normal path calls destroy() so that a
// failing destroy is reported; the destructor covers the error path, where a second error
// (after a sticky fault, say) must not hide the first.
template <typename Handle, auto Destroy>
class Owned {
 public:
  Owned() = default;
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (handle_ != Handle{}) (void)Destroy(handle_);
  }
  Handle* out() { return &handle_; }
  Handle get() const { return handle_; }
  auto destroy() {
    auto status = Destroy(handle_);
    handle_ = Handle{};
    return status;
  }

 private:
  Handle handle_{};
};

using DeviceMemory = Owned<void*, &cudaFree>;
using Stream = Owned<cudaStream_t, &cudaStreamDestroy>;
using CublasHandle = Owned<cublasHandle_t, &cublasDestroy>;
using CublasLtHandle = Owned<cublasLtHandle_t, &cublasLtDestroy>;
using MatmulDesc = Owned<cublasLtMatmulDesc_t, &cublasLtMatmulDescDestroy>;
using MatrixLayout = Owned<cublasLtMatrixLayout_t, &cublasLtMatrixLayoutDestroy>;

// Restores the calling thread's current device, which the inventory and the probe change.
class CurrentDeviceGuard {
 public:
  CurrentDeviceGuard() { check_cuda(cudaGetDevice(&saved_), "cudaGetDevice", ""); }
  CurrentDeviceGuard(const CurrentDeviceGuard&) = delete;
  CurrentDeviceGuard& operator=(const CurrentDeviceGuard&) = delete;
  ~CurrentDeviceGuard() { (void)cudaSetDevice(saved_); }

 private:
  int saved_ = 0;
};

// The number of devices, or SpecError saying why there are none.
int usable_device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    std::string reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
    // Without libcuda the runtime says "driver version is insufficient": name the real cause.
    int driver = 0;
    int runtime = 0;
    if (cudaDriverGetVersion(&driver) == cudaSuccess && cudaRuntimeGetVersion(&runtime) == cudaSuccess) {
      if (driver == 0) {
        reason = "no NVIDIA driver is loaded; " + reason;
      } else if (driver < runtime) {
        reason += "; the driver supports up to CUDA " + cuda_version(driver).text(false) +
                  ", this binary loaded the CUDA " + cuda_version(runtime).text(false) + " runtime";
      }
    }
    fail("no CUDA device found (" + reason + visible_devices_note() + ")");
  }
  if (count == 0) fail("no CUDA device found (cudaGetDeviceCount returned 0" + visible_devices_note() + ")");
  return count;
}

void require_device_exists(int device_index, int count) {
  if (device_index >= 0 && device_index < count) return;
  fail("device " + std::to_string(device_index) + " does not exist: this process sees " + std::to_string(count) +
       " CUDA device" + (count == 1 ? "" : "s") + ", numbered 0 to " + std::to_string(count - 1) +
       visible_devices_note());
}

LibraryVersion cublas_version() {
  LibraryVersion version;
  check_cublas(cublasGetProperty(MAJOR_VERSION, &version.major), "cublasGetProperty(MAJOR_VERSION)", "");
  check_cublas(cublasGetProperty(MINOR_VERSION, &version.minor), "cublasGetProperty(MINOR_VERSION)", "");
  check_cublas(cublasGetProperty(PATCH_LEVEL, &version.patch), "cublasGetProperty(PATCH_LEVEL)", "");
  return version;
}

LibraryVersion cublaslt_version() {
  LibraryVersion version;
  check_cublas(cublasLtGetProperty(MAJOR_VERSION, &version.major), "cublasLtGetProperty(MAJOR_VERSION)", "");
  check_cublas(cublasLtGetProperty(MINOR_VERSION, &version.minor), "cublasLtGetProperty(MINOR_VERSION)", "");
  check_cublas(cublasLtGetProperty(PATCH_LEVEL, &version.patch), "cublasLtGetProperty(PATCH_LEVEL)", "");
  return version;
}

LibraryVersion nccl_version() {
  int code = 0;
  check_nccl(ncclGetVersion(&code), "ncclGetVersion", "");
  // NCCL encodes 2.28.9 as 22809; releases up to 2.8 used 1000 x major + 100 x minor + patch.
  if (code >= 10000) return LibraryVersion{code / 10000, (code % 10000) / 100, code % 100};
  return LibraryVersion{code / 1000, (code % 1000) / 100, code % 100};
}

// "device 0 (NVIDIA H100 80GB HBM3, sm_90): ", the prefix of every per-device message.
std::string describe(int device_index, const cudaDeviceProp& properties) {
  return "device " + std::to_string(device_index) + " (" + properties.name + ", sm_" +
         std::to_string(properties.major) + std::to_string(properties.minor) + "): ";
}

// An attribute that some devices or runtimes do not report: 0 when the query fails.
int optional_attribute(cudaDeviceAttr attribute, int device_index) {
  int value = 0;
  if (cudaDeviceGetAttribute(&value, attribute, device_index) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return value;
}

GpuDevice query_device(int device_index) {
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, device_index), "cudaGetDeviceProperties",
             "device " + std::to_string(device_index) + ": ");
  const std::string where = describe(device_index, properties);

  GpuDevice device;
  device.index = device_index;
  device.name = properties.name;
  device.compute_capability_major = properties.major;
  device.compute_capability_minor = properties.minor;
  device.sm_count = properties.multiProcessorCount;
  device.total_memory_bytes = static_cast<int64_t>(properties.totalGlobalMem);
  // cudaDeviceProp lost clockRate and memoryClockRate in CUDA 13; the attributes still answer where known.
  device.sm_clock_khz = optional_attribute(cudaDevAttrClockRate, device_index);
  device.memory_clock_khz = optional_attribute(cudaDevAttrMemoryClockRate, device_index);
  device.memory_bus_width_bits = optional_attribute(cudaDevAttrGlobalMemoryBusWidth, device_index);

  char bus_id[32] = {};
  check_cuda(cudaDeviceGetPCIBusId(bus_id, static_cast<int>(sizeof(bus_id)), device_index), "cudaDeviceGetPCIBusId",
             where);
  device.pci_bus_id = bus_id;

  // Free memory is per context: this creates the device's primary context (and so proves the
  // driver can open it).
  check_cuda(cudaSetDevice(device_index), "cudaSetDevice", where);
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo", where);
  device.free_memory_bytes = static_cast<int64_t>(free_bytes);
  return device;
}

// The kernel half of the probe: fill a buffer on the device, copy it back, compare.
void probe_kernel(cudaStream_t stream, const std::string& where) {
  constexpr size_t kElements = size_t{1} << 20;  // 4 MiB: many blocks, every SM takes part
  constexpr uint32_t kSeed = 0x6D656761u;        // "mega"
  DeviceMemory buffer;
  check_cuda(cudaMalloc(buffer.out(), kElements * sizeof(uint32_t)), "cudaMalloc(probe buffer)", where);
  check_cuda(cudaMemsetAsync(buffer.get(), 0, kElements * sizeof(uint32_t), stream), "cudaMemsetAsync", where);
  check_cuda(detail::launch_fill_probe_pattern(static_cast<uint32_t*>(buffer.get()), kElements, kSeed, stream),
             "launching the probe kernel fill_probe_pattern", where);
  std::vector<uint32_t> host(kElements);
  check_cuda(cudaMemcpyAsync(host.data(), buffer.get(), kElements * sizeof(uint32_t), cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync(probe buffer to host)", where);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(after the probe kernel)", where);
  check_cuda(buffer.destroy(), "cudaFree(probe buffer)", where);

  size_t mismatches = 0;
  size_t first_mismatch = 0;
  for (size_t i = 0; i < kElements; ++i) {
    if (host[i] == detail::probe_pattern(i, kSeed)) continue;
    if (mismatches++ == 0) first_mismatch = i;
  }
  if (mismatches > 0) {
    fail(where + "the probe kernel wrote wrong values: " + std::to_string(mismatches) + " of " +
         std::to_string(kElements) + " elements differ from the host pattern, the first at index " +
         std::to_string(first_mismatch) + " (" + std::to_string(host[first_mismatch]) + " instead of " +
         std::to_string(detail::probe_pattern(first_mismatch, kSeed)) + ")");
  }
}

// The library half: a cuBLAS handle, and a small FP32 GEMM through cuBLASLt (which loads and
// runs one of its kernels on this architecture, unlike creating a handle alone).
void probe_libraries(cudaStream_t stream, const std::string& where) {
  CublasHandle cublas;
  check_cublas(cublasCreate(cublas.out()), "cublasCreate", where);
  check_cublas(cublasSetStream(cublas.get(), stream), "cublasSetStream", where);
  check_cublas(cublas.destroy(), "cublasDestroy", where);

  // D = A x B with small integers, so that every product and sum is exact in FP32 (and in TF32,
  // should a library choose it) and the result can be compared for equality.
  constexpr int kM = 64;
  constexpr int kN = 48;
  constexpr int kK = 32;
  std::vector<float> a(kM * kK);  // column-major, lda = kM
  std::vector<float> b(kK * kN);  // column-major, ldb = kK
  for (int k = 0; k < kK; ++k) {
    for (int i = 0; i < kM; ++i) a[static_cast<size_t>(k * kM + i)] = static_cast<float>((i + 2 * k) % 7 - 3);
    for (int j = 0; j < kN; ++j) b[static_cast<size_t>(j * kK + k)] = static_cast<float>((3 * j + k) % 5 - 2);
  }
  std::vector<float> expected(kM * kN, 0.0f);
  for (int j = 0; j < kN; ++j) {
    for (int i = 0; i < kM; ++i) {
      float sum = 0.0f;
      for (int k = 0; k < kK; ++k) sum += a[static_cast<size_t>(k * kM + i)] * b[static_cast<size_t>(j * kK + k)];
      expected[static_cast<size_t>(j * kM + i)] = sum;
    }
  }

  DeviceMemory a_device;
  DeviceMemory b_device;
  DeviceMemory d_device;
  check_cuda(cudaMalloc(a_device.out(), a.size() * sizeof(float)), "cudaMalloc(GEMM A)", where);
  check_cuda(cudaMalloc(b_device.out(), b.size() * sizeof(float)), "cudaMalloc(GEMM B)", where);
  check_cuda(cudaMalloc(d_device.out(), expected.size() * sizeof(float)), "cudaMalloc(GEMM D)", where);
  check_cuda(cudaMemcpyAsync(a_device.get(), a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync(GEMM A to device)", where);
  check_cuda(cudaMemcpyAsync(b_device.get(), b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync(GEMM B to device)", where);

  CublasLtHandle lt;
  check_cublas(cublasLtCreate(lt.out()), "cublasLtCreate", where);
  MatmulDesc operation;
  check_cublas(cublasLtMatmulDescCreate(operation.out(), CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate",
               where);
  MatrixLayout a_layout;
  MatrixLayout b_layout;
  MatrixLayout d_layout;
  check_cublas(cublasLtMatrixLayoutCreate(a_layout.out(), CUDA_R_32F, kM, kK, kM), "cublasLtMatrixLayoutCreate(A)",
               where);
  check_cublas(cublasLtMatrixLayoutCreate(b_layout.out(), CUDA_R_32F, kK, kN, kK), "cublasLtMatrixLayoutCreate(B)",
               where);
  check_cublas(cublasLtMatrixLayoutCreate(d_layout.out(), CUDA_R_32F, kM, kN, kM), "cublasLtMatrixLayoutCreate(D)",
               where);
  const float alpha = 1.0f;
  const float beta = 0.0f;
  // No algorithm and no workspace: cuBLASLt runs its own heuristic, which is all a probe needs.
  check_cublas(cublasLtMatmul(lt.get(), operation.get(), &alpha, a_device.get(), a_layout.get(), b_device.get(),
                              b_layout.get(), &beta, d_device.get(), d_layout.get(), d_device.get(), d_layout.get(),
                              nullptr, nullptr, 0, stream),
               "cublasLtMatmul(FP32 64x48x32)", where);
  std::vector<float> d(expected.size());
  check_cuda(cudaMemcpyAsync(d.data(), d_device.get(), d.size() * sizeof(float), cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync(GEMM D to host)", where);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(after cublasLtMatmul)", where);

  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] == expected[i]) continue;
    fail(where + "cublasLtMatmul(FP32 64x48x32) computed a wrong result: D[" + std::to_string(i % kM) + "," +
         std::to_string(i / kM) + "] = " + std::to_string(d[i]) + ", expected " + std::to_string(expected[i]));
  }

  check_cublas(d_layout.destroy(), "cublasLtMatrixLayoutDestroy(D)", where);
  check_cublas(b_layout.destroy(), "cublasLtMatrixLayoutDestroy(B)", where);
  check_cublas(a_layout.destroy(), "cublasLtMatrixLayoutDestroy(A)", where);
  check_cublas(operation.destroy(), "cublasLtMatmulDescDestroy", where);
  check_cublas(lt.destroy(), "cublasLtDestroy", where);
  check_cuda(d_device.destroy(), "cudaFree(GEMM D)", where);
  check_cuda(b_device.destroy(), "cudaFree(GEMM B)", where);
  check_cuda(a_device.destroy(), "cudaFree(GEMM A)", where);
}

}  // namespace

namespace cuda_module {

std::string built_cuda_architectures() {
  // __CUDA_ARCH_LIST__ spells "900,1000"; people read "sm_90,sm_100".
  const std::string list = detail::device_code_architecture_list();
  std::string result;
  size_t start = 0;
  while (start < list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    const int arch = std::atoi(list.substr(start, end - start).c_str());
    if (!result.empty()) result += ",";
    result += "sm_" + std::to_string(arch / 10);
    start = end + 1;
  }
  return result;
}

GpuInventory query_gpu_inventory() {
  const int count = usable_device_count();

  GpuInventory inventory;
  int runtime = 0;
  int driver = 0;
  check_cuda(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion", "");
  check_cuda(cudaDriverGetVersion(&driver), "cudaDriverGetVersion", "");
  inventory.cuda_runtime = cuda_version(runtime);
  inventory.cuda_driver = cuda_version(driver);
  inventory.cublas = cublas_version();
  inventory.cublaslt = cublaslt_version();
  inventory.nccl = nccl_version();

  CurrentDeviceGuard restore_current_device;
  for (int index = 0; index < count; ++index) inventory.devices.push_back(query_device(index));
  return inventory;
}

void probe_device(int device_index) {
  require_device_exists(device_index, usable_device_count());
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, device_index), "cudaGetDeviceProperties",
             "device " + std::to_string(device_index) + ": ");
  const std::string where = describe(device_index, properties);

  CurrentDeviceGuard restore_current_device;
  check_cuda(cudaSetDevice(device_index), "cudaSetDevice", where);
  Stream stream;
  check_cuda(cudaStreamCreateWithFlags(stream.out(), cudaStreamNonBlocking), "cudaStreamCreateWithFlags", where);
  probe_kernel(stream.get(), where);
  probe_libraries(stream.get(), where);
  check_cuda(stream.destroy(), "cudaStreamDestroy", where);
}

}  // namespace cuda_module
}  // namespace megaplan
