// tensorwire/dlpack.hpp — C++ spelling of tensorwire/dlpack.h (the DLPack C ABI, usable from C as well).
#pragma once

#include "tensorwire/dlpack.h"
