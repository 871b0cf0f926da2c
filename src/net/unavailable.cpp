// unavailable.cpp — the net engines of a build without UCX's headers: every use says so.
#include "net/net_internal.hpp"
#include "tensorwire/error.hpp"
#include "tensorwire/net.hpp"

namespace tw::net_detail {

namespace {
const char* kWhy = "this tensorwire was built without UCX (its headers, Debian's libucx-dev, were not found at build "
                   "time), so listen= and connect= are unavailable; rebuild with UCX's headers installed";
}

std::string ucx_unavailable_reason() { return kWhy; }
std::unique_ptr<Server> Server::create(std::string, ServerOptions) {
  throw Error(ErrorCode::unsupported, std::string("tensorwire net: ") + kWhy);
}
std::unique_ptr<Client> Client::create(std::string, ClientOptions) {
  throw Error(ErrorCode::unsupported, std::string("tensorwire net: ") + kWhy);
}

}  // namespace tw::net_detail

namespace tw::net {
bool prefer_ucx_library(std::string) { return false; }  // (no UCX is ever loaded)
std::string ucx_library() { return ""; }
std::string ucx_version() { return ""; }
std::string ucx_unavailable_reason() { return net_detail::ucx_unavailable_reason(); }
}  // namespace tw::net
