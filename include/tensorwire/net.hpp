// tensorwire/net.hpp — which UCX carries tensors across machines (PublisherOptions::listen,
// SubscriberOptions::connect in tensorwire/ipc.hpp; "Across machines" in the README).
#pragma once
#if defined(__cplusplus) && __cplusplus < 202002L && !(defined(_MSVC_LANG) && _MSVC_LANG >= 202002L)
#error "tensorwire's C++ headers need C++20 (-std=c++20); C and older C++ take the C API, tensorwire/tensorwire.h"
#endif

#include <string>

namespace tw {

/// The UCX behind listen= and connect= (see "Across machines" in the README). tensorwire loads UCX at run time, on
/// first use: the library TW_UCX_LIBRARY names (a path, or a name the dynamic loader searches for) when that is
/// set; else a UCX the process has already loaded (another library's: two UCX builds in one process would mix
/// their libraries); else the one given to prefer_ucx_library() (the Python package gives the libucx wheel's when
/// it is installed); else libucp.so.0 from the library path (Debian's libucx0).
namespace net {
/// Prefers `path` (a libucp.so to dlopen) over the library path's UCX. Takes effect only before UCX is first
/// loaded: returns false, changing nothing, after that. A preferred library that fails to load is passed over
/// (ucx_library() then says which one is in use, and ucx_unavailable_reason() stays empty while another works).
bool prefer_ucx_library(std::string path);
/// The file of the UCX in use ("" when none can be loaded); loads it if need be.
std::string ucx_library();
/// Its version, "major.minor.release" ("" when none can be loaded).
std::string ucx_version();
/// Why listen= and connect= cannot be used ("" when they can): no UCX, a UCX too old, a build without UCX.
std::string ucx_unavailable_reason();
}  // namespace net

}  // namespace tw
