// ipc.cpp — tw.Publisher and tw.Subscriber: bindings of tw::Publisher / tw::Subscriber (include/tensorwire/ipc.hpp).
// Nothing here takes an internal lock of the publisher or subscriber with the GIL held (every call that may wait
// for one releases it first; the receive fast path only try-locks), and no C++ wait ever takes the GIL back: long
// waits run as C++ calls bounded to a slice, and between slices the binding checks for signals (Ctrl-C) with the
// GIL. A timed-out slice of send() or loan() has done nothing, so retrying it is exact.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "convert.hpp"
#include "tensorwire/ipc.hpp"

namespace twpy {
namespace {

constexpr auto kSlice = std::chrono::milliseconds(100);

// The constructors take their arguments as Python objects and check them here, so that a wrong type is a
// TypeError naming the argument (nanobind's own answer is "incompatible function arguments" and a signature).
std::string py_type(nb::handle h) { return Py_TYPE(h.ptr())->tp_name; }

std::string str_arg(nb::handle h, const char* what) {
  if (!PyUnicode_Check(h.ptr()))
    throw nb::type_error((std::string(what) + " must be a str, not " + py_type(h)).c_str());
  if (auto s = key_text(h)) return std::move(*s);
  throw nb::value_error((std::string(what) + " " + nb::cast<std::string>(nb::repr(h)) +
                         " is not valid Unicode text (it holds a lone surrogate)").c_str());
}

std::chrono::milliseconds keepalive_from(nb::handle h) {
  if (PyBool_Check(h.ptr()) || !(PyFloat_Check(h.ptr()) || PyIndex_Check(h.ptr())))
    throw nb::type_error(("keepalive must be a number of seconds, not " + py_type(h)).c_str());
  const double s = PyFloat_AsDouble(h.ptr());
  if (s == -1.0 && PyErr_Occurred()) PyErr_Clear();  // (an int too large for a double: refused below)
  if (!(s >= 0.1 && s <= 86400.0)) throw nb::value_error("keepalive must be a number of seconds from 0.1 to 86400");
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0));
}

// token=: None (no token) or a non-empty str.
std::string token_from(nb::handle h) {
  if (h.is_none()) return {};
  if (!PyUnicode_Check(h.ptr()))
    throw nb::type_error(("token must be None or a str (a shared secret), not " + py_type(h)).c_str());
  std::string t = str_arg(h, "token");
  if (t.empty()) throw nb::value_error("token must not be empty (omit it, or give a secret)");
  return t;
}

// listen= / connect=: 'host:port', ':port', or a port number (an int, as users of socket APIs write it; a bare
// port listens on loopback and connects to it). None, or '' (a configuration left empty), is "no address".
std::string address_from(nb::handle h, const char* what) {
  if (h.is_none()) return {};
  if (PyUnicode_Check(h.ptr())) return nb::cast<std::string>(h);
  if (PyIndex_Check(h.ptr()) && !PyBool_Check(h.ptr())) {
    nb::object i = nb::steal(PyNumber_Index(h.ptr()));
    if (!i) throw nb::python_error();
    const long long v = PyLong_AsLongLong(i.ptr());
    const bool overflow = v == -1 && PyErr_Occurred();
    if (overflow) PyErr_Clear();
    if (overflow || v < 0 || v > 65535)
      throw nb::value_error((std::string(what) + "=" + nb::cast<std::string>(nb::str(i)) +
                             ": the port must be a number from 0 to 65535").c_str());
    return std::to_string(v);
  }
  throw nb::type_error((std::string(what) + " must be 'host:port', ':port' or a port number, not " +
                        Py_TYPE(h.ptr())->tp_name).c_str());
}

tw::Dims shape_from(nb::handle h) {
  tw::Dims d;
  auto one = [](nb::handle x) -> int64_t {
    if (PyBool_Check(x.ptr()) || !PyIndex_Check(x.ptr()))
      throw tw::Error(tw::ErrorCode::type_mismatch, std::string("shape entries must be ints, not ") + Py_TYPE(x.ptr())->tp_name);
    Py_ssize_t v = PyNumber_AsSsize_t(x.ptr(), PyExc_OverflowError);
    if (v == -1 && PyErr_Occurred()) throw nb::python_error();
    return v;
  };
  if (PyIndex_Check(h.ptr()) && !PyBool_Check(h.ptr())) {
    d.push_back(one(h));
    return d;
  }
  if (!PyTuple_Check(h.ptr()) && !PyList_Check(h.ptr()))
    throw tw::Error(tw::ErrorCode::type_mismatch, std::string("shape must be an int or a tuple of ints, not ") +
                                                      Py_TYPE(h.ptr())->tp_name);
  for (nb::handle x : h) d.push_back(one(x));
  return d;
}


