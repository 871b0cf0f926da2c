// tensorwire's CUDA copy kernels (src/cuda/kernels.cu), compiled by the host compiler and run on the CPU: the fake
// driver of test_cuda_host.cpp launches them through this, so that the kernels' own index arithmetic (the 32-bit
// unravel, the tile transpose's bounds, the grid-stride loops) is exercised on machines without a GPU, under the same
// sanitizers as the rest of the suite. A block's threads are real threads and __syncthreads a barrier among them;
// blocks run one after another (so __shared__ memory is a static of the kernel).
#pragma once

#include <cstdint>
#include <string>

namespace tw_test_emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

/// Runs kernel `name` (an entry point of kernels.cu, e.g. "tw_transpose_u4") over `grid` x `block` with the
/// parameter block `params` (what cuLaunchKernel's args[0] points at). Returns false for an unknown name. A block
/// whose threads do not all reach the same __syncthreads within 60 s (undefined behaviour on a GPU) aborts the
/// process with a message naming the kernel, instead of hanging.
bool launch(const std::string& name, Dim3 grid, Dim3 block, const void* params);

/// The kernels' unravel (linear index -> source and destination offsets), 32- and 64-bit instantiations.
void unravel32(uint32_t i, int ndim, const int64_t* shape, const int64_t* src_stride, const int64_t* dst_stride,
               int64_t& src_off, int64_t& dst_off);
void unravel64(uint64_t i, int ndim, const int64_t* shape, const int64_t* src_stride, const int64_t* dst_stride,
               int64_t& src_off, int64_t& dst_off);

}  // namespace tw_test_emu
