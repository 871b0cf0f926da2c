// The C ABI (tensorwire.h) as a binding uses it: frozen layouts, ownership hand-offs, exclusivity, metadata values,
// publish/subscribe with its status codes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <unistd.h>

#include "tensorwire/copy.hpp"  // tw::get_num_threads, to check what tw_set_num_threads set
#include "tensorwire/ipc.hpp"  // the C++ peer of one test (a message of several tensors)
#include "tensorwire/tensorwire.h"
#include "net/net_internal.hpp"  // ucx_unavailable_reason: the remote test skips where UCX cannot run

// ---- layouts a binding hard-codes (rust/src/ffi.rs declares the same) ------------------------------------------
static_assert(offsetof(tw_export_options, struct_size) == 0);
static_assert(offsetof(tw_export_options, copy) == 4);
static_assert(offsetof(tw_export_options, consumer) == 8);
static_assert(offsetof(tw_export_options, has_device) == 12);
static_assert(offsetof(tw_export_options, device) == 16);
static_assert(offsetof(tw_export_options, has_stream) == 24);
static_assert(offsetof(tw_export_options, stream) == 32);
static_assert(offsetof(tw_export_options, max_version) == 40);
static_assert(sizeof(tw_export_options) == 48);

static_assert(offsetof(tw_import_options, struct_size) == 0);
static_assert(offsetof(tw_import_options, copy) == 4);
static_assert(offsetof(tw_import_options, has_device) == 8);
static_assert(offsetof(tw_import_options, device) == 12);
static_assert(sizeof(tw_import_options) == 20);

static_assert(offsetof(tw_publisher_options, struct_size) == 0);
static_assert(offsetof(tw_publisher_options, on_full) == 4);
static_assert(offsetof(tw_publisher_options, depth) == 8);
static_assert(offsetof(tw_publisher_options, max_metadata_bytes) == 16);
static_assert(offsetof(tw_publisher_options, max_buffers) == 24);
static_assert(offsetof(tw_publisher_options, pool_bytes) == 32);
static_assert(offsetof(tw_publisher_options, max_subscribers) == 40);
static_assert(offsetof(tw_publisher_options, protect_sent_loans) == 48);
static_assert(offsetof(tw_publisher_options, allow_other_users) == 52);
static_assert(offsetof(tw_publisher_options, listen) == 56);  // ABI 1.2: appended
static_assert(offsetof(tw_publisher_options, token) == 64);
static_assert(offsetof(tw_publisher_options, insecure) == 72);
static_assert(sizeof(tw_publisher_options) == 80);

static_assert(offsetof(tw_subscriber_options, struct_size) == 0);
static_assert(offsetof(tw_subscriber_options, allow_other_users) == 4);
static_assert(offsetof(tw_subscriber_options, connect) == 8);  // ABI 1.2: appended
static_assert(offsetof(tw_subscriber_options, token) == 16);
static_assert(offsetof(tw_subscriber_options, has_device) == 24);
static_assert(offsetof(tw_subscriber_options, device) == 28);
static_assert(sizeof(tw_subscriber_options) == 40);

static_assert(offsetof(tw_send_options, struct_size) == 0);
static_assert(offsetof(tw_send_options, copy) == 4);
static_assert(offsetof(tw_send_options, timeout_ns) == 8);
static_assert(offsetof(tw_send_options, extra) == 16);
static_assert(offsetof(tw_send_options, stream) == 24);
static_assert(sizeof(tw_send_options) == 32);

static_assert(TW_OK == 0 && TW_ERR_TIMEOUT == 12 && TW_ERR_WOULD_BLOCK == 13 && TW_END_OF_STREAM == 14);
static_assert(TW_VALUE_NONE == 0 && TW_VALUE_DICT == 8);
static_assert(TW_ON_FULL_BLOCK == 0 && TW_ON_FULL_DROP_OLDEST == 1 && TW_ON_FULL_RAISE == 2);

