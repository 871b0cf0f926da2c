// tensorwire/tensor.hpp — a strided view of memory, the owner that keeps the memory alive, and metadata.
//
// Cost is in the name: `from_blob` and `adopt` never copy; `copy_of`, `copy` and (when needed) `contiguous` and
// `reshape` copy once. Views (slice, select, permute, transpose, view, expand) share the buffer and carry a deep
// copy of the metadata. A Tensor is a cheap value type: copying one shares the buffer and copies the metadata.
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "tensorwire/buffer.hpp"
#include "tensorwire/device.hpp"
#include "tensorwire/dtype.hpp"
#include "tensorwire/error.hpp"
#include "tensorwire/layout.hpp"
#include "tensorwire/metadata.hpp"

namespace tw {

class Tensor {
 public:
  /// An undefined tensor (defined() is false); every accessor but defined() throws on it.
  Tensor() = default;
  Tensor(const Tensor& o);
  Tensor(Tensor&& o) noexcept = default;
  Tensor& operator=(const Tensor& o);
  Tensor& operator=(Tensor&& o) noexcept = default;
  ~Tensor() = default;

  /// Zero-copy view of memory owned by someone else. `data` is the address of element (0, ..., 0);
  /// `keep_alive` is held until the last view is gone. Strides default to C-contiguous.
  /// Throws Error on invalid shapes/strides or a null `data` with nonzero size.
  static Tensor from_blob(void* data, Shape shape, DType dtype, Device device,
                          std::shared_ptr<const void> keep_alive, Strides strides = {}, bool readonly = false);
  /// The same over memory the caller may only read (a pointer to const): the tensor is read-only. (A template, so
  /// that a null pointer constant -- nullptr, 0, NULL -- and non-const pointers still mean the overload above.)
  template <class U>
    requires std::is_const_v<U>
  static Tensor from_blob(U* data, Shape shape, DType dtype, Device device, std::shared_ptr<const void> keep_alive,
                          Strides strides = {}) {
    return from_blob(const_cast<void*>(static_cast<const void*>(data)), std::move(shape), dtype, device,
                     std::move(keep_alive), std::move(strides), true);
  }

  /// Zero-copy: takes ownership of the vector's storage (moved, never copied); C-contiguous.
  /// Throws Error(invalid_argument) when the shape's element count differs from v.size().
  template <class T, class A>
  static Tensor adopt(std::vector<T, A>&& v, Shape shape);
  /// The same, 1-D of v.size() elements.
  template <class T, class A>
  static Tensor adopt(std::vector<T, A>&& v) {
    const auto n = static_cast<int64_t>(v.size());
    return adopt(std::move(v), Shape{n});
  }

  /// Copies `data` into a new C-contiguous tensor of `shape`.
  template <class T>
  static Tensor copy_of(std::span<const T> data, Shape shape);
  template <class T>
  static Tensor copy_of(std::span<T> data, Shape shape) { return copy_of(std::span<const T>(data), std::move(shape)); }

  /// A new uninitialised host tensor in `order` (C or F).
  static Tensor empty(Shape shape, DType dtype, MemoryOrder order = MemoryOrder::C);
  /// A new zero-filled host tensor.
  static Tensor zeros(Shape shape, DType dtype, MemoryOrder order = MemoryOrder::C);
  /// A new uninitialised tensor on `device`: cpu as above, cuda:N from tensorwire's device pool (ordered on the
  /// legacy default stream), cuda_host from the pinned host pool. Device memory needs the CUDA layer's runtime
  /// (tw::cuda); without a driver or device it throws Error(device_unavailable) naming why.
  static Tensor empty(Shape shape, DType dtype, Device device, MemoryOrder order = MemoryOrder::C);

  /// The general factory: a view of `buffer` with `layout`. Validates the layout and that every element lies
  /// inside the buffer.
  static Tensor make(std::shared_ptr<Buffer> buffer, Layout layout, bool readonly = false);

