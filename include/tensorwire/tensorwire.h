/* tensorwire.h — the C ABI of tensorwire, for C, Rust and every language with a C FFI.
 *
 * Built on DLPack: tensors enter and leave as DLManagedTensorVersioned. In between, a tw_tensor is an opaque
 * handle to a tensorwire::Tensor (a strided view plus the owner that keeps its memory alive).
 *
 * Contract:
 *  1. Every function returns TW_OK (0) or an error code; on error, tw_last_error() describes it in this thread.
 *     No C++ exception ever crosses this boundary.
 *  2. Handles returned through out-parameters are owned by the caller and released with tw_tensor_free (which
 *     accepts NULL). Views share memory with their source; the memory lives until every handle and every DLPack
 *     export of it is released.
 *  3. tw_tensor_from_dlpack takes ownership of the DLPack struct even when it fails (the producer's deleter has
 *     then been called exactly once). tw_tensor_to_dlpack hands the caller a struct whose deleter it must call.
 *  4. Pointers returned by accessors (shape, strides) stay valid as long as the handle does.
 */
#ifndef TENSORWIRE_H_
#define TENSORWIRE_H_

#include <stddef.h>
#include <stdint.h>

#include "tensorwire/dlpack.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tw_tensor tw_tensor;

typedef enum {
  TW_OK = 0,
  TW_ERR_INVALID_ARGUMENT = 1,
  TW_ERR_TYPE_MISMATCH = 2,
  TW_ERR_OUT_OF_RANGE = 3,
  TW_ERR_OVERFLOW = 4,
  TW_ERR_UNSUPPORTED = 5,
  TW_ERR_COPY_REQUIRED = 6,
  TW_ERR_DEVICE_UNAVAILABLE = 7,
  TW_ERR_VERSION_MISMATCH = 8,
  TW_ERR_READ_ONLY = 9,
  TW_ERR_INTERNAL = 10,
  TW_ERR_OUT_OF_MEMORY = 11,
  TW_ERR_TIMEOUT = 12,
} tw_status;

/* "MAJOR.MINOR.PATCH" of the linked library. */
const char* tw_version(void);
/* The message of the last error in the calling thread ("" when none). Valid until the next call in this thread. */
const char* tw_last_error(void);

/* DLPack in and out (see contract 3). max_major/max_minor: the highest DLPack version the caller understands.
   Both apply the default policy of tw_tensor_import_dlpack / tw_tensor_export_dlpack below. */
tw_status tw_tensor_from_dlpack(DLManagedTensorVersioned* managed, tw_tensor** out);
tw_status tw_tensor_to_dlpack(const tw_tensor* t, uint32_t max_major, uint32_t max_minor,
                              DLManagedTensorVersioned** out);

/* ---- the import/export policy: the same rules and error texts as Python's asarray / __dlpack__ ------------ */
typedef enum {
  TW_COPY_IF_NEEDED = 0, /* Python copy=None: copy only when no view can serve */
  TW_COPY_ALWAYS = 1,    /* copy=True */
  TW_COPY_NEVER = 2,     /* copy=False: a needed copy is TW_ERR_COPY_REQUIRED */
} tw_copy_mode;

typedef enum {
  TW_CONSUMER_PORTABLE = 0, /* any DLPack consumer: negative strides are copied (PyTorch aborts on them) */
  TW_CONSUMER_STRIDED = 1,  /* a consumer that takes every strided layout (NumPy, tensorwire) */
} tw_consumer_profile;

/* Export request. Initialise with tw_export_options_init (which sets struct_size), then change fields. */
typedef struct {
  uint32_t struct_size;      /* sizeof(tw_export_options) as the caller compiled it */
  int32_t copy;              /* tw_copy_mode */
  int32_t consumer;          /* tw_consumer_profile */
  int32_t has_device;        /* nonzero: export onto `device` (DLPack dl_device) */
  DLDevice device;
  int32_t has_stream;        /* nonzero: `stream` is the consumer's stream (DLPack rules: -1 none; 0 refused on CUDA) */
  int64_t stream;
  DLPackVersion max_version; /* the newest version the consumer understands; a newer major gets our newest 1.x */
} tw_export_options;

