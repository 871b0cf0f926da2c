// fuzz_interface — NumPy / CUDA array-interface and buffer-protocol descriptions: tw::validate_interface.
//
// Properties checked:
//  1. Only tw::Error escapes; no sanitizer report.
//  2. The returned layout is self-consistent: its byte span is the span returned, element 0 sits at -span.begin.
//  3. When the description stated the exporter's buffer honestly (buffer_extent / buffer_before), an accepted span
//     lies inside that buffer.
//  4. When the span fits the harness buffer, Tensor::make accepts the view and a copy (byte-swapped as asked)
//     reproduces every element a naive walk reads; the buffer has the exact size, so ASan sees any overreach.
//
// Input (little-endian, missing bytes read as 0; see fuzz/make_corpus.py):
//   u8 mode   bits 0-1 protocol (0/3 __array_interface__, 1 __cuda_array_interface__, 2 buffer protocol),
//             2 byte_strides present, 3 data = 0, 4 buffer_extent present, 5 has_mask, 6 readonly, 7 wide
//   version: i32 if wide else i8
//   u8 extra  bit 0: a dtype override follows as u8 code, u8 bits, u16 lanes (InterfaceDesc::dtype)
//   u8 typestr length (mod 17) and its bytes;  u8 ndim (mod 72)
//   ndim shape values: i64 if wide else i8
//   if byte_strides: u8 count selector (0: ndim entries, else (sel - 1) mod 72 entries), then the values
//   u16 buffer size (mod 8193), u16 position of `data` in it (mod size + 1)
//   if buffer_extent: u8 honesty (0: extent = size - pos and before = pos; else both off by a value read next,
//                     i64 if wide else i8, extent first)
//   the rest: buffer contents
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "tensorwire/copy.hpp"
#include "tensorwire/interop.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  twfuzz::ByteReader in(data, size);
  const uint8_t mode = in.u8();
  const bool has_strides = mode & 4, data_zero = mode & 8, has_extent = mode & 16, wide = mode & 128;
  static const char* const kProtocols[] = {"__array_interface__", "__cuda_array_interface__", "buffer protocol",
                                           "__array_interface__"};
  tw::InterfaceDesc d;
  d.protocol = kProtocols[mode & 3];
  d.has_mask = mode & 32;
  d.readonly = mode & 64;
  d.version = wide ? in.read<int32_t>() : in.read<int8_t>();
  if (in.u8() & 1) {  // unchecked on purpose: validate_interface must refuse any triple that is not a dtype
    tw::DType dt;
    dt.code = in.u8();
    dt.bits = in.u8();
    dt.lanes = in.read<uint16_t>();
    d.dtype = dt;
  }
  d.typestr = in.str(in.u8() % 17u);
  const size_t nd = in.u8() % 72u;
  d.shape.resize(nd);
  for (auto& s : d.shape) s = in.sval(wide);
  if (has_strides) {
    const uint8_t sel = in.u8();
    std::vector<int64_t> st(sel == 0 ? nd : (sel - 1u) % 72u);
    for (auto& s : st) s = in.sval(wide);
    d.byte_strides = std::move(st);
  }
  const size_t bufsize = in.read<uint16_t>() % 8193u;
  const size_t pos = in.read<uint16_t>() % (bufsize + 1);
  bool honest = false;
  if (has_extent) {
    honest = in.u8() == 0;
    int64_t extent = static_cast<int64_t>(bufsize - pos), before = static_cast<int64_t>(pos);
    if (!honest) {
      // Wrapping adds: the lie may be any int64, and the library must cope with every one.
      extent = static_cast<int64_t>(static_cast<uint64_t>(extent) + static_cast<uint64_t>(in.sval(wide)));
      before = static_cast<int64_t>(static_cast<uint64_t>(before) + static_cast<uint64_t>(in.sval(wide)));
    }
    d.buffer_extent = extent;
    d.buffer_before = before;
  }
  std::unique_ptr<uint8_t[]> buf(new uint8_t[bufsize ? bufsize : 1]);
  in.fill_rest(buf.get(), bufsize);
  d.data = data_zero ? 0 : reinterpret_cast<uintptr_t>(buf.get() + pos);

  tw::InterfaceLayout il;
  try {
    il = tw::validate_interface(d);
  } catch (const tw::Error&) {
    return 0;
  }
  const tw::Layout& l = il.layout;
  const int64_t n = l.numel();
  TW_FUZZ_CHECK(!d.has_mask, "a masked array was accepted");
  if (d.dtype) TW_FUZZ_CHECK(l.dtype == *d.dtype, "the dtype override was not applied");
  TW_FUZZ_CHECK(l.shape.vec() == d.shape, "shape changed: %s", l.shape.str().c_str());
  const tw::ByteSpan sp = l.byte_span();
  TW_FUZZ_CHECK(sp.begin == il.span.begin && sp.end == il.span.end, "span [%lld, %lld) but layout spans [%lld, %lld)",
                static_cast<long long>(il.span.begin), static_cast<long long>(il.span.end),
                static_cast<long long>(sp.begin), static_cast<long long>(sp.end));
  TW_FUZZ_CHECK(l.byte_offset == (n > 0 ? -sp.begin : 0), "byte_offset %lld for span start %lld",
                static_cast<long long>(l.byte_offset), static_cast<long long>(sp.begin));
  if (n == 0) return 0;
  TW_FUZZ_CHECK(d.data != 0, "null data accepted with %lld elements", static_cast<long long>(n));
  const bool fits = __int128(pos) + sp.begin >= 0 && __int128(pos) + sp.end <= __int128(bufsize);
  TW_FUZZ_CHECK(fits || !honest,
                "span [%lld, %lld) around element 0 accepted although the exporter said %lld bytes before and %lld "
                "from it",
                static_cast<long long>(sp.begin), static_cast<long long>(sp.end),
                static_cast<long long>(d.buffer_before), static_cast<long long>(*d.buffer_extent));
  if (!fits) return 0;

  // Build the view over the harness buffer, element 0 at `pos`.
  tw::Layout view = l;
  view.byte_offset = static_cast<int64_t>(pos);
  auto buffer = std::make_shared<tw::Buffer>(buf.get(), bufsize, tw::Device::cpu(), nullptr);
  tw::Tensor t;
  try {
    t = tw::Tensor::make(buffer, view, d.readonly);
  } catch (const tw::Error& e) {
    TW_FUZZ_CHECK(false, "Tensor::make refused a layout validate_interface accepted inside the buffer: %s", e.what());
  }
  if (n > twfuzz::kMaxCheckedElements) return 0;
  const size_t isz = l.dtype.itemsize();
  const size_t unit = l.dtype.code == kDLComplex ? isz / 2 : isz / l.dtype.lanes;
  tw::Tensor c;
  if (il.byteswap) {
    c = tw::Tensor::empty(l.shape, l.dtype);
    tw::copy(t, c, tw::CopyOptions{true});
  } else {
    c = t.contiguous();
  }
  twfuzz::check_gather(l, buf.get() + pos, c, il.byteswap, unit);
  return 0;
}