  bool defined() const noexcept { return buffer_ != nullptr; }
  const Layout& layout() const;
  DType dtype() const { return layout().dtype; }
  const Shape& shape() const { return layout().shape; }
  const Strides& strides() const { return layout().strides; }
  /// Strides in bytes (element strides times itemsize; for packed sub-byte types, only when exact).
  std::vector<int64_t> byte_strides() const;
  int64_t byte_offset() const { return layout().byte_offset; }
  size_t ndim() const { return layout().ndim(); }
  int64_t numel() const { return layout().numel(); }
  int64_t nbytes() const { return layout().nbytes(); }
  int64_t size(int64_t dim) const;
  Device device() const { return buffer().device(); }
  bool readonly() const noexcept { return readonly_ || (buffer_ && buffer_->sealed()); }
  bool subbyte_padded() const { return layout().subbyte_padded; }
  const Buffer& buffer() const;
  const std::shared_ptr<Buffer>& buffer_ptr() const noexcept { return buffer_; }

  /// Address of element (0, ..., 0): buffer base + byte_offset.
  void* data_ptr() const { return static_cast<char*>(buffer().base()) + byte_offset(); }
  /// Typed pointer; throws Error(type_mismatch) when T is not the tensor's dtype, Error(read_only) for a
  /// mutable pointer into a read-only tensor.
  template <class T>
  T* data() const;

  /// The tensor's own metadata (views and copies get a deep copy). Allocated on first mutable access, so
  /// tensors without metadata cost nothing for it.
  Metadata& metadata() {
    if (!metadata_) metadata_ = std::make_unique<Metadata>();
    return *metadata_;
  }
  const Metadata& metadata() const noexcept;

  /// CUDA stream the data is ordered on, when the producer said so (CUDA Array Interface v3 / DLPack).
  std::optional<intptr_t> stream() const noexcept { return stream_; }
  /// Sets the stream (and forgets any ready event: the data is now ordered on `s` alone).
  void set_stream(std::optional<intptr_t> s) noexcept {
    stream_ = s;
    ready_event_.reset();
  }
  /// Sets the stream and the event recorded on it when the tensor was imported (tw::set_producer_stream).
  void set_stream(intptr_t s, std::shared_ptr<void> ready_event) noexcept {
    stream_ = s;
    ready_event_ = std::move(ready_event);
  }
  /// The event (a CUevent) recorded on stream() when a foreign producer's tensor was imported, or null. Every later
  /// use waits on it rather than on stream(), which the producer may destroy meanwhile (or which, as the per-thread
  /// default stream, means another stream on another thread).
  void* ready_event() const noexcept { return ready_event_.get(); }

  bool is_contiguous(MemoryOrder order = MemoryOrder::C) const { return layout().is_contiguous(order); }
  bool is_dense() const { return layout().is_dense(); }
  bool has_broadcast() const { return layout().has_broadcast(); }

  /// This tensor when already C-contiguous (same buffer, no copy); otherwise one copy.
  Tensor contiguous() const;
  /// Always a new tensor, contiguous in `order` (C, F, or Any = keep the dimension order of a dense source).
  /// On the tensor's own device: CUDA memory is copied by the device (a driver copy or tensorwire's kernels),
  /// queued on `stream` (as in to(); nullopt: the legacy default stream) after the tensor's own stream through an
  /// event; the result carries `stream`. A stream for a copy the host makes (cpu, managed memory) is refused.
  Tensor copy(MemoryOrder order = MemoryOrder::C, std::optional<intptr_t> stream = std::nullopt) const;

  /// This tensor on `device` ("cpu", cuda:N, cuda_host = pinned). copy: nullopt copies only when the device
  /// differs, true always copies, false throws Error(copy_required) when the device differs. A copy keeps the
  /// dimension order of a dense source (else C order), dtype and metadata. Device work is queued on `stream`
  /// (a CUstream handle of the target device; 1 = legacy default, 2 = per-thread default; nullopt = legacy) after
  /// the tensor's own stream, through an event, never a device-wide synchronisation. A device result carries
  /// `stream` and is returned at once (ordered on it); a host result (pageable or pinned) is returned with the data
  /// there. Between two devices the bytes cross through pinned host memory.
  Tensor to(Device device, std::optional<intptr_t> stream = std::nullopt, std::optional<bool> copy = std::nullopt) const;
  /// A copy of this host tensor in pinned (page-locked) memory from the pinned pool: dtype, shape, strides,
  /// offset within the copied span, and metadata kept; device() is cuda_host. Already pinned: this tensor.
  Tensor pin() const;
  /// True for memory from a pinned pool (device cuda_host).
  bool pinned() const { return device().type == kDLCUDAHost; }

