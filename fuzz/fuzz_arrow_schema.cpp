// fuzz_arrow_schema — the Arrow schema reader: tw::parse_arrow_schema (format strings, children, dictionaries, the
// metadata framing, the canonical extensions' JSON, tensorwire's metadata) and tw::decode_arrow_metadata, on hostile
// input.
//
// Properties checked:
//  1. Only tw::Error escapes; no sanitizer report, no unbounded recursion or allocation.
//  2. Metadata framing round trip: encode_arrow_metadata(decode_arrow_metadata(b)) == b (the framing is canonical).
//  3. A parsed type is self-consistent: parameters have one entry per dimension, the permutation is one, and a
//     fixed-shape type's shape holds the list size.
//  4. Export agrees with import: a tensor laid out as a parsed fixed-shape type (physical shape, permutation) exports
//     to a schema that parses back to the same logical shape, dtype, dim names and metadata (and, when no dimension
//     has size 1, which makes the permutation ambiguous, to the same physical shape and permutation).
//
// Input: byte 0 selects the mode (mod 3).
//  0  metadata framing: the rest of the input is given to decode_arrow_metadata.
//  1  schema tree: nodes read depth first. A node is: u8 format selector (< kFormats: that format; else u8 length
//     % 24 and the raw bytes), u8 name length % 8 and bytes, u8 flags, u8 metadata pair count % 5 and per pair
//     (u8 key selector % 4 -> extension name / extension metadata / tensorwire.metadata / "other"; u8 value selector
//     (< kValues: that value; else u16 length % 512 and raw bytes)), u8 child count % 4, u8 dictionary flag (bit 0).
//     Depth is capped at 4 and the tree at 64 nodes (the caps stop reading, they do not fail).
//  2  extension JSON: u16 list size, then the JSON text of an arrow.fixed_shape_tensor over float32 values.
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.hpp"
#include "tensorwire/arrow.hpp"

namespace {

constexpr const char* kFormats[] = {"c",    "C",   "s",   "S",    "i",    "I",    "l",   "L",   "e",
                                    "f",    "g",   "b",   "+w:4", "+w:6", "+w:0", "+w:2", "+w:1", "+w:24",
                                    "+s",   "+l",  "+L",  "u",    "n",    "tdD",  "+w:3", "+w:12"};
constexpr size_t kNumFormats = sizeof(kFormats) / sizeof(kFormats[0]);

const std::string kValues[] = {
    "arrow.fixed_shape_tensor",
    "arrow.variable_shape_tensor",
    "arrow.bool8",
    "",
    "{}",
    R"({"shape":[2,3]})",
    R"({"shape":[2,2],"permutation":[1,0],"dim_names":["a","b"]})",
    R"({"uniform_shape":[null,3]})",
    R"({"shape":[4],"dim_names":["x"]})",
    R"({"shape":[3,4,2],"permutation":[2,0,1]})",
    std::string("TWMD\x01\x09\x00\x00\x00\x00", 10),
};
constexpr size_t kNumValues = sizeof(kValues) / sizeof(kValues[0]);
const char* kKeys[] = {"ARROW:extension:name", "ARROW:extension:metadata", "tensorwire.metadata", "other"};

void noop_release(ArrowSchema* s) { s->release = nullptr; }

struct Node {
  std::string format, name, metadata;
  std::vector<ArrowSchema*> children;
  ArrowSchema schema{};
};

class TreeBuilder {
 public:
  explicit TreeBuilder(twfuzz::ByteReader& r) : r_(r) {}

