#include "tensorwire/tensor.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>


#include "checked.hpp"

namespace tw {
namespace {

[[noreturn]] void undefined() {
  throw Error(ErrorCode::invalid_argument, "operation on an undefined tensor: default-constructed, moved-from, or a spent loan "
                                           "(send() handed it over; loan again, or send a copy)");
}

size_t norm_dim(int64_t dim, size_t ndim, const char* op) {
  int64_t n = static_cast<int64_t>(ndim);
  int64_t d = dim < 0 ? dim + n : dim;
  if (d < 0 || d >= n)
    throw Error(ErrorCode::out_of_range, std::string(op) + ": dimension " + std::to_string(dim) +
                                             " is out of range for a tensor of rank " + std::to_string(ndim));
  return static_cast<size_t>(d);
}

}  // namespace

Tensor::Tensor(const Tensor& o)
    : buffer_(o.buffer_), layout_(o.layout_), metadata_(o.clone_metadata()), readonly_(o.readonly_),
      stream_(o.stream_),
      ready_event_(o.ready_event_) {}

Tensor& Tensor::operator=(const Tensor& o) {
  if (this != &o) {
    buffer_ = o.buffer_;
    layout_ = o.layout_;
    metadata_ = o.clone_metadata();
    readonly_ = o.readonly_;
    stream_ = o.stream_;
    ready_event_ = o.ready_event_;
  }
  return *this;
}

std::unique_ptr<Metadata> Tensor::clone_metadata() const {
  if (!metadata_ || metadata_->empty()) return nullptr;
  return std::make_unique<Metadata>(*metadata_);
}

const Metadata& Tensor::metadata() const noexcept {
  static const Metadata kEmpty;
  return metadata_ ? *metadata_ : kEmpty;
}

const Layout& Tensor::layout() const {
  if (!buffer_) undefined();
  return layout_;
}

const Buffer& Tensor::buffer() const {
  if (!buffer_) undefined();
  return *buffer_;
}

int64_t Tensor::size(int64_t dim) const { return shape()[norm_dim(dim, ndim(), "Tensor::size")]; }

std::vector<int64_t> Tensor::byte_strides() const {
  const Layout& l = layout();
  std::vector<int64_t> out(l.ndim());
  // A dimension that never steps (size <= 1) may carry any stride, even one whose byte value does not fit in
  // 64 bits; such a stride is stated as 0. Validated layouts cannot overflow here otherwise.
  auto scaled = [&](size_t i, int64_t unit) {
    int64_t r;
    if (!__builtin_mul_overflow(l.strides[i], unit, &r)) return r;
    if (l.shape[i] > 1) detail::throw_overflow("a byte stride");
    return int64_t{0};
  };
  if (l.is_packed_subbyte()) {
    for (size_t i = 0; i < l.ndim(); ++i) {
      int64_t bits = scaled(i, int64_t(l.dtype.total_bits()));
      if (bits % 8 != 0 && l.shape[i] > 1)
        throw Error(ErrorCode::unsupported, "stride " + std::to_string(l.strides[i]) + " of a packed " +
                                                l.dtype.name() + " tensor is not a whole number of bytes");
      out[i] = bits / 8;
    }
    return out;
  }
  for (size_t i = 0; i < l.ndim(); ++i) out[i] = scaled(i, int64_t(l.dtype.itemsize()));
  return out;
}

Tensor Tensor::make(std::shared_ptr<Buffer> buffer, Layout layout, bool readonly) {
  if (!buffer) throw Error(ErrorCode::invalid_argument, "Tensor::make: null buffer");
  layout.validate();
  if (layout.numel() > 0) {
    ByteSpan sp = layout.byte_span();
    int64_t lo = layout.byte_offset + sp.begin, hi = layout.byte_offset + sp.end;
    if (lo < 0 || static_cast<uint64_t>(hi) > buffer->size())
      throw Error(ErrorCode::out_of_range,
                  "tensor of shape " + layout.shape.str() + ", strides " + layout.strides.str() + ", byte_offset " +
                      std::to_string(layout.byte_offset) + " spans bytes [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + ") but its buffer holds " + std::to_string(buffer->size()) + " bytes");
    if (buffer->base() == nullptr)
      throw Error(ErrorCode::invalid_argument, "tensor with " + std::to_string(layout.numel()) +
                                                   " elements has a null data pointer");
  }
  return Tensor(std::move(buffer), std::move(layout), readonly);
}

Tensor Tensor::from_blob(void* data, Shape shape, DType dtype, Device device, std::shared_ptr<const void> keep_alive,
                         Strides strides, bool readonly) {
  // The same device check as every other way in (DLPack, the C ABI): a type DLPack does not define, or a negative
  // id, is refused here rather than printed as "unknown:0" by every later message.
  device = Device::from_dlpack(DLDevice{device.type, device.id});
  Layout l{dtype, std::move(shape), std::move(strides), 0, false};
  if (l.strides.empty() && !l.shape.empty()) l.strides = Layout::contiguous_strides(l.shape);
  l.validate();
  ByteSpan sp = l.byte_span();
  if (l.numel() > 0 && data == nullptr)
    throw Error(ErrorCode::invalid_argument,
                "Tensor::from_blob: null data pointer for a tensor of shape " + l.shape.str());
  l.byte_offset = -sp.begin;
  char* base = static_cast<char*>(data) + sp.begin;
  auto buf = std::make_shared<Buffer>(base, static_cast<size_t>(sp.size()), device, std::move(keep_alive));
  return make(std::move(buf), std::move(l), readonly);
}

Tensor Tensor::empty(Shape shape, DType dtype, MemoryOrder order) {
  Layout l{dtype, std::move(shape), {}, 0, false};
  l.strides = Layout::contiguous_strides(l.shape, order == MemoryOrder::F ? MemoryOrder::F : MemoryOrder::C);
  l.validate();
  auto buf = Buffer::allocate(static_cast<size_t>(l.nbytes()));
  return make(std::move(buf), std::move(l), false);
}

Tensor Tensor::zeros(Shape shape, DType dtype, MemoryOrder order) {
  Tensor t = empty(std::move(shape), dtype, order);
  std::memset(t.buffer_->base(), 0, t.buffer_->size());
  return t;
}

Tensor Tensor::derive(Layout l) const {
  Tensor t(buffer_, std::move(l), readonly_);
  t.metadata_ = clone_metadata();
  t.stream_ = stream_;
  t.ready_event_ = ready_event_;
  return t;
}



Tensor Tensor::slice(int64_t dim, std::optional<int64_t> start, std::optional<int64_t> stop, int64_t step) const {
  const Layout& l = layout();
  size_t d = norm_dim(dim, l.ndim(), "Tensor::slice");
  if (step == 0) throw Error(ErrorCode::invalid_argument, "Tensor::slice: step cannot be zero");
  const int64_t n = l.shape[d];
  // Python's slice.indices semantics.
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  int64_t b = clamp(start, step < 0 ? n - 1 : 0);
  int64_t e = clamp(stop, step < 0 ? -1 : n);
  int64_t len = 0;
  if (step > 0 && e > b) len = (e - b - 1) / step + 1;
  // Unsigned division: -step does not fit in int64_t when step is INT64_MIN.
  if (step < 0 && b > e) len = static_cast<int64_t>(uint64_t(b - e - 1) / (0 - static_cast<uint64_t>(step))) + 1;
  Layout out = l;
  out.shape[d] = len;
  int64_t stride;
  if (__builtin_mul_overflow(l.strides[d], step, &stride)) {
    if (len > 1) detail::throw_overflow("slice stride");
    stride = l.strides[d];  // a view of at most one element never steps along d: any stride will do
  }
  out.strides[d] = stride;
  // An empty view keeps its offset: moving it along d when another dimension is 0 (then nothing is addressed)
  // took it outside the buffer, even below 0, and the next reshape or pickle refused "byte_offset -16".
  bool empty = len == 0;
  for (size_t i = 0; i < l.ndim(); ++i) empty = empty || l.shape[i] == 0;
  if (!empty) {
    int64_t elem_off = detail::mul(b, l.strides[d], "slice offset");
    if (l.is_packed_subbyte()) {
      int64_t bits = elem_off * int64_t(l.dtype.total_bits());
      if (bits % 8 != 0)
        throw Error(ErrorCode::unsupported, "Tensor::slice: a packed " + l.dtype.name() +
                                                " view must start on a byte boundary; index " + std::to_string(b) +
                                                " of dimension " + std::to_string(d) + " does not");
      out.byte_offset = detail::add(l.byte_offset, bits / 8, "slice offset");
    } else {
      out.byte_offset =
          detail::add(l.byte_offset, detail::mul(elem_off, int64_t(l.dtype.itemsize()), "slice offset"), "slice offset");
    }
  }
  return derive(std::move(out));
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  const Layout& l = layout();
  size_t d = norm_dim(dim, l.ndim(), "Tensor::select");
  int64_t n = l.shape[d];
  int64_t i = index < 0 ? index + n : index;
  if (i < 0 || i >= n)
    throw Error(ErrorCode::out_of_range, "Tensor::select: index " + std::to_string(index) +
                                             " is out of range for dimension " + std::to_string(d) + " of size " +
                                             std::to_string(n));
  Tensor t = slice(static_cast<int64_t>(d), i, i + 1, 1);
  Layout out = t.layout_;
  std::vector<int64_t> sh(out.shape.begin(), out.shape.end()), st(out.strides.begin(), out.strides.end());
  sh.erase(sh.begin() + static_cast<std::ptrdiff_t>(d));
  st.erase(st.begin() + static_cast<std::ptrdiff_t>(d));
  out.shape = Shape(std::move(sh));
  out.strides = Strides(std::move(st));
  return derive(std::move(out));
}

Tensor Tensor::permute(const Dims& dims) const {
  const Layout& l = layout();
  if (dims.size() != l.ndim())
    throw Error(ErrorCode::invalid_argument, "Tensor::permute: " + dims.str() + " has " + std::to_string(dims.size()) +
                                                 " entries for a tensor of rank " + std::to_string(l.ndim()));
  std::vector<bool> seen(l.ndim(), false);
  Layout out = l;
  for (size_t i = 0; i < dims.size(); ++i) {
    size_t d = norm_dim(dims[i], l.ndim(), "Tensor::permute");
    if (seen[d]) throw Error(ErrorCode::invalid_argument, "Tensor::permute: " + dims.str() + " repeats dimension " + std::to_string(d));
    seen[d] = true;
    out.shape[i] = l.shape[d];
    out.strides[i] = l.strides[d];
  }
  return derive(std::move(out));
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  const Layout& l = layout();
  size_t a = norm_dim(dim0, l.ndim(), "Tensor::transpose"), b = norm_dim(dim1, l.ndim(), "Tensor::transpose");
  Layout out = l;
  std::swap(out.shape[a], out.shape[b]);
  std::swap(out.strides[a], out.strides[b]);
  return derive(std::move(out));
}

namespace {

Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int64_t known = 1;
  std::optional<size_t> infer;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer) throw Error(ErrorCode::invalid_argument, std::string(op) + ": only one dimension can be -1 in " + shape.str());
      infer = i;
    } else if (shape[i] < 0) {
      throw Error(ErrorCode::invalid_argument, std::string(op) + ": negative size in " + shape.str());
    } else {
      known = detail::mul(known, shape[i], "the requested shape");
    }
  }
  if (infer) {
    if (known == 0 || numel % known != 0)
      throw Error(ErrorCode::invalid_argument, std::string(op) + ": cannot infer -1 in " + shape.str() + " for " +
                                                   std::to_string(numel) + " elements");
    out[*infer] = numel / known;
  } else if (known != numel) {
    throw Error(ErrorCode::invalid_argument, std::string(op) + ": shape " + shape.str() + " holds " +
                                                 std::to_string(known) + " elements, the tensor has " +
                                                 std::to_string(numel));
  }
  return out;
}

