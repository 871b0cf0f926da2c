// tensorwire/tensorwire.hpp — the whole public C++ API of tensorwire.
// Move a tensor across framework, process and device boundaries without losing its dtype, layout or metadata.
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#include "tensorwire/arrow.hpp"
#include "tensorwire/buffer.hpp"
#include "tensorwire/copy.hpp"
#include "tensorwire/cuda.hpp"
#include "tensorwire/device.hpp"
#include "tensorwire/dlpack.hpp"
#include "tensorwire/dtype.hpp"
#include "tensorwire/error.hpp"
#include "tensorwire/interop.hpp"
#include "tensorwire/ipc.hpp"
#include "tensorwire/layout.hpp"
#include "tensorwire/metadata.hpp"
#include "tensorwire/net.hpp"
#include "tensorwire/tensor.hpp"
#include "tensorwire/version.hpp"