  ArrowSchema* node(int depth) {
    nodes_.emplace_back();
    Node& n = nodes_.back();
    const uint8_t fsel = r_.u8();
    if (fsel < kNumFormats) n.format = kFormats[fsel];
    else n.format = r_.str(r_.u8() % 24);
    n.name = r_.str(r_.u8() % 8);
    const uint8_t flags = r_.u8();
    std::vector<std::pair<std::string, std::string>> md;
    const int pairs = r_.u8() % 5;
    for (int i = 0; i < pairs; ++i) {
      std::string key = kKeys[r_.u8() % 4];
      const uint8_t vsel = r_.u8();
      std::string value = vsel < kNumValues ? kValues[vsel] : r_.str(r_.read<uint16_t>() % 512);
      md.emplace_back(std::move(key), std::move(value));
    }
    if (!md.empty()) n.metadata = tw::encode_arrow_metadata(md);
    const int kids = r_.u8() % 4;
    const bool dictionary = r_.u8() & 1;
    for (int i = 0; i < kids && depth < 4 && nodes_.size() < 64; ++i) n.children.push_back(node(depth + 1));
    ArrowSchema* dict = nullptr;
    if (dictionary && depth < 4 && nodes_.size() < 64) dict = node(depth + 1);
    ArrowSchema& s = n.schema;
    s.format = n.format.c_str();
    s.name = n.name.c_str();
    s.metadata = n.metadata.empty() ? nullptr : n.metadata.data();
    s.flags = flags;
    s.n_children = static_cast<int64_t>(n.children.size());
    s.children = n.children.empty() ? nullptr : n.children.data();
    s.dictionary = dict;
    s.release = noop_release;
    return &s;
  }

