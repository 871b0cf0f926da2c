// The CUDA driver API, resolved at run time (dlopen + cuGetProcAddress) so tensorwire loads on machines without one.
#include "cuda/driver.hpp"

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <vector>

#include "tensorwire/cuda.hpp"
#include "tensorwire/device_runtime.hpp"
#include "tensorwire/error.hpp"

namespace tw::cuda {
namespace detail {
namespace {

// cuGetProcAddress (CUDA 11.3+, 4 arguments) and cuGetProcAddress_v2 (CUDA 12.0+, with a symbol status).
using GetProc1 = CUresult (*)(const char*, void**, int, unsigned long long);
using GetProc2 = CUresult (*)(const char*, void**, int, unsigned long long, int*);

template <class F>
void resolve(void* lib, GetProc1 gp1, GetProc2 gp2, const char* name, F& out) {
  void* p = nullptr;
  if (gp2) {
    int status = 0;
    if (gp2(name, &p, kApiVersion, 0, &status) != kSuccess || status != 0) p = nullptr;
  } else if (gp1) {
    if (gp1(name, &p, kApiVersion, 0) != kSuccess) p = nullptr;
  } else {
    (void)lib;
  }
  out = reinterpret_cast<F>(p);
}

Driver load_real() {
  Driver d;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    d.status = "no NVIDIA driver (libcuda.so.1 could not be loaded)";
    return d;
  }
  auto gp2 = reinterpret_cast<GetProc2>(dlsym(lib, "cuGetProcAddress_v2"));
  auto gp1 = reinterpret_cast<GetProc1>(dlsym(lib, "cuGetProcAddress"));
  if (!gp1 && !gp2) {
    d.status = "the NVIDIA driver is too old (libcuda.so.1 has no cuGetProcAddress; CUDA 12 or newer is needed)";
    return d;
  }
  Api& a = d.api;
#define TW_RESOLVE(f) resolve(lib, gp1, gp2, #f, a.f)
  TW_RESOLVE(cuInit);
  TW_RESOLVE(cuDriverGetVersion);
  TW_RESOLVE(cuDeviceGetCount);
  TW_RESOLVE(cuDeviceGet);
  TW_RESOLVE(cuDeviceGetAttribute);
  TW_RESOLVE(cuDevicePrimaryCtxRetain);
  TW_RESOLVE(cuCtxGetCurrent);
  TW_RESOLVE(cuCtxSetCurrent);
  TW_RESOLVE(cuCtxSynchronize);
  TW_RESOLVE(cuPointerGetAttribute);
  TW_RESOLVE(cuMemGetAddressRange);
  TW_RESOLVE(cuStreamSynchronize);
  TW_RESOLVE(cuStreamWaitEvent);
  TW_RESOLVE(cuEventCreate);
  TW_RESOLVE(cuEventRecord);
  TW_RESOLVE(cuEventQuery);
  TW_RESOLVE(cuEventSynchronize);
  TW_RESOLVE(cuEventDestroy);
  TW_RESOLVE(cuMemcpyAsync);
  TW_RESOLVE(cuMemsetD8Async);
  TW_RESOLVE(cuMemHostAlloc);
  TW_RESOLVE(cuMemFreeHost);
  TW_RESOLVE(cuMemAlloc);
  TW_RESOLVE(cuMemFree);
  TW_RESOLVE(cuMemGetInfo);
  TW_RESOLVE(cuModuleLoadData);
  TW_RESOLVE(cuModuleGetFunction);
  TW_RESOLVE(cuLaunchKernel);
  TW_RESOLVE(cuGetErrorName);
  TW_RESOLVE(cuThreadExchangeStreamCaptureMode);
  TW_RESOLVE(cuModuleUnload);
  TW_RESOLVE(cuStreamGetCtx);
  TW_RESOLVE(cuStreamGetFlags);
  TW_RESOLVE(cuMemGetAllocationGranularity);
  TW_RESOLVE(cuMemCreate);
  TW_RESOLVE(cuMemRelease);
  TW_RESOLVE(cuMemAddressReserve);
  TW_RESOLVE(cuMemAddressFree);
  TW_RESOLVE(cuMemMap);
  TW_RESOLVE(cuMemUnmap);
  TW_RESOLVE(cuMemSetAccess);
  TW_RESOLVE(cuMemExportToShareableHandle);
  TW_RESOLVE(cuMemImportFromShareableHandle);
  TW_RESOLVE(cuMemRetainAllocationHandle);
  TW_RESOLVE(cuIpcGetMemHandle);
  TW_RESOLVE(cuIpcOpenMemHandle);
  TW_RESOLVE(cuIpcCloseMemHandle);
  TW_RESOLVE(cuIpcGetEventHandle);
  TW_RESOLVE(cuIpcOpenEventHandle);
  TW_RESOLVE(cuDeviceGetUuid);
  TW_RESOLVE(cuStreamCreate);
#undef TW_RESOLVE
  const std::pair<const char*, const void*> required[] = {
      {"cuInit", reinterpret_cast<const void*>(a.cuInit)},
      {"cuDriverGetVersion", reinterpret_cast<const void*>(a.cuDriverGetVersion)},
      {"cuDeviceGetCount", reinterpret_cast<const void*>(a.cuDeviceGetCount)},
      {"cuDeviceGet", reinterpret_cast<const void*>(a.cuDeviceGet)},
      {"cuDeviceGetAttribute", reinterpret_cast<const void*>(a.cuDeviceGetAttribute)},
      {"cuDevicePrimaryCtxRetain", reinterpret_cast<const void*>(a.cuDevicePrimaryCtxRetain)},
      {"cuCtxGetCurrent", reinterpret_cast<const void*>(a.cuCtxGetCurrent)},
      {"cuCtxSetCurrent", reinterpret_cast<const void*>(a.cuCtxSetCurrent)},
      {"cuCtxSynchronize", reinterpret_cast<const void*>(a.cuCtxSynchronize)},
      {"cuPointerGetAttribute", reinterpret_cast<const void*>(a.cuPointerGetAttribute)},
      {"cuMemGetAddressRange", reinterpret_cast<const void*>(a.cuMemGetAddressRange)},
      {"cuStreamSynchronize", reinterpret_cast<const void*>(a.cuStreamSynchronize)},
      {"cuStreamWaitEvent", reinterpret_cast<const void*>(a.cuStreamWaitEvent)},
      {"cuEventCreate", reinterpret_cast<const void*>(a.cuEventCreate)},
      {"cuEventRecord", reinterpret_cast<const void*>(a.cuEventRecord)},
      {"cuEventQuery", reinterpret_cast<const void*>(a.cuEventQuery)},
      {"cuEventSynchronize", reinterpret_cast<const void*>(a.cuEventSynchronize)},
      {"cuEventDestroy", reinterpret_cast<const void*>(a.cuEventDestroy)},
      {"cuMemcpyAsync", reinterpret_cast<const void*>(a.cuMemcpyAsync)},
      {"cuMemsetD8Async", reinterpret_cast<const void*>(a.cuMemsetD8Async)},
      {"cuMemHostAlloc", reinterpret_cast<const void*>(a.cuMemHostAlloc)},
      {"cuMemFreeHost", reinterpret_cast<const void*>(a.cuMemFreeHost)},
      {"cuMemAlloc", reinterpret_cast<const void*>(a.cuMemAlloc)},
      {"cuMemFree", reinterpret_cast<const void*>(a.cuMemFree)},
      {"cuMemGetInfo", reinterpret_cast<const void*>(a.cuMemGetInfo)},
      {"cuModuleLoadData", reinterpret_cast<const void*>(a.cuModuleLoadData)},
      {"cuModuleGetFunction", reinterpret_cast<const void*>(a.cuModuleGetFunction)},
      {"cuLaunchKernel", reinterpret_cast<const void*>(a.cuLaunchKernel)},
  };
  for (const auto& [name, fn] : required)
    if (!fn) {
      d.status = std::string("the NVIDIA driver lacks ") + name + " at the CUDA 12.0 ABI (CUDA 12 or newer is needed)";
      return d;
    }
  if (CUresult r = a.cuInit(0); r != kSuccess) {
    d.status = "cuInit failed: " + [&] {
      const char* n = nullptr;
      if (a.cuGetErrorName && a.cuGetErrorName(r, &n) == kSuccess && n) return std::string(n) + " (" + std::to_string(r) + ")";
      return "CUresult " + std::to_string(r);
    }();
    if (r == 100) d.status += ": no CUDA-capable device is visible";
    return d;
  }
  a.cuDriverGetVersion(&d.version);
  if (a.cuDeviceGetCount(&d.devices) != kSuccess || d.devices <= 0) {
    d.devices = 0;
    d.status = "the NVIDIA driver sees no CUDA device";
  }
  return d;
}

std::atomic<const Driver*> g_fake{nullptr};
Driver g_fake_driver;
std::mutex g_reset_mu;
std::vector<void (*)()>& resets() {
  static std::vector<void (*)()> v;
  return v;
}

// Primary contexts by device ordinal, retained on first use.
std::mutex g_ctx_mu;
std::vector<CUcontext>& g_ctx = *new std::vector<CUcontext>();  // never destroyed (see driver())

void reset_contexts() {
  std::lock_guard lk(g_ctx_mu);
  g_ctx.clear();
}

// A fork()ed child of a process that initialised CUDA cannot use it (every driver call fails there), and the
// parent's other threads may have held tensorwire's locks at the moment of the fork. Once a driver is loaded, a
// child is told so: driver() answers with a driver whose status says why (its entry points are the parent's, so
// a call that ignores the status gets the driver's own error, never a null pointer), and the pools' entry points
// return before taking a lock.
std::atomic<bool> g_forked{false};
std::atomic<const Driver*> g_parent{nullptr};  // the driver the child's parent had loaded

void watch_fork(const Driver* d) noexcept {
  g_parent.store(d, std::memory_order_release);
  static const bool once = (::pthread_atfork(nullptr, nullptr, [] { g_forked.store(true); }), true);
  (void)once;
}

const Driver& forked_driver() noexcept {
  static const Driver& d = *new Driver([] {
    const Driver* parent = g_parent.load(std::memory_order_acquire);
    Driver f = parent ? *parent : Driver{};
    f.status = "CUDA was initialised in this process's parent before fork(), and a fork()ed child cannot use it "
               "(start processes with the 'spawn' or 'forkserver' method, or fork before the parent uses CUDA)";
    f.devices = 0;
    return f;
  }());
  return d;
}

}  // namespace

bool forked_child() noexcept { return g_forked.load(std::memory_order_relaxed); }

const Driver& driver() noexcept {
  if (forked_child()) return forked_driver();
  if (const Driver* f = g_fake.load(std::memory_order_acquire)) return *f;
  // Never destroyed: pool blocks may come back while the process exits.
  static const Driver& real = *new Driver([] {
    try {
      return load_real();
    } catch (...) {
      Driver d;
      d.status = "loading the NVIDIA driver failed";
      return d;
    }
  }());
  if (real.status.empty() && !g_parent.load(std::memory_order_relaxed)) watch_fork(&real);
  return real;
}

const Api& api(const char* what) {
  const Driver& d = driver();
  if (!d.status.empty()) throw Error(ErrorCode::device_unavailable, std::string(what) + ": CUDA is unavailable: " + d.status);
  return d.api;
}

std::string result_name(CUresult r) {
  const Driver& d = driver();
  const char* n = nullptr;
  if (d.status.empty() && d.api.cuGetErrorName && d.api.cuGetErrorName(r, &n) == kSuccess && n)
    return std::string(n) + " (" + std::to_string(r) + ")";
  return "CUresult " + std::to_string(r);
}

void check(CUresult r, const char* call) {
  if (r == kSuccess) return;
  ErrorCode code = ErrorCode::invalid_argument;
  if (r == kErrorOutOfMemory) code = ErrorCode::out_of_memory;
  // CUDA_ERROR_NO_DEVICE 100, INVALID_DEVICE 101, DEVICE_UNAVAILABLE 46, NOT_INITIALIZED 3, DEINITIALIZED 4
  if (r == 100 || r == 101 || r == 46 || r == 3 || r == 4) code = ErrorCode::device_unavailable;
  throw Error(code, std::string(call) + " failed: " + result_name(r));
}

void check_device(Device d, const char* what) {
  if (d.type != kDLCUDA && d.type != kDLCUDAManaged)
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": " + d.str() + " is not a CUDA device");
  const Driver& drv = driver();
  if (!drv.status.empty())
    throw Error(ErrorCode::device_unavailable, std::string(what) + ": CUDA is unavailable: " + drv.status);
  if (d.id < 0 || d.id >= drv.devices)
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": " + d.str() + " does not exist (this process sees " +
                                                 std::to_string(drv.devices) + " CUDA device" +
                                                 (drv.devices == 1 ? "" : "s") + ")");
}

