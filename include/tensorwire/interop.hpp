// tensorwire/interop.hpp — DLPack in and out, and the parsers for array-interface descriptions.
//
// DLPack hand-off contract (both directions):
//  1. to_dlpack* returns a struct owned by the consumer. The consumer calls its deleter exactly once; the deleter
//     releases our reference to the buffer (the memory stays valid while any other view lives).
//  2. from_dlpack takes ownership of the struct the moment it is called, even when it throws: on any failure the
//     producer's deleter has been called (exactly once) before the exception leaves.
//  3. On success the returned tensor calls the producer's deleter when its last view dies.
//  4. Exports always fill `strides`; `data` is the address of the first element and byte_offset is 0 (the most
//     widely consumed form; all DLPack consumers we test add byte_offset correctly, but several older ones did not).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensorwire/dlpack.hpp"
#include "tensorwire/tensor.hpp"

namespace tw {

struct DLPackExportOptions {
  /// Highest version the consumer understands; the exported version is min(ours, this) within major 1.
  /// A consumer whose major is not 1 cannot be served a versioned struct (Error(version_mismatch)).
  DLPackVersion max_version{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
  /// Set DLPACK_FLAG_BITMASK_IS_COPIED: the producer made this copy for the consumer alone.
  bool is_copied = false;
};

/// Exports a versioned DLPack struct (flags: READ_ONLY, IS_COPIED, IS_SUBBYTE_TYPE_PADDED as they apply).
DLManagedTensorVersioned* to_dlpack(const Tensor& t, const DLPackExportOptions& options = {});
/// Exports a legacy (unversioned) struct. Read-only tensors are refused (the legacy struct cannot say so):
/// Error(read_only). Padded sub-byte tensors are refused likewise.
DLManagedTensor* to_dlpack_unversioned(const Tensor& t);

/// Imports a DLPack struct, zero-copy; takes ownership (see the contract above). Null is Error(invalid_argument).
Tensor from_dlpack(DLManagedTensorVersioned* m);
Tensor from_dlpack(DLManagedTensor* m);

/// Validates a DLTensor and returns the layout it describes, relative to `dl.data` (byte_offset included).
/// `version_minor` selects the rules (NULL strides are accepted for all versions; see interop.hpp notes).
/// Throws Error naming the field at fault. This is what from_dlpack runs; it never dereferences `data`.
Layout validate_dltensor(const DLTensor& dl, bool subbyte_padded);

// ---- NumPy __array_interface__ / CUDA Array Interface / PEP 3118 descriptions --------------------------------

/// The result of parsing a type string or a buffer format.
struct ParsedType {
  DType dtype;
  size_t itemsize = 0;     ///< bytes per element as the producer lays them out
  bool byteswap = false;   ///< non-native byte order: the data must be byte-swapped into a copy
};

/// Parses a NumPy array-interface typestr ("<f4", "|b1", ">i8", "<c16", "|u1", "<f2"). Throws
/// Error(unsupported) for object, string, void or datetime kinds, with the typestr in the message.
ParsedType parse_typestr(std::string_view typestr);

/// Parses a PEP 3118 struct format ("f", "<d", "=e", "?", "Zf", "Zd", "!I", "B", "q"...) against the item size the
/// exporter reported. Standard sizes apply after '<', '>', '=', '!'; native sizes otherwise ('@' or none).
/// Throws Error(unsupported) naming the format for structs, pointers, multi-item or mismatched formats.
ParsedType parse_buffer_format(std::string_view format, int64_t itemsize);

/// A protocol's description of an array, after the binding layer has checked Python types.
struct InterfaceDesc {
  std::string protocol = "__array_interface__";  ///< named in error messages
  int version = 3;
  std::string typestr;
  /// When set, the element type, overriding the typestr's kind; the typestr's size must equal its itemsize.
  /// (NumPy describes ml_dtypes' bfloat16 / float8 / int4 as void '<V2', '|V1'; the binding reads the real type
  /// from the array's dtype name.) Sub-byte types given this way are stored one per byte (padded).
  std::optional<DType> dtype;
  std::vector<int64_t> shape;
  std::optional<std::vector<int64_t>> byte_strides;  ///< absent/None: C-contiguous
  uintptr_t data = 0;            ///< address of element 0 (offset already applied when it came from a buffer)
  bool readonly = false;
  std::optional<int64_t> buffer_extent;  ///< bytes available from `data` to the end of the exporter's buffer
  int64_t buffer_before = 0;             ///< bytes available before `data` inside that buffer (for negative strides)
  bool has_mask = false;
  Device device = Device::cpu();
};

/// Validates an interface description and returns the layout (relative to `data`) and the byte-swap need.
/// Refuses: masks, unsupported versions, negative sizes, strides that are not a multiple of the item size,
/// null data with nonzero size, spans leaving the exporter's buffer, overflow.
struct InterfaceLayout {
  Layout layout;          ///< byte_offset = bytes from the lowest element address to element 0
  ByteSpan span;          ///< bytes spanned relative to element 0
  bool byteswap = false;
};
InterfaceLayout validate_interface(const InterfaceDesc& desc);

}  // namespace tw