 private:
  twfuzz::ByteReader& r_;
  std::deque<Node> nodes_;  // stable addresses
};

// Property 3.
void check_consistent(const tw::ArrowTensorType& t) {
  using K = tw::ArrowTensorType::Kind;
  const size_t nd = static_cast<size_t>(t.ndim);
  if (t.kind == K::fixed_shape) {
    TW_FUZZ_CHECK(t.shape.size() == nd, "shape has %zu entries for ndim %zu", t.shape.size(), nd);
    TW_FUZZ_CHECK(t.logical_shape().size() == nd, "logical shape has the wrong rank");
  }
  if (t.kind == K::fixed_shape || t.kind == K::variable_shape) {
    TW_FUZZ_CHECK(t.permutation.empty() || t.permutation.size() == nd, "permutation of %zu for ndim %zu",
                  t.permutation.size(), nd);
    std::vector<bool> seen(t.permutation.size(), false);
    for (int64_t p : t.permutation) {
      TW_FUZZ_CHECK(p >= 0 && static_cast<size_t>(p) < nd && !seen[size_t(p)], "not a permutation");
      seen[size_t(p)] = true;
    }
    TW_FUZZ_CHECK(t.dim_names.empty() || t.dim_names.size() == nd, "dim_names of %zu for ndim %zu",
                  t.dim_names.size(), nd);
    TW_FUZZ_CHECK(t.logical_dim_names().size() == t.dim_names.size(), "logical dim names lost entries");
  }
  if (t.kind == K::variable_shape)
    TW_FUZZ_CHECK(t.uniform_shape.empty() || t.uniform_shape.size() == nd, "uniform_shape of %zu for ndim %zu",
                  t.uniform_shape.size(), nd);
  for (const auto& c : t.columns) check_consistent(c);
}

// Property 4.
void check_reexport(const tw::ArrowTensorType& t) {
  if (t.kind != tw::ArrowTensorType::Kind::fixed_shape || t.bit_packed || t.ndim == 0) return;
  int64_t row = 1;
  bool ambiguous = false;  // a size-1 or empty dimension lets several physical orders describe the same tensor
  for (int64_t d : t.shape) {
    if (d > 4096 || row * d > 4096) return;  // keep the tensor small
    row *= d;
    ambiguous = ambiguous || d <= 1;
  }
  std::vector<int64_t> phys{2};
  phys.insert(phys.end(), t.shape.begin(), t.shape.end());
  tw::Tensor x = tw::Tensor::zeros(tw::Shape(phys), t.dtype);
  if (!t.permutation.empty()) {
    std::vector<int64_t> dims{0};
    for (int64_t p : t.permutation) dims.push_back(p + 1);
    x = x.permute(tw::Dims(dims));
  }
  if (t.metadata) x.metadata() = *t.metadata;
  tw::ArrowExportOptions o;
  o.copy = false;
  o.dim_names = t.logical_dim_names();
  ArrowSchema s;
  try {
    tw::ArrowTensorArray::from_tensor(x, o).export_schema(&s);
  } catch (const tw::Error& e) {
    // Names that are not UTF-8 cannot be written as JSON strings; everything else must export without a copy.
    TW_FUZZ_CHECK(e.code() == tw::ErrorCode::invalid_argument && std::string(e.what()).find("UTF-8") != std::string::npos,
                  "a parsed fixed-shape type does not export: %s", e.what());
    return;
  }
  tw::ArrowTensorType back;
  try {
    back = tw::parse_arrow_schema(s);
  } catch (const tw::Error& e) {
    s.release(&s);
    TW_FUZZ_CHECK(false, "an exported schema does not parse: %s", e.what());
  }
  s.release(&s);
  TW_FUZZ_CHECK(back.dtype == t.dtype, "dtype %s came back as %s", t.dtype.name().c_str(), back.dtype.name().c_str());
  TW_FUZZ_CHECK(back.logical_shape() == t.logical_shape(), "the logical shape changed");
  TW_FUZZ_CHECK(back.logical_dim_names() == t.logical_dim_names(), "the logical dim names changed");
  TW_FUZZ_CHECK(back.metadata.has_value() == (t.metadata && !t.metadata->empty()), "metadata appeared or vanished");
  if (back.metadata) TW_FUZZ_CHECK(*back.metadata == *t.metadata, "metadata changed");
  if (!ambiguous) {
    TW_FUZZ_CHECK(back.shape == t.shape, "the physical shape changed");
    TW_FUZZ_CHECK(back.permutation == t.permutation, "the permutation changed");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 3;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (mode == 0) {
    std::vector<std::pair<std::string, std::string>> pairs;
    try {
      pairs = tw::decode_arrow_metadata(rest);
    } catch (const tw::Error&) {
      return 0;
    }
    TW_FUZZ_CHECK(tw::encode_arrow_metadata(pairs) == rest, "the metadata framing does not re-encode identically");
    return 0;
  }
  twfuzz::ByteReader r(data + 1, size - 1);
  ArrowSchema* root = nullptr;
  TreeBuilder builder(r);
  Node value_node, list_node;
  uint16_t list_size = 0;
  if (mode == 1) {
    root = builder.node(0);
  } else {
    list_size = r.read<uint16_t>();
    const std::string json = r.str(r.remaining());
    value_node.format = "f";
    value_node.name = "item";
    value_node.schema = ArrowSchema{value_node.format.c_str(), value_node.name.c_str(), nullptr, 0, 0, nullptr,
                                    nullptr, noop_release, nullptr};
    list_node.format = "+w:" + std::to_string(list_size);
    list_node.metadata =
        tw::encode_arrow_metadata({{"ARROW:extension:name", "arrow.fixed_shape_tensor"}, {"ARROW:extension:metadata", json}});
    list_node.children.push_back(&value_node.schema);
    list_node.schema = ArrowSchema{list_node.format.c_str(), "", list_node.metadata.data(), 0, 1,
                                   list_node.children.data(), nullptr, noop_release, nullptr};
    root = &list_node.schema;
  }
  tw::ArrowTensorType t;
  try {
    t = tw::parse_arrow_schema(*root);
  } catch (const tw::Error&) {
    return 0;
  }
  check_consistent(t);
  if (mode == 2) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    TW_FUZZ_CHECK(n == list_size, "a shape of %lld elements was accepted for list size %u", static_cast<long long>(n),
                  unsigned(list_size));
  }
  check_reexport(t);
  return 0;
}