CUcontext first_retained_context() noexcept {
  if (forked_child()) return nullptr;  // (the parent's contexts; its lock may be held forever)
  std::lock_guard lk(g_ctx_mu);
  for (CUcontext c : g_ctx)
    if (c) return c;
  return nullptr;
}

std::vector<int> retained_devices() noexcept {
  std::vector<int> out;
  if (forked_child()) return out;
  try {
    std::lock_guard lk(g_ctx_mu);
    for (size_t i = 0; i < g_ctx.size(); ++i)
      if (g_ctx[i]) out.push_back(static_cast<int>(i));
  } catch (...) {  // (out of memory: none)
  }
  return out;
}

int default_device() noexcept {
  if (forked_child()) return 0;
  std::lock_guard lk(g_ctx_mu);
  for (size_t i = 0; i < g_ctx.size(); ++i)
    if (g_ctx[i]) return static_cast<int>(i);
  return 0;
}

CUcontext primary_context(int device) {
  const Api& a = api("CUDA context");
  std::lock_guard lk(g_ctx_mu);
  if (g_ctx.size() <= static_cast<size_t>(device)) g_ctx.resize(static_cast<size_t>(device) + 1, nullptr);
  CUcontext& c = g_ctx[static_cast<size_t>(device)];
  if (!c) {
    CUdevice dev = 0;
    check(a.cuDeviceGet(&dev, device), "cuDeviceGet");
    check(a.cuDevicePrimaryCtxRetain(&c, dev), "cuDevicePrimaryCtxRetain");
  }
  return c;
}

