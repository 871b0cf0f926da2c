// ucx.cpp — loads UCX at run time (ucx.hpp).
#include "net/ucx.hpp"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "net/net_internal.hpp"
#include "tensorwire/error.hpp"
#include "tensorwire/net.hpp"

namespace tw::net_detail {

namespace {

struct Loaded {
  UcxApi api{};
  std::string error;  // why not, when not
  std::string library;  // the file loaded
  std::string version;  // "major.minor.release"
};

// prefer_ucx_library()'s choice, and whether loaded() has run (after which a preference changes nothing).
std::mutex g_pref_mu;
std::string g_preferred;
bool g_loading = false;

std::string dl_error(const char* fallback) {
  const char* e = ::dlerror();
  return e ? e : fallback;
}

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    // UCX finds a buffer's memory type in a cache its CUDA memory hooks fill as the driver maps memory; an address
    // the hooks did not see (mapped before they were installed, or through an entry point they do not patch) is
    // taken for host memory. With the cache off, UCX asks its CUDA memory domain about each device buffer instead:
    // one driver query per device send or receive, always right (tensorwire declares its host buffers as host,
    // which UCX trusts without asking). Read by libucs as it loads: set before, unless the user set it. (A UCX
    // loaded by someone else first keeps its own setting; ucx_tells_cuda_memory then decides.)
    if (!std::getenv("UCX_MEMTYPE_CACHE")) ::setenv("UCX_MEMTYPE_CACHE", "n", 0);
    std::string preferred;
    {
      std::lock_guard lock(g_pref_mu);
      g_loading = true;
      preferred = g_preferred;
    }
    void* h = nullptr;
    const char* env = std::getenv("TW_UCX_LIBRARY");
    if (env && *env) {  // the user's explicit choice: that one or none
      h = ::dlopen(env, RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        r.error = std::string("TW_UCX_LIBRARY='") + env + "' cannot be loaded: " + dl_error("not found");
        if (::dlopen("libucs.so.0", RTLD_NOW | RTLD_NOLOAD) || ::dlopen("libucp.so.0", RTLD_NOW | RTLD_NOLOAD))
          r.error += " (this process already loaded another UCX, whose libraries it would have mixed with: load "
                     "the one TW_UCX_LIBRARY names before anything else does, or unset it)";
        return r;
      }
    } else {
      // A UCX this process already has (another library loaded it) wins over the preference: a second UCX would
      // take the first one's libucs and libuct, matched by name, and mix two builds.
      h = ::dlopen("libucp.so.0", RTLD_NOW | RTLD_NOLOAD);
      if (!h) {
        if (void* ucs = ::dlopen("libucs.so.0", RTLD_NOW | RTLD_NOLOAD)) {
          char dir[PATH_MAX] = {};
          if (::dlinfo(ucs, RTLD_DI_ORIGIN, dir) == 0)
            h = ::dlopen((std::string(dir) + "/libucp.so.0").c_str(), RTLD_NOW | RTLD_LOCAL);
        } else if (!preferred.empty()) {
          h = ::dlopen(preferred.c_str(), RTLD_NOW | RTLD_LOCAL);
        }
      }
      if (!h) h = ::dlopen("libucp.so.0", RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        r.error = "UCX is not installed (" + dl_error("libucp.so.0 not found") +
                  "); install it (pip install libucx-cu13, or Debian/Ubuntu: apt-get install libucx0)";
        return r;
      }
    }
    bool ok = true;
    const auto sym = [&](auto& fn, const char* name) {
      void* p = ::dlsym(h, name);
      if (!p && ok) {
        ok = false;
        r.error = std::string("the installed UCX lacks ") + name + " (tensorwire needs UCX 1.12 or newer)";
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    UcxApi& a = r.api;
    sym(a.config_read, "ucp_config_read");
    sym(a.config_release, "ucp_config_release");
    sym(a.config_modify, "ucp_config_modify");
    sym(a.cleanup, "ucp_cleanup");
    sym(a.init_version, "ucp_init_version");
    sym(a.context_query, "ucp_context_query");
    sym(a.get_version, "ucp_get_version");
    sym(a.worker_create, "ucp_worker_create");
    sym(a.worker_destroy, "ucp_worker_destroy");
    sym(a.worker_query, "ucp_worker_query");
    sym(a.worker_progress, "ucp_worker_progress");
    sym(a.worker_get_efd, "ucp_worker_get_efd");
    sym(a.worker_arm, "ucp_worker_arm");
    sym(a.listener_create, "ucp_listener_create");
    sym(a.listener_destroy, "ucp_listener_destroy");
    sym(a.listener_query, "ucp_listener_query");
    sym(a.listener_reject, "ucp_listener_reject");
    sym(a.conn_request_query, "ucp_conn_request_query");
    sym(a.ep_create, "ucp_ep_create");
    sym(a.ep_close_nbx, "ucp_ep_close_nbx");
    sym(a.set_am_recv_handler, "ucp_worker_set_am_recv_handler");
    sym(a.am_send_nbx, "ucp_am_send_nbx");
    sym(a.am_recv_data_nbx, "ucp_am_recv_data_nbx");
    sym(a.am_data_release, "ucp_am_data_release");
    sym(a.request_check_status, "ucp_request_check_status");
    sym(a.request_free, "ucp_request_free");
    sym(a.request_cancel, "ucp_request_cancel");
    sym(a.status_string, "ucs_status_string");
    sym(a.ep_print_info, "ucp_ep_print_info");
    if (ok) {
      unsigned major = 0, minor = 0, release = 0;
      a.get_version(&major, &minor, &release);
      r.version = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
      Dl_info info{};
      if (::dladdr(reinterpret_cast<void*>(a.get_version), &info) != 0 && info.dli_fname) r.library = info.dli_fname;
      if (major != UCP_API_MAJOR || minor < 12) {
        ok = false;
        r.error = "the installed UCX is version " + std::to_string(major) + "." + std::to_string(minor) +
                  "; tensorwire needs 1.12 or newer";
      }
    }
    if (!ok) r.api = UcxApi{};
    return r;
  }();
  return l;
}

}  // namespace

}  // namespace tw::net_detail

