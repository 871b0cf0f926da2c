// driver.hpp (private to the cuda layer) — the CUDA driver API as a table of entry points.
//
// The table is filled from libcuda.so.1 with cuGetProcAddress at kApiVersion (a fixed ABI: a symbol whose
// signature changed later still resolves to the one declared here), or, in tests, by a fake driver that models
// device memory with host memory (tests/cpp/test_cuda_host.cpp), so that pool bookkeeping, stream rules and copy
// planning are tested on machines without a GPU. Types are declared here from the CUDA driver API reference, not
// taken from cuda.h (tensorwire builds without the CUDA toolkit); their layouts are frozen by tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tensorwire/device.hpp"

namespace tw::cuda::detail {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;
using CUstream = void*;
using CUevent = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUmemHandle = unsigned long long;  // CUmemGenericAllocationHandle

/// The CUDA version whose ABI every entry point is resolved at (12.0: VMM, cuGetProcAddress, _v2 symbols).
inline constexpr int kApiVersion = 12000;

// Values from the driver API reference (cuda.h of CUDA 12/13).
inline constexpr CUresult kSuccess = 0;
inline constexpr CUresult kErrorOutOfMemory = 2;
inline constexpr CUresult kErrorNotReady = 600;
inline constexpr CUresult kErrorInvalidContext = 201;
inline constexpr int kAttrVmmSupported = 102;            // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
inline constexpr int kAttrPosixFdSupported = 103;        // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
inline constexpr int kAttrGpuDirectRdmaWithVmm = 110;    // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
inline constexpr int kAttrUnifiedAddressing = 41;        // CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
inline constexpr int kPointerAttrContext = 1;            // CU_POINTER_ATTRIBUTE_CONTEXT
inline constexpr int kPointerAttrMemoryType = 2;         // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
inline constexpr int kPointerAttrDeviceOrdinal = 9;      // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
inline constexpr unsigned kMemoryTypeHost = 1;           // CU_MEMORYTYPE_HOST
inline constexpr unsigned kMemoryTypeDevice = 2;         // CU_MEMORYTYPE_DEVICE
inline constexpr unsigned kMemoryTypeUnified = 4;        // CU_MEMORYTYPE_UNIFIED
inline constexpr unsigned kEventDisableTiming = 0x2;     // CU_EVENT_DISABLE_TIMING
inline constexpr unsigned kMemHostAllocPortable = 0x1;   // CU_MEMHOSTALLOC_PORTABLE
inline constexpr int kMemAllocationTypePinned = 1;       // CU_MEM_ALLOCATION_TYPE_PINNED
inline constexpr int kMemHandleTypePosixFd = 1;          // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
inline constexpr int kMemLocationTypeDevice = 1;         // CU_MEM_LOCATION_TYPE_DEVICE
inline constexpr int kMemAccessReadWrite = 3;            // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
inline constexpr int kMemGranularityRecommended = 1;     // CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
inline constexpr unsigned kEventInterprocess = 0x4;      // CU_EVENT_INTERPROCESS (with CU_EVENT_DISABLE_TIMING)
inline constexpr unsigned kIpcLazyPeerAccess = 0x1;      // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
inline constexpr unsigned kStreamNonBlocking = 0x1;      // CU_STREAM_NON_BLOCKING
inline constexpr int kPointerAttrLegacyIpcCapable = 10;  // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
inline constexpr int kPointerAttrAllowedHandleTypes = 14;  // CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES
inline constexpr int kPointerAttrMempoolHandle = 17;     // CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE
inline constexpr int kPointerAttrMappingSize = 18;       // CU_POINTER_ATTRIBUTE_MAPPING_SIZE
inline constexpr int kPointerAttrMappingBase = 19;       // CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR

/// CUipcMemHandle / CUipcEventHandle (CU_IPC_HANDLE_SIZE = 64 bytes, passed by value) and CUuuid.
struct IpcHandle {
  unsigned char bytes[64];
};
struct Uuid {
  unsigned char bytes[16];
};

// CUmemLocation, CUmemAllocationProp, CUmemAccessDesc (driver API reference, "Virtual Memory Management").
struct MemLocation {
  int type;
  int id;
};
struct MemAllocationProp {
  int type;
  int requested_handle_types;
  MemLocation location;
  void* win32_handle_metadata;
  unsigned char compression_type;
  unsigned char gpu_direct_rdma_capable;
  unsigned short usage;
  unsigned char reserved[4];
};
struct MemAccessDesc {
  MemLocation location;
  int flags;
};

/// Every entry point tensorwire uses. A null optional one means "this driver lacks it"; the required ones are
/// never null in a loaded table.
struct Api {
  // required
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxSynchronize)() = nullptr;
  CUresult (*cuPointerGetAttribute)(void*, int, CUdeviceptr) = nullptr;
  CUresult (*cuMemGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuEventQuery)(CUevent) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  CUresult (*cuEventDestroy)(CUevent) = nullptr;
  CUresult (*cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*cuMemFreeHost)(void*) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
  CUresult (*cuMemGetInfo)(size_t*, size_t*) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**) = nullptr;
  // optional
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuThreadExchangeStreamCaptureMode)(int*) = nullptr;  // (CUstreamCaptureMode*)
  CUresult (*cuModuleUnload)(CUmodule) = nullptr;
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*) = nullptr;
  CUresult (*cuStreamGetFlags)(CUstream, unsigned*) = nullptr;
  CUresult (*cuMemGetAllocationGranularity)(size_t*, const MemAllocationProp*, int) = nullptr;
  CUresult (*cuMemCreate)(CUmemHandle*, size_t, const MemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*cuMemRelease)(CUmemHandle) = nullptr;
  CUresult (*cuMemAddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t) = nullptr;
  CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemHandle, unsigned long long) = nullptr;
  CUresult (*cuMemUnmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const MemAccessDesc*, size_t) = nullptr;
  CUresult (*cuMemExportToShareableHandle)(void*, CUmemHandle, int, unsigned long long) = nullptr;
  // optional: between processes
  CUresult (*cuMemImportFromShareableHandle)(CUmemHandle*, void*, int) = nullptr;
  CUresult (*cuMemRetainAllocationHandle)(CUmemHandle*, void*) = nullptr;
  CUresult (*cuIpcGetMemHandle)(IpcHandle*, CUdeviceptr) = nullptr;
  CUresult (*cuIpcOpenMemHandle)(CUdeviceptr*, IpcHandle, unsigned) = nullptr;  // _v2 at the 12.0 ABI
  CUresult (*cuIpcCloseMemHandle)(CUdeviceptr) = nullptr;
  CUresult (*cuIpcGetEventHandle)(IpcHandle*, CUevent) = nullptr;
  CUresult (*cuIpcOpenEventHandle)(CUevent*, IpcHandle) = nullptr;
  CUresult (*cuDeviceGetUuid)(Uuid*, CUdevice) = nullptr;  // _v2 at the 12.0 ABI
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
};