// Whether `o` is an instance of numpy.<kind> (no NumPy imported: none is). Each type is looked up once, when NumPy
// is first seen, and kept for the life of the process; the GIL guards the cache.
bool numpy_kind(PyObject* o, const char* kind) {
  if (PyFloat_CheckExact(o) || PyLong_CheckExact(o)) return false;  // (the common case, without a lookup)
  static std::vector<std::pair<std::string, PyObject*>> types;
  PyObject* type = nullptr;
  for (const auto& [name, t] : types)
    if (name == kind) type = t;
  if (!type) {
    PyObject* np = PyImport_GetModule(nb::str("numpy").ptr());
    if (!np) {
      PyErr_Clear();
      return false;
    }
    type = PyObject_GetAttrString(np, kind);
    Py_DECREF(np);
    if (!type) {
      PyErr_Clear();
      return false;
    }
    types.emplace_back(kind, type);  // (a new reference, never released)
  }
  const int r = PyObject_IsInstance(o, type);
  PyErr_Clear();
  return r == 1;
}

std::chrono::nanoseconds timeout_from(nb::handle h, bool& forever) {
  forever = h.is_none();
  if (forever) return std::chrono::nanoseconds(0);
  // A real number: float, int, and what converts like one (numpy.int64, numpy.float32, a 0-d array...); not a
  // bool (numpy's either) nor a complex (whose imaginary part float() would drop).
  auto refuse = [&] {
    throw tw::Error(tw::ErrorCode::type_mismatch,
                    std::string("timeout must be None or a number of seconds, not ") + Py_TYPE(h.ptr())->tp_name);
  };
  PyNumberMethods* nm = Py_TYPE(h.ptr())->tp_as_number;
  if (PyBool_Check(h.ptr()) || PyComplex_Check(h.ptr()) || numpy_kind(h.ptr(), "bool_") ||
      numpy_kind(h.ptr(), "complexfloating") ||
      !(PyFloat_Check(h.ptr()) || PyIndex_Check(h.ptr()) || (nm && nm->nb_float)))
    refuse();
  const double s = PyFloat_AsDouble(h.ptr());
  if (s == -1.0 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_TypeError)) throw nb::python_error();
    PyErr_Clear();  // (numpy.timedelta64: NumPy's own words about float())
    refuse();
  }
  if (std::isnan(s) || s < 0) throw nb::value_error("timeout must be None or a number >= 0");
  if (s > 1e9) {
    forever = true;
    return std::chrono::nanoseconds(0);
  }
  return std::chrono::nanoseconds(static_cast<int64_t>(s * 1e9));
}

// Whether anything but plain references sees a loaned tensor's memory, counted exactly: every export through
// tensorwire's own slots shares the tensor's Buffer — other tw.Tensor views, DLPack capsules, and buffer-protocol
// exports (memoryviews, and the NumPy arrays np.asarray / __array__ build on them) hold it until released. What
// cannot be counted — a raw pointer copied out of __array_interface__, or a consumer such as torch.frombuffer that
// releases its buffer view at once and keeps only the pointer — is caught differently: after send() the loan's
// memory is read-only in this process, so a stale write through it faults instead of corrupting a message.
bool has_other_exports(const tw::Tensor& t) { return t.buffer_ptr().use_count() > 1; }

bool closed_nogil(const tw::Subscriber& s) {
  ReleaseGil nogil;
  return s.closed();
}

// A C++ send/loan bounded to `timeout`, in slices with a signal check between them (see the top of this file).
template <class F>
auto sliced(nb::handle timeout_h, F&& attempt) {
  bool forever;
  const auto timeout = timeout_from(timeout_h, forever);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now());
    const auto slice = forever ? std::chrono::nanoseconds(kSlice)
                               : std::clamp<std::chrono::nanoseconds>(left, std::chrono::nanoseconds(0), kSlice);
    std::string timed_out;
    {
      ReleaseGil nogil;
      try {
        return attempt(tw::Timeout(slice));
      } catch (const tw::TimeoutError& e) {
        timed_out = e.what();
      }
    }
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (!forever && std::chrono::steady_clock::now() >= deadline) {
      PyErr_SetString(PyExc_TimeoutError, python_message(timed_out).c_str());
      throw nb::python_error();
    }
  }
}

// A received message as Python sees it: a tensor, or the list / tuple / dict of tensors it was sent as.
nb::object wrap_received(tw::Subscriber::Received&& r) {
  tw::Message& m = r.message;
  if (r.single) return wrap(std::move(m.tensors.front()));
  if (m.kind == tw::Message::Kind::dict) {
    nb::dict d;
    for (size_t i = 0; i < m.tensors.size(); ++i) d[nb::str(m.keys[i].data(), m.keys[i].size())] = wrap(std::move(m.tensors[i]));
    return d;
  }
  nb::list l;
  for (tw::Tensor& t : m.tensors) l.append(wrap(std::move(t)));
  if (m.kind == tw::Message::Kind::tuple) return nb::tuple(l);
  return l;
}

