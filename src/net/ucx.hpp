// ucx.hpp (private) — UCX, loaded at run time with dlopen("libucp.so.0"): tensorwire has no link-time dependency on
// it (a wheel works where UCX is absent, and UCX keeps loading its transport modules from its own directory).
// Compiled against Debian's libucx-dev headers (API 1.x); functions are resolved once, by name, on first use.
#pragma once

#include <ucp/api/ucp.h>

#include <string>

namespace tw::net_detail {

struct UcxApi {
  decltype(&::ucp_config_read) config_read;
  decltype(&::ucp_config_release) config_release;
  decltype(&::ucp_init_version) init_version;
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
/// The process's UCX context (active messages; workers used from several threads). Created on first use, and
/// again in a fork()ed child (UCX contexts do not survive fork). Throws Error(unsupported).
ucp_context_h ucx_context();
/// "Input/output error (UCS_ERR_IO_ERROR)"-like text for a status.
std::string ucx_status(ucs_status_t s);

}  // namespace tw::net_detail
