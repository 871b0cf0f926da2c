// Layout predicates (contiguity, density, broadcast, overlap), byte spans and validate(): the algebra every view,
// copy and import relies on.
#include <cstdint>
#include <limits>
#include <vector>

#include "tw_test_util.hpp"

namespace {

using tw::DType;
using tw::ErrorCode;
using tw::Layout;
using tw::MemoryOrder;

Layout L(DType d, tw::Shape shape, tw::Strides strides, int64_t byte_offset = 0, bool padded = false) {
  return Layout{d, std::move(shape), std::move(strides), byte_offset, padded};
}

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(Dims, BracedListsOfAnyIntegerTypeCompile) {
  size_t n = 5;
  int m = 3;
  uint32_t k = 2;
  tw::Shape a = {n};
  tw::Shape b = {n, m, k};
  tw::Shape c{2, n};
  tw::Shape d = {0, n};  // a literal 0 first must still mean a size, not a null pointer
  EXPECT_EQ(a.vec(), (std::vector<int64_t>{5}));
  EXPECT_EQ(b.vec(), (std::vector<int64_t>{5, 3, 2}));
  EXPECT_EQ(c.vec(), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(d.vec(), (std::vector<int64_t>{0, 5}));
  tw::Shape e = {};
  EXPECT_TRUE(e.empty());
  EXPECT_EQ(b.str(), "(5, 3, 2)");
  EXPECT_EQ(a.str(), "(5,)");
  EXPECT_EQ(e.str(), "()");
}

TEST(Dims, ValueSemanticsForInlineAndHeapStorage) {
  for (size_t n : {size_t{0}, size_t{3}, size_t{6}, size_t{7}, size_t{64}}) {
    SCOPED_TRACE(n);
    std::vector<int64_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = int64_t(i * 7 + 1);
    tw::Dims a(v);
    EXPECT_EQ(a.size(), n);
    EXPECT_EQ(a.vec(), v);
    tw::Dims b = a;  // copy: independent
    if (n) b[0] = -1;
    EXPECT_EQ(a.vec(), v);
    tw::Dims c = std::move(b);  // move: takes the values
    EXPECT_EQ(c.size(), n);
    if (n) {
      EXPECT_EQ(c[0], -1);
    }
    tw::Dims d;
    d = c;
    EXPECT_EQ(d, c);
    d = d;  // self-assignment keeps the values
    EXPECT_EQ(d, c);
    tw::Dims e{1, 2};
    e = std::move(d);
    EXPECT_EQ(e, c);
    e.push_back(99);
    EXPECT_EQ(e.size(), n + 1);
    EXPECT_EQ(e[n], 99);
    EXPECT_EQ(c.size(), n);
    e.resize(2, 5);
    EXPECT_EQ(e.size(), 2u);
    tw::Dims grow;
    for (size_t i = 0; i < n; ++i) grow.push_back(v[i]);
    EXPECT_EQ(grow, a);
    EXPECT_EQ(std::vector<int64_t>(a.begin(), a.end()), v);
    EXPECT_EQ(tw::Dims(a.data(), a.size()), a);
  }
  EXPECT_NE((tw::Dims{1, 2}), (tw::Dims{1, 2, 3}));
  EXPECT_NE((tw::Dims{1, 2}), (tw::Dims{1, 3}));
}

TEST(Layout, ContiguousStrides) {
  EXPECT_EQ(Layout::contiguous_strides({2, 3, 4}).vec(), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(Layout::contiguous_strides({2, 3, 4}, MemoryOrder::F).vec(), (std::vector<int64_t>{1, 2, 6}));
  // Zero-size dimensions do not zero the other strides.
  EXPECT_EQ(Layout::contiguous_strides({2, 0, 4}).vec(), (std::vector<int64_t>{4, 4, 1}));
  EXPECT_TRUE(Layout::contiguous_strides({}).empty());
  TW_EXPECT_ERROR(Layout::contiguous_strides({kMax, kMax, 2}), ErrorCode::overflow);
}

TEST(Layout, NumelAndNbytes) {
  EXPECT_EQ(L(DType::float32(), {2, 3}, {3, 1}).numel(), 6);
  EXPECT_EQ(L(DType::float32(), {2, 3}, {3, 1}).nbytes(), 24);
  EXPECT_EQ(L(DType::float32(), {}, {}).numel(), 1);  // a scalar
  EXPECT_EQ(L(DType::float32(), {4, 0}, {1, 1}).numel(), 0);
  // Packed sub-byte: ceil(numel * bits / 8).
  EXPECT_EQ(L(DType::int4(), {5}, {1}).nbytes(), 3);
  EXPECT_EQ(L(DType::int4(), {5}, {1}).storage_bits(), 4u);
  EXPECT_EQ(L(DType::float6_e2m3fn(), {4}, {1}).nbytes(), 3);
  EXPECT_EQ(L(DType::int2(), {5}, {1}).nbytes(), 2);
  // Padded sub-byte: one byte per element.
  Layout padded = L(DType::int4(), {5}, {1}, 0, true);
  EXPECT_FALSE(padded.is_packed_subbyte());
  EXPECT_EQ(padded.nbytes(), 5);
  EXPECT_EQ(padded.element_bytes(), 1u);
  EXPECT_EQ(padded.storage_bits(), 8u);
  EXPECT_EQ(L(DType::complex128(), {3}, {1}).element_bytes(), 16u);
}

TEST(Layout, IsContiguousCAndF) {
  Layout c = L(DType::float32(), {2, 3, 4}, {12, 4, 1});
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_TRUE(c.is_contiguous(MemoryOrder::C));
  EXPECT_FALSE(c.is_contiguous(MemoryOrder::F));
  EXPECT_TRUE(c.is_contiguous(MemoryOrder::Any));

  Layout f = L(DType::float32(), {2, 3, 4}, {1, 2, 6});
  EXPECT_FALSE(f.is_contiguous(MemoryOrder::C));
  EXPECT_TRUE(f.is_contiguous(MemoryOrder::F));
  EXPECT_TRUE(f.is_contiguous(MemoryOrder::Any));

  // A permutation that is neither C nor F but still dense.
  Layout p = L(DType::float32(), {2, 3, 4}, {4, 8, 1});
  EXPECT_FALSE(p.is_contiguous(MemoryOrder::C));
  EXPECT_FALSE(p.is_contiguous(MemoryOrder::F));
  EXPECT_TRUE(p.is_contiguous(MemoryOrder::Any));

  // Gaps: every other row.
  Layout g = L(DType::float32(), {2, 3}, {6, 1});
  EXPECT_FALSE(g.is_contiguous(MemoryOrder::C));
  EXPECT_FALSE(g.is_contiguous(MemoryOrder::Any));

  // Size-1 dimensions may have any stride.
  Layout ones = L(DType::float32(), {1, 3, 1}, {999, 1, -7});
  EXPECT_TRUE(ones.is_contiguous(MemoryOrder::C));
  EXPECT_TRUE(ones.is_contiguous(MemoryOrder::F));
  // Zero-size tensors are contiguous whatever their strides.
  EXPECT_TRUE(L(DType::float32(), {0, 3}, {5, 77}).is_contiguous(MemoryOrder::C));
  EXPECT_TRUE(L(DType::float32(), {0, 3}, {5, 77}).is_contiguous(MemoryOrder::F));
  // Scalars.
  EXPECT_TRUE(L(DType::float32(), {}, {}).is_contiguous(MemoryOrder::C));
  // A 1-D tensor with stride 2 is not contiguous in any order, nor is a reversed one.
  EXPECT_FALSE(L(DType::float32(), {4}, {2}).is_contiguous(MemoryOrder::Any));
  EXPECT_FALSE(L(DType::float32(), {4}, {-1}).is_contiguous(MemoryOrder::C));
}

TEST(Layout, IsDense) {
  EXPECT_TRUE(L(DType::uint8(), {3, 4}, {1, 3}).is_dense());
  EXPECT_TRUE(L(DType::uint8(), {3, 1, 4}, {1, 100, 3}).is_dense());
  EXPECT_FALSE(L(DType::uint8(), {3, 4}, {1, 4}).is_dense());   // a gap
  EXPECT_FALSE(L(DType::uint8(), {3, 4}, {0, 1}).is_dense());   // broadcast
  EXPECT_FALSE(L(DType::uint8(), {3, 4}, {1, 2}).is_dense());   // overlap
  EXPECT_FALSE(L(DType::uint8(), {3, 4}, {-4, 1}).is_dense());  // negative strides are not treated as dense
  EXPECT_TRUE(L(DType::uint8(), {0, 4}, {0, 0}).is_dense());
}

TEST(Layout, HasBroadcast) {
  EXPECT_TRUE(L(DType::float32(), {3, 4}, {0, 1}).has_broadcast());
  EXPECT_TRUE(L(DType::float32(), {3, 4}, {1, 0}).has_broadcast());
  EXPECT_FALSE(L(DType::float32(), {1, 4}, {0, 1}).has_broadcast());  // size-1 dims with stride 0 broadcast nothing
  EXPECT_FALSE(L(DType::float32(), {3, 4}, {4, 1}).has_broadcast());
  EXPECT_FALSE(L(DType::float32(), {}, {}).has_broadcast());
}

TEST(Layout, MayOverlap) {
  EXPECT_FALSE(L(DType::float32(), {3, 4}, {4, 1}).may_overlap());
  EXPECT_FALSE(L(DType::float32(), {3, 4}, {1, 3}).may_overlap());
  EXPECT_FALSE(L(DType::float32(), {3, 4}, {-4, -1}).may_overlap());
  EXPECT_FALSE(L(DType::float32(), {3, 4}, {8, 2}).may_overlap());   // gaps, no overlap
  EXPECT_FALSE(L(DType::float32(), {2, 3}, {2, 3}).may_overlap());   // interleaved, distinct offsets 0,2,3,5,6,8
  EXPECT_TRUE(L(DType::float32(), {3, 4}, {0, 1}).may_overlap());    // broadcast
  EXPECT_TRUE(L(DType::float32(), {3, 4}, {1, 1}).may_overlap());    // sliding window
  EXPECT_TRUE(L(DType::float32(), {3, 4}, {2, 1}).may_overlap());
  EXPECT_TRUE(L(DType::float32(), {3, 4}, {-1, 1}).may_overlap());
  EXPECT_FALSE(L(DType::float32(), {1, 4}, {0, 1}).may_overlap());   // size-1 dims never step
  EXPECT_FALSE(L(DType::float32(), {1}, {0}).may_overlap());
  EXPECT_FALSE(L(DType::float32(), {0, 5}, {0, 0}).may_overlap());
  // Huge strides are compared without wrapping.
  EXPECT_FALSE(L(DType::uint8(), {2, 2}, {1, kMax}).may_overlap());
  EXPECT_TRUE(L(DType::uint8(), {3, 2}, {kMax / 2, kMax - 1}).may_overlap());  // 2 * (kMax/2) == kMax - 1
}

TEST(Layout, ByteSpanPositiveStrides) {
  auto sp = L(DType::float32(), {3, 4}, {4, 1}).byte_span();
  EXPECT_EQ(sp.begin, 0);
  EXPECT_EQ(sp.end, 48);
  EXPECT_EQ(sp.size(), 48);
  sp = L(DType::float64(), {3, 4}, {10, 2}).byte_span();  // last element at 2*10 + 3*2 = 26 -> end (26+1)*8
  EXPECT_EQ(sp.begin, 0);
  EXPECT_EQ(sp.end, 216);
  sp = L(DType::float32(), {}, {}).byte_span();
  EXPECT_EQ(sp.begin, 0);
  EXPECT_EQ(sp.end, 4);
}

TEST(Layout, ByteSpanNegativeStrides) {
  // Rows reversed: element 0 is the start of the last row in memory.
  auto sp = L(DType::float32(), {3, 4}, {-4, 1}).byte_span();
  EXPECT_EQ(sp.begin, -32);
  EXPECT_EQ(sp.end, 16);
  // Fully reversed.
  sp = L(DType::int16(), {5}, {-1}).byte_span();
  EXPECT_EQ(sp.begin, -8);
  EXPECT_EQ(sp.end, 2);
  // Mixed signs and gaps.
  sp = L(DType::float64(), {2, 3}, {-10, 3}).byte_span();  // offsets from -10 to 6
  EXPECT_EQ(sp.begin, -80);
  EXPECT_EQ(sp.end, 56);
  // Broadcast dims add nothing.
  sp = L(DType::float32(), {7, 2}, {0, -1}).byte_span();
  EXPECT_EQ(sp.begin, -4);
  EXPECT_EQ(sp.end, 4);
}

TEST(Layout, ByteSpanZeroSizeIsEmpty) {
  auto sp = L(DType::float32(), {3, 0}, {-100, 1}).byte_span();
  EXPECT_EQ(sp.begin, 0);
  EXPECT_EQ(sp.end, 0);
}

TEST(Layout, ByteSpanPackedSubbyte) {
  // 5 int4 elements: 20 bits -> 3 bytes.
  auto sp = L(DType::int4(), {5}, {1}).byte_span();
  EXPECT_EQ(sp.begin, 0);
  EXPECT_EQ(sp.end, 3);
  // Reversed, 5 elements: offsets -4..0 -> bits [-16, 4) -> bytes [-2, 1).
  sp = L(DType::int4(), {5}, {-1}).byte_span();
  EXPECT_EQ(sp.begin, -2);
  EXPECT_EQ(sp.end, 1);
  // Reversed, 4 elements: bits [-12, 4) -> bytes [-2, 1) (the partial byte below is included).
  sp = L(DType::int4(), {4}, {-1}).byte_span();
  EXPECT_EQ(sp.begin, -2);
  EXPECT_EQ(sp.end, 1);
  // float6: 3 elements with stride 2 -> offsets 0..4 -> bits [0, 30) -> 4 bytes.
  sp = L(DType::float6_e3m2fn(), {3}, {2}).byte_span();
  EXPECT_EQ(sp.begin, 0);
  EXPECT_EQ(sp.end, 4);
  // Padded: a byte each.
  sp = L(DType::int4(), {5}, {-1}, 0, true).byte_span();
  EXPECT_EQ(sp.begin, -4);
  EXPECT_EQ(sp.end, 1);
}

TEST(Layout, ValidateAcceptsSoundLayouts) {
  EXPECT_NO_THROW(L(DType::float32(), {2, 3}, {3, 1}).validate());
  EXPECT_NO_THROW(L(DType::float32(), {2, 3}, {-3, -1}, 100).validate());
  EXPECT_NO_THROW(L(DType::float32(), {}, {}).validate());
  EXPECT_NO_THROW(L(DType::float32(), {0, 5}, {kMax, kMax}).validate());  // zero-size: strides never used
  EXPECT_NO_THROW(L(DType::int4(), {3}, {1}, 0, true).validate());
  std::vector<int64_t> sh(64, 1), st(64, 1);
  EXPECT_NO_THROW(L(DType::uint8(), sh, st).validate());
}

TEST(Layout, ValidateRefusesNegativeShape) {
  TW_EXPECT_ERROR_MSG(L(DType::float32(), {2, -1}, {1, 1}).validate(), ErrorCode::invalid_argument, "negative");
  TW_EXPECT_ERROR(L(DType::float32(), {-5}, {1}).validate(), ErrorCode::invalid_argument);
  // Even when another dimension is zero.
  TW_EXPECT_ERROR(L(DType::float32(), {0, -1}, {1, 1}).validate(), ErrorCode::invalid_argument);
}

TEST(Layout, ValidateRefusesOverflow) {
  // The element count alone overflows.
  TW_EXPECT_ERROR(L(DType::float32(), {int64_t(1) << 40, int64_t(1) << 40}, {int64_t(1) << 40, 1}).validate(),
                  ErrorCode::overflow);
  // shape * stride overflows.
  TW_EXPECT_ERROR(L(DType::float32(), {3}, {kMax / 2 + 1}).validate(), ErrorCode::overflow);
  TW_EXPECT_ERROR(L(DType::float32(), {3}, {-(kMax / 2 + 1)}).validate(), ErrorCode::overflow);
  // The highest offset fits in elements but not in bytes.
  TW_EXPECT_ERROR(L(DType::float64(), {2}, {kMax / 4}).validate(), ErrorCode::overflow);
  // Sum of extents overflows.
  TW_EXPECT_ERROR(L(DType::uint8(), {2, 2}, {kMax - 1, kMax - 1}).validate(), ErrorCode::overflow);
  // Offset plus span overflows.
  TW_EXPECT_ERROR(L(DType::uint8(), {2}, {kMax / 16}, kMax - 10).validate(), ErrorCode::overflow);
  TW_EXPECT_ERROR(L(DType::float32(), {2}, {1}, kMax - 2).validate(), ErrorCode::overflow);
}

TEST(Layout, ValidateRefusesMalformedLayouts) {
  TW_EXPECT_ERROR(L(DType::float32(), {2, 3}, {1}).validate(), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(L(DType::float32(), {2}, {1}, -1).validate(), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(L(DType::float32(), {2}, {1}, 0, true).validate(), ErrorCode::invalid_argument);  // padded non-subbyte
  std::vector<int64_t> sh(65, 1), st(65, 1);
  TW_EXPECT_ERROR_MSG(L(DType::uint8(), sh, st).validate(), ErrorCode::invalid_argument, "65");
  TW_EXPECT_ERROR(L(DType{static_cast<uint8_t>(kDLFloat), 8, 1}, {2}, {1}).validate(), ErrorCode::unsupported);
  TW_EXPECT_ERROR(L(DType{static_cast<uint8_t>(kDLFloat), 32, 0}, {2}, {1}).validate(), ErrorCode::unsupported);
}

}  // namespace

// validate() accepts a packed sub-byte span whose end in bits lies within 7 of INT64_MAX: rounding it up to bytes
// must not overflow (UBSan caught hi_bits + 7 here).
TEST(Layout, PackedSubByteSpanNearTheLimitRoundsWithoutOverflow) {
  const int64_t stride = INT64_MAX / 4 - 1;  // (stride + 1) * 4 bits is within 7 of INT64_MAX
  tw::Layout l{tw::DType::int4(), tw::Shape{2}, tw::Strides{stride}, 0, false};
  ASSERT_NO_THROW(l.validate());
  const tw::ByteSpan sp = l.byte_span();
  const int64_t hi_bits = (stride + 1) * 4;
  EXPECT_EQ(sp.begin, 0);
  EXPECT_EQ(sp.end, hi_bits / 8 + (hi_bits % 8 ? 1 : 0));
}
