// tensorwire/dlpack.h — DLPack 1.4 C ABI, declared from the specification (dmlc/dlpack, include/dlpack/dlpack.h).
//
// These declarations are ABI-identical to the specification's header and sit behind the guard macro that header
// uses (DLPACK_DLPACK_H_): if a translation unit includes the official dlpack.h first, its declarations are used
// and these are skipped; if it includes this file first, the official header becomes a no-op. The layout is
// frozen by static_assert tests in tests/cpp/test_abi_layout.cpp.
#pragma once

#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define DLPACK_EXTERN_C extern "C"
#else
#define DLPACK_EXTERN_C
#endif

#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 4

#ifdef _WIN32
#ifdef DLPACK_EXPORTS
#define DLPACK_DLL __declspec(dllexport)
#else
#define DLPACK_DLL __declspec(dllimport)
#endif
#else
#define DLPACK_DLL
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* major: ABI layout of DLManagedTensorVersioned; minor: added enumerators only. */
typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

#ifdef __cplusplus
typedef enum : int32_t {
#else
typedef enum {
#endif
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
  kDLMAIA = 17,
  kDLTrn = 18,     /* 1.2 */
  kDLTPU = 19,     /* 1.4 */
  kDLTPUHost = 20, /* 1.4 */
  kDLAscend = 21,  /* 1.4 */
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id; /* 0 for plain CPU, pinned and managed memory */
} DLDevice;

typedef enum {
  kDLInt = 0U,
  kDLUInt = 1U,
  kDLFloat = 2U,
  kDLOpaqueHandle = 3U,
  kDLBfloat = 4U,
  kDLComplex = 5U,
  kDLBool = 6U,
  kDLFloat8_e3m4 = 7U,
  kDLFloat8_e4m3 = 8U,
  kDLFloat8_e4m3b11fnuz = 9U,
  kDLFloat8_e4m3fn = 10U,
  kDLFloat8_e4m3fnuz = 11U,
  kDLFloat8_e5m2 = 12U,
  kDLFloat8_e5m2fnuz = 13U,
  kDLFloat8_e8m0fnu = 14U,
  kDLFloat6_e2m3fn = 15U,
  kDLFloat6_e3m2fn = 16U,
  kDLFloat4_e2m1fn = 17U,
  kDLBcomplex = 18U, /* 1.4: two bfloat16 (real, imag); bits counts both halves */
} DLDataTypeCode;

/* Packed sub-byte data is little bit-endian: element i of a byte run is (D >> (i * bits)) & mask. */
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;            /* allocation pointer; the first element is at data + byte_offset */
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;        /* may be NULL when ndim == 0 */
  int64_t* strides;      /* in elements; NULL allowed only before DLPack 1.2 (means C-contiguous) */
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)

typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* ---- the C exchange API (DLPack 1.2; advertised since 1.3 as a type attribute `__dlpack_c_exchange_api__`
 * holding a PyCapsule named "dlpack_exchange_api" whose pointer is a DLPackExchangeAPI* that lives as long as the
 * process). Every function returns 0 on success and -1 with a Python exception set on failure, and is called with
 * the GIL held. "NoSync": the producer does not synchronise any stream; a consumer on a stream-ordered device
 * orders its work after the producer's current_work_stream. */
typedef int (*DLPackManagedTensorAllocator)(DLTensor* prototype, DLManagedTensorVersioned** out, void* error_ctx,
                                            void (*SetError)(void* error_ctx, const char* kind, const char* message));
typedef int (*DLPackManagedTensorFromPyObjectNoSync)(void* py_object, DLManagedTensorVersioned** out);
typedef int (*DLPackManagedTensorToPyObjectNoSync)(DLManagedTensorVersioned* tensor, void** out_py_object);
typedef int (*DLPackDLTensorFromPyObjectNoSync)(void* py_object, DLTensor* out);
typedef int (*DLPackCurrentWorkStream)(DLDeviceType device_type, int32_t device_id, void** out_current_stream);

typedef struct DLPackExchangeAPIHeader {
  DLPackVersion version;
  struct DLPackExchangeAPIHeader* prev_api; /* NULL unless older major versions are chained */
} DLPackExchangeAPIHeader;

typedef struct DLPackExchangeAPI {
  DLPackExchangeAPIHeader header;
  DLPackManagedTensorAllocator managed_tensor_allocator;
  DLPackManagedTensorFromPyObjectNoSync managed_tensor_from_py_object_no_sync;
  DLPackManagedTensorToPyObjectNoSync managed_tensor_to_py_object_no_sync; /* steals `tensor` */
  DLPackDLTensorFromPyObjectNoSync dltensor_from_py_object_no_sync;         /* may be NULL */
  DLPackCurrentWorkStream current_work_stream;
} DLPackExchangeAPI;

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // DLPACK_DLPACK_H_

/* What tensorwire's headers need of DLPack, under its own names, whichever dlpack.h a translation unit included
   first. An older official header (PyTorch 2.13's ATen/dlpack.h and PyArrow's are 1.3) makes the declarations above
   a no-op: its layouts are the same (a minor version adds enumerators only) but it lacks 1.4's names, and its
   DLPACK_MINOR_VERSION is not the version tensorwire speaks. */
#if !defined(DLPACK_MAJOR_VERSION) || DLPACK_MAJOR_VERSION != 1 || DLPACK_MINOR_VERSION < 1
#error "tensorwire needs DLPack 1.1 or newer declarations, and an older dlpack.h was included first: include a tensorwire header before it (tensorwire's 1.4 declarations then serve both)"
#endif
#define TW_DLPACK_MAJOR_VERSION 1
#define TW_DLPACK_MINOR_VERSION 4
#define TW_DL_BCOMPLEX 18 /* kDLBcomplex (1.4) */
