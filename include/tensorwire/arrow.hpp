// tensorwire/arrow.hpp — tensors as Arrow arrays and back, zero-copy, through the Arrow C Data Interface and the
// C Device Data Interface, without linking libarrow.
//
// What travels:
//  - a tensor of rank >= 2: `arrow.fixed_shape_tensor` (storage FixedSizeList<value>[prod(shape)]). The first
//    dimension is the row dimension; the others are one row's tensor. A dense permuted layout (NHWC viewed as
//    NCHW, a transposed batch) is exported as is, with the extension's `permutation`: logical dim i of a row is
//    physical dim permutation[i], and `shape` is the physical (row-major) shape;
//  - a tensor of rank 1: a plain primitive array;
//  - a list of tensors of one dtype and rank: `arrow.variable_shape_tensor` (storage
//    Struct{data: List<value>, shape: FixedSizeList<int32>[ndim]}), the elements packed into one buffer;
//  - bool as `arrow.bool8` (one byte per value, zero-copy). Arrow's own bit-packed boolean is imported with a copy.
//  - the tensor's Metadata, encoded with encode_metadata(), under the schema-metadata key kArrowMetadataKey.
//
// Hand-off contract (both directions, as the C Data Interface specifies):
//  1. Export: to_arrow() fills structs the caller allocated. The caller owns them and calls each struct's
//     `release` exactly once (or moves the struct: bitwise copy, then set the source's `release` to NULL). The
//     exported memory stays valid until the ArrowArray is released, whatever happens to the source tensor. Exported
//     data must be treated as immutable. On failure nothing is written.
//  2. Import: from_arrow() takes ownership of the structs the moment it is called, even when it throws: on return
//     (or exception) the caller's ArrowSchema has been released and the ArrowArray moved out (both `release` NULL).
//     The producer's array release callback is called exactly once, when the last tensor viewing it dies (or at
//     once, on failure or when the import copied).
//  3. Imported tensors are read-only: Arrow memory is immutable by contract.
//  4. Device arrays: the buffers live on `device_type`/`device_id`. A CUDA export sets `sync_event` to a
//     `CUevent*` (the driver's `cudaEvent_t*`) recorded on the tensor's stream, owned by the array and destroyed by
//     its release; NULL when the tensor has no stream (its data is ready) or no driver is loaded (nothing can be
//     pending). An import with a non-null CUDA `sync_event` waits on the event (host-side) before returning, and
//     needs the driver to do so (Error(device_unavailable) otherwise).
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensorwire/tensor.hpp"

