// The Tensor members that copy elements: defined by the copy layer, so that `core` (tensor.cpp) needs nothing of
// the copy engine. core declares them (tensor.hpp); a program that calls them links the copy layer, as every
// tensorwire library does. (The alternative, a copy hook that core calls through a pointer, would hide a
// dependency the build can check.)
#include "tensorwire/copy.hpp"
#include "tensorwire/tensor.hpp"

namespace tw {

Tensor Tensor::contiguous() const {
  if (is_contiguous(MemoryOrder::C)) return *this;
  return copy(MemoryOrder::C);
}

Tensor Tensor::copy(MemoryOrder order) const {
  const Layout& l = layout();
  if (!device().is_host_accessible())
    throw Error(ErrorCode::unsupported, "Tensor::copy: the host copy engine cannot read memory on " + device().str());
  Layout out{l.dtype, l.shape, {}, 0, l.subbyte_padded};
  if (order == MemoryOrder::Any && l.is_dense() && !l.is_packed_subbyte()) {
    out.strides = l.strides;  // same dimension order, dense
    for (size_t i = 0; i < l.ndim(); ++i)
      if (l.shape[i] == 1) out.strides[i] = 1;
    if (!out.is_dense()) out.strides = Layout::contiguous_strides(l.shape);
  } else {
    out.strides = Layout::contiguous_strides(l.shape, order == MemoryOrder::F ? MemoryOrder::F : MemoryOrder::C);
  }
  int64_t nbytes = l.nbytes();
  if (l.subbyte_padded) nbytes = l.numel();
  Tensor dst = Tensor::make(Buffer::allocate(static_cast<size_t>(nbytes)), std::move(out), false);
  if (!metadata().empty()) dst.metadata() = metadata();
  tw::copy(*this, dst);
  return dst;
}

Tensor Tensor::reshape(const Shape& shape) const {
  try {
    return view(shape);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::copy_required) throw;
  }
  return contiguous().view(shape);
}

}  // namespace tw
