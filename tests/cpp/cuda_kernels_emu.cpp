// src/cuda/kernels.cu for the host compiler (see cuda_kernels_emu.hpp). The few CUDA names the kernels use are
// given host meanings here, then the file itself is included unchanged: what runs is the kernels' own code.
#include "cuda_kernels_emu.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace tw_test_emu {
namespace {

// __syncthreads among the threads of one block; a thread that waits 60 s means some thread of the block never
// arrives (a barrier in divergent code): said, then abort, rather than a test that hangs.
class Barrier {
 public:
  Barrier(unsigned n, const std::string& kernel) : n_(n), kernel_(kernel) {}
  void wait() {
    std::unique_lock lk(mu_);
    const uint64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lk, std::chrono::seconds(60), [&] { return gen_ != gen; })) {
      std::fprintf(stderr, "cuda_kernels_emu: %s: %u of the block's %u threads waited 60 s at __syncthreads for "
                           "the others (a barrier not every thread reaches)\n", kernel_.c_str(), arrived_, n_);
      std::abort();
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const unsigned n_;
  unsigned arrived_ = 0;
  uint64_t gen_ = 0;
  const std::string& kernel_;
};

thread_local Barrier* t_barrier = nullptr;

}  // namespace
}  // namespace tw_test_emu

// ---- what nvcc provides ------------------------------------------------------------------------------------------
namespace {
thread_local tw_test_emu::Dim3 threadIdx, blockIdx, blockDim, gridDim;

struct alignas(16) uint4 {  // CUDA's vector type: 16 bytes, 16-byte aligned
  unsigned x, y, z, w;
};

void __syncthreads() {
  if (!tw_test_emu::t_barrier) {
    std::fprintf(stderr, "cuda_kernels_emu: __syncthreads in a kernel emulated without a barrier\n");
    std::abort();
  }
  tw_test_emu::t_barrier->wait();
}
}  // namespace

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__ static  // blocks run one at a time: one tile per kernel serves them all
#if !defined(__clang__)
#define __builtin_assume(cond) ((void)0)
#endif

#include "cuda/kernels.cu"

// ---- launching ---------------------------------------------------------------------------------------------------
namespace tw_test_emu {
namespace {

template <typename P, void (*K)(P)>
void call(const void* params) {
  K(*static_cast<const P*>(params));
}

struct Kernel {
  const char* name;
  void (*run)(const void*);
  bool syncs;  // calls __syncthreads: a block's threads run concurrently
};

const Kernel kKernels[] = {
    {"tw_strided_copy_u1", &call<tw_cuda_strided_params, tw_strided_copy_u1>, false},
    {"tw_strided_copy_u2", &call<tw_cuda_strided_params, tw_strided_copy_u2>, false},
    {"tw_strided_copy_u4", &call<tw_cuda_strided_params, tw_strided_copy_u4>, false},
    {"tw_strided_copy_u8", &call<tw_cuda_strided_params, tw_strided_copy_u8>, false},
    {"tw_strided_copy_u16", &call<tw_cuda_strided_params, tw_strided_copy_u16>, false},
    {"tw_transpose_u1", &call<tw_cuda_transpose_params, tw_transpose_u1>, true},
    {"tw_transpose_u2", &call<tw_cuda_transpose_params, tw_transpose_u2>, true},
    {"tw_transpose_u4", &call<tw_cuda_transpose_params, tw_transpose_u4>, true},
    {"tw_transpose_u8", &call<tw_cuda_transpose_params, tw_transpose_u8>, true},
};

std::mutex g_launch_mu;  // one launch at a time: __shared__ memory is one static per kernel

}  // namespace

bool launch(const std::string& name, Dim3 grid, Dim3 block, const void* params) {
  const Kernel* k = nullptr;
  for (const Kernel& e : kKernels)
    if (name == e.name) k = &e;
  if (!k) return false;
  std::lock_guard lk(g_launch_mu);
  const auto each_block = [&](auto&& body) {
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) {
          blockIdx = {x, y, z};
          body();
        }
  };
  if (!k->syncs) {  // no barrier: the block's threads one after another, on this thread
    blockDim = block;
    gridDim = grid;
    each_block([&] {
      for (unsigned tz = 0; tz < block.z; ++tz)
        for (unsigned ty = 0; ty < block.y; ++ty)
          for (unsigned tx = 0; tx < block.x; ++tx) {
            threadIdx = {tx, ty, tz};
            k->run(params);
          }
    });
    return true;
  }
  const unsigned n = block.x * block.y * block.z;
  Barrier bar(n, name);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (unsigned t = 0; t < n; ++t) {
    try {
      threads.emplace_back([&, t] {
        t_barrier = &bar;
        blockDim = block;
        gridDim = grid;
        threadIdx = {t % block.x, t / block.x % block.y, t / (block.x * block.y)};
        each_block([&] {
          k->run(params);
          bar.wait();  // the block ends for all its threads before the next one reuses __shared__ memory
        });
        t_barrier = nullptr;
      });
    } catch (const std::exception& e) {  // (the threads started wait at the first barrier for ever)
      std::fprintf(stderr, "cuda_kernels_emu: %s: cannot start thread %u of the block's %u: %s\n", name.c_str(), t,
                   n, e.what());
      std::abort();
    }
  }
  for (std::thread& t : threads) t.join();
  return true;
}

void unravel32(uint32_t i, int ndim, const int64_t* shape, const int64_t* src_stride, const int64_t* dst_stride,
               int64_t& src_off, int64_t& dst_off) {
  unravel<uint32_t>(i, ndim, shape, src_stride, dst_stride, src_off, dst_off);
}

void unravel64(uint64_t i, int ndim, const int64_t* shape, const int64_t* src_stride, const int64_t* dst_stride,
               int64_t& src_off, int64_t& dst_off) {
  unravel<uint64_t>(i, ndim, shape, src_stride, dst_stride, src_off, dst_off);
}

}  // namespace tw_test_emu
