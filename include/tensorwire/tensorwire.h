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
 *  5. Blocking calls (tw_publisher_send, tw_publisher_loan, tw_subscriber_recv) take a timeout in nanoseconds:
 *     negative waits as long as it takes, 0 never waits. They never wait on a subscriber that hung up.
 *  6. Handles may be used from any thread; one tw_tensor handle is not to be mutated (tw_tensor_set_metadata,
 *     tw_tensor_free) while another thread uses it. Publishers and subscribers are thread-safe.
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
  TW_ERR_TIMEOUT = 12,       /* a bounded wait ended with nothing done */
  TW_ERR_WOULD_BLOCK = 13,   /* TW_ON_FULL_RAISE: a subscriber's ring is full or the pool exhausted; nothing sent */
  TW_END_OF_STREAM = 14,     /* tw_subscriber_recv: the publisher closed or died and every message was received,
                                or the subscriber was closed */
} tw_status;

/* The C ABI's version: TW_ABI_VERSION_MAJOR changes when a declaration here changes incompatibly; MINOR when
   functions or trailing fields of size-versioned structs are added. */
#define TW_ABI_VERSION_MAJOR 1
#define TW_ABI_VERSION_MINOR 4
/* (major << 16) | minor of the linked library: a binding checks the major equals the one it was written for. */
uint32_t tw_abi_version(void);
/* "MAJOR.MINOR.PATCH" of the linked library. */
const char* tw_version(void);
/* The stable lower-case name of a status ("ok", "copy_required", "would_block", "end_of_stream", ...). */
const char* tw_status_name(tw_status status);
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

/* The *_init_sized functions fill the first `size` bytes (the caller's sizeof, never more) with the defaults and
   set struct_size to it, so a caller compiled against an older, smaller struct is never written past its end.
   Call them through the *_init wrappers, which pass sizeof *options as this header declares it. */
void tw_export_options_init_sized(tw_export_options* options, size_t size);
void tw_import_options_init_sized(tw_import_options* options, size_t size);
static inline void tw_export_options_init(tw_export_options* options) {
  tw_export_options_init_sized(options, sizeof *options);
}
static inline void tw_import_options_init(tw_import_options* options) {
  tw_import_options_init_sized(options, sizeof *options);
}
/* Exports under `options` (NULL: defaults). *copied (may be NULL) is set to 1 when the struct holds a copy made for
   this consumer (its IS_COPIED flag), else 0. The caller owns *out and calls its deleter. */
tw_status tw_tensor_export_dlpack(const tw_tensor* t, const tw_export_options* options,
                                  DLManagedTensorVersioned** out, int* copied);
/* The legacy (unversioned) struct, for pre-1.0 consumers: a read-only tensor is refused (TW_ERR_UNSUPPORTED). */
tw_status tw_tensor_export_dlpack_legacy(const tw_tensor* t, const tw_export_options* options, DLManagedTensor** out);
/* Imports under `options` (NULL: defaults); takes ownership of `managed` as tw_tensor_from_dlpack does. A copy
   tensorwire makes of a non-empty tensor (TW_COPY_ALWAYS, another device) is the caller's alone:
   tw_tensor_is_exclusive says 1. */
tw_status tw_tensor_import_dlpack(DLManagedTensorVersioned* managed, const tw_import_options* options,
                                  tw_tensor** out);
/* A read-only view of t (a new handle). */
tw_status tw_tensor_as_readonly(const tw_tensor* t, tw_tensor** out);
/* Zero-copy view of memory the caller keeps access to; `release(ctx)` is called exactly once — when the last view
   and export dies, or before this function returns when it fails — and may be NULL. strides may be NULL
   (C-contiguous). The caller may still write the memory, so such a tensor is never exclusive. */
tw_status tw_tensor_from_blob(void* data, int32_t ndim, const int64_t* shape, const int64_t* strides,
                              DLDataType dtype, DLDevice device, void (*release)(void* ctx), void* ctx,
                              tw_tensor** out);
/* Like tw_tensor_from_blob, but the caller hands the memory over: nothing else refers to it after this call, so
   the new handle is its only owner (tw_tensor_is_exclusive) until views or exports are made. `release(ctx)` runs
   exactly once, from whichever thread drops the last reference (or before this returns, on failure). */
