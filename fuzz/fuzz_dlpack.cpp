// fuzz_dlpack — DLPack import from hostile producers: tw::validate_dltensor and tw::from_dlpack.
//
// Properties checked:
//  1. Only tw::Error escapes; no sanitizer report.
//  2. The producer's deleter runs exactly once, whether the import throws or succeeds (then when the last view
//     dies), and nothing touches the struct afterwards (the deleter frees it, so ASan would see it).
//  3. validate_dltensor accepts only what the harness's own reading of the struct accepts, with the same layout.
//  4. An imported host tensor lies inside the harness buffer and contiguous() reproduces every element a naive
//     walk reads (the buffer is allocated to the exact size, so any read past the claimed span is an ASan report).
//     Host devices are only used when the harness proved the span fits; otherwise the device becomes kDLCUDA so
//     the library never dereferences the pointer.
//  5. Exporting an imported tensor and importing it again gives the same view.
//
// Input (little-endian, missing bytes read as 0; see fuzz/make_corpus.py):
//   u8 mode   bits 0-1 kind (0 DLTensor only, 1 versioned, 2 legacy, 3 versioned), 2 strides NULL, 3 data NULL,
//             4 shape NULL, 5 deleter NULL, 6 sub-byte padded (kind 0), 7 wide (8-byte fields below)
//   i8 ndim, u8 code, u8 bits, u16 lanes, i32 device_type, i32 device_id
//   byte_offset: u64 if wide else u8;  flags: u64 if wide else u8;  major, minor: u32 if wide else u8 each
//   u16 buffer size (mod 8193), u16 position of `data` in the buffer (mod size + 1)
//   wide only: u64 fake address used as `data` when the span does not fit the buffer (0: use the buffer anyway)
//   ndim shape values, then (unless strides NULL) ndim stride values: i64 if wide else i8
//   the rest: buffer contents
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_util.hpp"
#include "tensorwire/interop.hpp"

