// The import/export policy (tensorwire/interop.hpp): every binding's rules for copies, devices, streams and
// consumer profiles, in one place, with one set of error texts.
#include <string>

#include "core/checked.hpp"
#include "tensorwire/copy.hpp"
#include "tensorwire/device_runtime.hpp"
#include "tensorwire/interop.hpp"

namespace tw {
namespace {

bool stream_capable(DLDeviceType t) { return t == kDLCUDA || t == kDLCUDAManaged || t == kDLROCM; }

void check_export_stream(const Tensor& t, std::optional<int64_t> stream) {
  if (!stream) return;
  const int64_t s = *stream;
  if (stream_capable(t.device().type)) {
    if (s == 0)
      throw Error(ErrorCode::invalid_argument,
                  "DLPack export: stream 0 is disallowed by DLPack for " + std::string(t.device().type_name()) +
                      " (ambiguous); use 1 for the legacy default stream, 2 for per-thread, -1 for no sync");
    if (s < -1) throw Error(ErrorCode::invalid_argument, "DLPack export: stream " + std::to_string(s) + " is not valid");
    return;
  }
  if (s != -1)
    throw Error(ErrorCode::invalid_argument, "DLPack export: a " + t.device().str() +
                                                 " tensor takes no stream (None or -1), not " + std::to_string(s));
}

std::string version_str(uint32_t major, uint32_t minor) { return std::to_string(major) + "." + std::to_string(minor); }

}  // namespace

uint32_t dlpack_minor_for(DType d) noexcept {
  if (d.code == kDLBcomplex) return 4;
  if (d.code >= kDLFloat8_e3m4) return 1;  // float8/6/4 codes arrived in DLPack 1.1
  return 0;
}

uint32_t dlpack_minor_for(Device dev) noexcept {
  switch (dev.type) {
    case kDLTrn: return 2;
    case kDLTPU:
    case kDLTPUHost:
    case kDLAscend: return 4;
    default: return 0;
  }
}

PreparedExport prepare_export(const Tensor& t, const ExportRequest& r) {
  if (!t.defined())
    throw Error(ErrorCode::invalid_argument, "DLPack export: the tensor is undefined (a spent loan or moved-from)");
  check_export_stream(t, r.stream);
  PreparedExport out{t, false};
  if (r.device && !(*r.device == t.device())) {
    if (r.copy == CopyMode::never)
      throw Error(ErrorCode::copy_required, "DLPack export: the tensor is on " + t.device().str() + ", " +
                                                r.device->str() + " was requested, and copy is forbidden");
    out.tensor = t.to(*r.device, std::nullopt, true);
    out.copied = true;
  }
  if (r.copy == CopyMode::always && !out.copied) {
    out.tensor = t.copy();
    out.copied = true;
  }
  if (r.consumer == ConsumerProfile::portable && out.tensor.layout().has_negative_stride()) {
    if (r.copy == CopyMode::never)
      throw Error(ErrorCode::copy_required,
                  "DLPack export: strides " + out.tensor.strides().str() +
                      " are negative; PyTorch and other DLPack consumers cannot take them, and copy is forbidden "
                      "(NumPy's array interface and the buffer protocol view them without one)");
    out.tensor = out.tensor.copy();
    out.copied = true;
  }
  // The consumer's stream waits for the producer's (DLPack: None on CUDA is the legacy default stream, -1 means
  // the consumer orders the work itself). An event, never a host or device-wide synchronisation.
  const Tensor& e = out.tensor;
  // The consumer will use the memory on its stream (any stream, when it named none): a received tensor's lease goes
  // back to its publisher only after that work (Buffer::note_stream_use).
  if (stream_capable(e.device().type) && e.device().type != kDLROCM) e.buffer().note_stream_use(r.stream.value_or(1));
  if (stream_capable(e.device().type) && e.device().type != kDLROCM)
    order_after(e, static_cast<intptr_t>(r.stream.value_or(1)));
  return out;
}

DLManagedTensorVersioned* export_dlpack(const Tensor& t, const ExportRequest& r) {
  DLPackVersion v = r.max_version;
  // max_version is an upper bound: a consumer of a newer major takes any older version (the array API's rule).
  if (v.major > DLPACK_MAJOR_VERSION) v = DLPackVersion{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
  if (v.major != DLPACK_MAJOR_VERSION)
    throw Error(ErrorCode::version_mismatch, "DLPack export: the consumer asked for DLPack " +
                                                 version_str(v.major, v.minor) + " at most; tensorwire's versioned "
                                                 "structs are major version " + std::to_string(DLPACK_MAJOR_VERSION) +
                                                 " (ask for a legacy struct)");
  if (t.defined()) {  // refuse before copying anything
    const uint32_t minor = std::min<uint32_t>(v.minor, DLPACK_MINOR_VERSION);
    if (const uint32_t need = dlpack_minor_for(t.dtype()); need > minor)
      throw Error(ErrorCode::version_mismatch, "DLPack export: " + t.dtype().name() + " needs DLPack " +
                                                   version_str(1, need) + " but the consumer understands at most " +
                                                   version_str(v.major, v.minor));
    if (const uint32_t need = dlpack_minor_for(t.device()); need > minor)
      throw Error(ErrorCode::version_mismatch, "DLPack export: device " + t.device().str() + " needs DLPack " +
                                                   version_str(1, need) + " but the consumer understands at most " +
                                                   version_str(v.major, v.minor));
  }
  PreparedExport p = prepare_export(t, r);
  DLPackExportOptions o;
  o.max_version = v;
  o.is_copied = p.copied;
  return to_dlpack(p.tensor, o);
}

DLManagedTensor* export_dlpack_legacy(const Tensor& t, const ExportRequest& r) {
  PreparedExport p = prepare_export(t, r);
  if (p.tensor.readonly())
    throw Error(ErrorCode::unsupported, "DLPack export: the tensor is read-only and the consumer asked for a legacy "
                                      "(unversioned) DLPack struct, which cannot mark it read-only; ask for a "
                                      "versioned one (max_version 1.0 or newer) or for a copy");
  return to_dlpack_unversioned(p.tensor);
}

bool import_may_copy(const ImportRequest& r, const ImportFacts& f) noexcept {
  return f.byteswap || r.device.has_value() || (r.copy == CopyMode::always && !f.producer_copied);
}

Tensor finish_import(Tensor t, const ImportRequest& r, const ImportFacts& f) {
  const bool move = r.device && !(*r.device == t.device());
  // The caller's stream orders tensorwire's device work; a copy between host memories has none to order.
  const std::optional<intptr_t> stream = r.stream && *r.stream != -1 ? r.stream : std::nullopt;
  auto on_device = [](const Device& d) { return d.type == kDLCUDA || d.type == kDLCUDAHost; };
  if (move && r.copy == CopyMode::never)
    throw Error(ErrorCode::copy_required, "import: the data is on " + t.device().str() + " but " + r.device->str() +
                                              " was requested, which needs a copy, and copy is forbidden");
  if (f.byteswap) {
    if (r.copy == CopyMode::never)
      throw Error(ErrorCode::copy_required, "import: the data is in non-native byte order and must be byte-swapped "
                                            "into a copy, but copy is forbidden");
    if (!t.device().is_host_accessible())
      throw Error(ErrorCode::unsupported, "import: non-native byte order in " + t.device().str() +
                                              " memory cannot be swapped by the host");
    Tensor out = Tensor::empty(t.shape(), t.dtype());
    copy(t, out, CopyOptions{true});
    return move ? out.to(*r.device, on_device(*r.device) ? stream : std::nullopt, true) : out;
  }
  // One copy at most: to another device (in the source's dense order), or on the same one for copy=always.
  if (move)
    return t.to(*r.device, on_device(*r.device) || on_device(t.device()) ? stream : std::nullopt, true);
  if (r.copy == CopyMode::always && !f.producer_copied)
    return t.copy(MemoryOrder::C, on_device(t.device()) ? stream : std::nullopt);
  // Zero-copy device memory for a caller that named its stream: ready on it, as a DLPack producer makes it (the
  // CUDA Array Interface gives the consumer's stream no role): that stream waits for the producer's on the device.
  if (stream && t.device().type == kDLCUDA && t.stream() != stream) {
    order_after(t, *stream);
    set_producer_stream(t, *stream);
  }
  return t;
}

Tensor import_dlpack(DLManagedTensorVersioned* m, const ImportRequest& r) {
  const bool copied = m && m->version.major == DLPACK_MAJOR_VERSION && (m->flags & DLPACK_FLAG_BITMASK_IS_COPIED);
  return finish_import(from_dlpack(m), r, ImportFacts{copied, false});
}

Tensor import_dlpack(DLManagedTensor* m, const ImportRequest& r) {
  return finish_import(from_dlpack(m), r, ImportFacts{});
}

Tensor view_foreign(uintptr_t origin, Layout l, Device dev, std::shared_ptr<const void> keep, bool readonly) {
  const ByteSpan sp = l.byte_span();
  if (l.numel() == 0) {
    l.byte_offset = 0;
    auto buf = std::make_shared<Buffer>(reinterpret_cast<void*>(origin), size_t{0}, dev, std::move(keep));
    return Tensor::make(std::move(buf), std::move(l), readonly);
  }
  // The lowest address any element occupies, relative to origin.
  const int64_t lo = detail::add(l.byte_offset, sp.begin, "the byte offset plus the byte span");
  if (lo < 0 && origin <= static_cast<uintptr_t>(-lo))
    throw Error(ErrorCode::out_of_range, "foreign tensor: its lowest element would lie at or below address 0");
  // Whatever the sign of lo: with negative strides element 0 can sit above the lowest address and still wrap.
  if (static_cast<__int128>(origin) + lo + sp.size() > static_cast<__int128>(UINTPTR_MAX))
    throw Error(ErrorCode::overflow, "foreign tensor: its span overflows the address space");
  // Integer arithmetic: the producer's pointer need not point into one object we could do pointer arithmetic in.
  char* base = reinterpret_cast<char*>(origin + static_cast<uintptr_t>(lo));
  l.byte_offset = -sp.begin;
  auto buf = std::make_shared<Buffer>(base, static_cast<size_t>(sp.size()), dev, std::move(keep));
  return Tensor::make(std::move(buf), std::move(l), readonly);
}

Tensor import_interface(const InterfaceDesc& desc_in, std::shared_ptr<const void> keep, const ImportRequest& r) {
  InterfaceDesc desc = desc_in;
  const std::string& proto = desc.protocol;
  if (desc.stream) {
    if (*desc.stream == 0)
      throw Error(ErrorCode::invalid_argument,
                  proto + ": 'stream' is 0, which the CUDA Array Interface v3 disallows (ambiguous between the "
                          "legacy and per-thread default streams); use 1, 2 or a stream handle");
    if (*desc.stream < 0)
      throw Error(ErrorCode::invalid_argument, proto + ": 'stream' " + std::to_string(*desc.stream) + " is not a stream");
    // A stream handle is the address of the driver's object: never in the first page. Passed on, a value like 3 (a
    // stream index mistaken for a handle) would reach the driver, which does not check handles (it may crash).
    if (*desc.stream > 2 && *desc.stream < 4096)
      throw Error(ErrorCode::invalid_argument, proto + ": 'stream' " + std::to_string(*desc.stream) +
                                                   " is neither 1 (legacy default), 2 (per-thread default) nor a "
                                                   "stream handle");
  }
  if (!desc.device) {
    // The CUDA Array Interface carries no device number: the driver knows it; otherwise the caller must say.
    const DeviceRuntime& rt = device_runtime();
    std::optional<int> ordinal;
    if (desc.data) ordinal = rt.device_of_pointer(desc.data);
    bool empty = false;
    for (int64_t n : desc.shape) empty = empty || n == 0;
    if (ordinal) {
      desc.device = Device::cuda(*ordinal);  // from the driver; a request for another device is a copy below
    } else if (r.device && (r.device->type == kDLCUDA || r.device->type == kDLCUDAManaged)) {
      desc.device = *r.device;
    } else if (r.device) {
      throw Error(ErrorCode::device_unavailable,
                  proto + ": the data is CUDA device memory and " + r.device->str() + " was requested, which needs a "
                          "copy by the CUDA driver, and the device runtime cannot reach it (" + rt.status() + ")");
    } else if (empty) {
      desc.device = Device::cuda(0);  // no memory is referenced, so no device can be wrong
    } else {
      throw Error(ErrorCode::device_unavailable,
                  proto + ": the description does not say which device the pointer is on, and the device runtime "
                          "cannot tell (" + rt.status() + "); request a device explicitly (device='cuda:N')");
    }
  }
  InterfaceLayout il = validate_interface(desc);
  if (il.byteswap && !desc.device->is_host_accessible())
    throw Error(ErrorCode::unsupported, proto + ": non-native byte order on " + desc.device->str() +
                                            " cannot be swapped on the host");
  // il.layout.byte_offset is element 0's distance from the lowest element: element 0 sits at desc.data.
  Layout rel = il.layout;
  rel.byte_offset = 0;
  Tensor t = view_foreign(desc.data, std::move(rel), *desc.device, std::move(keep), desc.readonly);
  if (desc.stream) {
    if (!device_runtime_installed())
      throw Error(ErrorCode::device_unavailable, proto + ": the producer's data is ordered on a CUDA stream and no "
                                                          "device runtime is installed to wait for it "
                                                          "(tw::cuda::install_runtime())");
    // Device memory: the stream is recorded with an event on it (the producer may destroy its stream), and every
    // later use (a copy, an export to a consumer's stream) is ordered after that event, never by a host wait.
    // Memory the host can read is waited for now.
    set_producer_stream(t, static_cast<intptr_t>(*desc.stream));
  }
  return finish_import(std::move(t), r, ImportFacts{false, il.byteswap});
}

}  // namespace tw