// Publisher.send of a dict / list / tuple: one message of several tensors. Loans among them cross with no copy
// and are spent once it is sent; every value is converted with tw.asarray first.
// SendOptions from the keyword arguments (timeout is applied in slices by the caller).
tw::SendOptions send_options(nb::handle metadata, std::optional<bool> copy, nb::handle stream) {
  tw::SendOptions o;
  o.metadata = metadata_from(metadata);
  o.copy = copy;
  o.stream = parse_stream(stream);
  return o;
}

// A NumPy scalar number (np.float32(1), np.int64(2), np.bool_): a number as a Python one is (np.float64 already
// was, being a float).
bool numpy_number(PyObject* o) { return numpy_kind(o, "number") || numpy_kind(o, "bool_"); }

// A non-empty list / tuple whose leaves are all numbers, Python's or NumPy's scalars (nested lists and tuples of
// them): array data, which send takes as tw.asarray does ([1, 2, 3] is one 1-d tensor), not a message of several
// 0-d tensors. A list holding any array, a 0-d one included, (or anything else) is a message of several tensors.
bool numbers_only(PyObject* o, int depth) {
  if (depth > 64) return false;
  if (PyLong_Check(o) || PyFloat_Check(o) || PyComplex_Check(o) || numpy_number(o)) return depth > 0;
  if (!PyList_Check(o) && !PyTuple_Check(o)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  if (n == 0) return depth > 0;  // [[], []] is array data (shape (2, 0)); [] alone is an empty message
  PyObject** items = PySequence_Fast_ITEMS(o);
  for (Py_ssize_t i = 0; i < n; ++i)
    if (!numbers_only(items[i], depth + 1)) return false;
  return true;
}

// Whether a list / tuple holds (at any depth) an array-like or a dict: a nested message, where asarray would stack
// the arrays into one tensor. Lists of numbers (array data) and of other objects (asarray's own error) are not.
bool holds_arrays(PyObject* o, int depth) {
  if (depth > 64) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
  PyObject** items = PySequence_Fast_ITEMS(o);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* x = items[i];
    if (PyList_Check(x) || PyTuple_Check(x)) {
      if (holds_arrays(x, depth + 1)) return true;
      continue;
    }
    if (PyLong_Check(x) || PyFloat_Check(x) || PyComplex_Check(x) || PyUnicode_Check(x) || x == Py_None) continue;
    if (PyDict_Check(x)) return true;
    if (PyObject* nd = PyObject_GetAttrString(x, "ndim")) {  // a 0-d array or NumPy scalar is a number here
      const long k = PyLong_Check(nd) ? PyLong_AsLong(nd) : -1;
      Py_DECREF(nd);
      if (k == -1 && PyErr_Occurred()) PyErr_Clear();
      if (k == 0) continue;
    } else {
      PyErr_Clear();
    }
    if (is_tensor(nb::handle(x))) return true;
    for (const char* attr : {"__dlpack__", "__array_interface__", "__cuda_array_interface__", "__array__"}) {
      if (PyObject_HasAttrString(x, attr)) return true;
    }
  }
  return false;
}

// A message dict's key: a str, whole (its NULs kept: c_str() cut 'a\0b' to 'a'), and UTF-8 (a lone surrogate gave
// a bare "basic_string: construction from null").
std::string message_key(PyObject* k, const char* who) {
  if (!PyUnicode_Check(k))
    throw tw::Error(tw::ErrorCode::type_mismatch,
                    std::string(who) + ": the keys of a message dict must be str, not " + Py_TYPE(k)->tp_name);
  if (auto s = key_text(nb::handle(k))) return std::move(*s);
  throw tw::Error(tw::ErrorCode::invalid_argument,
                  std::string(who) + ": the message dict key " + nb::cast<std::string>(nb::repr(nb::handle(k))) +
                      " is not valid Unicode text (it holds a lone surrogate, as os.fsdecode() makes of undecodable "
                      "bytes); keys cross as UTF-8");
}

// How an error names one part of a message: its key, or its index in a list or tuple.
std::string part_name(const tw::Message& m, size_t i) {
  return m.kind == tw::Message::Kind::dict ? nb::cast<std::string>(nb::repr(nb::str(m.keys[i].data(), m.keys[i].size())))
                                           : std::to_string(i);
}

