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
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

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
  DLPackVersion max_version{TW_DLPACK_MAJOR_VERSION, TW_DLPACK_MINOR_VERSION};
  /// Set DLPACK_FLAG_BITMASK_IS_COPIED: the producer made this copy for the consumer alone.
  bool is_copied = false;
};

/// Exports a versioned DLPack struct (flags: READ_ONLY, IS_COPIED, IS_SUBBYTE_TYPE_PADDED as they apply): the
/// tensor's own memory and layout, whatever they are (negative and zero strides included), never a copy. To hand
/// a tensor to a consumer that cannot take every layout (PyTorch aborts on negative strides), use export_dlpack,
/// which copies what the consumer cannot take.
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

/// The writers, inverse of the parsers: the array-interface typestr of a dtype NumPy knows natively ("<f4", "|b1";
/// "" for bfloat16, float8, sub-byte, complex32 and vector types, which NumPy has only through ml_dtypes), and the
/// PEP 3118 format of a dtype the struct module has a code for (nullptr otherwise).
std::string typestr_of(DType d);
const char* buffer_format_of(DType d) noexcept;

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
  /// Where the memory is. Absent (the CUDA Array Interface): the device runtime is asked which device owns
  /// `data`, else the import request's device is taken; an empty array with neither lands on cuda:0.
  std::optional<Device> device = Device::cpu();
  /// CUDA Array Interface v3 `stream`: absent/None = no synchronisation; 0 is refused (ambiguous); 1 and 2 are
  /// the legacy and per-thread default streams. import_interface waits for it through the device runtime.
  std::optional<int64_t> stream;
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

// ---- the import/export policy: one set of rules for Python, C, C++ and Rust ------------------------------------
//
// Every binding converts its arguments into these requests and calls these functions; it decides nothing itself,
// so every language takes the same decisions and reports them with the same text.

/// Python's copy=None / True / False; C's TW_COPY_IF_NEEDED / ALWAYS / NEVER.
enum class CopyMode : int { if_needed = 0, always = 1, never = 2 };

/// What an export knows of its consumer.
enum class ConsumerProfile : int {
  /// Any DLPack consumer: negative strides are copied into a C-contiguous tensor (PyTorch aborts the process on
  /// them, and a capsule's consumer is unknown), or refused under CopyMode::never.
  portable = 0,
  /// A consumer known to take every strided layout, negative strides included (NumPy, tensorwire itself).
  strided = 1,
};

struct ExportRequest {
  CopyMode copy = CopyMode::if_needed;
  /// The consumer's device (DLPack `dl_device`); absent = where the tensor is.
  std::optional<Device> device;
  /// The consumer's stream, DLPack's convention: -1 = no synchronisation; on CUDA/ROCm 0 is refused, 1 and 2 are
  /// the default streams; a CPU tensor takes only -1. Absent = the producer's choice.
  std::optional<int64_t> stream;
  ConsumerProfile consumer = ConsumerProfile::portable;
  /// Highest DLPack version the consumer understands (versioned exports only).
  DLPackVersion max_version{TW_DLPACK_MAJOR_VERSION, TW_DLPACK_MINOR_VERSION};
};

/// The tensor an export hands out, and whether it is a copy made for this consumer alone.
struct PreparedExport {
  Tensor tensor;
  bool copied = false;
};

/// Applies the export rules: validates the stream for the device; moves to the requested device (host-accessible
/// to CPU only, for now) or refuses; copies for copy=always and for negative strides under the portable profile;
/// CopyMode::never turns every needed copy into Error(copy_required) naming the reason.
PreparedExport prepare_export(const Tensor& t, const ExportRequest& request);

/// prepare_export, then a versioned struct (IS_COPIED set for a copy), capped to request.max_version: a dtype or
/// device newer than that minor is Error(version_mismatch) naming both versions; another major is refused too.
DLManagedTensorVersioned* export_dlpack(const Tensor& t, const ExportRequest& request);
/// prepare_export, then a legacy struct. A read-only tensor is Error(unsupported) (the legacy struct cannot say so)
/// unless the request's copy (CopyMode::always) made a writable one.
DLManagedTensor* export_dlpack_legacy(const Tensor& t, const ExportRequest& request);

struct ImportRequest {
  CopyMode copy = CopyMode::if_needed;
  /// The device the caller wants the result on; absent = wherever the producer's memory is.
  std::optional<Device> device;
  /// The caller's CUDA stream (1 legacy default, 2 per-thread default, else a handle; -1 or absent: the legacy
  /// default stream): a copy the import makes to or on a CUDA device is queued on it, after the producer's stream
  /// through an event, and the result carries it; zero-copy device memory is made ready on it (it waits for the
  /// producer's stream on the device). (Handing the stream to a DLPack producer is the binding's part.)
  std::optional<intptr_t> stream;
};

/// What the protocol said about the memory it handed over.
struct ImportFacts {
  bool producer_copied = false;  ///< the producer made this memory for us alone (DLPack IS_COPIED, copy=True)
  bool byteswap = false;         ///< non-native byte order: must be swapped into a copy
};

/// True when finish_import may copy (so a binding releases its interpreter lock around it).
bool import_may_copy(const ImportRequest& request, const ImportFacts& facts) noexcept;
/// Applies the import rules to a zero-copy import: device match (tensorwire does not move data between devices
/// on import), byte swapping (one copy; refused under never), copy=always (one copy unless the producer's was
/// made for us).
Tensor finish_import(Tensor t, const ImportRequest& request, const ImportFacts& facts);

/// from_dlpack + finish_import (IS_COPIED counts as the producer's copy). Ownership as from_dlpack.
Tensor import_dlpack(DLManagedTensorVersioned* m, const ImportRequest& request);
Tensor import_dlpack(DLManagedTensor* m, const ImportRequest& request);

/// Validates an interface description, resolves its device and stream (CUDA Array Interface rules, see
/// InterfaceDesc), views its memory (keeping `keep` alive) and applies finish_import.
Tensor import_interface(const InterfaceDesc& desc, std::shared_ptr<const void> keep, const ImportRequest& request);

/// The one span-to-buffer helper: a tensor over foreign memory whose element 0 is at `element0` and whose
/// layout is `rel` (byte_offset relative to element0, may be negative with negative strides). The Buffer is the
/// exact span the elements occupy; `keep` holds the producer's memory. Validates address-space overflow.
Tensor view_foreign(uintptr_t element0, Layout rel, Device device, std::shared_ptr<const void> keep, bool readonly);

/// The smallest DLPack minor version (major 1) that can describe `d` / `dev`.
uint32_t dlpack_minor_for(DType d) noexcept;
uint32_t dlpack_minor_for(Device dev) noexcept;

}  // namespace tw
