#include <cstring>
#include <memory>
#include <vector>

#include "core/checked.hpp"
#include "tensorwire/interop.hpp"

namespace tw {
namespace {

// Owns everything an exported struct points to: a reference to the tensor (so its buffer stays alive) and the
// shape/strides arrays. The DLPack struct is the first member so `manager_ctx` can point at the whole context.
template <class Managed>
struct ExportCtx {
  Managed managed{};
  Tensor tensor;  // its shape/strides storage is what the DLTensor points at (never mutated while exported)
};

template <class Managed>
void fill(ExportCtx<Managed>& ctx, const Tensor& t) {
  ctx.tensor = t;
  DLTensor& dl = ctx.managed.dl_tensor;
  dl.data = t.numel() == 0 ? nullptr : t.data_ptr();  // the spec asks for NULL data on zero-size tensors
  dl.device = t.device().to_dlpack();
  dl.ndim = static_cast<int32_t>(t.ndim());
  dl.dtype = t.dtype().to_dlpack();
  // DLTensor's fields are non-const by the spec's declaration; consumers only read them.
  dl.shape = t.ndim() ? const_cast<int64_t*>(ctx.tensor.shape().data()) : nullptr;
  dl.strides = t.ndim() ? const_cast<int64_t*>(ctx.tensor.strides().data()) : nullptr;
  dl.byte_offset = 0;
  ctx.managed.manager_ctx = &ctx;
}

template <class Managed>
void delete_export(Managed* m) {
  if (m) delete static_cast<ExportCtx<Managed>*>(m->manager_ctx);
}

// Calls a producer's deleter exactly once: on failure during import, or when the last view is released.
template <class Managed>
struct ImportOwner {
  Managed* m;
  explicit ImportOwner(Managed* p) : m(p) {}
  ImportOwner(const ImportOwner&) = delete;
  ImportOwner& operator=(const ImportOwner&) = delete;
  ~ImportOwner() {
    if (m && m->deleter) m->deleter(m);
  }
};

template <class Managed>
Tensor import(Managed* m, bool readonly, bool padded) {
  // From here on the struct is ours: `owner` calls the deleter if anything below throws. make_shared itself may
  // throw before the owner exists: then the deleter runs here.
  std::shared_ptr<ImportOwner<Managed>> owner;
  try {
    owner = std::make_shared<ImportOwner<Managed>>(m);
  } catch (...) {
    if (m->deleter) m->deleter(m);
    throw;
  }
  const DLTensor& dl = m->dl_tensor;
  Layout l = validate_dltensor(dl, padded);
  return view_foreign(reinterpret_cast<uintptr_t>(dl.data), std::move(l), Device::from_dlpack(dl.device),
                      std::move(owner), readonly);
}

}  // namespace

Layout validate_dltensor(const DLTensor& dl, bool subbyte_padded) {
  if (dl.ndim < 0 || static_cast<size_t>(dl.ndim) > kMaxRank)
    throw Error(ErrorCode::invalid_argument, "DLPack tensor: ndim " + std::to_string(dl.ndim) +
                                                 " is outside [0, " + std::to_string(kMaxRank) + "]");
  if (dl.ndim > 0 && dl.shape == nullptr)
    throw Error(ErrorCode::invalid_argument, "DLPack tensor: shape is NULL for ndim " + std::to_string(dl.ndim));
  Layout l;
  l.dtype = DType::from_dlpack(dl.dtype);
  l.subbyte_padded = subbyte_padded && l.dtype.is_subbyte();
  const size_t nd = static_cast<size_t>(dl.ndim);
  l.shape = nd ? Shape(dl.shape, nd) : Shape();
  for (size_t i = 0; i < nd; ++i)
    if (l.shape[i] < 0)
      throw Error(ErrorCode::invalid_argument, "DLPack tensor: shape " + l.shape.str() +
                                                   " has a negative size in dimension " + std::to_string(i));
  if (nd && dl.strides) {
    l.strides = Strides(dl.strides, nd);
  } else {
    // NULL strides: legacy and pre-1.2 producers mean C-contiguous.
    l.strides = Layout::contiguous_strides(l.shape);
  }
  if (dl.byte_offset > static_cast<uint64_t>(INT64_MAX))
    throw Error(ErrorCode::overflow, "DLPack tensor: byte_offset " + std::to_string(dl.byte_offset) + " is too large");
  l.byte_offset = static_cast<int64_t>(dl.byte_offset);
  l.validate();
  if (l.numel() > 0 && dl.data == nullptr)
    throw Error(ErrorCode::invalid_argument,
                "DLPack tensor: data is NULL but shape " + l.shape.str() + " has elements");
  return l;
}

DLManagedTensorVersioned* to_dlpack(const Tensor& t, const DLPackExportOptions& options) {
  if (!t.defined()) throw Error(ErrorCode::invalid_argument, "to_dlpack: undefined tensor");
  if (options.max_version.major != DLPACK_MAJOR_VERSION)
    throw Error(ErrorCode::version_mismatch, "to_dlpack: the consumer asked for DLPack " +
                                                 std::to_string(options.max_version.major) + "." +
                                                 std::to_string(options.max_version.minor) +
                                                 "; tensorwire produces major version " +
                                                 std::to_string(DLPACK_MAJOR_VERSION));
  const uint32_t minor = std::min<uint32_t>(options.max_version.minor, DLPACK_MINOR_VERSION);
  const auto too_new = [&](const std::string& what, uint32_t need) {
    throw Error(ErrorCode::version_mismatch, "to_dlpack: " + what + " needs DLPack 1." + std::to_string(need) +
                                                 " but the consumer understands at most " +
                                                 std::to_string(options.max_version.major) + "." +
                                                 std::to_string(options.max_version.minor));
  };
  if (const uint32_t need = dlpack_minor_for(t.dtype()); need > minor) too_new(t.dtype().name(), need);
  if (const uint32_t need = dlpack_minor_for(t.device()); need > minor) too_new("device " + t.device().str(), need);
  auto ctx = std::make_unique<ExportCtx<DLManagedTensorVersioned>>();
  fill(*ctx, t);
  auto& m = ctx->managed;
  m.version = DLPackVersion{DLPACK_MAJOR_VERSION, minor};
  m.deleter = delete_export<DLManagedTensorVersioned>;
  m.flags = 0;
  if (t.readonly()) m.flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
  if (options.is_copied) m.flags |= DLPACK_FLAG_BITMASK_IS_COPIED;
  if (t.subbyte_padded()) m.flags |= DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED;
  return &ctx.release()->managed;
}

DLManagedTensor* to_dlpack_unversioned(const Tensor& t) {
  if (!t.defined()) throw Error(ErrorCode::invalid_argument, "to_dlpack_unversioned: undefined tensor");
  if (t.readonly())
    throw Error(ErrorCode::read_only, "to_dlpack_unversioned: the tensor is read-only and a legacy DLManagedTensor "
                                      "cannot say so; export a versioned DLManagedTensorVersioned instead");
  if (t.subbyte_padded())
    throw Error(ErrorCode::unsupported, "to_dlpack_unversioned: a padded " + t.dtype().name() +
                                            " tensor needs the versioned struct's IS_SUBBYTE_TYPE_PADDED flag");
  auto ctx = std::make_unique<ExportCtx<DLManagedTensor>>();
  fill(*ctx, t);
  ctx->managed.deleter = delete_export<DLManagedTensor>;
  return &ctx.release()->managed;
}

Tensor from_dlpack(DLManagedTensorVersioned* m) {
  if (!m) throw Error(ErrorCode::invalid_argument, "from_dlpack: null DLManagedTensorVersioned");
  if (m->version.major != DLPACK_MAJOR_VERSION) {
    // The spec: on a major mismatch only the deleter may be touched, and it must be called.
    const uint32_t major = m->version.major, minor = m->version.minor;
    if (m->deleter) m->deleter(m);
    throw Error(ErrorCode::version_mismatch, "from_dlpack: the producer's DLPack version " + std::to_string(major) +
                                                 "." + std::to_string(minor) + " has major version " +
                                                 std::to_string(major) + "; tensorwire understands major " +
                                                 std::to_string(DLPACK_MAJOR_VERSION));
  }
  const bool ro = (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0;
  const bool padded = (m->flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED) != 0;
  return import(m, ro, padded);
}

Tensor from_dlpack(DLManagedTensor* m) {
  if (!m) throw Error(ErrorCode::invalid_argument, "from_dlpack: null DLManagedTensor");
  return import(m, false, false);
}

}  // namespace tw