size_t send_message(tw::Publisher& p, nb::handle obj, nb::handle metadata, nb::handle timeout,
                    std::optional<bool> copy, nb::handle stream) {
  tw::Message m;
  std::vector<nb::object> values;  // the Python objects, kept alive for the send
  if (PyDict_Check(obj.ptr())) {
    m.kind = tw::Message::Kind::dict;
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(obj.ptr(), &pos, &k, &v)) {
      m.keys.push_back(message_key(k, "Publisher.send"));
      values.push_back(nb::borrow(v));
    }
  } else {
    m.kind = PyTuple_Check(obj.ptr()) ? tw::Message::Kind::tuple : tw::Message::Kind::list;
    for (nb::handle v : obj) values.push_back(nb::borrow(v));
  }
  if (values.empty())
    throw tw::Error(tw::ErrorCode::invalid_argument, "Publisher.send: an empty message (a dict, list or tuple of no "
                                                     "tensors); to send an empty array, send np.empty(0)");
  std::vector<tw::Tensor*> srcs;  // the tw.Tensor behind each value
  std::vector<bool> loaned;
  for (size_t i = 0; i < values.size(); ++i) {
    nb::object& v = values[i];
    // A part that is itself a list / tuple holding arrays: asarray stacked it into one tensor (np.asarray's rule),
    // so [[a, b]] arrived as one (2, n) tensor, silently; a nested dict is refused, and so is this now.
    if ((PyList_Check(v.ptr()) || PyTuple_Check(v.ptr())) && holds_arrays(v.ptr(), 0))
      throw nb::type_error(("tensorwire.Publisher.send: the message's part " + part_name(m, i) + " is a " +
                            Py_TYPE(v.ptr())->tp_name + " of arrays: a message is one dict, list or tuple of "
                            "tensors, not nested; send its items as parts, or stack them into one array first "
                            "(np.stack)").c_str());
    if (!is_tensor(v)) {
      try {
        v = as_tensor(v);
      } catch (const tw::Error& e) {  // which part: a message may have dozens
        throw tw::Error(e.code(), "Publisher.send: the message's part " + part_name(m, i) + ": " +
                                      python_message(e.what()));
      } catch (const nb::builtin_exception& e) {
        throw nb::builtin_exception(e.type(), ("tensorwire.Publisher.send: the message's part " + part_name(m, i) +
                                               ": " + e.what()).c_str());
      } catch (nb::python_error& e) {
        if (!e.matches(PyExc_TypeError) && !e.matches(PyExc_ValueError) && !e.matches(PyExc_BufferError)) throw;
        nb::object type = nb::borrow(e.type()), value = nb::borrow(e.value());
        nb::raise_from(e, type, "tensorwire.Publisher.send: the message's part %s: %S", part_name(m, i).c_str(),
                       value.ptr());
      }
    }
    tw::Tensor& t = unwrap(v);
    if (!t.defined())
      throw tw::Error(tw::ErrorCode::invalid_argument,
                      "Publisher.send: a tensor of the message is spent (a loan already sent)");
    bool owned;
    {
      ReleaseGil nogil;
      owned = p.owns(t);
    }
    if (owned) {
      for (size_t j = 0; j < srcs.size(); ++j)
        if (loaned[j] && srcs[j]->buffer_ptr() == t.buffer_ptr())
          throw nb::buffer_error("tensorwire.Publisher.send: the same loan appears twice in the message");
      if (has_other_exports(t))
        throw nb::buffer_error("tensorwire.Publisher.send: a loaned tensor of the message has other live exports "
                               "(views, NumPy arrays, memoryviews or DLPack capsules); release them before sending");
    }
    srcs.push_back(&t);
    loaned.push_back(owned);
  }
  tw::SendOptions o = send_options(metadata, copy, stream);  // (before anything is moved: it may raise)
  // Loans are handed over (moved: their Python objects are spent once the message is sent, and get them back if
  // it is not); everything else is shared.
  m.tensors.reserve(srcs.size());
  for (size_t i = 0; i < srcs.size(); ++i) m.tensors.push_back(loaned[i] ? std::move(*srcs[i]) : *srcs[i]);
  try {
    return sliced(timeout, [&](tw::Timeout slice) {
      o.timeout = slice;
      return p.send(std::move(m), o);
    });
  } catch (...) {
    for (size_t i = 0; i < srcs.size(); ++i)
      if (loaned[i]) *srcs[i] = std::move(m.tensors[i]);
    throw;
  }
}

// A size or count argument: an int >= 0, or a ValueError/TypeError naming it (nanobind's own answer to -1 for a
// size_t was "incompatible function arguments").
// `rule`: what the option takes, in the words the library uses for 0 (so that -1 and 0 are told the same thing).
size_t count_arg(nb::handle h, const char* what, const char* rule = ">= 0") {
  const int64_t v = int64_arg(h, what);
  if (v < 0)
    throw tw::Error(tw::ErrorCode::invalid_argument,
                    std::string(what) + " must be " + rule + ", not " + std::to_string(v));
  return static_cast<size_t>(v);
}

// EOFError's text.
std::string end_of_stream(const tw::Subscriber& s) {
  const std::string why = s.why_ended();
  return "tensorwire.Subscriber('" + s.name() + "'): end of stream" + (why.empty() ? "" : ": " + why);
}

