// Parsers for NumPy array-interface type strings, PEP 3118 buffer formats and interface descriptions.
// Everything here reads untrusted input: every path ends in a value or an Error, never in undefined behaviour.
#include <bit>
#include <charconv>
#include <string>

#include "core/checked.hpp"
#include "tensorwire/interop.hpp"

namespace tw {
namespace {

constexpr bool kLittle = std::endian::native == std::endian::little;

[[noreturn]] void bad_typestr(std::string_view s, const std::string& why) {
  throw Error(ErrorCode::unsupported, "typestr '" + std::string(s) + "': " + why);
}

}  // namespace

ParsedType parse_typestr(std::string_view s) {
  if (s.size() >= 2 && s[1] == 'O')  // (NumPy's '|O' has no size: before the size check, which named the format)
    bad_typestr(s, "Python object arrays hold references to objects, not numbers; convert them first if they are "
                   "numbers (np.asarray(x, dtype=float))");
  if (s.size() < 3) bad_typestr(s, "expected <byteorder><kind><size>, e.g. '<f4'");
  const char order = s[0], kind = s[1];
  if (order != '<' && order != '>' && order != '|' && order != '=')
    bad_typestr(s, "byte order must be one of '<', '>', '|', '='");
  if (kind == 'M' || kind == 'm')  // (before the size: '<M8[s]' has a unit after it)
    bad_typestr(s, "datetime/timedelta arrays have no tensor dtype; view them as int64 first (a.view('int64'))");
  int size = 0;
  auto digits = s.substr(2);
  auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), size);
  if (ec != std::errc() || p != digits.data() + digits.size() || size <= 0)
    bad_typestr(s, "the size after the kind must be a positive integer");
  DType d;
  switch (kind) {
    case 'b':
      if (size != 1) bad_typestr(s, "bool must have size 1");
      d = DType::boolean();
      break;
    case 'i':
    case 'u':
      if (size != 1 && size != 2 && size != 4 && size != 8) bad_typestr(s, "integer size must be 1, 2, 4 or 8");
      d = DType::make(kind == 'i' ? kDLInt : kDLUInt, size * 8);
      break;
    case 'f':
      if (size != 2 && size != 4 && size != 8) bad_typestr(s, "float size must be 2, 4 or 8 (long double is not portable)");
      d = DType::make(kDLFloat, size * 8);
      break;
    case 'c':
      if (size != 8 && size != 16) bad_typestr(s, "complex size must be 8 or 16");
      d = DType::make(kDLComplex, size * 8);
      break;
    case 'V': bad_typestr(s, "void/record types have no tensor dtype (bfloat16 and float8 arrive this way from "
                             "ml_dtypes: pass the NumPy array itself so its dtype name can be read)");
    case 'S':
    case 'U':
    case 'a': bad_typestr(s, "string arrays have no tensor dtype");
    default: bad_typestr(s, std::string("unknown kind '") + kind + "'");
  }
  ParsedType r{d, static_cast<size_t>(size), false};
  if (size > 1) r.byteswap = (order == '>' && kLittle) || (order == '<' && !kLittle);
  return r;
}

