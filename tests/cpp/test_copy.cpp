// The strided copy engine, swept over item sizes x layouts x byte misalignments of source and destination, each
// result compared element by element with a naive reference walk, and every destination byte that is not an
// element checked to be untouched (guards before and after, and the gaps of strided destinations).
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tw_test_util.hpp"

namespace {

using tw::Buffer;
using tw::Device;
using tw::DType;
using tw::ErrorCode;
using tw::Layout;
using tw::Shape;
using tw::Strides;
using tw::Tensor;

// ThreadSanitizer runs of this file are for the thread pool's races: they skip the exhaustive misalignment
// variations (single-threaded, and ~50x slower under TSan), which the other builds cover.
#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif

constexpr size_t kGuard = 64;              // bytes kept free before and after every placed tensor
constexpr unsigned char kSentinel = 0xA5;  // what untouched destination bytes hold

// ---- reference machinery ---------------------------------------------------------------------------------------

void for_each_index(const Shape& shape, const std::function<void(const std::vector<int64_t>&)>& fn) {
  for (int64_t s : shape)
    if (s == 0) return;
  std::vector<int64_t> idx(shape.size(), 0);
  for (;;) {
    fn(idx);
    size_t k = shape.size();
    for (; k-- > 0;) {
      if (++idx[k] < shape[k]) break;
      idx[k] = 0;
    }
    if (k == static_cast<size_t>(-1)) return;
  }
}

// Calls fn(linear C-order index, element offset in `a`, element offset in `b`) for every index of `shape`, with
// offsets carried incrementally so multi-million-element references stay fast in unoptimised builds.
template <class F>
void walk2(const Shape& shape, const Strides& a, const Strides& b, F&& fn) {
  const size_t nd = shape.size();
  for (int64_t s : shape)
    if (s == 0) return;
  if (nd == 0) {
    fn(int64_t{0}, int64_t{0}, int64_t{0});
    return;
  }
  std::vector<int64_t> idx(nd, 0);
  const int64_t inner = shape[nd - 1], ia = a[nd - 1], ib = b[nd - 1];
  int64_t oa = 0, ob = 0, lin = 0;
  for (;;) {
    for (int64_t i = 0; i < inner; ++i) fn(lin++, oa + i * ia, ob + i * ib);
    size_t k = nd - 1;
    for (; k-- > 0;) {
      oa += a[k];
      ob += b[k];
      if (++idx[k] < shape[k]) break;
      oa -= a[k] * shape[k];
      ob -= b[k] * shape[k];
      idx[k] = 0;
    }
    if (k == static_cast<size_t>(-1)) return;
  }
}

std::string index_str(const Shape& shape, int64_t lin) {
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = lin % shape[k];
    lin /= shape[k];
  }
  std::string s = "(";
  for (size_t i = 0; i < idx.size(); ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
  return s + ")";
}

int64_t elem_offset(const Strides& strides, const std::vector<int64_t>& idx) {
  int64_t off = 0;
  for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * strides[i];
  return off;
}

unsigned char pattern(size_t pos) { return static_cast<unsigned char>((pos * 2654435761u) >> 13); }

// A tensor placed at a chosen misalignment (relative to a 16-byte boundary) inside a fresh allocation of its own,
// kGuard bytes after the allocation starts, so `t`'s byte_offset is nonzero, as for any view.
//  - A source is filled with a position-dependent pattern and its allocation ends exactly at its last byte, so an
//    address sanitizer catches any read past the end (a vector load that runs over, say).
//  - A destination is filled with kSentinel and has kGuard more bytes after its last byte, so writes past the
//    end (or into the gaps of a strided layout) are seen as changed sentinels.
//  - A fenced source sits flush against an inaccessible page (after its last byte, or before its first), so a
//    read outside it faults even where a sanitizer cannot see (vector loads through intrinsics).
enum class Role { source, destination, source_fenced_end, source_fenced_start };

struct Placed {
  std::shared_ptr<Buffer> mem;
  Tensor t;
  unsigned char* bytes() const { return static_cast<unsigned char*>(mem->base()); }
  size_t size() const { return mem->size(); }
  std::vector<unsigned char> snapshot() const { return std::vector<unsigned char>(bytes(), bytes() + size()); }
};

Placed place(DType dtype, const Shape& shape, const Strides& strides, size_t misalign, Role role) {
  Layout l{dtype, shape, strides, 0, false};
  l.validate();
  tw::ByteSpan sp = l.byte_span();
  if (role == Role::source_fenced_end || role == Role::source_fenced_start) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t span = static_cast<size_t>(sp.size());
    const size_t body = std::max<size_t>(1, (span + page - 1) / page) * page;
    void* m = mmap(nullptr, body + 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::runtime_error("mmap failed");
    auto* region = static_cast<unsigned char*>(m) + page;
    mprotect(m, page, PROT_NONE);
    mprotect(region + body, page, PROT_NONE);
    std::shared_ptr<void> keep(m, [n = body + 2 * page](void* q) { munmap(q, n); });
    Placed p;
    p.mem = std::make_shared<Buffer>(region, body, Device::cpu(), keep);
    for (size_t i = 0; i < body; ++i) region[i] = pattern(i);
    const size_t first = role == Role::source_fenced_end ? body - span : 0;
    l.byte_offset = static_cast<int64_t>(first) - sp.begin;
    p.t = Tensor::make(p.mem, l);
    return p;
  }
  const bool src = role == Role::source;
  const size_t total = kGuard + misalign + static_cast<size_t>(sp.size()) + (src ? 0 : kGuard);
  std::shared_ptr<unsigned char[]> raw(new unsigned char[total]);
  Placed p;
  p.mem = std::make_shared<Buffer>(raw.get(), total, Device::cpu(), raw);
  unsigned char* b = p.bytes();
  for (size_t i = 0; i < total; ++i) b[i] = src ? pattern(i) : kSentinel;
  l.byte_offset = static_cast<int64_t>(kGuard + misalign) - sp.begin;
  p.t = Tensor::make(p.mem, l);
  return p;
}

struct Case {
  std::string name;
  Shape shape;
  Strides src;
  Strides dst;
};

std::string describe(const Case& c, DType d, size_t sm, size_t dm) {
  std::ostringstream os;
  os << c.name << " shape " << c.shape.str() << " src strides " << c.src.str() << " dst strides " << c.dst.str()
     << " dtype " << d.name() << " src misalign " << sm << " dst misalign " << dm;
  return os.str();
}

// Copies src -> dst with the engine and checks every element and every non-element byte of the destination.
testing::AssertionResult run_case(const Case& c, DType d, size_t sm, size_t dm, tw::CopyOptions opt = {},
                                   Role src_role = Role::source) {
  Placed src = place(d, c.shape, c.src, sm, src_role);
  Placed dst = place(d, c.shape, c.dst, dm, Role::destination);
  const auto src_before = src.snapshot();
  try {
    tw::copy(src.t, dst.t, opt);
  } catch (const std::exception& e) {
    return testing::AssertionFailure() << describe(c, d, sm, dm) << ": threw " << e.what();
  }
  const int64_t isz = static_cast<int64_t>(d.itemsize());
  const auto* s0 = static_cast<const unsigned char*>(src.t.data_ptr());
  unsigned char* d0 = static_cast<unsigned char*>(dst.t.data_ptr());
  std::vector<unsigned char> is_elem(dst.size(), 0);
  unsigned char* const mark0 = is_elem.data();
  unsigned char* mark = mark0 + (d0 - dst.bytes());
  std::optional<std::string> bad;
  walk2(c.shape, c.src, c.dst, [&](int64_t lin, int64_t so, int64_t doff) {
    if (bad) return;
    const unsigned char* se = s0 + so * isz;
    const unsigned char* de = d0 + doff * isz;
    std::memset(mark + doff * isz, 1, static_cast<size_t>(isz));
    const bool same = opt.byteswap ? std::equal(de, de + isz, std::reverse_iterator<const unsigned char*>(se + isz))
                                   : std::memcmp(de, se, static_cast<size_t>(isz)) == 0;
    if (!same) {
      std::ostringstream os;
      os << describe(c, d, sm, dm) << ": element " << index_str(c.shape, lin) << " differs from the source"
         << (opt.byteswap ? " (byte-swapped)" : "");
      bad = os.str();
    }
  });
  if (bad) return testing::AssertionFailure() << *bad;
  const unsigned char* bytes = dst.bytes();
  for (size_t i = 0; i < dst.size(); ++i)
    if (!mark0[i] && bytes[i] != kSentinel)
      return testing::AssertionFailure() << describe(c, d, sm, dm) << ": byte " << i << " of the destination allocation "
                                         << "(not an element) was overwritten";
  if (src.snapshot() != src_before)
    return testing::AssertionFailure() << describe(c, d, sm, dm) << ": the source was modified";
  return testing::AssertionSuccess();
}

Strides c_strides(const Shape& s) { return Layout::contiguous_strides(s); }

Strides permuted(const Strides& st, const std::vector<size_t>& perm) {
  Strides out;
  for (size_t p : perm) out.push_back(st[p]);
  return out;
}
Shape permuted_shape(const Shape& s, const std::vector<size_t>& perm) {
  Shape out;
  for (size_t p : perm) out.push_back(s[p]);
  return out;
}

// The layouts of the sweep. Every source/destination pair has the same logical shape.
std::vector<Case> sweep_cases() {
  std::vector<Case> cs;
  // Contiguous runs of many lengths (around vector widths and memcpy thresholds).
  for (int64_t n : {0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 255, 256, 257, 1023, 4099})
    cs.push_back({"contiguous", {n}, {1}, {1}});
  cs.push_back({"scalar", {}, {}, {}});
  cs.push_back({"contiguous-3d", {3, 5, 7}, {35, 7, 1}, {35, 7, 1}});
  cs.push_back({"zero-size", {0, 5}, {5, 1}, {1, 0}});
  cs.push_back({"zero-size", {5, 0}, {0, 1}, {1, 5}});
  // 2-D transposes both ways, including ragged edges that are not multiples of the 8x8 / 4x4 tiles.
  const std::vector<std::pair<int64_t, int64_t>> shapes2d = {
      {1, 1}, {1, 7}, {7, 1}, {2, 3}, {3, 2}, {4, 4}, {4, 5}, {5, 4}, {7, 9}, {8, 8}, {8, 9}, {9, 8},
      {12, 12}, {16, 16}, {13, 17}, {31, 33}, {33, 31}, {64, 64}, {65, 63}, {100, 3}, {3, 100}, {129, 257}};
  for (auto [r, c] : shapes2d) {
    cs.push_back({"transposed-src", {r, c}, {1, r}, {c, 1}});
    cs.push_back({"transposed-dst", {r, c}, {c, 1}, {1, r}});
  }
  // Transposes with padded rows on either side (leading dimension larger than the row).
  cs.push_back({"transposed-padded", {37, 29}, {1, 40}, {31, 1}});
  cs.push_back({"transposed-padded", {29, 37}, {45, 1}, {1, 33}});
  // Every other / every third element.
  for (int64_t n : {1, 7, 8, 9, 64, 65, 1001}) {
    cs.push_back({"every-other-src", {n}, {2}, {1}});
    cs.push_back({"every-other-dst", {n}, {1}, {2}});
    cs.push_back({"every-third-both", {n}, {3}, {2}});
  }
  cs.push_back({"every-other-col", {9, 13}, {52, 2}, {13, 1}});
  cs.push_back({"every-other-row", {9, 13}, {26, 1}, {13, 1}});
  // Negative strides on either side.
  for (int64_t n : {1, 2, 9, 64, 257}) {
    cs.push_back({"reversed-src", {n}, {-1}, {1}});
    cs.push_back({"reversed-dst", {n}, {1}, {-1}});
    cs.push_back({"reversed-every-other", {n}, {-2}, {1}});
  }
  cs.push_back({"rows-reversed", {13, 17}, {-17, 1}, {17, 1}});
  cs.push_back({"cols-reversed", {13, 17}, {17, -1}, {17, 1}});
  cs.push_back({"reversed-transposed", {13, 17}, {-1, 13}, {17, 1}});
  cs.push_back({"both-reversed", {13, 17}, {17, 1}, {-17, -1}});
  cs.push_back({"transposed-dst-reversed", {16, 24}, {24, 1}, {-1, -16}});
  // Stride-0 broadcast sources, and an overlapping (sliding window) source.
  for (auto [r, c] : std::vector<std::pair<int64_t, int64_t>>{{5, 7}, {8, 8}, {33, 17}, {1, 9}, {64, 3}}) {
    cs.push_back({"broadcast-rows", {r, c}, {0, 1}, {c, 1}});
    cs.push_back({"broadcast-cols", {r, c}, {1, 0}, {c, 1}});
    cs.push_back({"broadcast-all", {r, c}, {0, 0}, {c, 1}});
    cs.push_back({"broadcast-to-transposed", {r, c}, {0, 1}, {1, r}});
  }
  for (int64_t n : {1, 9, 100}) cs.push_back({"broadcast-1d", {n}, {0}, {1}});
  cs.push_back({"sliding-window", {5, 4}, {1, 1}, {4, 1}});
  // NCHW -> NHWC and back, as the logical NHWC / NCHW tensors.
  for (auto [n, c, h, w] : std::vector<std::array<int64_t, 4>>{
           {1, 3, 4, 5}, {2, 3, 5, 7}, {2, 16, 8, 8}, {1, 64, 7, 7}, {3, 1, 5, 5}, {2, 5, 1, 9}, {1, 8, 3, 16}}) {
    Shape nchw{n, c, h, w};
    Strides nchw_st = c_strides(nchw);
    Shape nhwc = permuted_shape(nchw, {0, 2, 3, 1});
    cs.push_back({"nchw->nhwc", nhwc, permuted(nchw_st, {0, 2, 3, 1}), c_strides(nhwc)});
    Strides nhwc_st = c_strides(nhwc);
    cs.push_back({"nhwc->nchw", nchw, permuted(nhwc_st, {0, 3, 1, 2}), c_strides(nchw)});
  }
  // Every permutation of a 3-D source.
  for (Shape base : {Shape{3, 4, 5}, Shape{8, 9, 10}, Shape{2, 1, 17}}) {
    std::vector<size_t> perm = {0, 1, 2};
    do {
      Shape sh = permuted_shape(base, perm);
      cs.push_back({"permuted-3d", sh, permuted(c_strides(base), perm), c_strides(sh)});
      cs.push_back({"permuted-3d-dst", sh, c_strides(sh), permuted(c_strides(base), perm)});
    } while (std::next_permutation(perm.begin(), perm.end()));
  }
  // Sub-blocks of larger arrays (offset views with row gaps) on either side.
  cs.push_back({"sub-block", {7, 9}, {30, 1}, {9, 1}});
  cs.push_back({"sub-block-both", {7, 9}, {30, 1}, {12, 1}});
  cs.push_back({"sub-block-3d", {3, 4, 5}, {42, 7, 1}, {20, 5, 1}});
  cs.push_back({"sub-block-transposed", {9, 10}, {1, 11}, {20, 2}});
  // Many small dimensions, fully reversed order.
  {
    Shape s(std::vector<int64_t>(12, 2));
    Strides rev;
    for (int64_t i = 0; i < 12; ++i) rev.push_back(int64_t(1) << i);
    cs.push_back({"rank-12-reversed-dims", s, rev, c_strides(s)});
  }
  // Size-1 dimensions with arbitrary strides must not disturb coalescing.
  cs.push_back({"size-1-dims", {1, 6, 1, 5}, {999, 5, -3, 1}, {1, 5, 7, 1}});
  return cs;
}

// Item sizes 1, 2, 4, 8, 16 (the kernel-specialised ones) and 3, 12 (the generic fallback).
std::vector<DType> sweep_dtypes() {
  return {DType::uint8(),       DType::float16(),          DType::float32(),
          DType::float64(),     DType::complex128(),       DType{static_cast<uint8_t>(kDLUInt), 8, 3},
          DType{static_cast<uint8_t>(kDLFloat), 32, 3}};
}

TEST(Copy, SweepItemsizesLayoutsMisalignments) {
  tw::set_num_threads(1);
  const std::vector<std::pair<size_t, size_t>> all_mis = {{0, 0}, {0, 2}, {0, 5}, {1, 0}, {1, 2},
                                                          {1, 5}, {3, 0}, {3, 2}, {3, 5}};
  const std::vector<std::pair<size_t, size_t>> few_mis = {{0, 0}, {1, 3}};
  int n = 0;
  for (const Case& c : sweep_cases()) {
    int64_t numel = 1;
    for (int64_t s : c.shape) numel *= s;
    for (DType d : sweep_dtypes()) {
      for (auto [sm, dm] : numel > 4096 || kThreadSanitizer ? few_mis : all_mis) {
        ASSERT_TRUE(run_case(c, d, sm, dm));
        ++n;
      }
    }
  }
  EXPECT_GT(n, kThreadSanitizer ? 2000 : 5000);  // the sweep really ran
}

// Kernels must read only the source's elements: with the source flush against an unmapped page on either side,
// any over-read (a vector load past the last element, say) faults and fails the test.
TEST(Copy, SweepWithSourcesFencedByUnmappedPages) {
  tw::set_num_threads(1);
  for (const Case& c : sweep_cases()) {
    for (DType d : sweep_dtypes()) {
      ASSERT_TRUE(run_case(c, d, 0, 0, {}, Role::source_fenced_end));
      ASSERT_TRUE(run_case(c, d, 0, 1, {}, Role::source_fenced_start));
    }
  }
}

// ---- large copies through the thread pool ----------------------------------------------------------------------

std::vector<Case> large_cases() {
  std::vector<Case> cs;
  cs.push_back({"large-contiguous", {1572864 + 3}, {1}, {1}});  // > 6 MiB of float32
  cs.push_back({"large-transposed", {1500, 1100}, {1, 1500}, {1100, 1}});
  cs.push_back({"large-transposed-ragged", {1501, 1103}, {1, 1501}, {1103, 1}});
  cs.push_back({"large-every-other", {1200001}, {2}, {1}});
  cs.push_back({"large-broadcast", {2000, 700}, {0, 1}, {700, 1}});
  cs.push_back({"large-reversed", {1100, 1200}, {-1200, 1}, {1200, 1}});
  Shape nchw{4, 64, 80, 80};
  Shape nhwc = permuted_shape(nchw, {0, 2, 3, 1});
  cs.push_back({"large-nchw->nhwc", nhwc, permuted(c_strides(nchw), {0, 2, 3, 1}), c_strides(nhwc)});
  return cs;
}

TEST(Copy, LargeCopiesUseThreadsAndStayExact) {
  tw::set_num_threads(2);
  EXPECT_EQ(tw::get_num_threads(), 2);
  for (const Case& c : large_cases()) {
    ASSERT_TRUE(run_case(c, DType::float32(), 0, 0));
    if (!kThreadSanitizer) {
      ASSERT_TRUE(run_case(c, DType::float32(), 1, 3));
    }
  }
  if (kThreadSanitizer) return;
  // Other item sizes through the parallel transpose and gather paths.
  ASSERT_TRUE(run_case({"large-transposed-u8", {2500, 2100}, {1, 2500}, {2100, 1}}, DType::uint8(), 0, 1));
  ASSERT_TRUE(run_case({"large-transposed-u16", {1700, 1500}, {1, 1700}, {1500, 1}}, DType::uint16(), 2, 0));
  ASSERT_TRUE(run_case({"large-transposed-f64", {1000, 700}, {1, 1000}, {700, 1}}, DType::float64(), 0, 0));
  ASSERT_TRUE(run_case({"large-transposed-c128", {600, 500}, {1, 600}, {500, 1}}, DType::complex128(), 3, 0));
  ASSERT_TRUE(run_case({"large-3d-gather", {150, 150, 40}, {1, 150, 22500}, {6000, 40, 1}}, DType::float64(), 0, 0));
  tw::set_num_threads(1);
}

// Copies of more than 8 MiB may take other store paths (non-temporal stores that need aligned destinations);
// every destination alignment must still be exact and stay inside the destination.
TEST(Copy, VeryLargeCopiesAtEveryDestinationAlignment) {
  tw::set_num_threads(2);
  if (kThreadSanitizer) {
    ASSERT_TRUE(run_case({"huge-transposed-f32", {2048, 1100}, {1, 2048}, {1100, 1}}, DType::float32(), 0, 0));
    ASSERT_TRUE(run_case({"huge-every-other-f32", {2300001}, {2}, {1}}, DType::float32(), 0, 0));
    ASSERT_TRUE(run_case({"huge-fill-f32", {2100, 1001}, {1, 0}, {1001, 1}}, DType::float32(), 0, 0));
    tw::set_num_threads(1);
    return;
  }
  for (size_t dm : {size_t{0}, size_t{1}, size_t{4}, size_t{8}, size_t{16}, size_t{28}}) {
    ASSERT_TRUE(run_case({"huge-transposed-f32", {2048, 1100}, {1, 2048}, {1100, 1}}, DType::float32(), 0, dm));
    ASSERT_TRUE(run_case({"huge-transposed-f64-ragged", {1101, 1003}, {1, 1101}, {1003, 1}}, DType::float64(), 3, dm));
  }
  ASSERT_TRUE(run_case({"huge-contiguous", {2300001}, {1}, {1}}, DType::float32(), 1, 5));
  // Stride-2 gathers and broadcast fills of every specialised item size, at aligned and misaligned destinations.
  for (size_t dm : {size_t{0}, size_t{20}}) {  // a 32-byte aligned destination, and one aligned to 4 only
    ASSERT_TRUE(run_case({"huge-every-other-u8", {8500001}, {2}, {1}}, DType::uint8(), 1, dm));
    ASSERT_TRUE(run_case({"huge-every-other-u16", {4300001}, {2}, {1}}, DType::uint16(), 0, dm));
    ASSERT_TRUE(run_case({"huge-every-other-f32", {2300001}, {2}, {1}}, DType::float32(), 0, dm));
    ASSERT_TRUE(run_case({"huge-every-other-f64", {1100001}, {2}, {1}}, DType::float64(), 0, dm));
    ASSERT_TRUE(run_case({"huge-fill-u8", {4100, 2101}, {1, 0}, {2101, 1}}, DType::uint8(), 0, dm));
    ASSERT_TRUE(run_case({"huge-fill-f32", {2100, 1001}, {1, 0}, {1001, 1}}, DType::float32(), 0, dm));
    ASSERT_TRUE(run_case({"huge-fill-c128", {600, 901}, {1, 0}, {901, 1}}, DType::complex128(), 0, dm));
    ASSERT_TRUE(run_case({"huge-fill-all", {3000000}, {0}, {1}}, DType::float32(), 0, dm));
  }
  ASSERT_TRUE(run_case({"huge-every-other-u16-odd", {4300001}, {2}, {1}}, DType::uint16(), 0, 3));
  ASSERT_TRUE(run_case({"huge-fill-f32-odd", {2100, 1001}, {1, 0}, {1001, 1}}, DType::float32(), 0, 3));
  tw::set_num_threads(1);
}

TEST(Copy, ThreadCountChangesBetweenLargeCopies) {
  const Case c{"large-transposed", {1024, 1536}, {1, 1024}, {1536, 1}};
  for (int n : {2, 1, 3, 2, 0}) {
    tw::set_num_threads(n);
    ASSERT_TRUE(run_case(c, DType::float32(), 0, 0)) << "threads " << n;
  }
  EXPECT_EQ(tw::get_num_threads(), static_cast<int>(std::thread::hardware_concurrency()));
  tw::set_num_threads(-5);
  EXPECT_EQ(tw::get_num_threads(), static_cast<int>(std::thread::hardware_concurrency()));
  tw::set_num_threads(1);
}

TEST(Copy, AThreadCountPastTheLimitIsRefusedAndThreadsTheSystemRefusesAreDoneWithout) {
  tw::set_num_threads(3);
  TW_EXPECT_ERROR_MSG(tw::set_num_threads(tw::kMaxThreads + 1), ErrorCode::invalid_argument, "at most 1024");
  TW_EXPECT_ERROR(tw::set_num_threads(100000), ErrorCode::invalid_argument);
  EXPECT_EQ(tw::get_num_threads(), 3);  // unchanged by a refused request
  tw::set_num_threads(tw::kMaxThreads);
  EXPECT_EQ(tw::get_num_threads(), tw::kMaxThreads);
  tw::set_num_threads(1);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // (their shadow memory needs the address space)
  // A child whose address space has room for a few thread stacks only: 64 threads asked for, a large copy still
  // completes, exactly, on the threads the system gave (before, the pool's constructor let std::system_error
  // escape with joinable threads: std::terminate).
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    size_t vm_kib = 0;
    FILE* f = std::fopen("/proc/self/status", "r");
    char line[256];
    while (f && std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "VmSize: %zu kB", &vm_kib) == 1) break;
    if (f) std::fclose(f);
    // Everything the check needs is allocated first; only the copy runs under the limit.
    Tensor src = Tensor::empty({1536, 1024}, DType::float32());
    float* s = src.data<float>();
    for (int64_t i = 0; i < src.numel(); ++i) s[i] = static_cast<float>(i);
    Tensor dst = Tensor::empty({1024, 1536}, DType::float32());
    rlimit lim{};
    lim.rlim_cur = lim.rlim_max = (vm_kib << 10) + (size_t{96} << 20);  // room for a few thread stacks
    if (vm_kib == 0 || ::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(3);
    tw::set_num_threads(64);
    try {
      tw::copy(src.transpose(0, 1), dst);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "the copy threw: %s\n", e.what());
      ::_exit(4);
    }
    bool ok = true;
    const float* d = dst.data<const float>();
    for (int64_t r = 0; r < 1024 && ok; ++r)
      for (int64_t c = 0; c < 1536 && ok; ++c) ok = d[r * 1536 + c] == static_cast<float>(c * 1024 + r);
    ::_exit(ok ? 0 : 5);
  }
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 6000 && (done = ::waitpid(pid, &status, WNOHANG)) == 0; ++i) ::usleep(10000);
  if (done == 0) {  // a hung child (the pool before the fix deadlocked) fails the test, within 60 s
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "the copy with threads the system refused did not finish within 60 s";
  }
  ASSERT_EQ(done, pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
#endif
}

