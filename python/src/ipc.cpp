// ipc.cpp — tw.Publisher and tw.Subscriber: bindings of tw::Publisher / tw::Subscriber (include/tensorwire/ipc.hpp).
// Waits release the GIL and run in slices so Ctrl-C (and any Python signal handler) interrupts them.
#include <nanobind/stl/string.h>

#include <chrono>
#include <cmath>
#include <cstring>

#include "convert.hpp"
#include "tensorwire/ipc.hpp"

namespace twpy {
namespace {

constexpr auto kSlice = std::chrono::milliseconds(100);

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

// "uint8", tw.uint8, np.uint8, np.dtype("uint8"), torch.uint8.
tw::DType dtype_from(nb::handle h) {
  if (nb::isinstance<tw::DType>(h)) return nb::cast<tw::DType>(h);
  if (nb::isinstance<nb::str>(h)) return tw::DType::from_name(nb::cast<std::string>(h));
  if (PyType_Check(h.ptr()) && nb::hasattr(h, "__name__"))  // NumPy scalar types
    return tw::DType::from_name(nb::cast<std::string>(h.attr("__name__")));
  if (nb::hasattr(h, "name") && nb::isinstance<nb::str>(h.attr("name")))  // np.dtype
    return tw::DType::from_name(nb::cast<std::string>(h.attr("name")));
  std::string s = nb::cast<std::string>(nb::str(h));
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  return tw::DType::from_name(s);
}

tw::Metadata metadata_from(nb::handle h) {
  tw::Metadata m;
  if (h.is_none()) return m;
  if (!PyDict_Check(h.ptr())) {
    if (!nb::hasattr(h, "keys"))
      throw tw::Error(tw::ErrorCode::type_mismatch, std::string("metadata must be a dict with str keys, not ") +
                                                        Py_TYPE(h.ptr())->tp_name);
    nb::dict d;
    for (nb::handle k : h.attr("keys")()) d[k] = h[k];
    return metadata_from(d);
  }
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  while (PyDict_Next(h.ptr(), &pos, &k, &v)) {
    if (!PyUnicode_Check(k))
      throw tw::Error(tw::ErrorCode::type_mismatch,
                      std::string("metadata keys must be str, not ") + Py_TYPE(k)->tp_name);
    std::string key = nb::borrow<nb::str>(k).c_str();
    m.set(key, to_value(v, "['" + key + "']"));
  }
  return m;
}

std::chrono::nanoseconds timeout_from(nb::handle h, bool& forever) {
  forever = h.is_none();
  if (forever) return std::chrono::nanoseconds(0);
  const double s = nb::cast<double>(h);
  if (std::isnan(s) || s < 0) throw nb::value_error("timeout must be None or a number >= 0");
  if (s > 1e9) {
    forever = true;
    return std::chrono::nanoseconds(0);
  }
  return std::chrono::nanoseconds(static_cast<int64_t>(s * 1e9));
}

// Python references held by the caller of send(pub, buf): the variable and the argument on the stack.
constexpr Py_ssize_t kCallerRefs = 2;

// Whether anything but plain references sees a loaned tensor's memory: other tw.Tensor views or DLPack capsules
// (they share its Buffer) and buffer-protocol exports — memoryviews and the NumPy arrays built on them, which
// reference the tensor through a 'managedbuffer'. Plain references (a variable in an outer frame, a list) only
// cost a scan of the referrers when there are more than the caller's own.
bool has_other_exports(nb::handle obj, const tw::Tensor& t) {
  if (t.buffer_ptr().use_count() > 1) return true;
  if (Py_REFCNT(obj.ptr()) <= kCallerRefs) return false;
  nb::object refs = nb::module_::import_("gc").attr("get_referrers")(obj);
  for (nb::handle r : refs) {
    const char* tn = Py_TYPE(r.ptr())->tp_name;
    if (PyMemoryView_Check(r.ptr()) || std::strcmp(tn, "managedbuffer") == 0) return true;
  }
  return false;
}

nb::object recv(tw::Subscriber& s, nb::handle timeout_h) {
  bool forever;
  const auto timeout = timeout_from(timeout_h, forever);
  if (auto t = s.try_recv()) return wrap(std::move(*t));  // a waiting message: no GIL round trip
  if (!forever && timeout.count() == 0) {  // a poll: answer now
    // Returning a null object with the error set raises it without a C++ throw (unwinding costs microseconds,
    // and busy pollers raise TimeoutError all the time).
    if (s.closed()) PyErr_SetString(PyExc_EOFError, ("tensorwire.Subscriber('" + s.name() + "'): end of stream").c_str());
    else PyErr_SetString(PyExc_TimeoutError, "no message waiting");
    return nb::object();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::optional<tw::Tensor> r;
    bool interrupted = false;
    const auto left = forever ? kSlice : std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now());
    {
      nb::gil_scoped_release nogil;
      r = s.recv_interruptible(std::max(std::chrono::nanoseconds(0), std::min<std::chrono::nanoseconds>(left, kSlice)),
                               interrupted);
    }
    if (r) return wrap(std::move(*r));
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
    if (s.closed()) {
      PyErr_SetString(PyExc_EOFError, ("tensorwire.Subscriber('" + s.name() + "'): end of stream").c_str());
      throw nb::python_error();
    }
    if (!forever && std::chrono::steady_clock::now() >= deadline) {
      PyErr_SetString(PyExc_TimeoutError,
                      ("tensorwire.Subscriber('" + s.name() + "'): no message within the timeout").c_str());
      throw nb::python_error();
    }
  }
}

}  // namespace