ParsedType parse_buffer_format(std::string_view fmt, int64_t itemsize) {
  auto fail = [&](const std::string& why) -> ParsedType {
    throw Error(ErrorCode::unsupported, "buffer format '" + std::string(fmt) + "': " + why);
  };
  std::string_view f = fmt;
  char order = '@';
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<' || f[0] == '>' || f[0] == '!')) {
    order = f[0];
    f.remove_prefix(1);
  }
  if (!f.empty() && f[0] == '1') f.remove_prefix(1);  // an explicit repeat count of one
  const bool native_sizes = order == '@';
  DType d;
  size_t size = 0;
  if (f == "?") { d = DType::boolean(); size = 1; }
  else if (f == "b") { d = DType::int8(); size = 1; }
  else if (f == "B") { d = DType::uint8(); size = 1; }
  else if (f == "h") { d = DType::int16(); size = 2; }
  else if (f == "H") { d = DType::uint16(); size = 2; }
  else if (f == "i") { d = DType::int32(); size = 4; }
  else if (f == "I") { d = DType::uint32(); size = 4; }
  else if (f == "l" || f == "L") {
    size = native_sizes ? sizeof(long) : 4;
    d = DType::make(f == "l" ? kDLInt : kDLUInt, static_cast<int>(size * 8));
  } else if (f == "q") { d = DType::int64(); size = 8; }
  else if (f == "Q") { d = DType::uint64(); size = 8; }
  else if (f == "n" || f == "N") {
    if (!native_sizes) return fail("'n'/'N' exist only with native sizes ('@')");
    size = sizeof(size_t);
    d = DType::make(f == "n" ? kDLInt : kDLUInt, static_cast<int>(size * 8));
  } else if (f == "e") { d = DType::float16(); size = 2; }
  else if (f == "f") { d = DType::float32(); size = 4; }
  else if (f == "d") { d = DType::float64(); size = 8; }
  else if (f == "Zf") { d = DType::complex64(); size = 8; }
  else if (f == "Zd") { d = DType::complex128(); size = 16; }
  else if (f.empty()) return fail("empty format");
  else if (f.find('T') != std::string_view::npos || f.find('{') != std::string_view::npos) return fail("structured formats have no tensor dtype");
  else if (f == "g" || f == "Zg") return fail("long double is not portable");
  else if (f == "P") return fail("pointers are not numbers");
  else if (f == "c" || f.find('s') != std::string_view::npos || f.find('p') != std::string_view::npos) return fail("character/string formats have no tensor dtype");
  else return fail("not a single numeric item (supported: ? b B h H i I l L q Q n N e f d Zf Zd with an optional <, >, =, ! or @)");
  if (itemsize != static_cast<int64_t>(size))
    return fail("the exporter reports itemsize " + std::to_string(itemsize) + " but the format describes " +
                std::to_string(size) + "-byte items");
  ParsedType r{d, size, false};
  if (size > 1) r.byteswap = ((order == '>' || order == '!') && kLittle) || (order == '<' && !kLittle);
  return r;
}