TEST(Copy, ConcurrentLargeCopiesToDisjointDestinations) {
  tw::set_num_threads(2);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      const Case c = i % 2 ? Case{"concurrent-transposed", {1200, 1000}, {1, 1200}, {1000, 1}}
                           : Case{"concurrent-contiguous", {1300000}, {1}, {1}};
      for (int rep = 0; rep < 2; ++rep)
        if (!run_case(c, DType::float32(), size_t(i), 0)) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  tw::set_num_threads(1);
}

#if !defined(__SANITIZE_THREAD__)
// Runs `child` in a forked process; true when it exits 0 within a minute (a hung child is killed and counts false).
bool in_forked_child(const std::function<bool()>& child) {
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) _exit(child() ? 0 : 1);
  int status = 0;
  for (int i = 0; i < 600; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    usleep(100 * 1000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return false;
}
#endif

// After fork() the child has none of the parent's pool threads, and the pool's locks may be held by threads that
// no longer exist there: a large copy in the child must still complete (on a fresh pool) and be exact.
TEST(Copy, ThreadPoolWorksInForkedChildren) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not support fork() from a multi-threaded process";
#else
  tw::set_num_threads(2);
  const Case big{"fork-transposed", {1200, 1000}, {1, 1200}, {1000, 1}};
  ASSERT_TRUE(run_case(big, DType::float32(), 0, 0));  // the parent's pool now exists
  EXPECT_TRUE(in_forked_child([&] { return bool(run_case(big, DType::float32(), 1, 0)); }));
#if defined(__SANITIZE_ADDRESS__)
  // GCC 12's AddressSanitizer does not take its allocator's locks around fork(): a fork while the busy thread
  // below allocates can leave the child's allocator locked forever, a failure of the runtime, not of ours. The
  // release build runs this part.
  tw::set_num_threads(1);
  return;
#endif
  // Fork while another thread is in the middle of parallel copies.
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::thread busy([&] {
    while (!stop)
      if (!run_case({"busy-contiguous", {1300000}, {1}, {1}}, DType::float32(), 0, 0)) ++bad;
  });
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(in_forked_child([&] { return bool(run_case(big, DType::float32(), 0, 3)); })) << "fork " << i;
  stop = true;
  busy.join();
  EXPECT_EQ(bad.load(), 0);
  ASSERT_TRUE(run_case(big, DType::float32(), 0, 0));  // and the parent's pool still works
  tw::set_num_threads(1);
#endif
}