void register_ipc(nb::module_& m) {
  // Registered after the module's translator, so tried first: WouldBlockError is a tw::Error too.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const tw::WouldBlockError& e) {
      PyErr_SetString(PyExc_BlockingIOError, e.what());
    }
  });

  nb::class_<tw::Publisher>(m, "Publisher",
                            "The sending end of a shared-memory topic: Publisher(name, *, depth=8, on_full='block').\n\n"
                            "send(obj, metadata=None) delivers anything tw.asarray accepts to every subscriber "
                            "(one copy, or none for a loan()ed tensor); on_full is 'block', 'drop_oldest' or 'raise' "
                            "(BlockingIOError).")
      .def("__init__",
           [](tw::Publisher* self, const std::string& name, size_t depth, const std::string& on_full,
              size_t max_metadata_bytes, size_t max_buffers, size_t pool_bytes) {
             tw::PublisherOptions o;
             o.depth = depth;
             o.on_full = tw::on_full_from_string(on_full);
             o.max_metadata_bytes = max_metadata_bytes;
             o.max_buffers = max_buffers;
             o.pool_bytes = pool_bytes;
             new (self) tw::Publisher(name, o);
             self->set_wait_hook([] {
               nb::gil_scoped_acquire gil;
               if (PyErr_CheckSignals() != 0) throw nb::python_error();
             });
           },
           "name"_a, nb::kw_only(), "depth"_a = 8, "on_full"_a = "block", "max_metadata_bytes"_a = 64 * 1024,
           "max_buffers"_a = 64, "pool_bytes"_a = size_t{2} << 30)
      .def("send",
           [](tw::Publisher& p, nb::handle obj, nb::handle metadata) {
             if (p.closed())
               throw tw::Error(tw::ErrorCode::invalid_argument, "send on a closed tensorwire.Publisher('" + p.name() + "')");
             nb::object converted;
             const bool is_t = is_tensor(obj);
             if (!is_t) converted = nb::module_::import_("tensorwire").attr("asarray")(obj);
             tw::Tensor& src = unwrap(is_t ? obj : nb::handle(converted));
             tw::Metadata extra = metadata_from(metadata);
             const bool loaned = is_t && p.owns(src);
             if (loaned && has_other_exports(obj, src))
               throw nb::buffer_error("tensorwire.Publisher.send: this loaned tensor has other live exports "
                                      "(views, NumPy arrays, memoryviews or DLPack capsules); release them "
                                      "before sending, or send a copy");
             tw::Tensor t = src;
             {
               nb::gil_scoped_release nogil;
               p.send(t, extra);
             }
             if (loaned) src = tw::Tensor();  // the loan is handed over: the Python object is now invalid
           },
           "obj"_a, "metadata"_a = nb::none(),
           "Delivers obj (anything tw.asarray accepts) to every current subscriber with its metadata merged with "
           "`metadata`. A loan()ed tensor crosses with no copy and becomes invalid; anything else is copied once.")
      .def("loan",
           [](tw::Publisher& p, nb::handle shape, nb::handle dtype) {
             const tw::Dims s = shape_from(shape);
             const tw::DType d = dtype_from(dtype);
             nb::gil_scoped_release nogil;
             return p.loan(s, d);
           },
           "shape"_a, "dtype"_a = "float32",
           "A writable tensor in shared memory: fill it, then send() it with no copy.")
      .def("close", [](tw::Publisher& p) { p.close(); })
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](tw::Publisher& p, nb::args) { p.close(); })
      .def_prop_ro("closed", &tw::Publisher::closed)
      .def_prop_ro("name", &tw::Publisher::name)
      .def_prop_ro("subscribers", &tw::Publisher::subscriber_count, "Subscribers currently connected.")
      .def_prop_ro("dropped", &tw::Publisher::dropped, "Messages dropped under on_full='drop_oldest'.")
      .def_prop_ro("pool_buffers", &tw::Publisher::pool_buffers)
      .def("__repr__", [](const tw::Publisher& p) {
        return "tensorwire.Publisher('" + p.name() + "'" + (p.closed() ? ", closed" : "") + ")";
      });

  nb::class_<tw::Subscriber>(m, "Subscriber",
                             "The receiving end of a shared-memory topic: Subscriber(name). recv(timeout=None) "
                             "returns a read-only tw.Tensor (zero-copy), raising TimeoutError or EOFError at "
                             "end-of-stream; iterate until end-of-stream; fileno() for selectors and asyncio.")
      .def("__init__", [](tw::Subscriber* self, const std::string& name) { new (self) tw::Subscriber(name); },
           "name"_a)
      .def("recv", &recv, "timeout"_a = nb::none(),
           "The next message as a read-only tensor. timeout=None waits (interruptible, GIL released); raises "
           "TimeoutError when the timeout passes and EOFError at end-of-stream.")
      .def("__iter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__next__", [](tw::Subscriber& s) {
        try {
          return recv(s, nb::none());
        } catch (nb::python_error& e) {
          if (e.matches(PyExc_EOFError)) throw nb::stop_iteration();
          throw;
        }
      })
      .def("fileno", &tw::Subscriber::fileno,
           "A descriptor that polls readable while a message (or end-of-stream) waits.")
      .def("close", [](tw::Subscriber& s) { s.close(); })
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](tw::Subscriber& s, nb::args) { s.close(); })
      .def_prop_ro("closed", &tw::Subscriber::closed, "True once the stream ended (or after close()).")
      .def_prop_ro("connected", &tw::Subscriber::connected)
      .def_prop_ro("dropped", &tw::Subscriber::dropped, "Messages the publisher dropped for this subscriber.")
      .def_prop_ro("name", &tw::Subscriber::name)
      .def("__repr__", [](const tw::Subscriber& s) {
        return "tensorwire.Subscriber('" + s.name() + "'" + (s.closed() ? ", closed" : "") + ")";
      });
}

}  // namespace twpy