tw_status tw_tensor_adopt(void* data, int32_t ndim, const int64_t* shape, const int64_t* strides, DLDataType dtype,
                          DLDevice device, void (*release)(void* ctx), void* ctx, tw_tensor** out);
/* New host tensor, zero-filled (zeros) or uninitialised (empty), C-contiguous. */
tw_status tw_tensor_zeros(int32_t ndim, const int64_t* shape, DLDataType dtype, tw_tensor** out);
tw_status tw_tensor_empty(int32_t ndim, const int64_t* shape, DLDataType dtype, tw_tensor** out);
/* A new handle to the same view (shares memory and copies metadata). */
tw_status tw_tensor_share(const tw_tensor* t, tw_tensor** out);
void tw_tensor_free(tw_tensor* t);

/* Accessors; NULL handles give 0 / NULL. */
int32_t tw_tensor_ndim(const tw_tensor* t);
const int64_t* tw_tensor_shape(const tw_tensor* t);
const int64_t* tw_tensor_strides(const tw_tensor* t); /* in elements */
int64_t tw_tensor_byte_offset(const tw_tensor* t);
/* Address of element (0, ..., 0). The pointer leaves tensorwire's accounting: a loan whose pointer was taken is made
   read-only when sent (see tw_publisher_options.protect_sent_loans), and the tensor is no longer exclusive. */
void* tw_tensor_data(const tw_tensor* t);
/* The same address for bindings that bound its use by the handle's lifetime (Rust's borrow checker): the caller
   promises not to use it after the handle is freed or sent, so the memory stays exclusive. */
void* tw_tensor_data_borrowed(const tw_tensor* t);
int64_t tw_tensor_numel(const tw_tensor* t);
int64_t tw_tensor_nbytes(const tw_tensor* t); /* numel * element size (what a dense copy takes) */
DLDataType tw_tensor_dtype(const tw_tensor* t);
DLDevice tw_tensor_device(const tw_tensor* t);
int tw_tensor_is_contiguous(const tw_tensor* t);
int tw_tensor_readonly(const tw_tensor* t);
/* 1 when writing through this handle cannot be observed by anyone else: it is writable, no other handle, view,
   export or escaped pointer (tw_tensor_data) shares its memory, and the memory is tensorwire's or was handed over
   (tw_tensor_adopt, a loan). What a binding checks before it hands out a mutable slice. */
int tw_tensor_is_exclusive(const tw_tensor* t);
/* How the tensor's memory arrived (ABI 1.3), a string with static storage: "shm" (a publisher's loan, no copy),
   "shm-copy", "cuda-ipc", "cuda-vmm", "cuda-copy", "ucx", "ucx-packed", "ucx-cuda", "ucx-staged"; "" for memory
   no transport made (and for NULL). */
const char* tw_tensor_transport(const tw_tensor* t);

/* CUDA (tensorwire/cuda.hpp). The driver is loaded at run time: without one these say so and every CUDA operation
   fails with TW_ERR_DEVICE_UNAVAILABLE naming why. */
int tw_cuda_is_available(void);
int tw_cuda_device_count(void);
/* What CUDA there is, or why there is none: copied into buf (NUL-terminated, truncated to len bytes); returns the
   full length (call with len 0 to size the buffer). */
size_t tw_cuda_status(char* buf, size_t len);
/* The CUDA stream the tensor's data is ordered on (1 legacy default, 2 per-thread, else a CUstream), 0 if none:
   for a tensor imported from a foreign producer, the producer's stream, which the producer may have destroyed since;
   tensorwire's own uses of the tensor wait on an event recorded on it at import, never on the stream itself. */
intptr_t tw_tensor_stream(const tw_tensor* t);
/* The tensor on `device` (tw::Tensor::to): kDLCPU, kDLCUDA (device_id N) or kDLCUDAHost (pinned). copy is a
   tw_copy_mode: IF_NEEDED returns a new handle to the same tensor when it is already there, NEVER fails with
   TW_ERR_COPY_REQUIRED instead of copying. CUDA work is queued on `stream` (0: the tensor's stream, else the legacy
   default) after the tensor's own; a device or pinned result is ordered on it, a cpu result is ready on return. */