namespace {

using twfuzz::ByteReader;

struct ProducerCtx {
  int* deleted;
  std::vector<int64_t> shape, strides;
};

template <class Managed>
void producer_deleter(Managed* self) {
  auto* ctx = static_cast<ProducerCtx*>(self->manager_ctx);
  ++*ctx->deleted;
  delete ctx;
  delete self;
}

bool same_layout(const tw::Layout& a, const tw::Layout& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.strides == b.strides && a.byte_offset == b.byte_offset &&
         a.subbyte_padded == b.subbyte_padded;
}

// Everything checked on a successful import. `elem0` is the harness's own idea of element 0's address.
void check_import(const tw::Tensor& t, const tw::Layout& pre, bool fits, const uint8_t* buf, size_t bufsize,
                  uintptr_t elem0, tw::Device dev, bool readonly) {
  TW_FUZZ_CHECK(t.defined(), "from_dlpack returned an undefined tensor");
  // (the host is one device: a CPU device of any number imports as cpu)
  const tw::Device want = dev.type == kDLCPU ? tw::Device::cpu() : dev;
  TW_FUZZ_CHECK(t.device() == want, "device %s became %s", dev.str().c_str(), t.device().str().c_str());
  TW_FUZZ_CHECK(t.readonly() == readonly, "read-only flag lost");
  TW_FUZZ_CHECK(t.dtype() == pre.dtype && t.shape() == pre.shape && t.strides() == pre.strides,
                "layout changed: shape %s strides %s -> shape %s strides %s", pre.shape.str().c_str(),
                pre.strides.str().c_str(), t.shape().str().c_str(), t.strides().str().c_str());
  // Queries that any validated layout must answer without undefined behaviour.
  (void)t.nbytes();
  (void)t.is_dense();
  (void)t.has_broadcast();
  (void)t.layout().may_overlap();
  const int64_t n = t.numel();
  if (n == 0) return;
  const auto base = reinterpret_cast<uintptr_t>(t.buffer().base());
  const tw::ByteSpan sp = t.layout().byte_span();
  TW_FUZZ_CHECK(base + static_cast<uint64_t>(t.byte_offset()) == elem0,
                "element 0 moved: expected %#llx, buffer base %#llx + byte_offset %lld",
                static_cast<unsigned long long>(elem0), static_cast<unsigned long long>(base),
                static_cast<long long>(t.byte_offset()));
  TW_FUZZ_CHECK(t.byte_offset() + sp.begin >= 0 &&
                    static_cast<uint64_t>(t.byte_offset() + sp.end) <= t.buffer().size(),
                "layout leaves its own buffer");
  if (!dev.is_host_accessible()) return;
  TW_FUZZ_CHECK(fits, "a host tensor was imported although the harness could not place it in its buffer");
  const auto lo = reinterpret_cast<uintptr_t>(buf);
  TW_FUZZ_CHECK(base >= lo && base + t.buffer().size() <= lo + bufsize,
                "the imported buffer [%#llx, +%zu) is not inside the producer's [%#llx, +%zu)",
                static_cast<unsigned long long>(base), t.buffer().size(), static_cast<unsigned long long>(lo),
                bufsize);
  if (n > twfuzz::kMaxCheckedElements) return;
  tw::Tensor c = t.contiguous();
  twfuzz::check_gather(t.layout(), reinterpret_cast<const uint8_t*>(elem0), c, false, 0);
  if (t.is_contiguous())
    TW_FUZZ_CHECK(c.data_ptr() == t.data_ptr(), "contiguous() copied an already C-contiguous tensor");
}

// Export and re-import: the round trip must give the same view of the same memory.
void check_reexport(const tw::Tensor& t) {
  tw::Tensor back;
  try {
    back = tw::from_dlpack(tw::to_dlpack(t));
  } catch (const tw::Error&) {
    return;  // e.g. a consumer version that cannot carry the dtype
  }
  TW_FUZZ_CHECK(back.dtype() == t.dtype() && back.shape() == t.shape() && back.device() == t.device() &&
                    back.readonly() == t.readonly() && back.subbyte_padded() == t.subbyte_padded(),
                "to_dlpack/from_dlpack round trip changed the tensor");
  if (t.numel() > 0) {
    TW_FUZZ_CHECK(back.strides() == t.strides(), "round trip changed strides %s -> %s", t.strides().str().c_str(),
                  back.strides().str().c_str());
    TW_FUZZ_CHECK(back.data_ptr() == t.data_ptr(), "round trip moved element 0");
  }
  if (!t.readonly() && !t.subbyte_padded()) {
    try {
      tw::Tensor legacy = tw::from_dlpack(tw::to_dlpack_unversioned(t));
      TW_FUZZ_CHECK(legacy.shape() == t.shape(), "legacy round trip changed the shape");
    } catch (const tw::Error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  const uint8_t mode = in.u8();
  const int kind = mode & 3;
  const bool strides_null = mode & 4, data_null = mode & 8, shape_null = mode & 16, deleter_null = mode & 32;
  const bool padded_arg = mode & 64, wide = mode & 128;

  const int32_t ndim = in.read<int8_t>();
  DLDataType dt;
  dt.code = in.u8();
  dt.bits = in.u8();
  dt.lanes = in.read<uint16_t>();
  const int32_t dev_type = in.read<int32_t>();
  const int32_t dev_id = in.read<int32_t>();
  const uint64_t byte_offset = wide ? in.read<uint64_t>() : in.u8();
  const uint64_t flags = wide ? in.read<uint64_t>() : in.u8();
  const uint32_t major = wide ? in.read<uint32_t>() : in.u8();
  const uint32_t minor = wide ? in.read<uint32_t>() : in.u8();
  const size_t bufsize = in.read<uint16_t>() % 8193u;
  const size_t pos = in.read<uint16_t>() % (bufsize + 1);
  const uint64_t fake_addr = wide ? in.read<uint64_t>() : 0;

  const size_t nd = ndim > 0 ? static_cast<size_t>(ndim) : 0;
  std::vector<int64_t> shape(nd), strides(nd);
  for (auto& s : shape) s = in.sval(wide);
  if (!strides_null)
    for (auto& s : strides) s = in.sval(wide);

  // Exactly `bufsize` bytes: ASan's redzone starts right after the last byte any honest layout may touch.
  std::unique_ptr<uint8_t[]> buf(new uint8_t[bufsize ? bufsize : 1]);
  in.fill_rest(buf.get(), bufsize);

  const bool versioned = kind == 1 || kind == 3;
  const bool padded = kind == 0 ? padded_arg : versioned && (flags & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED);
  const bool readonly = versioned && (flags & DLPACK_FLAG_BITMASK_READ_ONLY);

  // The harness's own reading of the struct, to decide where `data` may point.
  tw::Layout pre;
  bool pre_ok = false;
  try {
    if (ndim < 0 || nd > tw::kMaxRank || (nd > 0 && shape_null) || byte_offset > uint64_t(INT64_MAX))
      throw tw::Error(tw::ErrorCode::invalid_argument, "harness: malformed");
    pre.dtype = tw::DType::from_dlpack(dt);
    pre.subbyte_padded = padded && pre.dtype.is_subbyte();
    pre.shape = tw::Shape(shape);
    pre.strides = strides_null ? tw::Layout::contiguous_strides(pre.shape) : tw::Strides(strides);
    pre.byte_offset = static_cast<int64_t>(byte_offset);
    pre.validate();
    pre_ok = true;
  } catch (const tw::Error&) {
  }
  bool fits = false;
  if (pre_ok) {
    if (pre.numel() == 0) {
      fits = true;
    } else {
      const tw::ByteSpan sp = pre.byte_span();
      const __int128 lo = __int128(pos) + pre.byte_offset + sp.begin;
      const __int128 hi = __int128(pos) + pre.byte_offset + sp.end;
      fits = lo >= 0 && hi <= __int128(bufsize);
    }
  }

  DLDevice device{static_cast<DLDeviceType>(dev_type), dev_id};
  void* dl_data = data_null ? nullptr : buf.get() + pos;
  if (!fits && tw::Device{device.device_type, 0}.is_host_accessible()) device.device_type = kDLCUDA;
  if (!fits && !data_null && fake_addr) dl_data = reinterpret_cast<void*>(static_cast<uintptr_t>(fake_addr));
  const bool dev_ok = tw::Device{device.device_type, 0}.type_name() != std::string("unknown") && dev_id >= 0;
  const tw::Device dev{device.device_type, dev_id};

  auto* ctx = new ProducerCtx;
  int deleted = 0;
  ctx->deleted = &deleted;
  ctx->shape = shape;
  ctx->strides = strides;
  DLTensor dl;
  dl.data = dl_data;
  dl.device = device;
  dl.ndim = ndim;
  dl.dtype = dt;
  dl.shape = shape_null ? nullptr : ctx->shape.data();
  dl.strides = strides_null ? nullptr : ctx->strides.data();
  dl.byte_offset = byte_offset;

  bool valid = false;
  try {
    tw::Layout l = tw::validate_dltensor(dl, padded);
    valid = true;
    TW_FUZZ_CHECK(pre_ok, "validate_dltensor accepted a struct the harness finds malformed (shape %s)",
                  l.shape.str().c_str());
    TW_FUZZ_CHECK(same_layout(l, pre), "validate_dltensor: layout shape %s strides %s offset %lld, expected %s %s %lld",
                  l.shape.str().c_str(), l.strides.str().c_str(), static_cast<long long>(l.byte_offset),
                  pre.shape.str().c_str(), pre.strides.str().c_str(), static_cast<long long>(pre.byte_offset));
    TW_FUZZ_CHECK(l.numel() == 0 || dl.data != nullptr, "validate_dltensor accepted NULL data with elements");
  } catch (const tw::Error&) {
  }

  if (kind == 0) {
    delete ctx;
    return 0;
  }

  const uintptr_t elem0 = reinterpret_cast<uintptr_t>(dl_data) + byte_offset;
  bool imported = false;
  if (versioned) {
    auto* m = new DLManagedTensorVersioned;
    m->version = DLPackVersion{major, minor};
    m->manager_ctx = ctx;
    m->deleter = deleter_null ? nullptr : producer_deleter<DLManagedTensorVersioned>;
    m->flags = flags;
    m->dl_tensor = dl;
    try {
      tw::Tensor t = tw::from_dlpack(m);
      imported = true;
      TW_FUZZ_CHECK(major == DLPACK_MAJOR_VERSION, "imported DLPack major version %u", major);
      TW_FUZZ_CHECK(deleted == 0, "deleter ran %d times while the tensor is alive", deleted);
      check_import(t, pre, fits, buf.get(), bufsize, elem0, dev, readonly);
      check_reexport(t);
      TW_FUZZ_CHECK(deleted == 0, "deleter ran %d times while the tensor is alive", deleted);
    } catch (const tw::Error&) {
      TW_FUZZ_CHECK(deleter_null || deleted == 1, "deleter ran %d times after a failed import", deleted);
    }
    if (deleter_null) {
      delete ctx;
      delete m;
    }
  } else {
    auto* m = new DLManagedTensor;
    m->dl_tensor = dl;
    m->manager_ctx = ctx;
    m->deleter = deleter_null ? nullptr : producer_deleter<DLManagedTensor>;
    try {
      tw::Tensor t = tw::from_dlpack(m);
      imported = true;
      TW_FUZZ_CHECK(deleted == 0, "deleter ran %d times while the tensor is alive", deleted);
      check_import(t, pre, fits, buf.get(), bufsize, elem0, dev, false);
      check_reexport(t);
      TW_FUZZ_CHECK(deleted == 0, "deleter ran %d times while the tensor is alive", deleted);
    } catch (const tw::Error&) {
      TW_FUZZ_CHECK(deleter_null || deleted == 1, "deleter ran %d times after a failed import", deleted);
    }
    if (deleter_null) {
      delete ctx;
      delete m;
    }
  }
  TW_FUZZ_CHECK(deleter_null || deleted == 1, "deleter ran %d times in all (expected exactly once)", deleted);
  TW_FUZZ_CHECK(!imported || (valid && dev_ok), "from_dlpack accepted what validate_dltensor or the device refused");
  return 0;
}