// ---- overlapping source and destination ------------------------------------------------------------------------

Tensor arange_f(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.f);
  return Tensor::adopt(std::move(v), {n});
}

std::vector<float> values(const Tensor& t) {
  std::vector<float> out;
  for_each_index(t.shape(), [&](const std::vector<int64_t>& idx) {
    out.push_back(static_cast<const float*>(t.data_ptr())[elem_offset(t.strides(), idx)]);
  });
  return out;
}

std::vector<float> iota(int64_t b, int64_t e) {
  std::vector<float> v;
  for (int64_t i = b; i < e; ++i) v.push_back(static_cast<float>(i));
  return v;
}

TEST(Copy, OverlappingShiftForward) {
  for (int64_t n : {100, 2000003}) {  // the second goes through the thread pool
    tw::set_num_threads(2);
    Tensor t = arange_f(n);
    tw::copy(t.slice(0, 0, n - 10), t.slice(0, 10, n));
    std::vector<float> expect = iota(0, 10);
    auto rest = iota(0, n - 10);
    expect.insert(expect.end(), rest.begin(), rest.end());
    ASSERT_EQ(values(t), expect) << n;
  }
  tw::set_num_threads(1);
}

TEST(Copy, OverlappingShiftBackward) {
  Tensor t = arange_f(100);
  tw::copy(t.slice(0, 7, 100), t.slice(0, 0, 93));
  std::vector<float> expect = iota(7, 100);
  auto tail = iota(93, 100);
  expect.insert(expect.end(), tail.begin(), tail.end());
  EXPECT_EQ(values(t), expect);
}

