// tensorwire/device.hpp — where a tensor's memory lives, as a DLPack device descriptor.
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#include <cstdint>
#include <string>
#include <string_view>

#include "tensorwire/dlpack.hpp"

namespace tw {

/// A device: DLPack's (device_type, device_id). Every DLPack device type is representable; only memory that the
/// CPU can address (cpu, cuda_host, cuda_managed, rocm_host) can be read or copied by the host copy engine.
struct Device {
  DLDeviceType type = kDLCPU;
  int32_t id = 0;

  static constexpr Device cpu() noexcept { return Device{kDLCPU, 0}; }
  static constexpr Device cuda(int32_t id = 0) noexcept { return Device{kDLCUDA, id}; }
  static constexpr Device cuda_host() noexcept { return Device{kDLCUDAHost, 0}; }
  static constexpr Device cuda_managed(int32_t id = 0) noexcept { return Device{kDLCUDAManaged, id}; }

  /// Validates a DLPack device (known type, id >= 0); throws Error(unsupported) otherwise.
  static Device from_dlpack(DLDevice d);
  /// Parses "cpu", "cuda", "cuda:1", "cuda_host", "cuda_managed:0", "rocm:0", ...
  static Device from_string(std::string_view s);

  constexpr DLDevice to_dlpack() const noexcept { return DLDevice{type, id}; }
  /// True when host code may dereference pointers into this memory.
  constexpr bool is_host_accessible() const noexcept {
    return type == kDLCPU || type == kDLCUDAHost || type == kDLCUDAManaged || type == kDLROCMHost;
  }
  /// "cpu" for the CPU, otherwise "<type>:<id>", e.g. "cuda:0", "cuda_host:0".
  std::string str() const;
  /// The type's name alone: "cpu", "cuda", "cuda_host", ...
  const char* type_name() const noexcept;

  friend constexpr bool operator==(Device a, Device b) noexcept { return a.type == b.type && a.id == b.id; }
};

}  // namespace tw
