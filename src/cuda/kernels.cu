// tensorwire's CUDA copy kernels: a strided copy over any layout and a shared-memory tile transpose. Built by nvcc
// alone into a fatbin (cmake/tw_cuda_kernels.cmake) that the host loads through the driver's module API; the
// parameter blocks and the launch geometry are the contract in kernel_abi.h.
//
// Both kernels take their parameters as __grid_constant__: the block stays in the kernel parameter space (a
// constant bank) and the per-dimension arrays are read there with an indexed load, never copied to local memory.
#include <stdint.h>

#include "kernel_abi.h"

namespace {

// Unit offsets of linear index `i` over `shape[0..ndim)` (row-major, dim ndim - 1 fastest; ndim >= 1), walking
// from the innermost dimension with one division per dimension but the outermost. I is the integer type of the
// division: 32 bits when the whole index space fits (a 64-bit division is a long software sequence on the GPU),
// else 64. The offsets themselves are always 64-bit.
template <typename I>
__device__ __forceinline__ void unravel(I i, int ndim, const int64_t* shape, const int64_t* src_stride,
                                        const int64_t* dst_stride, int64_t& src_off, int64_t& dst_off) {
  int64_t so = 0, d_o = 0;
#pragma unroll 1  // the divisions dominate: unrolling only adds code and registers
  for (int d = ndim - 1; d > 0; --d) {
    const I n = static_cast<I>(shape[d]);
    const I q = i / n;
    const int64_t r = static_cast<int64_t>(i - q * n);
    so += r * src_stride[d];
    d_o += r * dst_stride[d];
    i = q;
  }
  // what is left of i is the outermost index
  src_off = so + static_cast<int64_t>(i) * src_stride[0];
  dst_off = d_o + static_cast<int64_t>(i) * dst_stride[0];
}

template <typename T, typename I>
__device__ __forceinline__ void strided_loop(const tw_cuda_strided_params& p, const T* __restrict__ src,
                                             T* __restrict__ dst, int64_t first, int64_t step) {
#pragma unroll 1
  for (int64_t i = first; i < p.numel; i += step) {
    int64_t so, d_o;
    unravel<I>(static_cast<I>(i), p.ndim, p.shape, p.src_stride, p.dst_stride, so, d_o);
    dst[d_o] = src[so];
  }
}

template <typename T>
__device__ __forceinline__ void strided_copy(const tw_cuda_strided_params& p) {
  const T* __restrict__ src = reinterpret_cast<const T*>(p.src);
  T* __restrict__ dst = reinterpret_cast<T*>(p.dst);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // The branches below are uniform across the grid.
  if (p.ndim <= 1) {  // a single strided dimension (kernel_abi.h: ndim >= 1): no division at all
    const int64_t ss = p.src_stride[0], ds = p.dst_stride[0];
    for (int64_t i = first; i < p.numel; i += step) dst[i * ds] = src[i * ss];
    return;
  }
  __builtin_assume(p.ndim >= 2);  // spares the compiler a path for ndim < 2
  if (p.numel <= static_cast<int64_t>(UINT32_MAX)) {
    strided_loop<T, uint32_t>(p, src, dst, first, step);  // every dim's extent <= numel fits too
  } else {
    strided_loop<T, uint64_t>(p, src, dst, first, step);
  }
}

// One 32 x 32 tile per block (blockDim 32 x 8: each thread moves four units each way). The tile is read with
// threadIdx.x along rows, where the source is contiguous (src_row_stride == 1), and written with threadIdx.x along
// cols, where the destination is contiguous (dst_col_stride == 1). tile[c][r] holds unit (r0 + r, c0 + c); the +1
// column keeps the column-wise reads of the write phase on distinct banks for every unit size.
template <typename T>
__device__ __forceinline__ void transpose(const tw_cuda_transpose_params& p) {
  constexpr int kTile = TW_CUDA_TILE, kRows = TW_CUDA_TILE_ROWS, kPer = TW_CUDA_TILE / TW_CUDA_TILE_ROWS;
  __shared__ T tile[kTile][kTile + 1];
  const T* __restrict__ src = reinterpret_cast<const T*>(p.src);
  T* __restrict__ dst = reinterpret_cast<T*>(p.dst);
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  // The part of this tile inside the matrix: 1..32 rows and cols (the grid covers the matrix with whole tiles).
  const int nr = static_cast<int>(p.rows - r0 < kTile ? p.rows - r0 : kTile);
  const int nc = static_cast<int>(p.cols - c0 < kTile ? p.cols - c0 : kTile);
  // Thread (tx, ty) reads units (r0 + tx, c0 + ty + 8j) and writes units (r0 + ty + 8j, c0 + tx), j = 0..3.
  const int64_t src_tile = (r0 + tx) * p.src_row_stride + (c0 + ty) * p.src_col_stride;
  const int64_t dst_tile = (r0 + ty) * p.dst_row_stride + (c0 + tx) * p.dst_col_stride;
  const int64_t src_step = kRows * p.src_col_stride, dst_step = kRows * p.dst_row_stride;

  for (int64_t b = blockIdx.z; b < p.batch; b += gridDim.z) {  // uniform across the block: the barriers are safe
    int64_t bs = 0, bd = 0;
    if (p.batch_ndim > 0)
      unravel<uint64_t>(static_cast<uint64_t>(b), p.batch_ndim, p.batch_shape, p.batch_src_stride,
                        p.batch_dst_stride, bs, bd);
    if (tx < nr) {
      const T* s = src + (bs + src_tile);
      T v[kPer];  // all four loads in flight before the first shared store
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        if (ty + j * kRows < nc) v[j] = s[j * src_step];
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        if (ty + j * kRows < nc) tile[ty + j * kRows][tx] = v[j];
    }
    __syncthreads();
    if (tx < nc) {
      T* d = dst + (bd + dst_tile);
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        if (ty + j * kRows < nr) d[j * dst_step] = tile[tx][ty + j * kRows];
    }
    __syncthreads();  // the next batch item overwrites the tile
  }
}

}  // namespace

// The entry points: C names (the host looks them up by name), parameters by value in the param space.
#define TW_STRIDED(NAME, T)                                                                                      \
  extern "C" __global__ void __launch_bounds__(TW_CUDA_COPY_BLOCK)                                               \
      NAME(const __grid_constant__ tw_cuda_strided_params p) {                                                   \
    strided_copy<T>(p);                                                                                          \
  }
#define TW_TRANSPOSE(NAME, T)                                                                                    \
  extern "C" __global__ void __launch_bounds__(TW_CUDA_TILE * TW_CUDA_TILE_ROWS)                                 \
      NAME(const __grid_constant__ tw_cuda_transpose_params p) {                                                 \
    transpose<T>(p);                                                                                             \
  }

TW_STRIDED(tw_strided_copy_u1, uint8_t)
TW_STRIDED(tw_strided_copy_u2, uint16_t)
TW_STRIDED(tw_strided_copy_u4, uint32_t)
TW_STRIDED(tw_strided_copy_u8, uint64_t)
TW_STRIDED(tw_strided_copy_u16, uint4)  // 16-byte aligned: one 128-bit load and store
TW_TRANSPOSE(tw_transpose_u1, uint8_t)
TW_TRANSPOSE(tw_transpose_u2, uint16_t)
TW_TRANSPOSE(tw_transpose_u4, uint32_t)
TW_TRANSPOSE(tw_transpose_u8, uint64_t)
