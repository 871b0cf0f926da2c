// The C ABI (include/tensorwire/tensorwire.h): a thin, exception-free shell over the C++ API.
#include "tensorwire/tensorwire.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <new>
#include <string>

#include "tensorwire/tensorwire.hpp"
#include "core/text.hpp"
#include "core/utf8.hpp"

struct tw_tensor {
  tw::Tensor t;
  // The memory is tensorwire's or was handed over (tw_tensor_adopt, a loan, a copy): no one outside tensorwire's
  // accounting can write it. Memory imported from DLPack or borrowed through tw_tensor_from_blob is not.
  bool owned = false;
};

// A tw_value* is a heap-allocated tw::Value (tw_value itself is never defined): a borrowed item of a container is
// then simply the address of the tw::Value inside it.
namespace {
tw::Value* val(tw_value* v) noexcept { return reinterpret_cast<tw::Value*>(v); }
const tw::Value* val(const tw_value* v) noexcept { return reinterpret_cast<const tw::Value*>(v); }
const tw_value* handle(const tw::Value* v) noexcept { return reinterpret_cast<const tw_value*>(v); }
tw_value* new_handle(tw::Value v) { return reinterpret_cast<tw_value*>(new tw::Value(std::move(v))); }
}  // namespace

struct tw_publisher {
  tw::Publisher p;
};