RelaxedCapture::RelaxedCapture() noexcept {
  const Driver& d = driver();
  if (!d.status.empty() || !d.api.cuThreadExchangeStreamCaptureMode) return;
  int mode = 2;  // CU_STREAM_CAPTURE_MODE_RELAXED (cuda.h's CUstreamCaptureMode)
  if (d.api.cuThreadExchangeStreamCaptureMode(&mode) == kSuccess) {
    prev_ = mode;
    exchanged_ = true;
  }
}

RelaxedCapture::~RelaxedCapture() {
  if (!exchanged_) return;
  int mode = prev_;
  driver().api.cuThreadExchangeStreamCaptureMode(&mode);
}

ContextGuard::ContextGuard(int device) {
  const Api& a = api("CUDA context");
  ctx_ = primary_context(device);
  check(a.cuCtxGetCurrent(&prev_), "cuCtxGetCurrent");
  if (prev_ != ctx_) {
    check(a.cuCtxSetCurrent(ctx_), "cuCtxSetCurrent");
    switched_ = true;
  }
}

ContextGuard::~ContextGuard() {
  if (switched_) driver().api.cuCtxSetCurrent(prev_);
}

void check_stream(int device, intptr_t stream, const char* what) {
  if (stream == kLegacyStream || stream == kPerThreadStream) return;
  if (stream == 0)
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + ": stream 0 is ambiguous (legacy or per-thread default); pass 1 for the legacy "
                                    "default stream, 2 for the per-thread one, or a stream handle");
  if (stream < 0) throw Error(ErrorCode::invalid_argument, std::string(what) + ": " + std::to_string(stream) + " is not a stream");
  if (stream < 4096)  // (a handle is the address of the driver's object, never in the first page; see policy.cpp)
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": " + std::to_string(stream) +
                                                 " is neither 1 (legacy default), 2 (per-thread default) nor a stream "
                                                 "handle");
  const Api& a = api(what);
  if (!a.cuStreamGetCtx) return;  // cannot tell: the driver will refuse a foreign stream itself
  CUcontext c = nullptr;
  if (CUresult r = a.cuStreamGetCtx(as_stream(stream), &c); r != kSuccess)
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + ": " + std::to_string(stream) + " is not a valid CUDA stream (" + result_name(r) + ")");
  if (c != primary_context(device))
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": stream " + std::to_string(stream) +
                                                 " belongs to another device (or a context other than cuda:" +
                                                 std::to_string(device) + "'s primary context)");
}