// ---- The Arrow C ABI, declared from the specifications (C Data Interface, C Stream Interface, C Device Data
// Interface). The guard macros are the spec's own, so these coexist with any other copy of the declarations.
extern "C" {

#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE

#define ARROW_FLAG_DICTIONARY_ORDERED 1
#define ARROW_FLAG_NULLABLE 2
#define ARROW_FLAG_MAP_KEYS_SORTED 4

/// A type, field or schema: format string, name, binary key/value metadata, children.
struct ArrowSchema {
  const char* format;
  const char* name;
  const char* metadata;
  int64_t flags;
  int64_t n_children;
  struct ArrowSchema** children;
  struct ArrowSchema* dictionary;
  void (*release)(struct ArrowSchema*);
  void* private_data;
};

/// The data of an array: length and offset in slots, buffers, children.
struct ArrowArray {
  int64_t length;
  int64_t null_count;
  int64_t offset;
  int64_t n_buffers;
  int64_t n_children;
  const void** buffers;
  struct ArrowArray** children;
  struct ArrowArray* dictionary;
  void (*release)(struct ArrowArray*);
  void* private_data;
};

#endif  // ARROW_C_DATA_INTERFACE

#ifndef ARROW_C_DEVICE_DATA_INTERFACE
#define ARROW_C_DEVICE_DATA_INTERFACE

/// Where the buffers of an ArrowDeviceArray live; the values equal DLPack's DLDeviceType.
typedef int32_t ArrowDeviceType;

#define ARROW_DEVICE_CPU 1
#define ARROW_DEVICE_CUDA 2
#define ARROW_DEVICE_CUDA_HOST 3
#define ARROW_DEVICE_OPENCL 4
#define ARROW_DEVICE_VULKAN 7
#define ARROW_DEVICE_METAL 8
#define ARROW_DEVICE_VPI 9
#define ARROW_DEVICE_ROCM 10
#define ARROW_DEVICE_ROCM_HOST 11
#define ARROW_DEVICE_EXT_DEV 12
#define ARROW_DEVICE_CUDA_MANAGED 13
#define ARROW_DEVICE_ONEAPI 14
#define ARROW_DEVICE_WEBGPU 15
#define ARROW_DEVICE_HEXAGON 16

/// An ArrowArray whose buffers are on a device, plus the event to wait on before reading them.
struct ArrowDeviceArray {
  struct ArrowArray array;
  int64_t device_id;
  ArrowDeviceType device_type;
  void* sync_event;
  int64_t reserved[3];  ///< zero
};

#endif  // ARROW_C_DEVICE_DATA_INTERFACE

#ifndef ARROW_C_STREAM_INTERFACE
#define ARROW_C_STREAM_INTERFACE

/// A pull-style stream of arrays sharing one schema. get_next yields a released array at the end of the stream.
struct ArrowArrayStream {
  int (*get_schema)(struct ArrowArrayStream*, struct ArrowSchema* out);
  int (*get_next)(struct ArrowArrayStream*, struct ArrowArray* out);
  const char* (*get_last_error)(struct ArrowArrayStream*);
  void (*release)(struct ArrowArrayStream*);
  void* private_data;
};

#endif  // ARROW_C_STREAM_INTERFACE

#ifndef ARROW_C_DEVICE_STREAM_INTERFACE
#define ARROW_C_DEVICE_STREAM_INTERFACE

/// The device flavour of ArrowArrayStream: every array it yields is on `device_type`.
struct ArrowDeviceArrayStream {
  ArrowDeviceType device_type;
  int (*get_schema)(struct ArrowDeviceArrayStream*, struct ArrowSchema* out);
  int (*get_next)(struct ArrowDeviceArrayStream*, struct ArrowDeviceArray* out);
  const char* (*get_last_error)(struct ArrowDeviceArrayStream*);
  void (*release)(struct ArrowDeviceArrayStream*);
  void* private_data;
};

#endif  // ARROW_C_DEVICE_STREAM_INTERFACE

}  // extern "C"

namespace tw {

/// Schema-metadata key under which a tensor's Metadata travels; the value is encode_metadata()'s bytes
/// ("TWMD", version, root dict). Consumers that keep the field (record batches, streams, nanoarrow) keep it too.
inline constexpr std::string_view kArrowMetadataKey = "tensorwire.metadata";
/// Canonical extension names tensorwire reads and writes.
inline constexpr std::string_view kArrowFixedShapeTensor = "arrow.fixed_shape_tensor";
inline constexpr std::string_view kArrowVariableShapeTensor = "arrow.variable_shape_tensor";
inline constexpr std::string_view kArrowBool8 = "arrow.bool8";

/// Options of to_arrow / ArrowTensorArray.
struct ArrowExportOptions {
  /// nullopt: copy only when no Arrow layout describes the tensor (gaps, negative or zero strides, a row stride
  /// that is not one row) and when packing a list; false: never copy (Error(copy_required) instead);
  /// true: always export a fresh copy.
  std::optional<bool> copy;
  /// Name of the exported field ("" by default).
  std::string name;
  /// Optional names of one row's logical dimensions (rank - 1 names for a batch, rank for a list), written as the
  /// extension's `dim_names` (which the spec puts in physical order: tensorwire reorders them).
  std::vector<std::string> dim_names;
};

/// Options of from_arrow.
struct ArrowImportOptions {
  /// nullopt: copy only when needed (Arrow's bit-packed boolean, several chunks of a stream);
  /// false: never (Error(copy_required) instead); true: always return fresh C-contiguous, writable copies.
  std::optional<bool> copy;
};

/// An Arrow schema, read and validated as a tensor type (parse_arrow_schema).
struct ArrowTensorType {
  enum class Kind {
    primitive,        ///< a plain array: one value per row, a 1-D tensor
    fixed_size_list,  ///< FixedSizeList<value>[n] without extension: a (rows, n) tensor
    fixed_shape,      ///< arrow.fixed_shape_tensor: a (rows, *logical shape) tensor
    variable_shape,   ///< arrow.variable_shape_tensor: one tensor per row
    record_batch,     ///< a struct without extension: one column per field (`columns`)
  };
  Kind kind = Kind::primitive;
  std::string name;                  ///< the field name
  DType dtype = DType::float32();    ///< the element type
  bool bit_packed = false;           ///< elements are Arrow booleans, one bit each (imported with a copy)
  bool bool8 = false;                ///< elements are arrow.bool8 (one byte each, zero-copy)
  std::vector<int64_t> shape;        ///< fixed_shape / fixed_size_list: one row's physical (row-major) shape
  std::vector<int64_t> permutation;  ///< logical dim i = physical dim permutation[i]; empty means identity
  std::vector<std::string> dim_names;  ///< as written: physical order; empty when absent
  std::vector<std::optional<int64_t>> uniform_shape;  ///< variable_shape: physical sizes, nullopt where they vary
  int64_t ndim = 0;                  ///< rank of one row's tensor (variable_shape: the shape field's list size)
  bool large_list = false;           ///< variable_shape whose data is a LargeList (int64 offsets)
  std::optional<Metadata> metadata;  ///< decoded from kArrowMetadataKey when present
  std::vector<ArrowTensorType> columns;  ///< record_batch only