tw_status tw_tensor_to(const tw_tensor* t, DLDevice device, intptr_t stream, int32_t copy, tw_tensor** out);
/* A pinned copy of a host tensor from the pinned pool (dtype, shape, strides, metadata kept). */
tw_status tw_tensor_pin(const tw_tensor* t, tw_tensor** out);
/* A new uninitialised C-contiguous tensor on `device` (cpu, cuda:N from the device pool, cuda_host pinned). */
tw_status tw_tensor_empty_on(int32_t ndim, const int64_t* shape, DLDataType dtype, DLDevice device, tw_tensor** out);

/* The same tensor (a new handle) when C-contiguous, else a C-contiguous copy. */
tw_status tw_tensor_contiguous(const tw_tensor* t, tw_tensor** out);
/* Views: Python-style slice of one dimension (bounds clamp as Python's do, so INT64_MAX / INT64_MIN stand in
   for an omitted stop: start -1, stop INT64_MIN, step -1 is [::-1]); permutation of all dimensions. */
tw_status tw_tensor_slice(const tw_tensor* t, int64_t dim, int64_t start, int64_t stop, int64_t step, tw_tensor** out);
tw_status tw_tensor_permute(const tw_tensor* t, const int64_t* dims, int32_t ndim, tw_tensor** out);
tw_status tw_tensor_transpose(const tw_tensor* t, int64_t dim0, int64_t dim1, tw_tensor** out);
/* Index one dimension away (negative index counts from the end). */
tw_status tw_tensor_select(const tw_tensor* t, int64_t dim, int64_t index, tw_tensor** out);
/* A view with a new shape when the layout allows one (else TW_ERR_COPY_REQUIRED); reshape copies instead. One
   extent may be -1 (inferred). */
tw_status tw_tensor_view(const tw_tensor* t, int32_t ndim, const int64_t* shape, tw_tensor** out);
tw_status tw_tensor_reshape(const tw_tensor* t, int32_t ndim, const int64_t* shape, tw_tensor** out);
/* A new C-contiguous, writable copy (always copies; metadata copied). */
tw_status tw_tensor_clone(const tw_tensor* t, tw_tensor** out);
/* Copies every element of src into dst (same shape and dtype). */
tw_status tw_copy(const tw_tensor* src, const tw_tensor* dst);
/* Threads used by large copies (the caller included): n <= 0 restores the number of CPUs; more than 1024 is taken
   as 1024 (tw::kMaxThreads). */
void tw_set_num_threads(int n);
/* The buffer cache of recently freed large host blocks (tw::set_buffer_cache_limit): 0 disables it. */
void tw_set_buffer_cache_limit(size_t nbytes);
size_t tw_buffer_cache_limit(void);

/* ---- metadata: JSON-like values (none, bool, int64, float64, str, bytes, list, tuple, dict) -------------------
   A tw_value is an owned tree: tw_value_free releases it and everything in it. Values passed to tw_value_append
   and tw_value_dict_set are moved into their container (the caller's handle is consumed, even on failure).
   Pointers returned by getters (strings, items) are borrowed: valid until their root is freed or changed.
   Strings are UTF-8 with an explicit length (they may contain NUL); bytes are arbitrary. */
typedef struct tw_value tw_value;
typedef enum {
  TW_VALUE_NONE = 0,
  TW_VALUE_BOOL = 1,
  TW_VALUE_INT = 2,
  TW_VALUE_FLOAT = 3,
  TW_VALUE_STRING = 4,
  TW_VALUE_BYTES = 5,
  TW_VALUE_LIST = 6,
  TW_VALUE_TUPLE = 7,
  TW_VALUE_DICT = 8,
} tw_value_kind;

/* Constructors return NULL only when out of memory (or, for strings, on invalid UTF-8); tw_last_error says. */
tw_value* tw_value_none(void);
tw_value* tw_value_bool(int b);
tw_value* tw_value_int(int64_t v);
tw_value* tw_value_float(double v);
tw_value* tw_value_string(const char* s, size_t len);
tw_value* tw_value_bytes(const void* data, size_t len);
tw_value* tw_value_list(void);
tw_value* tw_value_tuple(void);
tw_value* tw_value_dict(void);
void tw_value_free(tw_value* v);
/* A deep copy; NULL (tw_last_error says) for a tree nested deeper than 64 levels, which no metadata may be: setting
   or sending such a tree fails the same way. */
