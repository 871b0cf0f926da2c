// The C ABI (include/tensorwire/tensorwire.h): a thin, exception-free shell over the C++ API.
#include "tensorwire/tensorwire.h"

#include <cstring>
#include <new>
#include <string>

#include "tensorwire/tensorwire.hpp"

struct tw_tensor {
  tw::Tensor t;
};

namespace {

thread_local std::string g_last_error;

// The C ABI installs the CUDA driver as interop's device runtime when it loads (this file is linked by every
// program that calls a tw_* function).
[[maybe_unused]] const bool g_runtime_installed = (tw::cuda::install_runtime(), true);

tw_status fail(tw_status s, const char* msg) {
  try {
    g_last_error = msg;
  } catch (...) {
  }
  return s;
}

// Runs fn, translating every exception into a status and a message.
template <class F>
tw_status guarded(F&& fn) {
  try {
    fn();
    g_last_error.clear();
    return TW_OK;
  } catch (const tw::Error& e) {
    return fail(static_cast<tw_status>(e.code()), e.what());
  } catch (const std::bad_alloc&) {
    return fail(TW_ERR_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return fail(TW_ERR_INTERNAL, e.what());
  } catch (...) {
    return fail(TW_ERR_INTERNAL, "unknown error");
  }
}

tw::CopyMode copy_mode(int32_t c) {
  switch (c) {
    case TW_COPY_IF_NEEDED: return tw::CopyMode::if_needed;
    case TW_COPY_ALWAYS: return tw::CopyMode::always;
    case TW_COPY_NEVER: return tw::CopyMode::never;
    default:
      throw tw::Error(tw::ErrorCode::invalid_argument,
                      "copy mode " + std::to_string(c) + " is not TW_COPY_IF_NEEDED, TW_COPY_ALWAYS or TW_COPY_NEVER");
  }
}

// Options structs carry their size so that fields can be added: a caller compiled against an older (smaller)
// struct is read up to its size only; a size we do not know at all is refused.
template <class Options>
Options read_options(const Options* o, void (*init)(Options*), size_t min_size, const char* name) {
  Options r;
  init(&r);
  if (!o) return r;
  if (o->struct_size < min_size || o->struct_size > sizeof(Options))
    throw tw::Error(tw::ErrorCode::invalid_argument,
                    std::string(name) + ".struct_size is " + std::to_string(o->struct_size) + "; expected " +
                        std::to_string(sizeof(Options)) + " (initialise it with " + name + "_init)");
  std::memcpy(&r, o, o->struct_size);
  return r;
}

tw::ExportRequest export_request(const tw_export_options* options) {
  const tw_export_options o =
      read_options(options, tw_export_options_init, sizeof(tw_export_options), "tw_export_options");
  tw::ExportRequest r;
  r.copy = copy_mode(o.copy);
  if (o.consumer != TW_CONSUMER_PORTABLE && o.consumer != TW_CONSUMER_STRIDED)
    throw tw::Error(tw::ErrorCode::invalid_argument, "consumer profile " + std::to_string(o.consumer) +
                                                         " is not TW_CONSUMER_PORTABLE or TW_CONSUMER_STRIDED");
  r.consumer = o.consumer == TW_CONSUMER_STRIDED ? tw::ConsumerProfile::strided : tw::ConsumerProfile::portable;
  if (o.has_device) r.device = tw::Device::from_dlpack(o.device);
  if (o.has_stream) r.stream = o.stream;
  r.max_version = o.max_version;
  return r;
}

tw::ImportRequest import_request(const tw_import_options* options) {
  const tw_import_options o =
      read_options(options, tw_import_options_init, sizeof(tw_import_options), "tw_import_options");
  tw::ImportRequest r;
  r.copy = copy_mode(o.copy);
  if (o.has_device) r.device = tw::Device::from_dlpack(o.device);
  return r;
}

tw_status null_arg(const char* what) noexcept {
  try {
    g_last_error.assign(what).append(" is NULL");
  } catch (...) {
    // no memory for the message: the code alone still says what went wrong
  }
  return TW_ERR_INVALID_ARGUMENT;
}

}  // namespace

extern "C" {

const char* tw_version(void) { return tw::version(); }
const char* tw_last_error(void) { return g_last_error.c_str(); }

tw_status tw_tensor_from_dlpack(DLManagedTensorVersioned* managed, tw_tensor** out) {
  if (!out) {
    if (managed && managed->deleter) managed->deleter(managed);  // ownership was ours: contract 3
    return null_arg("out");
  }
  *out = nullptr;
  return guarded([&] { *out = new tw_tensor{tw::from_dlpack(managed)}; });
}

tw_status tw_tensor_to_dlpack(const tw_tensor* t, uint32_t max_major, uint32_t max_minor,
                              DLManagedTensorVersioned** out) {
  tw_export_options o;
  tw_export_options_init(&o);
  o.max_version = DLPackVersion{max_major, max_minor};
  return tw_tensor_export_dlpack(t, &o, out, nullptr);
}

void tw_export_options_init(tw_export_options* o) {
  if (!o) return;
  *o = tw_export_options{};
  o->struct_size = sizeof(tw_export_options);
  o->copy = TW_COPY_IF_NEEDED;
  o->consumer = TW_CONSUMER_PORTABLE;
  o->device = DLDevice{kDLCPU, 0};
  o->max_version = DLPackVersion{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
}

void tw_import_options_init(tw_import_options* o) {
  if (!o) return;
  *o = tw_import_options{};
  o->struct_size = sizeof(tw_import_options);
  o->copy = TW_COPY_IF_NEEDED;
  o->device = DLDevice{kDLCPU, 0};
}

tw_status tw_tensor_export_dlpack(const tw_tensor* t, const tw_export_options* options,
                                  DLManagedTensorVersioned** out, int* copied) {
  if (!t) return null_arg("tensor");
  if (!out) return null_arg("out");
  *out = nullptr;
  if (copied) *copied = 0;
  return guarded([&] {
    const tw::ExportRequest r = export_request(options);
    *out = tw::export_dlpack(t->t, r);
    if (copied) *copied = ((*out)->flags & DLPACK_FLAG_BITMASK_IS_COPIED) ? 1 : 0;
  });
}

tw_status tw_tensor_export_dlpack_legacy(const tw_tensor* t, const tw_export_options* options, DLManagedTensor** out) {
  if (!t) return null_arg("tensor");
  if (!out) return null_arg("out");
  *out = nullptr;
  return guarded([&] { *out = tw::export_dlpack_legacy(t->t, export_request(options)); });
}

tw_status tw_tensor_import_dlpack(DLManagedTensorVersioned* managed, const tw_import_options* options,
                                  tw_tensor** out) {
  if (!out) {
    if (managed && managed->deleter) managed->deleter(managed);  // ownership was ours: contract 3
    return null_arg("out");
  }
  *out = nullptr;
  tw::ImportRequest r;
  if (const tw_status st = guarded([&] { r = import_request(options); }); st != TW_OK) {
    if (managed && managed->deleter) managed->deleter(managed);  // ownership was ours: contract 3
    return st;
  }
  return guarded([&] { *out = new tw_tensor{tw::import_dlpack(managed, r)}; });
}

tw_status tw_tensor_as_readonly(const tw_tensor* t, tw_tensor** out) {
  if (!t) return null_arg("tensor");
  if (!out) return null_arg("out");
  *out = nullptr;
  return guarded([&] { *out = new tw_tensor{t->t.as_readonly()}; });
}

tw_status tw_tensor_from_blob(void* data, int32_t ndim, const int64_t* shape, const int64_t* strides,
                              DLDataType dtype, DLDevice device, void (*release)(void* ctx), void* ctx,
                              tw_tensor** out) {
  // Whatever happens, `release` runs exactly once: through the keep-alive on success, here on failure.
  std::shared_ptr<const void> keep;
  try {
    if (release) keep = std::shared_ptr<void>(ctx, release);
  } catch (...) {
    // shared_ptr's constructor has already called release(ctx) when it failed to allocate its control block.
    return fail(TW_ERR_OUT_OF_MEMORY, "out of memory");
  }
  if (!out) return null_arg("out");
  *out = nullptr;
  if (ndim < 0 || (ndim > 0 && !shape)) return fail(TW_ERR_INVALID_ARGUMENT, "shape is NULL or ndim is negative");
  return guarded([&] {
    const size_t n = static_cast<size_t>(ndim);
    tw::Shape sh(shape, n);
    tw::Strides st = strides ? tw::Strides(strides, n) : tw::Strides();
    *out = new tw_tensor{tw::Tensor::from_blob(data, sh, tw::DType::from_dlpack(dtype), tw::Device::from_dlpack(device),
                                               keep, st)};
  });
}

tw_status tw_tensor_zeros(int32_t ndim, const int64_t* shape, DLDataType dtype, tw_tensor** out) {
  if (!out) return null_arg("out");
  *out = nullptr;
  if (ndim < 0 || (ndim > 0 && !shape)) return fail(TW_ERR_INVALID_ARGUMENT, "shape is NULL or ndim is negative");
  return guarded([&] {
    *out = new tw_tensor{tw::Tensor::zeros(tw::Shape(shape, static_cast<size_t>(ndim)), tw::DType::from_dlpack(dtype))};
  });
}

void tw_tensor_free(tw_tensor* t) { delete t; }

int32_t tw_tensor_ndim(const tw_tensor* t) { return t ? static_cast<int32_t>(t->t.ndim()) : 0; }
const int64_t* tw_tensor_shape(const tw_tensor* t) { return t ? t->t.shape().data() : nullptr; }
const int64_t* tw_tensor_strides(const tw_tensor* t) { return t ? t->t.strides().data() : nullptr; }
int64_t tw_tensor_byte_offset(const tw_tensor* t) { return t ? t->t.byte_offset() : 0; }
void* tw_tensor_data(const tw_tensor* t) { return t ? t->t.data_ptr() : nullptr; }
DLDataType tw_tensor_dtype(const tw_tensor* t) { return t ? t->t.dtype().to_dlpack() : DLDataType{0, 0, 0}; }
DLDevice tw_tensor_device(const tw_tensor* t) { return t ? t->t.device().to_dlpack() : DLDevice{kDLCPU, 0}; }
int tw_tensor_is_contiguous(const tw_tensor* t) { return t && t->t.is_contiguous() ? 1 : 0; }
int tw_tensor_readonly(const tw_tensor* t) { return t && t->t.readonly() ? 1 : 0; }

tw_status tw_tensor_contiguous(const tw_tensor* t, tw_tensor** out) {
  if (!t) return null_arg("tensor");
  if (!out) return null_arg("out");
  *out = nullptr;
  return guarded([&] { *out = new tw_tensor{t->t.contiguous()}; });
}

tw_status tw_tensor_slice(const tw_tensor* t, int64_t dim, int64_t start, int64_t stop, int64_t step, tw_tensor** out) {
  if (!t) return null_arg("tensor");
  if (!out) return null_arg("out");
  *out = nullptr;
  return guarded([&] { *out = new tw_tensor{t->t.slice(dim, start, stop, step)}; });
}

tw_status tw_tensor_permute(const tw_tensor* t, const int64_t* dims, int32_t ndim, tw_tensor** out) {
  if (!t) return null_arg("tensor");
  if (!out) return null_arg("out");
  *out = nullptr;
  if (ndim < 0 || (ndim > 0 && !dims)) return fail(TW_ERR_INVALID_ARGUMENT, "dims is NULL or ndim is negative");
  return guarded([&] { *out = new tw_tensor{t->t.permute(tw::Dims(dims, static_cast<size_t>(ndim)))}; });
}

tw_status tw_copy(const tw_tensor* src, const tw_tensor* dst) {
  if (!src) return null_arg("src");
  if (!dst) return null_arg("dst");
  return guarded([&] { tw::copy(src->t, dst->t); });
}

void tw_set_num_threads(int n) { tw::set_num_threads(n); }
void tw_set_buffer_cache_limit(size_t nbytes) { tw::set_buffer_cache_limit(nbytes); }
size_t tw_buffer_cache_limit(void) { return tw::buffer_cache_limit(); }

}  // extern "C"