TEST(Copy, OverlappingInPlaceReverseAndTranspose) {
  Tensor t = arange_f(257);
  tw::copy(t, t.slice(0, std::nullopt, std::nullopt, -1));
  auto expect = iota(0, 257);
  std::reverse(expect.begin(), expect.end());
  EXPECT_EQ(values(t), expect);

  Tensor a = arange_f(33 * 33).view({33, 33});
  tw::copy(a, a.transpose(0, 1));  // a becomes its own transpose
  for (int64_t i = 0; i < 33; ++i)
    for (int64_t j = 0; j < 33; ++j)
      ASSERT_EQ(static_cast<const float*>(a.data_ptr())[i * 33 + j], static_cast<float>(j * 33 + i));
}

TEST(Copy, OverlappingWithByteswap) {
  std::vector<uint32_t> v = {0x01020304, 0x05060708, 0x090A0B0C, 0x0D0E0F10, 0x11121314};
  Tensor t = Tensor::adopt(std::move(v), {5});
  tw::copy(t.slice(0, 0, 4), t.slice(0, 1, 5), tw::CopyOptions{true});
  const auto* p = static_cast<const uint32_t*>(t.data_ptr());
  EXPECT_EQ(p[0], 0x01020304u);
  EXPECT_EQ(p[1], 0x04030201u);
  EXPECT_EQ(p[2], 0x08070605u);
  EXPECT_EQ(p[3], 0x0C0B0A09u);
  EXPECT_EQ(p[4], 0x100F0E0Du);
}

