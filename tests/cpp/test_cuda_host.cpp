// The CUDA layer's host-side logic, on machines without a GPU: a fake driver table models device memory with host
// memory and runs a host reference of each kernel from the very parameter blocks the real launch would pass, so
// pool bookkeeping, stream rules, copy planning and the kernels' parameters are tested everywhere. The GPU suite
// (test_cuda_gpu.cpp, `make test-gpu`) runs the same paths on a real device.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <optional>
#include <string>
#include <thread>

#include "copy/plan.hpp"
#include "cuda/copy.hpp"
#include "cuda/driver.hpp"
#include "cuda/ipc.hpp"
#include "cuda/kernel_abi.h"
#include "cuda/pool.hpp"
#include "cuda_kernels_emu.hpp"
#include "tensorwire/arrow.hpp"
#include "tensorwire/copy.hpp"
#include "tensorwire/cuda.hpp"
#include "ipc/ipc_internal.hpp"
#include "ipc/pool_internal.hpp"
#include "net/net_internal.hpp"
#if __has_include(<ucp/api/ucp.h>)
#include "net/engine.hpp"
#endif
#include "tensorwire/device_runtime.hpp"
#include "tensorwire/interop.hpp"
#include "tensorwire/ipc.hpp"
#include "tensorwire/tensor.hpp"
#include "tw_test_util.hpp"

namespace {

namespace d = tw::cuda::detail;
using tw::Device;
using tw::DType;
using tw::ErrorCode;
using tw::Tensor;

// ---- the fake driver ---------------------------------------------------------------------------------------------
struct Fake {
  std::mutex mu;
  std::map<uintptr_t, size_t> device_mem;  // live device allocations (reserve or cuMemAlloc)
  std::map<uintptr_t, size_t> host_mem;    // live pinned allocations
  std::set<uintptr_t> events;
  int handles = 0;          // live VMM handles
  std::atomic<int> retained[4] = {};  // cuDevicePrimaryCtxRetain calls per device
  std::atomic<bool> hold_create{false}, in_create{false};  // cuMemCreate waits while hold_create
  std::atomic<int> no_context_refusals{0};  // event calls refused for want of a current context
  bool rdma_supported = false;  // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
  int rdma_segments = 0;        // cuMemCreate calls that asked for gpuDirectRDMACapable
  int stream_waits = 0;     // cuStreamWaitEvent calls
  int launches_strided = 0;
  int launches_transpose = 0;
  std::atomic<int> launches_emulated{0};  // of those, how many ran kernels.cu's own code
  int memcpys = 0;
  std::atomic<int> syncs{0};  // (the net thread synchronizes too: allocate_idle)
  std::atomic<bool> events_done{true};  // false: every event reports CUDA_ERROR_NOT_READY (queued work pending)
  std::atomic<bool> work_running{false};  // true: cuEventSynchronize and cuCtxSynchronize block until it turns false
  std::atomic<int> event_syncs{0}, ctx_syncs{0};
  std::atomic<bool> work_fails{false};  // true: cuEventSynchronize reports that the work failed
  std::mutex streams_mu;
  std::multiset<uintptr_t> recorded_on;  // the streams events were recorded on
  std::set<std::string> names;
  std::string missing_kernel;       // cuModuleGetFunction of this name is CUDA_ERROR_NOT_FOUND
  std::atomic<int> modules_loaded{0};  // cuModuleLoadData minus cuModuleUnload
  int ctx[4] = {};
  int foreign_ctx = 0;
  // VMM, modelled with memfds so that an exported fd imported and mapped again aliases the same bytes.
  std::map<d::CUmemHandle, std::pair<int, size_t>> vmm;  // handle -> (memfd, size)
  std::map<uintptr_t, d::CUmemHandle> mapped;             // VA -> handle mapped there
  d::CUmemHandle next_handle = 0;
  std::map<uintptr_t, size_t> plain;  // cuMemAlloc allocations (legacy IPC)
  std::atomic<int> ipc_opens{0};      // cuIpcOpenMemHandle minus cuIpcCloseMemHandle
  int ipc_event_opens = 0;
  std::atomic<int> ipc_open_tries{0}, ipc_event_open_tries{0};  // calls, refused ones included
  int records = 0;                    // cuEventRecord calls
  // Allocations and host waits made while their thread's capture mode was not relaxed: under a global-mode graph
  // capture on any thread, a real driver refuses them and invalidates the capture.
  std::atomic<int> unsafe_unrelaxed{0};
  int stream_creates = 0;
  std::deque<int> created_streams;    // each created stream is the address of one entry: the context it was made in
  std::vector<int> synced_in;         // the context of each stream cuStreamSynchronize waited for
  std::vector<uintptr_t> synced_streams;  // each stream cuStreamSynchronize waited for (under streams_mu)
  std::set<uintptr_t> dead_streams;   // destroyed by their owner: every call naming one is CUDA_ERROR_INVALID_HANDLE
  std::atomic<int> dead_stream_uses{0};  // calls that named one (UB on a real driver, which may reuse the handle)
  std::set<uintptr_t> nonblocking_streams;  // made with CU_STREAM_NON_BLOCKING (every other handle is blocking)
  std::set<uintptr_t> pending_events;  // cuEventQuery says CUDA_ERROR_NOT_READY for these (their work still runs)
  std::map<uintptr_t, uintptr_t> event_stream;             // event -> the stream it was last recorded on
  std::vector<std::pair<uintptr_t, uintptr_t>> waited;     // (stream, event) of each cuStreamWaitEvent
  std::vector<std::pair<uintptr_t, uintptr_t>> waited_for;  // (stream, the stream its event was recorded on)
  size_t device_limit = 0;            // when not 0: cuMemCreate beyond this many live VMM bytes is out of memory
  size_t host_limit = 0;              // the same for cuMemHostAlloc
  // As the real driver: an IPC memory or event handle does not open in the process that exported it (201,
  // CUDA_ERROR_INVALID_CONTEXT). Off by default: the other tests play two processes in one.
  bool one_process = false;
  size_t vmm_bytes() const {
    size_t n = 0;
    for (const auto& [h, v] : vmm) n += v.second;
    return n;
  }
  size_t host_bytes() const {
    size_t n = 0;
    for (const auto& [p, sz] : host_mem) n += sz;
    return n;
  }
};
Fake* g_fake = nullptr;
thread_local d::CUcontext t_current = nullptr;
thread_local int t_capture_mode = 0;  // CU_STREAM_CAPTURE_MODE_GLOBAL, each thread's default
d::CUresult no_context() {
  ++g_fake->no_context_refusals;
  return d::kErrorInvalidContext;
}
constexpr intptr_t kForeignStream = 0x7777;  // a stream of another context
constexpr intptr_t kBadStream = 0x6666;      // not a stream at all
constexpr int kForeignCtx = 99;

// Which context `c` is: 0..3 the devices' primary ones, kForeignCtx another's, -1 none.
int ctx_index(d::CUcontext c) {
  for (int i = 0; i < 4; ++i)
    if (c == &g_fake->ctx[i]) return i;
  return c == &g_fake->foreign_ctx ? kForeignCtx : -1;
}
// The context of a stream the fake made (cuStreamCreate, in the context current then), or -1.
int created_stream_ctx(intptr_t v) {
  std::lock_guard lk(g_fake->streams_mu);
  for (const int& c : g_fake->created_streams)
    if (reinterpret_cast<intptr_t>(&c) == v) return c;
  return -1;
}
// The context a stream belongs to: the default streams 1 and 2 are the current context's; kForeignStream is
// another context's; a stream the fake made, the one it was made in; every other handle (a test's) is cuda:0's
// (as the fake cuStreamGetCtx says).
int stream_ctx(d::CUstream s) {
  const auto v = reinterpret_cast<intptr_t>(s);
  if (v == tw::cuda::kLegacyStream || v == tw::cuda::kPerThreadStream) return ctx_index(t_current);
  if (v == kForeignStream) return kForeignCtx;
  const int c = created_stream_ctx(v);
  return c >= 0 ? c : 0;
}

void* aligned(size_t n) {
  void* p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  std::memset(p, 0xAB, n);  // fresh device memory is not zero: tests must not depend on it
  return p;
}

void run_strided(const tw_cuda_strided_params& p, size_t unit) {
  for (int64_t i = 0; i < p.numel; ++i) {
    int64_t rem = i, so = 0, doff = 0;
    for (int k = p.ndim - 1; k >= 0; --k) {
      const int64_t idx = rem % p.shape[k];
      rem /= p.shape[k];
      so += idx * p.src_stride[k];
      doff += idx * p.dst_stride[k];
    }
    std::memcpy(reinterpret_cast<char*>(p.dst) + doff * static_cast<int64_t>(unit),
                reinterpret_cast<const char*>(p.src) + so * static_cast<int64_t>(unit), unit);
  }
}

void run_transpose(const tw_cuda_transpose_params& p, size_t unit) {
  const auto u = static_cast<int64_t>(unit);
  for (int64_t b = 0; b < p.batch; ++b) {
    int64_t rem = b, bs = 0, bd = 0;
    for (int k = p.batch_ndim - 1; k >= 0; --k) {
      const int64_t idx = rem % p.batch_shape[k];
      rem /= p.batch_shape[k];
      bs += idx * p.batch_src_stride[k];
      bd += idx * p.batch_dst_stride[k];
    }
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t c = 0; c < p.cols; ++c)
        std::memcpy(reinterpret_cast<char*>(p.dst) + (bd + r * p.dst_row_stride + c * p.dst_col_stride) * u,
                    reinterpret_cast<const char*>(p.src) + (bs + r * p.src_row_stride + c * p.src_col_stride) * u,
                    unit);
  }
}