void register_reset(void (*fn)()) {
  std::lock_guard lk(g_reset_mu);
  resets().push_back(fn);
}

void install_fake_driver(const Api* a, int devices, int version) {
  {
    std::lock_guard lk(g_reset_mu);
    for (auto fn : resets()) fn();
  }
  reset_contexts();
  if (!a) {
    g_fake.store(nullptr, std::memory_order_release);
    return;
  }
  g_fake_driver = Driver{};
  g_fake_driver.api = *a;
  g_fake_driver.devices = devices;
  g_fake_driver.version = version;
  g_fake_driver.fake = true;
  if (devices <= 0) g_fake_driver.status = "the fake driver has no device";
  g_fake.store(&g_fake_driver, std::memory_order_release);
  if (g_fake_driver.status.empty()) watch_fork(&g_fake_driver);
}

}  // namespace detail

using detail::driver;

bool driver_available() noexcept { return driver().status.empty(); }
std::string driver_status() { return driver().status; }
bool is_available() noexcept { return driver().status.empty() && driver().devices > 0; }
int device_count() noexcept { return driver().status.empty() ? driver().devices : 0; }
int driver_version() noexcept { return driver().version; }

std::string status() {
  const detail::Driver& d = driver();
  if (!d.status.empty()) return d.status;
  std::string s = std::to_string(d.devices) + " CUDA device" + (d.devices == 1 ? "" : "s") + ", driver " +
                  std::to_string(d.version / 1000) + "." + std::to_string(d.version % 1000 / 10);
  if (d.fake) s += " (a test's fake driver)";
  return s;
}