// Strides for viewing (shape, strides) as new_shape without copying, or nullopt when impossible.
// Walks old and new dimensions in step, grouping them into chunks of equal element count; inside a chunk the old
// dimensions must be laid out contiguously with respect to each other.
std::optional<Strides> view_strides(const Shape& shape, const Strides& strides, const Shape& new_shape) {
  std::vector<int64_t> os, ost;  // old dims without size-1 entries
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] != 1) {
      os.push_back(shape[i]);
      ost.push_back(strides[i]);
    }
  Strides out;
  out.resize(new_shape.size(), 0);
  size_t oi = 0, ni = 0;
  const size_t on = os.size(), nn = new_shape.size();
  while (ni < nn || oi < on) {
    if (ni < nn && new_shape[ni] == 1) {  // size-1 new dims: any stride; use the next chunk's or 1
      out[ni] = 1;
      ++ni;
      continue;
    }
    if (oi >= on || ni >= nn) return std::nullopt;
    size_t o0 = oi, n0 = ni;
    int64_t op = os[oi++], np = new_shape[ni++];
    while (op != np) {
      if (op < np) {
        if (oi >= on) return std::nullopt;
        op *= os[oi++];
      } else {
        while (ni < nn && new_shape[ni] == 1) out[ni++] = 1;
        if (ni >= nn) return std::nullopt;
        np *= new_shape[ni++];
      }
    }
    for (size_t k = o0; k + 1 < oi; ++k)
      if (ost[k] != ost[k + 1] * os[k + 1]) return std::nullopt;
    int64_t st = ost[oi - 1];
    for (size_t k = ni; k-- > n0;) {
      if (new_shape[k] == 1) {
        out[k] = st;
        continue;
      }
      out[k] = st;
      st *= new_shape[k];
    }
  }
  return out;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  const Layout& l = layout();
  Shape ns = infer_shape(shape, l.numel(), "Tensor::view");
  Layout out = l;
  out.shape = ns;
  if (l.numel() == 0) {
    out.strides = Layout::contiguous_strides(ns);
  } else {
    auto st = view_strides(l.shape, l.strides, ns);
    if (!st)
      throw Error(ErrorCode::copy_required, "Tensor::view: a tensor of shape " + l.shape.str() + " and strides " +
                                                l.strides.str() + " cannot be viewed as " + ns.str() +
                                                " without a copy; use reshape() to allow one");
    out.strides = *st;
  }
  out.validate();
  return derive(std::move(out));
}