nb::object recv(tw::Subscriber& s, nb::handle timeout_h) {
  bool forever;
  const auto timeout = timeout_from(timeout_h, forever);
  tw::Subscriber::PollStatus st;
  if (auto t = s.poll_nowait(st)) return wrap_received(std::move(*t));  // a waiting message: no GIL round trip
  if (!forever && timeout.count() == 0 && st != tw::Subscriber::PollStatus::busy) {  // a poll: answer now
    // Returning a null object with the error set raises it without a C++ throw (unwinding costs microseconds,
    // and busy pollers raise TimeoutError all the time).
    if (st == tw::Subscriber::PollStatus::ended) {
      PyErr_SetString(PyExc_EOFError, end_of_stream(s).c_str());
    } else {
      std::string why;
      {
        ReleaseGil nogil;
        why = s.waiting_for();
      }
      PyErr_SetString(PyExc_TimeoutError, ("tensorwire.Subscriber('" + s.name() + "'): no message waiting" +
                                           (why.empty() ? std::string() : " (" + why + ")")).c_str());
    }
    return nb::object();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::optional<tw::Subscriber::Received> r;
    bool interrupted = false;
    const auto left = forever ? kSlice : std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now());
    {
      ReleaseGil nogil;
      r = s.recv_interruptible(std::max(std::chrono::nanoseconds(0), std::min<std::chrono::nanoseconds>(left, kSlice)),
                               interrupted);
    }
    if (r) return wrap_received(std::move(*r));
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (closed_nogil(s)) {
      PyErr_SetString(PyExc_EOFError, end_of_stream(s).c_str());
      throw nb::python_error();
    }
    if (!forever && std::chrono::steady_clock::now() >= deadline) {
      std::string why;
      {
        ReleaseGil nogil;
        why = s.waiting_for();
      }
      PyErr_SetString(PyExc_TimeoutError, ("tensorwire.Subscriber('" + s.name() + "'): no message within the timeout" +
                                           (why.empty() ? std::string() : " (" + why + ")")).c_str());
      throw nb::python_error();
    }
  }
}

}  // namespace

// A listener other machines can reach, run on a UCX that a crafted packet aborts (before 1.18: Debian 12's 1.13;
// README, "Security"): the user is told once per publisher, with the remedy.
static std::string abortable_listener_warning(const std::string& address) {
  const std::string version = tw::net::ucx_version();
  unsigned major = 0, minor = 0;
  if (std::sscanf(version.c_str(), "%u.%u", &major, &minor) != 2 || major != 1 || minor >= 18) return "";
  const std::string host = address.substr(0, address.rfind(':'));
  if (host.rfind("127.", 0) == 0 || host == "[::1]" || host == "localhost") return "";
  return "tensorwire.Publisher listens on " + address + " with UCX " + version + " (" + tw::net::ucx_library() +
         "), which aborts the whole process when crafted bytes reach its ports; use UCX 1.18 or later: pip install "
         "'tensorwire[ucx]' (the libucx wheel is then preferred, unless TW_UCX_LIBRARY names another or the process "
         "loaded a UCX before tensorwire did) or set TW_UCX_LIBRARY to one";
}

