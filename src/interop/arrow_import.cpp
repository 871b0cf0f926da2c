// Arrow interop, part 3 of 3: producers' Arrow arrays as tensors, validated once (tensorwire/arrow.hpp).
#include "tensorwire/arrow.hpp"

#include <algorithm>
#include <cstring>
#include <memory>

#include "arrow_internal.hpp"
#include "core/checked.hpp"
#include "core/text.hpp"
#include "tensorwire/copy.hpp"
#include "tensorwire/device_runtime.hpp"

namespace tw {

using namespace arrow_detail;
using detail::add;
using detail::mul;

namespace {

// Owns a moved ArrowArray: the producer's release callback runs exactly once, when the last view is gone.
struct ImportedArray {
  ArrowArray array{};
  ImportedArray() = default;
  ImportedArray(const ImportedArray&) = delete;
  ImportedArray& operator=(const ImportedArray&) = delete;
  ~ImportedArray() {
    if (array.release) array.release(&array);
  }
};

std::shared_ptr<ImportedArray> take_array(ArrowArray* src) {
  if (!src) throw Error(ErrorCode::invalid_argument, "from_arrow: null ArrowArray");
  if (!src->release)
    throw Error(ErrorCode::invalid_argument, "from_arrow: the ArrowArray is released (its release callback is NULL): "
                                             "it was consumed or moved already");
  std::shared_ptr<ImportedArray> owner;
  try {
    owner = std::make_shared<ImportedArray>();
  } catch (...) {
    src->release(src);
    throw;
  }
  owner->array = *src;  // the move of the C Data Interface: bitwise copy, then mark the source released
  src->release = nullptr;
  return owner;
}

// Releases a schema the import owns; the NULL store guards against producers that forget to mark it released.
struct SchemaGuard {
  ArrowSchema* s;
  void release() {
    if (s && s->release) {
      s->release(s);
      s->release = nullptr;
    }
  }
  ~SchemaGuard() { release(); }
};

struct ImportCtx {
  std::shared_ptr<const void> keep;
  Device device = Device::cpu();
  bool host = true;
  std::optional<bool> copy;
};

void check_node(const ArrowArray& a, int64_t n_buffers, int64_t n_children, const std::string& where) {
  if (!a.release) malformed(where, "the array is released (its release callback is NULL)");
  if (a.length < 0) malformed(where, "negative length " + std::to_string(a.length));
  if (a.offset < 0) malformed(where, "negative offset " + std::to_string(a.offset));
  if (a.null_count < -1) malformed(where, "invalid null_count " + std::to_string(a.null_count));
  add(a.offset, a.length, "the array's offset plus length");
  if (a.n_buffers != n_buffers)
    malformed(where, "n_buffers is " + std::to_string(a.n_buffers) + " but the type has " +
                         tw::detail::counted(int64_t(n_buffers), "buffer"));
  if (n_buffers > 0 && !a.buffers) malformed(where, "buffers is NULL");
  if (a.n_children != n_children)
    malformed(where, "n_children is " + std::to_string(a.n_children) + " but the type has " +
                         std::to_string(n_children));
  if (n_children > 0 && !a.children) malformed(where, "children is NULL");
  for (int64_t i = 0; i < n_children; ++i)
    if (!a.children[i]) malformed(where, "child " + std::to_string(i) + " is NULL");
  if (a.dictionary) malformed(where, "a dictionary array is attached to a type without one");
}

void check_range(const ArrowArray& a, int64_t first, int64_t count, const std::string& where) {
  if (add(first, count, "a row range") > a.length)
    malformed(where, "needs slots [" + std::to_string(first) + ", " + std::to_string(first + count) +
                         ") but the array's length is " + std::to_string(a.length));
}

// Slots [a.offset + first, + count) must all be valid.
void check_no_nulls(const ArrowArray& a, int64_t first, int64_t count, const ImportCtx& ctx, const std::string& where) {
  if (count == 0 || a.null_count == 0) return;
  const auto* bitmap = static_cast<const uint8_t*>(a.buffers[0]);
  if (!bitmap) {
    if (a.null_count > 0)
      malformed(where, "null_count is " + std::to_string(a.null_count) + " but the validity bitmap is NULL");
    return;
  }
  if (!ctx.host)
    unsupported(where, "the array may hold nulls and its validity bitmap is in " + ctx.device.str() +
                           " memory, which the host cannot check; tensors cannot hold nulls");
  const int64_t begin = a.offset + first, end = begin + count;
  for (int64_t i = begin; i < end;) {
    if ((i & 7) == 0 && end - i >= 8) {
      if (bitmap[i >> 3] != 0xFF) {
        for (int64_t k = i; k < i + 8; ++k)
          if (!((bitmap[k >> 3] >> (k & 7)) & 1))
            malformed(where, "slot " + std::to_string(k - a.offset) + " is null; tensors cannot hold nulls (fill or "
                                                                      "drop them first)");
      }
      i += 8;
      continue;
    }
    if (!((bitmap[i >> 3] >> (i & 7)) & 1))
      malformed(where, "slot " + std::to_string(i - a.offset) + " is null; tensors cannot hold nulls (fill or drop "
                                                               "them first)");
    ++i;
  }
}

// A value array's slots [first, first + count): validated; returns the address of slot `first` (bit-packed
// booleans: of its byte, with the bit index in `bit`).
const char* value_slots(const ArrowArray& a, const ArrowTensorType& t, int64_t first, int64_t count,
                        const ImportCtx& ctx, const std::string& where, int64_t* bit = nullptr) {
  check_node(a, 2, 0, where);
  check_range(a, first, count, where);
  check_no_nulls(a, first, count, ctx, where);
  const auto* base = static_cast<const char*>(a.buffers[1]);
  if (count == 0) return base;
  if (!base) malformed(where, "the data buffer is NULL for " + std::to_string(count) + " values");
  const int64_t slot = a.offset + first;
  if (t.bit_packed) {
    *bit = slot & 7;
    return base + (slot >> 3);
  }
  return base + mul(slot, static_cast<int64_t>(t.dtype.itemsize()), "the data offset");
}

// Bytes of arrow.bool8 values are any non-zero for true; tensorwire's bool is 0 or 1.
bool bytes_are_01(const char* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (static_cast<unsigned char>(p[i]) > 1) return false;
  return true;
}

Tensor values_tensor(const char* p, int64_t bit, int64_t n, const ArrowTensorType& t, const ImportCtx& ctx,
                     const std::string& where) {
  if (t.bit_packed) {
    if (ctx.copy == false)
      throw Error(ErrorCode::copy_required, "Arrow " + where + ": Arrow booleans are bit-packed; unpacking them "
                                            "into a bool tensor is a copy, which copy=False forbids (arrow.bool8 "
                                            "imports without one)");
    if (!ctx.host) unsupported(where, "bit-packed booleans in " + ctx.device.str() + " memory cannot be unpacked");
    Tensor out = Tensor::empty(Shape(n), DType::boolean());
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    const auto* src = reinterpret_cast<const uint8_t*>(p);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = bit + i;
      dst[i] = (src[b >> 3] >> (b & 7)) & 1;
    }
    return out;
  }
  Tensor v = Tensor::from_blob(const_cast<char*>(p), Shape(n), t.dtype, ctx.device, ctx.keep, {}, true);
  if (t.bool8 && ctx.host && n > 0 && !bytes_are_01(p, n)) {
    if (ctx.copy == false)
      throw Error(ErrorCode::copy_required, "Arrow " + where + ": arrow.bool8 values other than 0 and 1 must be "
                                            "normalised into a copy, which copy=False forbids");
    Tensor out = Tensor::empty(Shape(n), DType::boolean());
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    for (int64_t i = 0; i < n; ++i) dst[i] = p[i] != 0;
    return out;
  }
  return v;
}

// Reshapes a flat tensor of rows * prod(shape) elements into (rows, *logical), zero-copy (strided for a permutation).
// One Tensor::make over the flat tensor's buffer (no intermediate views: this is the per-import fast path).
Tensor shape_rows(const Tensor& flat, int64_t rows, const std::vector<int64_t>& phys, const std::vector<int64_t>& perm,
                  bool with_rows) {
  const size_t lead = with_rows ? 1 : 0, n = lead + phys.size();
  std::vector<int64_t> pshape(n), pstrides(n);
  if (with_rows) pshape[0] = rows;
  std::copy(phys.begin(), phys.end(), pshape.begin() + static_cast<std::ptrdiff_t>(lead));
  int64_t st = 1;
  for (size_t k = n; k-- > 0;) {
    pstrides[k] = st;
    st *= pshape[k];
  }
  Layout l{flat.dtype(), {}, {}, flat.byte_offset(), false};
  if (perm.empty()) {
    l.shape = Shape(pshape);
    l.strides = Strides(pstrides);
  } else {
    std::vector<int64_t> lshape(n), lstrides(n);
    if (with_rows) {
      lshape[0] = pshape[0];
      lstrides[0] = pstrides[0];
    }
    for (size_t i = 0; i < perm.size(); ++i) {
      lshape[lead + i] = pshape[lead + size_t(perm[i])];
      lstrides[lead + i] = pstrides[lead + size_t(perm[i])];
    }
    l.shape = Shape(lshape);
    l.strides = Strides(lstrides);
  }
  return Tensor::make(flat.buffer_ptr(), std::move(l), flat.readonly());
}

Tensor import_batch(const ArrowTensorType& t, const ArrowArray& a, int64_t first, int64_t rows, const ImportCtx& ctx,
                    const std::string& where) {
  if (t.kind == ArrowTensorType::Kind::primitive) {
    int64_t bit = 0;
    const char* p = value_slots(a, t, first, rows, ctx, where, &bit);
    return values_tensor(p, bit, rows, t, ctx, where);
  }
  // FixedSizeList (with or without the fixed_shape_tensor extension).
  check_node(a, 1, 1, where);
  check_range(a, first, rows, where);
  check_no_nulls(a, first, rows, ctx, where);
  int64_t n = 1;
  for (int64_t d : t.shape) n = mul(n, d, "the list size");
  const int64_t start = mul(add(a.offset, first, "a row index"), n, "the first value index");
  const int64_t count = mul(rows, n, "the value count");
  int64_t bit = 0;
  const std::string vwhere = where + " values";
  const char* p = value_slots(*a.children[0], t, start, count, ctx, vwhere, &bit);
  Tensor flat = values_tensor(p, bit, count, t, ctx, vwhere);
  return shape_rows(flat, rows, t.shape, t.permutation, true);
}

int64_t read_offset(const void* buf, bool large, int64_t i) {
  if (large) return static_cast<const int64_t*>(buf)[i];
  return static_cast<const int32_t*>(buf)[i];
}

std::vector<Tensor> import_list(const ArrowTensorType& t, const ArrowArray& a, int64_t first, int64_t rows,
                                const ImportCtx& ctx, const std::string& where) {
  check_node(a, 1, 2, where);
  check_range(a, first, rows, where);
  check_no_nulls(a, first, rows, ctx, where);
  if (rows > 0 && !ctx.host)
    unsupported(where, "arrow.variable_shape_tensor offsets and shapes in " + ctx.device.str() +
                           " memory cannot be read by the host");
  const int64_t srow = add(a.offset, first, "a row index");  // row index in the children
  const ArrowArray& data = *a.children[0];
  const ArrowArray& shape = *a.children[1];
  const std::string dwhere = where + " 'data'", swhere = where + " 'shape'";
  check_node(data, 2, 1, dwhere);
  check_range(data, srow, rows, dwhere);
  check_no_nulls(data, srow, rows, ctx, dwhere);
  check_node(shape, 1, 1, swhere);
  check_range(shape, srow, rows, swhere);
  check_no_nulls(shape, srow, rows, ctx, swhere);
  std::vector<Tensor> out;
  if (rows == 0) return out;
  const int64_t ndim = t.ndim;
  // Shapes: int32 values of the shape list's rows.
  ArrowTensorType i32;
  i32.dtype = DType::int32();
  const int64_t sstart = mul(add(shape.offset, srow, "a row index"), ndim, "the first shape value");
  const auto* shapes = reinterpret_cast<const int32_t*>(
      value_slots(*shape.children[0], i32, sstart, mul(rows, ndim, "the shape value count"), ctx, swhere + " values"));
  // Offsets: rows + 1 entries from slot data.offset + srow.
  if (!data.buffers[1]) malformed(dwhere, "the offsets buffer is NULL");
  const int64_t o0 = add(data.offset, srow, "an offset index");
  std::vector<int64_t> offs(static_cast<size_t>(rows) + 1);
  for (int64_t i = 0; i <= rows; ++i) {
    offs[size_t(i)] = read_offset(data.buffers[1], t.large_list, o0 + i);
    if (offs[size_t(i)] < 0) malformed(dwhere, "offset " + std::to_string(o0 + i) + " is negative");
    if (i > 0 && offs[size_t(i)] < offs[size_t(i) - 1])
      malformed(dwhere, "offsets decrease at row " + std::to_string(first + i - 1));
  }
  const int64_t vfirst = offs[0], vcount = offs[size_t(rows)] - offs[0];
  int64_t bit = 0;
  const std::string vwhere = dwhere + " values";
  const char* base = value_slots(*data.children[0], t, vfirst, vcount, ctx, vwhere, &bit);
  Tensor flat = values_tensor(base, bit, vcount, t, ctx, vwhere);
  out.reserve(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> phys(static_cast<size_t>(ndim));
    int64_t n = 1;
    for (int64_t k = 0; k < ndim; ++k) {
      const int32_t d = shapes[r * ndim + k];
      if (d < 0) malformed(swhere, "row " + std::to_string(first + r) + " has a negative size " + std::to_string(d));
      if (!t.uniform_shape.empty() && t.uniform_shape[size_t(k)] && *t.uniform_shape[size_t(k)] != d)
        malformed(swhere, "row " + std::to_string(first + r) + " has size " + std::to_string(d) + " in dimension " +
                              std::to_string(k) + " which uniform_shape fixes at " +
                              std::to_string(*t.uniform_shape[size_t(k)]));
      phys[size_t(k)] = d;
      n = mul(n, d, "a row's element count");
    }
    const int64_t len = offs[size_t(r) + 1] - offs[size_t(r)];
    if (n != len)
      malformed(where, "row " + std::to_string(first + r) + ": shape holds " + std::to_string(n) +
                           " elements but its data list holds " + std::to_string(len));
    Tensor row = flat.slice(0, offs[size_t(r)] - vfirst, offs[size_t(r) + 1] - vfirst);
    out.push_back(shape_rows(row, 1, phys, t.permutation, false));
  }
  return out;
}

void finish_tensor(Tensor& x, const ArrowTensorType& t, bool force_copy) {
  if (force_copy) {
    if (!x.device().is_host_accessible())
      throw Error(ErrorCode::unsupported, "from_arrow: copy=True for memory on " + x.device().str() +
                                              ": the host copy engine cannot copy it");
    x = x.copy(MemoryOrder::C);
  }
  if (t.metadata) x.metadata() = *t.metadata;
}

ArrowColumn import_column(const ArrowTensorType& t, const ArrowArray& a, int64_t first, int64_t rows,
                          const ImportCtx& ctx, const std::string& where, bool force_copy) {
  ArrowColumn c;
  c.name = t.name;
  c.dim_names = t.logical_dim_names();
  if (t.kind == ArrowTensorType::Kind::variable_shape) {
    c.variable_shape = true;
    c.tensors = import_list(t, a, first, rows, ctx, where);
  } else {
    c.tensors.push_back(import_batch(t, a, first, rows, ctx, where));
  }
  for (Tensor& x : c.tensors) finish_tensor(x, t, force_copy);
  return c;
}

std::vector<ArrowColumn> import_all(const ArrowTensorType& t, const ArrowArray& a, const ImportCtx& ctx,
                                    bool force_copy) {
  std::vector<ArrowColumn> out;
  if (t.kind != ArrowTensorType::Kind::record_batch) {
    check_range(a, 0, a.length, "array");
    out.push_back(import_column(t, a, 0, a.length, ctx, "array", force_copy));
    return out;
  }
  const std::string where = "record batch";
  check_node(a, 1, static_cast<int64_t>(t.columns.size()), where);
  check_no_nulls(a, 0, a.length, ctx, where);
  for (size_t i = 0; i < t.columns.size(); ++i) {
    const std::string cw = "column " + std::to_string(i) + (t.columns[i].name.empty() ? "" : " '" + t.columns[i].name + "'");
    out.push_back(import_column(t.columns[i], *a.children[i], a.offset, a.length, ctx, cw, force_copy));
  }
  return out;
}

Device device_of(const ArrowDeviceArray& d) {
  // Arrow C++ (PyArrow) writes device_id -1 for CPU memory, which has one device.
  if (d.device_type == ARROW_DEVICE_CPU && d.device_id == -1) return Device::cpu();
  if (d.device_id < 0 || d.device_id > kInt32Max)
    throw Error(ErrorCode::invalid_argument, "from_arrow: device_id " + std::to_string(d.device_id) + " is invalid");
  return Device::from_dlpack(DLDevice{static_cast<DLDeviceType>(d.device_type), static_cast<int32_t>(d.device_id)});
}

ArrowColumns columns_from(ArrowSchema* schema, const std::shared_ptr<ImportedArray>& owner, Device dev,
                          const ArrowImportOptions& options) {
  SchemaGuard guard{schema};
  if (!schema) throw Error(ErrorCode::invalid_argument, "from_arrow: null ArrowSchema");
  ArrowTensorType t = parse_arrow_schema(*schema);
  guard.release();  // parsed: the schema is no longer needed
  ImportCtx ctx;
  ctx.keep = owner;
  ctx.device = dev;
  ctx.host = dev.is_host_accessible();
  ctx.copy = options.copy;
  ArrowColumns out;
  out.record_batch = t.kind == ArrowTensorType::Kind::record_batch;
  out.columns = import_all(t, owner->array, ctx, options.copy == true);
  return out;
}

Tensor single_tensor(ArrowColumns all) {
  std::vector<ArrowColumn>& cols = all.columns;
  if (all.record_batch)
    throw Error(ErrorCode::unsupported, "from_arrow: a record batch of " + std::to_string(cols.size()) +
                                            " columns is not one tensor; use from_arrow_columns (Python: "
                                            "tw.from_arrow, which returns a dict of columns)");
  if (cols[0].variable_shape)
    throw Error(ErrorCode::unsupported, "from_arrow: an arrow.variable_shape_tensor array holds tensors of different "
                                        "shapes, not one tensor; use from_arrow_columns (Python: tw.from_arrow, "
                                        "which returns a list of tensors)");
  return std::move(cols[0].tensors[0]);
}

Tensor empty_batch(const ArrowTensorType& t) {
  std::vector<int64_t> dims{0};
  if (t.kind != ArrowTensorType::Kind::primitive) {
    auto l = t.logical_shape();
    dims.insert(dims.end(), l.begin(), l.end());
  }
  Tensor x = Tensor::empty(Shape(dims), t.dtype);
  if (t.metadata) x.metadata() = *t.metadata;
  return x;
}

// Concatenates one column's chunks.
ArrowColumn concat_column(const ArrowTensorType& t, std::vector<ArrowColumn> parts, const ArrowImportOptions& options) {
  ArrowColumn c;
  c.name = t.name;
  c.dim_names = t.logical_dim_names();
  c.variable_shape = t.kind == ArrowTensorType::Kind::variable_shape;
  if (c.variable_shape) {
    for (auto& p : parts)
      for (auto& x : p.tensors) c.tensors.push_back(std::move(x));
    if (options.copy == true)
      for (auto& x : c.tensors)
        if (x.readonly()) x = x.copy(MemoryOrder::C);
    return c;
  }
  std::vector<Tensor> batches;
  for (auto& p : parts)
    if (p.tensors[0].shape()[0] > 0) batches.push_back(std::move(p.tensors[0]));
  if (batches.empty()) {
    c.tensors.push_back(parts.empty() ? empty_batch(t) : std::move(parts[0].tensors[0]));
  } else if (batches.size() == 1) {
    c.tensors.push_back(std::move(batches[0]));
  } else {
    if (options.copy == false)
      throw Error(ErrorCode::copy_required, "from_arrow: the stream holds " + std::to_string(batches.size()) +
                                                " non-empty chunks; concatenating them is a copy, which copy=False "
                                                "forbids");
    int64_t rows = 0;
    for (auto& b : batches) rows = add(rows, b.shape()[0], "the row count");
    std::vector<int64_t> dims = to_vec(batches[0].shape());
    dims[0] = rows;
    Tensor out = Tensor::empty(Shape(dims), t.dtype);
    int64_t at = 0;
    for (auto& b : batches) {
      if (!b.device().is_host_accessible())
        throw Error(ErrorCode::unsupported, "from_arrow: cannot concatenate chunks on " + b.device().str());
      copy(b, out.slice(0, at, at + b.shape()[0]));
      at += b.shape()[0];
    }
    if (t.metadata) out.metadata() = *t.metadata;
    c.tensors.push_back(std::move(out));
  }
  if (options.copy == true && c.tensors[0].readonly()) c.tensors[0] = c.tensors[0].copy(MemoryOrder::C);
  return c;
}

struct StreamGuard {
  ArrowArrayStream s{};
  ~StreamGuard() {
    if (s.release) s.release(&s);
  }
};

std::string stream_error(ArrowArrayStream* s, const char* op, int rc) {
  std::string msg = "from_arrow: the stream's " + std::string(op) + " failed with error " + std::to_string(rc);
  if (s->get_last_error) {
    if (const char* e = s->get_last_error(s)) msg += ": " + std::string(e, strnlen(e, 4096));
  }
  return msg;
}

}  // namespace