namespace {

constexpr DLDataType kF32{kDLFloat, 32, 1};
constexpr DLDevice kCpu{kDLCPU, 0};

std::string topic(const char* what) { return std::string("capi_").append(what).append(".").append(std::to_string(getpid())); }

// A call failed with `status`, and tw_last_error() says `what`.
#define EXPECT_FAILS(call, status, what)                                                    \
  do {                                                                                      \
    EXPECT_EQ((call), (status));                                                            \
    EXPECT_NE(std::string(tw_last_error()).find(what), std::string::npos) << tw_last_error(); \
  } while (0)

TEST(CApi, OptionsInitNeverWritesPastTheCallersSize) {
  // A caller compiled against an older, smaller struct passes its own sizeof: the bytes after it are its stack.
  alignas(8) unsigned char buf[sizeof(tw_publisher_options) + 16];
  std::memset(buf, 0xAB, sizeof buf);
  auto* o = reinterpret_cast<tw_publisher_options*>(buf);
  tw_publisher_options_init_sized(o, 40);
  EXPECT_EQ(o->struct_size, 40u);
  EXPECT_EQ(o->depth, 8u);  // the defaults, up to the caller's size
  for (size_t i = 40; i < sizeof buf; ++i) ASSERT_EQ(buf[i], 0xAB) << "byte " << i << " written";
  std::memset(buf, 0xAB, sizeof buf);
  tw_publisher_options_init_sized(o, 2);  // cannot even hold struct_size: nothing written
  for (size_t i = 0; i < sizeof buf; ++i) ASSERT_EQ(buf[i], 0xAB) << "byte " << i << " written";
  std::memset(buf, 0xAB, sizeof buf);
  tw_publisher_options_init(o);  // this header's size: all of it, nothing after
  EXPECT_EQ(o->struct_size, sizeof(tw_publisher_options));
  EXPECT_EQ(o->allow_other_users, 0);
  for (size_t i = sizeof(tw_publisher_options); i < sizeof buf; ++i) ASSERT_EQ(buf[i], 0xAB);

  alignas(8) unsigned char eb[sizeof(tw_export_options) + 8];
  std::memset(eb, 0xCD, sizeof eb);
  tw_export_options_init_sized(reinterpret_cast<tw_export_options*>(eb), 12);
  EXPECT_EQ(reinterpret_cast<tw_export_options*>(eb)->struct_size, 12u);
  for (size_t i = 12; i < sizeof eb; ++i) ASSERT_EQ(eb[i], 0xCD);
  tw_import_options io;
  tw_import_options_init(&io);
  EXPECT_EQ(io.struct_size, sizeof io);
  EXPECT_EQ(io.copy, TW_COPY_IF_NEEDED);
  tw_subscriber_options so;
  tw_subscriber_options_init(&so);
  EXPECT_EQ(so.struct_size, sizeof so);
  // A struct smaller than any the library shipped is refused, naming the init function.
  tw_publisher* p = nullptr;
  tw_publisher_options_init_sized(reinterpret_cast<tw_publisher_options*>(buf), 40);
  EXPECT_FAILS(tw_publisher_new(topic("small").c_str(), reinterpret_cast<tw_publisher_options*>(buf), &p),
               TW_ERR_INVALID_ARGUMENT, "tw_publisher_options.struct_size is 40");
  EXPECT_EQ(p, nullptr);
  // A size between two shipped ones ends inside a field: 60 is half of `listen` (a pointer read from half of one
  // crashed). Only the shipped sizes are read.
  for (uint32_t size : {57u, 60u, 64u, 72u, 81u}) {
    tw_publisher_options po;
    tw_publisher_options_init(&po);
    po.listen = "127.0.0.1:0";
    po.struct_size = size;
    EXPECT_FAILS(tw_publisher_new(topic("torn").c_str(), &po, &p), TW_ERR_INVALID_ARGUMENT,
                 "tw_publisher_options.struct_size is " + std::to_string(size) + "; expected 80 (or 56, as ABI 1.1");
    EXPECT_EQ(p, nullptr);
  }
  tw_subscriber_options_init(&so);
  so.struct_size = 12;  // half of `connect`
  tw_subscriber* s = nullptr;
  EXPECT_FAILS(tw_subscriber_new(topic("torn").c_str(), &so, &s), TW_ERR_INVALID_ARGUMENT,
               "tw_subscriber_options.struct_size is 12");
  EXPECT_EQ(s, nullptr);
  so.struct_size = 8;  // ABI 1.1's: read up to its size, the rest defaults
  ASSERT_EQ(tw_subscriber_new(topic("v11").c_str(), &so, &s), TW_OK) << tw_last_error();
  tw_subscriber_free(s);
}

TEST(CApi, VersionQueries) {
  EXPECT_EQ(tw_abi_version() >> 16, uint32_t{TW_ABI_VERSION_MAJOR});
  EXPECT_EQ(tw_abi_version() & 0xFFFFu, uint32_t{TW_ABI_VERSION_MINOR});
  EXPECT_STRNE(tw_version(), "");
  EXPECT_STREQ(tw_status_name(TW_OK), "ok");
  EXPECT_STREQ(tw_status_name(TW_ERR_COPY_REQUIRED), "copy_required");
  EXPECT_STREQ(tw_status_name(TW_ERR_WOULD_BLOCK), "would_block");
  EXPECT_STREQ(tw_status_name(TW_END_OF_STREAM), "end_of_stream");
  EXPECT_STREQ(tw_status_name(static_cast<tw_status>(15)), "unknown");
}

std::atomic<int> g_released{0};
void count_release(void*) { g_released.fetch_add(1); }

TEST(CApi, AThreadCountPastTheLimitIsTakenAsTheLimit) {
  // (tw_set_num_threads returns nothing: more than tw::kMaxThreads means the most it takes, not an error.)
  tw_set_num_threads(100000);
  EXPECT_EQ(tw::get_num_threads(), tw::kMaxThreads);
  tw_set_num_threads(1);
  EXPECT_EQ(tw::get_num_threads(), 1);
}

TEST(CApi, ARankPastTheMaximumIsRefusedBeforeItsEntriesAreRead) {
  // The caller's array holds two entries: a wild ndim must be refused before one past them is read (ASan would
  // report the read), with a short message, for every call that takes a shape or a permutation.
  int64_t dims[2] = {1, 0};
  tw_tensor* t = nullptr;
  ASSERT_EQ(tw_tensor_zeros(2, dims, DLDataType{2, 32, 1}, &t), TW_OK);
  tw_tensor* out = nullptr;
  for (int32_t ndim : {65, 1000000}) {
    const std::string want = "rank " + std::to_string(ndim) + " exceeds the maximum of 64";
    EXPECT_EQ(tw_tensor_view(t, ndim, dims, &out), TW_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(tw_last_error()), want);
    EXPECT_EQ(tw_tensor_reshape(t, ndim, dims, &out), TW_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(tw_last_error()), want);
    EXPECT_EQ(tw_tensor_permute(t, dims, ndim, &out), TW_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(tw_last_error()), want);
    EXPECT_EQ(tw_tensor_zeros(ndim, dims, DLDataType{2, 32, 1}, &out), TW_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(std::string(tw_last_error()), want);
    EXPECT_EQ(out, nullptr);
  }
  tw_tensor_free(t);
}

TEST(CApi, AdoptReleasesExactlyOnceAfterTheLastView) {
  g_released = 0;
  alignas(8) static float data[6] = {0, 1, 2, 3, 4, 5};
  const int64_t shape[2] = {2, 3};
  tw_tensor* t = nullptr;
  ASSERT_EQ(tw_tensor_adopt(data, 2, shape, nullptr, kF32, kCpu, count_release, nullptr, &t), TW_OK);
  EXPECT_EQ(tw_tensor_data_borrowed(t), static_cast<void*>(data));  // zero-copy
  EXPECT_EQ(tw_tensor_is_exclusive(t), 1);
  tw_tensor* v = nullptr;
  ASSERT_EQ(tw_tensor_transpose(t, 0, 1, &v), TW_OK);
  EXPECT_EQ(tw_tensor_is_exclusive(t), 0);  // a view shares it
  EXPECT_EQ(tw_tensor_is_exclusive(v), 0);
  tw_tensor_free(t);
  EXPECT_EQ(g_released.load(), 0);
  EXPECT_EQ(tw_tensor_is_exclusive(v), 1);  // the view is now the only owner
  EXPECT_EQ(static_cast<float*>(tw_tensor_data_borrowed(v))[1 * 1], 1.0f);
  tw_tensor_free(v);
  EXPECT_EQ(g_released.load(), 1);
}

TEST(CApi, FailedAdoptStillReleasesOnce) {
  g_released = 0;
  static float data[4];
  const int64_t bad_shape[1] = {-1};
  tw_tensor* t = nullptr;
  EXPECT_FAILS(tw_tensor_adopt(data, 1, bad_shape, nullptr, kF32, kCpu, count_release, nullptr, &t),
               TW_ERR_INVALID_ARGUMENT, "negative");
  EXPECT_EQ(t, nullptr);
  EXPECT_EQ(g_released.load(), 1);
  EXPECT_EQ(tw_tensor_adopt(data, 1, nullptr, nullptr, kF32, kCpu, count_release, nullptr, &t),
            TW_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(g_released.load(), 2);
  EXPECT_NE(std::string(tw_last_error()).find("shape is NULL"), std::string::npos);
}

TEST(CApi, ExclusivityFollowsEveryOtherOwner) {
  static float data[4];
  const int64_t shape[1] = {4};
  tw_tensor* borrowed = nullptr;
  ASSERT_EQ(tw_tensor_from_blob(data, 1, shape, nullptr, kF32, kCpu, nullptr, nullptr, &borrowed), TW_OK);
  EXPECT_EQ(tw_tensor_is_exclusive(borrowed), 0);  // the caller can still write it
  tw_tensor_free(borrowed);

  tw_tensor* z = nullptr;
  ASSERT_EQ(tw_tensor_zeros(1, shape, kF32, &z), TW_OK);
  EXPECT_EQ(tw_tensor_is_exclusive(z), 1);
  DLManagedTensorVersioned* m = nullptr;
  ASSERT_EQ(tw_tensor_to_dlpack(z, 1, 4, &m), TW_OK);
  EXPECT_EQ(tw_tensor_is_exclusive(z), 0);  // an export holds it
  m->deleter(m);
  EXPECT_EQ(tw_tensor_is_exclusive(z), 1);
  tw_tensor* ro = nullptr;
  ASSERT_EQ(tw_tensor_as_readonly(z, &ro), TW_OK);
  EXPECT_EQ(tw_tensor_is_exclusive(ro), 0);
  tw_tensor_free(ro);
  EXPECT_NE(tw_tensor_data(z), nullptr);  // a raw pointer escaped
  EXPECT_EQ(tw_tensor_is_exclusive(z), 0);
  tw_tensor_free(z);

  // Memory imported from DLPack belongs to its producer.
  ASSERT_EQ(tw_tensor_zeros(1, shape, kF32, &z), TW_OK);
  ASSERT_EQ(tw_tensor_to_dlpack(z, 1, 4, &m), TW_OK);
  tw_tensor_free(z);
  tw_tensor* imported = nullptr;
  ASSERT_EQ(tw_tensor_from_dlpack(m, &imported), TW_OK);
  EXPECT_EQ(tw_tensor_is_exclusive(imported), 0);
  tw_tensor* copy = nullptr;
  ASSERT_EQ(tw_tensor_clone(imported, &copy), TW_OK);
  EXPECT_EQ(tw_tensor_is_exclusive(copy), 1);
  tw_tensor_free(imported);
  tw_tensor_free(copy);
  // ... unless the import copied it: then the copy is tensorwire's own (it was never exclusive).
  for (const tw_copy_mode mode : {TW_COPY_IF_NEEDED, TW_COPY_ALWAYS}) {
    ASSERT_EQ(tw_tensor_zeros(1, shape, kF32, &z), TW_OK);
    ASSERT_EQ(tw_tensor_to_dlpack(z, 1, 4, &m), TW_OK);
    const void* producers = m->dl_tensor.data;
    tw_import_options io;
    tw_import_options_init(&io);
    io.copy = mode;
    ASSERT_EQ(tw_tensor_import_dlpack(m, &io, &imported), TW_OK) << tw_last_error();
    EXPECT_EQ(tw_tensor_data_borrowed(imported) != producers, mode == TW_COPY_ALWAYS);
    EXPECT_EQ(tw_tensor_is_exclusive(imported), mode == TW_COPY_ALWAYS ? 1 : 0) << mode;
    tw_tensor_free(imported);
    tw_tensor_free(z);
  }

  // contiguous/reshape of borrowed memory: the same memory when no copy is needed (still not exclusive), new
  // memory of tensorwire's own when one is.
  static float grid[6];
  const int64_t gshape[2] = {2, 3};
  ASSERT_EQ(tw_tensor_from_blob(grid, 2, gshape, nullptr, kF32, kCpu, nullptr, nullptr, &borrowed), TW_OK);
  tw_tensor* same = nullptr;
  ASSERT_EQ(tw_tensor_contiguous(borrowed, &same), TW_OK);
  EXPECT_EQ(tw_tensor_data_borrowed(same), static_cast<void*>(grid));
  EXPECT_EQ(tw_tensor_is_exclusive(same), 0);
  tw_tensor *tr = nullptr, *dense = nullptr;
  ASSERT_EQ(tw_tensor_transpose(borrowed, 0, 1, &tr), TW_OK);
  EXPECT_EQ(tw_tensor_is_exclusive(tr), 0);
  tw_tensor_free(borrowed);
  tw_tensor_free(same);
  ASSERT_EQ(tw_tensor_contiguous(tr, &dense), TW_OK);
  EXPECT_NE(tw_tensor_data_borrowed(dense), static_cast<void*>(grid));
  EXPECT_EQ(tw_tensor_is_exclusive(dense), 1);
  tw_tensor_free(tr);
  tw_tensor_free(dense);
}

TEST(CApi, ViewsReshapeAndSelect) {
  const int64_t shape[2] = {3, 4};
  tw_tensor* t = nullptr;
  ASSERT_EQ(tw_tensor_empty(2, shape, kF32, &t), TW_OK);
  float* d = static_cast<float*>(tw_tensor_data_borrowed(t));
  for (int i = 0; i < 12; ++i) d[i] = static_cast<float>(i);
  EXPECT_EQ(tw_tensor_numel(t), 12);
  EXPECT_EQ(tw_tensor_nbytes(t), 48);

  tw_tensor *tr = nullptr, *row = nullptr, *flat = nullptr, *v = nullptr;
  ASSERT_EQ(tw_tensor_transpose(t, 0, 1, &tr), TW_OK);
  const int64_t flat_shape[1] = {-1};
  EXPECT_EQ(tw_tensor_view(tr, 1, flat_shape, &v), TW_ERR_COPY_REQUIRED);
  EXPECT_EQ(v, nullptr);
  EXPECT_NE(std::string(tw_last_error()).find("reshape"), std::string::npos);
  ASSERT_EQ(tw_tensor_reshape(tr, 1, flat_shape, &flat), TW_OK);
  EXPECT_EQ(tw_tensor_shape(flat)[0], 12);
  EXPECT_EQ(static_cast<float*>(tw_tensor_data_borrowed(flat))[1], 4.0f);  // column-major order of t
  ASSERT_EQ(tw_tensor_select(t, 0, -1, &row), TW_OK);
  EXPECT_EQ(tw_tensor_ndim(row), 1);
  EXPECT_EQ(tw_tensor_data_borrowed(row), static_cast<void*>(d + 8));  // a view: the same memory, offset
  EXPECT_EQ(tw_tensor_data_borrowed(tr), static_cast<void*>(d));
  EXPECT_FAILS(tw_tensor_select(t, 0, 3, &v), TW_ERR_OUT_OF_RANGE, "index 3 is out of range");
  EXPECT_FAILS(tw_tensor_permute(t, nullptr, 2, &v), TW_ERR_INVALID_ARGUMENT, "dims is NULL");
  EXPECT_FAILS(tw_tensor_transpose(nullptr, 0, 1, &v), TW_ERR_INVALID_ARGUMENT, "tensor is NULL");
  for (tw_tensor* h : {t, tr, row, flat}) tw_tensor_free(h);
}

// Copying and encoding recurse: a tree deeper than the encoding's 64 levels is refused where the C ABI would copy
// it (100 000 levels, built inside out, overflowed the stack in tw_value_clone / tw_tensor_set_metadata / send).
TEST(CApi, MetadataNestedDeeperThanTheEncodingIsRefusedBeforeItIsCopied) {
  const auto nest = [](int levels) {  // a dict holding `levels` lists, one inside the next
    tw_value* v = tw_value_list();
    for (int i = 1; i < levels; ++i) {
      tw_value* outer = tw_value_list();
      EXPECT_EQ(tw_value_append(outer, v), TW_OK);
      v = outer;
    }
    tw_value* d = tw_value_dict();
    EXPECT_EQ(tw_value_dict_set(d, "deep", 4, v), TW_OK);
    return d;
  };
  const int64_t shape[1] = {1};
  tw_tensor* t = nullptr;
  ASSERT_EQ(tw_tensor_zeros(1, shape, kF32, &t), TW_OK);
  tw_value* ok = nest(64);  // the dict, then 64 lists: as deep as the encoding goes
  tw_value* copy = tw_value_clone(ok);
  ASSERT_NE(copy, nullptr) << tw_last_error();
  EXPECT_EQ(tw_tensor_set_metadata(t, ok), TW_OK) << tw_last_error();
  tw_value_free(copy);
  tw_value_free(ok);
  tw_value* deep = nest(5000);
  EXPECT_EQ(tw_value_clone(deep), nullptr);
  EXPECT_NE(std::string(tw_last_error()).find("nested deeper than 64 levels"), std::string::npos) << tw_last_error();
  EXPECT_FAILS(tw_tensor_set_metadata(t, deep), TW_ERR_INVALID_ARGUMENT, "metadata is nested deeper than 64 levels");
  tw_value* got = nullptr;
  ASSERT_EQ(tw_tensor_metadata(t, &got), TW_OK);  // unchanged by the refusal
  EXPECT_EQ(tw_value_len(got), 1u);
  tw_value_free(got);
  tw_value_free(deep);
  tw_tensor_free(t);
}

// tw_value_free of a tree deeper than the stack allows: it recursed and crashed (400 000 levels on an 8 MiB stack).
// A chain of dicts and lists, each holding the next.
TEST(CApi, AValueTreeOfAnyDepthIsFreedWithoutRecursion) {
  constexpr int kLevels = 1000000;
  tw_value* root = tw_value_dict();
  tw_value* cur = root;
  for (int i = 0; i < kLevels; ++i) {
    if (tw_value_get_kind(cur) == TW_VALUE_DICT) {
      ASSERT_EQ(tw_value_dict_set(cur, "k", 1, tw_value_list()), TW_OK) << tw_last_error();
      cur = const_cast<tw_value*>(tw_value_dict_get(cur, "k", 1));
    } else {
      ASSERT_EQ(tw_value_append(cur, tw_value_dict()), TW_OK) << tw_last_error();
      cur = const_cast<tw_value*>(tw_value_item(cur, 0));
    }
    ASSERT_NE(cur, nullptr);
  }
  int depth = 0;
  for (const tw_value* v = root; tw_value_len(v) == 1; ++depth)
    v = tw_value_get_kind(v) == TW_VALUE_DICT ? tw_value_dict_get(v, "k", 1) : tw_value_item(v, 0);
  EXPECT_EQ(depth, kLevels);
  tw_value_free(root);
}

TEST(CApi, MetadataValuesRoundTrip) {
  tw_value* d = tw_value_dict();
  ASSERT_NE(d, nullptr);
  ASSERT_EQ(tw_value_dict_set(d, "step", 4, tw_value_int(7)), TW_OK);
  ASSERT_EQ(tw_value_dict_set(d, "scale", 5, tw_value_float(0.5)), TW_OK);
  const char nul_string[] = {'a', '\0', 'b'};
  ASSERT_EQ(tw_value_dict_set(d, "name", 4, tw_value_string(nul_string, 3)), TW_OK);
  ASSERT_EQ(tw_value_dict_set(d, "raw", 3, tw_value_bytes("\xff\x00", 2)), TW_OK);
  tw_value* tup = tw_value_tuple();
  ASSERT_EQ(tw_value_append(tup, tw_value_bool(1)), TW_OK);
  ASSERT_EQ(tw_value_append(tup, tw_value_none()), TW_OK);
  ASSERT_EQ(tw_value_dict_set(d, "pair", 4, tup), TW_OK);
  ASSERT_EQ(tw_value_dict_set(d, "step", 4, tw_value_int(8)), TW_OK);  // replaced in place

  const int64_t shape[1] = {2};
  tw_tensor* t = nullptr;
  ASSERT_EQ(tw_tensor_zeros(1, shape, kF32, &t), TW_OK);
  ASSERT_EQ(tw_tensor_set_metadata(t, d), TW_OK);
  tw_value_free(d);
  tw_value* got = nullptr;
  ASSERT_EQ(tw_tensor_metadata(t, &got), TW_OK);
  ASSERT_EQ(tw_value_get_kind(got), TW_VALUE_DICT);
  ASSERT_EQ(tw_value_len(got), 5u);
  const char* key = nullptr;
  size_t len = 0;
  ASSERT_EQ(tw_value_key(got, 0, &key, &len), TW_OK);
  EXPECT_EQ(std::string(key, len), "step");
  int64_t i = 0;
  ASSERT_EQ(tw_value_get_int(tw_value_item(got, 0), &i), TW_OK);
  EXPECT_EQ(i, 8);
  double f = 0;
  EXPECT_EQ(tw_value_get_int(tw_value_dict_get(got, "scale", 5), &i), TW_ERR_TYPE_MISMATCH);
  EXPECT_NE(std::string(tw_last_error()).find("float"), std::string::npos);
  ASSERT_EQ(tw_value_get_float(tw_value_dict_get(got, "scale", 5), &f), TW_OK);
  const char* text = nullptr;
  size_t text_len = 0;
  EXPECT_FAILS(tw_value_get_data(tw_value_dict_get(got, "scale", 5), &text, &text_len), TW_ERR_TYPE_MISMATCH,
               "needs a str or bytes value, not a float");
  EXPECT_EQ(f, 0.5);
  const char* data = nullptr;
  ASSERT_EQ(tw_value_get_data(tw_value_dict_get(got, "name", 4), &data, &len), TW_OK);
  EXPECT_EQ(std::string(data, len), std::string(nul_string, 3));
  ASSERT_EQ(tw_value_get_data(tw_value_dict_get(got, "raw", 3), &data, &len), TW_OK);
  EXPECT_EQ(std::string(data, len), std::string("\xff\x00", 2));
  const tw_value* pair = tw_value_dict_get(got, "pair", 4);
  ASSERT_EQ(tw_value_get_kind(pair), TW_VALUE_TUPLE);
  EXPECT_EQ(tw_value_len(pair), 2u);
  EXPECT_EQ(tw_value_get_kind(tw_value_item(pair, 1)), TW_VALUE_NONE);
  EXPECT_EQ(tw_value_item(pair, 2), nullptr);
  EXPECT_EQ(tw_value_dict_get(got, "missing", 7), nullptr);
  EXPECT_EQ(tw_value_key(got, 9, &key, &len), TW_ERR_OUT_OF_RANGE);
  tw_value_free(got);

  // Bad input: invalid UTF-8, a non-dict as metadata, a non-container append (its item is still consumed).
  EXPECT_EQ(tw_value_string("\xc3\x28", 2), nullptr);
  EXPECT_NE(std::string(tw_last_error()).find("UTF-8"), std::string::npos);
  tw_value* l = tw_value_list();
  EXPECT_EQ(tw_tensor_set_metadata(t, l), TW_ERR_TYPE_MISMATCH);
  EXPECT_NE(std::string(tw_last_error()).find("must be a dict, not a list"), std::string::npos);
  tw_value* n = tw_value_int(1);
  EXPECT_FAILS(tw_value_append(n, tw_value_int(2)), TW_ERR_TYPE_MISMATCH, "needs a list or tuple, not a int");
  EXPECT_FAILS(tw_value_dict_set(l, "k", 1, tw_value_int(2)), TW_ERR_TYPE_MISMATCH, "needs a dict, not a list");
  // A container appended to itself would be moved into itself and freed: refused, and not consumed.
  EXPECT_FAILS(tw_value_append(l, l), TW_ERR_INVALID_ARGUMENT, "itself");
  tw_value* self_dict = tw_value_dict();
  EXPECT_FAILS(tw_value_dict_set(self_dict, "k", 1, self_dict), TW_ERR_INVALID_ARGUMENT, "itself");
  tw_value_free(self_dict);
  tw_value_free(n);
  tw_value_free(l);
  tw_tensor_free(t);
}

TEST(CApi, PublishSubscribeWithStatusCodes) {
  const std::string name = topic("pubsub");
  tw_subscriber* s = nullptr;
  ASSERT_EQ(tw_subscriber_new(name.c_str(), nullptr, &s), TW_OK);
  tw_publisher_options po;
  tw_publisher_options_init(&po);
  EXPECT_EQ(po.depth, 8u);
  EXPECT_EQ(po.protect_sent_loans, 1);
  po.depth = 1;
  po.on_full = TW_ON_FULL_RAISE;
  po.protect_sent_loans = 0;
  tw_publisher* p = nullptr;
  ASSERT_EQ(tw_publisher_new(name.c_str(), &po, &p), TW_OK);

  tw_tensor* got = nullptr;
  EXPECT_EQ(tw_subscriber_recv(s, 1'000'000, &got), TW_ERR_TIMEOUT);  // also completes the connection
  EXPECT_EQ(got, nullptr);
  EXPECT_NE(std::string(tw_last_error()).find("no message on \"" + name + "\" within 1 ms"), std::string::npos)
      << tw_last_error();
  EXPECT_EQ(tw_publisher_subscriber_count(p), 1u);

  const int64_t shape[2] = {2, 3};
  tw_tensor* loan = nullptr;
  ASSERT_EQ(tw_publisher_loan(p, 2, shape, kF32, -1, &loan), TW_OK);
  EXPECT_EQ(tw_tensor_is_exclusive(loan), 1);
  float* d = static_cast<float*>(tw_tensor_data_borrowed(loan));
  for (int i = 0; i < 6; ++i) d[i] = static_cast<float>(i) * 1.5f;
  tw_value* extra = tw_value_dict();
  ASSERT_EQ(tw_value_dict_set(extra, "step", 4, tw_value_int(7)), TW_OK);
  size_t delivered = 0;
  ASSERT_EQ(tw_publisher_send_move(p, &loan, extra, -1, &delivered), TW_OK);
  EXPECT_EQ(loan, nullptr);  // consumed
  EXPECT_EQ(delivered, 1u);

  // The ring (depth 1) is full: under TW_ON_FULL_RAISE the next send would block, and the handle survives it.
  tw_tensor* other = nullptr;
  ASSERT_EQ(tw_tensor_zeros(2, shape, kF32, &other), TW_OK);
  EXPECT_FAILS(tw_publisher_send_move(p, &other, nullptr, -1, &delivered), TW_ERR_WOULD_BLOCK, "unread");
  EXPECT_NE(other, nullptr);
  EXPECT_EQ(delivered, 0u);

  ASSERT_EQ(tw_subscriber_recv(s, 5'000'000'000, &got), TW_OK);
  EXPECT_EQ(tw_tensor_readonly(got), 1);
  EXPECT_EQ(tw_tensor_shape(got)[1], 3);
  EXPECT_EQ(static_cast<const float*>(tw_tensor_data_borrowed(got))[5], 7.5f);
  tw_value* md = nullptr;
  ASSERT_EQ(tw_tensor_metadata(got, &md), TW_OK);
  int64_t step = 0;
  ASSERT_EQ(tw_value_get_int(tw_value_dict_get(md, "step", 4), &step), TW_OK);
  EXPECT_EQ(step, 7);
  tw_value_free(md);

  // A non-dict extra is refused before anything is sent.
  EXPECT_EQ(tw_publisher_send(p, other, extra, -1, &delivered), TW_OK);
  tw_value* bad = tw_value_int(3);
  EXPECT_FAILS(tw_publisher_send(p, other, bad, 0, &delivered), TW_ERR_TYPE_MISMATCH,
               "extra metadata must be a dict, not a int");
  tw_value_free(bad);
  tw_value_free(extra);
  tw_tensor_free(other);

  // A loan sent by reference is read by subscribers from now on: it never looks exclusive again (even with
  // protect_sent_loans off), and neither does another handle of a loan sent by move.
  tw_tensor* kept = nullptr;
  ASSERT_EQ(tw_publisher_loan(p, 2, shape, kF32, -1, &kept), TW_OK);
  tw_tensor* second = nullptr;
  ASSERT_EQ(tw_tensor_share(kept, &second), TW_OK);
  tw_tensor* msg = nullptr;
  ASSERT_EQ(tw_subscriber_recv(s, 5'000'000'000, &msg), TW_OK);  // make room (depth 1)
  tw_tensor_free(msg);
  ASSERT_EQ(tw_publisher_send_move(p, &second, nullptr, -1, &delivered), TW_OK);
  EXPECT_EQ(second, nullptr);
  EXPECT_EQ(tw_tensor_is_exclusive(kept), 0);
  tw_tensor_free(kept);
  ASSERT_EQ(tw_subscriber_recv(s, 5'000'000'000, &msg), TW_OK);
  tw_tensor_free(msg);
  ASSERT_EQ(tw_publisher_loan(p, 2, shape, kF32, -1, &kept), TW_OK);
  EXPECT_EQ(tw_tensor_is_exclusive(kept), 1);
  ASSERT_EQ(tw_publisher_send(p, kept, nullptr, -1, &delivered), TW_OK);
  EXPECT_EQ(tw_tensor_is_exclusive(kept), 0);
  // Zero-copy: the subscriber maps the loan's own memory (protect_sent_loans is off here, so the publisher can
  // still write it, and the subscriber sees the write).
  ASSERT_EQ(tw_subscriber_recv(s, 5'000'000'000, &msg), TW_OK);
  static_cast<float*>(tw_tensor_data(kept))[4] = 42.0f;
  EXPECT_EQ(static_cast<const float*>(tw_tensor_data_borrowed(msg))[4], 42.0f);
  tw_tensor_free(msg);
  tw_tensor_free(kept);

  // A send that fails (the ring is full under TW_ON_FULL_RAISE) leaves a kept loan exclusive: nobody reads it.
  tw_tensor* filler = nullptr;
  ASSERT_EQ(tw_tensor_zeros(2, shape, kF32, &filler), TW_OK);
  ASSERT_EQ(tw_publisher_send(p, filler, nullptr, -1, &delivered), TW_OK);
  tw_tensor_free(filler);
  ASSERT_EQ(tw_publisher_loan(p, 2, shape, kF32, -1, &kept), TW_OK);
  EXPECT_FAILS(tw_publisher_send(p, kept, nullptr, -1, &delivered), TW_ERR_WOULD_BLOCK, "unread");
  EXPECT_EQ(tw_tensor_is_exclusive(kept), 1);
  tw_tensor_free(kept);
  ASSERT_EQ(tw_subscriber_recv(s, 5'000'000'000, &msg), TW_OK);  // the filler
  tw_tensor_free(msg);

  ASSERT_EQ(tw_tensor_zeros(2, shape, kF32, &filler), TW_OK);
  ASSERT_EQ(tw_publisher_send(p, filler, nullptr, -1, &delivered), TW_OK);
  tw_tensor_free(filler);
  tw_publisher_free(p);  // closes: the subscriber drains, then sees end-of-stream
  tw_tensor* last = nullptr;
  ASSERT_EQ(tw_subscriber_recv(s, 5'000'000'000, &last), TW_OK);
  tw_tensor_free(last);
  EXPECT_FAILS(tw_subscriber_recv(s, 5'000'000'000, &last), TW_END_OF_STREAM, "closed the topic, and every message was received");
  EXPECT_EQ(last, nullptr);
  EXPECT_EQ(tw_subscriber_closed(s), 1);
  tw_subscriber_free(s);
  // Received tensors outlive both ends.
  EXPECT_EQ(static_cast<const float*>(tw_tensor_data_borrowed(got))[1], 1.5f);
  tw_tensor_free(got);
}

TEST(CApi, AMessageOfSeveralTensorsIsSkippedWithAnErrorSayingWhy) {
  const std::string name = topic("multi");
  tw_subscriber* s = nullptr;
  ASSERT_EQ(tw_subscriber_new(name.c_str(), nullptr, &s), TW_OK);
  tw::Publisher pub(name);  // a C++ (or Python) peer sends a dict of two tensors, then one tensor
  tw_tensor* got = nullptr;
  EXPECT_EQ(tw_subscriber_recv(s, 1'000'000, &got), TW_ERR_TIMEOUT);  // completes the connection
  tw::Message m;
  m.kind = tw::Message::Kind::dict;
  m.tensors = {tw::Tensor::zeros({2}, tw::DType::float32()), tw::Tensor::zeros({3}, tw::DType::float32())};
  m.keys = {"a", "b"};
  ASSERT_EQ(pub.send(m), 1u);
  ASSERT_EQ(pub.send(tw::Tensor::zeros({4}, tw::DType::float32())), 1u);
  EXPECT_FAILS(tw_subscriber_recv(s, 5'000'000'000, &got), TW_ERR_UNSUPPORTED,
               "a message of 2 tensors (sent as one dict, list or tuple)");
  EXPECT_EQ(got, nullptr);
  ASSERT_EQ(tw_subscriber_recv(s, 5'000'000'000, &got), TW_OK);  // the stream goes on
  EXPECT_EQ(tw_tensor_shape(got)[0], 4);
  tw_tensor_free(got);
  tw_subscriber_free(s);
}

// A subscriber, then a publisher, of `name` with default options, connected (the subscriber's first recv times out
// and completes the handshake).
void connect_pair(const std::string& name, tw_subscriber** s, tw_publisher** p) {
  ASSERT_EQ(tw_subscriber_new(name.c_str(), nullptr, s), TW_OK);
  ASSERT_EQ(tw_publisher_new(name.c_str(), nullptr, p), TW_OK);
  tw_tensor* got = nullptr;
  EXPECT_EQ(tw_subscriber_recv(*s, 1'000'000, &got), TW_ERR_TIMEOUT);
}

// Closing a subscriber discards what is queued for it: its end of stream says so, not "every message was
// received" (which it said).
TEST(CApi, ClosingASubscriberSaysHowManyQueuedMessagesItDiscarded) {
  tw_subscriber* s = nullptr;
  tw_publisher* p = nullptr;
  ASSERT_NO_FATAL_FAILURE(connect_pair(topic("closeq"), &s, &p));
  tw_tensor* got = nullptr;
  const int64_t shape[1] = {4};
  tw_tensor* x = nullptr;
  ASSERT_EQ(tw_tensor_zeros(1, shape, kF32, &x), TW_OK);
  size_t delivered = 0;
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(tw_publisher_send(p, x, nullptr, -1, &delivered), TW_OK) << tw_last_error();
    EXPECT_EQ(delivered, 1u);
  }
  ASSERT_EQ(tw_subscriber_recv(s, 5'000'000'000, &got), TW_OK);
  tw_tensor_free(got);
  got = nullptr;
  tw_subscriber_close(s);
  EXPECT_FAILS(tw_subscriber_recv(s, 1'000'000'000, &got), TW_END_OF_STREAM,
               "end of stream: this subscriber was closed with 2 unread messages queued; close() discarded them");
  EXPECT_EQ(std::string(tw_last_error()).find("every message was received"), std::string::npos) << tw_last_error();
  EXPECT_EQ(got, nullptr);
  tw_tensor_free(x);
  tw_publisher_free(p);
  tw_subscriber_free(s);
}

TEST(CApi, BadPublishSubscribeArguments) {
  tw_publisher* p = nullptr;
  EXPECT_EQ(tw_publisher_new("bad name!", nullptr, &p), TW_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  EXPECT_NE(std::string(tw_last_error()).find("bad name!"), std::string::npos);
  tw_publisher_options po;
  tw_publisher_options_init(&po);
  po.on_full = 9;
  EXPECT_EQ(tw_publisher_new(topic("bad").c_str(), &po, &p), TW_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tw_last_error()).find("on_full 9"), std::string::npos);
  tw_publisher_options_init(&po);
  po.struct_size = 7;
  EXPECT_EQ(tw_publisher_new(topic("bad").c_str(), &po, &p), TW_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tw_last_error()).find("tw_publisher_options_init"), std::string::npos);
  EXPECT_FAILS(tw_publisher_new(nullptr, nullptr, &p), TW_ERR_INVALID_ARGUMENT, "name is NULL");
  EXPECT_FAILS(tw_subscriber_recv(nullptr, 0, nullptr), TW_ERR_INVALID_ARGUMENT, "subscriber is NULL");
  EXPECT_FAILS(tw_publisher_send_move(nullptr, nullptr, nullptr, 0, nullptr), TW_ERR_INVALID_ARGUMENT,
               "publisher is NULL");
  tw_publisher_free(nullptr);
  tw_subscriber_free(nullptr);
  EXPECT_EQ(tw_subscriber_fileno(nullptr), -1);
}

}  // namespace

namespace {
TEST(CApiCuda, StatusDevicesAndMovesBetweenDevices) {
  const size_t n = tw_cuda_status(nullptr, 0);
  EXPECT_GT(n, 0u);  // a description or a reason, never empty
  std::string buf(n + 1, 'x');
  EXPECT_EQ(tw_cuda_status(buf.data(), buf.size()), n);
  EXPECT_EQ(buf[n], '\0');
  char small[4];
  EXPECT_EQ(tw_cuda_status(small, sizeof small), n);  // truncated, still terminated
  EXPECT_EQ(small[3], '\0');
  const int64_t shape[1] = {4};
  const DLDataType f32{kDLFloat, 32, 1};
  tw_tensor* t = nullptr;
  ASSERT_EQ(tw_tensor_zeros(1, shape, f32, &t), TW_OK);
  EXPECT_EQ(tw_tensor_stream(t), 0);
  tw_tensor* same = nullptr;
  ASSERT_EQ(tw_tensor_to(t, DLDevice{kDLCPU, 0}, 0, TW_COPY_NEVER, &same), TW_OK);
  EXPECT_EQ(tw_tensor_data_borrowed(same), tw_tensor_data_borrowed(t));
  tw_tensor* copied = nullptr;
  ASSERT_EQ(tw_tensor_to(t, DLDevice{kDLCPU, 0}, 0, TW_COPY_ALWAYS, &copied), TW_OK);
  EXPECT_NE(tw_tensor_data_borrowed(copied), tw_tensor_data_borrowed(t));
  tw_tensor* bad = nullptr;
  EXPECT_EQ(tw_tensor_to(t, DLDevice{kDLCPU, 0}, 0, 7, &bad), TW_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(bad, nullptr);
  EXPECT_EQ(tw_tensor_to(t, DLDevice{kDLCUDA, 0}, 0, TW_COPY_NEVER, &bad), TW_ERR_COPY_REQUIRED);
  if (!tw_cuda_is_available()) {
    EXPECT_EQ(tw_cuda_device_count(), 0);
    EXPECT_EQ(tw_tensor_to(t, DLDevice{kDLCUDA, 0}, 0, TW_COPY_IF_NEEDED, &bad), TW_ERR_DEVICE_UNAVAILABLE);
    EXPECT_EQ(tw_tensor_pin(t, &bad), TW_ERR_DEVICE_UNAVAILABLE);
    EXPECT_EQ(tw_tensor_empty_on(1, shape, f32, DLDevice{kDLCUDA, 0}, &bad), TW_ERR_DEVICE_UNAVAILABLE);
    EXPECT_EQ(bad, nullptr);
  } else {
    tw_tensor* g = nullptr;
    ASSERT_EQ(tw_tensor_to(t, DLDevice{kDLCUDA, 0}, 0, TW_COPY_IF_NEEDED, &g), TW_OK);
    EXPECT_EQ(tw_tensor_device(g).device_type, kDLCUDA);
    EXPECT_EQ(tw_tensor_stream(g), 1);
    tw_tensor_free(g);
  }
  tw_tensor* e = nullptr;
  ASSERT_EQ(tw_tensor_empty_on(1, shape, f32, DLDevice{kDLCPU, 0}, &e), TW_OK);
  EXPECT_EQ(tw_tensor_numel(e), 4);
  for (tw_tensor* x : {t, same, copied, e}) tw_tensor_free(x);
}
}  // namespace

namespace {

TEST(CApi, SendOptionsAndLoansOnADevice) {
  tw_send_options so;
  tw_send_options_init(&so);
  EXPECT_EQ(so.struct_size, sizeof so);
  EXPECT_EQ(so.copy, TW_COPY_IF_NEEDED);
  EXPECT_EQ(so.timeout_ns, -1);
  EXPECT_EQ(so.extra, nullptr);
  EXPECT_EQ(so.stream, 0);

  tw_subscriber* s = nullptr;
  tw_publisher* p = nullptr;
  ASSERT_NO_FATAL_FAILURE(connect_pair(topic("sendwith"), &s, &p));
  tw_tensor* got = nullptr;

  // A host tensor that is not a loan has no zero-copy way: TW_COPY_NEVER refuses it, naming why; nothing is sent.
  const int64_t shape[2] = {3, 4};
  tw_tensor* x = nullptr;
  ASSERT_EQ(tw_tensor_zeros(2, shape, kF32, &x), TW_OK);
  for (int i = 0; i < 12; ++i) static_cast<float*>(tw_tensor_data_borrowed(x))[i] = static_cast<float>(i);
  tw_tensor* cols = nullptr;
  ASSERT_EQ(tw_tensor_slice(x, 1, 0, 4, 2, &cols), TW_OK);  // every other column: strides (4, 2)
  size_t delivered = 7;
  so.copy = TW_COPY_NEVER;
  EXPECT_FAILS(tw_publisher_send_with(p, cols, &so, &delivered), TW_ERR_COPY_REQUIRED,
               "not in the publisher's pool (only a loan() crosses host memory without a copy)");
  EXPECT_EQ(delivered, 0u);
  so.copy = 9;
  EXPECT_FAILS(tw_publisher_send_with(p, cols, &so, &delivered), TW_ERR_INVALID_ARGUMENT, "copy mode 9");
  so.copy = TW_COPY_IF_NEEDED;
  so.stream = 5;  // a stream for a host tensor is a mistake, not something to ignore
  EXPECT_FAILS(tw_publisher_send_with(p, cols, &so, &delivered), TW_ERR_INVALID_ARGUMENT,
               "stream= orders CUDA work, but the tensor is in host memory");
  so.stream = 0;
  tw_value* extra = tw_value_dict();
  ASSERT_EQ(tw_value_dict_set(extra, "ts", 2, tw_value_float(1.5)), TW_OK);
  so.extra = extra;
  so.copy = TW_COPY_ALWAYS;
  so.timeout_ns = 5'000'000'000;
  ASSERT_EQ(tw_publisher_send_with(p, cols, &so, &delivered), TW_OK) << tw_last_error();
  EXPECT_EQ(delivered, 1u);
  ASSERT_EQ(tw_subscriber_recv(s, 5'000'000'000, &got), TW_OK);
  EXPECT_EQ(tw_tensor_shape(got)[0], 3);
  EXPECT_EQ(tw_tensor_shape(got)[1], 2);
  tw_tensor* dense = nullptr;
  ASSERT_EQ(tw_tensor_contiguous(got, &dense), TW_OK);
  const float* v = static_cast<const float*>(tw_tensor_data_borrowed(dense));
  const float want[6] = {0, 2, 4, 6, 8, 10};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(v[i], want[i]) << i;
  tw_value* md = nullptr;
  ASSERT_EQ(tw_tensor_metadata(got, &md), TW_OK);
  double ts = 0;
  ASSERT_EQ(tw_value_get_float(tw_value_dict_get(md, "ts", 2), &ts), TW_OK);
  EXPECT_EQ(ts, 1.5);
  tw_value_free(md);
  tw_tensor_free(dense);
  tw_tensor_free(got);
  // NULL options: the defaults.
  ASSERT_EQ(tw_publisher_send_with(p, cols, nullptr, &delivered), TW_OK);
  ASSERT_EQ(tw_subscriber_recv(s, 5'000'000'000, &got), TW_OK);
  tw_tensor_free(got);
  // A struct smaller than any the library shipped is refused.
  so.struct_size = 8;
  EXPECT_FAILS(tw_publisher_send_with(p, cols, &so, &delivered), TW_ERR_INVALID_ARGUMENT,
               "tw_send_options.struct_size is 8");

  // Loans on a device: the cpu is tw_publisher_loan; a CUDA loan needs a driver and a GPU (an error naming why
  // on this machine, a device buffer on one with a GPU).
  const int64_t n[1] = {16};
  tw_tensor* loan = nullptr;
  ASSERT_EQ(tw_publisher_loan_on(p, 1, n, kF32, kCpu, -1, &loan), TW_OK);
  EXPECT_EQ(tw_tensor_is_exclusive(loan), 1);
  EXPECT_EQ(tw_tensor_device(loan).device_type, kDLCPU);
  tw_tensor_free(loan);
  loan = nullptr;
  const tw_status st = tw_publisher_loan_on(p, 1, n, kF32, DLDevice{kDLCUDA, 0}, 1'000'000'000, &loan);
  if (tw_cuda_is_available()) {
    ASSERT_EQ(st, TW_OK) << tw_last_error();
    EXPECT_EQ(tw_tensor_device(loan).device_type, kDLCUDA);
    tw_tensor_free(loan);
  } else {
    EXPECT_EQ(st, TW_ERR_DEVICE_UNAVAILABLE) << tw_last_error();
    EXPECT_EQ(loan, nullptr);
    EXPECT_NE(std::string(tw_last_error()).find("loan on cuda:0"), std::string::npos) << tw_last_error();
  }
  EXPECT_EQ(tw_publisher_address(p, nullptr, 0), 0u) << "no listen: no address";

  tw_value_free(extra);
  tw_tensor_free(cols);
  tw_tensor_free(x);
  tw_publisher_free(p);
  tw_subscriber_free(s);
}

TEST(CApi, SubscriberOnADeviceAndBadDevices) {
  tw_subscriber_options so;
  tw_subscriber_options_init(&so);
  EXPECT_EQ(so.connect, nullptr);
  EXPECT_EQ(so.has_device, 0);
  EXPECT_EQ(so.device.device_type, kDLCPU);
  const std::string name = topic("subdev");
  so.has_device = 1;
  so.device = DLDevice{static_cast<DLDeviceType>(999), 0};
  tw_subscriber* s = nullptr;
  EXPECT_FAILS(tw_subscriber_new(name.c_str(), &so, &s), TW_ERR_UNSUPPORTED, "999");
  EXPECT_EQ(s, nullptr);
  so.device = kCpu;  // host tensors are already there: received as they are
  ASSERT_EQ(tw_subscriber_new(name.c_str(), &so, &s), TW_OK) << tw_last_error();
  tw_publisher* p = nullptr;
  ASSERT_EQ(tw_publisher_new(name.c_str(), nullptr, &p), TW_OK);
  tw_tensor* got = nullptr;
  EXPECT_EQ(tw_subscriber_recv(s, 1'000'000, &got), TW_ERR_TIMEOUT);
  const int64_t shape[1] = {4};
  tw_tensor* loan = nullptr;
  ASSERT_EQ(tw_publisher_loan(p, 1, shape, kF32, -1, &loan), TW_OK);
  static_cast<float*>(tw_tensor_data_borrowed(loan))[3] = 42.0f;
  ASSERT_EQ(tw_publisher_send_move(p, &loan, nullptr, -1, nullptr), TW_OK);
  ASSERT_EQ(tw_subscriber_recv(s, 5'000'000'000, &got), TW_OK);
  EXPECT_EQ(tw_tensor_device(got).device_type, kDLCPU);
  EXPECT_EQ(static_cast<const float*>(tw_tensor_data_borrowed(got))[3], 42.0f);
  EXPECT_STREQ(tw_tensor_transport(got), "shm");  // a loan: no copy
  tw_tensor_free(got);
  // A tensor of the caller's own memory is packed into the pool with one copy, and says so.
  tw_tensor* mine = nullptr;
  ASSERT_EQ(tw_tensor_empty(1, shape, kF32, &mine), TW_OK) << tw_last_error();
  EXPECT_STREQ(tw_tensor_transport(mine), "") << "made by no transport";
  ASSERT_EQ(tw_publisher_send(p, mine, nullptr, -1, nullptr), TW_OK) << tw_last_error();
  ASSERT_EQ(tw_subscriber_recv(s, 5'000'000'000, &got), TW_OK);
  EXPECT_STREQ(tw_tensor_transport(got), "shm-copy");
  EXPECT_STREQ(tw_tensor_transport(nullptr), "");
  tw_tensor_free(got);
  tw_tensor_free(mine);
  tw_publisher_free(p);
  tw_subscriber_free(s);
}

TEST(CApi, TheUcxInUseIsNamedAndAPreferenceAfterLoadingIsRefused) {
  char reason[512];
  const size_t why = tw_ucx_unavailable_reason(reason, sizeof reason);
  EXPECT_EQ(why, std::strlen(reason));
  if (why != 0) GTEST_SKIP() << "UCX cannot run here: " << reason;
  const size_t n = tw_ucx_library(nullptr, 0);
  ASSERT_GT(n, 0u);
  std::string lib(n, '\0');
  EXPECT_EQ(tw_ucx_library(lib.data(), n + 1), n);
  EXPECT_EQ(lib, tw::net::ucx_library());
  char version[4];  // too small for "1.13.1": truncated, NUL-terminated, the full length returned
  const size_t vn = tw_ucx_version(version, sizeof version);
  EXPECT_EQ(vn, tw::net::ucx_version().size());
  EXPECT_EQ(std::string(version), tw::net::ucx_version().substr(0, sizeof version - 1));
  EXPECT_EQ(tw_prefer_ucx_library("/nonexistent/libucp.so.0"), 0);  // UCX is loaded: too late
  EXPECT_EQ(tw_prefer_ucx_library(nullptr), 0);
}

TEST(CApi, RemotePublishSubscribeOverLoopback) {
  if (const std::string why = tw::net_detail::ucx_unavailable_reason(); !why.empty())
    GTEST_SKIP() << "UCX cannot run here: " << why;
  const std::string name = topic("remote");
  tw_publisher_options po;
  tw_publisher_options_init(&po);
  EXPECT_EQ(po.listen, nullptr);
  EXPECT_EQ(po.insecure, 0);
  po.listen = "0.0.0.0:0";  // reachable from other machines: refused without a token or insecure
  tw_publisher* p = nullptr;
  EXPECT_FAILS(tw_publisher_new(name.c_str(), &po, &p), TW_ERR_INVALID_ARGUMENT, "token");
  EXPECT_EQ(p, nullptr);
  po.listen = ":0";  // loopback only, any free port
  po.token = "s3cret";
  ASSERT_EQ(tw_publisher_new(name.c_str(), &po, &p), TW_OK) << tw_last_error();
  const size_t len = tw_publisher_address(p, nullptr, 0);
  ASSERT_GT(len, 0u);
  std::string addr(len, '\0');
  ASSERT_EQ(tw_publisher_address(p, addr.data(), len + 1), len);
  EXPECT_EQ(addr.rfind("127.0.0.1:", 0), 0u) << addr;
  char tiny[4];
  EXPECT_EQ(tw_publisher_address(p, tiny, sizeof tiny), len);  // truncated, NUL-terminated
  EXPECT_EQ(std::strlen(tiny), 3u);

  tw_subscriber_options so;
  tw_subscriber_options_init(&so);
  so.connect = addr.c_str();
  so.token = "s3cret";
  tw_subscriber* s = nullptr;
  ASSERT_EQ(tw_subscriber_new(name.c_str(), &so, &s), TW_OK) << tw_last_error();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (tw_publisher_subscriber_count(p) < 1 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(tw_publisher_subscriber_count(p), 1u);

  const int64_t shape[2] = {4, 6};
  tw_tensor* x = nullptr;
  ASSERT_EQ(tw_tensor_zeros(2, shape, kF32, &x), TW_OK);
  for (int i = 0; i < 24; ++i) static_cast<float*>(tw_tensor_data_borrowed(x))[i] = static_cast<float>(i);
  tw_tensor* view = nullptr;
  ASSERT_EQ(tw_tensor_slice(x, 1, 1, 6, 2, &view), TW_OK);  // columns 1, 3, 5
  tw_value* extra = tw_value_dict();
  ASSERT_EQ(tw_value_dict_set(extra, "ts", 2, tw_value_float(1.5)), TW_OK);
  tw_send_options o;
  tw_send_options_init(&o);
  o.extra = extra;
  size_t delivered = 0;
  ASSERT_EQ(tw_publisher_send_with(p, view, &o, &delivered), TW_OK) << tw_last_error();
  EXPECT_EQ(delivered, 1u);
  tw_tensor* got = nullptr;
  ASSERT_EQ(tw_subscriber_recv(s, 10'000'000'000, &got), TW_OK) << tw_last_error();
  ASSERT_EQ(tw_tensor_ndim(got), 2);
  EXPECT_EQ(tw_tensor_shape(got)[0], 4);
  EXPECT_EQ(tw_tensor_shape(got)[1], 3);
  tw_tensor* dense = nullptr;
  ASSERT_EQ(tw_tensor_contiguous(got, &dense), TW_OK);
  const float* v = static_cast<const float*>(tw_tensor_data_borrowed(dense));
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(v[r * 3 + c], static_cast<float>(r * 6 + 1 + 2 * c));
  tw_value* md = nullptr;
  ASSERT_EQ(tw_tensor_metadata(got, &md), TW_OK);
  double ts = 0;
  ASSERT_EQ(tw_value_get_float(tw_value_dict_get(md, "ts", 2), &ts), TW_OK);
  EXPECT_EQ(ts, 1.5);
  tw_value_free(md);
  tw_tensor_free(dense);
  tw_tensor_free(got);
  tw_value_free(extra);
  tw_tensor_free(view);
  tw_tensor_free(x);
  tw_publisher_close(p);
  EXPECT_EQ(tw_subscriber_recv(s, 10'000'000'000, &got), TW_END_OF_STREAM) << tw_last_error();
  tw_publisher_free(p);
  tw_subscriber_free(s);
}

}  // namespace