/// The loaded driver: its table, or why there is none.
struct Driver {
  Api api{};
  std::string status;  ///< "" when usable
  int version = 0;     ///< cuDriverGetVersion
  int devices = 0;     ///< cuDeviceGetCount
  bool fake = false;   ///< installed by a test
};

/// The driver (loaded once on first use), or the fake a test installed.
const Driver& driver() noexcept;
/// Whether this process is a fork()ed child of one that had loaded the driver (real or fake): CUDA is then
/// unusable here, driver() says why, and what would take a lock the parent's threads may have held returns first.
bool forked_child() noexcept;
/// The table when the driver is usable; otherwise throws Error(device_unavailable) "<what>: <status>".
const Api& api(const char* what);
/// Throws Error naming `call` and the driver's name for `r` when r != success (out_of_memory for
/// CUDA_ERROR_OUT_OF_MEMORY, device_unavailable for a lost or missing device, else invalid_argument).
void check(CUresult r, const char* call);
/// "CUDA_ERROR_OUT_OF_MEMORY (2)" or "CUresult 2".
std::string result_name(CUresult r);

/// Throws Error(device_unavailable / invalid_argument) unless `d` is a CUDA device this process has.
void check_device(Device d, const char* what);

/// This thread's stream-capture mode set to relaxed for the guard's life (restored after), where the driver has
/// cuThreadExchangeStreamCaptureMode. Around tensorwire's own driver calls that belong to no caller's stream
/// (allocating and mapping pool memory, waiting for events before memory is reused or released): under a CUDA
/// graph capture in the default global mode on any thread (torch.cuda.graph's), such "potentially unsafe" calls
/// fail and invalidate the capture; PyTorch's caching allocator relaxes the mode around its allocations the same
/// way. Work on a capturing stream is still captured (or refused) as the driver decides.
class RelaxedCapture {
 public:
  RelaxedCapture() noexcept;
  ~RelaxedCapture();
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  int prev_ = 0;
  bool exchanged_ = false;
};

/// Makes cuda:`device`'s primary context current on this thread for the guard's life (restoring the previous
/// one), so driver calls land on the right device whatever the caller's thread had current.
class ContextGuard {
 public:
  explicit ContextGuard(int device);
  ~ContextGuard();
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;
  CUcontext context() const noexcept { return ctx_; }

 private:
  CUcontext ctx_ = nullptr;
  CUcontext prev_ = nullptr;
  bool switched_ = false;
};

/// An event call (query, synchronize, destroy) made where no context may be current, as on a thread that never
/// touched CUDA: the driver's reference lists CUDA_ERROR_INVALID_CONTEXT among their results, so one refused for
/// that reason is made again with cuda:`device`'s primary context current. Never throws.
template <class F>
CUresult with_context(int device, F&& call) noexcept {
  const CUresult r = call();
  if (r != kErrorInvalidContext) return r;
  try {
    ContextGuard g(device);
    return call();
  } catch (...) {
    return r;
  }
}

/// The primary context of cuda:`device` (retained once per process, never released: PyTorch and CuPy share it).
CUcontext primary_context(int device);
/// The primary context of the lowest-numbered device tensorwire has used so far (retained), or null: never creates
/// one.
CUcontext first_retained_context() noexcept;
/// The devices whose primary context tensorwire has retained, lowest first (empty before any use).
std::vector<int> retained_devices() noexcept;
/// Where work that any context can do goes (portable pinned memory, a thread with no context current): the
/// lowest-numbered device already in use, else 0. A process that only uses cuda:1 never gets a context on cuda:0
/// (memory there, and a failure where cuda:0 is prohibited or exclusive to another process).
int default_device() noexcept;

/// Throws Error(invalid_argument) when `stream` (a handle; 1 and 2 are the per-context defaults, always fine)
/// belongs to a context other than cuda:`device`'s primary context.
void check_stream(int device, intptr_t stream, const char* what);

inline CUstream as_stream(intptr_t s) noexcept { return reinterpret_cast<CUstream>(s); }

/// Installs a fake driver (tests only): `api` must outlive its use; `devices` devices, driver version `version`.
/// Resets the pools and the kernel module. nullptr restores the real driver.
void install_fake_driver(const Api* api, int devices, int version);

/// Registry of per-driver state to reset when a fake driver is installed (pools, modules).
void register_reset(void (*fn)());

}  // namespace tw::cuda::detail