tw_value* tw_value_clone(const tw_value* v);
/* Appends `item` to a list or tuple; consumes `item`. */
tw_status tw_value_append(tw_value* container, tw_value* item);
/* Inserts or replaces `key` in a dict (a replaced key keeps its position); consumes `value`. */
tw_status tw_value_dict_set(tw_value* dict, const char* key, size_t key_len, tw_value* value);

tw_value_kind tw_value_get_kind(const tw_value* v); /* NULL: TW_VALUE_NONE */
/* Typed getters: TW_ERR_TYPE_MISMATCH naming both kinds when the kind differs. */
tw_status tw_value_get_bool(const tw_value* v, int* out);
tw_status tw_value_get_int(const tw_value* v, int64_t* out);
tw_status tw_value_get_float(const tw_value* v, double* out);
/* String or bytes: *data (not NUL-terminated for bytes; strings are followed by a NUL) and *len. */
tw_status tw_value_get_data(const tw_value* v, const char** data, size_t* len);
/* Elements of a list, tuple or dict (0 for any other kind). */
size_t tw_value_len(const tw_value* v);
/* The i-th element of a list, tuple or dict (borrowed), or NULL when out of range or not a container. */
const tw_value* tw_value_item(const tw_value* v, size_t i);
/* The i-th key of a dict (borrowed, NUL-terminated, with its length), or TW_ERR_OUT_OF_RANGE. */
tw_status tw_value_key(const tw_value* v, size_t i, const char** key, size_t* len);
/* The value under `key` in a dict (borrowed), or NULL. */
const tw_value* tw_value_dict_get(const tw_value* dict, const char* key, size_t key_len);

/* A tensor's metadata as a new dict (the caller frees it). */
tw_status tw_tensor_metadata(const tw_tensor* t, tw_value** out);
/* Replaces a handle's metadata with the entries of `dict` (copied; NULL clears it). Other handles keep theirs. */
tw_status tw_tensor_set_metadata(tw_tensor* t, const tw_value* dict);

/* ---- publish/subscribe through shared memory (tensorwire/ipc.hpp) -------------------------------------------- */
typedef struct tw_publisher tw_publisher;
typedef struct tw_subscriber tw_subscriber;

typedef enum {
  TW_ON_FULL_BLOCK = 0,       /* wait until the subscriber makes room (never for a dead one) */
  TW_ON_FULL_DROP_OLDEST = 1, /* drop the subscriber's oldest unread message */
  TW_ON_FULL_RAISE = 2,       /* fail with TW_ERR_WOULD_BLOCK; nobody receives the message */
} tw_on_full;

/* Initialise with tw_publisher_options_init (the C++ defaults), then change fields. */
typedef struct {
  uint32_t struct_size;       /* sizeof(tw_publisher_options) as the caller compiled it */
  int32_t on_full;            /* tw_on_full */
  uint64_t depth;             /* messages each subscriber's ring holds (>= 1) */
  uint64_t max_metadata_bytes;/* largest encoded metadata of one message */
  uint64_t max_buffers;       /* pool buffers at most */
  uint64_t pool_bytes;        /* shared memory the pool may hold at once */
  uint64_t max_subscribers;   /* subscribers served at once */
  int32_t protect_sent_loans; /* nonzero: a sent loan that could still be written becomes read-only here */
  int32_t allow_other_users;  /* nonzero: accept subscribers of other uids */
  /* ABI 1.2 (a caller compiled against 1.1 passes a smaller struct: these keep their defaults) */
  const char* listen;         /* NULL or "": local subscribers only; "host:port" also serves remote subscribers over
                                 UCX (":port" binds loopback only; port 0 picks one: tw_publisher_address) */
  const char* token;          /* NULL or "": none; a shared secret remote subscribers must prove (never sent) */
  int32_t insecure;           /* nonzero: allow a non-loopback listen without a token (data is never encrypted) */
} tw_publisher_options;