  /// One row's logical shape (fixed_shape / fixed_size_list): shape permuted.
  std::vector<int64_t> logical_shape() const;
  /// The names in logical order (dim_names permuted), or empty.
  std::vector<std::string> logical_dim_names() const;
};

/// Validates a schema (format strings, children, flags, dictionaries, the binary metadata, the canonical
/// extensions' JSON) and describes it. Never takes ownership; never reads past what the schema's own framing says.
/// Throws Error(invalid_argument) for malformed input (bad format strings, bad JSON, inconsistent parameters) and
/// Error(unsupported) for well-formed types that have no tensor meaning (strings, dictionaries, decimals...).
ArrowTensorType parse_arrow_schema(const ArrowSchema& schema);

/// Decodes the C Data Interface metadata framing (int32 pair count, then int32-length-prefixed keys and values,
/// native endianness) from `bytes`, which must hold the whole encoding and nothing after it. Keys must be UTF-8.
/// Throws Error(invalid_argument) on any malformation.
std::vector<std::pair<std::string, std::string>> decode_arrow_metadata(std::string_view bytes);
/// The inverse of decode_arrow_metadata.
std::string encode_arrow_metadata(const std::vector<std::pair<std::string, std::string>>& pairs);

namespace detail {
struct ArrowExportState;  // the prepared data and type of an ArrowTensorArray (src/interop/arrow.cpp)
}  // namespace detail

/// A tensor (or a list of tensors) in a layout Arrow describes, ready to be exported any number of times without
/// a copy. Preparing it makes the one copy the layout may need (see ArrowExportOptions::copy); each export shares
/// the prepared memory and keeps it alive until its ArrowArray is released. Cheap to copy (shared state).
class ArrowTensorArray {
 public:
  /// A tensor as arrow.fixed_shape_tensor (rank >= 2), a primitive array (rank 1) or arrow.bool8 (bool).
  /// Throws Error(invalid_argument) for a 0-d tensor, Error(unsupported) for dtypes without a canonical Arrow type
  /// (bfloat16, float8, complex, sub-byte, vector lanes), Error(copy_required) when copy=false and no layout fits.
  static ArrowTensorArray from_tensor(const Tensor& t, const ArrowExportOptions& options = {});
  /// Tensors of one dtype and rank (any shapes) as arrow.variable_shape_tensor. The data is packed into one
  /// buffer, so copy=false is Error(copy_required). Int32 offsets: more than 2^31 - 1 elements in all is
  /// Error(overflow). Tensors of one dense dimension order keep it (exported with `permutation`). Their metadata
  /// must be equal (Arrow keeps one per field): Error(invalid_argument) otherwise.
  static ArrowTensorArray from_tensors(std::span<const Tensor> tensors, const ArrowExportOptions& options = {});

