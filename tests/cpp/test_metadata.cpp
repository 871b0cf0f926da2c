// Metadata values and their binary encoding: kinds and accessors, an exact round trip (nested tuples, dicts, bytes,
// special floats), a frozen wire format, and hostile input that must end in Error(invalid_argument), never a crash.
#include <cmath>
#include <type_traits>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tw_test_util.hpp"

namespace {

using tw::ErrorCode;
using tw::Metadata;
using tw::Value;
using K = tw::Value::Kind;

TEST(Value, Kinds) {
  EXPECT_EQ(Value().kind(), K::none);
  EXPECT_TRUE(Value().is_none());
  EXPECT_EQ(Value(nullptr).kind(), K::none);
  EXPECT_EQ(Value(true).kind(), K::boolean);
  EXPECT_EQ(Value(1).kind(), K::integer);
  EXPECT_EQ(Value(1L).kind(), K::integer);
  EXPECT_EQ(Value(1LL).kind(), K::integer);
  EXPECT_EQ(Value(int64_t{-5}).kind(), K::integer);
  EXPECT_EQ(Value(1.5).kind(), K::floating);
  EXPECT_EQ(Value("s").kind(), K::string);
  EXPECT_EQ(Value(std::string("s")).kind(), K::string);
  EXPECT_EQ(Value(std::string_view("s")).kind(), K::string);
  EXPECT_EQ(Value::bytes("b").kind(), K::bytes);
  EXPECT_EQ(Value::list().kind(), K::list);
  EXPECT_EQ(Value::tuple().kind(), K::tuple);
  EXPECT_EQ(Value::dict().kind(), K::dict);
  EXPECT_FALSE(Value(0).is_none());
}

TEST(Value, Accessors) {
  EXPECT_TRUE(Value(true).as_bool());
  EXPECT_FALSE(Value(false).as_bool());
  EXPECT_EQ(Value(std::numeric_limits<int64_t>::min()).as_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(Value(2.25).as_float(), 2.25);
  EXPECT_EQ(Value("héllo").as_string(), "héllo");
  EXPECT_EQ(Value::bytes(std::string("a\0b", 3)).as_bytes(), std::string("a\0b", 3));
  Value l = Value::list({1, "two", Value::tuple({3.0})});
  ASSERT_EQ(l.items().size(), 3u);
  EXPECT_EQ(l.items()[1].as_string(), "two");
  EXPECT_EQ(l.items()[2].items()[0].as_float(), 3.0);
  l.items().push_back(Value());
  EXPECT_EQ(l.items().size(), 4u);
}

TEST(Value, WrongAccessorIsTypeMismatchNamingBothKinds) {
  TW_EXPECT_ERROR_MSG(Value(1).as_string(), ErrorCode::type_mismatch, "int");
  TW_EXPECT_ERROR_MSG(Value(1).as_string(), ErrorCode::type_mismatch, "str");
  TW_EXPECT_ERROR(Value(true).as_int(), ErrorCode::type_mismatch);   // a bool is not an int here
  TW_EXPECT_ERROR(Value(1).as_bool(), ErrorCode::type_mismatch);
  TW_EXPECT_ERROR(Value(1).as_float(), ErrorCode::type_mismatch);    // no silent int -> float
  TW_EXPECT_ERROR(Value("s").as_bytes(), ErrorCode::type_mismatch);  // str and bytes differ
  TW_EXPECT_ERROR(Value::bytes("s").as_string(), ErrorCode::type_mismatch);
  TW_EXPECT_ERROR(Value::dict().items(), ErrorCode::type_mismatch);
  TW_EXPECT_ERROR(Value::list().keys(), ErrorCode::type_mismatch);
  TW_EXPECT_ERROR(Value::list().values(), ErrorCode::type_mismatch);
  Value s = "x";
  TW_EXPECT_ERROR(s.set("k", 1), ErrorCode::type_mismatch);
  TW_EXPECT_ERROR(s.find("k"), ErrorCode::type_mismatch);
  TW_EXPECT_ERROR(s.erase("k"), ErrorCode::type_mismatch);
}

TEST(Value, DictKeepsInsertionOrderAndReplacesInPlace) {
  Value d = Value::dict();
  d.set("z", 1);
  d.set("a", 2);
  d.set("m", 3);
  d.set("a", "replaced");
  EXPECT_EQ(d.keys(), (std::vector<std::string>{"z", "a", "m"}));
  EXPECT_EQ(d.values()[1].as_string(), "replaced");
  ASSERT_NE(d.find("m"), nullptr);
  EXPECT_EQ(d.find("m")->as_int(), 3);
  EXPECT_EQ(d.find("nope"), nullptr);
  EXPECT_TRUE(d.erase("z"));
  EXPECT_FALSE(d.erase("z"));
  EXPECT_EQ(d.keys(), (std::vector<std::string>{"a", "m"}));
  EXPECT_EQ(d.values().size(), 2u);
  EXPECT_EQ(d.values()[1].as_int(), 3);
}

TEST(Value, Equality) {
  EXPECT_EQ(Value(1), Value(1));
  EXPECT_NE(Value(1), Value(2));
  EXPECT_NE(Value(1), Value(1.0));
  EXPECT_NE(Value(true), Value(1));
  EXPECT_NE(Value("a"), Value::bytes("a"));
  EXPECT_NE(Value::list({1}), Value::tuple({1}));
  EXPECT_EQ(Value::tuple({1, "x"}), Value::tuple({1, "x"}));
  EXPECT_EQ(Value(std::nan("")), Value(std::nan("")));  // NaN metadata survives a round trip equal to itself
  EXPECT_EQ(Value(0.0), Value(-0.0));
  EXPECT_EQ(Value(), Value(nullptr));
}

// A tree is freed in a loop, not by recursion: one deeper than the stack allows was a crash. Copies and moves of
// nested values keep their contents (the destructor made them user-declared).
TEST(Value, ATreeOfAnyDepthIsFreedAndNestedValuesCopyAndMove) {
  {
    Value root = Value::list();
    Value* cur = &root;
    for (int i = 0; i < 1000000; ++i) {
      cur->items().push_back(i % 2 ? Value::list() : Value::tuple({1, Value::list()}));
      cur = &cur->items().back();
    }
    EXPECT_EQ(cur->kind(), K::list);
  }  // freed here
  Value a = Value::list({Value::tuple({1, Value::list({"x"})}), 2});
  Value b = a;
  EXPECT_EQ(b, a);
  Value c = std::move(b);
  EXPECT_EQ(c, a);
  EXPECT_TRUE(b.items().empty());  // (moved from)
  b = c;
  EXPECT_EQ(b, a);
  c = Value(3);
  EXPECT_EQ(c, Value(3));
  EXPECT_EQ(a.items()[0].items()[1].items()[0].as_string(), "x");
}

TEST(Value, KindNames) {
  EXPECT_STREQ(tw::value_kind_name(K::none), "none");
  EXPECT_STREQ(tw::value_kind_name(K::boolean), "bool");
  EXPECT_STREQ(tw::value_kind_name(K::integer), "int");
  EXPECT_STREQ(tw::value_kind_name(K::floating), "float");
  EXPECT_STREQ(tw::value_kind_name(K::string), "str");
  EXPECT_STREQ(tw::value_kind_name(K::bytes), "bytes");
  EXPECT_STREQ(tw::value_kind_name(K::list), "list");
  EXPECT_STREQ(tw::value_kind_name(K::tuple), "tuple");
  EXPECT_STREQ(tw::value_kind_name(K::dict), "dict");
}

TEST(Metadata, MapOperations) {
  Metadata m{{"format", "xyxy"}, {"scale", 0.5}};
  EXPECT_EQ(m.size(), 2u);
  EXPECT_FALSE(m.empty());
  EXPECT_TRUE(m.contains("format"));
  EXPECT_EQ(m.at("scale").as_float(), 0.5);
  TW_EXPECT_ERROR_MSG(m.at("missing"), ErrorCode::out_of_range, "missing");
  m.set("format", "cxcywh");
  EXPECT_EQ(m.keys(), (std::vector<std::string>{"format", "scale"}));
  EXPECT_EQ(m.at("format").as_string(), "cxcywh");
  TW_EXPECT_ERROR(m.find("scale")->items(), ErrorCode::type_mismatch);  // not a list
}

TEST(Metadata, UnsignedIntegersAreStoredAsInt64AndOnePastItOverflows) {
  std::vector<int> v(3);
  Metadata m;
  m.set("size", v.size());  // (size_t: ambiguous before, a compile error)
  m.set("u", 5u);
  m.set("max", uint64_t{INT64_MAX});
  EXPECT_EQ(m.at("size").as_int(), 3);
  EXPECT_EQ(m.at("u").as_int(), 5);
  EXPECT_EQ(m.at("max").as_int(), INT64_MAX);
  TW_EXPECT_ERROR_MSG(Value(uint64_t{INT64_MAX} + 1), ErrorCode::overflow, "9223372036854775808 does not fit");
  static_assert(!std::is_constructible_v<Value, char>);  // text or a number: the caller says which
}

TEST(Metadata, MapOperationsContinued) {
  Metadata m{{"a", 1}};
  EXPECT_TRUE(m.erase("a"));
  EXPECT_TRUE(m.empty());
  m.set("b", Value::list());
  m.clear();
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.as_value().kind(), K::dict);
  // Copies are deep.
  Metadata x{{"l", Value::list({1})}};
  Metadata y = x;
  y.find("l")->items().push_back(2);
  EXPECT_EQ(x.at("l").items().size(), 1u);
  EXPECT_NE(x, y);
}

// update() is set() of each entry in order: replaced values keep their place, new keys follow in the other's order.
// Past a few keys it indexes the target (send merges a message's metadata= into each tensor's this way, and a
// loop of set() made 40 000 keys take seconds).
TEST(Metadata, UpdateReplacesInPlaceAndAppendsInOrder) {
  const auto key = [](size_t i) {  // (not "k" + to_string(i): GCC 12 warns falsely, -Wrestrict)
    std::string k = std::to_string(i);
    k.insert(k.begin(), 'k');
    return k;
  };
  for (size_t n : {size_t{0}, size_t{3}, size_t{20000}}) {
    Metadata m;
    for (size_t i = 0; i < n; i += 2) m.set(key(i), -1);  // the even keys
    Metadata extra;
    std::vector<std::string> keys;
    std::vector<Value> values;
    for (size_t i = 0; i < n; ++i) {
      keys.push_back(key(i));
      values.emplace_back(static_cast<int64_t>(i));
    }
    extra = Metadata::from_value(Value::dict(keys, values));
    m.update(extra);
    ASSERT_EQ(m.size(), n);
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(m.at(key(i)).as_int(), static_cast<int64_t>(i));
    const size_t evens = (n + 1) / 2;
    for (size_t j = 0; j < evens; ++j) EXPECT_EQ(m.keys()[j], key(2 * j)) << n;  // kept places
    for (size_t j = evens; j < n; ++j) EXPECT_EQ(m.keys()[j], key(2 * (j - evens) + 1)) << n;
  }
  Metadata a{{"x", 1}, {"y", 2}};
  a.update(a);  // with itself: nothing changes
  EXPECT_EQ(a, (Metadata{{"x", 1}, {"y", 2}}));
  Metadata few{{"y", 3}, {"z", 4}};
  a.update(few);
  EXPECT_EQ(a, (Metadata{{"x", 1}, {"y", 3}, {"z", 4}}));
  Value not_dict = Value::list();
  TW_EXPECT_ERROR(not_dict.update(Value::dict()), ErrorCode::type_mismatch);
}

// A dict past kIndexFrom keys answers from a hash index: every operation must agree with a plain ordered model
// (a vector of pairs searched linearly) through growth, erasure (which moves positions), copies and assignment.
TEST(Value, IndexedDictAgreesWithALinearModelUnderRandomOperations) {
  std::mt19937 rng(20261129u);
  const auto key = [](unsigned i) {  // few distinct keys so that hits, misses, replaces and erases all happen
    std::string k = std::to_string(i);
    k.insert(k.begin(), 'k');
    return k;
  };
  Value d = Value::dict();
  std::vector<std::pair<std::string, int64_t>> model;
  const auto in_model = [&](const std::string& k) {
    for (size_t i = 0; i < model.size(); ++i)
      if (model[i].first == k) return i;
    return model.size();
  };
  for (int step = 0; step < 20000; ++step) {
    const unsigned universe = step < 10000 ? 300u : 40u;  // grow past the index, then shrink back below it
    const std::string k = key(static_cast<unsigned>(rng() % universe));
    const size_t at = in_model(k);
    switch (rng() % 4) {
      case 0:
      case 1:
        d.set(k, step);
        if (at < model.size()) model[at].second = step; else model.emplace_back(k, step);
        break;
      case 2:
        ASSERT_EQ(d.erase(k), at < model.size()) << step;
        if (at < model.size()) model.erase(model.begin() + static_cast<std::ptrdiff_t>(at));
        break;
      default: {
        const Value* v = d.find(k);
        ASSERT_EQ(v != nullptr, at < model.size()) << step << " " << k;
        if (v) {
          ASSERT_EQ(v->as_int(), model[at].second) << step;
        }
      }
    }
    if (step % 997 == 0) {  // the whole state, and a copy's, match the model
      const Value copy = d;
      ASSERT_EQ(d.keys().size(), model.size());
      for (size_t i = 0; i < model.size(); ++i) {
        ASSERT_EQ(d.keys()[i], model[i].first);
        ASSERT_NE(copy.find(model[i].first), nullptr) << model[i].first;
        ASSERT_EQ(copy.find(model[i].first)->as_int(), model[i].second);
      }
      ASSERT_EQ(copy.find("absent"), nullptr);
      ASSERT_EQ(copy, d);
    }
  }
  // A dict built in one step, and one assigned over an indexed one, answer from their own keys.
  std::vector<std::string> keys;
  std::vector<Value> values;
  for (unsigned i = 0; i < 1000; ++i) {
    keys.push_back(key(i));
    values.emplace_back(static_cast<int64_t>(i));
  }
  Value big = Value::dict(keys, values);
  for (unsigned i = 0; i < 1000; ++i) ASSERT_EQ(big.find(key(i))->as_int(), i);
  EXPECT_EQ(big.find(key(1000)), nullptr);
  big = Value::dict({"a"}, {Value(1)});
  EXPECT_EQ(big.find(key(5)), nullptr);
  EXPECT_EQ(big.find("a")->as_int(), 1);
  // A duplicate is found by the index too, however late it comes.
  keys.push_back(key(777));
  values.emplace_back(0);
  TW_EXPECT_ERROR_MSG(Value::dict(keys, values), ErrorCode::invalid_argument, "duplicate key 'k777'");
}

Metadata rich() {
  Value inner = Value::dict();
  inner.set("bytes", Value::bytes(std::string("\x00\xff\x01 binary", 10)));
  inner.set("tuple", Value::tuple({1, Value::tuple({2, Value::tuple()}), Value::list()}));
  inner.set("", Value("empty key"));
  inner.set("none", Value());
  Metadata m;
  m.set("format", "xyxy");
  m.set("timestamp", int64_t{1700000000123456789});
  m.set("min", std::numeric_limits<int64_t>::min());
  m.set("max", std::numeric_limits<int64_t>::max());
  m.set("neg", -1);
  m.set("pi", 3.141592653589793);
  m.set("negzero", -0.0);
  m.set("inf", std::numeric_limits<double>::infinity());
  m.set("nan", std::nan("0x7"));
  m.set("denorm", std::numeric_limits<double>::denorm_min());
  m.set("flags", Value::list({true, false, Value()}));
  m.set("nested", inner);
  m.set("unicode ключ 🚀", "значение");
  m.set("empty_str", "");
  m.set("empty_bytes", Value::bytes(""));
  m.set("empty_dict", Value::dict());
  return m;
}

TEST(MetadataEncoding, RoundTripPreservesEveryKindAndOrder) {
  const Metadata m = rich();
  const std::string enc = tw::encode_metadata(m);
  const Metadata back = tw::decode_metadata(enc);
  EXPECT_EQ(back, m);
  EXPECT_EQ(back.keys(), m.keys());
  // Exact kinds survive: tuple stays tuple, bytes stay bytes, -0.0 keeps its sign, NaN its payload.
  const Value& nested = back.at("nested");
  EXPECT_EQ(nested.find("tuple")->kind(), K::tuple);
  EXPECT_EQ(nested.find("tuple")->items()[1].kind(), K::tuple);
  EXPECT_EQ(nested.find("tuple")->items()[2].kind(), K::list);
  EXPECT_EQ(nested.find("bytes")->as_bytes(), std::string("\x00\xff\x01 binary", 10));
  EXPECT_TRUE(std::signbit(back.at("negzero").as_float()));
  double nan_in = m.at("nan").as_float(), nan_out = back.at("nan").as_float();
  EXPECT_EQ(std::memcmp(&nan_in, &nan_out, sizeof(double)), 0);
  EXPECT_EQ(back.at("min").as_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(back.at("unicode ключ 🚀").as_string(), "значение");
  // The encoding is canonical.
  EXPECT_EQ(tw::encode_metadata(back), enc);
  // Empty metadata too.
  EXPECT_EQ(tw::decode_metadata(tw::encode_metadata(Metadata())), Metadata());
}

TEST(MetadataEncoding, WireFormatIsFrozen) {
  // "TWMD", version 1, dict tag 9, count 1, key "a", int tag 3, 1 as 8 little-endian bytes.
  const std::string expect("TWMD\x01\x09\x01\x00\x00\x00\x01\x00\x00\x00" "a" "\x03\x01\x00\x00\x00\x00\x00\x00\x00",
                           24);
  EXPECT_EQ(tw::encode_metadata(Metadata{{"a", 1}}), expect);
  // Every tag once: none 0, false 1, true 2, float 4, str 5, bytes 6, list 7, tuple 8.
  Metadata m{{"v", Value::list({Value(), false, true, 1.0, "s", Value::bytes("b"), Value::tuple()})}};
  const std::string e2 = tw::encode_metadata(m);
  const std::string body("\x07\x07\x00\x00\x00"           // list of 7
                         "\x00\x01\x02"                   // none, false, true
                         "\x04\x00\x00\x00\x00\x00\x00\xf0\x3f"  // 1.0
                         "\x05\x01\x00\x00\x00s"          // "s"
                         "\x06\x01\x00\x00\x00" "b"       // b"b"
                         "\x08\x00\x00\x00\x00",          // ()
                         5 + 3 + 9 + 6 + 6 + 5);
  EXPECT_EQ(e2.substr(e2.size() - body.size()), body);
}

TEST(MetadataEncoding, TruncationAtEveryLengthIsRefused) {
  const std::string enc = tw::encode_metadata(rich());
  for (size_t n = 0; n < enc.size(); ++n) {
    SCOPED_TRACE(n);
    TW_EXPECT_ERROR(tw::decode_metadata(std::string_view(enc.data(), n)), ErrorCode::invalid_argument);
  }
}

TEST(MetadataEncoding, MalformedHeadersAndBodies) {
  const std::string good = tw::encode_metadata(Metadata{{"a", 1}});
  auto with = [&](size_t pos, char c) {
    std::string s = good;
    s[pos] = c;
    return s;
  };
  TW_EXPECT_ERROR_MSG(tw::decode_metadata(with(0, 'X')), ErrorCode::invalid_argument, "magic");
  TW_EXPECT_ERROR_MSG(tw::decode_metadata(with(4, '\x02')), ErrorCode::invalid_argument, "version");
  TW_EXPECT_ERROR(tw::decode_metadata(with(5, '\x07')), ErrorCode::invalid_argument);   // root is a list
  TW_EXPECT_ERROR(tw::decode_metadata(with(15, '\x0a')), ErrorCode::invalid_argument);  // unknown tag 10
  TW_EXPECT_ERROR(tw::decode_metadata(with(15, '\xff')), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR_MSG(tw::decode_metadata(good + "x"), ErrorCode::invalid_argument, "trailing");
  // Counts and lengths far beyond the input.
  TW_EXPECT_ERROR(tw::decode_metadata(std::string("TWMD\x01\x09\xff\xff\xff\xff", 10)), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::decode_metadata(std::string("TWMD\x01\x09\x01\x00\x00\x00\xff\xff\xff\xff" "a", 15)),
                  ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::decode_metadata(std::string("TWMD\x01\x09\x01\x00\x00\x00\x01\x00\x00\x00" "a\x05\xff\xff\xff\x7f",
                                                  20)),
                  ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::decode_metadata(std::string("TWMD\x01\x09\x01\x00\x00\x00\x01\x00\x00\x00" "a\x07\xff\xff\xff\xff",
                                                  20)),
                  ErrorCode::invalid_argument);
  // Duplicate keys would make the decoded map ambiguous.
  TW_EXPECT_ERROR_MSG(
      tw::decode_metadata(std::string("TWMD\x01\x09\x02\x00\x00\x00\x01\x00\x00\x00" "a\x00\x01\x00\x00\x00" "a\x00", 22)),
      ErrorCode::invalid_argument, "duplicate");
  TW_EXPECT_ERROR(tw::decode_metadata(""), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::decode_metadata("TWMD"), ErrorCode::invalid_argument);
  TW_EXPECT_ERROR(tw::decode_metadata(std::string("TWMD\x01", 5)), ErrorCode::invalid_argument);
}

TEST(MetadataEncoding, TextThatIsNotUtf8IsRefusedBothWays) {
  // Keys and str values are text: the decoder refuses bytes that are not UTF-8 (a hostile peer's, an edited
  // pickle's), naming where; the encoder refuses them too, so that the sender, not every receiver, hears it.
  const std::string key_ff("TWMD\x01\x09\x01\x00\x00\x00\x03\x00\x00\x00" "k\xffy" "\x00", 18);
  TW_EXPECT_ERROR_MSG(tw::decode_metadata(key_ff), ErrorCode::invalid_argument, "a key is not valid UTF-8");
  TW_EXPECT_ERROR_MSG(tw::decode_metadata(key_ff), ErrorCode::invalid_argument, "at byte 15");
  const std::string val_surrogate("TWMD\x01\x09\x01\x00\x00\x00\x01\x00\x00\x00" "k" "\x05\x03\x00\x00\x00"
                                  "\xed\xa0\x80", 23);  // U+D800 encoded: not text
  TW_EXPECT_ERROR_MSG(tw::decode_metadata(val_surrogate), ErrorCode::invalid_argument, "a str value is not valid UTF-8");
  TW_EXPECT_ERROR_MSG(tw::encode_metadata(Metadata{{"k", std::string("v\xff")}}), ErrorCode::invalid_argument, "UTF-8");
  TW_EXPECT_ERROR_MSG(tw::encode_metadata(Metadata{{std::string("k\xc0\xaf"), 1}}), ErrorCode::invalid_argument,
                      "UTF-8");
  // Bytes values hold anything; text of every plane round-trips.
  const Metadata ok{{"b", Value::bytes(std::string("\xff\x00\xc0", 3))}, {"t", "é€😀"}};
  EXPECT_EQ(tw::decode_metadata(tw::encode_metadata(ok)), ok);
}

std::string nested_lists(int depth) {
  // {"k": [[[...]]]} with `depth` lists, built byte by byte.
  std::string s("TWMD\x01\x09\x01\x00\x00\x00\x01\x00\x00\x00" "k", 15);
  for (int i = 0; i < depth; ++i) s += std::string(i + 1 < depth ? "\x07\x01\x00\x00\x00" : "\x07\x00\x00\x00\x00", 5);
  return s;
}

TEST(MetadataEncoding, DeepNestingIsRefusedWithoutExhaustingTheStack) {
  EXPECT_NO_THROW(tw::decode_metadata(nested_lists(60)));
  TW_EXPECT_ERROR_MSG(tw::decode_metadata(nested_lists(70)), ErrorCode::invalid_argument, "nesting");
  TW_EXPECT_ERROR(tw::decode_metadata(nested_lists(100000)), ErrorCode::invalid_argument);
  // What encode writes for moderate nesting decodes back equal.
  Value v = Value::list();
  for (int i = 0; i < 40; ++i) v = Value::tuple({v, i});
  Metadata m{{"deep", v}};
  EXPECT_EQ(tw::decode_metadata(tw::encode_metadata(m)), m);
  // Encode refuses exactly what decode would: the deepest encodable metadata decodes, one level more is refused at
  // the sender (a publisher must not send what ends every subscriber's stream).
  auto chain = [](int levels) {  // the root dict, then `levels` nested dicts under "k"
    Value x = Value::dict();
    for (int i = 1; i < levels; ++i) x = Value::dict({"k"}, {x});
    return Metadata{{"k", x}};
  };
  EXPECT_EQ(tw::decode_metadata(tw::encode_metadata(chain(64))), chain(64));
  TW_EXPECT_ERROR_MSG(tw::encode_metadata(chain(65)), ErrorCode::invalid_argument, "nested deeper than 64");
}

TEST(MetadataEncoding, MutatedInputNeverCrashes) {
  const std::string good = tw::encode_metadata(rich());
  std::mt19937_64 rng(12345);
  int decoded = 0, refused = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string s = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t pos = rng() % s.size();
      switch (rng() % 5) {
        case 0: s[pos] = static_cast<char>(rng()); break;
        case 1: s[pos] = static_cast<char>(s[pos] ^ (1 << (rng() % 8))); break;
        case 2: s.erase(pos, 1 + rng() % 4); break;
        case 3: s.insert(pos, 1, static_cast<char>(rng())); break;
        case 4:
          if (pos + 4 <= s.size()) std::memset(&s[pos], (rng() & 1) ? 0xff : 0x7f, 4);
          break;
      }
    }
    try {
      Metadata m = tw::decode_metadata(s);
      ++decoded;
      // Whatever decodes is canonical: it re-encodes to the very same bytes.
      ASSERT_EQ(tw::encode_metadata(m), s) << "iteration " << iter;
    } catch (const tw::Error& e) {
      ++refused;
      ASSERT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
    }
  }
  EXPECT_GT(refused, 1000);
  // Pure garbage after a valid header.
  for (int iter = 0; iter < 5000; ++iter) {
    std::string s("TWMD\x01\x09", 6);
    const size_t n = rng() % 64;
    for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>(rng()));
    try {
      tw::decode_metadata(s);
    } catch (const tw::Error& e) {
      ASSERT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
    }
  }
  (void)decoded;
}

}  // namespace
