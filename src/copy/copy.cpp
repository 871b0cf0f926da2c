#include "tensorwire/copy.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "kernels.hpp"
#include "plan.hpp"
#include "thread_pool.hpp"

namespace tw {
namespace {

constexpr int64_t kParallelBytes = 4 << 20;  // below this a copy stays on the calling thread
constexpr int64_t kBytesPerTask = 1 << 20;
// At and above this the destination will not stay in cache anyway: kernels that can write whole lines use
// non-temporal stores, which skip reading the destination first (a third of the memory traffic of a copy).
// Measured on the transpose: regular stores win at 4 MiB, streaming ones from 16 MiB.
constexpr int64_t kStreamBytes = 8 << 20;
// The same for write-dominated copies, whose source is a broadcast that stays in cache (expand): they keep ordinary
// stores up to about a last-level cache, where those measured 24-29 GB/s against 16-18 streaming at 16 MiB; at
// 64 MiB streaming wins again (expand_row 12 -> 17.7 GB/s).
constexpr int64_t kStreamBytesWriteOnly = 32 << 20;

// A copy problem after simplification: dims ordered outermost first, all strides in bytes.
struct Plan {
  int nd = 0;
  int64_t n[kMaxRank];
  int64_t ss[kMaxRank];
  int64_t ds[kMaxRank];
  const char* src = nullptr;
  char* dst = nullptr;
  size_t isz = 0;
  enum class Kernel { memcpy_runs, transpose, gather } kernel = Kernel::gather;
  int loop_dims = 0;  // dims iterated outside the kernel: [0, loop_dims)
  bool stream = false;  // non-temporal stores where the kernel has them (see kStreamBytes)
};

}  // namespace

detail::CopyDims detail::simplify_copy(const Layout& src, const Layout& dst, size_t isz) noexcept {
  CopyDims c;
  const int64_t is = static_cast<int64_t>(isz);
  struct D {
    int64_t n, s, d;
  };
  D dims[kMaxRank];
  int nd = 0;
  for (size_t i = 0; i < src.ndim(); ++i) {
    if (src.shape[i] == 1) continue;
    D x{src.shape[i], src.strides[i] * is, dst.strides[i] * is};
    if (x.d < 0) {  // walk the destination forwards
      c.dst_start += (x.n - 1) * x.d;
      c.src_start += (x.n - 1) * x.s;
      x.d = -x.d;
      x.s = -x.s;
    }
    dims[nd++] = x;
  }
  // Outermost = largest destination stride; ties broken by source stride so equal-stride dims stay coalescable.
  std::stable_sort(dims, dims + nd, [](const D& a, const D& b) {
    if (a.d != b.d) return a.d > b.d;
    return std::llabs(a.s) > std::llabs(b.s);
  });
  // Coalesce neighbours that are contiguous together on both sides.
  int m = 0;
  for (int i = 0; i < nd; ++i) {
    if (m > 0 && dims[m - 1].s == dims[i].s * dims[i].n && dims[m - 1].d == dims[i].d * dims[i].n) {
      dims[m - 1] = D{dims[m - 1].n * dims[i].n, dims[i].s, dims[i].d};
      continue;
    }
    dims[m++] = dims[i];
  }
  nd = m;
  if (nd == 0) {  // a single element
    dims[0] = D{1, is, is};
    nd = 1;
  }
  c.nd = nd;
  for (int i = 0; i < nd; ++i) {
    c.n[i] = dims[i].n;
    c.ss[i] = dims[i].s;
    c.ds[i] = dims[i].d;
  }
  return c;
}

namespace {

Plan make_plan(const Tensor& src, const Tensor& dst, size_t isz) {
  Plan p;
  p.isz = isz;
  const int64_t is = static_cast<int64_t>(isz);
  const detail::CopyDims c = detail::simplify_copy(src.layout(), dst.layout(), isz);
  p.src = static_cast<const char*>(src.data_ptr()) + c.src_start;
  p.dst = static_cast<char*>(dst.data_ptr()) + c.dst_start;
  struct D {
    int64_t n, s, d;
  };
  D dims[kMaxRank]{};
  int nd = c.nd;
  for (int i = 0; i < nd; ++i) dims[i] = D{c.n[i], c.ss[i], c.ds[i]};
  // Pick the kernel. Transpose: destination contiguous innermost, source contiguous along another dim: move that
  // dim next to the innermost so the kernel sees a 2-D transpose. A broadcast innermost source (stride 0) is a
  // fill, which the gather kernel does at store speed: no transpose for it.
  const D inner = dims[nd - 1];
  if (inner.d == is && inner.s == is) {
    p.kernel = Plan::Kernel::memcpy_runs;
  } else if (inner.d == is && inner.s != 0 && nd >= 2) {
    int k = -1;
    for (int i = nd - 2; i >= 0; --i)
      if (dims[i].s == is) {
        k = i;
        break;
      }
    if (k >= 0 && dims[k].n >= 4 && inner.n >= 4) {
      D kd = dims[k];
      for (int i = k; i < nd - 2; ++i) dims[i] = dims[i + 1];
      dims[nd - 2] = kd;
      p.kernel = Plan::Kernel::transpose;
    }
  }
  p.nd = nd;
  for (int i = 0; i < nd; ++i) {
    p.n[i] = dims[i].n;
    p.ss[i] = dims[i].s;
    p.ds[i] = dims[i].d;
  }
  p.loop_dims = p.kernel == Plan::Kernel::transpose ? nd - 2 : nd - 1;
  return p;
}

void run_plan_unfenced(const Plan& p, int64_t b0, int64_t e0);

// Runs the kernel over outer index range [b0, e0) of dim 0 (the outermost dim, loop dim or kernel dim). Streaming
// stores are fenced once here, by the thread that made them, before the pool or the caller publishes the result.
void run_plan(const Plan& p, int64_t b0, int64_t e0) {
  run_plan_unfenced(p, b0, e0);
  if (p.stream) detail::stream_fence();
}

void run_plan_unfenced(const Plan& p, int64_t b0, int64_t e0) {
  const int ld = p.loop_dims;
  const char* s0 = p.src + b0 * p.ss[0];
  char* d0 = p.dst + b0 * p.ds[0];
  auto kernel = [&](const char* s, char* d, int64_t first_n) {
    // first_n replaces n[0] when dim 0 is a kernel dim
    const int nd = p.nd;
    if (p.kernel == Plan::Kernel::transpose) {
      int64_t rows = ld == 0 ? first_n : p.n[nd - 2];
      detail::transpose_2d(d, p.ds[nd - 2], s, p.ss[nd - 1], rows, p.n[nd - 1], p.isz, p.stream);
    } else {
      int64_t n = ld == 0 ? first_n : p.n[nd - 1];
      detail::gather_1d(d, p.ds[nd - 1], s, p.ss[nd - 1], n, p.isz, p.stream);
    }
  };
  if (ld == 0) {
    kernel(s0, d0, e0 - b0);
    return;
  }
  int64_t idx[kMaxRank] = {0};
  int64_t n0 = e0 - b0;
  const char* s = s0;
  char* d = d0;
  for (;;) {
    kernel(s, d, 0);
    int k = ld - 1;
    for (; k >= 0; --k) {
      const int64_t nk = k == 0 ? n0 : p.n[k];
      if (++idx[k] < nk) {
        s += p.ss[k];
        d += p.ds[k];
        break;
      }
      s -= (nk - 1) * p.ss[k];
      d -= (nk - 1) * p.ds[k];
      idx[k] = 0;
    }
    if (k < 0) return;
  }
}

void run_parallel(const Plan& p, int64_t total_bytes) {
  const int64_t n0 = p.n[0];
  if (total_bytes < kParallelBytes || n0 <= 1) {
    run_plan(p, 0, n0);
    return;
  }
  const int threads = detail::num_threads();
  int64_t tasks = std::min<int64_t>({n0, total_bytes / kBytesPerTask, int64_t(threads) * 4});
  if (threads <= 1 || tasks <= 1) {
    run_plan(p, 0, n0);
    return;
  }
  // Transpose kernels want row chunks that are multiples of the register tile.
  const int64_t align = (p.kernel == Plan::Kernel::transpose && p.loop_dims == 0) ? 8 : 1;
  int64_t chunk = (n0 + tasks - 1) / tasks;
  chunk = (chunk + align - 1) / align * align;
  tasks = (n0 + chunk - 1) / chunk;
  detail::parallel_for(tasks, [&](int64_t t) {
    int64_t b = t * chunk, e = std::min(n0, b + chunk);
    if (b < e) run_plan(p, b, e);
  });
}

// ---- packed sub-byte types: element-by-element bit moves (little bit-endian, as DLPack specifies) -------------
void copy_packed(const Tensor& src, const Tensor& dst) {
  const int64_t bits = src.dtype().total_bits();
  const unsigned mask = (1u << bits) - 1u;
  const auto* s = static_cast<const unsigned char*>(src.data_ptr());
  auto* d = static_cast<unsigned char*>(dst.data_ptr());
  const size_t nd = src.ndim();
  if (src.is_contiguous() && dst.is_contiguous() && (src.numel() * bits) % 8 == 0) {
    std::memmove(d, s, static_cast<size_t>(src.numel() * bits / 8));
    return;
  }
  std::vector<int64_t> idx(nd, 0);
  int64_t so = 0, dof = 0;  // element offsets
  const int64_t n = src.numel();
  for (int64_t e = 0; e < n; ++e) {
    int64_t sb = so * bits, db = dof * bits;
    unsigned v = (unsigned(s[sb >> 3]) | (unsigned(s[(sb >> 3) + ((sb & 7) + bits > 8 ? 1 : 0)]) << 8)) >> (sb & 7);
    v &= mask;
    unsigned char* p = d + (db >> 3);
    const int sh = static_cast<int>(db & 7);
    unsigned w = unsigned(p[0]) | (sh + bits > 8 ? unsigned(p[1]) << 8 : 0u);
    w = (w & ~(mask << sh)) | (v << sh);
    p[0] = static_cast<unsigned char>(w & 0xFF);
    if (sh + bits > 8) p[1] = static_cast<unsigned char>(w >> 8);
    for (size_t k = nd; k-- > 0;) {
      if (++idx[k] < src.shape()[k]) {
        so += src.strides()[k];
        dof += dst.strides()[k];
        break;
      }
      so -= (src.shape()[k] - 1) * src.strides()[k];
      dof -= (dst.shape()[k] - 1) * dst.strides()[k];
      idx[k] = 0;
    }
  }
}

bool ranges_overlap(const Tensor& a, const Tensor& b) {
  return detail::spans_overlap(a.data_ptr(), a.layout(), b.data_ptr(), b.layout());
}

void byteswap_all(const Tensor& dst, size_t isz, size_t unit) {
  // Walk the destination as a gather with itself: dims ordered outermost first.
  const int64_t is = static_cast<int64_t>(isz);
  const size_t nd = dst.ndim();
  if (dst.numel() == 0) return;
  if (nd == 0) {
    detail::byteswap_1d(static_cast<char*>(dst.data_ptr()), is, 1, isz, unit);
    return;
  }
  std::vector<int64_t> idx(nd, 0);
  char* base = static_cast<char*>(dst.data_ptr());
  int64_t off = 0;
  const int64_t inner_n = dst.shape()[nd - 1], inner_s = dst.strides()[nd - 1] * is;
  for (;;) {
    detail::byteswap_1d(base + off, inner_s, inner_n, isz, unit);
    size_t k = nd - 1;
    for (; k-- > 0;) {
      if (++idx[k] < dst.shape()[k]) {
        off += dst.strides()[k] * is;
        break;
      }
      off -= (dst.shape()[k] - 1) * dst.strides()[k] * is;
      idx[k] = 0;
    }
    if (k == static_cast<size_t>(-1)) return;
  }
}

}  // namespace

void copy(const Tensor& src, const Tensor& dst, CopyOptions options) {
  if (!src.defined() || !dst.defined()) throw Error(ErrorCode::invalid_argument, "tw::copy: undefined tensor");
  if (!(src.dtype() == dst.dtype()))
    throw Error(ErrorCode::invalid_argument, "tw::copy: dtypes differ (" + src.dtype().name() + " -> " +
                                                 dst.dtype().name() + "); the copy engine does not convert");
  if (!(src.shape() == dst.shape()))
    throw Error(ErrorCode::invalid_argument,
                "tw::copy: shapes differ (" + src.shape().str() + " -> " + dst.shape().str() + ")");
  if (src.subbyte_padded() != dst.subbyte_padded())
    throw Error(ErrorCode::unsupported, "tw::copy: packed and padded " + src.dtype().name() +
                                            " layouts differ; converting between them is not supported");
  if (dst.readonly()) throw Error(ErrorCode::read_only, "tw::copy: the destination is read-only");
  if (!src.device().is_host_accessible() || !dst.device().is_host_accessible())
    throw Error(ErrorCode::unsupported, "tw::copy: the host copy engine cannot access " +
                                            (src.device().is_host_accessible() ? dst.device() : src.device()).str() +
                                            " memory");
  if (dst.layout().may_overlap())
    throw Error(ErrorCode::invalid_argument, "tw::copy: the destination (strides " + dst.strides().str() +
                                                 ") has elements that overlap; writing it would be ambiguous");
  if (src.numel() == 0) return;
  if (ranges_overlap(src, dst)) {  // through a temporary, so no element is overwritten before it is read
    Tensor tmp = Tensor::empty(src.shape(), src.dtype());
    if (src.subbyte_padded()) tmp = src.copy();
    else copy(src, tmp);
    copy(tmp, dst, options);
    return;
  }
  if (src.layout().is_packed_subbyte()) {
    copy_packed(src, dst);
    return;
  }
  const size_t isz = src.layout().element_bytes();
  Plan p = make_plan(src, dst, isz);
  const int64_t bytes = src.numel() * static_cast<int64_t>(isz);
  const bool write_only = src.layout().byte_span().size() * 2 < bytes;
  p.stream = bytes >= (write_only ? kStreamBytesWriteOnly : kStreamBytes);
  run_parallel(p, bytes);
  if (options.byteswap) {
    const bool complex = src.dtype().code == kDLComplex || src.dtype().code == kDLBcomplex;  // swap each half
    byteswap_all(dst, isz, complex ? isz / (2 * src.dtype().lanes) : isz / src.dtype().lanes);
  }
}

}  // namespace tw