InterfaceLayout validate_interface(const InterfaceDesc& desc) {
  const std::string& proto = desc.protocol;
  auto fail = [&](ErrorCode code, const std::string& why) -> InterfaceLayout { throw Error(code, proto + ": " + why); };
  const bool cai = proto == "__cuda_array_interface__";
  if (cai ? (desc.version < 2 || desc.version > 3) : desc.version != 3)
    return fail(ErrorCode::version_mismatch, "version " + std::to_string(desc.version) + " is not supported (" +
                                                 (cai ? std::string("2 and 3 are") : std::string("3 is")) + ")");
  if (desc.has_mask)
    return fail(ErrorCode::unsupported, "a mask is present; masked arrays cannot be imported (fill or compress them first)");
  ParsedType pt;
  if (desc.dtype) {
    DType::from_dlpack(desc.dtype->to_dlpack());  // a triple that is no dtype (itemsize 0...) is refused here
    int size = 0;
    std::string_view ts = desc.typestr;
    auto [p, ec] = ts.size() > 2 ? std::from_chars(ts.data() + 2, ts.data() + ts.size(), size)
                                 : std::from_chars_result{ts.data(), std::errc::invalid_argument};
    const char order = ts.empty() ? '\0' : ts[0];
    if (ec != std::errc() || p != ts.data() + ts.size() || static_cast<size_t>(size) != desc.dtype->itemsize() ||
        (order != '<' && order != '>' && order != '|' && order != '='))
      return fail(ErrorCode::invalid_argument, "typestr '" + desc.typestr + "' does not describe " +
                                                   std::to_string(desc.dtype->itemsize()) + "-byte " +
                                                   desc.dtype->name() + " items");
    // The typestr still carries the byte order: a byte-swapped bfloat16 array says '>V2'.
    const bool swap = size > 1 && ((order == '>' && kLittle) || (order == '<' && !kLittle));
    pt = ParsedType{*desc.dtype, desc.dtype->itemsize(), swap};
  } else {
    pt = parse_typestr(desc.typestr);
  }
  if (desc.shape.size() > kMaxRank)
    return fail(ErrorCode::invalid_argument, "rank " + std::to_string(desc.shape.size()) + " exceeds " + std::to_string(kMaxRank));
  InterfaceLayout out;
  out.byteswap = pt.byteswap;
  Layout& l = out.layout;
  l.dtype = pt.dtype;
  l.subbyte_padded = pt.dtype.is_subbyte();  // interface arrays never pack: one element per item
  l.shape = Shape(desc.shape);
  for (size_t i = 0; i < desc.shape.size(); ++i)
    if (desc.shape[i] < 0)
      return fail(ErrorCode::invalid_argument, "shape " + l.shape.str() + " has a negative size in dimension " + std::to_string(i));
  const int64_t isz = static_cast<int64_t>(pt.itemsize);
  if (desc.byte_strides) {
    const auto& bs = *desc.byte_strides;
    if (bs.size() != desc.shape.size())
      return fail(ErrorCode::invalid_argument, "strides has " + std::to_string(bs.size()) + " entries for " +
                                                   std::to_string(desc.shape.size()) + " dimensions");
    Strides st;
    for (size_t i = 0; i < bs.size(); ++i) {
      if (bs[i] % isz != 0) {
        if (desc.shape[i] <= 1) {  // a stride never used to step may be anything
          st.push_back(0);
          continue;
        }
        return fail(ErrorCode::unsupported, "byte stride " + std::to_string(bs[i]) + " in dimension " +
                                                std::to_string(i) + " is not a multiple of the item size " +
                                                std::to_string(isz) + "; make the array contiguous first");
      }
      st.push_back(bs[i] / isz);
    }
    l.strides = st;
  } else {
    l.strides = Layout::contiguous_strides(l.shape);
  }
  l.validate();
  const int64_t n = l.numel();
  if (n > 0 && desc.data == 0)
    return fail(ErrorCode::invalid_argument, "data pointer is 0 but shape " + l.shape.str() + " has elements");
  out.span = l.byte_span();
  if (n > 0 && desc.buffer_extent) {
    if (out.span.end > *desc.buffer_extent || -out.span.begin > desc.buffer_before)
      return fail(ErrorCode::out_of_range,
                  "shape " + l.shape.str() + " with strides " + l.strides.str() + " spans bytes [" +
                      std::to_string(out.span.begin) + ", " + std::to_string(out.span.end) +
                      ") around the first element, but the exporter's buffer only has " +
                      std::to_string(desc.buffer_before) + " bytes before and " +
                      std::to_string(*desc.buffer_extent) + " from it");
  }
  if (n > 0) {
    const auto lo = static_cast<__int128>(desc.data) + out.span.begin;
    const auto hi = static_cast<__int128>(desc.data) + out.span.end;
    if (lo < 0 || hi > static_cast<__int128>(UINTPTR_MAX))
      return fail(ErrorCode::out_of_range, "the elements would lie outside the address space");
  }
  l.byte_offset = n > 0 ? -out.span.begin : 0;
  return out;
}

std::string typestr_of(DType d) {
  if (d.lanes != 1) return "";
  const char order = kLittle ? '<' : '>';
  auto sized = [&](char kind) {
    return std::string(1, d.bits == 8 ? '|' : order).append(1, kind).append(std::to_string(d.bits / 8));
  };
  switch (d.code) {
    case kDLBool: return "|b1";
    case kDLInt: return d.bits >= 8 ? sized('i') : "";
    case kDLUInt: return d.bits >= 8 ? sized('u') : "";
    case kDLFloat: return sized('f');
    case kDLComplex: return d.bits >= 64 ? sized('c') : "";
    default: return "";
  }
}

const char* buffer_format_of(DType d) noexcept {
  if (d.lanes != 1) return nullptr;
  if (d == DType::boolean()) return "?";
  if (d == DType::int8()) return "b";
  if (d == DType::uint8()) return "B";
  if (d == DType::int16()) return "h";
  if (d == DType::uint16()) return "H";
  if (d == DType::int32()) return "i";
  if (d == DType::uint32()) return "I";
  if (d == DType::int64()) return "q";
  if (d == DType::uint64()) return "Q";
  if (d == DType::float16()) return "e";
  if (d == DType::float32()) return "f";
  if (d == DType::float64()) return "d";
  if (d == DType::complex64()) return "Zf";
  if (d == DType::complex128()) return "Zd";
  return nullptr;
}

}  // namespace tw