namespace tw::net {

bool prefer_ucx_library(std::string path) {
  std::lock_guard lock(net_detail::g_pref_mu);
  if (net_detail::g_loading) return false;
  net_detail::g_preferred = std::move(path);
  return true;
}

std::string ucx_library() { return net_detail::loaded().library; }
std::string ucx_version() { return net_detail::loaded().version; }
std::string ucx_unavailable_reason() { return net_detail::ucx_unavailable_reason(); }

}  // namespace tw::net

namespace tw::net_detail {

std::string ucx_unavailable_reason() {
  const Loaded& l = loaded();
  if (!l.error.empty()) return l.error;
  try {
    (void)ucx_context();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const UcxApi& ucx() {
  const Loaded& l = loaded();
  if (!l.error.empty()) throw Error(ErrorCode::unsupported, "tensorwire net: " + l.error);
  return l.api;
}

std::string ucx_status(ucs_status_t s) {
  const Loaded& l = loaded();
  std::string name = l.error.empty() ? l.api.status_string(s) : "UCX status";
  return name + " (" + std::to_string(static_cast<int>(s)) + ")";
}

namespace {
std::atomic<bool> g_cuda_memory{false};  // UCX moves CUDA memory itself, and can tell it from host memory

// Whether UCX can tell a device address from a host one. It finds out through its memory-type cache, which its
// CUDA memory hooks (libucm_cuda) fill as the driver maps memory; when that module failed to load (a library it
// needs is missing), the cache stays empty and UCX takes every device address for a host one, whatever the
// request declares: it would read device memory with the CPU. Unless the cache is off (UCX_MEMTYPE_CACHE=n: then
// UCX asks the driver about every address), no module, no direct path: CUDA tensors are staged.
bool ucx_tells_cuda_memory() noexcept {
  if (void* h = ::dlopen("libucm_cuda.so.0", RTLD_NOW | RTLD_NOLOAD)) {  // (loaded by UCX at ucp_init)
    ::dlclose(h);
    return true;
  }
  const char* c = std::getenv("UCX_MEMTYPE_CACHE");
  if (!c) return false;
  const std::string v = c;
  return v == "n" || v == "no" || v == "N" || v == "NO" || v == "0" || v == "off" || v == "false";
}
}  // namespace

CudaPath ucx_cuda_path() {
  (void)ucx_context();
  const char* e = std::getenv("TW_NET_CUDA_DIRECT");
  const std::string want = e ? e : "";
  if (want == "0") return {};
  if (want == "host") return {true, UCS_MEMORY_TYPE_HOST};
  if (g_cuda_memory.load(std::memory_order_acquire)) return {true, UCS_MEMORY_TYPE_CUDA};
  return {};
}

bool ucx_cuda_transports() {
  (void)ucx_context();
  const char* e = std::getenv("TW_NET_CUDA_DIRECT");
  return g_cuda_memory.load(std::memory_order_acquire) || (e && std::string(e) == "host");
}

namespace {
struct ContextState {
  std::mutex mu;
  ucp_context_h ctx = nullptr;
  pid_t owner = 0;
  bool loopback = false;   // made with NET_DEVICES=lo
  bool scoped = false;     // made, or kept, for a publisher's or subscriber's scope (not only for a status query)
  UcxScope wanted = UcxScope::any;  // what a context made for a worker is made for: the last scope asked
  int workers = 0;         // workers made on ctx and not yet destroyed
};
ContextState& state() {
  static ContextState s;
  return s;
}

// Whether the user chose UCX's devices: then tensorwire never narrows them.
bool devices_set_by_user() { return std::getenv("UCX_NET_DEVICES") != nullptr; }

ucp_context_h make_context(ContextState& s) {
  const UcxApi& api = ucx();
  if (s.ctx && s.owner != ::getpid())
    throw Error(ErrorCode::unsupported,
                "tensorwire net: this process is a fork() of pid " + std::to_string(s.owner) + ", which had started "
                "UCX; UCX cannot start again in a forked child (its threads and state stay the parent's). Start "
                "processes that use listen= or connect= with multiprocessing's 'spawn' or 'forkserver' method, or "
                "fork before the parent's first network publisher or subscriber");
  if (s.ctx) return s.ctx;
  ucp_config_t* config = nullptr;
  // A publisher restarted on its address must be able to listen at once, while the old connections sit in
  // TIME_WAIT: UCX's TCP connection manager sets SO_REUSEADDR only when asked (the user's setting wins). UCX 1.13
  // reads its transports' settings from the environment only (ucp_config_modify accepts the name but does not
  // reach the connection manager), so it is set there, once, before UCX first reads it.
  if (!std::getenv("UCX_TCP_CM_REUSEADDR")) ::setenv("UCX_TCP_CM_REUSEADDR", "y", 0);
  ucs_status_t st = api.config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) throw Error(ErrorCode::unsupported, "tensorwire net: reading UCX's configuration failed: " + ucx_status(st));
  // NET_DEVICES is the context's own setting (ucp_config_modify reaches it in every supported UCX).
  const bool loopback = s.wanted == UcxScope::loopback && !devices_set_by_user();
  if (loopback && (st = api.config_modify(config, "NET_DEVICES", "lo")) != UCS_OK) {
    api.config_release(config);
    throw Error(ErrorCode::unsupported, "tensorwire net: limiting UCX to the loopback interface failed: " +
                                            ucx_status(st));
  }
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  p.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  p.mt_workers_shared = 1;
  ucp_context_h c = nullptr;
  st = api.init_version(UCP_API_MAJOR, UCP_API_MINOR, &p, config, &c);
  api.config_release(config);
  if (st != UCS_OK)
    throw Error(ErrorCode::unsupported, "tensorwire net: UCX failed to initialise: " + ucx_status(st) +
                                            " (check the UCX_* environment variables, e.g. UCX_TLS)");
  // Whether this UCX moves CUDA memory itself (it loaded a CUDA memory domain: a build with CUDA transports on a
  // machine with a driver). A failed query means no.
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  const bool cuda = api.context_query(c, &attr) == UCS_OK && (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  g_cuda_memory.store(cuda && ucx_tells_cuda_memory(), std::memory_order_release);
  s.ctx = c;
  s.owner = ::getpid();
  s.loopback = loopback;
  s.scoped = false;
  return c;
}
}  // namespace

ucp_context_h ucx_context() {
  ContextState& s = state();
  std::lock_guard lock(s.mu);
  if (!s.ctx) s.wanted = UcxScope::any;  // (a status query: the full context, narrowed by a loopback session)
  return make_context(s);
}

void ucx_require_scope(UcxScope scope, const std::string& who) {
  ContextState& s = state();
  std::lock_guard lock(s.mu);
  s.wanted = scope;
  if (s.ctx && s.owner == ::getpid() && !devices_set_by_user()) {
    const bool want_loopback = scope == UcxScope::loopback;
    if (s.loopback && !want_loopback) {
      // Widened when nothing uses it (a loopback session still starting takes the new one: a wider context
      // serves it too); impossible while a worker serves.
      if (s.workers != 0)
        throw Error(ErrorCode::invalid_argument,
                    who + " reaches other machines, but this process's UCX serves loopback only while its "
                          "loopback publishers and subscribers are open (so that no UCX port listens on another "
                          "interface); close them first, or set UCX_NET_DEVICES (e.g. UCX_NET_DEVICES=all) "
                          "before the process's first network publisher or subscriber");
      ucx().cleanup(s.ctx);
      s.ctx = nullptr;
    } else if (!s.loopback && want_loopback && !s.scoped && s.workers == 0) {
      // Narrowed only when it was made for a status query alone: a wide context made for a session is kept (that
      // session may still be starting, and needs it).
      ucx().cleanup(s.ctx);
      s.ctx = nullptr;
    }
  }
  (void)make_context(s);
  s.scoped = true;
}

ucp_context_h ucx_context_for_worker() {
  ContextState& s = state();
  std::lock_guard lock(s.mu);
  ucp_context_h c = make_context(s);
  ++s.workers;
  return c;
}

void ucx_worker_gone() noexcept {
  ContextState& s = state();
  std::lock_guard lock(s.mu);
  if (s.workers > 0) --s.workers;
}

}  // namespace tw::net_detail