  /// Python-style slice of dimension `dim`: start/stop are clamped like Python's; step != 0, negative allowed.
  Tensor slice(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step = 1) const;
  /// Drops dimension `dim`, taking index `index` (negative counts from the end).
  Tensor select(int64_t dim, int64_t index) const;
  /// Reorders dimensions: result dim i is source dim dims[i].
  Tensor permute(const Dims& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  /// A view with a new shape; throws Error(copy_required) when no strides can express it. One -1 is inferred.
  Tensor view(const Shape& shape) const;
  /// view() when possible, else a C-contiguous copy reshaped.
  Tensor reshape(const Shape& shape) const;
  /// Broadcasts size-1 (or new leading) dimensions to `shape` with stride 0; -1 keeps a size.
  Tensor expand(const Shape& shape) const;
  /// The same view, read-only.
  Tensor as_readonly() const;

 private:
  Tensor(std::shared_ptr<Buffer> b, Layout l, bool ro) : buffer_(std::move(b)), layout_(std::move(l)), readonly_(ro) {}
  Tensor derive(Layout l) const;  // a view sharing buffer, metadata copied

  std::shared_ptr<Buffer> buffer_;
  Layout layout_;
  std::unique_ptr<Metadata> clone_metadata() const;

  std::unique_ptr<Metadata> metadata_;  // null means empty
  bool readonly_ = false;
  std::optional<intptr_t> stream_;
  std::shared_ptr<void> ready_event_;  // see ready_event()
};

template <class T, class A>
Tensor Tensor::adopt(std::vector<T, A>&& v, Shape shape) {
  static_assert(std::is_trivially_copyable_v<T>, "adopt needs trivially copyable elements");
  auto holder = std::make_shared<std::vector<T, A>>(std::move(v));  // moves the storage: no element is copied
  void* data = holder->data();
  size_t n = holder->size();
  Layout l{DType::of<T>(), std::move(shape), {}, 0, false};
  l.strides = Layout::contiguous_strides(l.shape);
  l.validate();
  if (l.numel() != static_cast<int64_t>(n))
    throw Error(ErrorCode::invalid_argument, "Tensor::adopt: shape " + l.shape.str() + " holds " +
                                                 std::to_string(l.numel()) + " elements but the vector has " +
                                                 std::to_string(n));
  auto buf = std::make_shared<Buffer>(data, n * sizeof(T), Device::cpu(), std::move(holder));
  return make(std::move(buf), std::move(l), false);
}

template <class T>
Tensor Tensor::copy_of(std::span<const T> data, Shape shape) {
  static_assert(std::is_trivially_copyable_v<T>, "copy_of needs trivially copyable elements");
  Tensor t = empty(std::move(shape), DType::of<T>());
  if (t.numel() != static_cast<int64_t>(data.size()))
    throw Error(ErrorCode::invalid_argument, "Tensor::copy_of: shape " + t.shape().str() + " holds " +
                                                 std::to_string(t.numel()) + " elements but the span has " +
                                                 std::to_string(data.size()));
  if (!data.empty()) std::memcpy(t.data_ptr(), data.data(), data.size_bytes());
  return t;
}

template <class T>
T* Tensor::data() const {
  using U = std::remove_const_t<T>;
  if (!(DType::of<U>() == dtype()))
    throw Error(ErrorCode::type_mismatch, "Tensor::data<T>: T is " + DType::of<U>().name() + " but the tensor is " +
                                              dtype().name());
  if constexpr (!std::is_const_v<T>) {
    if (readonly())
      throw Error(ErrorCode::read_only, std::string("Tensor::data<T>: the tensor is read-only") +
                                            (readonly_ ? "" : " (a loan already sent: loan again to write)") +
                                            "; use data<const T>()");
  }
  if (!device().is_host_accessible())
    throw Error(ErrorCode::unsupported, "Tensor::data<T>: memory on " + device().str() + " is not host-accessible");
  // (Every element is at data_ptr() plus a multiple of the element size: the first one's alignment is all of them.)
  if (const std::uintptr_t off = reinterpret_cast<std::uintptr_t>(data_ptr()) % alignof(U); off != 0)
    throw Error(ErrorCode::invalid_argument,
                "Tensor::data<T>: the data starts " + std::to_string(off) + (off == 1 ? " byte" : " bytes") +
                    " past a " +
                    std::to_string(alignof(U)) + "-byte boundary, and a " + DType::of<U>().name() +
                    " pointer to it would be undefined behaviour; read it through data_ptr() with std::memcpy, or "
                    "copy() it into aligned memory");
  return static_cast<T*>(data_ptr());
}

}  // namespace tw