struct tw_subscriber {
  tw::Subscriber s;
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
  } catch (const tw::WouldBlockError& e) {
    return fail(TW_ERR_WOULD_BLOCK, e.what());
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
// struct is read up to its size only; a size we do not know at all is refused. Each struct has shipped in two
// sizes at most: as ABI 1.1 shipped it (frozen here: fields added later must be appended, and these stay) and as
// it is now. Only those two are read: any other size ends inside a field (half a pointer read as a whole one).
constexpr size_t kExportOptionsV1 = 48;
constexpr size_t kImportOptionsV1 = 20;
constexpr size_t kPublisherOptionsV1 = 56;
constexpr size_t kSubscriberOptionsV1 = 8;
constexpr size_t kSendOptionsV1 = 32;  // ABI 1.2
static_assert(sizeof(tw_export_options) >= kExportOptionsV1 && sizeof(tw_import_options) >= kImportOptionsV1 &&
              sizeof(tw_publisher_options) >= kPublisherOptionsV1 &&
              sizeof(tw_subscriber_options) >= kSubscriberOptionsV1 && sizeof(tw_send_options) >= kSendOptionsV1);
// The *_init_sized functions: the defaults `d`, written up to the caller's size only (an older caller's struct is
// smaller than ours). A size that cannot even hold struct_size writes nothing; read_options then refuses it.
template <class Options>
void fill_sized(Options* o, Options d, size_t size) noexcept {
  if (!o || size < sizeof(uint32_t)) return;
  const size_t n = std::min(size, sizeof(Options));
  d.struct_size = static_cast<uint32_t>(n);
  std::memcpy(o, &d, n);
}

template <class Options>
Options read_options(const Options* o, void (*init)(Options*), size_t min_size, const char* name) {
  Options r;
  init(&r);
  if (!o) return r;
  if (o->struct_size != min_size && o->struct_size != sizeof(Options))
    throw tw::Error(tw::ErrorCode::invalid_argument,
                    std::string(name) + ".struct_size is " + std::to_string(o->struct_size) + "; expected " +
                        std::to_string(sizeof(Options)) +
                        (min_size != sizeof(Options) ? " (or " + std::to_string(min_size) + ", as ABI 1.1 had it)"
                                                     : std::string()) +
                        " (initialise it with " + name + "_init)");
  std::memcpy(&r, o, o->struct_size);
  return r;
}

tw::ExportRequest export_request(const tw_export_options* options) {
  const tw_export_options o =
      read_options(options, tw_export_options_init, kExportOptionsV1, "tw_export_options");
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
      read_options(options, tw_import_options_init, kImportOptionsV1, "tw_import_options");
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

tw_tensor* wrap(tw::Tensor t, bool owned) { return new tw_tensor{std::move(t), owned}; }

// What a tensor operation's result is, for ownership (tw_tensor_is_exclusive): a view of its source's memory
// (owned exactly when the source was), new memory tensorwire allocated, or either (contiguous, reshape: the same
// tensor when no copy is needed, else a copy into memory of tensorwire's own).
enum class Result { view, copy, view_or_copy };

// The body every tensor operation shares: argument checks, *out cleared, exceptions turned into statuses.
template <class F>
tw_status tensor_op(const tw_tensor* t, tw_tensor** out, Result kind, F&& op) {
  if (!t) return null_arg("tensor");
  if (!out) return null_arg("out");
  *out = nullptr;
  return guarded([&] {
    tw::Tensor r = op(t->t);
    const bool owned = kind == Result::copy ||
                       (kind == Result::view_or_copy && r.buffer_ptr() != t->t.buffer_ptr()) || t->owned;
    *out = wrap(std::move(r), owned);
  });
}

// The rank is checked before a single entry is read: a caller's array is only as long as a valid rank.
void rank_arg(int32_t ndim) {
  if (ndim > static_cast<int32_t>(tw::kMaxRank))
    throw tw::Error(tw::ErrorCode::invalid_argument, "rank " + std::to_string(ndim) + " exceeds the maximum of " +
                                                         std::to_string(tw::kMaxRank));  // (the core's words)
}

tw::Shape shape_arg(int32_t ndim, const int64_t* shape) {
  if (ndim < 0 || (ndim > 0 && !shape))
    throw tw::Error(tw::ErrorCode::invalid_argument, "shape is NULL or ndim is negative");
  rank_arg(ndim);
  return tw::Shape(shape, static_cast<size_t>(ndim));
}

// Negative: wait as long as it takes.
tw::Timeout timeout_arg(int64_t ns) {
  if (ns < 0) return std::nullopt;
  return std::chrono::nanoseconds(ns);
}

std::string utf8_arg(const char* s, size_t len, const char* what) {
  if (!s && len) throw tw::Error(tw::ErrorCode::invalid_argument, std::string(what) + " is NULL");
  if (len && !tw::detail::valid_utf8(std::string_view(s, len)))
    throw tw::Error(tw::ErrorCode::invalid_argument, std::string(what) + " is not valid UTF-8");
  return len ? std::string(s, len) : std::string();
}

tw_value* new_value(tw::Value v) noexcept {
  try {
    return new_handle(std::move(v));
  } catch (...) {
    fail(TW_ERR_OUT_OF_MEMORY, "out of memory");
    return nullptr;
  }
}

// A tree nested deeper than the encoding allows is refused before anything copies it: copying (and encoding)
// recurse, and a C caller can build a tree of any depth (100 000 levels overflowed the stack in the copy).
// Checked without recursion.
constexpr size_t kMaxValueDepth = 64;  // encode_metadata's limit
void check_depth(const tw::Value& root, const char* what) {
  std::vector<std::pair<const tw::Value*, size_t>> pending{{&root, 0}};
  while (!pending.empty()) {
    const auto [v, depth] = pending.back();
    pending.pop_back();
    if (depth > kMaxValueDepth)
      throw tw::Error(tw::ErrorCode::invalid_argument,
                      std::string(what) + " is nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
    const auto k = v->kind();
    if (k == tw::Value::Kind::list || k == tw::Value::Kind::tuple) {
      for (const tw::Value& x : v->items()) pending.emplace_back(&x, depth + 1);
    } else if (k == tw::Value::Kind::dict) {
      for (const tw::Value& x : v->values()) pending.emplace_back(&x, depth + 1);
    }
  }
}

tw::Metadata metadata_arg(const tw_value* dict, const char* what) {
  if (!dict) return {};
  if (val(dict)->kind() != tw::Value::Kind::dict)
    throw tw::Error(tw::ErrorCode::type_mismatch, std::string(what) + " must be a dict, not a " +
                                                      tw::value_kind_name(val(dict)->kind()));
  check_depth(*val(dict), what);
  return tw::Metadata::from_value(*val(dict));
}

tw::OnFull on_full_arg(int32_t f) {
  switch (f) {
    case TW_ON_FULL_BLOCK: return tw::OnFull::block;
    case TW_ON_FULL_DROP_OLDEST: return tw::OnFull::drop_oldest;
    case TW_ON_FULL_RAISE: return tw::OnFull::raise;
    default:
      throw tw::Error(tw::ErrorCode::invalid_argument, "on_full " + std::to_string(f) +
                                                           " is not TW_ON_FULL_BLOCK, TW_ON_FULL_DROP_OLDEST or "
                                                           "TW_ON_FULL_RAISE");
  }
}

// A string getter's contract: `text()` written into buf (NUL-terminated, truncated to len - 1; buf may be NULL to
// ask the length), its full length returned; "" and 0 when it throws.
template <class F>
size_t string_out(char* buf, size_t len, F&& text) noexcept {
  try {
    const std::string s = text();
    if (buf && len > 0) {
      const size_t n = std::min(len - 1, s.size());
      std::memcpy(buf, s.data(), n);
      buf[n] = '\0';
    }
    return s.size();
  } catch (...) {
    if (buf && len > 0) buf[0] = '\0';
    return 0;
  }
}

}  // namespace

extern "C" {

uint32_t tw_abi_version(void) { return (uint32_t{TW_ABI_VERSION_MAJOR} << 16) | TW_ABI_VERSION_MINOR; }
const char* tw_version(void) { return tw::version(); }

// tw_status and tw_value_kind mirror tw::ErrorCode and tw::Value::Kind by number (statuses are cast from codes and
// back): a new code or kind must be added to both, or this stops compiling.
static_assert(int(tw::ErrorCode::invalid_argument) == TW_ERR_INVALID_ARGUMENT &&
              int(tw::ErrorCode::type_mismatch) == TW_ERR_TYPE_MISMATCH &&
              int(tw::ErrorCode::out_of_range) == TW_ERR_OUT_OF_RANGE &&
              int(tw::ErrorCode::overflow) == TW_ERR_OVERFLOW &&
              int(tw::ErrorCode::unsupported) == TW_ERR_UNSUPPORTED &&
              int(tw::ErrorCode::copy_required) == TW_ERR_COPY_REQUIRED &&
              int(tw::ErrorCode::device_unavailable) == TW_ERR_DEVICE_UNAVAILABLE &&
              int(tw::ErrorCode::version_mismatch) == TW_ERR_VERSION_MISMATCH &&
              int(tw::ErrorCode::read_only) == TW_ERR_READ_ONLY && int(tw::ErrorCode::internal) == TW_ERR_INTERNAL &&
              int(tw::ErrorCode::out_of_memory) == TW_ERR_OUT_OF_MEMORY &&
              int(tw::ErrorCode::timeout) == TW_ERR_TIMEOUT &&
              TW_ERR_WOULD_BLOCK == int(tw::ErrorCode::timeout) + 1);
static_assert(int(tw::Value::Kind::none) == TW_VALUE_NONE && int(tw::Value::Kind::boolean) == TW_VALUE_BOOL &&
              int(tw::Value::Kind::integer) == TW_VALUE_INT && int(tw::Value::Kind::floating) == TW_VALUE_FLOAT &&
              int(tw::Value::Kind::string) == TW_VALUE_STRING && int(tw::Value::Kind::bytes) == TW_VALUE_BYTES &&
              int(tw::Value::Kind::list) == TW_VALUE_LIST && int(tw::Value::Kind::tuple) == TW_VALUE_TUPLE &&
              int(tw::Value::Kind::dict) == TW_VALUE_DICT);

const char* tw_status_name(tw_status status) {
  switch (status) {
    case TW_OK: return "ok";
    case TW_ERR_WOULD_BLOCK: return "would_block";
    case TW_END_OF_STREAM: return "end_of_stream";
    default: break;
  }
  const int c = static_cast<int>(status);
  if (c >= 1 && c <= int(tw::ErrorCode::timeout)) return tw::error_code_name(static_cast<tw::ErrorCode>(c));
  return "unknown";
}
const char* tw_last_error(void) { return g_last_error.c_str(); }

tw_status tw_tensor_from_dlpack(DLManagedTensorVersioned* managed, tw_tensor** out) {
  if (!out) {
    if (managed && managed->deleter) managed->deleter(managed);  // ownership was ours: contract 3
    return null_arg("out");
  }
  *out = nullptr;
  return guarded([&] { *out = wrap(tw::from_dlpack(managed), false); });
}

tw_status tw_tensor_to_dlpack(const tw_tensor* t, uint32_t max_major, uint32_t max_minor,
                              DLManagedTensorVersioned** out) {
  tw_export_options o;
  tw_export_options_init(&o);
  o.max_version = DLPackVersion{max_major, max_minor};
  return tw_tensor_export_dlpack(t, &o, out, nullptr);
}

void tw_export_options_init_sized(tw_export_options* o, size_t size) {
  tw_export_options d{};
  d.copy = TW_COPY_IF_NEEDED;
  d.consumer = TW_CONSUMER_PORTABLE;
  d.device = DLDevice{kDLCPU, 0};
  d.max_version = DLPackVersion{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
  fill_sized(o, d, size);
}

void tw_import_options_init_sized(tw_import_options* o, size_t size) {
  tw_import_options d{};
  d.copy = TW_COPY_IF_NEEDED;
  d.device = DLDevice{kDLCPU, 0};
  fill_sized(o, d, size);
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
  // Where the producer's first element is: a result elsewhere is tensorwire's own copy (copy=always, another
  // device, a layout that needed one), made before the producer's memory was released, and the caller's alone.
  // A producer's IS_COPIED is its word, not tensorwire's knowledge: that memory is not counted exclusive.
  const uintptr_t origin =
      managed ? reinterpret_cast<uintptr_t>(managed->dl_tensor.data) + uintptr_t(managed->dl_tensor.byte_offset) : 0;
  return guarded([&] {
    tw::Tensor t = tw::import_dlpack(managed, r);
    const bool copied_here = t.numel() > 0 && reinterpret_cast<uintptr_t>(t.data_ptr()) != origin;
    *out = wrap(std::move(t), copied_here);
  });
}

tw_status tw_tensor_as_readonly(const tw_tensor* t, tw_tensor** out) {
  return tensor_op(t, out, Result::view, [&](const tw::Tensor& x) { return x.as_readonly(); });
}

namespace {
tw_status blob(void* data, int32_t ndim, const int64_t* shape, const int64_t* strides, DLDataType dtype,
               DLDevice device, void (*release)(void* ctx), void* ctx, tw_tensor** out, bool owned) {
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
  return guarded([&] {
    tw::Shape sh = shape_arg(ndim, shape);
    tw::Strides st = strides ? tw::Strides(strides, sh.size()) : tw::Strides();
    *out = wrap(tw::Tensor::from_blob(data, sh, tw::DType::from_dlpack(dtype), tw::Device::from_dlpack(device),
                                      std::move(keep), st),
                owned);
  });
}
}  // namespace

tw_status tw_tensor_from_blob(void* data, int32_t ndim, const int64_t* shape, const int64_t* strides,
                              DLDataType dtype, DLDevice device, void (*release)(void* ctx), void* ctx,
                              tw_tensor** out) {
  return blob(data, ndim, shape, strides, dtype, device, release, ctx, out, false);
}

tw_status tw_tensor_adopt(void* data, int32_t ndim, const int64_t* shape, const int64_t* strides, DLDataType dtype,
                          DLDevice device, void (*release)(void* ctx), void* ctx, tw_tensor** out) {
  return blob(data, ndim, shape, strides, dtype, device, release, ctx, out, true);
}

tw_status tw_tensor_zeros(int32_t ndim, const int64_t* shape, DLDataType dtype, tw_tensor** out) {
  if (!out) return null_arg("out");
  *out = nullptr;
  return guarded([&] { *out = wrap(tw::Tensor::zeros(shape_arg(ndim, shape), tw::DType::from_dlpack(dtype)), true); });
}

tw_status tw_tensor_empty(int32_t ndim, const int64_t* shape, DLDataType dtype, tw_tensor** out) {
  if (!out) return null_arg("out");
  *out = nullptr;
  return guarded([&] { *out = wrap(tw::Tensor::empty(shape_arg(ndim, shape), tw::DType::from_dlpack(dtype)), true); });
}

tw_status tw_tensor_share(const tw_tensor* t, tw_tensor** out) {
  return tensor_op(t, out, Result::view, [&](const tw::Tensor& x) { return x; });
}

void tw_tensor_free(tw_tensor* t) { delete t; }

int32_t tw_tensor_ndim(const tw_tensor* t) { return t ? static_cast<int32_t>(t->t.ndim()) : 0; }
const int64_t* tw_tensor_shape(const tw_tensor* t) { return t ? t->t.shape().data() : nullptr; }
const int64_t* tw_tensor_strides(const tw_tensor* t) { return t ? t->t.strides().data() : nullptr; }
int64_t tw_tensor_byte_offset(const tw_tensor* t) { return t ? t->t.byte_offset() : 0; }
void* tw_tensor_data(const tw_tensor* t) {
  if (!t || !t->t.defined()) return nullptr;
  t->t.buffer().mark_escaped();
  return t->t.data_ptr();
}
void* tw_tensor_data_borrowed(const tw_tensor* t) { return t && t->t.defined() ? t->t.data_ptr() : nullptr; }
int64_t tw_tensor_numel(const tw_tensor* t) { return t && t->t.defined() ? t->t.numel() : 0; }
int64_t tw_tensor_nbytes(const tw_tensor* t) { return t && t->t.defined() ? t->t.nbytes() : 0; }
DLDataType tw_tensor_dtype(const tw_tensor* t) { return t ? t->t.dtype().to_dlpack() : DLDataType{0, 0, 0}; }
DLDevice tw_tensor_device(const tw_tensor* t) { return t ? t->t.device().to_dlpack() : DLDevice{kDLCPU, 0}; }
int tw_tensor_is_contiguous(const tw_tensor* t) { return t && t->t.is_contiguous() ? 1 : 0; }
int tw_tensor_readonly(const tw_tensor* t) { return t && t->t.readonly() ? 1 : 0; }
int tw_tensor_is_exclusive(const tw_tensor* t) {
  if (!t || !t->owned || !t->t.defined() || t->t.readonly()) return 0;
  if (t->t.buffer_ptr().use_count() != 1) return 0;
  // use_count() is a relaxed load: order this thread's coming writes after everything other owners did before
  // they let go (their reads, a mark_escaped), as Arc::get_mut does. (GCC refuses fences under TSan, which does
  // not model them; the TSan build leaves it out.)
#if !defined(__SANITIZE_THREAD__)
  std::atomic_thread_fence(std::memory_order_acquire);
#endif
  return t->t.buffer().escaped() ? 0 : 1;
}

const char* tw_tensor_transport(const tw_tensor* t) {
  const char* how = t && t->t.defined() ? t->t.buffer().transport() : nullptr;
  return how ? how : "";
}

int tw_cuda_is_available(void) { return tw::cuda::is_available() ? 1 : 0; }
int tw_cuda_device_count(void) { return tw::cuda::device_count(); }

size_t tw_cuda_status(char* buf, size_t len) {
  return string_out(buf, len, [] { return tw::cuda::status(); });
}

intptr_t tw_tensor_stream(const tw_tensor* t) { return t && t->t.defined() ? t->t.stream().value_or(0) : 0; }

tw_status tw_tensor_to(const tw_tensor* t, DLDevice device, intptr_t stream, int32_t copy, tw_tensor** out) {
  return tensor_op(t, out, Result::view_or_copy, [&](const tw::Tensor& x) {
    if (copy < TW_COPY_IF_NEEDED || copy > TW_COPY_NEVER)
      throw tw::Error(tw::ErrorCode::invalid_argument, "copy " + std::to_string(copy) + " is not a tw_copy_mode");
    const tw::Device dev = tw::Device::from_dlpack(device);
    std::optional<bool> c;
    if (copy == TW_COPY_ALWAYS) c = true;
    if (copy == TW_COPY_NEVER) c = false;
    return x.to(dev, stream == 0 ? std::nullopt : std::optional<intptr_t>(stream), c);
  });
}

tw_status tw_tensor_pin(const tw_tensor* t, tw_tensor** out) {
  return tensor_op(t, out, Result::view_or_copy, [&](const tw::Tensor& x) { return x.pin(); });
}

tw_status tw_tensor_empty_on(int32_t ndim, const int64_t* shape, DLDataType dtype, DLDevice device, tw_tensor** out) {
  if (!out) return null_arg("out");
  *out = nullptr;
  return guarded([&] {
    *out = wrap(tw::Tensor::empty(shape_arg(ndim, shape), tw::DType::from_dlpack(dtype), tw::Device::from_dlpack(device)),
                true);
  });
}

tw_status tw_tensor_contiguous(const tw_tensor* t, tw_tensor** out) {
  return tensor_op(t, out, Result::view_or_copy, [&](const tw::Tensor& x) { return x.contiguous(); });
}

tw_status tw_tensor_slice(const tw_tensor* t, int64_t dim, int64_t start, int64_t stop, int64_t step, tw_tensor** out) {
  return tensor_op(t, out, Result::view, [&](const tw::Tensor& x) { return x.slice(dim, start, stop, step); });
}

tw_status tw_tensor_permute(const tw_tensor* t, const int64_t* dims, int32_t ndim, tw_tensor** out) {
  return tensor_op(t, out, Result::view, [&](const tw::Tensor& x) {
    if (ndim < 0 || (ndim > 0 && !dims))
      throw tw::Error(tw::ErrorCode::invalid_argument, "dims is NULL or ndim is negative");
    rank_arg(ndim);
    return x.permute(tw::Dims(dims, static_cast<size_t>(ndim)));
  });
}

tw_status tw_tensor_transpose(const tw_tensor* t, int64_t dim0, int64_t dim1, tw_tensor** out) {
  return tensor_op(t, out, Result::view, [&](const tw::Tensor& x) { return x.transpose(dim0, dim1); });
}

tw_status tw_tensor_select(const tw_tensor* t, int64_t dim, int64_t index, tw_tensor** out) {
  return tensor_op(t, out, Result::view, [&](const tw::Tensor& x) { return x.select(dim, index); });
}

tw_status tw_tensor_view(const tw_tensor* t, int32_t ndim, const int64_t* shape, tw_tensor** out) {
  return tensor_op(t, out, Result::view, [&](const tw::Tensor& x) { return x.view(shape_arg(ndim, shape)); });
}

tw_status tw_tensor_reshape(const tw_tensor* t, int32_t ndim, const int64_t* shape, tw_tensor** out) {
  return tensor_op(t, out, Result::view_or_copy,
                   [&](const tw::Tensor& x) { return x.reshape(shape_arg(ndim, shape)); });
}

tw_status tw_tensor_clone(const tw_tensor* t, tw_tensor** out) {
  return tensor_op(t, out, Result::copy, [&](const tw::Tensor& x) { return x.copy(); });
}

tw_status tw_copy(const tw_tensor* src, const tw_tensor* dst) {
  if (!src) return null_arg("src");
  if (!dst) return null_arg("dst");
  return guarded([&] { tw::copy(src->t, dst->t); });
}

void tw_set_num_threads(int n) { tw::set_num_threads(n > tw::kMaxThreads ? tw::kMaxThreads : n); }
void tw_set_buffer_cache_limit(size_t nbytes) { tw::set_buffer_cache_limit(nbytes); }
size_t tw_buffer_cache_limit(void) { return tw::buffer_cache_limit(); }

// ---- metadata values -------------------------------------------------------------------------------------------
tw_value* tw_value_none(void) { return new_value(tw::Value()); }
tw_value* tw_value_bool(int b) { return new_value(tw::Value(b != 0)); }
tw_value* tw_value_int(int64_t v) { return new_value(tw::Value(static_cast<long long>(v))); }
tw_value* tw_value_float(double v) { return new_value(tw::Value(v)); }
tw_value* tw_value_string(const char* s, size_t len) {
  tw_value* out = nullptr;
  guarded([&] { out = new_handle(tw::Value(utf8_arg(s, len, "string"))); });
  return out;
}
tw_value* tw_value_bytes(const void* data, size_t len) {
  tw_value* out = nullptr;
  guarded([&] {
    if (!data && len) throw tw::Error(tw::ErrorCode::invalid_argument, "bytes data is NULL");
    out = new_handle(tw::Value::bytes(len ? std::string(static_cast<const char*>(data), len) : std::string()));
  });
  return out;
}
tw_value* tw_value_list(void) { return new_value(tw::Value::list()); }
tw_value* tw_value_tuple(void) { return new_value(tw::Value::tuple()); }
tw_value* tw_value_dict(void) { return new_value(tw::Value::dict()); }
void tw_value_free(tw_value* v) { delete val(v); }
tw_value* tw_value_clone(const tw_value* v) {
  if (!v) {
    null_arg("value");
    return nullptr;
  }
  tw_value* out = nullptr;
  guarded([&] {
    check_depth(*val(v), "the value");
    out = new_handle(*val(v));
  });
  return out;
}

tw_status tw_value_append(tw_value* container, tw_value* item) {
  if (item && item == container) return fail(TW_ERR_INVALID_ARGUMENT, "cannot append a value to itself");
  std::unique_ptr<tw::Value> owned(val(item));  // consumed whatever happens
  if (!container) return null_arg("container");
  if (!item) return null_arg("item");
  return guarded([&] {
    const auto k = val(container)->kind();
    if (k != tw::Value::Kind::list && k != tw::Value::Kind::tuple)
      throw tw::Error(tw::ErrorCode::type_mismatch, std::string("tw_value_append needs a list or tuple, not a ") +
                                                        tw::value_kind_name(k));
    val(container)->items().push_back(std::move(*owned));
  });
}

tw_status tw_value_dict_set(tw_value* dict, const char* key, size_t key_len, tw_value* value) {
  if (value && value == dict) return fail(TW_ERR_INVALID_ARGUMENT, "cannot set a dict as a value of itself");
  std::unique_ptr<tw::Value> owned(val(value));  // consumed whatever happens
  if (!dict) return null_arg("dict");
  if (!value) return null_arg("value");
  return guarded([&] {
    if (val(dict)->kind() != tw::Value::Kind::dict)
      throw tw::Error(tw::ErrorCode::type_mismatch, std::string("tw_value_dict_set needs a dict, not a ") +
                                                        tw::value_kind_name(val(dict)->kind()));
    val(dict)->set(utf8_arg(key, key_len, "key"), std::move(*owned));
  });
}

tw_value_kind tw_value_get_kind(const tw_value* v) {
  return v ? static_cast<tw_value_kind>(static_cast<int>(val(v)->kind())) : TW_VALUE_NONE;
}
tw_status tw_value_get_bool(const tw_value* v, int* out) {
  if (!v) return null_arg("value");
  if (!out) return null_arg("out");
  return guarded([&] { *out = val(v)->as_bool() ? 1 : 0; });
}
tw_status tw_value_get_int(const tw_value* v, int64_t* out) {
  if (!v) return null_arg("value");
  if (!out) return null_arg("out");
  return guarded([&] { *out = val(v)->as_int(); });
}
tw_status tw_value_get_float(const tw_value* v, double* out) {
  if (!v) return null_arg("value");
  if (!out) return null_arg("out");
  return guarded([&] { *out = val(v)->as_float(); });
}
tw_status tw_value_get_data(const tw_value* v, const char** data, size_t* len) {
  if (!v) return null_arg("value");
  if (!data) return null_arg("data");
  if (!len) return null_arg("len");
  return guarded([&] {
    const auto k = val(v)->kind();
    if (k != tw::Value::Kind::string && k != tw::Value::Kind::bytes)
      throw tw::Error(tw::ErrorCode::type_mismatch,
                      std::string("tw_value_get_data needs a str or bytes value, not a ") + tw::value_kind_name(k));
    const std::string& s = k == tw::Value::Kind::bytes ? val(v)->as_bytes() : val(v)->as_string();
    *data = s.c_str();
    *len = s.size();
  });
}
size_t tw_value_len(const tw_value* v) {
  if (!v) return 0;
  switch (val(v)->kind()) {
    case tw::Value::Kind::list:
    case tw::Value::Kind::tuple: return val(v)->items().size();
    case tw::Value::Kind::dict: return val(v)->keys().size();
    default: return 0;
  }
}
const tw_value* tw_value_item(const tw_value* v, size_t i) {
  if (!v) return nullptr;
  const std::vector<tw::Value>* items = nullptr;
  switch (val(v)->kind()) {
    case tw::Value::Kind::list:
    case tw::Value::Kind::tuple: items = &val(v)->items(); break;
    case tw::Value::Kind::dict: items = &val(v)->values(); break;
    default: return nullptr;
  }
  if (i >= items->size()) return nullptr;
  return handle(&(*items)[i]);
}
tw_status tw_value_key(const tw_value* v, size_t i, const char** key, size_t* len) {
  if (!v) return null_arg("dict");
  if (!key) return null_arg("key");
  if (!len) return null_arg("len");
  return guarded([&] {
    const auto& keys = val(v)->keys();
    if (i >= keys.size())
      throw tw::Error(tw::ErrorCode::out_of_range,
                      "key index " + std::to_string(i) + " is out of range for a dict of " + std::to_string(keys.size()));
    *key = keys[i].c_str();
    *len = keys[i].size();
  });
}
const tw_value* tw_value_dict_get(const tw_value* dict, const char* key, size_t key_len) {
  if (!dict || (!key && key_len) || val(dict)->kind() != tw::Value::Kind::dict) return nullptr;
  const tw::Value* found = val(dict)->find(std::string_view(key ? key : "", key_len));
  return found ? handle(found) : nullptr;
}

tw_status tw_tensor_metadata(const tw_tensor* t, tw_value** out) {
  if (!t) return null_arg("tensor");
  if (!out) return null_arg("out");
  *out = nullptr;
  return guarded([&] { *out = new_handle(t->t.metadata().as_value()); });
}

tw_status tw_tensor_set_metadata(tw_tensor* t, const tw_value* dict) {
  if (!t) return null_arg("tensor");
  return guarded([&] { t->t.metadata() = metadata_arg(dict, "metadata"); });
}

// ---- publish/subscribe -------------------------------------------------------------------------------------------
void tw_publisher_options_init_sized(tw_publisher_options* o, size_t size) {
  const tw::PublisherOptions cpp;
  tw_publisher_options d{};
  d.on_full = TW_ON_FULL_BLOCK;
  d.depth = cpp.depth;
  d.max_metadata_bytes = cpp.max_metadata_bytes;
  d.max_buffers = cpp.max_buffers;
  d.pool_bytes = cpp.pool_bytes;
  d.max_subscribers = cpp.max_subscribers;
  d.protect_sent_loans = cpp.protect_sent_loans ? 1 : 0;
  d.allow_other_users = cpp.allow_other_users ? 1 : 0;
  fill_sized(o, d, size);
}

void tw_subscriber_options_init_sized(tw_subscriber_options* o, size_t size) {
  tw_subscriber_options d{};
  d.device = DLDevice{kDLCPU, 0};
  fill_sized(o, d, size);
}

void tw_send_options_init_sized(tw_send_options* o, size_t size) {
  tw_send_options d{};
  d.copy = TW_COPY_IF_NEEDED;
  d.timeout_ns = -1;
  fill_sized(o, d, size);
}

tw_status tw_publisher_new(const char* name, const tw_publisher_options* options, tw_publisher** out) {
  if (!name) return null_arg("name");
  if (!out) return null_arg("out");
  *out = nullptr;
  return guarded([&] {
    const tw_publisher_options o =
        read_options(options, tw_publisher_options_init, kPublisherOptionsV1, "tw_publisher_options");
    tw::PublisherOptions po;
    po.on_full = on_full_arg(o.on_full);
    po.depth = static_cast<size_t>(o.depth);
    po.max_metadata_bytes = static_cast<size_t>(o.max_metadata_bytes);
    po.max_buffers = static_cast<size_t>(o.max_buffers);
    po.pool_bytes = static_cast<size_t>(o.pool_bytes);
    po.max_subscribers = static_cast<size_t>(o.max_subscribers);
    po.protect_sent_loans = o.protect_sent_loans != 0;
    po.allow_other_users = o.allow_other_users != 0;
    po.listen = o.listen ? o.listen : "";
    po.token = o.token ? o.token : "";
    po.insecure = o.insecure != 0;
    *out = new tw_publisher{tw::Publisher(name, po)};
  });
}

void tw_publisher_free(tw_publisher* p) { delete p; }
void tw_publisher_close(tw_publisher* p) {
  if (p) p->p.close();
}

tw_status tw_publisher_loan(tw_publisher* p, int32_t ndim, const int64_t* shape, DLDataType dtype, int64_t timeout_ns,
                            tw_tensor** out) {
  if (!p) return null_arg("publisher");
  if (!out) return null_arg("out");
  *out = nullptr;
  return guarded([&] {
    *out = wrap(p->p.loan(shape_arg(ndim, shape), tw::DType::from_dlpack(dtype), timeout_arg(timeout_ns)), true);
  });
}

tw_status tw_publisher_loan_on(tw_publisher* p, int32_t ndim, const int64_t* shape, DLDataType dtype, DLDevice device,
                               int64_t timeout_ns, tw_tensor** out) {
  if (!p) return null_arg("publisher");
  if (!out) return null_arg("out");
  *out = nullptr;
  return guarded([&] {
    *out = wrap(p->p.loan(shape_arg(ndim, shape), tw::DType::from_dlpack(dtype), tw::Device::from_dlpack(device),
                          timeout_arg(timeout_ns)),
                true);
  });
}

tw_status tw_publisher_send(tw_publisher* p, const tw_tensor* t, const tw_value* extra, int64_t timeout_ns,
                            size_t* delivered) {
  tw_send_options o;
  tw_send_options_init(&o);
  o.extra = extra;
  o.timeout_ns = timeout_ns;
  return tw_publisher_send_with(p, t, &o, delivered);
}

tw_status tw_publisher_send_with(tw_publisher* p, const tw_tensor* t, const tw_send_options* options,
                                 size_t* delivered) {
  if (delivered) *delivered = 0;
  if (!p) return null_arg("publisher");
  if (!t) return null_arg("tensor");
  return guarded([&] {
    const tw_send_options o = read_options(options, tw_send_options_init, kSendOptionsV1, "tw_send_options");
    tw::SendOptions so;
    so.metadata = metadata_arg(o.extra, "extra metadata");
    so.timeout = timeout_arg(o.timeout_ns);
    switch (copy_mode(o.copy)) {
      case tw::CopyMode::always: so.copy = true; break;
      case tw::CopyMode::never: so.copy = false; break;
      default: break;
    }
    if (o.stream != 0) so.stream = o.stream;
    const size_t n = p->p.send(t->t, so);
    // The caller keeps a loan that subscribers now read: it must never look exclusive again (whatever
    // protect_sent_loans says). Each loan gets a new Buffer, so the mark goes with this message. A send that
    // reached nobody (or failed, above) leaves the loan as it was.
    if (n > 0 && p->p.owns(t->t)) t->t.buffer().mark_escaped();
    if (delivered) *delivered = n;
  });
}

tw_status tw_publisher_send_move(tw_publisher* p, tw_tensor** t, const tw_value* extra, int64_t timeout_ns,
                                 size_t* delivered) {
  if (delivered) *delivered = 0;
  if (!p) return null_arg("publisher");
  if (!t || !*t) return null_arg("tensor");
  return guarded([&] {
    const tw::Metadata m = metadata_arg(extra, "extra metadata");
    // Other handles of a loan outlive this one (they keep the Buffer alive): they must not look exclusive once
    // subscribers read the memory. Decided before the move, marked only after a send that reached someone.
    const tw::Buffer* shared_loan =
        (*t)->t.buffer_ptr().use_count() > 1 && p->p.owns((*t)->t) ? &(*t)->t.buffer() : nullptr;
    // send(Tensor&&) consumes the tensor only when it succeeds: on failure the handle still holds it.
    const size_t n = p->p.send(std::move((*t)->t), m, timeout_arg(timeout_ns));
    if (n > 0 && shared_loan) shared_loan->mark_escaped();
    delete *t;
    *t = nullptr;
    if (delivered) *delivered = n;
  });
}

size_t tw_publisher_address(const tw_publisher* p, char* buf, size_t len) {
  return string_out(buf, len, [p] { return p ? p->p.address() : std::string(); });
}

size_t tw_ucx_library(char* buf, size_t len) {
  return string_out(buf, len, [] { return tw::net::ucx_library(); });
}
size_t tw_ucx_version(char* buf, size_t len) {
  return string_out(buf, len, [] { return tw::net::ucx_version(); });
}
size_t tw_ucx_unavailable_reason(char* buf, size_t len) {
  return string_out(buf, len, [] { return tw::net::ucx_unavailable_reason(); });
}
int tw_prefer_ucx_library(const char* path) {
  if (!path) return 0;
  try {
    return tw::net::prefer_ucx_library(path) ? 1 : 0;
  } catch (...) {  // (out of memory)
    return 0;
  }
}

size_t tw_publisher_subscriber_count(const tw_publisher* p) {
  if (!p) return 0;
  try {
    return p->p.subscriber_count();
  } catch (...) {
    return 0;
  }
}
uint64_t tw_publisher_dropped(const tw_publisher* p) {
  if (!p) return 0;
  try {
    return p->p.dropped();
  } catch (...) {
    return 0;
  }
}
int tw_publisher_closed(const tw_publisher* p) { return !p || p->p.closed() ? 1 : 0; }

tw_status tw_subscriber_new(const char* name, const tw_subscriber_options* options, tw_subscriber** out) {
  if (!name) return null_arg("name");
  if (!out) return null_arg("out");
  *out = nullptr;
  return guarded([&] {
    const tw_subscriber_options o =
        read_options(options, tw_subscriber_options_init, kSubscriberOptionsV1, "tw_subscriber_options");
    tw::SubscriberOptions so;
    so.allow_other_users = o.allow_other_users != 0;
    so.connect = o.connect ? o.connect : "";
    so.token = o.token ? o.token : "";
    if (o.has_device) so.device = tw::Device::from_dlpack(o.device);
    *out = new tw_subscriber{tw::Subscriber(name, so)};
  });
}

void tw_subscriber_free(tw_subscriber* s) { delete s; }
void tw_subscriber_close(tw_subscriber* s) {
  if (s) s->s.close();
}

tw_status tw_subscriber_recv(tw_subscriber* s, int64_t timeout_ns, tw_tensor** out) {
  if (!s) return null_arg("subscriber");
  if (!out) return null_arg("out");
  *out = nullptr;
  bool timed_out = false;
  const tw_status st = guarded([&] {
    // A negative timeout waits as long as it takes (recv_message caps a huge wait at "forever").
    const auto wait = timeout_ns < 0 ? std::chrono::nanoseconds::max() : std::chrono::nanoseconds(timeout_ns);
    std::optional<tw::Subscriber::Received> got = s->s.recv_message(wait);
    if (!got) {
      timed_out = !s->s.closed();
      return;
    }
    if (!got->single) {
      const size_t n = got->message.tensors.size();
      throw tw::Error(tw::ErrorCode::unsupported,
                      "a message of " + tw::detail::counted(int64_t(n), "tensor") +
                          " (sent as one dict, list or tuple) arrived on \"" +
                          s->s.name() + "\"; the C ABI receives messages of one tensor, so it was skipped: "
                          "send the tensors one per message for C and Rust subscribers");
    }
    *out = wrap(std::move(got->message.tensors.front()), false);
  });
  if (st != TW_OK || *out) return st;
  if (!timed_out) {
    try {
      const std::string why = s->s.why_ended();
      // (A subscriber closed here released what was queued: why says how many; the publisher's end comes after
      // the last message.)
      const bool closed_here = why.rfind("this subscriber was closed", 0) == 0;
      if (!why.empty())
        return fail(TW_END_OF_STREAM,
                    ("end of stream: " + why + (closed_here ? "" : ", and every message was received")).c_str());
    } catch (...) {  // (no memory for the words: the generic text says enough)
    }
    return fail(TW_END_OF_STREAM, "end of stream: the publisher closed or died, or this subscriber was closed");
  }
  return guarded([&] {
    const std::string why = s->s.waiting_for();
    throw tw::Error(tw::ErrorCode::timeout, "no message on \"" + s->s.name() + "\" within " +
                                                tw::detail::duration_text(timeout_ns) +
                                                (why.empty() ? std::string() : " (" + why + ")"));
  });
}

int tw_subscriber_closed(const tw_subscriber* s) { return !s || s->s.closed() ? 1 : 0; }
int tw_subscriber_connected(const tw_subscriber* s) { return s && s->s.connected() ? 1 : 0; }
uint64_t tw_subscriber_dropped(const tw_subscriber* s) { return s ? s->s.dropped() : 0; }
int tw_subscriber_fileno(tw_subscriber* s) {
  if (!s) return -1;
  try {
    return s->s.fileno();
  } catch (...) {
    return -1;
  }
}

}  // extern "C"