typedef struct {
  uint32_t struct_size;      /* sizeof(tw_subscriber_options) as the caller compiled it */
  int32_t allow_other_users; /* nonzero: accept a publisher of another uid */
  /* ABI 1.2 */
  const char* connect;       /* NULL or "": this machine's shared memory; "host:port": a remote publisher (UCX) */
  const char* token;         /* the remote publisher's token (NULL or "": none) */
  int32_t has_device;        /* nonzero: every tensor is copied to `device` on receive (e.g. CUDA tensors to kDLCPU);
                                a CUDA device this process does not have fails tw_subscriber_new, and so does a
                                kind other than kDLCPU, kDLCUDA and kDLCUDAHost */
  DLDevice device;
} tw_subscriber_options;

/* Per-send options (ABI 1.2), for tw_publisher_send_with. */
typedef struct {
  uint32_t struct_size;  /* sizeof(tw_send_options) as the caller compiled it */
  int32_t copy;          /* tw_copy_mode: IF_NEEDED crosses without a copy where there is a way (a loan; a
                            caller's CUDA allocation the driver can share), else with exactly one copy into the
                            pool; ALWAYS copies once (the caller may reuse its memory at once); NEVER fails with
                            TW_ERR_COPY_REQUIRED, naming why, where there is no zero-copy way. */
  int64_t timeout_ns;    /* as tw_publisher_send (default -1: as long as it takes) */
  const tw_value* extra; /* metadata merged over the tensor's (NULL: none) */
  intptr_t stream;       /* CUDA: the stream the data was produced on, whose work subscribers wait for (0: the
                            tensor's own stream, else the legacy default stream) */
} tw_send_options;

/* As tw_export_options_init_sized: never writes past `size` bytes. */
void tw_publisher_options_init_sized(tw_publisher_options* options, size_t size);
void tw_subscriber_options_init_sized(tw_subscriber_options* options, size_t size);
static inline void tw_publisher_options_init(tw_publisher_options* options) {
  tw_publisher_options_init_sized(options, sizeof *options);
}
static inline void tw_subscriber_options_init(tw_subscriber_options* options) {
  tw_subscriber_options_init_sized(options, sizeof *options);
}
void tw_send_options_init_sized(tw_send_options* options, size_t size);
static inline void tw_send_options_init(tw_send_options* options) { tw_send_options_init_sized(options, sizeof *options); }

/* Binds topic `name` (NUL-terminated; 1 to 64 of [A-Za-z0-9_.:/-]). options may be NULL (defaults). */
tw_status tw_publisher_new(const char* name, const tw_publisher_options* options, tw_publisher** out);
/* Closes (subscribers drain, then see end-of-stream) and frees; loans and sent tensors stay valid. NULL is fine. */
void tw_publisher_free(tw_publisher* p);
/* Ends the stream without freeing; idempotent. */
void tw_publisher_close(tw_publisher* p);
/* A writable, C-contiguous, uninitialised shared-memory tensor: fill it, then send it with no copy. */
tw_status tw_publisher_loan(tw_publisher* p, int32_t ndim, const int64_t* shape, DLDataType dtype, int64_t timeout_ns,
                            tw_tensor** out);
/* A loan on `device` (ABI 1.2): kDLCPU as tw_publisher_loan; kDLCUDA device_id N: a buffer of the publisher's
   IPC-capable device pool, sent to local subscribers without a copy (fill it on a stream, then send it with
   tw_send_options.stream). */
tw_status tw_publisher_loan_on(tw_publisher* p, int32_t ndim, const int64_t* shape, DLDataType dtype, DLDevice device,
                               int64_t timeout_ns, tw_tensor** out);
/* Delivers `t` to every current subscriber or to none, with its metadata merged with `extra` (a dict or NULL;
   extra wins). A loan crosses with no copy, any other host tensor with one copy: a dense layout of any order
   (Fortran, a transpose) as it is, with its strides, anything else packed C-contiguous, so a receiver that reads
   the data as C order checks tw_tensor_is_contiguous (or takes tw_tensor_contiguous). The caller keeps `t`:
   a loan that could still be written is made read-only here (protect_sent_loans), and once a subscriber got it
   the handle never reports tw_tensor_is_exclusive again. *delivered (may be NULL): the number of subscribers
   that got it. TW_ERR_WOULD_BLOCK / TW_ERR_TIMEOUT: nobody got it, and the loan is as it was. */