  /// Fills a schema (the caller owns it and releases it).
  void export_schema(ArrowSchema* schema) const;
  /// Fills a schema and an array. The CPU interface: memory the host cannot read is Error(unsupported) (use the
  /// device overload).
  void export_to(ArrowSchema* schema, ArrowArray* array) const;
  /// Fills a schema and a device array (any device; see the contract above for sync_event).
  void export_to(ArrowSchema* schema, ArrowDeviceArray* array) const;

  const ArrowTensorType& type() const noexcept;
  /// Number of rows (tensors of a list, or the first dimension of a batch).
  int64_t length() const noexcept;
  /// True when preparing made a copy (the export does not alias the source tensor).
  bool copied() const noexcept;
  Device device() const noexcept;
  /// The prepared data: the batch tensor (in its exported layout), or for a list the packed 1-D element buffer.
  const Tensor& data() const noexcept;

 private:
  explicit ArrowTensorArray(std::shared_ptr<const detail::ArrowExportState> s) : state_(std::move(s)) {}
  std::shared_ptr<const detail::ArrowExportState> state_;
};

/// Exports `t` (see ArrowTensorArray::from_tensor for the rules). On failure nothing is written.
void to_arrow(const Tensor& t, ArrowSchema* schema, ArrowArray* array, const ArrowExportOptions& options = {});
void to_arrow(const Tensor& t, ArrowSchema* schema, ArrowDeviceArray* array, const ArrowExportOptions& options = {});
/// Exports a list of tensors as arrow.variable_shape_tensor (see ArrowTensorArray::from_tensors).
void to_arrow(std::span<const Tensor> tensors, ArrowSchema* schema, ArrowArray* array,
              const ArrowExportOptions& options = {});
void to_arrow(std::span<const Tensor> tensors, ArrowSchema* schema, ArrowDeviceArray* array,
              const ArrowExportOptions& options = {});

/// One imported field: a batch (exactly one tensor, rows first) or a variable-shape list (one tensor per row).
struct ArrowColumn {
  std::string name;
  bool variable_shape = false;
  std::vector<Tensor> tensors;
  /// One row's dimension names in logical order (from the extension's dim_names), or empty.
  std::vector<std::string> dim_names;
};

/// Imports an array as one tensor: primitive (1-D), FixedSizeList (2-D), arrow.fixed_shape_tensor (rows first,
/// logical order, zero-copy: permuted layouts become strided views), arrow.bool8. Takes ownership (see the
/// contract above). Variable-shape arrays and record batches are Error(unsupported) naming from_arrow_columns.
/// Nulls, dictionaries and malformed arrays (inconsistent lengths, too few buffers or children, null buffers,
/// offsets outside the data) are Error(invalid_argument) or Error(unsupported) naming the field at fault.
Tensor from_arrow(ArrowSchema* schema, ArrowArray* array, const ArrowImportOptions& options = {});
/// The device flavour: the tensor is on the array's device (no data is read, except the offsets and shapes of a
/// variable-shape array, which must be host-accessible).
Tensor from_arrow(ArrowSchema* schema, ArrowDeviceArray* array, const ArrowImportOptions& options = {});
/// Drains a stream (takes ownership, releases it). One chunk is imported zero-copy; several are concatenated along
/// the rows, which copies (Error(copy_required) with copy=false); none gives an empty batch.
Tensor from_arrow(ArrowArrayStream* stream, const ArrowImportOptions& options = {});

/// Everything an array or a stream held.
struct ArrowColumns {
  /// True when the array was a record batch (a struct without extension): one column per field. Otherwise there
  /// is exactly one column.
  bool record_batch = false;
  std::vector<ArrowColumn> columns;
};

/// The general import (same ownership and validation as from_arrow): record batches, variable shapes, all of it.
ArrowColumns from_arrow_columns(ArrowSchema* schema, ArrowArray* array, const ArrowImportOptions& options = {});
ArrowColumns from_arrow_columns(ArrowSchema* schema, ArrowDeviceArray* array, const ArrowImportOptions& options = {});
/// Variable-shape chunks concatenate without copying (a list of views into each chunk).
ArrowColumns from_arrow_columns(ArrowArrayStream* stream, const ArrowImportOptions& options = {});

/// Number of exported ArrowArray structures (children included) whose release callback has not run yet, in this
/// process. Returns to its previous value once every export is released: a leak check for tests.
int64_t arrow_exports_alive() noexcept;

}  // namespace tw