// The fake's "running kernels": a synchronize blocks while work_running is set (bounded, so that a test of a
// broken build fails instead of hanging; 60 s, far above any stall of a loaded machine under TSan, since a wait that
// gave up early would look like a release made while the work ran).
void wait_for_the_work() {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (g_fake->work_running.load() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

d::Api fake_api() {
  d::Api a{};
  a.cuInit = [](unsigned) { return 0; };
  a.cuDriverGetVersion = [](int* v) { *v = 13000; return 0; };
  a.cuDeviceGetCount = [](int* n) { *n = 2; return 0; };
  a.cuDeviceGet = [](d::CUdevice* dev, int o) { *dev = o; return o >= 0 && o < 2 ? 0 : 101; };
  a.cuDeviceGetAttribute = [](int* v, int attr, d::CUdevice) {
    *v = (attr == d::kAttrVmmSupported || attr == d::kAttrPosixFdSupported ||
          (attr == d::kAttrGpuDirectRdmaWithVmm && g_fake->rdma_supported)) ? 1 : 0;
    return 0;
  };
  a.cuDevicePrimaryCtxRetain = [](d::CUcontext* c, d::CUdevice dev) {
    ++g_fake->retained[dev];
    *c = &g_fake->ctx[dev];
    return 0;
  };
  a.cuCtxGetCurrent = [](d::CUcontext* c) { *c = t_current; return 0; };
  a.cuCtxSetCurrent = [](d::CUcontext c) { t_current = c; return 0; };
  a.cuPointerGetAttribute = [](void* out, int, d::CUdeviceptr) { *static_cast<int*>(out) = 0; return 0; };
  a.cuMemGetAddressRange = [](d::CUdeviceptr*, size_t*, d::CUdeviceptr) { return 1; };
  a.cuStreamSynchronize = [](d::CUstream s) {
    ++g_fake->syncs;
    const int c = stream_ctx(s);
    if (c < 0) return 201;  // CUDA_ERROR_INVALID_CONTEXT: a default stream with no context current
    std::lock_guard lk(g_fake->streams_mu);
    if (g_fake->dead_streams.count(reinterpret_cast<uintptr_t>(s))) return ++g_fake->dead_stream_uses, 400;
    g_fake->synced_in.push_back(c);
    g_fake->synced_streams.push_back(reinterpret_cast<uintptr_t>(s));
    return 0;
  };
  a.cuStreamWaitEvent = [](d::CUstream s, d::CUevent e, unsigned) {
    std::lock_guard lk(g_fake->streams_mu);
    if (g_fake->dead_streams.count(reinterpret_cast<uintptr_t>(s))) return ++g_fake->dead_stream_uses, 400;
    ++g_fake->stream_waits;
    g_fake->waited.emplace_back(reinterpret_cast<uintptr_t>(s), reinterpret_cast<uintptr_t>(e));
    if (auto it = g_fake->event_stream.find(reinterpret_cast<uintptr_t>(e)); it != g_fake->event_stream.end())
      g_fake->waited_for.emplace_back(reinterpret_cast<uintptr_t>(s), it->second);
    return 0;
  };
  a.cuEventCreate = [](d::CUevent* e, unsigned) {
    const int c = ctx_index(t_current);
    if (c < 0) return 201;  // CUDA_ERROR_INVALID_CONTEXT
    *e = new int(c);        // the context it belongs to
    std::lock_guard lk(g_fake->mu);
    g_fake->events.insert(reinterpret_cast<uintptr_t>(*e));
    return 0;
  };
  a.cuEventRecord = [](d::CUevent e, d::CUstream s) {
    // The driver's rule: an event is recorded on a stream of its own context (CUDA_ERROR_INVALID_HANDLE else).
    if (*static_cast<int*>(e) != stream_ctx(s)) return 400;
    std::lock_guard lk(g_fake->streams_mu);
    if (g_fake->dead_streams.count(reinterpret_cast<uintptr_t>(s))) return ++g_fake->dead_stream_uses, 400;
    ++g_fake->records;
    g_fake->recorded_on.insert(reinterpret_cast<uintptr_t>(s));
    g_fake->event_stream[reinterpret_cast<uintptr_t>(e)] = reinterpret_cast<uintptr_t>(s);
    return 0;
  };
  // Event calls with no context current are refused, as the real driver's reference allows it to (the code under
  // test must then make one current: cuda::detail::with_context).
  a.cuEventQuery = [](d::CUevent e) {
    if (!t_current) return no_context();
    std::lock_guard lk(g_fake->streams_mu);
    return g_fake->events_done && !g_fake->pending_events.count(reinterpret_cast<uintptr_t>(e)) ? 0 : d::kErrorNotReady;
  };
  a.cuThreadExchangeStreamCaptureMode = [](int* mode) {
    std::swap(*mode, t_capture_mode);
    return 0;
  };
  a.cuEventSynchronize = [](d::CUevent) {
    if (!t_current) return no_context();
    if (t_capture_mode != 2) ++g_fake->unsafe_unrelaxed;
    wait_for_the_work();
    ++g_fake->event_syncs;
    return g_fake->work_fails ? 719 : 0;  // CUDA_ERROR_LAUNCH_FAILED
  };
  a.cuCtxSynchronize = [] {
    if (t_capture_mode != 2) ++g_fake->unsafe_unrelaxed;
    wait_for_the_work();
    ++g_fake->ctx_syncs;
    return 0;
  };
  a.cuEventDestroy = [](d::CUevent e) {
    if (!t_current) return no_context();
    {
      std::lock_guard lk(g_fake->streams_mu);
      g_fake->event_stream.erase(reinterpret_cast<uintptr_t>(e));
    }
    std::lock_guard lk(g_fake->mu);
    g_fake->events.erase(reinterpret_cast<uintptr_t>(e));
    delete static_cast<int*>(e);
    return 0;
  };
  a.cuMemcpyAsync = [](d::CUdeviceptr dst, d::CUdeviceptr src, size_t n, d::CUstream) {
    ++g_fake->memcpys;
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    return 0;
  };
  a.cuMemsetD8Async = [](d::CUdeviceptr p, unsigned char v, size_t n, d::CUstream) {
    std::memset(reinterpret_cast<void*>(p), v, n);
    return 0;
  };
  a.cuMemHostAlloc = [](void** p, size_t n, unsigned) {
    std::lock_guard lk(g_fake->mu);
    if (g_fake->host_limit && g_fake->host_bytes() + n > g_fake->host_limit) return 2;
    *p = aligned(n);
    g_fake->host_mem[reinterpret_cast<uintptr_t>(*p)] = n;
    return 0;
  };
  a.cuMemFreeHost = [](void* p) {
    std::lock_guard lk(g_fake->mu);
    g_fake->host_mem.erase(reinterpret_cast<uintptr_t>(p));
    std::free(p);
    return 0;
  };
  a.cuMemAlloc = [](d::CUdeviceptr* p, size_t n) {
    *p = reinterpret_cast<d::CUdeviceptr>(aligned(n));
    std::lock_guard lk(g_fake->mu);
    g_fake->device_mem[*p] = n;
    g_fake->plain[*p] = n;
    return 0;
  };
  a.cuMemFree = [](d::CUdeviceptr p) {
    std::lock_guard lk(g_fake->mu);
    g_fake->device_mem.erase(p);
    g_fake->plain.erase(p);
    std::free(reinterpret_cast<void*>(p));
    return 0;
  };
  a.cuMemGetInfo = [](size_t* f, size_t* t) { *f = *t = size_t(1) << 34; return 0; };
  a.cuModuleLoadData = [](d::CUmodule* m, const void* image) {
    // What the real driver loads: the fatbin nvcc built (its magic number first), not an empty or broken embed.
    uint32_t magic = 0;
    std::memcpy(&magic, image, sizeof magic);
    EXPECT_EQ(magic, 0xBA55ED50u) << "the kernels' image is not a fatbin";
    if (magic != 0xBA55ED50u) return 200;  // CUDA_ERROR_INVALID_IMAGE
    *m = g_fake;
    ++g_fake->modules_loaded;
    return 0;
  };
  a.cuModuleUnload = [](d::CUmodule) {
    --g_fake->modules_loaded;
    return 0;
  };
  a.cuModuleGetFunction = [](d::CUfunction* f, d::CUmodule, const char* name) {
    if (name == g_fake->missing_kernel) return 500;  // CUDA_ERROR_NOT_FOUND
    *f = const_cast<char*>(g_fake->names.insert(name).first->c_str());
    return 0;
  };
  a.cuLaunchKernel = [](d::CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned, d::CUstream, void** args, void**) {
    const std::string name = static_cast<const char*>(f);
    const size_t unit = std::stoul(name.substr(name.rfind('u') + 1));
    // The real driver's limits (CUDA_ERROR_INVALID_VALUE beyond them), and the unit's alignment the kernels'
    // loads and stores assume (every address is the base plus a multiple of the unit).
    EXPECT_TRUE(gx >= 1 && gx <= 0x7fffffffu && gy >= 1 && gy <= 65535 && gz >= 1 && gz <= 65535)
        << "grid " << gx << " x " << gy << " x " << gz;
    if (gx > 0x7fffffffu || gy > 65535 || gz > 65535) return 1;
    const auto* addrs = static_cast<const uint64_t*>(args[0]);  // (src, dst first in both parameter blocks)
    EXPECT_TRUE(addrs[0] % unit == 0 && addrs[1] % unit == 0) << name << ": a misaligned unit";
    if (name.rfind("tw_strided_copy_", 0) == 0) {
      EXPECT_EQ(bx, unsigned{TW_CUDA_COPY_BLOCK});
      EXPECT_TRUE(gx >= 1 && gy == 1 && gz == 1 && by == 1 && bz == 1);
      ++g_fake->launches_strided;
    } else {
      const auto& p = *static_cast<const tw_cuda_transpose_params*>(args[0]);
      EXPECT_EQ(bx, unsigned{TW_CUDA_TILE});
      EXPECT_EQ(by, unsigned{TW_CUDA_TILE_ROWS});
      EXPECT_EQ(gx, static_cast<unsigned>((p.cols + 31) / 32));
      EXPECT_EQ(gy, static_cast<unsigned>((p.rows + 31) / 32));
      EXPECT_TRUE(gz >= 1 && bz == 1);
      EXPECT_EQ(p.src_row_stride, 1);
      EXPECT_EQ(p.dst_col_stride, 1);
      ++g_fake->launches_transpose;
    }
    // The kernel itself (kernels.cu built for the host: cuda_kernels_emu.cpp) where the launch is small; a large one
    // runs the model above instead (a transpose block's 256 threads are OS threads there, and a 16 MiB transpose
    // would take a million barrier wake-ups). The CudaKernels tests compare the two.
    const bool small = name.rfind("tw_strided_copy_", 0) == 0
                           ? static_cast<const tw_cuda_strided_params*>(args[0])->numel <= (int64_t{1} << 18)
                           : uint64_t{gx} * gy * static_cast<uint64_t>(
                                 static_cast<const tw_cuda_transpose_params*>(args[0])->batch) <= 64;
    if (!small) {
      if (name.rfind("tw_strided_copy_", 0) == 0)
        run_strided(*static_cast<const tw_cuda_strided_params*>(args[0]), unit);
      else
        run_transpose(*static_cast<const tw_cuda_transpose_params*>(args[0]), unit);
      return 0;
    }
    const bool known = tw_test_emu::launch(name, {gx, gy, gz}, {bx, by, bz}, args[0]);
    EXPECT_TRUE(known) << "no kernel " << name;
    if (known) ++g_fake->launches_emulated;
    return known ? 0 : 500;  // CUDA_ERROR_NOT_FOUND
  };
  a.cuGetErrorName = [](d::CUresult r, const char** s) {
    *s = r == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_FAKE";
    return 0;
  };
  a.cuStreamGetCtx = [](d::CUstream s, d::CUcontext* c) {
    const auto v = reinterpret_cast<intptr_t>(s);
    if (v == kBadStream) return 400;
    {
      std::lock_guard lk(g_fake->streams_mu);
      if (g_fake->dead_streams.count(static_cast<uintptr_t>(v))) return 400;
    }
    const int made_in = created_stream_ctx(v);
    *c = v == kForeignStream ? static_cast<void*>(&g_fake->foreign_ctx)
                             : static_cast<void*>(&g_fake->ctx[made_in >= 0 ? made_in : 0]);
    return 0;
  };
  a.cuStreamGetFlags = [](d::CUstream s, unsigned* flags) {
    const auto v = reinterpret_cast<uintptr_t>(s);
    std::lock_guard lk(g_fake->streams_mu);
    if (v == uintptr_t{kBadStream} || g_fake->dead_streams.count(v)) return 400;
    *flags = g_fake->nonblocking_streams.count(v) ? d::kStreamNonBlocking : 0u;
    return 0;
  };
  a.cuMemGetAllocationGranularity = [](size_t* g, const d::MemAllocationProp* p, int) {
    EXPECT_EQ(p->requested_handle_types, d::kMemHandleTypePosixFd);
    *g = size_t(2) << 20;
    return 0;
  };
  a.cuMemCreate = [](d::CUmemHandle* h, size_t n, const d::MemAllocationProp* p, unsigned long long) {
    if (t_capture_mode != 2) ++g_fake->unsafe_unrelaxed;
    if (g_fake->hold_create) {  // a caller stays inside the driver (and inside the pool's lock) until released
      g_fake->in_create = true;
      while (g_fake->hold_create) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(n % (size_t(2) << 20), 0u);
    EXPECT_EQ(p->type, d::kMemAllocationTypePinned);
    EXPECT_EQ(p->location.type, d::kMemLocationTypeDevice);
    EXPECT_EQ(p->gpu_direct_rdma_capable, g_fake->rdma_supported ? 1 : 0);  // asked for exactly where supported
    {
      std::lock_guard lk(g_fake->mu);
      g_fake->rdma_segments += p->gpu_direct_rdma_capable ? 1 : 0;
      if (g_fake->device_limit && g_fake->vmm_bytes() + n > g_fake->device_limit) return 2;
    }
    const int fd = memfd_create("fake-vmm", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(n)) != 0) return 2;
    void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    std::memset(m, 0xAB, n);  // fresh device memory is not zero: tests must not depend on it
    munmap(m, n);
    std::lock_guard lk(g_fake->mu);
    *h = ++g_fake->next_handle;
    g_fake->vmm[*h] = {fd, n};
    ++g_fake->handles;
    return 0;
  };
  a.cuMemRelease = [](d::CUmemHandle h) {
    if (t_capture_mode != 2) ++g_fake->unsafe_unrelaxed;
    std::lock_guard lk(g_fake->mu);
    auto it = g_fake->vmm.find(h);
    if (it == g_fake->vmm.end()) return 1;
    close(it->second.first);
    g_fake->vmm.erase(it);
    --g_fake->handles;
    return 0;
  };
  a.cuMemAddressReserve = [](d::CUdeviceptr* p, size_t n, size_t, d::CUdeviceptr, unsigned long long) {
    void* m = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 2;
    *p = reinterpret_cast<d::CUdeviceptr>(m);
    std::lock_guard lk(g_fake->mu);
    g_fake->device_mem[*p] = n;
    return 0;
  };
  a.cuMemAddressFree = [](d::CUdeviceptr p, size_t n) {
    std::lock_guard lk(g_fake->mu);
    g_fake->device_mem.erase(p);
    munmap(reinterpret_cast<void*>(p), n);
    return 0;
  };
  a.cuMemMap = [](d::CUdeviceptr va, size_t n, size_t off, d::CUmemHandle h, unsigned long long) {
    std::lock_guard lk(g_fake->mu);
    auto it = g_fake->vmm.find(h);
    if (it == g_fake->vmm.end() || off != 0 || n > it->second.second) return 1;
    if (mmap(reinterpret_cast<void*>(va), n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, it->second.first, 0) ==
        MAP_FAILED)
      return 2;
    g_fake->mapped[va] = h;
    return 0;
  };
  a.cuMemUnmap = [](d::CUdeviceptr va, size_t n) {
    std::lock_guard lk(g_fake->mu);
    g_fake->mapped.erase(va);
    mmap(reinterpret_cast<void*>(va), n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    return 0;
  };
  a.cuMemSetAccess = [](d::CUdeviceptr, size_t, const d::MemAccessDesc* acc, size_t n) {
    EXPECT_EQ(n, 1u);
    EXPECT_EQ(acc->flags, d::kMemAccessReadWrite);
    return 0;
  };
  a.cuMemExportToShareableHandle = [](void* out, d::CUmemHandle h, int type, unsigned long long) {
    EXPECT_EQ(type, d::kMemHandleTypePosixFd);
    std::lock_guard lk(g_fake->mu);
    auto it = g_fake->vmm.find(h);
    if (it == g_fake->vmm.end()) return 1;
    *static_cast<int*>(out) = ::dup(it->second.first);  // (no FD_CLOEXEC: the real driver does not promise it)
    return 0;
  };
  a.cuMemImportFromShareableHandle = [](d::CUmemHandle* h, void* os, int type) {
    EXPECT_EQ(type, d::kMemHandleTypePosixFd);
    const int fd = static_cast<int>(reinterpret_cast<intptr_t>(os));
    struct stat st {};
    if (fstat(fd, &st) != 0 || st.st_size == 0) return 400;  // CUDA_ERROR_INVALID_HANDLE
    std::lock_guard lk(g_fake->mu);
    *h = ++g_fake->next_handle;
    g_fake->vmm[*h] = {fcntl(fd, F_DUPFD_CLOEXEC, 0), static_cast<size_t>(st.st_size)};
    ++g_fake->handles;
    return 0;
  };
  a.cuMemRetainAllocationHandle = [](d::CUmemHandle* h, void* addr) {
    std::lock_guard lk(g_fake->mu);
    const auto p = reinterpret_cast<uintptr_t>(addr);
    for (const auto& [va, mh] : g_fake->mapped) {
      const size_t n = g_fake->vmm.at(mh).second;
      if (p >= va && p < va + n) {
        *h = ++g_fake->next_handle;
        g_fake->vmm[*h] = {fcntl(g_fake->vmm.at(mh).first, F_DUPFD_CLOEXEC, 0), n};
        ++g_fake->handles;
        return 0;
      }
    }
    return 1;  // CUDA_ERROR_INVALID_VALUE: not VMM memory
  };
  a.cuPointerGetAttribute = [](void* out, int attr, d::CUdeviceptr ptr) {
    std::lock_guard lk(g_fake->mu);
    const auto p = static_cast<uintptr_t>(ptr);
    uintptr_t mbase = 0;
    size_t msize = 0;
    for (const auto& [va, mh] : g_fake->mapped)
      if (p >= va && p < va + g_fake->vmm.at(mh).second) mbase = va, msize = g_fake->vmm.at(mh).second;
    switch (attr) {
      case d::kPointerAttrMappingBase: *static_cast<uintptr_t*>(out) = mbase; return mbase ? 0 : 1;
      case d::kPointerAttrMappingSize: *static_cast<size_t*>(out) = msize; return mbase ? 0 : 1;
      case d::kPointerAttrAllowedHandleTypes:
        *static_cast<unsigned long long*>(out) = mbase ? d::kMemHandleTypePosixFd : 0;
        return 0;
      case d::kPointerAttrMempoolHandle: *static_cast<uintptr_t*>(out) = 0; return 0;
      case d::kPointerAttrLegacyIpcCapable: *static_cast<int*>(out) = mbase ? 0 : 1; return 0;
      default: *static_cast<int*>(out) = 0; return 0;
    }
  };
  a.cuMemGetAddressRange = [](d::CUdeviceptr* base, size_t* size, d::CUdeviceptr ptr) {
    std::lock_guard lk(g_fake->mu);
    for (const auto& [b, n] : g_fake->plain)
      if (ptr >= b && ptr < b + n) {
        if (base) *base = b;
        if (size) *size = n;
        return 0;
      }
    return 1;
  };
  // Legacy IPC, within one process: a handle carries the base address; opening it aliases the same memory.
  a.cuIpcGetMemHandle = [](d::IpcHandle* h, d::CUdeviceptr p) {
    std::memset(h->bytes, 0, sizeof h->bytes);
    std::memcpy(h->bytes, "fakeipc", 7);
    std::memcpy(h->bytes + 8, &p, sizeof p);
    return 0;
  };
  a.cuIpcOpenMemHandle = [](d::CUdeviceptr* p, d::IpcHandle h, unsigned flags) {
    EXPECT_EQ(flags, d::kIpcLazyPeerAccess);
    ++g_fake->ipc_open_tries;
    if (g_fake->one_process) return 201;
    if (std::memcmp(h.bytes, "fakeipc", 7) != 0) return 400;  // a forged handle
    std::memcpy(p, h.bytes + 8, sizeof *p);
    std::lock_guard lk(g_fake->mu);
    if (!g_fake->plain.count(*p)) return 400;  // freed meanwhile: stale
    ++g_fake->ipc_opens;
    return 0;
  };
  a.cuIpcCloseMemHandle = [](d::CUdeviceptr) {
    std::lock_guard lk(g_fake->mu);
    --g_fake->ipc_opens;
    return 0;
  };
  a.cuIpcGetEventHandle = [](d::IpcHandle* h, d::CUevent e) {
    std::memset(h->bytes, 0, sizeof h->bytes);
    std::memcpy(h->bytes, "fakeevt", 7);
    std::memcpy(h->bytes + 8, &e, sizeof e);
    return 0;
  };
  a.cuIpcOpenEventHandle = [](d::CUevent* e, d::IpcHandle h) {
    ++g_fake->ipc_event_open_tries;
    if (g_fake->one_process) return 201;
    if (std::memcmp(h.bytes, "fakeevt", 7) != 0) return 400;
    *e = new int(0);
    std::lock_guard lk(g_fake->mu);
    g_fake->events.insert(reinterpret_cast<uintptr_t>(*e));
    ++g_fake->ipc_event_opens;
    return 0;
  };
  a.cuDeviceGetUuid = [](d::Uuid* u, d::CUdevice dev) {
    std::memset(u->bytes, 0, sizeof u->bytes);
    u->bytes[0] = static_cast<unsigned char>(0xF0 + dev);
    return 0;
  };
  a.cuStreamCreate = [](d::CUstream* s, unsigned flags) {
    EXPECT_EQ(flags, d::kStreamNonBlocking);
    ++g_fake->stream_creates;
    const int c = ctx_index(t_current);
    if (c < 0) return 201;  // CUDA_ERROR_INVALID_CONTEXT
    std::lock_guard lk(g_fake->streams_mu);
    *s = &g_fake->created_streams.emplace_back(c);
    g_fake->nonblocking_streams.insert(reinterpret_cast<uintptr_t>(*s));
    return 0;
  };
  return a;
}

// Installs the fake for one test and removes it after (every pool and cached module is reset both ways).
class FakeDriver : public ::testing::Test {
 protected:
  void SetUp() override {
    g_fake = new Fake();
    api_ = fake_api();
    d::install_fake_driver(&api_, 2, 13000);
    tw::cuda::install_runtime();
    tw::ipc_detail::set_local_shortcut(false);  // the fake's handles open in one process: exercise the open path
    // The fake's device memory is host memory: a UCX with CUDA transports (the GPU run's) must not be told it is
    // CUDA memory. CudaDirectNet turns the direct path on, with host memory, where a test wants it.
    ::setenv("TW_NET_CUDA_DIRECT", "0", 1);
  }
  void TearDown() override {
    ::unsetenv("TW_NET_CUDA_DIRECT");
    tw::ipc_detail::set_local_shortcut(true);
    tw::cuda::empty_cache();  // every held buffer back before the fake goes
    d::install_fake_driver(nullptr, 0, 0);
    delete g_fake;
    g_fake = nullptr;
  }
  // Everything handed back: every device and pinned allocation and every event released.
  void expect_no_leaks() {
    // A caller's allocation that a subscriber still held when its publisher closed lingers until the lingering thread
    // sees that subscriber let go (a hang-up at once, a lease within its 20 ms poll), and is freed just after it
    // leaves the list: wait for both, bounded (a real leak fails below all the same).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until) {
      if (tw::ipc_detail::lingering_foreign_allocations() == 0) {
        std::lock_guard lk(g_fake->mu);
        if (g_fake->plain.empty()) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    tw::cuda::empty_cache();
    EXPECT_EQ(tw::cuda::device_pool_stats(0).in_use_bytes, 0u);
    EXPECT_EQ(tw::cuda::pinned_pool_stats().in_use_bytes, 0u);
    EXPECT_TRUE(g_fake->device_mem.empty()) << g_fake->device_mem.size() << " device allocations left";
    EXPECT_TRUE(g_fake->host_mem.empty()) << g_fake->host_mem.size() << " pinned allocations left";
    EXPECT_EQ(g_fake->handles, 0);
    EXPECT_TRUE(g_fake->events.empty()) << g_fake->events.size() << " events left";
  }
  d::Api api_{};
};

// Random bytes in a host tensor of `shape`.
Tensor random_host(const tw::Shape& shape, DType dt, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape, dt);
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  for (int64_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>(rng());
  return t;
}

std::vector<int32_t> host_values_i32(const Tensor& t) {
  Tensor c = t.to(Device::cpu()).contiguous();
  return std::vector<int32_t>(c.data<const int32_t>(), c.data<const int32_t>() + c.numel());
}

bool same_values(const Tensor& a, const Tensor& b) {
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.shape() == cb.shape() && ca.nbytes() == cb.nbytes() &&
         std::memcmp(ca.data_ptr(), cb.data_ptr(), static_cast<size_t>(ca.nbytes())) == 0;
}

// ---- without any driver (this machine has none; the GPU machine has one) -----------------------------------------
TEST(CudaNoDriver, EverythingSaysWhyAndNothingCrashes) {
  if (tw::cuda::is_available()) GTEST_SKIP() << "a CUDA device is present: " << tw::cuda::status();
  tw::cuda::install_runtime();
  const std::string why = tw::cuda::status();
  EXPECT_FALSE(why.empty());
  EXPECT_EQ(tw::cuda::device_count(), 0);
  TW_EXPECT_ERROR_MSG(Tensor::empty({4}, DType::float32(), Device::cuda(0)), ErrorCode::device_unavailable, why);
  Tensor h = Tensor::zeros({4}, DType::float32());
  TW_EXPECT_ERROR_MSG(h.to(Device::cuda(0)), ErrorCode::device_unavailable, why);
  TW_EXPECT_ERROR_MSG(h.pin(), ErrorCode::device_unavailable, why);
  TW_EXPECT_ERROR_MSG(h.to(Device::cuda(0), std::nullopt, false), ErrorCode::copy_required, "copy=False");
  // Host-only moves need no driver.
  EXPECT_EQ(h.to(Device::cpu()).data_ptr(), h.data_ptr());
  Tensor c = h.to(Device::cpu(), std::nullopt, true);
  EXPECT_NE(c.data_ptr(), h.data_ptr());
  EXPECT_TRUE(same_values(c, h));
  EXPECT_EQ(tw::cuda::pinned_pool_stats().reserved_bytes, 0u);
  tw::cuda::empty_cache();  // a no-op without a driver
}

static_assert(TW_CUDA_MAX_RANK == tw::kMaxRank, "the kernels' rank limit is the core's");
static_assert(offsetof(tw_cuda_strided_params, shape) == 32 && sizeof(tw_cuda_strided_params) == 32 + 3 * 8 * 64);
static_assert(offsetof(tw_cuda_transpose_params, batch_shape) == 80 &&
              sizeof(tw_cuda_transpose_params) == 80 + 3 * 8 * 64);

// ---- pure logic -------------------------------------------------------------------------------------------------
TEST(StreamUses, NamedStreamsUntilOneIsUnnamedOrThereAreTooMany) {
  tw::StreamUses u;
  EXPECT_EQ(u.streams(), std::vector<int64_t>{});
  u.note(1);
  u.note(0x5150);
  u.note(1);  // once each
  EXPECT_EQ(u.streams(), (std::vector<int64_t>{1, 0x5150}));
  tw::StreamUses ptds;
  ptds.note(2);  // the per-thread default stream names a different stream on every thread: any stream
  EXPECT_FALSE(ptds.streams().has_value());
  tw::StreamUses many;
  for (int64_t s = 100; s < 100 + static_cast<int64_t>(tw::StreamUses::kMaxStreams); ++s) many.note(s);
  EXPECT_EQ(many.streams()->size(), tw::StreamUses::kMaxStreams);
  many.note(7);
  EXPECT_FALSE(many.streams().has_value()) << "more streams than kept count as any stream";
  // A tracked buffer: a raw pointer escaping means any stream; an untracked one records nothing.
  auto uses = std::make_shared<tw::StreamUses>();
  tw::Buffer b(nullptr, 0, Device::cpu(), nullptr);
  b.note_stream_use(9);
  b.track_stream_uses(uses);
  b.note_stream_use(9);
  EXPECT_EQ(uses->streams(), std::vector<int64_t>{9});
  b.mark_escaped();
  EXPECT_FALSE(uses->streams().has_value());
}

TEST(CudaPool, SizeClasses) {
  const size_t g = size_t(2) << 20;
  EXPECT_EQ(d::size_class(0, g), 512u);
  EXPECT_EQ(d::size_class(1, g), 512u);
  EXPECT_EQ(d::size_class(513, g), 1024u);
  EXPECT_EQ(d::size_class(1 << 20, g), size_t(1) << 20);
  EXPECT_EQ(d::size_class((1 << 20) + 1, g), g);  // above the slabs: granularity steps
  EXPECT_EQ(d::size_class(5 << 20, g), size_t(6) << 20);
  EXPECT_EQ(d::size_class(size_t(100) << 20, g), size_t(112) << 20);  // quarters of 64 MiB: 16 MiB steps
  for (size_t n = 1; n < (size_t(300) << 20); n = n * 3 + 7) {
    const size_t c = d::size_class(n, g);
    EXPECT_GE(c, n);
    if (n > (1 << 20)) {
      EXPECT_LE(c - n, std::max(g, std::bit_floor(n) / 4)) << n;
    }
  }
}

TEST(CudaPlan, DenseIsOneMemcpyTransposeIsTiledTheRestIsStrided) {
  const DType f = DType::float32();
  tw::Layout c{f, {64, 48}, {48, 1}, 0, false};
  tw::Layout t{f, {64, 48}, {1, 64}, 0, false};
  auto p = d::plan_device_copy(c, 4096, c, 8192, 4);
  EXPECT_EQ(p.kind, d::KernelPlan::Kind::memcpy);
  EXPECT_EQ(p.numel * p.unit, 64 * 48 * 4);
  p = d::plan_device_copy(t, 4096, c, 1 << 20, 4);
  EXPECT_EQ(p.kind, d::KernelPlan::Kind::transpose);
  EXPECT_EQ(p.unit, 4);
  tw::Layout every_other{f, {64, 24}, {48, 2}, 0, false};
  tw::Layout dense{f, {64, 24}, {24, 1}, 0, false};
  p = d::plan_device_copy(every_other, 4096, dense, 1 << 20, 4);
  EXPECT_EQ(p.kind, d::KernelPlan::Kind::strided);
  // complex128 at an address only 8-aligned: 8-byte units, two per element.
  tw::Layout z{DType::complex128(), {10}, {1}, 0, false};
  tw::Layout zs{DType::complex128(), {10}, {2}, 0, false};
  p = d::plan_device_copy(zs, 4096 + 8, z, 1 << 20, 16);
  EXPECT_EQ(p.unit, 8);
  EXPECT_EQ(p.kind, d::KernelPlan::Kind::strided);
  EXPECT_EQ(p.numel, 20);
  // the same, 16-aligned: whole 16-byte units
  p = d::plan_device_copy(zs, 4096, z, 1 << 20, 16);
  EXPECT_EQ(p.unit, 16);
  EXPECT_EQ(p.numel, 10);
}

// ---- the kernels themselves, run on the host (cuda_kernels_emu.cpp) against run_strided / run_transpose ---------
namespace kernels {

// A buffer for the units at offsets [lo, hi] from its origin, filled with random bytes (src) or a pattern (dst).
struct Span {
  std::vector<unsigned char> bytes;
  int64_t origin = 0;  // byte index of unit offset 0
  uint64_t addr() { return reinterpret_cast<uint64_t>(bytes.data() + origin); }
};

// Where a 16-byte unit is read as one uint4 the host's alignment must hold: the start is rounded up.
Span span(int64_t lo, int64_t hi, size_t unit, std::mt19937& rng, bool random_fill) {
  Span s;
  const auto u = static_cast<int64_t>(unit);
  s.bytes.resize(static_cast<size_t>((hi - lo + 1) * u) + 32);
  const auto misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(s.bytes.data()) % 16);
  s.origin = (misalign ? 16 - misalign : 0) - lo * u;
  for (size_t i = 0; i < s.bytes.size(); ++i)
    s.bytes[i] = random_fill ? static_cast<unsigned char>(rng()) : static_cast<unsigned char>(i * 7 + 3);
  return s;
}

// Offsets reached by shape/strides: [lo, hi].
std::pair<int64_t, int64_t> extent(int ndim, const int64_t* shape, const int64_t* strides) {
  int64_t lo = 0, hi = 0;
  for (int k = 0; k < ndim; ++k) (strides[k] < 0 ? lo : hi) += (shape[k] - 1) * strides[k];
  return {lo, hi};
}

// The source (random bytes) and two copies of the destination (a pattern) of a copy over shape/strides: `want`
// for the model, `got` for the kernel.
struct Buffers {
  Span src, want, got;
};
Buffers buffers(int ndim, const int64_t* shape, const int64_t* src_strides, const int64_t* dst_strides, size_t unit,
                std::mt19937& rng) {
  const auto [slo, shi] = extent(ndim, shape, src_strides);
  const auto [dlo, dhi] = extent(ndim, shape, dst_strides);
  Buffers b{span(slo, shi, unit, rng, true), span(dlo, dhi, unit, rng, false), {}};
  b.got = b.want;
  return b;
}

// Destination strides that never overlap: a random order of the dims, packed with gaps, some reversed.
void dst_strides(int ndim, const int64_t* shape, int64_t* out, std::mt19937& rng) {
  std::vector<int> order(static_cast<size_t>(ndim));
  for (int k = 0; k < ndim; ++k) order[static_cast<size_t>(k)] = k;
  std::shuffle(order.begin(), order.end(), rng);
  int64_t step = 1;
  for (int k : order) {
    out[k] = rng() % 4 == 0 ? -step : step;
    step *= shape[k] + (rng() % 3 == 0 ? 1 : 0);
  }
}

}  // namespace kernels

TEST(CudaKernels, TheStridedCopyMatchesItsReferenceForEveryUnitAndLayout) {
  std::mt19937 rng(4711);
  const size_t units[] = {1, 2, 4, 8, 16};
  for (int iter = 0; iter < 400; ++iter) {
    tw_cuda_strided_params p{};
    const size_t unit = units[rng() % std::size(units)];
    p.ndim = static_cast<int32_t>(rng() % 5 + 1);
    p.numel = 1;
    for (int k = 0; k < p.ndim; ++k) {
      p.shape[k] = static_cast<int64_t>(rng() % (k == p.ndim - 1 ? 40 : 6) + 1);
      p.numel *= p.shape[k];
      p.src_stride[k] = static_cast<int64_t>(rng() % 11) - 5;  // negative, zero (overlapping reads), gaps
    }
    kernels::dst_strides(p.ndim, p.shape, p.dst_stride, rng);
    kernels::Buffers b = kernels::buffers(p.ndim, p.shape, p.src_stride, p.dst_stride, unit, rng);
    p.src = b.src.addr();
    p.dst = b.want.addr();
    run_strided(p, unit);
    p.dst = b.got.addr();
    // The host's geometry (kernel_abi.h), or a grid too small for one pass (the grid-stride loop).
    const auto blocks = static_cast<unsigned>((p.numel + TW_CUDA_COPY_BLOCK - 1) / TW_CUDA_COPY_BLOCK);
    const unsigned grid = rng() % 2 ? blocks : static_cast<unsigned>(rng() % 2 + 1);
    const std::string name = "tw_strided_copy_u" + std::to_string(unit);
    ASSERT_TRUE(tw_test_emu::launch(name, {grid, 1, 1}, {TW_CUDA_COPY_BLOCK, 1, 1}, &p));
    ASSERT_EQ(b.got.bytes, b.want.bytes) << name << " iteration " << iter << ", ndim " << p.ndim << ", grid " << grid;
  }
}

TEST(CudaKernels, TheTileTransposeMatchesItsReferenceWithPartialTilesAndBatches) {
  std::mt19937 rng(815);
  const size_t units[] = {1, 2, 4, 8};
  for (int iter = 0; iter < 16; ++iter) {
    tw_cuda_transpose_params p{};
    const size_t unit = units[iter % 4];
    p.rows = static_cast<int64_t>(rng() % 70 + 1);  // 1..3 tiles, the last one partial
    p.cols = static_cast<int64_t>(rng() % 70 + 1);
    p.src_row_stride = 1;  // what the kernel's coalescing assumes (kernel_abi.h)
    p.src_col_stride = (p.rows + static_cast<int64_t>(rng() % 3)) * (rng() % 4 == 0 ? -1 : 1);
    p.dst_col_stride = 1;
    p.dst_row_stride = p.cols + static_cast<int64_t>(rng() % 3);
    p.batch_ndim = static_cast<int32_t>(rng() % 3);
    p.batch = 1;
    const int64_t src_plane = std::abs(p.src_col_stride) * p.cols, dst_plane = p.dst_row_stride * p.rows;
    int64_t src_step = src_plane, dst_step = dst_plane;
    for (int k = p.batch_ndim - 1; k >= 0; --k) {
      p.batch_shape[k] = static_cast<int64_t>(rng() % 3 + 1);
      p.batch *= p.batch_shape[k];
      p.batch_src_stride[k] = rng() % 3 == 0 ? 0 : src_step;  // a broadcast source plane, or the next one
      p.batch_dst_stride[k] = dst_step;
      src_step *= p.batch_shape[k];
      dst_step *= p.batch_shape[k];
    }
    int64_t shape[TW_CUDA_MAX_RANK + 2], sst[TW_CUDA_MAX_RANK + 2], dst[TW_CUDA_MAX_RANK + 2];
    for (int k = 0; k < p.batch_ndim; ++k) {
      shape[k] = p.batch_shape[k];
      sst[k] = p.batch_src_stride[k];
      dst[k] = p.batch_dst_stride[k];
    }
    const int n = p.batch_ndim;
    shape[n] = p.rows, shape[n + 1] = p.cols;
    sst[n] = p.src_row_stride, sst[n + 1] = p.src_col_stride;
    dst[n] = p.dst_row_stride, dst[n + 1] = p.dst_col_stride;
    kernels::Buffers b = kernels::buffers(n + 2, shape, sst, dst, unit, rng);
    p.src = b.src.addr();
    p.dst = b.want.addr();
    run_transpose(p, unit);
    p.dst = b.got.addr();
    // gridDim.z below the batch: blocks loop over batch items (and reuse their shared tile).
    const auto gz = static_cast<unsigned>(rng() % static_cast<uint64_t>(p.batch) + 1);
    const tw_test_emu::Dim3 grid{static_cast<unsigned>((p.cols + 31) / 32), static_cast<unsigned>((p.rows + 31) / 32),
                                 gz};
    const std::string name = "tw_transpose_u" + std::to_string(unit);
    ASSERT_TRUE(tw_test_emu::launch(name, grid, {TW_CUDA_TILE, TW_CUDA_TILE_ROWS, 1}, &p));
    ASSERT_EQ(b.got.bytes, b.want.bytes) << name << " " << p.rows << " x " << p.cols << ", batch " << p.batch
                                     << " over gridDim.z " << gz;
  }
  EXPECT_FALSE(tw_test_emu::launch("tw_transpose_u16", {1, 1, 1}, {1, 1, 1}, nullptr)) << "there is no such kernel";
}

TEST(CudaKernels, UnravelAgreesInBothIndexWidthsAndPastFourBillionUnits) {
  std::mt19937_64 rng(99);
  for (int iter = 0; iter < 2000; ++iter) {
    const bool big = iter % 2;  // past UINT32_MAX units: only the 64-bit instantiation may run there
    const int ndim = static_cast<int>(rng() % (big ? 3 : 5) + 2);  // (big: at most 3000^4 units, no overflow)
    int64_t shape[8], ss[8], ds[8];
    uint64_t numel = 1;
    for (int k = 0; k < ndim; ++k) {
      shape[k] = static_cast<int64_t>(rng() % (big ? 3000 : 9) + 1);
      numel *= static_cast<uint64_t>(shape[k]);
      ss[k] = static_cast<int64_t>(rng() % 2001) - 1000;
      ds[k] = static_cast<int64_t>(rng() % 2001) - 1000;
    }
    const uint64_t i = rng() % numel;
    int64_t want_s = 0, want_d = 0;
    uint64_t rem = i;
    for (int k = ndim - 1; k >= 0; --k) {
      const auto idx = static_cast<int64_t>(rem % static_cast<uint64_t>(shape[k]));
      rem /= static_cast<uint64_t>(shape[k]);
      want_s += idx * ss[k];
      want_d += idx * ds[k];
    }
    int64_t s = 0, d2 = 0;
    tw_test_emu::unravel64(i, ndim, shape, ss, ds, s, d2);
    EXPECT_EQ(s, want_s);
    EXPECT_EQ(d2, want_d);
    if (numel <= UINT32_MAX) {
      tw_test_emu::unravel32(static_cast<uint32_t>(i), ndim, shape, ss, ds, s, d2);
      EXPECT_EQ(s, want_s);
      EXPECT_EQ(d2, want_d);
    }
  }
}

// ---- with the fake driver ---------------------------------------------------------------------------------------
TEST_F(FakeDriver, StatusAndDevices) {
  EXPECT_TRUE(tw::cuda::is_available());
  EXPECT_EQ(tw::cuda::device_count(), 2);
  EXPECT_EQ(tw::cuda::driver_version(), 13000);
  EXPECT_EQ(tw::cuda::status(), "2 CUDA devices, driver 13.0 (a test's fake driver)");
  TW_EXPECT_ERROR_MSG(Tensor::empty({4}, DType::float32(), Device::cuda(5)), ErrorCode::invalid_argument,
                      "cuda:5 does not exist (this process sees 2 CUDA devices)");
}

TEST_F(FakeDriver, PoolReusesBlocksInStreamOrder) {
  {
    Tensor a = Tensor::empty({250}, DType::float32(), Device::cuda(0));
    EXPECT_EQ(a.buffer().size(), 1024u);  // class of 1000 bytes
    EXPECT_EQ(a.stream(), std::optional<intptr_t>(1));
    EXPECT_EQ(a.device(), Device::cuda(0));
  }
  auto st = tw::cuda::device_pool_stats(0);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.reserved_bytes, size_t(2) << 20);  // one slab segment
  EXPECT_EQ(st.in_use_bytes, 0u);
  const uintptr_t before = g_fake->device_mem.begin()->first;
  {
    Tensor b = Tensor::empty({256}, DType::float32(), Device::cuda(0));
    EXPECT_GE(reinterpret_cast<uintptr_t>(b.data_ptr()), before);
    EXPECT_EQ(tw::cuda::device_pool_stats(0).hits, 1u);
    EXPECT_EQ(g_fake->stream_waits, 0);  // same stream: no wait at all
  }
  // A large block: its own VMM segment, reused from another stream after a device-side wait on its free event.
  const void* big_ptr = nullptr;
  {
    Tensor big = Tensor::empty({3 << 20}, DType::uint8(), Device::cuda(0));
    big_ptr = big.data_ptr();
  }
  EXPECT_EQ(g_fake->handles, 2);
  {
    tw::Tensor src = Tensor::zeros({3 << 20}, DType::uint8());
    Tensor again = src.to(Device::cuda(0), intptr_t{2});
    EXPECT_EQ(again.data_ptr(), big_ptr);
    EXPECT_EQ(again.stream(), std::optional<intptr_t>(2));
    EXPECT_GE(g_fake->stream_waits, 1);
  }
  // This thread has no context current between calls: the pool's event calls were refused for it and made again
  // under the device's context (with_context), and nothing leaked for it.
  EXPECT_GT(g_fake->no_context_refusals, 0);
  expect_no_leaks();
}

// Memory for a writer outside any stream (a network transport's landing): the host waits for the block's previous
// users alone — on a stream of its own, never the legacy or a caller's stream — and the block comes back only once
// the device's work is done, whatever stream its readers used.
TEST_F(FakeDriver, AllocateIdleReusesOnlyBlocksWhoseWorkIsDoneNeverWaitsAndReturnsThemAfterTheDevicesWork) {
  const tw::DeviceRuntime& rt = tw::device_runtime();
  TW_EXPECT_ERROR_MSG(rt.allocate_idle(Device::cpu(), 64, true), ErrorCode::invalid_argument, "not a CUDA device");
  TW_EXPECT_ERROR_MSG(rt.allocate_idle(Device::cuda(5), 64, true), ErrorCode::invalid_argument,
                      "cuda:5 does not exist");
  const auto waits = [] {  // the host's and the device's: cuStreamSynchronize, cuEventSynchronize, cuStreamWaitEvent
    std::lock_guard lk(g_fake->streams_mu);
    return g_fake->synced_streams.size() + g_fake->waited.size() + static_cast<size_t>(g_fake->event_syncs.load());
  };
  const void* used = nullptr;
  {
    std::shared_ptr<tw::Buffer> a = rt.allocate(Device::cuda(1), 3 << 20, 1);  // a segment of its own, freed with an event on stream 1
    used = a->base();
  }
  // 1. Its free event has not completed (work queued before it still runs): fresh memory, no wait.
  g_fake->events_done = false;
  size_t before = waits();
  std::shared_ptr<tw::Buffer> fresh = rt.allocate_idle(Device::cuda(1), 3 << 20, true);
  EXPECT_NE(fresh->base(), used) << "a block still in use by queued work is not reused";
  EXPECT_EQ(waits(), before) << "nothing waited for";
  const void* fresh_base = fresh->base();
  fresh.reset();
  d::wait_releases();
  // 2. It has: the cached block, reused at once, again with no wait.
  g_fake->events_done = true;
  before = waits();
  std::shared_ptr<tw::Buffer> b = rt.allocate_idle(Device::cuda(1), 3 << 20, true);
  EXPECT_TRUE(b->base() == used || b->base() == fresh_base) << "a cached block, reused";
  EXPECT_EQ(b->device(), Device::cuda(1));
  EXPECT_EQ(b->size(), size_t{3} << 20);
  EXPECT_EQ(waits(), before) << "nothing waited for";
  EXPECT_GT(tw::cuda::device_pool_stats(1).in_use_bytes, 0u);
  g_fake->work_running = true;  // its readers' kernels still run: the block must not come back yet
  b.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GT(tw::cuda::device_pool_stats(1).in_use_bytes, 0u) << "back in the pool while the device still works";
  g_fake->work_running = false;
  d::wait_releases();
  EXPECT_EQ(tw::cuda::device_pool_stats(1).in_use_bytes, 0u);
  // 3. Without readers on other streams (the caller waited for its own device work): back at once, device busy
  //    or not, with no synchronize.
  const int syncs = g_fake->ctx_syncs;
  std::shared_ptr<tw::Buffer> own = rt.allocate_idle(Device::cuda(1), 1000, false);
  EXPECT_EQ(own->size(), 1000u);
  EXPECT_EQ(own->device(), Device::cuda(1));
  g_fake->work_running = true;
  own.reset();
  EXPECT_EQ(tw::cuda::device_pool_stats(1).in_use_bytes, 0u) << "back in the pool when its owner let go";
  g_fake->work_running = false;
  EXPECT_EQ(g_fake->ctx_syncs, syncs);
  expect_no_leaks();
}

TEST_F(FakeDriver, AReleaseThatCannotBeQueuedWaitsOnTheCallersThread) {
  // No release thread (or no memory to queue): the caller waits for the work instead of handing the memory back
  // while it may still be read, and the events it recorded are destroyed.
  const tw::DeviceRuntime& rt = tw::device_runtime();
  d::wait_releases();
  auto released = std::make_shared<std::atomic<int>>(0);
  auto counted = [&](int i) {
    return std::shared_ptr<const void>(new int(i), [released](const int* p) {
      delete p;
      ++*released;
    });
  };
  d::fail_release_queue_for_testing(true);
  const int event_syncs = g_fake->event_syncs, ctx_syncs = g_fake->ctx_syncs;
  const std::vector<int64_t> streams = {0, 2};
  rt.release_after_work(Device::cuda(0), &streams, counted(1));
  EXPECT_EQ(released->load(), 1) << "not released on the caller's thread";
  EXPECT_EQ(g_fake->event_syncs - event_syncs, 2) << "one wait per named stream's event";
  EXPECT_EQ(g_fake->ctx_syncs, ctx_syncs) << "no device-wide wait when every stream was named";
  rt.release_after_work(Device::cuda(0), nullptr, counted(2));
  EXPECT_EQ(released->load(), 2);
  EXPECT_EQ(g_fake->ctx_syncs - ctx_syncs, 1) << "an unnamed stream's use waits for the device";
  d::fail_release_queue_for_testing(false);
  rt.release_after_work(Device::cuda(0), &streams, counted(3));
  d::wait_releases();
  EXPECT_EQ(released->load(), 3);
  expect_no_leaks();
}

TEST_F(FakeDriver, ReleasesQueuedWhileTheDeviceWorksShareOneSynchronize) {
  // Received device memory goes back once the device's work so far is done: one cuCtxSynchronize serves every
  // release queued meanwhile, so a busy device costs one wait per batch, not one per message.
  const tw::DeviceRuntime& rt = tw::device_runtime();
  const int syncs = g_fake->ctx_syncs;
  auto released = std::make_shared<std::atomic<int>>(0);
  g_fake->work_running = true;
  for (int i = 0; i < 6; ++i)
    rt.release_after_work(Device::cuda(0), nullptr,
                          std::shared_ptr<const void>(new int(i), [released](const int* p) {
                            delete p;
                            ++*released;
                          }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(released->load(), 0) << "released while the device still works";
  g_fake->work_running = false;
  d::wait_releases();
  EXPECT_EQ(released->load(), 6);
  EXPECT_LE(g_fake->ctx_syncs - syncs, 2) << "the first release's wait, then one for all the others";
  EXPECT_GE(g_fake->ctx_syncs - syncs, 1);
}

// An allocation the driver refuses for want of memory is tried again once the pool has given its cache back; one
// that still does not fit is out_of_memory, naming the pool, the size and what live tensors hold.
TEST_F(FakeDriver, PoolsGiveTheirCacheBackWhenTheDriverRunsOutOfMemory) {
  constexpr int64_t MiB = 1 << 20;
  g_fake->device_limit = 8 * MiB;
  { Tensor a = Tensor::empty({4 * MiB}, DType::uint8(), Device::cuda(0)); }
  EXPECT_EQ(tw::cuda::device_pool_stats(0).reserved_bytes, size_t(4 * MiB));  // cached, not given back
  Tensor b = Tensor::empty({6 * MiB}, DType::uint8(), Device::cuda(0));  // 4 + 6 > 8: fits once the 4 go back
  EXPECT_EQ(tw::cuda::device_pool_stats(0).reserved_bytes, size_t(6 * MiB));
  EXPECT_EQ(g_fake->handles, 1);
  try {
    Tensor c = Tensor::empty({4 * MiB}, DType::uint8(), Device::cuda(0));
    ADD_FAILURE() << "8 MiB of device memory held 6 + 4 MiB";
  } catch (const tw::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::out_of_memory);
    const std::string m = e.what();
    for (const char* part : {"cuda:0", "4.0 MiB", "CUDA_ERROR_OUT_OF_MEMORY", "6.0 MiB"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " not in: " << m;
  }
  EXPECT_EQ(tw::cuda::device_pool_stats(0).in_use_bytes, size_t(6 * MiB));  // b still works
  b = Tensor();

  // The pinned pool: out of memory, it gives its idle blocks back and tries again, and says so when that fails.
  g_fake->host_limit = 8 * MiB;
  { Tensor p = Tensor::empty({4 * MiB}, DType::uint8(), Device::cuda_host()); }
  Tensor q = Tensor::empty({6 * MiB}, DType::uint8(), Device::cuda_host());
  EXPECT_EQ(q.device(), Device::cuda_host());
  EXPECT_EQ(tw::cuda::pinned_pool_stats().reserved_bytes, size_t(6 * MiB));
  TW_EXPECT_ERROR_MSG(Tensor::empty({4 * MiB}, DType::uint8(), Device::cuda_host()), ErrorCode::out_of_memory,
                      "pinned host memory");
  q = Tensor();
  expect_no_leaks();
}

// A cached block whose last work failed may still be written by it: giving the cache back keeps its segment.
// Memory that may cross processes or land network data: its exported fd does not leak into a child started with
// fork + exec, and its segments ask for GPUDirect RDMA where the device offers it (the fake checks every cuMemCreate
// asks for it exactly then).
TEST_F(FakeDriver, ExportedFdsAreCloseOnExecAndSegmentsAskForGpuDirectRdmaWhereTheDeviceHasIt) {
  g_fake->rdma_supported = true;  // (before the first allocation: a pool asks once)
  const tw::DeviceRuntime& rt = tw::device_runtime();
  {
    tw::DeviceExport e = rt.allocate_exportable(Device::cuda(0), 1000);
    ASSERT_EQ(e.kind, tw::DeviceExport::Kind::vmm);
    ASSERT_GE(e.fd, 0);
    EXPECT_NE(::fcntl(e.fd, F_GETFD) & FD_CLOEXEC, 0);
    ::close(e.fd);
    EXPECT_EQ(g_fake->rdma_segments, 1);
    Tensor big = Tensor::empty({3 << 20}, DType::uint8(), Device::cuda(0));  // a pool segment of its own
    EXPECT_EQ(g_fake->rdma_segments, 2);
    tw::DeviceExport p = rt.export_memory(Device::cuda(0), reinterpret_cast<uintptr_t>(big.data_ptr()),
                                          static_cast<uint64_t>(big.nbytes()));
    ASSERT_EQ(p.kind, tw::DeviceExport::Kind::vmm) << p.why;
    EXPECT_NE(::fcntl(p.fd, F_GETFD) & FD_CLOEXEC, 0);
    ::close(p.fd);
  }
  expect_no_leaks();
}

// Work any context can do (portable pinned memory, event calls on a thread with no context current, waiting for a
// pinned tensor's default stream) goes to a device already in use: a process that only uses cuda:1 never gets a
// context on cuda:0.
TEST_F(FakeDriver, AProcessThatUsesOnlyCuda1NeverMakesAContextOnCuda0) {
  std::mt19937 rng(7);
  {
    Tensor host = random_host({64, 33}, DType::int32(), rng);
    Tensor dev = host.to(Device::cuda(1));  // through pinned staging
    Tensor pinned = host.pin();
    Tensor t = dev.transpose(0, 1).contiguous();  // a kernel, and its scratch
    Tensor back = dev.to(Device::cpu());
    EXPECT_TRUE(same_values(back, host));
    EXPECT_TRUE(same_values(pinned.to(Device::cuda(1)).to(Device::cpu()), host));
    EXPECT_EQ(t.device(), Device::cuda(1));
  }
  tw::cuda::empty_cache();
  EXPECT_GT(g_fake->retained[1].load(), 0);
  EXPECT_EQ(g_fake->retained[0].load(), 0);
  expect_no_leaks();
}

// A fork()ed child of a process that uses CUDA cannot use it (the real driver fails every call there): it is told
// so in words, and a buffer of the parent's that dies in the child goes nowhere near the driver or the pool's lock
// (which another thread of the parent may have held at the fork).
TEST_F(FakeDriver, AForkedChildIsToldCudaIsUnusableAndLeavesTheParentsMemoryAlone) {
  std::optional<Tensor> a = Tensor::empty({250}, DType::float32(), Device::cuda(0));
  ASSERT_EQ(a->stream(), std::optional<intptr_t>(1));  // (so its return would record a free event)
  // Another thread is inside the pool's lock at the fork: it allocates a new segment, and the driver holds it there.
  g_fake->hold_create = true;
  std::thread other([] { Tensor big = Tensor::empty({3 << 20}, DType::uint8(), Device::cuda(0)); });
  while (!g_fake->in_create) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const pid_t pid = ::fork();
  if (pid != 0) {
    g_fake->hold_create = false;
    other.join();
  }
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(20);  // a hang is a failure, not a stuck test
    int rc = 0;
    const size_t events = g_fake->events.size();
    if (tw::cuda::is_available() || tw::cuda::device_count() != 0) rc |= 1;
    if (tw::cuda::status().find("fork()") == std::string::npos) rc |= 2;
    try {
      (void)Tensor::empty({4}, DType::float32(), Device::cuda(0));
      rc |= 4;
    } catch (const tw::Error& e) {
      if (e.code() != ErrorCode::device_unavailable || std::string(e.what()).find("fork()") == std::string::npos)
        rc |= 8;
    }
    if (tw::cuda::device_pool_stats(0).in_use_bytes != 0) rc |= 32;  // (nothing of the parent's is reported)
    a.reset();
    if (g_fake->events.size() != events) rc |= 16;
    ::_exit(rc);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child ended with status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "bits: 1 available, 2 status, 4 allocated, 8 error, 16 touched the driver, "
                                       "32 pool stats";
  EXPECT_TRUE(tw::cuda::is_available());  // the parent is unaffected
  a.reset();
  Tensor b = Tensor::empty({250}, DType::float32(), Device::cuda(0));
  EXPECT_EQ(b.device(), Device::cuda(0));
}

TEST_F(FakeDriver, ASegmentWhoseWorkFailedIsNeverGivenBack) {
  constexpr int64_t MiB = 1 << 20;
  g_fake->events_done = false;  // blocks come back with work still pending
  { Tensor a = Tensor::empty({4 * MiB}, DType::uint8(), Device::cuda(0)); }
  { Tensor b = Tensor::empty({6 * MiB}, DType::uint8(), Device::cuda(0)); }
  EXPECT_EQ(tw::cuda::device_pool_stats(0).reserved_bytes, size_t(10 * MiB));
  g_fake->work_fails = true;
  tw::cuda::empty_cache();
  EXPECT_EQ(tw::cuda::device_pool_stats(0).reserved_bytes, size_t(10 * MiB));
  EXPECT_EQ(g_fake->handles, 2);
  g_fake->work_fails = false;
  g_fake->events_done = true;
  { Tensor c = Tensor::empty({4 * MiB}, DType::uint8(), Device::cuda(0)); }  // a fresh segment: nothing reused
  EXPECT_EQ(tw::cuda::device_pool_stats(0).reserved_bytes, size_t(14 * MiB));
  tw::cuda::empty_cache();  // the healthy one goes back; the failed ones stay
  EXPECT_EQ(tw::cuda::device_pool_stats(0).reserved_bytes, size_t(10 * MiB));
  EXPECT_EQ(g_fake->handles, 2);
}

TEST_F(FakeDriver, EveryLayoutRoundTripsBitExact) {
  std::mt19937 rng(1234);
  const DType dtypes[] = {DType::uint8(), DType::float16(), DType::float32(), DType::float64(), DType::complex128(),
                          DType::boolean()};
  for (int iter = 0; iter < 300; ++iter) {
    const DType dt = dtypes[rng() % std::size(dtypes)];
    const size_t rank = rng() % 5;
    tw::Shape shape;
    for (size_t i = 0; i < rank; ++i) shape.push_back(static_cast<int64_t>(rng() % 6 + 1));
    Tensor base = random_host(shape, dt, rng);
    Tensor view = base;
    // a random view: permute, reverse a dim, step, expand a size-1 dim
    if (rank >= 2 && rng() % 2) {
      std::vector<int64_t> perm;
      for (size_t i = 0; i < rank; ++i) perm.push_back(static_cast<int64_t>(i));
      std::shuffle(perm.begin(), perm.end(), rng);
      view = view.permute(tw::Dims(perm));
    }
    if (rank >= 1 && rng() % 2) view = view.slice(0, std::nullopt, std::nullopt, rng() % 2 ? -1 : 2);
    if (rank >= 1 && rng() % 3 == 0) view = view.slice(static_cast<int64_t>(rank - 1), 1, std::nullopt);
    SCOPED_TRACE("shape " + view.shape().str() + " strides " + view.strides().str() + " " + dt.name());
    Tensor g = view.to(Device::cuda(0));
    EXPECT_EQ(g.device(), Device::cuda(0));
    EXPECT_EQ(g.shape(), view.shape());
    Tensor g2 = g.permute([&] {
      tw::Dims p;
      for (size_t i = g.ndim(); i-- > 0;) p.push_back(static_cast<int64_t>(i));
      return p;
    }()).contiguous();  // device-side strided copy
    Tensor back = g2.to(Device::cpu());
    EXPECT_EQ(back.device(), Device::cpu());
    Tensor expect = view.permute([&] {
      tw::Dims p;
      for (size_t i = view.ndim(); i-- > 0;) p.push_back(static_cast<int64_t>(i));
      return p;
    }());
    ASSERT_TRUE(same_values(back, expect));
    // Into a strided host destination (unpacked from pinned staging by the host engine).
    Tensor dst_base = Tensor::zeros(view.shape(), dt);
    Tensor dst = rank >= 1 ? dst_base.slice(0, std::nullopt, std::nullopt, -1) : dst_base;
    tw::device_runtime().copy(rank >= 1 ? g.slice(0, std::nullopt, std::nullopt, -1) : g, dst, 1);
    if (rank >= 1) {
      ASSERT_TRUE(same_values(dst_base, view));
    }
  }
  EXPECT_GT(g_fake->launches_strided, 0);  // (dimensions up to 6: no tile transposes, see the next test)
  EXPECT_EQ(g_fake->launches_emulated, g_fake->launches_transpose + g_fake->launches_strided)
      << "every launch ran the kernels' own code";
  expect_no_leaks();
}

TEST_F(FakeDriver, TransposedLayoutsRunTheTileKernelAndArriveBitExact) {
  // A device tensor made contiguous from a view whose innermost dimension is not the source's: the tile transpose,
  // with the rows from any dimension (batch dimensions before, between and after it) and partial tiles.
  std::mt19937 rng(2024);
  const DType dtypes[] = {DType::uint8(), DType::float16(), DType::float32(), DType::float64(), DType::complex64()};
  for (int iter = 0; iter < 12; ++iter) {
    const DType dt = dtypes[static_cast<size_t>(iter) % std::size(dtypes)];
    const size_t rank = static_cast<size_t>(iter % 3) + 2;  // 2..4: rows, cols and up to two batch dimensions
    tw::Shape shape;
    for (size_t i = 0; i < rank; ++i)
      shape.push_back(i + 2 < rank ? static_cast<int64_t>(rng() % 3 + 1) : static_cast<int64_t>(rng() % 63 + 8));
    std::vector<int64_t> perm;
    for (size_t i = 0; i < rank; ++i) perm.push_back(static_cast<int64_t>(i));
    std::shuffle(perm.begin(), perm.end(), rng);
    // The new innermost dimension: the source's rows (>= 8, stride != 1); its own innermost goes anywhere else.
    std::swap(*std::find(perm.begin(), perm.end(), static_cast<int64_t>(rank - 2)), perm.back());
    Tensor host = random_host(shape, dt, rng);
    Tensor g = host.to(Device::cuda(0));
    const int before = g_fake->launches_transpose, emulated = g_fake->launches_emulated;
    Tensor c = g.permute(tw::Dims(perm)).contiguous();
    SCOPED_TRACE("shape " + shape.str() + " permuted " + g.permute(tw::Dims(perm)).strides().str() + " " + dt.name());
    EXPECT_EQ(g_fake->launches_transpose, before + 1) << "one tile transpose";
    EXPECT_EQ(g_fake->launches_emulated, emulated + 1) << "kernels.cu's own code ran";
    ASSERT_TRUE(same_values(c.to(Device::cpu()), host.permute(tw::Dims(perm))));
  }
  expect_no_leaks();
}

TEST_F(FakeDriver, AModuleMissingAKernelIsUnloadedAndLoadedAfreshNextTime) {
  std::mt19937 rng(7);
  Tensor host = random_host(tw::Shape{16, 24}, DType::float32(), rng);
  {
    const Tensor g = host.to(Device::cuda(0));
    g_fake->missing_kernel = "tw_transpose_u4";
    try {
      (void)g.permute(tw::Dims{1, 0}).contiguous();
      ADD_FAILURE() << "a module without its kernel was used";
    } catch (const tw::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::unsupported);
      EXPECT_NE(std::string(e.what()).find("lack tw_transpose_u4"), std::string::npos) << e.what();
    }
    EXPECT_EQ(g_fake->modules_loaded, 0) << "the half-resolved module was kept loaded";
    g_fake->missing_kernel.clear();
    const Tensor c = g.permute(tw::Dims{1, 0}).contiguous();
    EXPECT_EQ(g_fake->modules_loaded, 1);
    EXPECT_TRUE(same_values(c.to(Device::cpu()), host.permute(tw::Dims{1, 0})));
    (void)g.permute(tw::Dims{1, 0}).contiguous();
    EXPECT_EQ(g_fake->modules_loaded, 1) << "loaded once per device";
  }
  expect_no_leaks();
}

TEST_F(FakeDriver, ExpandedSourcesAndBadDestinations) {
  Tensor row = Tensor::copy_of<float>(std::vector<float>{1, 2, 3}, {1, 3});
  Tensor g = row.expand({4, 3}).to(Device::cuda(0));  // stride-0 source: each row materialised
  Tensor h = g.to(Device::cpu());
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(h.data<float>()[r * 3 + c], static_cast<float>(c + 1));
  // An overlapping destination is refused, not raced.
  Tensor dst = Tensor::empty({1, 3}, DType::float32(), Device::cuda(0)).expand({4, 3});
  TW_EXPECT_ERROR_MSG(tw::device_runtime().copy(g, dst, 1), ErrorCode::invalid_argument, "overlap");
  TW_EXPECT_ERROR_MSG(tw::device_runtime().copy(g, Tensor::empty({4, 3}, DType::float64(), Device::cuda(0)), 1),
                      ErrorCode::type_mismatch, "dtypes differ");
}

TEST_F(FakeDriver, ACopyBetweenOverlappingRangesOfOneDeviceGoesThroughATemporary) {
  // A kernel's threads (or the driver's copy) would overwrite source elements before others read them: the
  // device engine copies through a temporary, as the host engine does. (The fake's kernel walks the elements in
  // order, so a direct copy shows the damage: the last element would read an already overwritten value.)
  std::vector<float> v(16);
  for (int i = 0; i < 16; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i);
  Tensor g = Tensor::copy_of<float>(v, {16}).to(Device::cuda(0));
  Tensor src = g.slice(0, 0, 6);     // elements 0..5
  Tensor dst = g.slice(0, 1, 12, 2);  // elements 1, 3, 5, 7, 9, 11: the same bytes, every other one
  const int kernels = g_fake->launches_strided;
  tw::device_runtime().copy(src, dst, 1);
  EXPECT_GT(g_fake->launches_strided, kernels) << "the premise: a kernel copies this layout";
  Tensor h = g.to(Device::cpu());
  EXPECT_EQ(std::vector<float>(h.data<const float>(), h.data<const float>() + 16),
            (std::vector<float>{0, 0, 2, 1, 4, 2, 6, 3, 8, 4, 10, 5, 12, 13, 14, 15}));
  // A view copied onto itself is the one case with nothing to do: no kernel, no copy, no temporary.
  const int launches = g_fake->launches_strided, copies = g_fake->memcpys;
  tw::device_runtime().copy(dst, dst, 1);
  EXPECT_EQ(g_fake->launches_strided, launches);
  EXPECT_EQ(g_fake->memcpys, copies);
  EXPECT_EQ(g.to(Device::cpu()).data<const float>()[11], 5.0f);
}

TEST_F(FakeDriver, StreamsFollowTheRules) {
  Tensor h = Tensor::zeros({8}, DType::float32());
  TW_EXPECT_ERROR_MSG(h.to(Device::cuda(0), intptr_t{0}), ErrorCode::invalid_argument, "stream 0 is ambiguous");
  TW_EXPECT_ERROR_MSG(h.to(Device::cuda(0), kForeignStream), ErrorCode::invalid_argument, "belongs to another device");
  TW_EXPECT_ERROR_MSG(h.to(Device::cuda(0), kBadStream), ErrorCode::invalid_argument, "not a valid CUDA stream");
  TW_EXPECT_ERROR_MSG(h.to(Device::cuda(0), intptr_t{3}), ErrorCode::invalid_argument,
                      "3 is neither 1 (legacy default), 2 (per-thread default) nor a stream handle");
  // A device tensor on stream A copied on stream B: B waits for A on the device, the host never waits.
  Tensor a = h.to(Device::cuda(0), intptr_t{2});
  const int waits = g_fake->stream_waits, syncs = g_fake->syncs;
  Tensor b = a.to(Device::cuda(1), std::nullopt, std::nullopt);
  (void)b;
  Tensor c = a.copy();  // tensorwire's work goes on the legacy stream, after a's
  EXPECT_EQ(c.stream(), std::optional<intptr_t>(1));
  Tensor d2 = a.to(Device::cuda(0), intptr_t{1}, true);
  EXPECT_EQ(d2.stream(), std::optional<intptr_t>(1));
  EXPECT_GE(g_fake->stream_waits, waits + 2);  // c and d2: stream 1 after stream 2, on the device
  EXPECT_EQ(g_fake->syncs, syncs + 1);         // only the cross-device copy waited (for its pinned staging)
  // to(cpu) into pageable memory returns with the data there: one stream synchronisation.
  Tensor back = a.to(Device::cpu());
  EXPECT_EQ(back.stream(), std::nullopt);
  EXPECT_EQ(back.data<float>()[7], 0.0f);
}

// An import that copies (to a device, or copy=always of device memory) queues the copy on the caller's stream,
// after the producer's through a device-side wait, and the result carries that stream; -1 (DLPack's "no
// synchronisation") and host-only copies queue nothing on it. (The copies were on the legacy stream whatever the
// caller asked, so a consumer's stream could read them before they were done.)
TEST_F(FakeDriver, AnImportsCopyIsQueuedOnTheCallersStream) {
  Tensor h = Tensor::zeros({8}, DType::float32());
  tw::ImportRequest to_dev;
  to_dev.device = Device::cuda(0);
  to_dev.stream = 2;
  Tensor g = tw::finish_import(h, to_dev, {});
  EXPECT_EQ(g.device(), Device::cuda(0));
  EXPECT_EQ(g.stream(), std::optional<intptr_t>(2));
  to_dev.stream = -1;
  EXPECT_EQ(tw::finish_import(h, to_dev, {}).stream(), std::optional<intptr_t>(1));  // the legacy one, as without
  to_dev.stream = 3;
  TW_EXPECT_ERROR_MSG(tw::finish_import(h, to_dev, {}), ErrorCode::invalid_argument, "3 is neither 1");
  // copy=always of a tensor ordered on the legacy stream, asked for on stream 2: stream 2 waits for stream 1.
  Tensor a = h.to(Device::cuda(0), intptr_t{1});
  tw::ImportRequest again;
  again.copy = tw::CopyMode::always;
  again.stream = 2;
  const size_t waits = g_fake->waited_for.size();
  Tensor c = tw::finish_import(a, again, {});
  EXPECT_NE(c.data_ptr(), a.data_ptr());
  EXPECT_EQ(c.stream(), std::optional<intptr_t>(2));
  ASSERT_GT(g_fake->waited_for.size(), waits);
  EXPECT_EQ(g_fake->waited_for.back(), (std::pair<uintptr_t, uintptr_t>{2, 1}));
  // Zero-copy device memory (the CUDA Array Interface, on the producer's stream 1) asked for on stream 2: stream 2
  // waits for stream 1 on the device and the tensor says 2, as a DLPack producer's would.
  tw::InterfaceDesc desc;
  desc.protocol = "__cuda_array_interface__";
  desc.typestr = "<f4";
  desc.shape = {8};
  desc.data = reinterpret_cast<uintptr_t>(a.data_ptr());
  desc.device = std::nullopt;  // the driver says which
  desc.stream = 1;
  tw::ImportRequest on2;
  on2.stream = 2;
  const size_t before = g_fake->waited_for.size();
  Tensor z = tw::import_interface(desc, a.buffer_ptr(), on2);
  EXPECT_EQ(z.data_ptr(), a.data_ptr());
  EXPECT_EQ(z.stream(), std::optional<intptr_t>(2));
  ASSERT_GT(g_fake->waited_for.size(), before);
  EXPECT_EQ(g_fake->waited_for.back(), (std::pair<uintptr_t, uintptr_t>{2, 1}));
  on2.stream = -1;  // no synchronisation asked: the producer's stream, as it said
  EXPECT_EQ(tw::import_interface(desc, a.buffer_ptr(), on2).stream(), std::optional<intptr_t>(1));
  // A copy the host makes has no stream to queue on: the import's request ignores it, Tensor::copy refuses it.
  tw::ImportRequest host_copy;
  host_copy.copy = tw::CopyMode::always;
  host_copy.stream = 2;
  EXPECT_EQ(tw::finish_import(h, host_copy, {}).stream(), std::nullopt);
  TW_EXPECT_ERROR_MSG(h.copy(tw::MemoryOrder::C, intptr_t{2}), ErrorCode::invalid_argument, "the host copies cpu memory");
}

// An event belongs to the context current when it is made, and is recorded only on a stream of that context; the
// default streams 1 and 2 are the current context's. So the context is chosen from the stream: a handle's own,
// else the named device's, else the thread's current one, else that of the lowest-numbered device in use (cuda:0's
// when none is).
TEST_F(FakeDriver, EventsAndWaitsHappenInTheStreamsOwnContext) {
  const auto ctx_of = [](void* ev) { return *static_cast<int*>(ev); };
  std::vector<void*> events;
  t_current = nullptr;  // a thread that never touched CUDA
  events.push_back(tw::cuda::record_event(tw::cuda::kLegacyStream, 1));
  EXPECT_EQ(ctx_of(events.back()), 1);
  EXPECT_EQ(t_current, nullptr) << "the caller's context is left as it was";
  events.push_back(tw::cuda::record_event(tw::cuda::kPerThreadStream));
  EXPECT_EQ(ctx_of(events.back()), 1);  // cuda:1 is the device in use
  EXPECT_EQ(g_fake->retained[0].load(), 0);
  events.push_back(tw::device_runtime().record_event(Device::cuda(1), tw::cuda::kPerThreadStream));
  EXPECT_EQ(ctx_of(events.back()), 1);
  t_current = &g_fake->ctx[1];
  events.push_back(tw::cuda::record_event(tw::cuda::kLegacyStream));
  EXPECT_EQ(ctx_of(events.back()), 1);
  TW_EXPECT_ERROR_MSG(tw::cuda::record_event(intptr_t{3}, 1), ErrorCode::invalid_argument,
                      "3 is neither 1 (legacy default), 2 (per-thread default) nor a stream handle");
  events.push_back(tw::cuda::record_event(kForeignStream, 1));  // a handle: its own context, whatever the device
  EXPECT_EQ(ctx_of(events.back()), kForeignCtx);
  EXPECT_EQ(t_current, &g_fake->ctx[1]);
  t_current = nullptr;
  g_fake->synced_in.clear();
  tw::cuda::synchronize_stream(tw::cuda::kLegacyStream, 1);
  tw::cuda::synchronize_stream(tw::cuda::kLegacyStream);
  tw::device_runtime().synchronize_stream(Device::cuda(1), tw::cuda::kPerThreadStream);
  EXPECT_EQ(g_fake->synced_in, (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(t_current, nullptr);
  for (void* e : events) tw::cuda::destroy_event(e);
  expect_no_leaks();
}

// A foreign producer's stream (the CUDA Array Interface's `stream`, a DLPack stream) is captured by an event at
// import: the producer may destroy the stream while the tensor lives, and every later use (a DLPack export to a
// consumer's stream, a copy, the CUDA Array Interface's stream, an Arrow sync_event) still waits for exactly the
// work the producer had queued, never touching the dead stream.
TEST_F(FakeDriver, AProducersStreamMayBeDestroyedOnceItsTensorIsImported) {
  constexpr intptr_t kProducer = 0x5000, kConsumer = 0x5100;
  std::mt19937 rng(11);
  Tensor host = random_host({4, 6}, DType::float32(), rng);
  Tensor mem = host.to(Device::cuda(0));  // the producer's device memory
  tw::InterfaceDesc desc;
  desc.protocol = "__cuda_array_interface__";
  desc.typestr = "<f4";
  desc.shape = {6, 4};
  desc.byte_strides = std::vector<int64_t>{4, 24};  // its transpose
  desc.data = reinterpret_cast<uintptr_t>(mem.data_ptr());
  desc.device = std::nullopt;  // the driver says which
  desc.stream = kProducer;
  Tensor t = tw::import_interface(desc, mem.buffer_ptr(), tw::ImportRequest{});
  EXPECT_EQ(t.stream(), std::optional<intptr_t>(kProducer)) << "t.stream is still the producer's";
  ASSERT_NE(t.ready_event(), nullptr);
  const auto ev = reinterpret_cast<uintptr_t>(t.ready_event());
  EXPECT_EQ(g_fake->event_stream.at(ev), static_cast<uintptr_t>(kProducer)) << "recorded at import";
  Tensor view = t.slice(0, 1, std::nullopt);
  EXPECT_EQ(view.ready_event(), t.ready_event()) << "views keep it";

  g_fake->pending_events.insert(ev);      // the producer's kernel still runs
  g_fake->dead_streams.insert(kProducer);  // the producer destroys its stream
  const auto waited_on = [&](intptr_t stream) {
    return std::count(g_fake->waited.begin(), g_fake->waited.end(),
                      std::pair<uintptr_t, uintptr_t>{static_cast<uintptr_t>(stream), ev});
  };
  // DLPack export to the consumer's stream: it waits on the import's event.
  tw::ExportRequest req;
  req.stream = kConsumer;
  tw::PreparedExport pe = tw::prepare_export(t, req);
  EXPECT_EQ(waited_on(kConsumer), 1);
  // A copy on another stream, and one on the legacy stream.
  Tensor c = t.to(Device::cuda(0), kConsumer, true);
  EXPECT_EQ(waited_on(kConsumer), 2);
  Tensor c2 = view.copy();
  EXPECT_EQ(waited_on(tw::cuda::kLegacyStream), 1);
  EXPECT_TRUE(same_values(c.to(Device::cpu()), host.transpose(0, 1)));
  EXPECT_TRUE(same_values(c2.to(Device::cpu()), host.transpose(0, 1).slice(0, 1, std::nullopt)));
  // A consumer that takes a stream handle gets tensorwire's own stream, which waited on the event.
  const std::optional<intptr_t> s = tw::stream_for_consumers(t);
  ASSERT_TRUE(s);
  EXPECT_NE(*s, kProducer);
  EXPECT_EQ(waited_on(*s), 1);
  EXPECT_EQ(g_fake->stream_creates, 1);
  EXPECT_EQ(tw::stream_for_consumers(view), s) << "one stream per device, made once";
  EXPECT_EQ(waited_on(*s), 2);
  // Arrow's sync_event is recorded on that stream, after the import's event.
  {
    ArrowSchema as;
    ArrowDeviceArray ad;
    tw::to_arrow(t.transpose(0, 1), &as, &ad);  // (C-contiguous again: Arrow takes it without a copy)
    ASSERT_NE(ad.sync_event, nullptr);
    const auto sync = reinterpret_cast<uintptr_t>(*static_cast<void**>(ad.sync_event));
    EXPECT_EQ(g_fake->event_stream.at(sync), static_cast<uintptr_t>(*s));
    EXPECT_EQ(waited_on(*s), 3);  // (once for t, once for view above, once here)
    // Once the producer's work is done, that shared stream does not wait for it any more (nor hold up later users).
    g_fake->pending_events.erase(ev);
    EXPECT_EQ(tw::stream_for_consumers(t), s);
    EXPECT_EQ(waited_on(*s), 3);
    g_fake->pending_events.insert(ev);
    ad.array.release(&ad.array);
    as.release(&as);
  }
  // t itself is strided: Arrow gets a device copy, in the legacy stream's order after the import's event.
  {
    ArrowSchema as;
    ArrowDeviceArray ad;
    const int legacy_waits = static_cast<int>(waited_on(tw::cuda::kLegacyStream));
    tw::to_arrow(t, &as, &ad);
    EXPECT_EQ(waited_on(tw::cuda::kLegacyStream), legacy_waits + 1);
    ASSERT_NE(ad.sync_event, nullptr);
    const auto sync = reinterpret_cast<uintptr_t>(*static_cast<void**>(ad.sync_event));
    EXPECT_EQ(g_fake->event_stream.at(sync), static_cast<uintptr_t>(tw::cuda::kLegacyStream));
    EXPECT_EQ(ad.device_type, ARROW_DEVICE_CUDA);
    EXPECT_EQ(ad.device_id, 0);
    ASSERT_EQ(ad.array.n_children, 1);
    const auto* values = static_cast<const float*>(ad.array.children[0]->buffers[1]);  // fake device memory
    Tensor want = host.transpose(0, 1).contiguous();
    EXPECT_EQ(std::memcmp(values, want.data_ptr(), 24 * sizeof(float)), 0) << "t's values, C order";
    ad.array.release(&ad.array);
    as.release(&as);
  }
  // Exported to the legacy stream, the per-thread default stream (each thread's own) or the producer's own
  // handle, the consumer still waits on the event.
  req.stream = tw::cuda::kPerThreadStream;
  (void)tw::prepare_export(t, req);
  EXPECT_EQ(waited_on(tw::cuda::kPerThreadStream), 1);
  const int legacy_waits = static_cast<int>(waited_on(tw::cuda::kLegacyStream));
  req.stream = tw::cuda::kLegacyStream;
  (void)tw::prepare_export(t, req);
  EXPECT_EQ(waited_on(tw::cuda::kLegacyStream), legacy_waits + 1);
  g_fake->dead_streams.erase(kProducer);  // (a new stream given the same handle: still the event, not the handle)
  req.stream = kProducer;
  (void)tw::prepare_export(t, req);
  EXPECT_EQ(waited_on(kProducer), 1);
  g_fake->dead_streams.insert(kProducer);

  // Without the capture (a tensor whose stream is set plainly), the same export records on the dead stream: the
  // driver refuses it. This is what the import's event avoids.
  Tensor plain = t;
  plain.set_stream(kProducer);
  EXPECT_EQ(plain.ready_event(), nullptr);
  req.stream = kConsumer;
  TW_EXPECT_ERROR_MSG(tw::prepare_export(plain, req), ErrorCode::invalid_argument, "cuEventRecord");

  // The legacy default stream is never destroyed: no event is made for it.
  desc.stream = tw::cuda::kLegacyStream;
  Tensor legacy = tw::import_interface(desc, mem.buffer_ptr(), tw::ImportRequest{});
  EXPECT_EQ(legacy.ready_event(), nullptr);
  EXPECT_EQ(legacy.stream(), std::optional<intptr_t>(tw::cuda::kLegacyStream));
  t = Tensor();
  view = Tensor();
  pe = tw::PreparedExport{};
  plain = Tensor();
  EXPECT_EQ(g_fake->event_stream.count(ev), 0u) << "the event goes with the last tensor that keeps it";
}

// The same capture for memory the host reads (pinned, managed: waited for at import, since host readers cannot
// wait on an event), for the per-thread default stream (2 on another thread is another stream), and for a device
// result of Tensor::to on the caller's stream.
TEST_F(FakeDriver, HostReadableImportsWaitNowAndPerThreadStreamsAreCaptured) {
  constexpr intptr_t kProducer = 0x5000, kConsumer = 0x5100;
  const auto count = [](intptr_t stream, uintptr_t ev) {
    return std::count(g_fake->waited.begin(), g_fake->waited.end(),
                      std::pair<uintptr_t, uintptr_t>{static_cast<uintptr_t>(stream), ev});
  };
  tw::InterfaceDesc desc;
  desc.protocol = "__cuda_array_interface__";
  desc.typestr = "<i4";
  desc.shape = {5};
  desc.stream = kProducer;
  // Pinned memory: waited for now (on the event), and a later host wait never names the producer's stream.
  {
    Tensor pinned = Tensor::empty({5}, DType::int32(), Device::cuda_host());
    for (int i = 0; i < 5; ++i) pinned.data<int32_t>()[i] = i * 3;
    desc.data = reinterpret_cast<uintptr_t>(pinned.data_ptr());
    desc.device = Device::cuda_host();
    const int syncs = g_fake->event_syncs.load();
    Tensor t = tw::import_interface(desc, pinned.buffer_ptr(), tw::ImportRequest{});
    ASSERT_NE(t.ready_event(), nullptr);
    EXPECT_EQ(g_fake->event_syncs.load(), syncs + 1) << "the host reads pinned memory at once: waited for at import";
    g_fake->dead_streams.insert(kProducer);
    Tensor d = t.to(Device::cuda(0));  // a host wait for pinned memory: on the event, not the dead stream
    EXPECT_EQ(host_values_i32(d), (std::vector<int32_t>{0, 3, 6, 9, 12}));
    g_fake->dead_streams.clear();
  }
  // Managed memory: the same (NumPy reads it as soon as the import returns); a DLPack export waits on the event.
  {
    std::vector<int32_t> managed{1, 2, 3, 4, 5};
    desc.data = reinterpret_cast<uintptr_t>(managed.data());
    desc.device = Device{kDLCUDAManaged, 0};
    const int syncs = g_fake->event_syncs.load();
    Tensor t = tw::import_interface(desc, nullptr, tw::ImportRequest{});
    ASSERT_NE(t.ready_event(), nullptr);
    EXPECT_EQ(g_fake->event_syncs.load(), syncs + 1);
    const auto ev = reinterpret_cast<uintptr_t>(t.ready_event());
    g_fake->dead_streams.insert(kProducer);
    tw::ExportRequest req;
    req.stream = kConsumer;
    (void)tw::prepare_export(t, req);
    EXPECT_EQ(count(kConsumer, ev), 1);
    g_fake->dead_streams.clear();
  }
  // The per-thread default stream: the import's event is recorded on the importing thread's stream 2; an export
  // to stream 2 on another thread (another stream) waits on it instead of treating the equal numbers as one stream.
  {
    Tensor mem = Tensor::zeros({5}, DType::int32()).to(Device::cuda(0));
    desc.data = reinterpret_cast<uintptr_t>(mem.data_ptr());
    desc.device = std::nullopt;
    desc.stream = tw::cuda::kPerThreadStream;
    Tensor t = tw::import_interface(desc, mem.buffer_ptr(), tw::ImportRequest{});
    ASSERT_NE(t.ready_event(), nullptr);
    const auto ev = reinterpret_cast<uintptr_t>(t.ready_event());
    EXPECT_EQ(g_fake->event_stream.at(ev), static_cast<uintptr_t>(tw::cuda::kPerThreadStream));
    std::thread other([&] {
      tw::ExportRequest req;
      req.stream = tw::cuda::kPerThreadStream;
      (void)tw::prepare_export(t, req);
    });
    other.join();
    EXPECT_EQ(count(tw::cuda::kPerThreadStream, ev), 1);
  }
  // Tensor::to on the caller's stream: the result carries that stream and an event recorded on it after the copy.
  {
    Tensor r = Tensor::zeros({5}, DType::int32()).to(Device::cuda(0), kConsumer);
    EXPECT_EQ(r.stream(), std::optional<intptr_t>(kConsumer));
    ASSERT_NE(r.ready_event(), nullptr);
    EXPECT_EQ(g_fake->event_stream.at(reinterpret_cast<uintptr_t>(r.ready_event())), static_cast<uintptr_t>(kConsumer));
    Tensor legacy = Tensor::zeros({5}, DType::int32()).to(Device::cuda(0));
    EXPECT_EQ(legacy.ready_event(), nullptr) << "the legacy default stream needs none";
  }
  expect_no_leaks();
}

TEST_F(FakeDriver, PinKeepsLayoutAndMetadata) {
  std::mt19937 rng(7);
  Tensor base = random_host({6, 5}, DType::int16(), rng);
  Tensor v = base.transpose(0, 1).slice(0, std::nullopt, std::nullopt, -2);
  v.metadata().set("step", tw::Value(int64_t{7}));
  Tensor p = v.pin();
  EXPECT_TRUE(p.pinned());
  EXPECT_EQ(p.device(), Device::cuda_host());
  EXPECT_EQ(p.strides(), v.strides());
  EXPECT_EQ(p.shape(), v.shape());
  EXPECT_EQ(p.metadata().at("step").as_int(), 7);
  EXPECT_TRUE(same_values(p, v));
  EXPECT_EQ(p.pin().data_ptr(), p.data_ptr());  // already pinned: the same tensor
  // pinned -> device -> pinned, asynchronous both ways on a stream
  Tensor g = p.to(Device::cuda(0), intptr_t{2});
  Tensor p2 = g.to(Device::cuda_host());
  EXPECT_TRUE(p2.pinned());
  EXPECT_EQ(p2.stream(), std::nullopt);  // host memory: the data is there when to() returns
  EXPECT_TRUE(same_values(p2.to(Device::cpu()), v));
  Tensor empty_pinned = Tensor::empty({4, 4}, DType::float32(), Device::cuda_host());
  EXPECT_TRUE(empty_pinned.pinned());
  EXPECT_GE(tw::cuda::pinned_pool_stats().hits + tw::cuda::pinned_pool_stats().misses, 2u);
  TW_EXPECT_ERROR_MSG(g.pin(), ErrorCode::unsupported, "not in host memory");
}

TEST_F(FakeDriver, HeldBuffersOutliveTheirTensorsUntilTheWorkIsDone) {
  // While the queued copy is pending, its pinned staging and device buffers stay out of the pools even though
  // every tensor naming them is gone; once its event completes they come back.
  g_fake->events_done = false;
  {
    Tensor h = Tensor::zeros({1000}, DType::float64());
    Tensor g = h.to(Device::cuda(0));
    EXPECT_EQ(tw::cuda::pinned_pool_stats().in_use_bytes, 8192u);  // the staging block, 8000 bytes in class 8192
  }
  (void)Tensor::empty({1}, DType::uint8(), Device::cuda(1));  // any CUDA call polls the held buffers
  EXPECT_EQ(tw::cuda::pinned_pool_stats().in_use_bytes, 8192u);  // still pending: still held
  EXPECT_EQ(tw::cuda::device_pool_stats(0).in_use_bytes, 8192u);
  g_fake->events_done = true;
  (void)Tensor::empty({1}, DType::uint8(), Device::cuda(1));
  EXPECT_EQ(tw::cuda::pinned_pool_stats().in_use_bytes, 0u);
  EXPECT_EQ(tw::cuda::device_pool_stats(0).in_use_bytes, 0u);
  expect_no_leaks();
}

TEST_F(FakeDriver, CopyFalseAndSameDevice) {
  Tensor g = Tensor::empty({3}, DType::float32(), Device::cuda(0));
  EXPECT_EQ(g.to(Device::cuda(0)).data_ptr(), g.data_ptr());
  TW_EXPECT_ERROR_MSG(g.to(Device::cpu(), std::nullopt, false), ErrorCode::copy_required, "copy=False");
  EXPECT_NE(g.to(Device::cuda(0), std::nullopt, true).data_ptr(), g.data_ptr());
}

}  // namespace

// ---- CUDA tensors between publisher and subscriber (issue 10), with the fake driver ------------------------------
// One process plays both sides: the fake's legacy handles carry the address (opening one aliases the same memory)
// and its VMM allocations are memfds (an exported fd imported and mapped again aliases the same bytes), so values,
// handle bookkeeping, events and leases are all checked here; the GPU suite runs the same across real processes.

std::string ipc_topic(const char* what) {
  static std::atomic<int> n{0};
  return "test/cudaipc/" + std::to_string(::getpid()) + "/" + what + "/" + std::to_string(n++);
}

// A caller's cudaMalloc allocation (the fake's cuMemAlloc), as PyTorch's caching allocator would hold it: `n`
// float32 values 0, 1, 2, ...; `freed` turns true when tensorwire lets the memory go.
Tensor foreign_floats(size_t n, std::shared_ptr<std::atomic<bool>> freed) {
  d::CUdeviceptr p = 0;
  EXPECT_EQ(d::driver().api.cuMemAlloc(&p, n * 4), 0);
  auto* f = reinterpret_cast<float*>(p);
  for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>(i);
  std::shared_ptr<void> owner(f, [freed](void* q) {
    d::driver().api.cuMemFree(reinterpret_cast<d::CUdeviceptr>(q));
    freed->store(true);  // (after the free: a test that saw it may count allocations at once)
  });
  auto buf = std::make_shared<tw::Buffer>(f, n * 4, Device::cuda(0), owner);
  return Tensor::make(buf, tw::Layout{DType::float32(), {static_cast<int64_t>(n)}, {1}, 0, false}, false);
}

std::vector<float> host_values(const Tensor& t) {
  Tensor h = t.to(Device::cpu());
  Tensor c = h.contiguous();
  return std::vector<float>(c.data<const float>(), c.data<const float>() + c.numel());
}

TEST_F(FakeDriver, IpcTheStackedPlaneArrivesWithItsOffset) {
  // The seed bug: two 2x3 tensors stacked, the second plane sent; the values 6..11 must arrive, not 0..5.
  const std::string name = ipc_topic("stack");
  auto freed = std::make_shared<std::atomic<bool>>(false);
  {
    tw::Publisher pub(name);
    tw::Subscriber sub(name);
    ASSERT_TRUE(sub.connected());
    Tensor stacked = foreign_floats(12, freed).view({2, 2, 3});
    const int waits = g_fake->stream_waits;
    ASSERT_EQ(pub.send(stacked.select(0, 1), tw::Metadata{{"step", 7}}), 1u);
    ASSERT_EQ(pub.send(stacked.select(0, 0)), 1u);  // the same allocation: the same segment, opened once
    stacked = Tensor();
    EXPECT_FALSE(freed->load()) << "the publisher keeps the caller's allocation while a subscriber may read it";
    auto t = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(t);
    EXPECT_EQ(std::string(t->buffer().transport()), "cuda-ipc");
    EXPECT_EQ(t->device(), Device::cuda(0));
    EXPECT_EQ(t->shape(), (tw::Shape{2, 3}));
    EXPECT_EQ(host_values(*t), (std::vector<float>{6, 7, 8, 9, 10, 11}));
    EXPECT_EQ(t->metadata().at("step").as_int(), 7);
    EXPECT_TRUE(t->stream().has_value());
    EXPECT_GT(g_fake->stream_waits, waits) << "the receive stream waits on the publisher's event";
    EXPECT_GE(g_fake->records, 2);
    auto t0 = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(t0);
    EXPECT_EQ(host_values(*t0), (std::vector<float>{0, 1, 2, 3, 4, 5}));
    EXPECT_EQ(g_fake->ipc_opens, 1) << "one open per allocation per process";
    EXPECT_EQ(d::open_legacy_handles(), 1u);
    t.reset();
    d::wait_releases();  // a lease goes back once the work queued on its memory is done, off the caller's thread
    EXPECT_EQ(g_fake->ipc_opens, 1) << "still used by the other message";
    t0.reset();
    d::wait_releases();
    EXPECT_EQ(g_fake->ipc_opens, 0) << "the handle closes when no lease uses it";
    EXPECT_EQ(d::open_legacy_handles(), 0u);
    // The publisher lets the caller's memory go at its next send (or close) once nobody holds it.
    pub.close();
  }
  EXPECT_TRUE(freed->load());
  expect_no_leaks();
}

// Allocating pool memory and the host's waits before memory is reused or released run in the relaxed capture mode
// (restored after): a user's CUDA graph capture in global mode (torch.cuda.graph's) would fail on them otherwise.
TEST_F(FakeDriver, PoolAllocationsAndReleaseWaitsRelaxTheCaptureMode) {
  {
    Tensor a = Tensor::empty({3 << 20}, DType::uint8(), Device::cuda(0));  // a VMM segment of its own
    EXPECT_EQ(t_capture_mode, 0) << "the caller's mode is restored";
  }
  {
    tw::Tensor src = Tensor::zeros({3 << 20}, DType::uint8());
    Tensor again = src.to(Device::cuda(0), intptr_t{2});  // reuse from another stream
  }
  tw::cuda::empty_cache();
  const std::string name = ipc_topic("relaxed");
  {
    tw::Publisher pub(name);
    tw::Subscriber sub(name);
    auto freed = std::make_shared<std::atomic<bool>>(false);
    ASSERT_EQ(pub.send(foreign_floats(12, freed)), 1u);
    auto t = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(t);
    const int syncs_before = g_fake->event_syncs + g_fake->ctx_syncs;
    g_fake->events_done = false;  // the release thread must wait for the work queued on the memory
    t.reset();
    d::wait_releases();
    g_fake->events_done = true;
    EXPECT_GT(g_fake->event_syncs + g_fake->ctx_syncs, syncs_before) << "the release thread waited on the host";
  }
  tw::cuda::empty_cache();  // the pool's segments are released (cuMemRelease)
  EXPECT_EQ(g_fake->handles, 0);
  EXPECT_EQ(g_fake->unsafe_unrelaxed, 0);
  EXPECT_EQ(t_capture_mode, 0);
  expect_no_leaks();
}

// Waits (bounded) for `flag`; true when it turned.
bool eventually(const std::atomic<bool>& flag, std::chrono::milliseconds within = std::chrono::seconds(5)) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (!flag.load() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return flag.load();
}

#define TW_SKIP_WITHOUT_UCX()                                                                    \
  do {                                                                                           \
    const std::string tw_why_ = tw::net_detail::ucx_unavailable_reason();                         \
    if (!tw_why_.empty()) GTEST_SKIP() << "UCX cannot run here: " << tw_why_;                     \
  } while (0)

// Waits (bounded) until `n` remote subscribers are connected to `pub`.
bool remote_subscribers_joined(const tw::Publisher& pub, size_t n) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (pub.remote_subscriber_count() < n && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  return pub.remote_subscriber_count() == n;
}

TEST_F(FakeDriver, NetACudaTensorCrossesToARemoteSubscriberStagedAndSaysSo) {
  // Debian's UCX has no CUDA transports: a CUDA tensor crosses packed into pinned host memory (after the producer's
  // stream), lands in host memory, and goes back to the device it came from (or to SubscriberOptions::device).
  TW_SKIP_WITHOUT_UCX();
  const std::string name = ipc_topic("net");
  auto freed = std::make_shared<std::atomic<bool>>(false);
  {
    tw::Publisher pub(name, tw::PublisherOptions{.depth = 8, .listen = "127.0.0.1:0"});
    tw::Subscriber sub(name, tw::SubscriberOptions{.connect = pub.address()});
    tw::Subscriber host(name, tw::SubscriberOptions{.device = Device::cpu(), .connect = pub.address()});
    // A device this process does not have is refused when the subscriber is made, not at its first recv.
    TW_EXPECT_ERROR_MSG(tw::Subscriber(name, tw::SubscriberOptions{.device = Device::cuda(7), .connect = pub.address()}),
                        ErrorCode::invalid_argument, "cuda:7 does not exist");
    TW_EXPECT_ERROR_MSG(tw::Subscriber(name, tw::SubscriberOptions{.device = Device::cuda(7)}),
                        ErrorCode::invalid_argument, "cuda:7 does not exist");
    ASSERT_TRUE(remote_subscribers_joined(pub, 2));
    Tensor loan = pub.loan({4, 6}, DType::float32(), Device::cuda(1));
    auto* f = reinterpret_cast<float*>(loan.data_ptr());
    for (int i = 0; i < 24; ++i) f[i] = static_cast<float>(i) - 3.5f;
    const Tensor view = loan.transpose(0, 1).slice(0, 1, 6, 2);  // strided, offset
    const int syncs = g_fake->syncs;
    g_fake->synced_in.clear();
    tw::SendOptions o;
    o.stream = 1;
    o.metadata.set("k", int64_t{5});
    o.timeout = std::chrono::seconds(5);
    ASSERT_EQ(pub.send(view, o), 2u);
    EXPECT_GT(g_fake->syncs, syncs) << "the host waited for the staging copy before UCX read it";
    EXPECT_FALSE(g_fake->synced_in.empty());
    for (int c : g_fake->synced_in) EXPECT_EQ(c, 1) << "cuda:1's legacy stream, where the copy was queued";
    auto t = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(t);
    EXPECT_EQ(std::string(t->buffer().transport()), "ucx-staged");
    EXPECT_EQ(t->device(), Device::cuda(1)) << "back on the device it was sent from";
    EXPECT_EQ(t->shape(), view.shape());
    EXPECT_EQ(host_values(*t), host_values(view));
    EXPECT_EQ(t->metadata().at("k").as_int(), 5);
    auto h = host.recv(std::chrono::seconds(5));
    ASSERT_TRUE(h);
    EXPECT_EQ(h->device(), Device::cpu());
    EXPECT_EQ(std::string(h->buffer().transport()), "ucx-staged");
    EXPECT_EQ(host_values(*h), host_values(view));
    // A caller's driver allocation: the stacked plane, with its offset.
    Tensor stacked = foreign_floats(12, freed).view({2, 2, 3});
    ASSERT_EQ(pub.send(stacked.select(0, 1), tw::Metadata{}, std::chrono::seconds(5)), 2u);
    stacked = Tensor();
    auto s2 = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(s2);
    EXPECT_EQ(s2->device(), Device::cuda(0));
    EXPECT_EQ(host_values(*s2), (std::vector<float>{6, 7, 8, 9, 10, 11}));
    auto h2 = host.recv(std::chrono::seconds(5));
    ASSERT_TRUE(h2);
    EXPECT_EQ(host_values(*h2), (std::vector<float>{6, 7, 8, 9, 10, 11}));
    t.reset();
    s2.reset();
    d::wait_releases();
  }
  EXPECT_TRUE(eventually(*freed));
  expect_no_leaks();
}

TEST_F(FakeDriver, NetWithOnlyRemoteSubscribersACudaTensorIsStagedStraightFromWhereItIs) {
  // No local subscriber: nothing is copied into the device pool, exported or recorded for one. Each tensor is one
  // copy into pinned memory, which returns with the data there (no second wait for the stream).
  TW_SKIP_WITHOUT_UCX();
  const std::string name = ipc_topic("netonly");
  auto freed = std::make_shared<std::atomic<bool>>(false);
  {
    tw::Publisher pub(name, tw::PublisherOptions{.depth = 8, .listen = "127.0.0.1:0"});
    tw::Subscriber sub(name, tw::SubscriberOptions{.connect = pub.address()});
    ASSERT_TRUE(remote_subscribers_joined(pub, 1));
    tw::SendOptions o;
    o.timeout = std::chrono::seconds(5);
    // A caller's allocation (it has a zero-copy path, which only local subscribers would use), and the same with
    // copy=true (which would copy it into the pool for them).
    for (const std::optional<bool> copy : {std::optional<bool>(), std::optional<bool>(true)}) {
      o.copy = copy;
      const int copies = g_fake->memcpys, records = g_fake->records, syncs = g_fake->syncs;
      const size_t vmm = g_fake->vmm_bytes();
      ASSERT_EQ(pub.send(foreign_floats(6, freed).view({2, 3}), o), 1u);
      EXPECT_EQ(g_fake->memcpys, copies + 1) << "one copy, device to pinned host (copy=" << copy.has_value() << ")";
      EXPECT_EQ(g_fake->syncs, syncs + 1) << "the copy into pinned memory waits; nothing else does";
      EXPECT_EQ(g_fake->vmm_bytes(), vmm) << "no device pool memory taken for subscribers that are not there";
      EXPECT_EQ(g_fake->records, records) << "no interprocess event recorded for subscribers that are not there";
      auto t = sub.recv(std::chrono::seconds(5));
      ASSERT_TRUE(t);
      EXPECT_EQ(std::string(t->buffer().transport()), "ucx-staged");
      EXPECT_EQ(t->device(), Device::cuda(0));
      EXPECT_EQ(host_values(*t), (std::vector<float>{0, 1, 2, 3, 4, 5}));
    }
    // copy=false gives the answer local subscribers would get: a received tensor has no zero-copy path.
    {
      const std::string other = ipc_topic("netonly-src");
      tw::Publisher src(other);
      tw::Subscriber in(other);
      ASSERT_TRUE(in.connected());
      ASSERT_EQ(src.send(foreign_floats(4, std::make_shared<std::atomic<bool>>(false))), 1u);
      auto got = in.recv(std::chrono::seconds(5));
      ASSERT_TRUE(got);
      o.copy = false;
      TW_EXPECT_ERROR_MSG(pub.send(*got, o), ErrorCode::copy_required, "received");
      o.copy = std::nullopt;
    }
    // A message of two CUDA tensors.
    Tensor a = foreign_floats(4, std::make_shared<std::atomic<bool>>(false));
    Tensor b = foreign_floats(8, std::make_shared<std::atomic<bool>>(false)).view({2, 4});
    const int syncs = g_fake->syncs;
    const int copies = g_fake->memcpys;
    tw::Message m;
    m.tensors = {a, b};
    ASSERT_EQ(pub.send(m, o), 1u);
    EXPECT_EQ(g_fake->memcpys, copies + 2);
    EXPECT_EQ(g_fake->syncs, syncs + 2);
    auto r = sub.recv_message(std::chrono::seconds(5));
    ASSERT_TRUE(r);
    ASSERT_EQ(r->message.tensors.size(), 2u);
    EXPECT_EQ(host_values(r->message.tensors[0]), host_values(a));
    EXPECT_EQ(host_values(r->message.tensors[1]), host_values(b));
    EXPECT_EQ(r->message.tensors[1].shape(), b.shape());
    // A local subscriber joins: it gets the next message through CUDA IPC, and the remote one still staged.
    tw::Subscriber local(name);
    ASSERT_TRUE(local.connected());
    ASSERT_EQ(pub.send(foreign_floats(3, std::make_shared<std::atomic<bool>>(false)), o), 2u);
    auto l = local.recv(std::chrono::seconds(5));
    ASSERT_TRUE(l);
    EXPECT_EQ(std::string(l->buffer().transport()), "cuda-ipc");
    auto rr = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(rr);
    EXPECT_EQ(std::string(rr->buffer().transport()), "ucx-staged");
    EXPECT_EQ(host_values(*l), host_values(*rr));
    l.reset();
    d::wait_releases();
  }
  EXPECT_TRUE(eventually(*freed));
  expect_no_leaks();
}

TEST_F(FakeDriver, NetAStagedTensorThatCannotGoBackToItsDeviceIsAnErrorAtRecvAndTheStreamGoesOn) {
  TW_SKIP_WITHOUT_UCX();
  const std::string name = ipc_topic("netback");
  {
    tw::Publisher pub(name, tw::PublisherOptions{.depth = 8, .listen = "127.0.0.1:0"});
    tw::Subscriber sub(name, tw::SubscriberOptions{.connect = pub.address()});
    ASSERT_TRUE(remote_subscribers_joined(pub, 1));
    ASSERT_EQ(pub.send(foreign_floats(6, std::make_shared<std::atomic<bool>>(false)), tw::Metadata{},
                       std::chrono::seconds(5)),
              1u);
    ASSERT_EQ(pub.send(foreign_floats(2, std::make_shared<std::atomic<bool>>(false)), tw::Metadata{},
                       std::chrono::seconds(5)),
              1u);
    tw::cuda::empty_cache();
    g_fake->device_limit = 1;  // cuda:0 has no memory left for the first message to go back to
    TW_EXPECT_ERROR_MSG(sub.recv(std::chrono::seconds(5)), ErrorCode::out_of_memory,
                        "arrived staged through host memory, and cannot go to cuda:0 here");
    g_fake->device_limit = 0;
    auto t = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(t) << "the stream goes on after the refused message";
    EXPECT_EQ(host_values(*t), (std::vector<float>{0, 1}));
    t.reset();
  }
  expect_no_leaks();
}

// A UCX with CUDA transports (the libucx-cu12/cu13 wheels, on a machine with a driver) reads and writes device memory
// itself. TW_NET_CUDA_DIRECT=host stands in for one here: the fake driver's device memory is host memory, and that
// is what UCX is told it is. Set while a publisher or subscriber is made, it decides that one's path (the fixture
// sets TW_NET_CUDA_DIRECT=0 otherwise).
struct CudaDirectNet {
  CudaDirectNet() { ::setenv("TW_NET_CUDA_DIRECT", "host", 1); }
  ~CudaDirectNet() { ::setenv("TW_NET_CUDA_DIRECT", "0", 1); }
};

#if __has_include(<ucp/api/ucp.h>)
TEST_F(FakeDriver, NetTheThreadsThatDriveAUcxWithCudaTransportsHaveACudaContext) {
  // UCX's CUDA transports call the driver from whichever thread drives the worker, without making a context
  // current (a worker's arm then crashes in cuEventQuery: ai-dynamo/nixl#2102). So where UCX has them, a thread
  // with no context gets, while it drives the worker, the one of the first device the process uses through
  // tensorwire (the engine's thread keeps it; a caller's thread in try_run has it for the call only), and none
  // before the process uses a device (no context is created on cuda:0 for UCX's sake).
  TW_SKIP_WITHOUT_UCX();
  namespace n = tw::net_detail;
  struct Probe final : n::Session {  // a session that lets the test run code on the engine's thread, then ends
    std::atomic<bool> finish{false};
    ucs_status_t on_am(unsigned, ucp_ep_h, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) override {
      return UCS_OK;
    }
    void on_ep_error(ucp_ep_h, ucs_status_t) override {}
    bool tick(n::Clock::time_point) override { return !finish; }
  };
  // What is current on the engine's thread; on a new thread that had `caller_had` current, inside try_run and
  // after it.
  const auto contexts = [](d::CUcontext caller_had) {
    Probe probe;
    n::Engine& e = n::Engine::get();
    d::CUcontext on_engine = &g_fake->foreign_ctx, in_call = &g_fake->foreign_ctx, after = &g_fake->foreign_ctx;
    e.attach(&probe, [&] { on_engine = t_current; });
    std::thread([&] {
      t_current = caller_had;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!e.try_run([&] { in_call = t_current; }) && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      after = t_current;
    }).join();
    probe.finish = true;
    e.wake();
    e.detach(&probe);  // (the last session: the worker and its thread go, and the next attach makes new ones)
    return std::tuple{on_engine, in_call, after};
  };
  t_current = nullptr;
  ASSERT_EQ(d::first_retained_context(), nullptr) << "(the fixture's driver is fresh)";
  {
    const CudaDirectNet cuda;  // a UCX with CUDA transports, as far as tensorwire can tell
    const auto [engine, in_call, after] = contexts(nullptr);
    EXPECT_EQ(engine, nullptr) << "no device used through tensorwire yet: no context is made for UCX";
    EXPECT_EQ(in_call, nullptr);
  }
  Tensor used = Tensor::empty({4}, DType::float32(), Device::cuda(1));  // the process uses cuda:1
  if (!n::ucx_cuda_transports()) {  // Debian's UCX (a GPU machine's bundled UCX has CUDA transports)
    const auto [engine, in_call, after] = contexts(nullptr);
    EXPECT_EQ(engine, nullptr) << "no CUDA transports: the engine's thread is left as it is";
    EXPECT_EQ(in_call, nullptr);
  }
  const CudaDirectNet cuda;
  {
    const auto [engine, in_call, after] = contexts(nullptr);
    EXPECT_EQ(engine, d::primary_context(1)) << "the engine's thread gets the device the process uses";
    EXPECT_EQ(in_call, d::primary_context(1)) << "so does a caller's thread while it drives the worker";
    EXPECT_EQ(after, nullptr) << "and is left as it was after the call";
    EXPECT_EQ(t_current, nullptr) << "the thread that made the worker is left as it was";
  }
  {
    const auto [engine, in_call, after] = contexts(d::primary_context(0));
    EXPECT_EQ(in_call, d::primary_context(0)) << "a thread with a context of its own keeps it";
    EXPECT_EQ(after, d::primary_context(0));
  }
  t_current = nullptr;
}
#endif

TEST_F(FakeDriver, NetWithCudaTransportsACudaTensorCrossesInDeviceMemory) {
  TW_SKIP_WITHOUT_UCX();
  const std::string name = ipc_topic("netdirect");
  auto freed = std::make_shared<std::atomic<bool>>(false);
  {
    std::optional<tw::Publisher> pub;
    std::optional<tw::Subscriber> sub, host, to0;
    {
      const CudaDirectNet direct;
      pub.emplace(name, tw::PublisherOptions{.depth = 8, .listen = "127.0.0.1:0"});
      sub.emplace(name, tw::SubscriberOptions{.connect = pub->address()});
      host.emplace(name, tw::SubscriberOptions{.device = Device::cpu(), .connect = pub->address()});
      to0.emplace(name, tw::SubscriberOptions{.device = Device::cuda(0), .connect = pub->address()});
    }
    // A subscriber whose UCX moves host memory only: it receives what the others get in device memory through
    // host memory, and says so.
    tw::Subscriber staged(name, tw::SubscriberOptions{.connect = pub->address()});
    ASSERT_TRUE(remote_subscribers_joined(*pub, 4));
    const auto device_copies = [] { return g_fake->memcpys + g_fake->launches_strided + g_fake->launches_transpose; };
    // 1. A loan on cuda:1, sent whole, of 1 MiB (UCX's rendezvous: the receivers' UCX writes device memory) and of
    //    64 bytes (eager: UCX hands the bytes over in host memory, and they are copied to the device once).
    for (const int64_t n : {int64_t{1} << 18, int64_t{16}}) {
      Tensor loan = pub->loan({n}, DType::float32(), Device::cuda(1));
      auto* f = reinterpret_cast<float*>(loan.data_ptr());
      for (int64_t i = 0; i < n; ++i) f[i] = static_cast<float>(i % 1000) - 0.5f;
      const std::vector<float> want = host_values(loan);
      const int copies = g_fake->memcpys;
      tw::SendOptions o;
      o.stream = 1;
      o.metadata.set("n", n);
      o.timeout = std::chrono::seconds(5);
      ASSERT_EQ(pub->send(std::move(loan), o), 4u);
      EXPECT_EQ(g_fake->memcpys, copies) << "the loan is sent from where it is: nothing packed or staged";
      // A rendezvous lands in device memory; an eager message's bytes come in UCX's host memory, and recv puts
      // them on the device.
      const char* how = n > 1024 ? "ucx-cuda" : "ucx-staged";
      auto t = sub->recv(std::chrono::seconds(5));
      ASSERT_TRUE(t);
      EXPECT_EQ(std::string(t->buffer().transport()), how);
      EXPECT_EQ(t->device(), Device::cuda(1)) << "on the device it was sent from";
      EXPECT_EQ(t->shape(), (tw::Shape{n}));
      EXPECT_EQ(t->metadata().at("n").as_int(), n);
      EXPECT_EQ(host_values(*t), want);
      auto z = to0->recv(std::chrono::seconds(5));
      ASSERT_TRUE(z);
      EXPECT_EQ(std::string(z->buffer().transport()), how);
      EXPECT_EQ(z->device(), Device::cuda(0)) << "on the device the subscriber asked for";
      EXPECT_EQ(host_values(*z), want);
      auto h = host->recv(std::chrono::seconds(5));
      ASSERT_TRUE(h);
      EXPECT_EQ(h->device(), Device::cpu());
      EXPECT_EQ(std::string(h->buffer().transport()), "ucx-staged") << "it asked for host memory";
      EXPECT_EQ(host_values(*h), want);
      auto s = staged.recv(std::chrono::seconds(5));
      ASSERT_TRUE(s);
      EXPECT_EQ(s->device(), Device::cuda(1));
      EXPECT_EQ(std::string(s->buffer().transport()), "ucx-staged") << "its own UCX landed it in host memory";
      EXPECT_EQ(host_values(*s), want);
      // Since the send: host_values' three device copies and the one that puts the staged subscriber's tensor back
      // on cuda:1; under rendezvous nothing else (UCX wrote device memory), eager adds recv's one per device
      // receiver (all on this thread: nothing races the count).
      EXPECT_EQ(g_fake->memcpys, copies + 4 + (n > 1024 ? 0 : 2));
    }
    // 2. A caller's allocation, the stacked plane with its offset; and a strided view. (1 MiB each: rendezvous.)
    constexpr int64_t kPlane = int64_t{1} << 18;
    // copy=true: the caller may reuse its memory when send returns, so even a loan is copied (once, on the device).
    {
      Tensor loan = pub->loan({kPlane}, DType::float32(), Device::cuda(0));
      auto* f = reinterpret_cast<float*>(loan.data_ptr());
      for (int64_t i = 0; i < kPlane; ++i) f[i] = static_cast<float>(i);
      const int copies = device_copies();
      ASSERT_EQ(pub->send(loan, tw::SendOptions{.timeout = std::chrono::seconds(5), .copy = true}), 4u);
      EXPECT_EQ(device_copies(), copies + 1);
      std::fill(f, f + kPlane, -1.0f);  // reused at once
      auto t = sub->recv(std::chrono::seconds(5));
      ASSERT_TRUE(t);
      EXPECT_EQ(std::string(t->buffer().transport()), "ucx-cuda");
      std::vector<float> want(static_cast<size_t>(kPlane));
      for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<float>(i);
      EXPECT_EQ(host_values(*t), want) << "what the loan held when send returned, not what was written after";
      for (auto* other : {&*host, &*to0, &staged}) ASSERT_TRUE(other->recv(std::chrono::seconds(5)));
    }
    Tensor stacked = foreign_floats(2 * kPlane, freed).view({2, 512, 512});
    intptr_t caller = 0x5400;  // the producer's stream (stream=): a non-blocking one, destroyed when send returns
    const auto synced_caller = [&caller] {
      std::lock_guard lk(g_fake->streams_mu);
      return std::count(g_fake->synced_streams.begin(), g_fake->synced_streams.end(), static_cast<uintptr_t>(caller));
    };
    for (const Tensor& x : {stacked.select(0, 1), stacked.select(0, 1).transpose(0, 1)}) {
      caller += 0x10;
      {
        std::lock_guard lk(g_fake->streams_mu);
        g_fake->nonblocking_streams.insert(static_cast<uintptr_t>(caller));
      }
      const int copies = device_copies();
      const auto synced = synced_caller();
      ASSERT_EQ(pub->send(x, tw::SendOptions{.timeout = std::chrono::seconds(5), .stream = caller}), 4u);
      {
        std::lock_guard lk(g_fake->streams_mu);
        g_fake->dead_streams.insert(static_cast<uintptr_t>(caller));
      }
      // A caller's memory is copied once on the device (it may change or free it when send returns), after its
      // stream, which the host waits for before UCX reads; the copy's memory never names that stream again (it
      // goes back to the pool from the net thread, when the remote sends are done).
      EXPECT_EQ(device_copies() - copies, 1) << "one device copy";
      EXPECT_EQ(synced_caller(), synced + 1) << "the host waits for stream= before UCX reads";
      auto t = sub->recv(std::chrono::seconds(5));
      ASSERT_TRUE(t);
      EXPECT_EQ(std::string(t->buffer().transport()), "ucx-cuda");
      EXPECT_EQ(t->device(), Device::cuda(0));
      EXPECT_EQ(t->shape(), x.shape());
      EXPECT_EQ(host_values(*t), host_values(x));
      for (auto* other : {&*host, &*to0, &staged}) ASSERT_TRUE(other->recv(std::chrono::seconds(5)));
    }
    stacked = Tensor();
    // 3. A group crosses staged (UCX would need its parts as an iov of device memory), and says so.
    tw::Message m;
    m.tensors = {foreign_floats(4, std::make_shared<std::atomic<bool>>(false)),
                 foreign_floats(6, std::make_shared<std::atomic<bool>>(false)).view({2, 3})};
    ASSERT_EQ(pub->send(m, tw::SendOptions{.timeout = std::chrono::seconds(5)}), 4u);
    auto r = sub->recv_message(std::chrono::seconds(5));
    ASSERT_TRUE(r);
    ASSERT_EQ(r->message.tensors.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(std::string(r->message.tensors[i].buffer().transport()), "ucx-staged");
      EXPECT_EQ(r->message.tensors[i].device(), Device::cuda(0));
      EXPECT_EQ(host_values(r->message.tensors[i]), host_values(m.tensors[i]));
    }
    for (auto* other : {&*host, &*to0, &staged}) ASSERT_TRUE(other->recv_message(std::chrono::seconds(5)));
    m.tensors.clear();
    r.reset();
    // 4. With a local subscriber too, the remote ones are sent the memory the local one opens, with no copy: the
    //    stacked plane from its offset in a caller's allocation (adopted), and from its offset in a loan.
    {
      tw::Subscriber local(name);
      ASSERT_TRUE(local.connected());
      std::vector<float> second(static_cast<size_t>(kPlane));
      for (size_t i = 0; i < second.size(); ++i) second[i] = static_cast<float>(kPlane + static_cast<int64_t>(i));
      Tensor planes = foreign_floats(2 * kPlane, std::make_shared<std::atomic<bool>>(false)).view({2, 512, 512});
      Tensor loan = pub->loan({2, 512, 512}, DType::float32(), Device::cuda(0));
      auto* f = reinterpret_cast<float*>(loan.data_ptr());
      for (int64_t i = 0; i < 2 * kPlane; ++i) f[i] = static_cast<float>(i);
      for (Tensor* x : {&planes, &loan}) {
        const int copies = device_copies();
        ASSERT_EQ(pub->send(x->select(0, 1), tw::Metadata{}, std::chrono::seconds(5)), 5u);
        EXPECT_EQ(device_copies(), copies);
        *x = Tensor();
        auto l = local.recv(std::chrono::seconds(5));
        ASSERT_TRUE(l);
        EXPECT_EQ(std::string(l->buffer().transport()), x == &loan ? "cuda-vmm" : "cuda-ipc");
        auto t = sub->recv(std::chrono::seconds(5));
        ASSERT_TRUE(t);
        EXPECT_EQ(std::string(t->buffer().transport()), "ucx-cuda");
        EXPECT_EQ(host_values(*t), second);
        EXPECT_EQ(host_values(*l), second);
        for (auto* other : {&*host, &*to0, &staged}) ASSERT_TRUE(other->recv(std::chrono::seconds(5)));
        l.reset();
        d::wait_releases();
      }
      // A loan filled on a side stream and sent with stream=1: stream 1 waits for the side stream's work before
      // the host waits for stream 1 and UCX reads the loan (with a local subscriber, as without).
      {
        constexpr intptr_t kSide = 0x6600;
        {
          std::lock_guard lk(g_fake->streams_mu);
          g_fake->nonblocking_streams.insert(uintptr_t{kSide});
        }
        Tensor side = pub->loan({kPlane}, DType::float32(), Device::cuda(0));
        std::fill_n(reinterpret_cast<float*>(side.data_ptr()), kPlane, 3.0f);
        tw::set_producer_stream(side, kSide);
        const auto on_legacy = [] {  // (stream 1's waits for kSide's work, the host's waits for stream 1)
          std::lock_guard lk(g_fake->streams_mu);
          return std::pair{std::count(g_fake->waited_for.begin(), g_fake->waited_for.end(),
                                      std::pair{uintptr_t{1}, uintptr_t{kSide}}),
                           std::count(g_fake->synced_streams.begin(), g_fake->synced_streams.end(), uintptr_t{1})};
        };
        const auto [waits, syncs] = on_legacy();
        ASSERT_EQ(pub->send(std::move(side), tw::SendOptions{.timeout = std::chrono::seconds(5), .stream = 1}), 5u);
        const auto [waits_after, syncs_after] = on_legacy();
        EXPECT_GE(waits_after - waits, 1) << "stream= waits for the loan's own producer";
        EXPECT_GE(syncs_after - syncs, 1) << "the host waits for stream= before UCX reads";
        auto t = sub->recv(std::chrono::seconds(5));
        ASSERT_TRUE(t);
        EXPECT_EQ(std::string(t->buffer().transport()), "ucx-cuda");
        EXPECT_EQ(host_values(*t), std::vector<float>(static_cast<size_t>(kPlane), 3.0f));
        ASSERT_TRUE(local.recv(std::chrono::seconds(5)));
        for (auto* other : {&*host, &*to0, &staged}) ASSERT_TRUE(other->recv(std::chrono::seconds(5)));
        d::wait_releases();
      }
      // A strided view copied into the pool for the local subscriber (copy=true) is sent from that dense copy:
      // one device copy in all.
      Tensor planes2 = foreign_floats(2 * kPlane, std::make_shared<std::atomic<bool>>(false)).view({2, 512, 512});
      const Tensor view = planes2.select(0, 1).transpose(0, 1);
      const int copies = device_copies();
      ASSERT_EQ(pub->send(view, tw::SendOptions{.timeout = std::chrono::seconds(5), .copy = true}), 5u);
      EXPECT_EQ(device_copies(), copies + 1);
      auto t = sub->recv(std::chrono::seconds(5));
      ASSERT_TRUE(t);
      EXPECT_EQ(std::string(t->buffer().transport()), "ucx-cuda");
      EXPECT_EQ(host_values(*t), host_values(view));
      auto l = local.recv(std::chrono::seconds(5));
      ASSERT_TRUE(l);
      EXPECT_EQ(std::string(l->buffer().transport()), "cuda-copy");
      for (auto* other : {&*host, &*to0, &staged}) ASSERT_TRUE(other->recv(std::chrono::seconds(5)));
      l.reset();
      d::wait_releases();
    }
    sub.reset();
    host.reset();
    to0.reset();
    pub.reset();
  }
  d::wait_releases();  // (received device memory goes back once the device's work is done, off this thread)
  EXPECT_TRUE(eventually(*freed));
  EXPECT_EQ(g_fake->dead_stream_uses, 0) << "a stream was named after its owner destroyed it";
  {
    std::lock_guard lk(g_fake->streams_mu);
    g_fake->dead_streams.clear();
  }
  expect_no_leaks();
}

TEST_F(FakeDriver, NetTheSendersDeviceCopyGoesBackToThePoolWithoutWaitingForTheDevice) {
  // A caller's tensor sent over UCX from device memory is copied once into the pool; once the remote sends are
  // done nothing on the device reads that copy (the host waited for it before UCX read it), so it goes back to the
  // pool at once, not after a device synchronize that a busy GPU would make long. (Subscribers that land in host
  // memory: the only device memory here is the sender's.)
  TW_SKIP_WITHOUT_UCX();
  const std::string name = ipc_topic("netsendcopy");
  std::optional<tw::Publisher> pub;
  {
    const CudaDirectNet direct;
    pub.emplace(name, tw::PublisherOptions{.depth = 4, .listen = "127.0.0.1:0"});
  }
  tw::Subscriber host(name, tw::SubscriberOptions{.device = Device::cpu(), .connect = pub->address()});
  ASSERT_TRUE(remote_subscribers_joined(*pub, 1));
  auto freed = std::make_shared<std::atomic<bool>>(false);
  const Tensor view = foreign_floats(2 * 512 * 512, freed).view({2, 512, 512}).select(0, 1).transpose(0, 1);
  const size_t in_use = tw::cuda::device_pool_stats(0).in_use_bytes;
  const int syncs = g_fake->ctx_syncs;
  ASSERT_EQ(pub->send(view, tw::SendOptions{.timeout = std::chrono::seconds(5), .stream = 1}), 1u);
  auto t = host.recv(std::chrono::seconds(5));
  ASSERT_TRUE(t);
  EXPECT_EQ(host_values(*t), host_values(view));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (tw::cuda::device_pool_stats(0).in_use_bytes > in_use && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(tw::cuda::device_pool_stats(0).in_use_bytes, in_use) << "the copy is back once the sends are done";
  d::wait_releases();
  EXPECT_EQ(g_fake->ctx_syncs, syncs) << "without waiting for the whole device";
  pub.reset();
}

TEST_F(FakeDriver, NetAPublisherWithoutCudaTransportsStagesForASubscriberThatHasThem) {
  // The receiver's UCX writes device memory; what it writes was staged through host memory at the sender: the
  // tensor lands on the device with no copy here, and says it was staged.
  TW_SKIP_WITHOUT_UCX();
  const std::string name = ipc_topic("netdirect-rx");
  {
    tw::Publisher pub(name, tw::PublisherOptions{.depth = 8, .listen = "127.0.0.1:0"});
    std::optional<tw::Subscriber> sub;
    {
      const CudaDirectNet direct;
      sub.emplace(name, tw::SubscriberOptions{.connect = pub.address()});
    }
    ASSERT_TRUE(remote_subscribers_joined(pub, 1));
    Tensor x = foreign_floats(1 << 18, std::make_shared<std::atomic<bool>>(false));
    const int copies = g_fake->memcpys;
    ASSERT_EQ(pub.send(x, tw::Metadata{}, std::chrono::seconds(5)), 1u);
    EXPECT_EQ(g_fake->memcpys, copies + 1) << "staged into pinned memory at the sender, nothing else";
    auto t = sub->recv(std::chrono::seconds(5));
    ASSERT_TRUE(t);
    EXPECT_EQ(g_fake->memcpys, copies + 1) << "landed on the device by UCX, not moved there after";
    EXPECT_EQ(t->device(), Device::cuda(0));
    EXPECT_EQ(std::string(t->buffer().transport()), "ucx-staged");
    EXPECT_EQ(host_values(*t), host_values(x));
    t.reset();
    sub.reset();
  }
  d::wait_releases();
  expect_no_leaks();
}

TEST_F(FakeDriver, IpcASubscriberInThePublishersProcessUsesItsHandlesWithoutOpeningThem) {
  // The real driver opens no IPC handle in the process that exported it: a subscriber of a publisher in its own
  // process takes the publisher's event and allocation as they are (VMM memory is imported from its fd as usual).
  tw::ipc_detail::set_local_shortcut(true);
  g_fake->one_process = true;
  const std::string name = ipc_topic("oneprocess");
  auto freed = std::make_shared<std::atomic<bool>>(false), freed_queued = std::make_shared<std::atomic<bool>>(false);
  std::optional<Tensor> kept;
  {
    tw::Publisher pub(name);
    tw::Subscriber sub(name);
    ASSERT_TRUE(sub.connected());
    // A caller's cudaMalloc allocation (a legacy handle): the stacked plane, with its offset, on a stream.
    constexpr intptr_t kCaller = 0x5400;
    tw::SendOptions o;
    o.stream = kCaller;
    Tensor stacked = foreign_floats(12, freed).view({2, 2, 3});
    ASSERT_EQ(pub.send(stacked.select(0, 1), o), 1u);
    stacked = Tensor();
    const size_t waits = g_fake->waited.size();
    auto t = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(t);
    EXPECT_EQ(std::string(t->buffer().transport()), "cuda-ipc");
    EXPECT_EQ(host_values(*t), (std::vector<float>{6, 7, 8, 9, 10, 11}));
    EXPECT_EQ(g_fake->ipc_open_tries.load(), 0) << "a handle of this process was opened";
    EXPECT_EQ(g_fake->ipc_event_open_tries.load(), 0) << "an event handle of this process was opened";
    // The receive stream waits on the publisher's own event, recorded on the caller's stream.
    bool waited_on_it = false;
    for (size_t i = waits; i < g_fake->waited.size(); ++i) {
      const auto it = g_fake->event_stream.find(g_fake->waited[i].second);
      waited_on_it |= it != g_fake->event_stream.end() && it->second == uintptr_t{kCaller};
    }
    EXPECT_TRUE(waited_on_it) << "the subscriber's stream did not wait on the event the publisher recorded";
    ASSERT_TRUE(t->stream());
    EXPECT_NE(*t->stream(), tw::cuda::kLegacyStream) << "on the receive stream, after the event";
    // Re-sent from here, the received tensor is found in the publisher's own slot of that allocation (its address
    // is the allocation's): it crosses again without a copy, and is not kept twice (its lease holds the slot).
    ASSERT_EQ(pub.send(*t), 1u);
    auto again = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(again);
    EXPECT_EQ(host_values(*again), (std::vector<float>{6, 7, 8, 9, 10, 11}));
    again.reset();
    // A device loan (the pool's VMM memory): imported from its fd.
    Tensor loan = pub.loan({2, 3}, DType::float32(), Device::cuda(0));
    auto* f = reinterpret_cast<float*>(loan.data_ptr());
    for (int i = 0; i < 6; ++i) f[i] = static_cast<float>(10 * i);
    ASSERT_EQ(pub.send(std::move(loan)), 1u);
    auto l = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(l);
    EXPECT_EQ(std::string(l->buffer().transport()), "cuda-vmm");
    EXPECT_EQ(host_values(*l), (std::vector<float>{0, 10, 20, 30, 40, 50}));
    // Queued when the publisher closes: still readable, and the caller's memory stays until the subscriber lets go.
    ASSERT_EQ(pub.send(foreign_floats(4, freed_queued)), 1u);
    pub.close();
    auto q = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(q);
    // Its segment went with the publisher, which waited for its event then: nothing is left to wait for.
    EXPECT_EQ(q->stream(), std::optional<intptr_t>(tw::cuda::kLegacyStream));
    EXPECT_EQ(host_values(*q), (std::vector<float>{0, 1, 2, 3}));
    EXPECT_EQ(host_values(*t), (std::vector<float>{6, 7, 8, 9, 10, 11}));
    EXPECT_FALSE(freed->load());
    EXPECT_FALSE(freed_queued->load());
    kept = std::move(q);
    t.reset();
    l.reset();
  }
  d::wait_releases();
  EXPECT_TRUE(eventually(*freed));
  EXPECT_FALSE(freed_queued->load()) << "a received tensor still reads it";
  EXPECT_EQ(host_values(*kept), (std::vector<float>{0, 1, 2, 3})) << "outlives its subscriber and publisher";
  kept.reset();
  d::wait_releases();
  EXPECT_TRUE(eventually(*freed_queued));
  expect_no_leaks();
}

TEST_F(FakeDriver, IpcAViewOfATensorReceivedInThePublishersProcessSentAgainDoesNotHoldItsSlotForEver) {
  // What a framework's import of a received tensor makes (torch.from_dlpack, then tw.asarray of a slice of it) is a
  // Buffer of its own, naming no transport, that keeps the received tensor alive. Sent again through the publisher
  // it came from, it is found in the same slot; kept there, it would keep its own lease, and so the slot and the
  // caller's allocation, for ever.
  tw::ipc_detail::set_local_shortcut(true);
  g_fake->one_process = true;
  const std::string name = ipc_topic("rewrapped");
  auto freed = std::make_shared<std::atomic<bool>>(false);
  {
    tw::Publisher pub(name);
    tw::Subscriber sub(name);
    ASSERT_TRUE(sub.connected());
    ASSERT_EQ(pub.send(foreign_floats(12, freed)), 1u);
    auto r = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(r);
    std::shared_ptr<void> holder = std::make_shared<Tensor>(*r);
    auto wrapped = std::make_shared<tw::Buffer>(static_cast<float*>(r->data_ptr()) + 1, 20, Device::cuda(0),
                                                std::move(holder));
    ASSERT_EQ(pub.send(Tensor::make(std::move(wrapped), tw::Layout{DType::float32(), {5}, {1}, 0, false}, false)),
              1u);
    r.reset();
    auto again = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(again);
    EXPECT_EQ(host_values(*again), (std::vector<float>{1, 2, 3, 4, 5}));
    again.reset();
    d::wait_releases();
    pub.close();
    EXPECT_TRUE(eventually(*freed)) << "the slot kept a tensor that holds a lease on it: the allocation never goes";
    EXPECT_EQ(tw::ipc_detail::lingering_foreign_allocations(), 0u);
  }
  expect_no_leaks();
}

TEST_F(FakeDriver, IpcATensorMovedToTheSubscribersDeviceIsItsOwnMemoryAndCrossesAgainWithoutACopy) {
  // A subscriber that asks for cuda:1 gets a cuda:0 tensor copied into tensorwire's pool there: it still says how
  // it came, but its memory is this process's own, not the publisher's, so it crosses on without a copy.
  const std::string a = ipc_topic("moved-a"), b = ipc_topic("moved-b");
  auto freed = std::make_shared<std::atomic<bool>>(false);
  {
    tw::Publisher pa(a);
    tw::Subscriber sa(a, tw::SubscriberOptions{.device = Device::cuda(1)});
    tw::Publisher pb(b);
    tw::Subscriber sb(b);
    ASSERT_TRUE(sa.connected() && sb.connected());
    ASSERT_EQ(pa.send(foreign_floats(6, freed)), 1u);
    auto moved = sa.recv(std::chrono::seconds(5));
    ASSERT_TRUE(moved);
    EXPECT_EQ(moved->device(), Device::cuda(1));
    EXPECT_EQ(std::string(moved->buffer().transport()), "cuda-ipc");
    tw::SendOptions never;
    never.copy = false;
    ASSERT_EQ(pb.send(*moved, never), 1u);
    auto there = sb.recv(std::chrono::seconds(5));
    ASSERT_TRUE(there);
    EXPECT_EQ(std::string(there->buffer().transport()), "cuda-vmm");
    EXPECT_EQ(host_values(*there), (std::vector<float>{0, 1, 2, 3, 4, 5}));
    // (Memory opened from another process is still refused: IpcCopiesWhatHasNoZeroCopyPathAndRefusesWithCopyFalse.)
    moved.reset();
    there.reset();
    d::wait_releases();
  }
  EXPECT_TRUE(eventually(*freed));
  expect_no_leaks();
}

TEST_F(FakeDriver, IpcAMessageQueuedByAPublisherGoneFromThisProcessIsReadAfterItsEventIsForgotten) {
  // The registry of this process's CUDA events is purged of gone segments' entries as it grows. A message queued
  // by a closed publisher names such an event: its segment waited for it when it went, so the subscriber has
  // nothing to wait for, and must not try to open the handle (the driver refuses it in this process). The newest
  // thousands of gone events are remembered (a purge that dropped them all, at 64 entries, failed this).
  tw::ipc_detail::set_local_shortcut(true);
  g_fake->one_process = true;
  const std::string a = ipc_topic("forgotten-a"), b = ipc_topic("forgotten-b");
  auto freed = std::make_shared<std::atomic<bool>>(false);
  {
    tw::Publisher pa(a);
    tw::Subscriber sa(a);
    ASSERT_TRUE(sa.connected());
    ASSERT_EQ(pa.send(foreign_floats(4, freed)), 1u);
    pa.close();
    // Another publisher here makes 80 segments, each with its event, while its subscriber holds them all.
    tw::Publisher pb(b);
    tw::Subscriber sb(b);
    ASSERT_TRUE(sb.connected());
    std::vector<Tensor> held;
    for (int i = 0; i < 80; ++i) {
      ASSERT_EQ(pb.send(foreign_floats(2, std::make_shared<std::atomic<bool>>(false))), 1u);
      auto x = sb.recv(std::chrono::seconds(5));
      ASSERT_TRUE(x);
      held.push_back(std::move(*x));
    }
    const int tries = g_fake->ipc_event_open_tries.load();
    auto q = sa.recv(std::chrono::seconds(5));
    ASSERT_TRUE(q) << "a message queued before its publisher closed could not be read";
    EXPECT_EQ(host_values(*q), (std::vector<float>{0, 1, 2, 3}));
    EXPECT_EQ(g_fake->ipc_event_open_tries.load(), tries);
    q.reset();
    held.clear();
    d::wait_releases();
  }
  EXPECT_TRUE(eventually(*freed));
  expect_no_leaks();
}

TEST_F(FakeDriver, IpcACallersAllocationAMessageNamesIsNotRetiredForItsNextPart) {
  // A caller's allocation slot has no loan, lease or hold until the message is pushed; a pool short of room for the
  // next part must not retire it to make that room. A caller's allocation is not the pool's memory (pool_bytes
  // does not count it), and when the message's own parts hold every buffer, the send says so instead of waiting.
  const std::string name = ipc_topic("reserved");
  auto freed = std::make_shared<std::atomic<bool>>(false);
  const auto message = [&] {
    tw::Message m;
    m.kind = tw::Message::Kind::dict;
    m.keys = {"features", "ids"};
    m.tensors = {foreign_floats(size_t{1} << 19, freed), Tensor::copy_of<int64_t>(std::vector<int64_t>{7, 8, 9}, {3})};
    return m;
  };
  {
    tw::Publisher pub(name, tw::PublisherOptions{.pool_bytes = size_t{1} << 20});  // half the caller's 2 MiB
    tw::Subscriber sub(name);
    ASSERT_TRUE(sub.connected());
    ASSERT_EQ(pub.send(message(), tw::Metadata{}, std::chrono::seconds(5)), 1u);
    auto r = sub.recv_message(std::chrono::seconds(5));
    ASSERT_TRUE(r);
    ASSERT_EQ(r->message.tensors.size(), 2u);
    EXPECT_EQ(std::string(r->message.tensors[0].buffer().transport()), "cuda-ipc");
    const std::vector<float> got = host_values(r->message.tensors[0]);
    ASSERT_EQ(got.size(), size_t{1} << 19);
    EXPECT_EQ(got[12345], 12345.0f);
    EXPECT_EQ(r->message.tensors[1].data<const int64_t>()[2], 9);
    r.reset();
    d::wait_releases();
  }
  EXPECT_TRUE(eventually(*freed));
  freed->store(false);
  {
    tw::Publisher pub(name, tw::PublisherOptions{.max_buffers = 1});
    tw::Subscriber sub(name);
    ASSERT_TRUE(sub.connected());
    TW_EXPECT_ERROR_MSG(pub.send(message(), tw::Metadata{}, std::chrono::seconds(5)), ErrorCode::invalid_argument,
                        "need more pool buffers than max_buffers (1)");
    EXPECT_FALSE(sub.recv(std::chrono::milliseconds(0))) << "nothing was sent";
  }
  EXPECT_TRUE(eventually(*freed));
  expect_no_leaks();
}

TEST_F(FakeDriver, IpcTwoPublishersInOneProcessSendingOneAllocationKeepEachOthersSubscribersWorking) {
  // Each publisher's segment of the allocation vouches for it: one letting go must not strand the other's
  // subscriber in this process.
  tw::ipc_detail::set_local_shortcut(true);
  g_fake->one_process = true;
  const std::string a = ipc_topic("shared-a"), b = ipc_topic("shared-b");
  auto freed = std::make_shared<std::atomic<bool>>(false);
  {
    Tensor x = foreign_floats(6, freed);
    tw::Publisher pa(a);
    tw::Subscriber sa(a);
    ASSERT_TRUE(sa.connected());
    ASSERT_EQ(pa.send(x), 1u);  // queued for sa: a's segment of the allocation stays
    // Re-sent while held, in a new Buffer each time (as every send from Python imports the tensor anew), the
    // memory is kept once, not once per send.
    auto wrappers = std::make_shared<int>(0);
    for (int i = 0; i < 3; ++i) {
      auto again = std::make_shared<tw::Buffer>(x.data_ptr(), x.buffer().size(), Device::cuda(0), wrappers);
      ASSERT_EQ(pa.send(Tensor::make(std::move(again), x.layout(), false)), 1u);
    }
    EXPECT_EQ(wrappers.use_count(), 1) << "a re-sent range was kept again";
    {
      tw::Publisher pb(b);
      tw::Subscriber sb(b);
      ASSERT_TRUE(sb.connected());
      ASSERT_EQ(pb.send(x), 1u);
      auto other = sb.recv(std::chrono::seconds(5));
      ASSERT_TRUE(other);
      EXPECT_EQ(host_values(*other), (std::vector<float>{0, 1, 2, 3, 4, 5}));
      other.reset();
      d::wait_releases();
    }  // b's segment of the allocation is gone
    auto again = sa.recv(std::chrono::seconds(5));
    ASSERT_TRUE(again) << "a's subscriber lost the allocation when b let go of it";
    EXPECT_EQ(host_values(*again), (std::vector<float>{0, 1, 2, 3, 4, 5}));
    again.reset();
    d::wait_releases();
  }
  EXPECT_TRUE(eventually(*freed));
  expect_no_leaks();
}

TEST_F(FakeDriver, NetALocalSubscriberThatJoinsWhileASendWaitsForARemoteOneGetsTheMessage) {
  // The send waits for a remote subscriber's credit; a local subscriber joins meanwhile. Who is there is counted
  // after the wait, so the CUDA tensor is not prepared for the remote subscriber alone.
  TW_SKIP_WITHOUT_UCX();
  const std::string name = ipc_topic("netjoin");
  {
    tw::Publisher pub(name, tw::PublisherOptions{.depth = 1, .listen = "127.0.0.1:0"});
    tw::Subscriber remote(name, tw::SubscriberOptions{.connect = pub.address()});
    ASSERT_TRUE(remote_subscribers_joined(pub, 1));
    ASSERT_EQ(pub.send(foreign_floats(2, std::make_shared<std::atomic<bool>>(false)), tw::Metadata{},
                       std::chrono::seconds(5)),
              1u);  // the remote subscriber's only credit
    Tensor x = foreign_floats(3, std::make_shared<std::atomic<bool>>(false));
    std::atomic<size_t> delivered{99};
    std::thread sender([&] { delivered = pub.send(x, tw::Metadata{}, std::chrono::seconds(10)); });
    // The premise: the send waits for credit (a probe that times out behind it says what that send waits for).
    bool waiting = false;
    for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
         !waiting && std::chrono::steady_clock::now() < until;) {
      try {
        pub.loan({1}, DType::uint8(), std::chrono::milliseconds(1));
      } catch (const tw::TimeoutError& e) {
        waiting = std::string(e.what()).find("which waits because") != std::string::npos;
      }
      if (!waiting) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(waiting) << "the send never waited for the remote subscriber's credit";
    tw::Subscriber local(name);
    ASSERT_TRUE(local.connected());
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (pub.subscriber_count() < 2 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    auto first = remote.recv(std::chrono::seconds(5));
    ASSERT_TRUE(first);
    auto second = remote.recv(std::chrono::seconds(5));  // gives the credit back, then gets the waiting message
    ASSERT_TRUE(second);
    sender.join();
    EXPECT_EQ(delivered.load(), 2u);
    auto l = local.recv(std::chrono::seconds(5));
    ASSERT_TRUE(l) << "the local subscriber that joined during the wait got nothing";
    EXPECT_EQ(host_values(*l), (std::vector<float>{0, 1, 2}));
    EXPECT_EQ(host_values(*second), (std::vector<float>{0, 1, 2}));
    l.reset();
    first.reset();
    second.reset();
    d::wait_releases();
  }
  expect_no_leaks();
}

TEST_F(FakeDriver, IpcEveryTensorSentFromAnAdoptedAllocationIsKeptUntilItsSubscribersLetGo) {
  // PyTorch's caching allocator packs tensors into one cudaMalloc allocation. The first sent adopts it; a second
  // tensor of the same allocation is found there, and must be kept too: dropped by its caller while a subscriber
  // reads it, its block would go to the next tensor.
  const std::string name = ipc_topic("twoinone");
  auto freed = std::make_shared<std::atomic<bool>>(false);
  {
    tw::Publisher pub(name);
    tw::Subscriber sub(name);
    ASSERT_TRUE(sub.connected());
    Tensor whole = foreign_floats(12, freed);
    const auto part = [&](int64_t first, const std::shared_ptr<std::atomic<bool>>& released) {
      std::shared_ptr<void> owner(whole.buffer_ptr().get(), [keep = whole.buffer_ptr(), released](void*) {
        released->store(true);  // the "tensor" goes back to its allocator here
      });
      auto b = std::make_shared<tw::Buffer>(static_cast<float*>(whole.data_ptr()) + first, 24, Device::cuda(0),
                                            std::move(owner));
      return Tensor::make(std::move(b), tw::Layout{DType::float32(), {6}, {1}, 0, false}, false);
    };
    auto a_released = std::make_shared<std::atomic<bool>>(false), b_released = std::make_shared<std::atomic<bool>>(false);
    ASSERT_EQ(pub.send(part(0, a_released)), 1u);  // adopts the allocation
    ASSERT_EQ(pub.send(part(6, b_released)), 1u);  // found in it
    auto ra = sub.recv(std::chrono::seconds(5));
    auto rb = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(ra && rb);
    EXPECT_FALSE(a_released->load());
    EXPECT_FALSE(b_released->load()) << "the second tensor of the allocation was let go under its subscriber";
    EXPECT_EQ(host_values(*rb), (std::vector<float>{6, 7, 8, 9, 10, 11}));
    ra.reset();
    rb.reset();
    d::wait_releases();
    whole = Tensor();
    pub.close();  // (lets go of what no lease holds)
    EXPECT_TRUE(a_released->load() && b_released->load());
  }
  EXPECT_TRUE(eventually(*freed));
  expect_no_leaks();
}

TEST_F(FakeDriver, IpcAClosedPublisherKeepsACallersAllocationUntilItsSubscribersLetGo) {
  // Closing (or destroying) the publisher must not free or recycle the caller's memory under a subscriber still
  // reading it: with PyTorch's caching allocator that memory would be handed to the next tensor at once.
  const std::string name = ipc_topic("linger");
  auto freed = std::make_shared<std::atomic<bool>>(false), other_freed = std::make_shared<std::atomic<bool>>(false);
  std::optional<Tensor> t;
  {
    auto pub = std::make_unique<tw::Publisher>(name);
    auto sub = std::make_unique<tw::Subscriber>(name);
    tw::Subscriber idle(name);  // never keeps what it receives: it must not keep anything alive
    {
      ASSERT_TRUE(sub->connected());
      ASSERT_TRUE(idle.connected());
      Tensor stacked = foreign_floats(12, freed).view({2, 2, 3});
      ASSERT_EQ(pub->send(stacked.select(0, 1)), 2u);
      stacked = Tensor();
      t = sub->recv(std::chrono::seconds(5));
      ASSERT_TRUE(t);
      while (idle.recv(std::chrono::milliseconds(0))) {
      }
      Tensor unheld = foreign_floats(4, other_freed);  // sent, read and released before close: freed by close
      ASSERT_EQ(pub->send(unheld), 2u);
      unheld = Tensor();
      ASSERT_TRUE(sub->recv(std::chrono::seconds(5)));
      while (idle.recv(std::chrono::milliseconds(0))) {
      }
      EXPECT_EQ(tw::ipc_detail::lingering_foreign_allocations(), 0u);
      pub.reset();
    }  // the publisher closes and is destroyed here
    EXPECT_TRUE(eventually(*other_freed)) << "an allocation nobody holds goes with the publisher";
    EXPECT_FALSE(freed->load()) << "freed under a subscriber that still holds the tensor";
    EXPECT_EQ(tw::ipc_detail::lingering_foreign_allocations(), 1u);
    EXPECT_EQ(host_values(*t), (std::vector<float>{6, 7, 8, 9, 10, 11}));
    sub->close();  // closed, but the tensor's lease keeps the subscriber's claim
    sub.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    EXPECT_FALSE(freed->load()) << "the received tensor is still alive";
    EXPECT_EQ(host_values(*t), (std::vector<float>{6, 7, 8, 9, 10, 11}));
    t.reset();  // the last lease goes: the subscriber's socket closes, the allocation is let go
    EXPECT_TRUE(eventually(*freed)) << "kept after every subscriber let go";
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (tw::ipc_detail::lingering_foreign_allocations() != 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(tw::ipc_detail::lingering_foreign_allocations(), 0u);
  expect_no_leaks();
}

size_t recorded_on(intptr_t stream) {
  std::lock_guard lk(g_fake->streams_mu);
  return g_fake->recorded_on.count(static_cast<uintptr_t>(stream));
}

TEST_F(FakeDriver, PoolMemoryOrderedOnACallersStreamComesBackAfterThatStreamIsGone) {
  // Blocks taken for work on a caller's stream s are in s's order. The caller may destroy s once the work is queued
  // (CuPy and Numba do when the stream object goes): a copy's scratch block must come back without naming s; a
  // result's block too when s is a blocking stream (the legacy stream follows it); with a non-blocking s the pool
  // finds it gone and waits for the device. No block may be leaked.
  constexpr intptr_t kCaller = 0x5200, kSide = 0x5210;
  g_fake->nonblocking_streams.insert(uintptr_t{kSide});
  std::mt19937 rng(12);
  const Tensor host = random_host({640, 480}, DType::float32(), rng);  // > kSlabMax: blocks of their own
  const int ctx_syncs = g_fake->ctx_syncs;
  {
    // Into every other column of a device tensor: the rows land dense in a scratch block, then a kernel scatters.
    Tensor big = Tensor::empty({640, 960}, DType::float32(), Device::cuda(0));
    Tensor cols = big.slice(1, 0, std::nullopt, 2);
    const int launches = g_fake->launches_strided + g_fake->launches_transpose;
    tw::device_runtime().copy(host, cols, kSide);
    EXPECT_GT(g_fake->launches_strided + g_fake->launches_transpose, launches) << "the scratch path ran";
    Tensor g = host.to(Device::cuda(0), kCaller, std::nullopt);  // a result whose block is in kCaller's order
    Tensor side = host.to(Device::cuda(0), kSide, std::nullopt);
    g_fake->dead_streams.insert(kCaller);
    g_fake->dead_streams.insert(kSide);
    d::poll_pending();  // the work is done: the scratch block goes back
    EXPECT_EQ(g_fake->ctx_syncs, ctx_syncs) << "the scratch block needed no wait at all";
    EXPECT_TRUE(same_values(cols.to(Device::cpu()), host));
    EXPECT_TRUE(same_values(g.to(Device::cpu()), host)) << "read after its ready event, not the dead stream";
    EXPECT_TRUE(same_values(side.to(Device::cpu()), host));
    const size_t legacy_now = recorded_on(tw::cuda::kLegacyStream);
    g = Tensor();
    EXPECT_EQ(recorded_on(tw::cuda::kLegacyStream), legacy_now + 1) << "a blocking stream's block: on legacy";
    EXPECT_EQ(g_fake->ctx_syncs, ctx_syncs);
  }
  EXPECT_EQ(g_fake->ctx_syncs, ctx_syncs + 1) << "the non-blocking stream is gone: the device was waited for once";
  tw::cuda::empty_cache();
  EXPECT_EQ(tw::cuda::device_pool_stats(0).in_use_bytes, 0u);
  EXPECT_EQ(tw::cuda::device_pool_stats(0).reserved_bytes, 0u) << "a block was leaked (poisoned) instead";
  g_fake->dead_streams.erase(kSide);
  g_fake->dead_streams.erase(kCaller);

  // Stream 2 is the per-thread default stream of whichever thread names it: a block allocated on thread A's and
  // released on thread B gets its free event on the legacy stream (which orders after every thread's), never on B's.
  std::optional<Tensor> on_a;
  std::thread([&] { on_a = host.to(Device::cuda(0), tw::cuda::kPerThreadStream, std::nullopt); }).join();
  ASSERT_TRUE(on_a);
  d::poll_pending();  // the copy's hold lets go of it
  const size_t per_thread = recorded_on(tw::cuda::kPerThreadStream), legacy = recorded_on(tw::cuda::kLegacyStream);
  std::thread([&] { on_a.reset(); }).join();
  EXPECT_EQ(recorded_on(tw::cuda::kPerThreadStream), per_thread) << "recorded on another thread's stream";
  EXPECT_EQ(recorded_on(tw::cuda::kLegacyStream), legacy + 1);
  // Its next user on thread B's stream waits for that event: a 2 is never the same stream as a cached block's.
  const size_t waits = g_fake->waited.size();
  std::thread([&] { Tensor again = host.to(Device::cuda(0), tw::cuda::kPerThreadStream, std::nullopt); }).join();
  EXPECT_GT(g_fake->waited.size(), waits);
  tw::cuda::empty_cache();
  EXPECT_EQ(tw::cuda::device_pool_stats(0).reserved_bytes, 0u);
}

TEST_F(FakeDriver, IpcALeaseGoesBackOnlyAfterTheConsumersWorkIsDone) {
  // A consumer imports a received tensor on its stream, queues kernels on it and drops the tensor at once (as
  // PyTorch does with DLPack memory: the deleter runs when the Python object goes, not when the kernels finish).
  // The publisher must not get the buffer back, to write the next message into it, before those kernels are done.
  const std::string name = ipc_topic("release");
  constexpr intptr_t kConsumerStream = 0x5150;
  tw::Publisher pub(name, tw::PublisherOptions{.max_buffers = 1});
  tw::Subscriber sub(name);
  ASSERT_TRUE(sub.connected());
  const auto send_one = [&](std::chrono::milliseconds within) {
    Tensor loan = pub.loan({4, 6}, DType::float32(), Device::cuda(0), within);
    ASSERT_EQ(pub.send(loan), 1u);
  };
  send_one(std::chrono::seconds(5));

  // 1. Exported with the consumer's stream: the release waits for an event recorded on that stream.
  auto t = sub.recv(std::chrono::seconds(5));
  ASSERT_TRUE(t);
  tw::ExportRequest r;
  r.stream = kConsumerStream;
  DLManagedTensorVersioned* m = tw::export_dlpack(*t, r);
  const size_t before = recorded_on(kConsumerStream);
  const int event_syncs = g_fake->event_syncs.load();
  g_fake->work_running = true;  // the consumer's kernels are still running
  t.reset();
  m->deleter(m);
  EXPECT_EQ(recorded_on(kConsumerStream), before + 1) << "an event on the consumer's stream orders the release";
  EXPECT_THROW(send_one(std::chrono::milliseconds(100)), tw::TimeoutError)
      << "the publisher got the buffer back while the consumer's kernels still read it";
  g_fake->work_running = false;
  send_one(std::chrono::seconds(5));  // the work is done: the buffer is free again
  EXPECT_GT(g_fake->event_syncs.load(), event_syncs);
  EXPECT_EQ(g_fake->ctx_syncs.load(), 0) << "named streams never wait for the whole device";

  // 2. A raw pointer (the CUDA Array Interface, data_ptr) names no stream: the release waits for the whole device.
  t = sub.recv(std::chrono::seconds(5));
  ASSERT_TRUE(t);
  t->buffer().mark_escaped();
  g_fake->work_running = true;
  t.reset();
  EXPECT_THROW(send_one(std::chrono::milliseconds(100)), tw::TimeoutError);
  g_fake->work_running = false;
  send_one(std::chrono::seconds(5));
  EXPECT_GE(g_fake->ctx_syncs.load(), 1);

  // 3. Nobody exported it: its receive stream is still ordered before the release.
  t = sub.recv(std::chrono::seconds(5));
  ASSERT_TRUE(t);
  ASSERT_TRUE(t->stream().has_value());
  const auto receive_stream = static_cast<intptr_t>(*t->stream());
  const size_t on_receive = recorded_on(receive_stream);
  t.reset();
  EXPECT_EQ(recorded_on(receive_stream), on_receive + 1) << "the receive stream's work orders the release";
  send_one(std::chrono::seconds(5));
  pub.close();
  sub.close();
  expect_no_leaks();
}

TEST_F(FakeDriver, IpcEveryLayoutOfALoanArrivesBitExact) {
  const std::string name = ipc_topic("loan");
  {
    tw::Publisher pub(name, tw::PublisherOptions{.depth = 16});
    tw::Subscriber sub(name);
    ASSERT_TRUE(sub.connected());
    Tensor loan = pub.loan({4, 6}, DType::float32(), Device::cuda(0));
    EXPECT_EQ(loan.device(), Device::cuda(0));
    EXPECT_TRUE(pub.owns(loan));
    auto* f = reinterpret_cast<float*>(loan.data_ptr());
    for (int i = 0; i < 24; ++i) f[i] = static_cast<float>(i);
    const std::vector<float> all = host_values(loan);
    std::vector<Tensor> views = {loan, loan.transpose(0, 1), loan.slice(1, 1, 6, 2), loan.slice(0, std::nullopt, std::nullopt, -1),
                                 loan.select(1, 2), loan.slice(0, 0, 1).expand({3, 6})};
    for (const Tensor& v : views) {
      tw::SendOptions o;
      o.stream = 1;
      ASSERT_EQ(pub.send(v, o), 1u);
      auto t = sub.recv(std::chrono::seconds(5));
      ASSERT_TRUE(t);
      EXPECT_EQ(std::string(t->buffer().transport()), "cuda-vmm");
      EXPECT_EQ(t->shape(), v.shape());
      EXPECT_EQ(t->strides(), v.strides());
      EXPECT_EQ(host_values(*t), host_values(v));
      EXPECT_NE(t->data_ptr(), v.data_ptr()) << "imported at an address of its own";
    }
    EXPECT_EQ(host_values(loan), all);
  }
  expect_no_leaks();
}

TEST_F(FakeDriver, IpcCopiesWhatHasNoZeroCopyPathAndRefusesWithCopyFalse) {
  const std::string a = ipc_topic("first"), b = ipc_topic("second");
  auto freed = std::make_shared<std::atomic<bool>>(false);
  {
    tw::Publisher pub_a(a);
    tw::Subscriber sub_a(a);
    tw::Publisher pub_b(b);
    tw::Subscriber sub_b(b);
    ASSERT_TRUE(sub_a.connected() && sub_b.connected());
    pub_a.send(foreign_floats(8, freed));
    auto got = sub_a.recv(std::chrono::seconds(5));
    ASSERT_TRUE(got);
    // A received tensor belongs to the other process: re-sending it needs one copy.
    tw::SendOptions never;
    never.copy = false;
    try {
      pub_b.send(*got, never);
      ADD_FAILURE() << "copy=false sent a received tensor";
    } catch (const tw::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::copy_required);
      EXPECT_NE(std::string(e.what()).find("received"), std::string::npos) << e.what();
    }
    const int copies = g_fake->memcpys;
    ASSERT_EQ(pub_b.send(*got), 1u);
    auto again = sub_b.recv(std::chrono::seconds(5));
    ASSERT_TRUE(again);
    EXPECT_EQ(std::string(again->buffer().transport()), "cuda-copy");
    EXPECT_EQ(g_fake->memcpys, copies + 1) << "exactly one device-to-device copy";
    EXPECT_EQ(host_values(*again), host_values(*got));
    // copy=true copies even what could cross without one.
    tw::SendOptions always;
    always.copy = true;
    pub_a.send(foreign_floats(4, std::make_shared<std::atomic<bool>>(false)), always);
    auto copied = sub_a.recv(std::chrono::seconds(5));
    ASSERT_TRUE(copied);
    EXPECT_EQ(std::string(copied->buffer().transport()), "cuda-copy");
    EXPECT_EQ(host_values(*copied), (std::vector<float>{0, 1, 2, 3}));
  }
  // (a lease goes back on the release thread: the publisher may have handed the allocation to the lingering
  // list at close, which lets it go once it sees the release)
  EXPECT_TRUE(eventually(*freed));
  expect_no_leaks();
}

// A tensor imported with a producer's stream that is destroyed before `send`: the interprocess event is recorded
// on tensorwire's own stream after the import's event, not on the dead stream.
TEST_F(FakeDriver, IpcATensorWhoseProducersStreamIsGoneIsSentAfterItsImportEvent) {
  constexpr intptr_t kProducer = 0x5000;
  const std::string name = ipc_topic("deadstream");
  {
    tw::Publisher pub(name);
    tw::Subscriber sub(name);
    ASSERT_TRUE(sub.connected());
    Tensor f = foreign_floats(6, std::make_shared<std::atomic<bool>>(false));
    tw::InterfaceDesc desc;
    desc.protocol = "__cuda_array_interface__";
    desc.typestr = "<f4";
    desc.shape = {3};
    desc.byte_strides = std::vector<int64_t>{-8};  // elements 4, 2, 0
    desc.data = reinterpret_cast<uintptr_t>(f.data_ptr()) + 16;
    desc.device = std::nullopt;
    desc.stream = kProducer;
    Tensor t = tw::import_interface(desc, f.buffer_ptr(), tw::ImportRequest{});
    ASSERT_NE(t.ready_event(), nullptr);
    const auto ev = reinterpret_cast<uintptr_t>(t.ready_event());
    g_fake->pending_events.insert(ev);  // the producer's kernel still runs
    g_fake->dead_streams.insert(kProducer);
    const size_t before_send = g_fake->waited.size();
    ASSERT_EQ(pub.send(t), 1u);
    const size_t after_send = g_fake->waited.size();
    const intptr_t own = *tw::stream_for_consumers(t);  // (itself waits again: count only what send did)
    EXPECT_EQ(std::count(g_fake->waited.begin() + static_cast<std::ptrdiff_t>(before_send),
                         g_fake->waited.begin() + static_cast<std::ptrdiff_t>(after_send),
                         std::pair<uintptr_t, uintptr_t>{static_cast<uintptr_t>(own), ev}),
              1);
    EXPECT_EQ(g_fake->recorded_on.count(static_cast<uintptr_t>(own)), 1u) << "the interprocess event's record";
    auto got = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(got);
    EXPECT_EQ(host_values(*got), (std::vector<float>{4, 2, 0}));
    // With stream= naming where the caller wrote next, the import's event still comes first there (as on the
    // copy path), and the interprocess event goes on that stream.
    constexpr intptr_t kCaller = 0x5300;
    tw::SendOptions o;
    o.stream = kCaller;
    ASSERT_EQ(pub.send(t, o), 1u);
    EXPECT_EQ(std::count(g_fake->waited.begin(), g_fake->waited.end(),
                         std::pair<uintptr_t, uintptr_t>{static_cast<uintptr_t>(kCaller), ev}),
              1);
    EXPECT_EQ(g_fake->recorded_on.count(static_cast<uintptr_t>(kCaller)), 1u);
    got = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(got);
    EXPECT_EQ(host_values(*got), (std::vector<float>{4, 2, 0}));
    // Imported on the legacy stream (PyTorch's default): no event, and kCaller still waits for that stream.
    desc.stream = tw::cuda::kLegacyStream;
    Tensor on_legacy = tw::import_interface(desc, f.buffer_ptr(), tw::ImportRequest{});
    ASSERT_EQ(on_legacy.ready_event(), nullptr);
    const size_t legacy_records = g_fake->recorded_on.count(static_cast<uintptr_t>(tw::cuda::kLegacyStream));
    const size_t waits = g_fake->waited.size();
    ASSERT_EQ(pub.send(on_legacy, o), 1u);
    EXPECT_EQ(g_fake->recorded_on.count(static_cast<uintptr_t>(tw::cuda::kLegacyStream)), legacy_records + 1);
    // (an event recorded on the legacy stream, which kCaller waited for; the fake forgets destroyed events)
    EXPECT_GE(std::count_if(g_fake->waited.begin() + static_cast<std::ptrdiff_t>(waits), g_fake->waited.end(),
                            [&](const auto& w) { return w.first == uintptr_t{kCaller}; }),
              1);
    got = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(got);
    EXPECT_EQ(host_values(*got), (std::vector<float>{4, 2, 0}));
    // With nobody to send to, a send queues no work at all (not even the wait on the import's event).
    tw::Publisher alone(ipc_topic("deadstream-alone"));
    const size_t before = g_fake->waited.size();
    const int records = g_fake->records;
    EXPECT_EQ(alone.send(t), 0u);
    EXPECT_EQ(g_fake->waited.size(), before);
    EXPECT_EQ(g_fake->records, records);
  }
  expect_no_leaks();
}

TEST_F(FakeDriver, IpcSubscriberDeviceCpuReceivesHostCopies) {
  const std::string name = ipc_topic("tocpu");
  {
    tw::Publisher pub(name);
    tw::SubscriberOptions so;
    so.device = Device::cpu();
    tw::Subscriber sub(name, so);
    ASSERT_TRUE(sub.connected());
    pub.send(foreign_floats(6, std::make_shared<std::atomic<bool>>(false)).view({2, 3}).transpose(0, 1));
    auto t = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(t);
    EXPECT_EQ(t->device(), Device::cpu());
    EXPECT_EQ(std::string(t->buffer().transport()), "cuda-ipc");
    EXPECT_EQ(host_values(*t), (std::vector<float>{0, 3, 1, 4, 2, 5}));
    d::wait_releases();
    EXPECT_EQ(g_fake->ipc_opens, 0) << "the device memory is let go once copied";
  }
  expect_no_leaks();
}

TEST_F(FakeDriver, IpcAForgedHandleIsAnErrorAtRecvAndTheStreamGoesOn) {
  // The publisher side is real; the subscriber opens what the driver refuses (the fake refuses a handle whose
  // allocation was freed: a stale handle).
  const std::string name = ipc_topic("stale");
  {
    tw::Publisher pub(name);
    tw::Subscriber sub(name);
    ASSERT_TRUE(sub.connected());
    Tensor x = foreign_floats(4, std::make_shared<std::atomic<bool>>(false));
    pub.send(x);
    // Free the allocation behind the publisher's back before the subscriber opens it.
    {
      std::lock_guard lk(g_fake->mu);
      g_fake->plain.clear();
    }
    try {
      (void)sub.recv(std::chrono::seconds(5));
      ADD_FAILURE() << "a stale handle was opened";
    } catch (const tw::Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("stale"), std::string::npos) << e.what();
    }
    Tensor h = Tensor::empty({3}, DType::int32());
    pub.send(h);
    auto t = sub.recv(std::chrono::seconds(5));
    ASSERT_TRUE(t) << "the stream goes on after a message that could not be opened";
    EXPECT_EQ(std::string(t->buffer().transport()), "shm-copy");
    {
      std::lock_guard lk(g_fake->mu);
      g_fake->plain[reinterpret_cast<uintptr_t>(x.buffer().base())] = 16;  // (so the owner's cuMemFree matches)
    }
  }
}

TEST_F(FakeDriver, IpcWireRefusesBadCudaSegments) {
  namespace ipc = tw::ipc_detail;
  ipc::CudaSegmentInfo info;
  info.device = 0;
  info.handle = ipc::CudaHandle::legacy;
  ipc::CudaSegmentWire w = ipc::encode_cuda_segment(5, 4096, info);
  auto decode = [](const ipc::CudaSegmentWire& x, size_t nfds) {
    return ipc::decode_control(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&x), sizeof x), nfds);
  };
  const ipc::ControlMessage m = decode(w, 0);
  EXPECT_EQ(m.type, ipc::ControlType::cuda_segment);
  EXPECT_EQ(m.cuda.handle, ipc::CudaHandle::legacy);
  EXPECT_THROW(decode(w, 1), tw::Error);  // a legacy handle comes with no fd
  ipc::CudaSegmentWire v = w;
  v.handle_kind = 9;
  EXPECT_THROW(decode(v, 0), tw::Error);
  v = w;
  v.device = -1;
  EXPECT_THROW(decode(v, 0), tw::Error);
  v = w;
  v.head.size = 0;
  EXPECT_THROW(decode(v, 0), tw::Error);
  info.handle = ipc::CudaHandle::vmm;
  ipc::CudaSegmentWire vm = ipc::encode_cuda_segment(5, 4096, info);
  EXPECT_THROW(decode(vm, 0), tw::Error);  // a VMM segment needs its fd
  EXPECT_EQ(decode(vm, 1).cuda.handle, ipc::CudaHandle::vmm);
}

TEST_F(FakeDriver, IpcADeviceThisProcessLacksIsNamed) {
  std::array<uint8_t, 16> uuid{};
  uuid[0] = 0x42;
  try {
    (void)d::device_of_uuid(uuid);
    ADD_FAILURE();
  } catch (const tw::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::device_unavailable);
    EXPECT_NE(std::string(e.what()).find("GPU-42000000"), std::string::npos) << e.what();
  }
  EXPECT_EQ(d::device_of_uuid(d::device_uuid(1)), 1);
}