ArrowColumns from_arrow_columns(ArrowSchema* schema, ArrowArray* array, const ArrowImportOptions& options) {
  SchemaGuard guard{schema};
  auto owner = take_array(array);
  guard.s = nullptr;
  return columns_from(schema, owner, Device::cpu(), options);
}

ArrowColumns from_arrow_columns(ArrowSchema* schema, ArrowDeviceArray* array, const ArrowImportOptions& options) {
  SchemaGuard guard{schema};
  if (!array) throw Error(ErrorCode::invalid_argument, "from_arrow: null ArrowDeviceArray");
  auto owner = take_array(&array->array);
  const Device dev = device_of(*array);
  if (array->sync_event && dev.type != kDLCPU) {
    if (dev.type != kDLCUDA && dev.type != kDLCUDAManaged && dev.type != kDLCUDAHost)
      throw Error(ErrorCode::unsupported, "from_arrow: tensorwire cannot wait on a sync_event of a " +
                                              std::string(dev.type_name()) + " device");
    device_runtime().synchronize_event(*static_cast<void**>(array->sync_event));
  }
  guard.s = nullptr;
  return columns_from(schema, owner, dev, options);
}

ArrowColumns from_arrow_columns(ArrowArrayStream* stream, const ArrowImportOptions& options) {
  if (!stream) throw Error(ErrorCode::invalid_argument, "from_arrow: null ArrowArrayStream");
  if (!stream->release)
    throw Error(ErrorCode::invalid_argument, "from_arrow: the ArrowArrayStream is released: it was consumed already");
  StreamGuard g;
  g.s = *stream;
  stream->release = nullptr;
  ArrowArrayStream* s = &g.s;
  if (!s->get_schema || !s->get_next)
    throw Error(ErrorCode::invalid_argument, "from_arrow: the stream lacks get_schema or get_next");
  ArrowSchema schema{};
  schema.release = nullptr;
  if (int rc = s->get_schema(s, &schema); rc != 0) throw Error(ErrorCode::invalid_argument, stream_error(s, "get_schema", rc));
  ArrowTensorType t;
  {
    SchemaGuard sg{&schema};
    if (!schema.release) throw Error(ErrorCode::invalid_argument, "from_arrow: get_schema returned a released schema");
    t = parse_arrow_schema(schema);
  }
  // Chunks import without copy=True's copy (the concatenation, or the final pass below, makes it once).
  const bool forbid_copy = options.copy == false;
  std::vector<std::vector<ArrowColumn>> chunks;
  for (;;) {
    ArrowArray a{};
    a.release = nullptr;
    if (int rc = s->get_next(s, &a); rc != 0) throw Error(ErrorCode::invalid_argument, stream_error(s, "get_next", rc));
    if (!a.release) break;
    auto owner = take_array(&a);
    ImportCtx ctx;
    ctx.keep = owner;
    if (forbid_copy) ctx.copy = false;
    chunks.push_back(import_all(t, owner->array, ctx, false));
  }
  ArrowColumns out;
  out.record_batch = t.kind == ArrowTensorType::Kind::record_batch;
  if (!out.record_batch) {
    std::vector<ArrowColumn> parts;
    for (auto& c : chunks) parts.push_back(std::move(c[0]));
    out.columns.push_back(concat_column(t, std::move(parts), options));
    return out;
  }
  for (size_t i = 0; i < t.columns.size(); ++i) {
    std::vector<ArrowColumn> parts;
    for (auto& c : chunks) parts.push_back(std::move(c[i]));
    out.columns.push_back(concat_column(t.columns[i], std::move(parts), options));
  }
  return out;
}

Tensor from_arrow(ArrowSchema* schema, ArrowArray* array, const ArrowImportOptions& options) {
  return single_tensor(from_arrow_columns(schema, array, options));
}
Tensor from_arrow(ArrowSchema* schema, ArrowDeviceArray* array, const ArrowImportOptions& options) {
  return single_tensor(from_arrow_columns(schema, array, options));
}
Tensor from_arrow(ArrowArrayStream* stream, const ArrowImportOptions& options) {
  return single_tensor(from_arrow_columns(stream, options));
}

}  // namespace tw