Tensor Tensor::expand(const Shape& shape) const {
  const Layout& l = layout();
  if (shape.size() < l.ndim())
    throw Error(ErrorCode::invalid_argument, "Tensor::expand: target " + shape.str() + " has fewer dimensions than " +
                                                 l.shape.str());
  size_t lead = shape.size() - l.ndim();
  Layout out = l;
  out.shape.resize(0);
  out.strides.resize(0);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      if (shape[i] < 0)
        throw Error(ErrorCode::invalid_argument, "Tensor::expand: new leading dimension " + std::to_string(i) +
                                                     " cannot be " + std::to_string(shape[i]));
      out.shape.push_back(shape[i]);
      out.strides.push_back(0);
      continue;
    }
    int64_t have = l.shape[i - lead], want = shape[i] == -1 ? have : shape[i];
    if (want < 0)
      throw Error(ErrorCode::invalid_argument, "Tensor::expand: size " + std::to_string(shape[i]) + " in " +
                                                   shape.str() + " is negative (only -1, keep the size, is allowed)");
    if (want == have) {
      out.shape.push_back(have);
      out.strides.push_back(l.strides[i - lead]);
    } else if (have == 1 && want >= 0) {
      out.shape.push_back(want);
      out.strides.push_back(0);
    } else {
      throw Error(ErrorCode::invalid_argument, "Tensor::expand: cannot expand " + l.shape.str() + " to " + shape.str() +
                                                   ": dimension " + std::to_string(i) + " has size " +
                                                   std::to_string(have) + ", not 1");
    }
  }
  out.validate();
  return derive(std::move(out));
}

Tensor Tensor::as_readonly() const {
  Tensor t = derive(layout());
  t.readonly_ = true;
  return t;
}

}  // namespace tw
