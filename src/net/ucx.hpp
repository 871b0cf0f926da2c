// ucx.hpp (private) — UCX, loaded at run time with dlopen: tensorwire has no link-time dependency on it (a wheel
// works where UCX is absent, and UCX keeps loading its transport modules from its own directory). Which library:
// TW_UCX_LIBRARY, else a UCX the process already loaded, else tw::net::prefer_ucx_library()'s (the Python package
// names the libucx wheel's), else "libucp.so.0" from the library path. Compiled against Debian's libucx-dev headers (API 1.x); functions are
// resolved once, by name, on first use.
#pragma once

#include <ucp/api/ucp.h>

#include <string>

namespace tw::net_detail {

struct UcxApi {
  decltype(&::ucp_config_read) config_read;
  decltype(&::ucp_config_release) config_release;
  decltype(&::ucp_config_modify) config_modify;
  decltype(&::ucp_cleanup) cleanup;
  decltype(&::ucp_init_version) init_version;
  decltype(&::ucp_context_query) context_query;
  decltype(&::ucp_get_version) get_version;
  decltype(&::ucp_worker_create) worker_create;
  decltype(&::ucp_worker_destroy) worker_destroy;
  decltype(&::ucp_worker_query) worker_query;
  decltype(&::ucp_worker_progress) worker_progress;
  decltype(&::ucp_worker_get_efd) worker_get_efd;
  decltype(&::ucp_worker_arm) worker_arm;
  decltype(&::ucp_listener_create) listener_create;
  decltype(&::ucp_listener_destroy) listener_destroy;
  decltype(&::ucp_listener_query) listener_query;
  decltype(&::ucp_listener_reject) listener_reject;
  decltype(&::ucp_conn_request_query) conn_request_query;
  decltype(&::ucp_ep_create) ep_create;
  decltype(&::ucp_ep_close_nbx) ep_close_nbx;
  decltype(&::ucp_worker_set_am_recv_handler) set_am_recv_handler;
  decltype(&::ucp_am_send_nbx) am_send_nbx;
  decltype(&::ucp_am_recv_data_nbx) am_recv_data_nbx;
  decltype(&::ucp_am_data_release) am_data_release;
  decltype(&::ucp_request_check_status) request_check_status;
  decltype(&::ucp_request_free) request_free;
  decltype(&::ucp_request_cancel) request_cancel;
  decltype(&::ucs_status_string) status_string;
  decltype(&::ucp_ep_print_info) ep_print_info;
};

/// The loaded API; throws Error(unsupported) saying why UCX cannot be used (library missing, symbol missing).
const UcxApi& ucx();
/// The process's UCX context (active messages; workers used from several threads), created on first use. A
/// fork()ed child of a process that started UCX cannot start it again (its threads and state stay the parent's):
/// Error(unsupported) says so. Throws Error(unsupported).
ucp_context_h ucx_context();

/// Which network interfaces UCX's transports open ports on. A publisher that listens on loopback, or a subscriber
/// that connects to it, needs loopback alone; UCX's TCP transport otherwise listens for its data connections on
/// every interface (UCX_NET_DEVICES=all), reachable from other machines whatever tensorwire's own listener binds.
enum class UcxScope { loopback, any };
/// Before a session starts: the context is made (or made again, while no worker lives) with NET_DEVICES=lo for
/// `loopback` and UCX's default for `any`, unless the user set UCX_NET_DEVICES. A loopback context still serving a
/// worker cannot take an `any` session: Error(invalid_argument) says what to do. `who` names the caller.
void ucx_require_scope(UcxScope scope, const std::string& who);
/// The context for a new worker, counted as in use until ucx_worker_gone() (no context is replaced under one).
ucp_context_h ucx_context_for_worker();
void ucx_worker_gone() noexcept;
/// How this process's UCX moves a CUDA tensor: `direct` when its context handles CUDA memory (a UCX built with
/// CUDA transports, such as the libucx-cu12/cu13 wheels; Debian's has none), so UCX reads and writes device memory
/// itself, declared to it as `memory_type`; else (direct false) tensorwire stages the bytes through pinned host
/// memory. TW_NET_CUDA_DIRECT=0 turns the direct path off; TW_NET_CUDA_DIRECT=host (for tests against the fake
/// driver, whose device memory is host memory) turns it on with the memory declared as host memory.
/// Throws Error(unsupported) like ucx_context().
struct CudaPath {
  bool direct = false;
  ucs_memory_type_t memory_type = UCS_MEMORY_TYPE_HOST;
};
CudaPath ucx_cuda_path();
/// Whether this process's UCX has CUDA transports (its context handles CUDA memory; TW_NET_CUDA_DIRECT=host
/// pretends so, for the fake driver's tests), whichever path CUDA tensors take: its transports then call the CUDA
/// driver from whatever thread drives the worker, and need a current context there (with none, a worker's arm
/// crashes in cuEventQuery: ai-dynamo/nixl#2102). Throws Error(unsupported) like ucx_context().
bool ucx_cuda_transports();
/// "Input/output error (UCS_ERR_IO_ERROR)"-like text for a status.
std::string ucx_status(ucs_status_t s);

}  // namespace tw::net_detail