void register_ipc(nb::module_& m) {
  // Registered after the module's translator, so tried first: WouldBlockError is a tw::Error too.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const tw::WouldBlockError& e) {
      PyErr_SetString(PyExc_BlockingIOError, python_message(e.what()).c_str());
    }
  });

  // Which UCX the network layer loads (tensorwire/__init__.py prefers the libucx wheel's when installed).
  m.def("_prefer_ucx_library", [](std::string path) { return tw::net::prefer_ucx_library(std::move(path)); });
  m.def("_ucx_info", [] {
    std::string library, version, why;
    {
      ReleaseGil nogil;  // (dlopen, and UCX's context on first use)
      library = tw::net::ucx_library();
      version = tw::net::ucx_version();
      why = tw::net::ucx_unavailable_reason();
    }
    nb::dict d;
    d["library"] = library.empty() ? nb::none() : nb::cast(library);
    d["version"] = version.empty() ? nb::none() : nb::cast(version);
    d["why"] = why.empty() ? nb::none() : nb::cast(why);
    return d;
  });

  nb::class_<tw::Publisher>(m, "Publisher",
                            "The sending end of a shared-memory topic: Publisher(name, *, depth=8, on_full='block').\n\n"
                            "send(obj, metadata=None, *, timeout=None) delivers anything tw.asarray accepts, or a "
                            "dict, list or tuple of such parts (one message), to every subscriber or to none (one copy, or none for a loan()ed tensor); on_full is 'block', "
                            "'drop_oldest' or 'raise' (BlockingIOError); a blocked send raises TimeoutError after "
                            "`timeout` seconds, naming the subscriber it waited for.")
      .def("__init__",
           [](tw::Publisher* self, nb::handle name_h, nb::handle depth, nb::handle on_full,
              nb::handle max_metadata_bytes, nb::handle max_buffers, nb::handle pool_bytes, nb::handle max_subscribers,
              nb::handle protect_sent_loans, nb::handle listen, nb::handle token, nb::handle insecure,
              nb::handle keepalive) {
             const std::string name = str_arg(name_h, "tensorwire.Publisher: the topic name");
             tw::PublisherOptions o;
             o.depth = count_arg(depth, "depth", "between 1 and 1048576");
             o.on_full = tw::on_full_from_string(str_arg(on_full, "on_full"));
             o.max_metadata_bytes = count_arg(max_metadata_bytes, "max_metadata_bytes");
             o.max_buffers = count_arg(max_buffers, "max_buffers", "between 1 and 65536");
             o.pool_bytes = count_arg(pool_bytes, "pool_bytes", "at least 1");
             o.max_subscribers = count_arg(max_subscribers, "max_subscribers", "at least 1");
             o.protect_sent_loans = bool_arg(protect_sent_loans, "protect_sent_loans");
             o.listen = address_from(listen, "listen");
             o.token = token_from(token);
             o.insecure = bool_arg(insecure, "insecure");
             o.keepalive = keepalive_from(keepalive);
             std::string warn;
             {
               ReleaseGil nogil;
               new (self) tw::Publisher(name, o);
               try {
                 if (!o.listen.empty()) warn = abortable_listener_warning(self->address());
               } catch (...) {  // (out of memory: no warning; the publisher stands)
               }
             }
             if (!warn.empty() && PyErr_WarnEx(PyExc_RuntimeWarning, warn.c_str(), 1) < 0) {
               {
                 ReleaseGil nogil;  // (closing may wait for the net thread)
                 self->~Publisher();  // warnings turned into errors: the publisher is not made
               }
               throw nb::python_error();
             }
           },
           nb::sig("def __init__(self, name: str, *, depth: int = 8, on_full: str = 'block', max_metadata_bytes: int = "
                   "65536, max_buffers: int = 1024, pool_bytes: int = 2147483648, max_subscribers: int = 256, "
                   "protect_sent_loans: bool = True, listen: str | int | None = None, token: str | None = None, "
                   "insecure: bool = False, keepalive: float = 10.0) -> None"),
           nb::arg("name").none(), nb::kw_only(), "depth"_a = 8, nb::arg("on_full").none() = "block",
           "max_metadata_bytes"_a = 64 * 1024, "max_buffers"_a = 1024, "pool_bytes"_a = size_t{2} << 30,
           "max_subscribers"_a = 256, nb::arg("protect_sent_loans").none() = true, "listen"_a = nb::none(),
           "token"_a = nb::none(), nb::arg("insecure").none() = false, nb::arg("keepalive").none() = 10.0,
           "Create the publisher of topic `name`: a shared-memory pool (up to pool_bytes and max_buffers; copies of "
           "at most 16 KiB share buffers) and, per "
           "subscriber, a ring of `depth` messages; on_full says what send does when a ring is full ('block', "
           "'drop_oldest' or 'raise'). listen='host:port' also serves subscribers on other machines over UCX "
           "(no host: loopback only; a reachable address needs token='secret' or insecure=True; data is not "
           "encrypted); keepalive: seconds of silence after which a remote subscriber is dropped.")
      .def("send",
           [](tw::Publisher& p, nb::handle obj, nb::handle metadata, nb::handle timeout, nb::handle copy_h,
              nb::handle stream) -> size_t {
             const CopyMode cm = parse_copy(copy_h);  // (None, True or False; TypeError naming copy= otherwise)
             const std::optional<bool> copy =
                 cm == CopyMode::if_needed ? std::nullopt : std::optional<bool>(cm == CopyMode::always);
             if (p.closed()) {
               // The publisher says why (closed, or inherited by a fork()ed child, which its message explains):
               // a send of nothing reaches its check before anything else.
               {
                 ReleaseGil nogil;
                 p.send(tw::Tensor::zeros({0}, tw::DType::uint8()));
               }
               throw tw::Error(tw::ErrorCode::invalid_argument, "send on a closed tensorwire.Publisher('" + p.name() + "')");
             }
             if (obj.is_none())  // (nanobind's own answer was "incompatible function arguments")
               throw nb::type_error("tensorwire.Publisher.send: nothing to send (None); send an array or tensor, or "
                                    "a dict, list or tuple of them");
             if (PyDict_Check(obj.ptr()) ||
                 ((PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr())) && !numbers_only(obj.ptr(), 0)))
               return send_message(p, obj, metadata, timeout, copy, stream);
             nb::object converted;
             const bool is_t = is_tensor(obj);
             if (!is_t) converted = as_tensor(obj);
             tw::Tensor& src = unwrap(is_t ? obj : nb::handle(converted));
             if (!src.defined())
               throw tw::Error(tw::ErrorCode::invalid_argument,
                               "Publisher.send: this tensor is spent (a loan is handed over by the send that "
                               "delivers it; loan again, or send a copy)");
             tw::SendOptions o = send_options(metadata, copy, stream);
             bool loaned;
             {
               ReleaseGil nogil;
               loaned = is_t && p.owns(src);
             }
             if (loaned && has_other_exports(src))
               throw nb::buffer_error("tensorwire.Publisher.send: this loaned tensor has other live exports "
                                      "(views, NumPy arrays, memoryviews or DLPack capsules); release them "
                                      "before sending, or send a copy");
             if (!loaned || copy == true)
               return sliced(timeout, [&](tw::Timeout slice) {
                 o.timeout = slice;
                 return p.send(src, o);
               });
             // A loan is handed over whole: the Python object is spent once it is sent (and stays usable when the
             // send fails: an rvalue send consumes only on success).
             tw::Tensor t = std::move(src);
             try {
               return sliced(timeout, [&](tw::Timeout slice) {
                 o.timeout = slice;
                 return p.send(std::move(t), o);
               });
             } catch (...) {
               src = std::move(t);
               throw;
             }
           },
           nb::sig("def send(self, obj: object, metadata: dict | None = None, *, timeout: float | None = None, "
                   "copy: bool | None = None, stream: object = None) -> int"),
           nb::arg("obj").none(), "metadata"_a = nb::none(), nb::kw_only(), "timeout"_a = nb::none(), "copy"_a.none() = nb::none(),
           "stream"_a = nb::none(),
           "Delivers obj (anything tw.asarray accepts, or a dict / list / tuple of such parts: one message of several "
           "tensors, not nested) to every current subscriber, or to none, with its metadata "
           "merged with `metadata`; returns how many subscribers got it. A loan()ed tensor crosses with no copy and "
           "is spent afterwards (its memory becomes read-only here); a CUDA tensor crosses by its allocation's "
           "handle where the driver can share it; anything else is copied once. copy=False raises tw.CopyError "
           "when there is no zero-copy path; copy=True always copies. stream: the CUDA stream that wrote the "
           "tensor (subscribers wait on an event recorded there). Waits for full subscribers (on_full='block') "
           "at most `timeout` seconds, then raises TimeoutError naming the subscriber; nobody got the message then.")
      .def("loan",
           [](tw::Publisher& p, nb::handle shape, nb::handle dtype, nb::handle timeout, nb::handle device) -> nb::object {
             const tw::Device dev = parse_device(device).value_or(tw::Device::cpu());
             // Several loans at once: a dict of name -> shape (or (shape, dtype)), or a list of them; one shape is
             // an int or a tuple/list of ints.
             auto one = [&](nb::handle spec) {
               nb::handle sh = spec, dt = dtype;
               if ((PyTuple_Check(spec.ptr()) || PyList_Check(spec.ptr())) && nb::len(spec) == 2 &&
                   !PyIndex_Check(nb::handle(PySequence_Fast_GET_ITEM(spec.ptr(), 1)).ptr())) {
                 sh = nb::handle(PySequence_Fast_GET_ITEM(spec.ptr(), 0));
                 dt = nb::handle(PySequence_Fast_GET_ITEM(spec.ptr(), 1));
               }
               const tw::Dims s = shape_from(sh);
               const tw::DType d = parse_dtype(dt);
               return wrap(sliced(timeout, [&](tw::Timeout slice) { return p.loan(s, d, dev, slice); }));
             };
             if (PyDict_Check(shape.ptr())) {
               nb::dict out;
               for (auto [k, v] : nb::borrow<nb::dict>(shape)) {
                 (void)message_key(k.ptr(), "Publisher.loan");  // (a key send() would refuse: refused now)
                 out[k] = one(v);
               }
               return out;
             }
             const bool several = (PyList_Check(shape.ptr()) || PyTuple_Check(shape.ptr())) && nb::len(shape) > 0 &&
                                  !PyIndex_Check(nb::handle(PySequence_Fast_GET_ITEM(shape.ptr(), 0)).ptr());
             if (several) {
               nb::list out;
               for (nb::handle v : shape) out.append(one(v));
               if (PyTuple_Check(shape.ptr())) return nb::tuple(out);
               return out;
             }
             return one(shape);
           },
           "shape"_a, "dtype"_a = "float32", nb::kw_only(), "timeout"_a = nb::none(), "device"_a = nb::none(),
           "A writable tensor in shared memory (device='cuda:0': in the publisher's CUDA IPC pool): fill it, then "
           "send() it with no copy. Waits at most `timeout` "
           "seconds for a free pool buffer (TimeoutError names who holds them); MemoryError when the machine "
           "cannot provide it. One shape is an int or a tuple or list of ints. Several at once: a dict of name -> "
           "shape or (shape, dtype), or a list or tuple of them, returns the same structure of loans (send it as "
           "one message).")
      .def("close", &tw::Publisher::close, nb::call_guard<ReleaseGil>(),
           "End the stream: subscribers receive what was sent, then end-of-stream; received tensors stay valid.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](tw::Publisher& p, nb::args) {
        ReleaseGil nogil;
        p.close();
      })
      .def_prop_ro("closed", &tw::Publisher::closed, "True after close() (or leaving a with block).")
      .def_prop_ro("name", &tw::Publisher::name, "The topic name.")
      .def_prop_ro("subscribers", [](const tw::Publisher& p) {
        ReleaseGil nogil;
        return p.subscriber_count();
      }, "Subscribers currently connected.")
      .def_prop_ro("dropped", [](const tw::Publisher& p) {
        ReleaseGil nogil;
        return p.dropped();
      }, "Messages this publisher dropped under on_full='drop_oldest' (a remote subscriber also drops its oldest "
         "unread messages itself when its own queue is full: its Subscriber.dropped counts both).")
      .def_prop_ro("address", [](const tw::Publisher& p) -> nb::object {
        std::string a = p.address();  // fixed at construction: no lock taken
        if (a.empty()) return nb::none();
        return nb::str(a.c_str());
      }, "The 'host:port' remote subscribers connect to (the port resolved when listen asked for 0), or None "
         "without listen.")
      .def_prop_ro("remote_subscribers", [](const tw::Publisher& p) {
        ReleaseGil nogil;
        return p.remote_subscriber_count();
      }, "Remote subscribers connected now (included in subscribers).")
      .def_prop_ro("pool_buffers", [](const tw::Publisher& p) {
        ReleaseGil nogil;
        return p.pool_buffers();
      }, "Buffers the publisher's shared-memory pool holds now (free and in use).")
      .def("__repr__", [](const tw::Publisher& p) {
        return "tensorwire.Publisher('" + p.name() + "'" + (p.closed() ? ", closed" : "") + ")";
      });

  nb::class_<tw::Subscriber>(m, "Subscriber",
                             "The receiving end of a shared-memory topic: Subscriber(name). recv(timeout=None) "
                             "returns a read-only tw.Tensor (zero-copy), raising TimeoutError or EOFError at "
                             "end-of-stream; iterate until end-of-stream; fileno() for selectors and asyncio.")
      .def("__init__", [](tw::Subscriber* self, nb::handle name_h, nb::handle connect, nb::handle token, nb::handle keepalive,
                          nb::handle max_message_bytes, nb::handle device) {
             const std::string name = str_arg(name_h, "tensorwire.Subscriber: the topic name");
             tw::SubscriberOptions o;
             o.device = parse_device(device);
             o.connect = address_from(connect, "connect");
             o.token = token_from(token);
             o.keepalive = keepalive_from(keepalive);
             o.max_message_bytes = count_arg(max_message_bytes, "max_message_bytes");
             ReleaseGil nogil;
             new (self) tw::Subscriber(name, o);
           }, nb::sig("def __init__(self, name: str, *, connect: str | int | None = None, token: str | None = None, "
                      "keepalive: float = 10.0, max_message_bytes: int = 17179869184, device: object = None) -> None"),
           nb::arg("name").none(), nb::kw_only(), "connect"_a = nb::none(), "token"_a = nb::none(),
           nb::arg("keepalive").none() = 10.0,
           "max_message_bytes"_a = uint64_t{1} << 34, "device"_a = nb::none(),
           "Subscribe to topic `name`; the publisher may start before or after, and each message sent while "
           "connected arrives once. connect='host:port' subscribes to a publisher on another machine (its "
           "listen=) over UCX, retrying until it is there; token= proves the shared secret (and checks the "
           "publisher's proof); keepalive: seconds of publisher silence that end the stream. device='cpu' (or "
           "'cuda:N') delivers every tensor there, copying what arrives elsewhere (a device this process does not "
           "have is refused here, at once); without it a CUDA tensor this process cannot open is an error at recv.")
      .def("recv", &recv, "timeout"_a = nb::none(),
           "The next message: a read-only tensor, or the dict / list / tuple of them it was sent as. timeout=None "
           "waits (interruptible, GIL released); raises TimeoutError when the timeout passes and EOFError at "
           "end-of-stream.")
      .def("__iter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__next__", [](tw::Subscriber& s) {
        try {
          return recv(s, nb::none());
        } catch (nb::python_error& e) {
          if (e.matches(PyExc_EOFError)) throw nb::stop_iteration();
          throw;
        }
      })
      .def("fileno", &tw::Subscriber::fileno, nb::call_guard<ReleaseGil>(),
           "A descriptor that polls readable while a message (or end-of-stream) waits.")
      .def("close", &tw::Subscriber::close, nb::call_guard<ReleaseGil>(),
           "Disconnect: nothing more is delivered and queued messages are discarded unread (recv's EOFError then says "
           "how many); tensors already received stay valid until dropped.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](tw::Subscriber& s, nb::args) {
        ReleaseGil nogil;
        s.close();
      })
      .def_prop_ro("closed", [](const tw::Subscriber& s) { return closed_nogil(s); },
                   "True once the stream ended (or after close()).")
      .def_prop_ro("connected", [](const tw::Subscriber& s) {
        ReleaseGil nogil;
        return s.connected();
      }, "True while connected to a live publisher.")
      .def_prop_ro("dropped", [](const tw::Subscriber& s) {
        ReleaseGil nogil;
        return s.dropped();
      }, "Messages this subscriber missed because a queue was full (on_full='drop_oldest'); a remote subscriber "
         "counts those the publisher dropped for it and those its own queue dropped. Still readable after close().")
      .def_prop_ro("name", &tw::Subscriber::name, "The topic name.")
      .def("__repr__", [](const tw::Subscriber& s) {
        return "tensorwire.Subscriber('" + s.name() + "'" + (closed_nogil(s) ? ", closed" : "") + ")";
      });
}

}  // namespace twpy