// ---- byteswap --------------------------------------------------------------------------------------------------

template <class T>
std::vector<T> read_all(const Tensor& t) {
  std::vector<T> out;
  for_each_index(t.shape(), [&](const std::vector<int64_t>& idx) {
    T x;
    std::memcpy(&x, static_cast<const char*>(t.data_ptr()) + elem_offset(t.strides(), idx) * int64_t(sizeof(T)),
                sizeof(T));
    out.push_back(x);
  });
  return out;
}

TEST(Copy, ByteswapScalarTypes) {
  {
    std::vector<uint16_t> v = {0x0102, 0xA0B0, 0x00FF};
    Tensor src = Tensor::adopt(std::move(v), {3});
    Tensor dst = Tensor::zeros({3}, DType::uint16());
    tw::copy(src, dst, {true});
    EXPECT_EQ(read_all<uint16_t>(dst), (std::vector<uint16_t>{0x0201, 0xB0A0, 0xFF00}));
  }
  {
    std::vector<uint64_t> v = {0x0102030405060708ull, 0x1122334455667788ull};
    Tensor src = Tensor::adopt(std::move(v), {2});
    Tensor dst = Tensor::zeros({2}, DType::uint64());
    tw::copy(src, dst, {true});
    EXPECT_EQ(read_all<uint64_t>(dst), (std::vector<uint64_t>{0x0807060504030201ull, 0x8877665544332211ull}));
  }
  {
    // A big-endian 1.0 (0x3FF0000000000000) becomes a native 1.0.
    const unsigned char be_one[8] = {0x3F, 0xF0, 0, 0, 0, 0, 0, 0};
    Tensor src = Tensor::from_blob(const_cast<unsigned char*>(be_one), {}, DType::float64(), Device::cpu(), nullptr);
    Tensor dst = Tensor::zeros({}, DType::float64());
    tw::copy(src, dst, {true});
    EXPECT_EQ(*dst.data<double>(), 1.0);
  }
  {
    // One-byte types are unchanged.
    std::vector<uint8_t> v = {1, 2, 3};
    Tensor src = Tensor::adopt(std::move(v), {3});
    Tensor dst = Tensor::zeros({3}, DType::uint8());
    tw::copy(src, dst, {true});
    EXPECT_EQ(read_all<uint8_t>(dst), (std::vector<uint8_t>{1, 2, 3}));
  }
}