tw_status tw_publisher_send(tw_publisher* p, const tw_tensor* t, const tw_value* extra, int64_t timeout_ns,
                            size_t* delivered);
/* The same, consuming the handle: on success *t is freed and set to NULL (a loan with no other views is then sent
   without being made read-only); on failure *t is left intact. */
tw_status tw_publisher_send_move(tw_publisher* p, tw_tensor** t, const tw_value* extra, int64_t timeout_ns,
                                 size_t* delivered);
/* tw_publisher_send with options (ABI 1.2; NULL: the defaults). */
tw_status tw_publisher_send_with(tw_publisher* p, const tw_tensor* t, const tw_send_options* options,
                                 size_t* delivered);
/* The address remote subscribers connect to ("host:port", the port bound when 0 was asked for), written into `buf`
   (NUL-terminated, truncated to len - 1; buf may be NULL to ask the length); "" without listen. Returns its
   length. */
size_t tw_publisher_address(const tw_publisher* p, char* buf, size_t len);
/* The UCX behind listen and connect (ABI 1.4; <tensorwire/net.hpp>), loaded on first use: the library
   TW_UCX_LIBRARY names, else one the process already loaded, else the one tw_prefer_ucx_library gave, else
   libucp.so.0 from the library path. Its file and its version ("major.minor.release"), written like
   tw_publisher_address ("" when none can be loaded; tw_cuda_status-like text of why in tw_ucx_unavailable_reason,
   "" when it can be used). Each returns the text's length. */
size_t tw_ucx_library(char* buf, size_t len);
size_t tw_ucx_version(char* buf, size_t len);
size_t tw_ucx_unavailable_reason(char* buf, size_t len);
/* Prefers `path` (a libucp.so to load) over the library path's UCX: 1 when taken, 0 once UCX is loaded (too late:
   nothing changes) or when path is NULL. UCX older than 1.18 (Debian 12's 1.13) aborts the whole process when
   crafted bytes reach its listening ports; the libucx wheels' does not (README, "Security"). */
int tw_prefer_ucx_library(const char* path);
size_t tw_publisher_subscriber_count(const tw_publisher* p);
uint64_t tw_publisher_dropped(const tw_publisher* p);
int tw_publisher_closed(const tw_publisher* p);

/* Connects to topic `name` (the publisher may come later). options may be NULL. */
tw_status tw_subscriber_new(const char* name, const tw_subscriber_options* options, tw_subscriber** out);
/* Disconnects and frees; received tensors stay valid. NULL is fine. */
void tw_subscriber_free(tw_subscriber* s);
/* Disconnects (a recv blocked in another thread returns TW_END_OF_STREAM); messages queued but not yet received
   are discarded, and the end-of-stream error says how many. Received tensors stay valid. NULL is fine. */
void tw_subscriber_close(tw_subscriber* s);
/* The next message as a read-only tensor (zero-copy; it holds the publisher's buffer until freed). TW_ERR_TIMEOUT:
   nothing arrived in time; TW_END_OF_STREAM: the stream ended (*out is NULL in both). A message of several
   tensors (a C++ or Python peer's dict, list or tuple) is skipped with TW_ERR_UNSUPPORTED saying so; the next
   call receives the message after it. */
tw_status tw_subscriber_recv(tw_subscriber* s, int64_t timeout_ns, tw_tensor** out);
int tw_subscriber_closed(const tw_subscriber* s);    /* the stream ended, or tw_subscriber_close was called */
int tw_subscriber_connected(const tw_subscriber* s); /* connected to a live publisher (never waits; polling it
                                                       alone completes the handshake with a later publisher) */
uint64_t tw_subscriber_dropped(const tw_subscriber* s); /* messages it missed: a full queue, either end */
/* A descriptor that polls readable when a message or end-of-stream waits (owned by the subscriber), or -1. */
int tw_subscriber_fileno(tw_subscriber* s);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TENSORWIRE_H_ */
