// tensorwire/dlpack.hpp — C++ spelling of tensorwire/dlpack.h (the DLPack C ABI, usable from C as well).
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#include "tensorwire/dlpack.h"
