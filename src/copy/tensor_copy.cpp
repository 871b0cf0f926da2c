// The Tensor members that copy elements: defined by the copy layer, so that `core` (tensor.cpp) needs nothing of
// the copy engine. core declares them (tensor.hpp); a program that calls them links the copy layer, as every
// tensorwire library does. (The alternative, a copy hook that core calls through a pointer, would hide a
// dependency the build can check.)
#include <cstring>

#include "tensorwire/copy.hpp"
#include "tensorwire/device_runtime.hpp"
#include "tensorwire/tensor.hpp"

namespace tw {
namespace {

constexpr intptr_t kLegacyStream = 1;  // CU_STREAM_LEGACY: DLPack's and the CUDA Array Interface's 1

bool is_cuda_memory(Device d) { return d.type == kDLCUDA || d.type == kDLCUDAManaged || d.type == kDLCUDAHost; }

// Memory for `l` on `d`: the host allocator for the CPU, the device runtime's pools otherwise.
std::shared_ptr<Buffer> allocate_for(const Layout& l, Device d, intptr_t stream) {
  int64_t nbytes = l.nbytes();
  if (l.subbyte_padded) nbytes = l.numel();
  if (d.type == kDLCPU) return Buffer::allocate(static_cast<size_t>(nbytes));
  if (!is_cuda_memory(d))
    throw Error(ErrorCode::unsupported, "tensorwire cannot allocate memory on " + d.str() + " (cpu, cuda:N and "
                                        "cuda_host are supported)");
  return device_runtime().allocate(d, static_cast<size_t>(nbytes > 0 ? nbytes : 1), stream);
}

// The layout a copy of `l` gets: dense in `order` (Any keeps the dimension order of a dense source, negative
// strides turned positive).
Layout copy_layout(const Layout& l, MemoryOrder order) {
  Layout out{l.dtype, l.shape, {}, 0, l.subbyte_padded};
  if (order == MemoryOrder::Any && l.is_dense() && !l.is_packed_subbyte()) {
    out.strides = l.strides;
    for (size_t i = 0; i < l.ndim(); ++i) {
      if (l.shape[i] == 1) out.strides[i] = 1;
      if (out.strides[i] < 0) out.strides[i] = -out.strides[i];
    }
    if (!out.is_dense()) out.strides = Layout::contiguous_strides(l.shape);
  } else {
    out.strides = Layout::contiguous_strides(l.shape, order == MemoryOrder::F ? MemoryOrder::F : MemoryOrder::C);
  }
  return out;
}

}  // namespace

Tensor Tensor::contiguous() const {
  if (is_contiguous(MemoryOrder::C)) return *this;
  return copy(MemoryOrder::C);
}

Tensor Tensor::copy(MemoryOrder order, std::optional<intptr_t> stream) const {
  const Device dev = device();
  Layout out = copy_layout(layout(), order);
  if (!is_cuda_memory(dev) && !dev.is_host_accessible())
    throw Error(ErrorCode::unsupported, "Tensor::copy: tensorwire cannot copy memory on " + dev.str());
  if (dev.type == kDLCPU || dev.type == kDLCUDAManaged) {  // managed memory: the host reads it (as before)
    if (stream)
      throw Error(ErrorCode::invalid_argument, "Tensor::copy: stream=" + std::to_string(*stream) + " orders CUDA "
                                               "work, and the host copies " + dev.str() + " memory; leave it unset");
    auto buf = allocate_for(out, Device::cpu(), 0);  // before `out` is moved into make's argument
    Tensor dst = Tensor::make(std::move(buf), std::move(out), false);
    if (!metadata().empty()) dst.metadata() = metadata();
    tw::copy(*this, dst);
    return dst;
  }
  // New work goes on the caller's stream (default: the legacy one), after the tensor's own stream (an event): a
  // producer's stream is waited for, never used to queue tensorwire's work.
  const intptr_t s = stream.value_or(kLegacyStream);
  auto buf = allocate_for(out, dev, s);
  Tensor dst = Tensor::make(std::move(buf), std::move(out), false);
  if (!metadata().empty()) dst.metadata() = metadata();
  device_runtime().copy(*this, dst, s);
  if (dev.type != kDLCUDAHost) set_producer_stream(dst, s);  // (an event on s unless it is the legacy stream)
  return dst;
}

Tensor Tensor::to(Device target, std::optional<intptr_t> stream_arg, std::optional<bool> copy_arg) const {
  const Device dev = device();
  if (stream_arg && dev.type == kDLCPU && target.type == kDLCPU)  // (DLPack export refuses one on the CPU too)
    throw Error(ErrorCode::invalid_argument, "Tensor::to: stream=" + std::to_string(*stream_arg) + " orders CUDA "
                                             "work, and a move from cpu to cpu has none; leave stream unset");
  if (target == dev && copy_arg != true) return *this;
  if (target != dev && copy_arg == false)
    throw Error(ErrorCode::copy_required, "Tensor::to: moving from " + dev.str() + " to " + target.str() +
                                              " needs a copy, and copy=False forbids one");
  if (target.type == kDLCPU && dev.type == kDLCPU) return copy(MemoryOrder::Any);
  if (!is_cuda_memory(target) && target.type != kDLCPU)
    throw Error(ErrorCode::unsupported, "Tensor::to: tensorwire moves tensors between cpu, cuda:N and cuda_host "
                                        "(pinned), not to " + target.str());
  if (!is_cuda_memory(dev) && dev.type != kDLCPU)
    throw Error(ErrorCode::unsupported, "Tensor::to: tensorwire cannot read memory on " + dev.str());
  const intptr_t s = stream_arg.value_or(kLegacyStream);
  Layout out = copy_layout(layout(), MemoryOrder::Any);
  auto buf = allocate_for(out, target, s);
  Tensor dst = Tensor::make(std::move(buf), std::move(out), false);
  if (!metadata().empty()) dst.metadata() = metadata();
  device_runtime().copy(*this, dst, s);
  // Device results are ready in the order of s (with an event on it unless it is the legacy stream: the caller's
  // stream may go, and 2 is each thread's own); host ones now.
  if (target.type == kDLCUDA) set_producer_stream(dst, s);
  return dst;
}

Tensor Tensor::pin() const {
  if (pinned()) return *this;
  const Device dev = device();
  if (dev.type != kDLCPU)
    throw Error(ErrorCode::unsupported, "Tensor::pin: the tensor is on " + dev.str() + ", not in host memory; pin "
                                        "copies host memory into page-locked memory (use to('cpu') first)");
  // The bytes the elements span, copied as they lie: strides (negative, zero, gaps) and metadata kept.
  const ByteSpan sp = layout().byte_span();
  const int64_t n = numel() == 0 ? 0 : sp.size();
  auto buf = device_runtime().allocate(Device::cuda_host(), static_cast<size_t>(n > 0 ? n : 1), 0);
  Layout out = layout();
  out.byte_offset = numel() == 0 ? 0 : -sp.begin;
  if (n > 0) std::memcpy(buf->base(), static_cast<const char*>(data_ptr()) + sp.begin, static_cast<size_t>(n));
  Tensor p = Tensor::make(std::move(buf), std::move(out), readonly());
  if (!metadata().empty()) p.metadata() = metadata();
  return p;
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device, MemoryOrder order) {
  if (device.type == kDLCPU) return empty(std::move(shape), dtype, order);
  Layout l{dtype, std::move(shape), {}, 0, false};
  l.strides = Layout::contiguous_strides(l.shape, order == MemoryOrder::F ? MemoryOrder::F : MemoryOrder::C);
  l.validate();
  auto buf = allocate_for(l, device, kLegacyStream);
  Tensor t = Tensor::make(std::move(buf), std::move(l), false);
  if (device.type != kDLCUDAHost) t.set_stream(kLegacyStream);
  return t;
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
