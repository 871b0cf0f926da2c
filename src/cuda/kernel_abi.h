/* The parameter blocks of tensorwire's CUDA copy kernels: shared by the host code (C++, g++) that launches them
 * through the driver's module API and by kernels.cu (nvcc), so both sides see one layout. Plain C, fixed-width
 * types only, no pointers (device addresses travel as uint64): the same bytes on both compilers.
 *
 * Copies move "units" of 1, 2, 4, 8 or 16 bytes. The host splits an element wider than the widest unit its
 * addresses and strides allow into an inner dimension of units, and coalesces dimensions first, so a kernel sees
 * few dimensions. Every stride and offset below is in units, may be negative or zero (source only).
 */
#ifndef TW_CUDA_KERNEL_ABI_H
#define TW_CUDA_KERNEL_ABI_H

#include <stdint.h>

#define TW_CUDA_MAX_RANK 64 /* the core's kMaxRank */

/* tw_strided_copy_u{1,2,4,8,16}: dst[idx] = src[idx] for every index of `shape` (row-major, dim ndim-1 fastest).
 * One launch covers numel units with a grid-stride loop. */
typedef struct tw_cuda_strided_params {
  uint64_t src;    /* device address of unit (0, ..., 0) of the source */
  uint64_t dst;    /* device address of unit (0, ..., 0) of the destination */
  int64_t numel;   /* product of shape */
  int32_t ndim;    /* 1..TW_CUDA_MAX_RANK */
  int32_t pad_;    /* zero */
  int64_t shape[TW_CUDA_MAX_RANK];
  int64_t src_stride[TW_CUDA_MAX_RANK];
  int64_t dst_stride[TW_CUDA_MAX_RANK];
} tw_cuda_strided_params;

/* tw_transpose_u{1,2,4,8}: a batch of 2-D tiles where the destination is contiguous along `cols` and the source
 * is contiguous (stride 1) along `rows`: dst[b, r, c] = src[b, r, c] with
 *   src offset = b_off_src + r * src_row_stride + c * src_col_stride    (src_row_stride == 1)
 *   dst offset = b_off_dst + r * dst_row_stride + c * dst_col_stride    (dst_col_stride == 1)
 * The batch index b runs over `batch_shape` (row-major) with its own strides, like tw_strided_copy. Tiles of
 * 32 x 32 units go through shared memory so that both the reads and the writes are coalesced. */
typedef struct tw_cuda_transpose_params {
  uint64_t src;
  uint64_t dst;
  int64_t rows;
  int64_t cols;
  int64_t src_row_stride;
  int64_t src_col_stride;
  int64_t dst_row_stride;
  int64_t dst_col_stride;
  int64_t batch;      /* product of batch_shape, >= 1 */
  int32_t batch_ndim; /* 0..TW_CUDA_MAX_RANK - 2 */
  int32_t pad_;
  int64_t batch_shape[TW_CUDA_MAX_RANK];
  int64_t batch_src_stride[TW_CUDA_MAX_RANK];
  int64_t batch_dst_stride[TW_CUDA_MAX_RANK];
} tw_cuda_transpose_params;

/* Launch geometry the host uses (kernels.cu relies on it):
 *   tw_strided_copy_*: blockDim = (256, 1, 1), gridDim.x = min(ceil(numel / 256), 65535 * 4) — grid-stride loop.
 *   tw_transpose_*:    blockDim = (32, 8, 1), gridDim = (ceil(cols / 32), ceil(rows / 32), min(batch, 65535));
 *                      each block covers one 32 x 32 tile and loops over b = blockIdx.z, += gridDim.z. */
#define TW_CUDA_COPY_BLOCK 256
#define TW_CUDA_TILE 32
#define TW_CUDA_TILE_ROWS 8

/* The fatbin nvcc built from kernels.cu (SASS for each of TW_CUDA_ARCHS, by default sm_80 and sm_90, plus PTX of the
 * highest), embedded at build time; size 0 when the build had no nvcc. Defined, with hidden visibility so that no
 * shared library exports it, in the C file cmake/tw_cuda_kernels.cmake generates. */
#ifdef __cplusplus
extern "C" {
#endif
extern const unsigned char tw_cuda_fatbin[];
extern const unsigned long long tw_cuda_fatbin_size;
extern const char tw_cuda_fatbin_archs[]; /* what it holds, in words: "sm_80, sm_90, PTX compute_90" ("none") */
#ifdef __cplusplus
}
#endif

#endif
