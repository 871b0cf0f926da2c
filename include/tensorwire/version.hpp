// tensorwire/version.hpp — the library version.
#pragma once

#define TENSORWIRE_VERSION_MAJOR 0
#define TENSORWIRE_VERSION_MINOR 1
#define TENSORWIRE_VERSION_PATCH 0

namespace tw {
/// "MAJOR.MINOR.PATCH" of the library actually linked (may differ from the headers' if mismatched).
const char* version() noexcept;
}  // namespace tw