TEST(Copy, ByteswapComplexSwapsEachHalfAndVectorsEachLane) {
  // complex64: two float32 halves, each reversed on its own (not the 8 bytes as a whole).
  unsigned char in[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  Tensor src = Tensor::from_blob(in, {1}, DType::complex64(), Device::cpu(), nullptr);
  Tensor dst = Tensor::zeros({1}, DType::complex64());
  tw::copy(src, dst, {true});
  const auto* o = static_cast<const unsigned char*>(dst.data_ptr());
  EXPECT_EQ(std::vector<unsigned char>(o, o + 8), (std::vector<unsigned char>{4, 3, 2, 1, 8, 7, 6, 5}));

  // float16x4: each 2-byte lane reversed.
  unsigned char in2[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  DType h4{static_cast<uint8_t>(kDLFloat), 16, 4};
  Tensor s2 = Tensor::from_blob(in2, {1}, h4, Device::cpu(), nullptr);
  Tensor d2 = Tensor::zeros({1}, h4);
  tw::copy(s2, d2, {true});
  const auto* o2 = static_cast<const unsigned char*>(d2.data_ptr());
  EXPECT_EQ(std::vector<unsigned char>(o2, o2 + 8), (std::vector<unsigned char>{2, 1, 4, 3, 6, 5, 8, 7}));

  // complex128: 8-byte halves.
  unsigned char in3[16];
  std::iota(in3, in3 + 16, static_cast<unsigned char>(0));
  Tensor s3 = Tensor::from_blob(in3, {1}, DType::complex128(), Device::cpu(), nullptr);
  Tensor d3 = Tensor::zeros({1}, DType::complex128());
  tw::copy(s3, d3, {true});
  const auto* o3 = static_cast<const unsigned char*>(d3.data_ptr());
  EXPECT_EQ(std::vector<unsigned char>(o3, o3 + 16),
            (std::vector<unsigned char>{7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8}));
}

TEST(Copy, ByteswapThroughStridedLayoutsLeavesGapsAlone) {
  // The sweep's checker reverses whole elements, which is right for plain scalar types.
  for (DType d : {DType::uint16(), DType::float32(), DType::float64()}) {
    for (const Case& c : {Case{"bswap-transposed", {13, 17}, {1, 13}, {17, 1}},
                          Case{"bswap-every-other-dst", {9, 7}, {7, 1}, {28, 2}},
                          Case{"bswap-reversed-dst", {9, 7}, {7, 1}, {-7, -1}},
                          Case{"bswap-broadcast", {6, 5}, {0, 1}, {1, 6}}, Case{"bswap-scalar", {}, {}, {}},
                          Case{"bswap-3d", {3, 4, 5}, {1, 3, 12}, {20, 5, 1}}}) {
      ASSERT_TRUE(run_case(c, d, 1, 3, {true}));
    }
  }
  tw::set_num_threads(2);
  ASSERT_TRUE(run_case({"bswap-large", {1200, 1000}, {1, 1200}, {1000, 1}}, DType::float32(), 0, 0, {true}));
  tw::set_num_threads(1);
}

// ---- packed sub-byte -------------------------------------------------------------------------------------------

// Element `e` (in elements from the first element, possibly negative) of packed data at `p`, little bit-endian.
unsigned packed_get(const unsigned char* p, int64_t e, unsigned bits) {
  unsigned v = 0;
  for (unsigned b = 0; b < bits; ++b) {
    const int64_t pos = e * int64_t(bits) + int64_t(b);
    const int64_t byte = pos >= 0 ? pos / 8 : -((-pos + 7) / 8);
    const int64_t bit = pos - byte * 8;
    v |= ((unsigned(p[byte]) >> bit) & 1u) << b;
  }
  return v;
}

struct PackedCase {
  std::string name;
  DType dtype;
  Shape shape;
  Strides src;
  Strides dst;
};

testing::AssertionResult run_packed(const PackedCase& c) {
  Placed src = place(c.dtype, c.shape, c.src, 0, Role::source);
  Placed dst = place(c.dtype, c.shape, c.dst, 0, Role::destination);
  const auto src_before = src.snapshot();
  try {
    tw::copy(src.t, dst.t);
  } catch (const std::exception& e) {
    return testing::AssertionFailure() << c.name << ": threw " << e.what();
  }
  const unsigned bits = c.dtype.bits;
  const auto* s0 = static_cast<const unsigned char*>(src.t.data_ptr());
  const auto* d0 = static_cast<const unsigned char*>(dst.t.data_ptr());
  std::vector<bool> is_elem_bit(dst.size() * 8, false);
  std::optional<std::string> bad;
  for_each_index(c.shape, [&](const std::vector<int64_t>& idx) {
    if (bad) return;
    const int64_t de = elem_offset(c.dst, idx), se = elem_offset(c.src, idx);
    for (unsigned b = 0; b < bits; ++b)
      is_elem_bit[static_cast<size_t>((d0 - dst.bytes()) * 8 + de * int64_t(bits) + int64_t(b))] = true;
    if (packed_get(d0, de, bits) != packed_get(s0, se, bits)) {
      std::ostringstream os;
      os << c.name << " " << c.dtype.name() << ": element at dst offset " << de << " is " << packed_get(d0, de, bits)
         << ", expected " << packed_get(s0, se, bits);
      bad = os.str();
    }
  });
  if (bad) return testing::AssertionFailure() << *bad;
  for (size_t i = 0; i < dst.size() * 8; ++i)
    if (!is_elem_bit[i] && ((unsigned(dst.bytes()[i / 8]) >> (i % 8)) & 1u) != ((unsigned(kSentinel) >> (i % 8)) & 1u))
      return testing::AssertionFailure() << c.name << " " << c.dtype.name() << ": bit " << i
                                         << " of the destination (not an element) changed";
  if (src.snapshot() != src_before) return testing::AssertionFailure() << c.name << ": the source was modified";
  return testing::AssertionSuccess();
}

TEST(Copy, PackedSubbyteFromStridedViews) {
  std::vector<PackedCase> cases;
  for (DType d : {DType::int4(), DType::uint4(), DType::float4_e2m1fn(), DType::uint2(), DType::int2(),
                  DType::make(kDLUInt, 1), DType::float6_e2m3fn(), DType::float6_e3m2fn()}) {
    cases.push_back({"contiguous-even", d, {16}, {1}, {1}});
    cases.push_back({"contiguous-odd", d, {5}, {1}, {1}});  // the last byte is shared with the guard
    cases.push_back({"contiguous-2d-odd-rows", d, {3, 5}, {5, 1}, {5, 1}});
    cases.push_back({"every-other-col", d, {6, 4}, {8, 2}, {4, 1}});
    cases.push_back({"every-third", d, {7}, {3}, {1}});
    cases.push_back({"reversed", d, {9}, {-1}, {1}});
    cases.push_back({"reversed-dst", d, {8}, {1}, {-1}});
    cases.push_back({"transposed", d, {6, 4}, {1, 6}, {4, 1}});
    cases.push_back({"transposed-dst", d, {4, 6}, {6, 1}, {1, 4}});
    cases.push_back({"broadcast", d, {3, 5}, {0, 1}, {5, 1}});
    cases.push_back({"strided-dst", d, {5, 3}, {3, 1}, {8, 2}});
    cases.push_back({"scalar", d, {}, {}, {}});
    cases.push_back({"zero-size", d, {0, 3}, {3, 1}, {3, 1}});
  }
  for (const auto& c : cases) ASSERT_TRUE(run_packed(c));
}

TEST(Copy, PackedSubbyteThroughLibraryViews) {
  // int4 values 0..15 in a (4, 8) tensor, then a strided, reversed, transposed view copied out.
  Tensor t = Tensor::zeros({4, 8}, DType::int4());
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  for (int i = 0; i < 32; ++i) p[i / 2] = static_cast<unsigned char>(p[i / 2] | ((i % 16) << (4 * (i % 2))));
  Tensor v = t.slice(1, 0, 8, 2).slice(0, std::nullopt, std::nullopt, -1).transpose(0, 1);  // (4 cols, 4 rows)
  Tensor c = v.contiguous();
  EXPECT_NE(c.data_ptr(), t.data_ptr());
  const auto* q = static_cast<const unsigned char*>(c.data_ptr());
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 4; ++j) {
      const int64_t row = 3 - j, col = 2 * i;
      ASSERT_EQ(packed_get(q, i * 4 + j, 4), unsigned((row * 8 + col) % 16)) << i << "," << j;
    }
}

TEST(Copy, PaddedSubbyteCopiesLikeBytes) {
  auto a = Buffer::allocate(12), b = Buffer::allocate(12);
  auto* pa = static_cast<unsigned char*>(a->base());
  for (int i = 0; i < 12; ++i) pa[i] = static_cast<unsigned char>(i % 16);
  Tensor src = Tensor::make(a, Layout{DType::int4(), {3, 4}, {1, 3}, 0, true});
  Tensor dst = Tensor::make(b, Layout{DType::int4(), {3, 4}, {4, 1}, 0, true});
  tw::copy(src, dst);
  const auto* pb = static_cast<const unsigned char*>(b->base());
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(pb[i * 4 + j], pa[i + 3 * j]);
  // Packed and padded layouts of the same type are not interchangeable.
  Tensor packed = Tensor::zeros({3, 4}, DType::int4());
  TW_EXPECT_ERROR(tw::copy(src, packed), ErrorCode::unsupported);
  TW_EXPECT_ERROR(tw::copy(packed, dst), ErrorCode::unsupported);
  // contiguous() of a padded view stays padded.
  Tensor c = src.contiguous();
  EXPECT_TRUE(c.subbyte_padded());
  const auto* pc = static_cast<const unsigned char*>(c.data_ptr());
  for (int i = 0; i < 12; ++i) EXPECT_EQ(pc[i], pb[i]);
}

TEST(Copy, PackedSubbyteOverlapping) {
  Tensor t = Tensor::zeros({16}, DType::uint4());
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  for (int i = 0; i < 16; ++i) p[i / 2] = static_cast<unsigned char>(p[i / 2] | (i << (4 * (i % 2))));
  tw::copy(t.slice(0, 0, 12), t.slice(0, 4, 16));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(packed_get(p, i, 4), unsigned(i < 4 ? i : i - 4)) << i;
}

// ---- errors ----------------------------------------------------------------------------------------------------

TEST(Copy, Errors) {
  Placed dst = place(DType::float32(), {2, 3}, {3, 1}, 0, Role::destination);
  const auto before = dst.snapshot();
  Tensor f = Tensor::zeros({2, 3}, DType::float32());
  TW_EXPECT_ERROR_MSG(tw::copy(Tensor::zeros({2, 3}, DType::int32()), dst.t), ErrorCode::invalid_argument, "int32");
  TW_EXPECT_ERROR(tw::copy(Tensor::zeros({2, 3}, DType{static_cast<uint8_t>(kDLFloat), 32, 2}), dst.t),
                  ErrorCode::invalid_argument);
  TW_EXPECT_ERROR_MSG(tw::copy(Tensor::zeros({3, 2}, DType::float32()), dst.t), ErrorCode::invalid_argument, "(3, 2)");
  TW_EXPECT_ERROR(tw::copy(Tensor::zeros({6}, DType::float32()), dst.t), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::copy(f, dst.t.as_readonly()), ErrorCode::read_only);
  TW_EXPECT_ERROR(tw::copy(Tensor(), dst.t), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::copy(f, Tensor()), ErrorCode::invalid_argument);
  // Destinations whose elements overlap: broadcast and sliding windows.
  Tensor row = Tensor::zeros({1, 3}, DType::float32());
  TW_EXPECT_ERROR(tw::copy(f, row.expand({2, 3})), ErrorCode::invalid_argument);
  auto buf = Buffer::allocate(64);
  Tensor window = Tensor::make(buf, Layout{DType::float32(), {2, 3}, {1, 1}, 0, false});
  TW_EXPECT_ERROR_MSG(tw::copy(f, window), ErrorCode::invalid_argument, "overlap");
  // Memory the host cannot touch.
  float host[6] = {};
  Tensor gpu = Tensor::from_blob(host, {2, 3}, DType::float32(), Device::cuda(0), nullptr);
  TW_EXPECT_ERROR(tw::copy(gpu, dst.t), ErrorCode::unsupported);
  TW_EXPECT_ERROR(tw::copy(f, gpu), ErrorCode::unsupported);
  EXPECT_EQ(dst.snapshot(), before) << "a refused copy wrote to the destination";
  // A read-only source is fine; so is host-accessible pinned memory.
  Tensor pinned = Tensor::from_blob(host, {2, 3}, DType::float32(), Device::cuda_host(), nullptr);
  EXPECT_NO_THROW(tw::copy(f.as_readonly(), pinned));
}

}  // namespace