std::optional<int> device_of_pointer(uintptr_t ptr) noexcept {
  if (!driver_available()) return std::nullopt;
  int ordinal = -1;
  // (With unified addressing any context answers for any pointer; a thread with none current borrows one.)
  detail::CUresult r = detail::with_context(detail::default_device(), [&] {
    return driver().api.cuPointerGetAttribute(&ordinal, detail::kPointerAttrDeviceOrdinal, ptr);
  });
  if (r != 0 || ordinal < 0) return std::nullopt;
  return ordinal;
}

namespace {
// Makes current, for one call, the context a stream lives in: a stream handle's own (the driver says which), else
// the primary context of `device` for the default streams 1 and 2; with no device either, the calling thread's
// current context, or default_device()'s on a thread that never touched CUDA (so the call does not fail with
// INVALID_CONTEXT). An event is made in the current context and must be recorded on a stream of that same context.
class StreamContext {
 public:
  StreamContext(intptr_t stream, int device) {
    if (stream <= 0 || (stream > kPerThreadStream && stream < 4096))  // (never a handle: see check_stream)
      throw Error(ErrorCode::invalid_argument, std::to_string(stream) + " is neither 1 (legacy default), 2 "
                                                                       "(per-thread default) nor a stream handle");
    const detail::Api& a = driver().api;
    detail::CUcontext want = nullptr;
    if (stream != kLegacyStream && stream != kPerThreadStream && a.cuStreamGetCtx) {
      detail::CUcontext c = nullptr;
      if (a.cuStreamGetCtx(detail::as_stream(stream), &c) == 0) want = c;  // else the call itself will say why
    }
    if (!want && device >= 0) {
      detail::check_device(Device::cuda(device), "a CUDA stream's device");
      want = detail::primary_context(device);
    }
    if (a.cuCtxGetCurrent(&prev_) != 0) return;  // cannot tell what to restore: the call goes as it is
    if (!want) {
      if (prev_) return;
      want = detail::primary_context(detail::default_device());
    }
    if (want != prev_) {
      detail::check(a.cuCtxSetCurrent(want), "cuCtxSetCurrent");
      switched_ = true;
    }
  }
  ~StreamContext() {
    if (switched_) driver().api.cuCtxSetCurrent(prev_);
  }
  StreamContext(const StreamContext&) = delete;
  StreamContext& operator=(const StreamContext&) = delete;

 private:
  detail::CUcontext prev_ = nullptr;
  bool switched_ = false;
};

// Events are destroyed and waited for in any context; a thread with none current gets default_device()'s.
struct AnyContext {
  std::optional<detail::ContextGuard> guard;
  AnyContext() {
    detail::CUcontext c = nullptr;
    if (driver().api.cuCtxGetCurrent(&c) != 0 || !c) guard.emplace(detail::default_device());
  }
};
}  // namespace

void synchronize_stream(intptr_t stream, int device) {
  const detail::Api& a = detail::api("synchronize a CUDA stream");
  StreamContext ctx(stream, device);
  if (detail::CUresult r = a.cuStreamSynchronize(detail::as_stream(stream)); r != 0)
    throw Error(ErrorCode::invalid_argument,
                "cuStreamSynchronize(" + std::to_string(stream) + ") failed: " + detail::result_name(r));
}

void* record_event(intptr_t stream, int device) {
  const detail::Api& a = detail::api("record a CUDA event");
  StreamContext ctx(stream, device);
  void* ev = nullptr;
  detail::check(a.cuEventCreate(&ev, detail::kEventDisableTiming), "cuEventCreate");
  if (detail::CUresult r = a.cuEventRecord(ev, detail::as_stream(stream)); r != 0) {
    a.cuEventDestroy(ev);
    throw Error(ErrorCode::invalid_argument,
                "cuEventRecord on stream " + std::to_string(stream) + " failed: " + detail::result_name(r));
  }
  return ev;
}

void destroy_event(void* event) noexcept {
  if (!event || !driver_available()) return;
  try {
    AnyContext ctx;
    driver().api.cuEventDestroy(event);
  } catch (...) {
  }
}

void synchronize_event(void* event) {
  const detail::RelaxedCapture relaxed;  // (a host wait for tensorwire's own bookkeeping, on no caller's stream)
  const detail::Api& a = detail::api("wait for a CUDA event");
  AnyContext ctx;
  detail::check(a.cuEventSynchronize(event), "cuEventSynchronize");
}

}  // namespace tw::cuda