typedef struct {
  uint32_t struct_size; /* sizeof(tw_import_options) as the caller compiled it */
  int32_t copy;         /* tw_copy_mode */
  int32_t has_device;   /* nonzero: the result must be on `device` (import never moves data between devices) */
  DLDevice device;
} tw_import_options;

void tw_export_options_init(tw_export_options* options);
void tw_import_options_init(tw_import_options* options);
/* Exports under `options` (NULL: defaults). *copied (may be NULL) is set to 1 when the struct holds a copy made for
   this consumer (its IS_COPIED flag), else 0. The caller owns *out and calls its deleter. */
tw_status tw_tensor_export_dlpack(const tw_tensor* t, const tw_export_options* options,
                                  DLManagedTensorVersioned** out, int* copied);
/* The legacy (unversioned) struct, for pre-1.0 consumers: a read-only tensor is refused (TW_ERR_UNSUPPORTED). */
tw_status tw_tensor_export_dlpack_legacy(const tw_tensor* t, const tw_export_options* options, DLManagedTensor** out);
/* Imports under `options` (NULL: defaults); takes ownership of `managed` as tw_tensor_from_dlpack does. */
tw_status tw_tensor_import_dlpack(DLManagedTensorVersioned* managed, const tw_import_options* options,
                                  tw_tensor** out);
/* A read-only view of t (a new handle). */
tw_status tw_tensor_as_readonly(const tw_tensor* t, tw_tensor** out);
/* Zero-copy view of caller-owned memory; `release(ctx)` is called once when the last view dies (may be NULL).
   strides may be NULL (C-contiguous). */
tw_status tw_tensor_from_blob(void* data, int32_t ndim, const int64_t* shape, const int64_t* strides,
                              DLDataType dtype, DLDevice device, void (*release)(void* ctx), void* ctx,
                              tw_tensor** out);
/* New host tensor, zero-filled, C-contiguous. */
tw_status tw_tensor_zeros(int32_t ndim, const int64_t* shape, DLDataType dtype, tw_tensor** out);
void tw_tensor_free(tw_tensor* t);

/* Accessors; NULL handles give 0 / NULL. */
int32_t tw_tensor_ndim(const tw_tensor* t);
const int64_t* tw_tensor_shape(const tw_tensor* t);
const int64_t* tw_tensor_strides(const tw_tensor* t); /* in elements */
int64_t tw_tensor_byte_offset(const tw_tensor* t);
void* tw_tensor_data(const tw_tensor* t);             /* address of element (0, ..., 0) */
DLDataType tw_tensor_dtype(const tw_tensor* t);
DLDevice tw_tensor_device(const tw_tensor* t);
int tw_tensor_is_contiguous(const tw_tensor* t);
int tw_tensor_readonly(const tw_tensor* t);

/* The same tensor (a new handle) when C-contiguous, else a C-contiguous copy. */
tw_status tw_tensor_contiguous(const tw_tensor* t, tw_tensor** out);
/* Views: Python-style slice of one dimension; permutation of all dimensions. */
tw_status tw_tensor_slice(const tw_tensor* t, int64_t dim, int64_t start, int64_t stop, int64_t step, tw_tensor** out);
tw_status tw_tensor_permute(const tw_tensor* t, const int64_t* dims, int32_t ndim, tw_tensor** out);
/* Copies every element of src into dst (same shape and dtype). */
tw_status tw_copy(const tw_tensor* src, const tw_tensor* dst);
void tw_set_num_threads(int n);
/* The buffer cache of recently freed large host blocks (tw::set_buffer_cache_limit): 0 disables it. */
void tw_set_buffer_cache_limit(size_t nbytes);
size_t tw_buffer_cache_limit(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TENSORWIRE_H_ */
