// tensorwire/version.hpp — the library version.
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#define TENSORWIRE_VERSION_MAJOR 0
#define TENSORWIRE_VERSION_MINOR 1
#define TENSORWIRE_VERSION_PATCH 0

namespace tw {
/// "MAJOR.MINOR.PATCH" of the library actually linked (may differ from the headers' if mismatched).
const char* version() noexcept;
}  // namespace tw
