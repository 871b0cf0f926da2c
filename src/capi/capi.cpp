// The C ABI (include/tensorwire/tensorwire.h): a thin, exception-free shell over the C++ API.
#include "tensorwire/tensorwire.h"

#include <new>
#include <string>

#include "tensorwire/tensorwire.hpp"

struct tw_tensor {
  tw::Tensor t;
};

namespace {

thread_local std::string g_last_error;

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
  if (!t) return null_arg("tensor");
  if (!out) return null_arg("out");
  *out = nullptr;
  return guarded([&] {
    tw::DLPackExportOptions o;
    o.max_version = DLPackVersion{max_major, max_minor};
    *out = tw::to_dlpack(t->t, o);
  });
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

}  // extern "C"
