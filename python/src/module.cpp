// module.cpp — the tensorwire._tensorwire extension: Tensor, DType, Device, errors, metadata and views.
// This layer only binds: every rule about layouts, copies and protocols lives in the C++ library.
#include <algorithm>
#include <bit>
#include <cctype>
#include <initializer_list>
#include <string_view>
#include <cstring>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "convert.hpp"

namespace twpy {

PyObject* g_copy_error = nullptr;

PyObject* exception_for(tw::ErrorCode code) noexcept {
  switch (code) {
    case tw::ErrorCode::invalid_argument: return PyExc_ValueError;
    case tw::ErrorCode::type_mismatch: return PyExc_TypeError;
    case tw::ErrorCode::out_of_range: return PyExc_IndexError;
    case tw::ErrorCode::overflow: return PyExc_ValueError;
    case tw::ErrorCode::unsupported: return PyExc_BufferError;
    case tw::ErrorCode::copy_required: return g_copy_error;
    case tw::ErrorCode::device_unavailable: return PyExc_BufferError;
    case tw::ErrorCode::version_mismatch: return PyExc_BufferError;
    case tw::ErrorCode::read_only: return PyExc_ValueError;
    case tw::ErrorCode::internal: return PyExc_RuntimeError;
    case tw::ErrorCode::out_of_memory: return PyExc_MemoryError;
    case tw::ErrorCode::timeout: return PyExc_TimeoutError;
  }
  return PyExc_RuntimeError;
}

namespace {

struct PyRef {
  explicit PyRef(PyObject* o) noexcept : obj(o) { Py_INCREF(o); }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  PyObject* obj;
  ~PyRef() {
    if (!Py_IsInitialized()) return;  // interpreter gone: leaking is the only safe choice
    PyGILState_STATE s = PyGILState_Ensure();
    Py_DECREF(obj);
    PyGILState_Release(s);
  }
};

}  // namespace

std::shared_ptr<const void> keep_python_alive(PyObject* obj) {
  return std::make_shared<PyRef>(obj);
}

// Python users read Python names. A C++ prefix "Tensor::select: " names a Python method and becomes
// "tensorwire.Tensor.select: " (also "Subscriber('x')::recv: " -> "tensorwire.Subscriber('x').recv: "); a prefix
// naming something Python has no name for ("tw::copy: ", "Buffer::allocate: ", "Tensor::make: ") is dropped, as
// the text after it says what happened.
std::string python_message(std::string m) {
  struct Class {
    std::string_view name;
    std::initializer_list<std::string_view> methods;
  };
  static const Class classes[] = {
      {"Tensor", {"view", "reshape", "permute", "transpose", "expand", "select", "slice", "contiguous", "copy",
                  "as_readonly", "is_contiguous", "to", "pin"}},
      {"Publisher", {"send", "loan", "close"}},
      {"Subscriber", {"recv", "fileno", "close"}},
  };
  // "Subscriber('x'): ..." (an object's own words, no method named) is the Python class's too.
  for (std::string_view cls : {"Subscriber('", "Publisher('"}) {
    if (m.rfind(cls, 0) != 0) continue;
    const size_t close = m.find("')", cls.size());
    if (close != std::string::npos && m.compare(close + 2, 2, "::") != 0) return "tensorwire." + m;
  }
  const size_t sep = m.find("::");
  if (sep == std::string::npos || sep == 0 || m.find(' ') < sep) return m;  // no C++ prefix at the start
  size_t end = sep + 2;
  while (end < m.size() && (std::isalnum(static_cast<unsigned char>(m[end])) || m[end] == '_')) ++end;
  const std::string owner = m.substr(0, sep);                  // "Tensor", "Subscriber('x')", "tw"
  const std::string method = m.substr(sep + 2, end - sep - 2);  // "select"
  const std::string rest = m.substr(end);                      // ": ..." or " on 'x' ..."
  const std::string base = owner.substr(0, owner.find('('));
  for (const Class& c : classes) {
    if (c.name != base) continue;
    for (std::string_view py : c.methods)
      if (py == method) return "tensorwire." + owner + "." + method + rest;
  }
  if (rest.rfind(": ", 0) == 0) return rest.substr(2);
  return m;
}

// Runs f; a tw::Error it throws is rethrown naming the Python function `py` instead of the C++ one it came from
// (reshape is implemented by view, empty by Buffer::allocate...).
template <class F>
auto as_python(const char* py, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const tw::Error& e) {
    std::string m = e.what();
    const auto colon = m.find(": ");
    if (colon != std::string::npos && m.find("::") < colon) m = m.substr(colon + 2);
    throw tw::Error(e.code(), std::string(py) + ": " + m);
  }
}

// str(x), for messages.
std::string str_of(nb::handle x) {
  PyObject* s = PyObject_Str(x.ptr());
  if (!s) throw nb::python_error();
  nb::str r = nb::steal<nb::str>(s);
  return r.c_str();
}

std::string error_text(const nb::python_error& e) {
  PyObject* type = e.type().ptr();
  std::string name = (type && PyType_Check(type)) ? reinterpret_cast<PyTypeObject*>(type)->tp_name : "exception";
  if (const auto dot = name.rfind('.'); dot != std::string::npos) name = name.substr(dot + 1);
  std::string text;
  if (PyObject* s = e.value().ptr() ? PyObject_Str(e.value().ptr()) : nullptr) {
    Py_ssize_t n = 0;
    if (const char* c = PyUnicode_AsUTF8AndSize(s, &n)) text.assign(c, static_cast<size_t>(n));
    Py_DECREF(s);
  }
  if (PyErr_Occurred()) PyErr_Clear();  // str() of the exception itself failed: the type name says enough
  // PyTorch's C++ errors carry their C++ backtrace after the message (c10's "Exception raised from ... frame #0
  // ..."): some 2 000 characters of addresses, in what is one line of a list of reasons here.
  if (const auto bt = text.find("\nException raised from "); bt != std::string::npos) text.resize(bt);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  for (char& c : text)
    if (c == '\n') c = ' ';
  return text.empty() ? name : name + ": " + text;
}

// isinstance(o, module.name), without importing the module: an object cannot be an instance of a class from a
// module nobody loaded. Never raises.
bool is_instance_of(PyObject* o, const char* module, const char* name) {
  PyObject* mod_name = PyUnicode_FromString(module);
  PyObject* mod = mod_name ? PyImport_GetModule(mod_name) : nullptr;
  Py_XDECREF(mod_name);
  PyObject* cls = mod ? PyObject_GetAttrString(mod, name) : nullptr;
  Py_XDECREF(mod);
  const int r = cls && PyType_Check(cls) ? PyObject_IsInstance(o, cls) : 0;
  Py_XDECREF(cls);
  if (PyErr_Occurred()) PyErr_Clear();
  return r == 1;
}

// "module.QualName" of o's type ("numpy.float64", "torch.Tensor", "mypackage.Point"), for messages.
std::string qualified_type_name(PyObject* o) {
  nb::handle t(reinterpret_cast<PyObject*>(Py_TYPE(o)));
  try {
    const std::string mod = str_of(t.attr("__module__"));
    const std::string qual = str_of(t.attr("__qualname__"));
    return mod == "builtins" ? qual : mod + "." + qual;
  } catch (nb::python_error&) {
    return Py_TYPE(o)->tp_name;
  }
}

const char* const kSurrogateKey = "metadata keys must be valid Unicode text; this one holds a lone surrogate (as "
                                  "os.fsdecode() makes for undecodable bytes)";

tw::Metadata metadata_from(nb::handle h) {
  if (h.is_none()) return tw::Metadata();
  if (!PyDict_Check(h.ptr())) {
    if (!nb::hasattr(h, "keys"))
      throw tw::Error(tw::ErrorCode::type_mismatch, std::string("metadata must be a dict with str keys, not ") +
                                                        Py_TYPE(h.ptr())->tp_name);
    nb::dict d;
    for (nb::handle k : h.attr("keys")()) d[k] = h[k];
    return metadata_from(d);
  }
  // Built in one step (a dict's keys are unique already): linear in the number of keys.
  std::vector<std::string> keys;
  std::vector<tw::Value> values;
  keys.reserve(static_cast<size_t>(PyDict_Size(h.ptr())));
  values.reserve(keys.capacity());
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  while (PyDict_Next(h.ptr(), &pos, &k, &v)) {
    if (!PyUnicode_Check(k))
      throw tw::Error(tw::ErrorCode::type_mismatch,
                      std::string("metadata keys must be str, not ") + Py_TYPE(k)->tp_name);
    std::optional<std::string> text = key_text(k);  // whole: embedded NULs kept (c_str() cut the key at one)
    if (!text) throw tw::Error(tw::ErrorCode::invalid_argument, kSurrogateKey);
    std::string key = std::move(*text);
    values.push_back(to_value(v, "['" + key + "']"));
    keys.push_back(std::move(key));
  }
  return tw::Metadata::from_value(tw::Value::dict(std::move(keys), std::move(values)));
}

tw::Value to_value(PyObject* o, const std::string& path, int depth) {
  if (depth > 64) throw tw::Error(tw::ErrorCode::type_mismatch, "metadata " + path + " is nested deeper than 64 levels");
  if (o == Py_None) return tw::Value();
  if (PyBool_Check(o)) return tw::Value(o == Py_True);
  if (PyLong_Check(o)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow)
      throw tw::Error(tw::ErrorCode::type_mismatch, "metadata " + path + ": int " +
                                                        nb::cast<std::string>(nb::repr(nb::handle(o))) +
                                                        " does not fit in int64 (metadata integers are signed 64-bit;"
                                                        " store a larger one as a str or bytes)");
    if (v == -1 && PyErr_Occurred()) throw nb::python_error();
    return tw::Value(v);
  }
  if (PyFloat_Check(o)) return tw::Value(PyFloat_AsDouble(o));
  if (PyUnicode_Check(o)) {
    Py_ssize_t n;
    const char* s = PyUnicode_AsUTF8AndSize(o, &n);
    if (!s) {
      PyErr_Clear();
      throw tw::Error(tw::ErrorCode::invalid_argument,
                      "metadata " + path + " is a str that is not valid Unicode text (it holds a lone surrogate, as "
                      "os.fsdecode() makes for undecodable bytes); store bytes instead");
    }
    return tw::Value(std::string(s, static_cast<size_t>(n)));
  }
  if (PyBytes_Check(o)) return tw::Value::bytes(std::string(PyBytes_AS_STRING(o), static_cast<size_t>(PyBytes_GET_SIZE(o))));
  if (PyList_Check(o) || PyTuple_Check(o)) {
    const bool list = PyList_Check(o);
    Py_ssize_t n = list ? PyList_GET_SIZE(o) : PyTuple_GET_SIZE(o);
    std::vector<tw::Value> items;
    items.reserve(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i)
      items.push_back(to_value(list ? PyList_GET_ITEM(o, i) : PyTuple_GET_ITEM(o, i),
                               path + "[" + std::to_string(i) + "]", depth + 1));
    return list ? tw::Value::list(std::move(items)) : tw::Value::tuple(std::move(items));
  }
  if (PyDict_Check(o)) {
    // Built in one step (a dict's keys are unique already): linear in the number of keys.
    std::vector<std::string> keys;
    std::vector<tw::Value> values;
    keys.reserve(static_cast<size_t>(PyDict_Size(o)));
    values.reserve(keys.capacity());
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(o, &pos, &k, &v)) {
      if (!PyUnicode_Check(k))
        throw tw::Error(tw::ErrorCode::type_mismatch, "metadata " + path + " has a key of type " +
                                                          qualified_type_name(k) + "; dict keys must be str");
      Py_ssize_t kn;
      const char* ks = PyUnicode_AsUTF8AndSize(k, &kn);  // keeps embedded NULs, unlike c_str()
      if (!ks) {
        PyErr_Clear();
        throw tw::Error(tw::ErrorCode::invalid_argument,
                        "metadata " + path + " has a key that is not valid Unicode text (a lone surrogate)");
      }
      std::string key(ks, static_cast<size_t>(kn));
      values.push_back(to_value(v, path + "[" + key + "]", depth + 1));
      keys.push_back(std::move(key));
    }
    return tw::Value::dict(std::move(keys), std::move(values));
  }
  nb::handle h(o);
  const std::string type = qualified_type_name(o);
  if (is_instance_of(o, "numpy", "generic") || is_instance_of(o, "numpy", "ndarray")) {
    // NumPy scalars and 0-d arrays are stored as the matching Python value (their .item()).
    const int64_t ndim = nb::cast<int64_t>(h.attr("ndim"));
    const std::string kind = str_of(h.attr("dtype").attr("kind"));
    if (ndim != 0)
      throw tw::Error(tw::ErrorCode::type_mismatch,
                      "metadata " + path + " is a NumPy array of shape " + str_of(h.attr("shape")) +
                          "; store a.tolist(), or send the array as a tensor of its own");
    if (kind == "b" || kind == "i" || kind == "u" || kind == "f" || kind == "S" || kind == "U") {
      nb::object v = h.attr("item")();
      // longdouble (and float128) have no Python type: item() gives back a NumPy scalar.
      if (!is_instance_of(v.ptr(), "numpy", "generic")) return to_value(v.ptr(), path, depth + 1);
    }
    throw tw::Error(tw::ErrorCode::type_mismatch,
                    "metadata " + path + " is a NumPy " + str_of(h.attr("dtype")) +
                        " value, which has no metadata type" +
                        (kind == "c"                 ? std::string("; store [x.real, x.imag]")
                         : kind == "M" || kind == "m" ? std::string("; store str(x) or an int count of its unit")
                         : kind == "f"                ? std::string("; store float(x) (a float64)")
                                                      : std::string()));
  }
  if (is_instance_of(o, "datetime", "date") || is_instance_of(o, "datetime", "time") ||
      is_instance_of(o, "datetime", "timedelta"))
    throw tw::Error(tw::ErrorCode::type_mismatch,
                    "metadata " + path + " is a " + type + ", which has no metadata type; store x.isoformat() (str) " +
                        (is_instance_of(o, "datetime", "timedelta") ? "or x.total_seconds() (float)"
                                                                     : "or a timestamp (float)"));
  if (is_instance_of(o, "enum", "Enum"))
    throw tw::Error(tw::ErrorCode::type_mismatch, "metadata " + path + " is an enum member (" +
                                                      std::string(nb::repr(h).c_str()) +
                                                      "), which has no metadata type; store its .value or .name");
  throw tw::Error(tw::ErrorCode::type_mismatch,
                  "metadata " + path + " is of type " + type +
                      "; values must be None, bool, int, float, str, bytes, or lists, tuples and dicts of these");
}

nb::object from_value(const tw::Value& v) {
  using K = tw::Value::Kind;
  switch (v.kind()) {
    case K::none: return nb::none();
    case K::boolean: return nb::bool_(v.as_bool());
    case K::integer: return nb::int_(v.as_int());
    case K::floating: return nb::float_(v.as_float());
    case K::string: return nb::str(v.as_string().data(), v.as_string().size());
    case K::bytes: return nb::bytes(v.as_bytes().data(), v.as_bytes().size());
    case K::list: {
      nb::list l;
      for (const auto& x : v.items()) l.append(from_value(x));
      return l;
    }
    case K::tuple: {
      nb::list l;
      for (const auto& x : v.items()) l.append(from_value(x));
      return nb::tuple(l);
    }
    case K::dict: {
      nb::dict d;
      for (size_t i = 0; i < v.keys().size(); ++i) d[nb::str(v.keys()[i].data(), v.keys()[i].size())] = from_value(v.values()[i]);
      return d;
    }
  }
  return nb::none();
}

bool bool_arg(nb::handle h, const char* what) {
  const std::string t = Py_TYPE(h.ptr())->tp_name;
  if (t == "numpy.bool" || t == "numpy.bool_") return PyObject_IsTrue(h.ptr()) == 1;
  if (!PyBool_Check(h.ptr())) throw nb::type_error((std::string(what) + " must be True or False, not " + t).c_str());
  return h.ptr() == Py_True;
}

int64_t int64_arg(nb::handle h, const std::string& what) {
  if (PyBool_Check(h.ptr()) || !PyIndex_Check(h.ptr()))
    throw tw::Error(tw::ErrorCode::type_mismatch, what + " must be an int, not " + Py_TYPE(h.ptr())->tp_name);
  nb::object i = nb::borrow(h);
  if (!PyLong_Check(h.ptr())) {  // an integer of another type (numpy.int64): its operator.index() value
    i = nb::steal(PyNumber_Index(h.ptr()));
    if (!i.is_valid()) throw nb::python_error();
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow) throw tw::Error(tw::ErrorCode::overflow, what + " " + std::string(nb::repr(h).c_str()) +
                                                          " does not fit in 64 bits");
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

std::optional<tw::Device> parse_device(nb::handle h) {
  if (h.is_none()) return std::nullopt;
  if (nb::isinstance<tw::Device>(h)) return nb::cast<tw::Device>(h);
  if (nb::isinstance<nb::str>(h)) return tw::Device::from_string(nb::cast<std::string>(h));
  if (nb::isinstance<nb::tuple>(h) && nb::len(h) == 2) {
    auto t = nb::borrow<nb::tuple>(h);
    if (nb::isinstance<nb::int_>(t[0]) && nb::isinstance<nb::int_>(t[1])) {
      const int64_t type = int64_arg(t[0], "device type"), id = int64_arg(t[1], "device id");
      if (type < 0 || type > INT32_MAX || id < INT32_MIN || id > INT32_MAX)
        throw tw::Error(tw::ErrorCode::invalid_argument, "device (" + std::to_string(type) + ", " + std::to_string(id) +
                                                             ") is out of range for a DLPack device");
      if (type == kDLCPU && id != 0)
        throw tw::Error(tw::ErrorCode::invalid_argument, "device (1, " + std::to_string(id) + ") does not exist: the "
                                                         "host is one device, 'cpu' (1, 0)");
      return tw::Device::from_dlpack(DLDevice{static_cast<DLDeviceType>(type), static_cast<int32_t>(id)});
    }
  }
  // torch.device and similar: use their string form
  if (nb::hasattr(h, "type") && nb::hasattr(h, "index")) {
    std::string s = nb::cast<std::string>(nb::str(h));
    return tw::Device::from_string(s);
  }
  throw tw::Error(tw::ErrorCode::type_mismatch, "device must be None, a string like 'cpu' or 'cuda:0', a tw.Device or a "
                                                "(device_type, device_id) tuple, not " + std::string(Py_TYPE(h.ptr())->tp_name));
}

CopyMode parse_copy(nb::handle h) {
  if (h.is_none()) return CopyMode::if_needed;
  if (h.ptr() == Py_True) return CopyMode::always;
  if (h.ptr() == Py_False) return CopyMode::never;
  throw tw::Error(tw::ErrorCode::type_mismatch, "copy must be None, True or False, not " + std::string(Py_TYPE(h.ptr())->tp_name));
}

std::optional<std::string> key_text(nb::handle k) {
  if (!PyUnicode_Check(k.ptr())) return std::nullopt;
  Py_ssize_t n;
  const char* s = PyUnicode_AsUTF8AndSize(k.ptr(), &n);
  if (!s) {
    PyErr_Clear();
    return std::nullopt;
  }
  return std::string(s, static_cast<size_t>(n));
}

namespace {

[[noreturn]] void missing_key(nb::handle k) {
  PyErr_SetObject(PyExc_KeyError, k.ptr());
  throw nb::python_error();
}

// A NumPy dtype (or what numpy.dtype() makes of h) as a tw dtype; nullopt when NumPy cannot interpret h at all.
std::optional<tw::DType> dtype_via_numpy(nb::handle h, std::string& why) {
  static nb::handle np_dtype;  // numpy.dtype, looked up once (an import per call cost ~0.6 us); GIL-guarded
  if (!np_dtype.is_valid()) {
    try {
      np_dtype = nb::object(nb::module_::import_("numpy").attr("dtype")).release();
    } catch (nb::python_error&) {
      why = "NumPy is not installed to interpret it";
      return std::nullopt;
    }
  }
  nb::object d;
  try {
    d = np_dtype(h);
  } catch (nb::python_error& e) {
    if (!e.matches(PyExc_TypeError) && !e.matches(PyExc_ValueError)) throw;
    why = error_text(e);
    return std::nullopt;
  }
  const std::string byteorder = nb::cast<std::string>(d.attr("byteorder"));
  if (byteorder == (std::endian::native == std::endian::little ? ">" : "<"))
    throw tw::Error(tw::ErrorCode::invalid_argument,
                    "dtype " + nb::cast<std::string>(nb::str(d)) + " is in non-native byte order; tensorwire "
                    "tensors hold native values (byte-swapped data is swapped on import)");
  // NumPy's own types (type numbers below NPY_USERDEF, 256) of kinds b/i/u/f/c are named "<kind><bits>": the name
  // is made here from kind and size, since dtype.name is a Python-level property (about 2 us, most of a
  // loan(shape, np.float32)). Other dtypes ask NumPy: user-defined ones (ml_dtypes') may say any kind
  // (float8_e5m2's is 'f').
  const bool builtin = nb::cast<long>(d.attr("num")) < 256;
  const std::string kind = builtin ? nb::cast<std::string>(d.attr("kind")) : std::string();
  std::string name;
  if (kind == "b") {
    name = "bool";
  } else if (kind == "i" || kind == "u" || kind == "f" || kind == "c") {
    const long bits = 8 * nb::cast<long>(d.attr("itemsize"));
    name = (kind == "i" ? "int" : kind == "u" ? "uint" : kind == "f" ? "float" : "complex") + std::to_string(bits);
  } else {
    name = nb::cast<std::string>(d.attr("name"));
  }
  try {
    return tw::DType::from_name(name);
  } catch (const tw::Error&) {
    throw tw::Error(tw::ErrorCode::invalid_argument,
                    "NumPy dtype '" + nb::cast<std::string>(nb::str(d)) + "' (" + name + ") has no tensorwire type");
  }
}

}  // namespace

tw::DType parse_dtype(nb::handle h) {
  if (nb::isinstance<tw::DType>(h)) return nb::cast<tw::DType>(h);
  if (PyUnicode_Check(h.ptr())) {
    const std::string s = nb::cast<std::string>(h);
    try {
      return tw::DType::from_name(s);
    } catch (const tw::Error& e) {
      std::string why;
      if (auto d = dtype_via_numpy(h, why)) return *d;  // "f4", "<f4", "double", "float"
      throw;
    }
  }
  if (h.is_none())
    throw tw::Error(tw::ErrorCode::type_mismatch, "dtype must be given (a name, a NumPy/PyTorch/ml_dtypes dtype or a "
                                                  "tensorwire.DType), not None");
  // PyTorch: torch.float32 and friends print as "torch.<name>", tensorwire's spelling of every shared type.
  if (std::strcmp(Py_TYPE(h.ptr())->tp_name, "torch.dtype") == 0) {
    std::string s = nb::cast<std::string>(nb::str(h));
    if (s.rfind("torch.", 0) == 0) s = s.substr(6);
    try {
      return tw::DType::from_name(s);
    } catch (const tw::Error&) {
      throw tw::Error(tw::ErrorCode::invalid_argument, "PyTorch dtype torch." + s + " has no tensorwire type");
    }
  }
  std::string why;
  if (auto d = dtype_via_numpy(h, why)) return *d;  // np.float32, np.dtype('f4'), ml_dtypes.bfloat16, float
  throw tw::Error(tw::ErrorCode::type_mismatch,
                  std::string("dtype must be a name, a NumPy/PyTorch/ml_dtypes dtype or a tensorwire.DType, not ") +
                      Py_TYPE(h.ptr())->tp_name + " (" + why + ")");
}

// A CUDA stream argument: an int handle (1 legacy default, 2 per-thread default), an object with
// __cuda_stream__ (the CUDA stream protocol: returns (version, handle)), a torch.cuda.Stream (.cuda_stream) or a
// cupy Stream (.ptr). None: nullopt.
std::optional<intptr_t> parse_stream(nb::handle h) {
  if (h.is_none()) return std::nullopt;
  nb::object v;
  bool object = true;
  if (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr())) {
    v = nb::borrow(h);
    object = false;
  } else if (nb::hasattr(h, "__cuda_stream__")) {
    nb::object r = h.attr("__cuda_stream__")();
    if (!nb::isinstance<nb::tuple>(r) || nb::len(r) != 2)
      throw tw::Error(tw::ErrorCode::type_mismatch, "stream: __cuda_stream__() must return (version, handle)");
    v = nb::borrow<nb::tuple>(r)[1];
  } else if (nb::hasattr(h, "cuda_stream")) {
    v = h.attr("cuda_stream");
  } else if (nb::hasattr(h, "ptr") && !nb::isinstance<tw::Tensor>(h)) {
    v = h.attr("ptr");
  } else {
    throw tw::Error(tw::ErrorCode::type_mismatch,
                    std::string("stream must be None, an int handle, or a stream object (__cuda_stream__, "
                                "torch.cuda.Stream, cupy.cuda.Stream), not ") + Py_TYPE(h.ptr())->tp_name);
  }
  if (!PyLong_Check(v.ptr()) || PyBool_Check(v.ptr()))
    throw tw::Error(tw::ErrorCode::type_mismatch, "stream: the handle is not an int");
  const int64_t x = int64_arg(v, "stream");
  // A stream object's handle 0 is its library's default stream: torch's and CuPy's are the legacy one.
  if (x == 0 && object) return intptr_t{1};
  if (x == 0)
    throw tw::Error(tw::ErrorCode::invalid_argument, "stream 0 is ambiguous (the legacy or the per-thread default "
                                                     "stream); pass 1 (legacy), 2 (per-thread) or a stream handle");
  if (x < 0) throw tw::Error(tw::ErrorCode::invalid_argument, "stream " + std::to_string(x) + " is not a stream");
  if (x > 2 && x < 4096)  // (a handle is the address of the driver's object, never in the first page)
    throw tw::Error(tw::ErrorCode::invalid_argument, "stream " + std::to_string(x) + " is neither 1 (legacy default), "
                                                     "2 (per-thread default) nor a stream handle");
  return static_cast<intptr_t>(x);
}

namespace {

nb::handle g_tensor_type;

// (int64_arg: one past 64 bits names the value, where PyNumber_AsSsize_t said "cannot fit 'int' into an
// index-sized integer")
int64_t as_index(nb::handle h, const char* what) { return int64_arg(h, what); }

// One integer, Python's or NumPy's (np.int64, a 0-d integer array: what np.prod(shape) gives), not a bool.
bool index_scalar(nb::handle h) {
  if (PyBool_Check(h.ptr())) return false;
  if (PyLong_Check(h.ptr())) return true;
  if (!PyIndex_Check(h.ptr()) || PyTuple_Check(h.ptr()) || PyList_Check(h.ptr())) return false;
  PyObject* nd = PyObject_GetAttrString(h.ptr(), "ndim");  // (an array of rank > 0 is a sequence of them)
  if (!nd) {
    PyErr_Clear();
    return true;
  }
  const long k = PyLong_Check(nd) ? PyLong_AsLong(nd) : -1;
  Py_DECREF(nd);
  PyErr_Clear();
  return k == 0;
}

tw::Dims dims_from(nb::handle h, const char* what) {
  tw::Dims d;
  if (index_scalar(h)) {
    d.push_back(as_index(h, what));
    return d;
  }
  if (!PyTuple_Check(h.ptr()) && !PyList_Check(h.ptr()))
    throw tw::Error(tw::ErrorCode::type_mismatch, std::string(what) + " must be a tuple of ints, not " + Py_TYPE(h.ptr())->tp_name);
  for (nb::handle x : h) d.push_back(as_index(x, what));
  return d;
}

// Whether h names a dtype (a name, a NumPy/PyTorch/ml_dtypes dtype, a scalar type, a tensorwire.DType).
std::optional<tw::DType> dtype_like(nb::handle h) {
  try {
    return parse_dtype(h);
  } catch (const nb::python_error&) {
    return std::nullopt;
  } catch (const tw::Error&) {
    return std::nullopt;
  }
}

nb::tuple to_tuple(const tw::Dims& d) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(d.size()));
  for (size_t i = 0; i < d.size(); ++i) PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), PyLong_FromLongLong(d[i]));
  return nb::steal<nb::tuple>(t);
}

tw::MemoryOrder parse_order(nb::handle h) {
  if (!PyUnicode_Check(h.ptr()))
    throw tw::Error(tw::ErrorCode::type_mismatch,
                    std::string("order must be 'C', 'F', 'A', 'K' or 'any', not ") + Py_TYPE(h.ptr())->tp_name);
  const std::string order = nb::cast<std::string>(h);
  if (order == "C") return tw::MemoryOrder::C;
  if (order == "F") return tw::MemoryOrder::F;
  if (order == "A" || order == "any" || order == "K") return tw::MemoryOrder::Any;
  throw tw::Error(tw::ErrorCode::invalid_argument,
                  "order must be 'C', 'F', 'A', 'K' or 'any' (the last three: whichever layout is cheapest), not '" +
                      order + "'");
}

// Copies at least this big release the GIL.
constexpr int64_t kReleaseGilBytes = 1 << 16;


nb::dict pool_stats_dict(const tw::cuda::PoolStats& st) {
  nb::dict d;
  d["reserved_bytes"] = st.reserved_bytes;
  d["in_use_bytes"] = st.in_use_bytes;
  d["cached_blocks"] = st.cached_blocks;
  d["hits"] = st.hits;
  d["misses"] = st.misses;
  return d;
}

tw::Device target_device(nb::handle device, bool pinned, const char* what) {
  std::optional<tw::Device> d = parse_device(device);
  if (pinned) {
    if (d && d->type != kDLCUDAHost && d->type != kDLCPU)
      throw tw::Error(tw::ErrorCode::invalid_argument, std::string(what) + ": pinned=True is host memory; it cannot "
                                                       "be on " + d->str());
    return tw::Device::cuda_host();
  }
  return d.value_or(tw::Device::cpu());
}

tw::Tensor copy_released(const tw::Tensor& t, tw::MemoryOrder order) {
  if (t.nbytes() >= kReleaseGilBytes) {
    ReleaseGil nogil;
    return t.copy(order);
  }
  return t.copy(order);
}

// The metadata key of tensorwire.torch's subclass descriptions (tensorwire/torch.py: METADATA_KEY).
constexpr const char* kSubclassKey = "tensorwire.torch";

// A view that reorders or reverses dimensions no longer shows what a subclass description in its metadata
// describes (a square box tensor's .T still has the recorded shape). tensorwire.torch.to_torch sees that from the
// view's layout, but a copy of the view does not (copy() packs it in C order, and so does a send of a view that
// is not dense): the view drops the description.
tw::Tensor without_subclass(tw::Tensor v) {
  if (v.metadata().contains(kSubclassKey)) v.metadata().erase(kSubclassKey);
  return v;
}

// Whether `order` moves a dimension of extent > 1 relative to another such dimension.
bool reorders(const tw::Tensor& t, const tw::Dims& order) {
  std::vector<int64_t> moved;
  const auto nd = static_cast<int64_t>(t.ndim());
  for (int64_t d : order) {
    const int64_t k = d < 0 ? d + nd : d;
    if (k >= 0 && k < nd && t.shape()[static_cast<size_t>(k)] > 1) moved.push_back(k);
  }
  return !std::is_sorted(moved.begin(), moved.end());
}

// An array of integers with an __index__ (a one-element torch or tw tensor, a NumPy array): advanced indexing in
// NumPy and PyTorch (t[torch.tensor([1])] keeps a dimension), never a scalar index here (which dropped it).
bool is_array_index(nb::handle x) {
  if (PyLong_Check(x.ptr())) return false;
  PyObject* nd = PyObject_GetAttrString(x.ptr(), "ndim");
  if (!nd) {
    PyErr_Clear();
    return false;
  }
  const long n = PyLong_Check(nd) ? PyLong_AsLong(nd) : 0;
  Py_DECREF(nd);
  if (n == -1 && PyErr_Occurred()) PyErr_Clear();
  return n != 0;
}

// t[index]: ints, slices, Ellipsis and None, alone or in a tuple (NumPy basic indexing).
tw::Tensor index_tensor(const tw::Tensor& t, nb::handle index) {
  std::vector<nb::handle> items;
  if (PyTuple_Check(index.ptr())) {
    for (nb::handle x : index) items.push_back(x);
  } else {
    items.push_back(index);
  }
  size_t consumed = 0, ellipses = 0;
  for (auto x : items) {
    if (x.ptr() == Py_Ellipsis) ++ellipses;
    else if (!x.is_none()) ++consumed;
  }
  if (ellipses > 1) throw tw::Error(tw::ErrorCode::out_of_range, "an index can only have a single ellipsis ('...')");
  if (consumed > t.ndim())
    throw tw::Error(tw::ErrorCode::out_of_range, "too many indices: " + std::to_string(consumed) + " for a tensor of rank " +
                                                     std::to_string(t.ndim()));
  tw::Tensor r = t;
  int64_t dim = 0;  // current dimension of r
  size_t src_dim = 0;  // the dimension of t it comes from (errors name t's dimensions, as NumPy's do)
  std::vector<int64_t> new_axes;
  for (auto x : items) {
    if (x.ptr() == Py_Ellipsis) {
      dim += static_cast<int64_t>(t.ndim() - consumed);
      src_dim += t.ndim() - consumed;
    } else if (x.is_none()) {
      new_axes.push_back(dim);
      tw::Shape sh = r.shape();
      std::vector<int64_t> s(sh.begin(), sh.end()), st(r.strides().begin(), r.strides().end());
      s.insert(s.begin() + dim, 1);
      st.insert(st.begin() + dim, 0);
      r = r.view(tw::Shape(s));
      ++dim;
    } else if (PySlice_Check(x.ptr())) {
      Py_ssize_t start, stop, step;
      PySliceObject* sl = reinterpret_cast<PySliceObject*>(x.ptr());
      if (sl->step != Py_None && PyIndex_Check(sl->step)) {  // a zero step, named (PySlice_Unpack's words are not)
        const Py_ssize_t st = PyNumber_AsSsize_t(sl->step, nullptr);  // (its __index__, clamped)
        if (st == -1 && PyErr_Occurred()) throw nb::python_error();
        if (st == 0) throw tw::Error(tw::ErrorCode::invalid_argument, "slice step cannot be zero");
      }
      if (PySlice_Unpack(x.ptr(), &start, &stop, &step) < 0) throw nb::python_error();
      std::optional<int64_t> b = sl->start == Py_None ? std::nullopt : std::optional<int64_t>(start);
      std::optional<int64_t> e = sl->stop == Py_None ? std::nullopt : std::optional<int64_t>(stop);
      const bool reversed = step < 0 && r.shape()[static_cast<size_t>(dim)] > 1;
      r = r.slice(dim, b, e, step);
      if (reversed) r = without_subclass(std::move(r));
      ++dim;
      ++src_dim;
    } else if (PyIndex_Check(x.ptr()) && !PyBool_Check(x.ptr()) && !is_array_index(x)) {
      const int64_t n = r.shape()[static_cast<size_t>(dim)];
      int64_t i = 0;
      try {
        i = as_index(x, "index");
      } catch (const tw::Error& e) {  // beyond 64 bits: out of range for any dimension, an IndexError as NumPy's
        if (e.code() != tw::ErrorCode::overflow) throw;
        throw tw::Error(tw::ErrorCode::out_of_range, std::string(e.what()) + ": it is out of range for dimension " +
                                                         std::to_string(src_dim) + " of size " + std::to_string(n));
      }
      if (i < -n || i >= n)
        throw tw::Error(tw::ErrorCode::out_of_range, "index " + std::to_string(i) + " is out of range for dimension " +
                                                         std::to_string(src_dim) + " of size " + std::to_string(n));
      r = r.select(dim, i);
      ++src_dim;
    } else {
      throw tw::Error(tw::ErrorCode::type_mismatch,
                      std::string("tensorwire supports basic indexing only (ints, slices, ..., None), not ") +
                          Py_TYPE(x.ptr())->tp_name + "; for advanced indexing use np.asarray(t)[...] or torch");
    }
  }
  return r;
}

// A spent loan (handed over by Publisher.send) or any undefined tensor: every use raises, as layout() does; for
// the accessors that read no layout (metadata, readonly, stream, transport), which answered as if it were empty.
template <class T>
T& live(T& t) {
  if (!t.defined()) (void)t.layout();  // throws, naming a spent loan
  return t;
}

std::string repr(const tw::Tensor& t) {
  // Never raises: a loan handed over by Publisher.send (or any undefined tensor) says so.
  if (!t.defined()) return "tensorwire.Tensor(<spent: a loan handed over by Publisher.send>)";
  std::string s = "tensorwire.Tensor(shape=" + t.shape().str() + ", dtype=" + t.dtype().name() +
                  ", device=" + t.device().str();
  if (!t.is_contiguous()) s += ", strides=" + t.strides().str();
  if (t.byte_offset()) s += ", byte_offset=" + std::to_string(t.byte_offset());
  if (t.readonly()) s += ", readonly=True";
  if (!t.metadata().empty()) s += ", metadata_keys=" + std::to_string(t.metadata().size());
  return s + ")";
}

}  // namespace

// Allocates the instance directly (no type-map lookup, no cast machinery): every import ends here.
nb::object wrap(tw::Tensor t) {
  nb::object o = nb::inst_alloc(g_tensor_type);
  new (nb::inst_ptr<tw::Tensor>(o)) tw::Tensor(std::move(t));
  nb::inst_mark_ready(o);
  return o;
}
bool is_tensor(nb::handle h) { return Py_TYPE(h.ptr()) == reinterpret_cast<PyTypeObject*>(g_tensor_type.ptr()) || nb::isinstance<tw::Tensor>(h); }
tw::Tensor& unwrap(nb::handle h) { return *nb::inst_ptr<tw::Tensor>(h); }

}  // namespace twpy

using namespace twpy;

NB_MODULE(_tensorwire, m) {
  tw::cuda::install_runtime();  // interop reaches the driver through it (CUDA Array Interface, Arrow events)
  m.doc() = "tensorwire native core";
  register_signatures(m);
  m.def("_python_message", &python_message, "Internal: a tw::Error text as Python users read it (for tests).");
  // Tensor gains Python-level attributes (metadata, __array__, pickling) in the package, which nanobind's
  // shutdown leak report would misread as leaks of the type.
  nb::set_leak_warnings(false);

  nb::object bases = nb::make_tuple(nb::handle(PyExc_BufferError), nb::handle(PyExc_ValueError));
  g_copy_error = PyErr_NewExceptionWithDoc(
      "tensorwire.CopyError",
      "Raised when an operation needs a copy and copy=False forbade it. A BufferError and a ValueError.",
      bases.ptr(), nullptr);
  m.attr("CopyError") = nb::handle(g_copy_error);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const tw::Error& e) {
      PyErr_SetString(exception_for(e.code()), python_message(e.what()).c_str());
    }
  });

  // ---- DType ------------------------------------------------------------------------------------------------
  nb::class_<tw::DType>(m, "DType", "An element type (DLPack code, bits, lanes); str() gives its NumPy/PyTorch name.")
      .def("__init__", [](tw::DType* self, nb::handle dtype) { new (self) tw::DType(parse_dtype(dtype)); },
           nb::sig("def __init__(self, dtype: object) -> None"), "dtype"_a.none(),
           "DType(dtype): from a name, a NumPy/PyTorch/ml_dtypes dtype or another DType.")
      .def_prop_ro("name", &tw::DType::name, "The canonical name ('float32', 'bfloat16', ...).")
      .def_prop_ro("code", [](const tw::DType& d) { return d.code; }, "The DLPack type code (kDLInt, kDLUInt, kDLFloat, ...).")
      .def_prop_ro("bits", [](const tw::DType& d) { return d.bits; }, "Bits per lane.")
      .def_prop_ro("lanes", [](const tw::DType& d) { return d.lanes; }, "Vector lanes per element (1 for every scalar type).")
      .def_prop_ro("itemsize", [](const tw::DType& d) { return d.itemsize(); },
                   "Bytes per element when stored one per byte or wider (1 for sub-byte types).")
      .def("__str__", &tw::DType::name)
      .def("__repr__", [](const tw::DType& d) { return "tensorwire.DType('" + d.name() + "')"; })
      .def("__hash__", [](const tw::DType& d) { return nb::hash(nb::str(d.name().c_str())); })
      .def("__eq__", [](const tw::DType& d, nb::handle o) {
        // Equal to whatever names the same type: "float32", np.float32, np.dtype("f4"), torch.float32, ...
        if (nb::isinstance<tw::DType>(o)) return d == nb::cast<tw::DType>(o);
        if (o.is_none()) return false;
        try {
          return d == parse_dtype(o);
        } catch (const tw::Error&) {
          return false;
        } catch (nb::python_error&) {
          return false;
        }
      }, "other"_a.none())
      .def("__ne__", [](nb::handle self, nb::handle o) { return !nb::cast<bool>(self.attr("__eq__")(o)); },
           "other"_a.none());

  // ---- Device -----------------------------------------------------------------------------------------------
  nb::class_<tw::Device>(m, "Device", "A DLPack device: (device_type, device_id); str() gives 'cpu' or 'cuda:0'.")
      .def("__init__", [](tw::Device* self, nb::handle spec, nb::handle index) {
        std::optional<tw::Device> d;
        if (index.is_none()) {
          d = parse_device(spec);
        } else {  // Device('cuda', 1), as torch.device('cuda', 1)
          if (!PyUnicode_Check(spec.ptr()))
            throw tw::Error(tw::ErrorCode::type_mismatch,
                            std::string("tensorwire.Device: with an index, the device type must be a str such as "
                                        "'cuda', not ") + Py_TYPE(spec.ptr())->tp_name);
          const std::string type = nb::cast<std::string>(spec);
          if (type.find(':') != std::string::npos)
            throw tw::Error(tw::ErrorCode::invalid_argument,
                            "tensorwire.Device: '" + type + "' names an index already; pass the index once");
          const int64_t i = int64_arg(index, "tensorwire.Device: index");
          d = parse_device(nb::str((type + ":" + std::to_string(i)).c_str()));
        }
        if (!d) throw tw::Error(tw::ErrorCode::invalid_argument, "Device(None) is not a device");
        new (self) tw::Device(*d);
      }, "spec"_a.none(), "index"_a.none() = nb::none(),
         "A device from 'cpu', 'cuda', 'cuda:1', ('cuda', 1) as torch.device takes it, a tw.Device or a DLPack "
         "(device_type, device_id) tuple.")
      .def_prop_ro("type", [](const tw::Device& d) { return std::string(d.type_name()); }, "The device kind as a name ('cpu', 'cuda', 'cuda_host', ...).")
      .def_prop_ro("device_type", [](const tw::Device& d) { return static_cast<int>(d.type); }, "The DLPack device type code (1 cpu, 2 cuda, 3 cuda_host, ...).")
      .def_prop_ro("host_accessible", [](const tw::Device& d) { return d.is_host_accessible(); },
                   "True when the host can read this memory directly (cpu, CUDA/ROCm pinned, CUDA managed).")
      .def_prop_ro("index", [](const tw::Device& d) { return d.id; }, "The device number (0 for the host).")
      .def("__str__", &tw::Device::str)
      .def("__repr__", [](const tw::Device& d) { return "tensorwire.Device('" + d.str() + "')"; })
      .def("__hash__", [](const tw::Device& d) { return nb::hash(nb::str(d.str().c_str())); })
      .def("__eq__", [](const tw::Device& d, nb::handle o) {
        try {
          auto other = parse_device(o);
          return other && *other == d;
        } catch (...) {
          return false;
        }
      }, "other"_a.none());

  // ---- Tensor -----------------------------------------------------------------------------------------------
  nb::class_<tw::Tensor> cls(m, "Tensor", nb::type_slots(tensor_slots), nb::is_weak_referenceable(),
                             "A strided view of memory on a device, the owner that keeps that memory alive, and "
                             "metadata. Create one with tensorwire.asarray().");
  g_tensor_type = cls;
  cls.def_prop_ro("shape", [](const tw::Tensor& t) { return to_tuple(t.shape()); }, "Size of each dimension, as a tuple of ints.")
      .def_prop_ro("strides", [](const tw::Tensor& t) { return to_tuple(t.strides()); }, "Strides in elements.")
      .def_prop_ro("byte_strides", [](const tw::Tensor& t) { return to_tuple(tw::Dims(t.byte_strides())); }, "Strides in bytes (NumPy's convention); `strides` counts elements.")
      .def_prop_ro("byte_offset", [](const tw::Tensor& t) { return t.byte_offset(); },
                   "Bytes from the allocation's base to element 0.")
      .def_prop_ro("nbytes", [](const tw::Tensor& t) { return t.nbytes(); }, "Bytes the elements occupy (size * itemsize; sub-byte types rounded up).")
      .def_prop_ro("ndim", [](const tw::Tensor& t) { return t.ndim(); }, "Number of dimensions (0 for a scalar tensor).")
      .def_prop_ro("size", [](const tw::Tensor& t) { return t.numel(); }, "Number of elements.")
      .def_prop_ro("itemsize", [](const tw::Tensor& t) { return t.dtype().itemsize(); }, "Bytes per element.")
      .def_prop_ro("transport", [](const tw::Tensor& t) -> nb::object {
        const char* tr = live(t).buffer().transport();
        if (!tr) return nb::none();
        return nb::str(tr);
      }, "How a received tensor's memory arrived: 'shm' (shared memory, no copy), 'ucx' (from another machine, "
         "layout kept), 'ucx-packed' (from another machine, packed dense by the sender); None when no transport "
         "made it.")
      .def_prop_ro("readonly", [](const tw::Tensor& t) { return live(t).readonly(); }, "True when the memory must not be written (received messages, read-only producers, as_readonly()).")
      .def_prop_ro("data_ptr", [](const tw::Tensor& t) {
        t.buffer().mark_escaped();  // a raw address: whoever holds it can write without being counted
        return reinterpret_cast<uintptr_t>(t.data_ptr());
      },
                   "Address of element (0, ..., 0): allocation base + byte_offset.")
      .def_prop_ro("allocation", [](const tw::Tensor& t) {
        return nb::make_tuple(reinterpret_cast<uintptr_t>(t.buffer().base()), t.buffer().size());
      }, "(base address, byte size) of the memory block the tensor lives in.")
      .def_prop_ro("dtype", [](const tw::Tensor& t) { return t.dtype(); }, "The element type, a tensorwire.DType.")
      .def_prop_ro("device", [](const tw::Tensor& t) { return t.device(); }, "Where the memory lives, a tensorwire.Device ('cpu', 'cuda:0', ...).")
      .def_prop_ro("stream", [](const tw::Tensor& t) { return live(t).stream(); }, "The CUDA stream the data is ordered on (1: the legacy default, 2: per-thread, else a handle), or None: for an "
                   "import, the producer's stream, which the producer may have destroyed since (tensorwire's own uses "
                   "wait on an event recorded on it at import, never on the stream); for to(), copy() and empty(), "
                   "the stream their work was queued on; for a received tensor, the stream it arrived on.")
      .def_prop_ro("subbyte_padded", [](const tw::Tensor& t) { return t.subbyte_padded(); }, "True when sub-byte elements (int4, float4...) are stored one per byte.")
      .def("is_contiguous", [](const tw::Tensor& t, nb::handle order) {
        return t.is_contiguous(as_python("tensorwire.Tensor.is_contiguous", [&] { return parse_order(order); }));
      },
           nb::sig("def is_contiguous(self, order: str = 'C') -> bool"),
           "order"_a.none() = "C", "True when dense in C order ('C'), Fortran order ('F'), or some order ('any').")
      .def("contiguous", [](nb::handle self) -> nb::object {
        const tw::Tensor& t = unwrap(self);
        if (t.is_contiguous()) return nb::borrow(self);
        return wrap(as_python("tensorwire.Tensor.contiguous", [&] { return copy_released(t, tw::MemoryOrder::C); }));
      }, "This tensor when already C-contiguous (the same object); otherwise a C-contiguous copy.")
      .def("to", [](nb::handle self, nb::handle device, nb::handle stream, nb::handle copy) -> nb::object {
        const tw::Tensor& t = unwrap(self);
        const std::optional<tw::Device> dev = as_python("tensorwire.Tensor.to", [&] { return parse_device(device); });
        if (!dev) throw tw::Error(tw::ErrorCode::invalid_argument, "tensorwire.Tensor.to: device must not be None");
        const std::optional<intptr_t> s = as_python("tensorwire.Tensor.to", [&] { return parse_stream(stream); });
        std::optional<bool> c;
        if (!copy.is_none()) {
          if (!PyBool_Check(copy.ptr()))
            throw tw::Error(tw::ErrorCode::type_mismatch, "tensorwire.Tensor.to: copy must be None, True or False");
          c = copy.ptr() == Py_True;
        }
        if (s && dev->type == kDLCPU && t.device().type == kDLCPU)
          throw nb::value_error(("tensorwire.Tensor.to: stream=" + std::to_string(*s) + " orders CUDA work, and a "
                                 "move from cpu to cpu has none; leave stream unset").c_str());
        if (*dev == t.device() && c != true) return nb::borrow(self);
        return wrap(as_python("tensorwire.Tensor.to", [&] {
          ReleaseGil nogil;  // a copy may wait for a stream
          return t.to(*dev, s, c);
        }));
      }, "device"_a.none(), nb::kw_only(), "stream"_a = nb::none(), "copy"_a = nb::none(),
         "This tensor on `device` ('cpu', 'cuda:N', 'cuda_host' = pinned): the same object when already there "
         "(copy=None), else one copy keeping a dense layout's order, dtype and metadata. copy=True always copies; "
         "copy=False raises CopyError instead of copying. CUDA work is queued on `stream` (an int handle, "
         "torch/cupy stream or __cuda_stream__ object; default: the legacy default stream) after "
         "the tensor's own stream, through an event; a device result carries `stream` (and an event on it unless "
         "it is the legacy stream), a pinned or cpu result is ready when this returns.")
      .def("pin", [](nb::handle self) -> nb::object {
        const tw::Tensor& t = unwrap(self);
        if (t.pinned()) return nb::borrow(self);
        return wrap(as_python("tensorwire.Tensor.pin", [&] {
          ReleaseGil nogil;
          return t.pin();
        }));
      }, "A copy in pinned (page-locked) host memory from tensorwire's pinned pool: dtype, shape, strides and "
         "metadata kept; the same object when already pinned. Host-to-device copies from it are asynchronous.")
      .def_prop_ro("pinned", [](const tw::Tensor& t) { return t.pinned(); },
                   "True for pinned host memory (device 'cuda_host').")
      .def("copy", [](const tw::Tensor& t, nb::handle order) {
        const tw::MemoryOrder o = as_python("tensorwire.Tensor.copy", [&] { return parse_order(order); });
        return as_python("tensorwire.Tensor.copy", [&] { return copy_released(t, o); });
      },
           nb::sig("def copy(self, order: str = 'C') -> Tensor"),
           "order"_a.none() = "C", "A new tensor with its own memory ('C', 'F', or 'any' to keep a dense layout's order).")
      .def("permute", [](const tw::Tensor& t, nb::args dims) {
        const char* what = "tensorwire.Tensor.permute: dims";
        const tw::Dims order = dims.size() == 1 && !index_scalar(dims[0]) ? dims_from(dims[0], what)
                                                                                : dims_from(nb::tuple(dims), what);
        tw::Tensor v = t.permute(order);
        return reorders(t, order) ? without_subclass(std::move(v)) : v;
      }, nb::sig("def permute(self, *dims: int) -> Tensor"),
      "permute(*dims) or permute(dims): a view with the dimensions reordered (no copy).")
      .def("transpose", [](const tw::Tensor& t, nb::handle a, nb::handle b) {
        const int64_t d0 = int64_arg(a, "tensorwire.Tensor.transpose: dim0");
        const int64_t d1 = int64_arg(b, "tensorwire.Tensor.transpose: dim1");
        tw::Tensor v = t.transpose(d0, d1);
        std::vector<int64_t> order;
        const auto nd = static_cast<int64_t>(t.ndim());
        for (int64_t i = 0; i < nd; ++i) order.push_back(i);
        std::swap(order[static_cast<size_t>(d0 < 0 ? d0 + nd : d0)], order[static_cast<size_t>(d1 < 0 ? d1 + nd : d1)]);
        return reorders(t, tw::Dims(order)) ? without_subclass(std::move(v)) : v;
      }, nb::sig("def transpose(self, dim0: int, dim1: int) -> Tensor"), "dim0"_a.none(), "dim1"_a.none(),
           "A view with dimensions dim0 and dim1 swapped (no copy); negative dimensions count from the end.")
      .def_prop_ro("T", [](const tw::Tensor& t) {
        std::vector<int64_t> p;
        for (size_t i = t.ndim(); i-- > 0;) p.push_back(static_cast<int64_t>(i));
        tw::Tensor v = t.permute(tw::Dims(p));
        return reorders(t, tw::Dims(p)) ? without_subclass(std::move(v)) : v;
      }, "The view with every dimension reversed (no copy), as NumPy's .T.")
      .def("view", [](const tw::Tensor& t, nb::args shape) -> tw::Tensor {
        // torch's view(dtype) reinterprets bits; tensorwire's view only reshapes: say so rather than "not str".
        std::optional<tw::DType> dt;
        if (shape.size() == 1 && !index_scalar(shape[0]) && !PyTuple_Check(shape[0].ptr()) &&
            !PyList_Check(shape[0].ptr()) && (dt = dtype_like(shape[0])))
          throw tw::Error(tw::ErrorCode::type_mismatch,
                          "tensorwire.Tensor.view takes a shape, not a dtype (" + dt->name() +
                              "): tensorwire does not reinterpret bits; use np.asarray(t).view(dtype) or "
                              "torch.from_dlpack(t).view(dtype)");
        const char* what = "tensorwire.Tensor.view: shape";
        if (shape.size() == 1 && !index_scalar(shape[0])) return t.view(dims_from(shape[0], what));
        return t.view(dims_from(nb::tuple(shape), what));
      }, nb::sig("def view(self, *shape: int) -> Tensor"),
      "view(*shape) or view(shape): a view with a new shape (one dimension may be -1); raises tw.CopyError when "
      "the strides cannot express it without a copy (use reshape).")
      .def("reshape", [](const tw::Tensor& t, nb::args shape) {
        const char* what = "tensorwire.Tensor.reshape: shape";
        tw::Dims d = shape.size() == 1 && !index_scalar(shape[0]) ? dims_from(shape[0], what)
                                                                         : dims_from(nb::tuple(shape), what);
        return as_python("tensorwire.Tensor.reshape", [&] { return t.reshape(d); });
      }, nb::sig("def reshape(self, *shape: int) -> Tensor"),
      "reshape(*shape) or reshape(shape): a view with a new shape when the strides allow it, else a C-contiguous "
      "copy reshaped (one dimension may be -1).")
      .def("expand", [](const tw::Tensor& t, nb::args shape) {
        const char* what = "tensorwire.Tensor.expand: shape";
        tw::Dims d = shape.size() == 1 && !index_scalar(shape[0]) ? dims_from(shape[0], what)
                                                                         : dims_from(nb::tuple(shape), what);
        return t.expand(d);
      }, nb::sig("def expand(self, *shape: int) -> Tensor"),
      "expand(*shape) or expand(shape): broadcast size-1 dimensions with stride 0 (no copy); -1 keeps a size.")
      .def("select", [](const tw::Tensor& t, nb::handle dim, nb::handle index) {
        return t.select(int64_arg(dim, "tensorwire.Tensor.select: dim"),
                        int64_arg(index, "tensorwire.Tensor.select: index"));
      }, nb::sig("def select(self, dim: int, index: int) -> Tensor"), "dim"_a.none(), "index"_a.none(),
           "The view at `index` along `dim`, with that dimension removed (t.select(0, i) is t[i]); negative "
           "values count from the end.")
      .def("slice", [](const tw::Tensor& t, nb::handle dim, nb::handle start, nb::handle stop, nb::handle step) {
        const auto opt = [](nb::handle h, const char* what) {
          return h.is_none() ? std::nullopt : std::optional<int64_t>(int64_arg(h, what));
        };
        const int64_t st = int64_arg(step, "tensorwire.Tensor.slice: step");
        tw::Tensor v = t.slice(int64_arg(dim, "tensorwire.Tensor.slice: dim"), opt(start, "tensorwire.Tensor.slice: start"),
                               opt(stop, "tensorwire.Tensor.slice: stop"), st);
        return st < 0 ? without_subclass(std::move(v)) : v;  // (reversed)
      }, nb::sig("def slice(self, dim: int, start: int | None = None, stop: int | None = None, step: int = 1) -> Tensor"),
         "dim"_a.none(), "start"_a.none() = nb::none(), "stop"_a.none() = nb::none(), "step"_a.none() = 1,
           "The view of elements start:stop:step along `dim`, as Python slicing (negative steps give negative "
           "strides); no copy.")
      .def("as_readonly", &tw::Tensor::as_readonly, "A read-only view of the same memory (exports carry the flag).")
      // .none(): nanobind refuses None for an argument unless told; t[None] inserts an axis
      .def("__getitem__", [](const tw::Tensor& t, nb::handle index) {
             return as_python("tensorwire.Tensor.__getitem__", [&] { return index_tensor(t, index); });
           },
           "index"_a.none())
      .def("__len__", [](const tw::Tensor& t) {
        if (t.ndim() == 0) throw nb::type_error("len() of a 0-d tensor");
        return t.shape()[0];
      })
      .def("__repr__", &repr)
      // metadata primitives; the MutableMapping view lives in the Python package
      .def("_meta_keys", [](const tw::Tensor& t) {
        nb::list l;
        for (const auto& k : live(t).metadata().keys()) l.append(nb::str(k.data(), k.size()));
        return l;
      })
      .def("_meta_get", [](const tw::Tensor& t, nb::handle k) -> nb::object {
        const auto key = key_text(k);
        const tw::Value* v = key ? live(t).metadata().find(*key) : nullptr;
        if (!v) missing_key(k);
        return from_value(*v);
      }, "key"_a.none())
      .def("_meta_get_or", [](const tw::Tensor& t, nb::handle k, nb::handle fallback) -> nb::object {
        // (Metadata.get: the mixin's try/except around __getitem__ costs a C++ exception per missing key, ~4 us)
        const auto key = key_text(k);
        const tw::Value* v = key ? live(t).metadata().find(*key) : nullptr;
        return v ? from_value(*v) : nb::borrow(fallback);
      }, "key"_a.none(), "default"_a.none())
      .def("_meta_set", [](tw::Tensor& t, nb::handle k, nb::handle v) {
        if (!PyUnicode_Check(k.ptr()))
          throw tw::Error(tw::ErrorCode::type_mismatch,
                          std::string("metadata keys must be str, not ") + Py_TYPE(k.ptr())->tp_name);
        const auto key = key_text(k);
        if (!key) throw tw::Error(tw::ErrorCode::invalid_argument, kSurrogateKey);
        live(t).metadata().set(*key, to_value(v.ptr(), "['" + *key + "']"));
      }, "key"_a.none(), "value"_a.none())
      .def("_meta_replace", [](tw::Tensor& t, nb::handle mapping) {
        live(t).metadata() = metadata_from(mapping);  // (converted whole first: a refused value leaves the old metadata)
      }, "mapping"_a.none())
      .def("_meta_del", [](tw::Tensor& t, nb::handle k) {
        const auto key = key_text(k);
        if (!key || !live(t).metadata().erase(*key)) missing_key(k);
      }, "key"_a.none())
      .def("_meta_len", [](const tw::Tensor& t) { return live(t).metadata().size(); })
      .def("_meta_contains", [](const tw::Tensor& t, nb::handle k) {
        const auto key = key_text(k);
        return key && live(t).metadata().contains(*key);
      })
      .def("_meta_clear", [](tw::Tensor& t) { live(t).metadata().clear(); })
      .def("_meta_encode", [](const tw::Tensor& t) {
        std::string s = tw::encode_metadata(live(t).metadata());
        return nb::bytes(s.data(), s.size());
      })
      .def("_meta_decode", [](tw::Tensor& t, nb::bytes b) {
        live(t).metadata() = tw::decode_metadata(std::string_view(b.c_str(), b.size()));
      })
      .def("_byte_view", [](const tw::Tensor& t) {
        // The raw bytes of a C-contiguous host tensor as a 1-D uint8 tensor over the same memory (pickling).
        if (!t.is_contiguous()) throw tw::Error(tw::ErrorCode::invalid_argument, "_byte_view needs a C-contiguous tensor");
        tw::Layout l{tw::DType::uint8(), tw::Shape(t.nbytes()), tw::Strides(int64_t{1}), t.byte_offset(), false};
        return tw::Tensor::make(t.buffer_ptr(), l, t.readonly());
      })
      .def("_from_bytes", [](const tw::Tensor& raw, const std::string& dtype, nb::handle shape, bool padded) {
        // Inverse of _byte_view: a C-contiguous tensor of dtype/shape over a 1-D uint8 tensor's bytes.
        if (raw.dtype() != tw::DType::uint8() || raw.ndim() != 1 || !raw.is_contiguous())
          throw tw::Error(tw::ErrorCode::invalid_argument, "_from_bytes needs a contiguous 1-D uint8 tensor");
        tw::Layout l{tw::DType::from_name(dtype), dims_from(shape, "shape"), {}, raw.byte_offset(), padded};
        l.subbyte_padded = padded && l.dtype.is_subbyte();
        l.strides = tw::Layout::contiguous_strides(l.shape);
        l.validate();
        if (l.nbytes() != raw.numel())
          throw tw::Error(tw::ErrorCode::invalid_argument, "pickled data holds " + std::to_string(raw.numel()) +
                                                               " bytes but " + l.shape.str() + " " + l.dtype.name() +
                                                               " needs " + std::to_string(l.nbytes()));
        return tw::Tensor::make(raw.buffer_ptr(), l, raw.readonly());
      }, "dtype"_a, "shape"_a, "padded"_a = false)
      .def("_reinterpret", [](const tw::Tensor& t, const std::string& dtype, bool padded) {
        // Same bytes, another element type of the same storage size (used by pickling and NumPy export).
        tw::DType d = tw::DType::from_name(dtype);
        tw::Layout l = t.layout();
        const bool was_packed = l.is_packed_subbyte();
        l.dtype = d;
        l.subbyte_padded = padded && d.is_subbyte();
        if (l.is_packed_subbyte() != was_packed || (!was_packed && l.element_bytes() != t.layout().element_bytes()) ||
            (was_packed && d.total_bits() != t.dtype().total_bits()))
          throw tw::Error(tw::ErrorCode::invalid_argument, "cannot reinterpret " + t.dtype().name() + " as " + d.name() +
                                                               ": storage sizes differ");
        tw::Tensor r = tw::Tensor::make(t.buffer_ptr(), l, t.readonly());
        r.metadata() = t.metadata();
        return r;
      }, "dtype"_a, "padded"_a = false);

  register_export(cls, m);
  register_import(m);
  register_ipc(m);
  register_arrow(m);

  m.def("set_num_threads", [](nb::handle n) {
          // (an int beyond C int: nanobind's answer was "incompatible function arguments", not the ValueError
          // the docstring promises)
          const int64_t v = int64_arg(n, "set_num_threads: n");
          if (v > tw::kMaxThreads)  // (said here: the value may not fit tw::set_num_threads' int)
            throw tw::Error(tw::ErrorCode::invalid_argument, "set_num_threads: at most " +
                                                                 std::to_string(tw::kMaxThreads) + " threads, not " +
                                                                 std::to_string(v));
          tw::set_num_threads(static_cast<int>(std::max<int64_t>(v, -1)));
        }, "n"_a,
        "Threads used by large copies (the caller included); n <= 0 restores the number of CPUs; at most 1024 "
        "(ValueError above).");
  m.def("get_num_threads", &tw::get_num_threads, "Threads large copies use (set_num_threads changes it).");
  m.def("set_buffer_cache_limit", [](nb::handle nbytes) {
    const int64_t n = int64_arg(nbytes, "set_buffer_cache_limit: nbytes");
    if (n < 0) throw tw::Error(tw::ErrorCode::invalid_argument, "set_buffer_cache_limit: nbytes must be >= 0");
    tw::set_buffer_cache_limit(static_cast<size_t>(n));
  }, "nbytes"_a,
  "Bytes of recently freed large (>= 32 MiB) host buffers kept mapped for reuse by same-sized allocations; 0 "
  "disables the cache and returns what it holds to the OS. Default 256 MiB.");
  m.def("get_buffer_cache_limit", [] { return tw::buffer_cache_limit(); }, "The buffer cache's limit in bytes.");
  m.def("buffer_cache_stats", [] {
    const tw::BufferCacheStats st = tw::buffer_cache_stats();
    nb::dict d;
    d["limit"] = st.limit;
    d["bytes"] = st.bytes;
    d["blocks"] = st.blocks;
    d["hits"] = st.hits;
    d["misses"] = st.misses;
    return d;
  }, "The buffer cache now: limit, bytes and blocks held, hits and misses of large allocations.");
  m.def("empty", [](nb::handle shape, nb::handle dtype, nb::handle order, nb::handle device, nb::handle pinned_h) {
    const bool pinned = bool_arg(pinned_h, "pinned");
    const tw::Dims d = dims_from(shape, "shape");
    const tw::DType dt = parse_dtype(dtype);
    const tw::Device dev = target_device(device, pinned, "tensorwire.empty");
    // (Python objects: read before the lock is released)
    const tw::MemoryOrder ord = as_python("tensorwire.empty", [&] { return parse_order(order); });
    return as_python("tensorwire.empty", [&] {
      ReleaseGil nogil;
      return tw::Tensor::empty(d, dt, dev, ord);
    });
  }, nb::sig("def empty(shape: int | tuple[int, ...], dtype: object = 'float32', order: str = 'C', *, device: object = None, pinned: bool = False) -> Tensor"),
  "shape"_a, "dtype"_a.none() = "float32", "order"_a.none() = "C", nb::kw_only(), "device"_a = nb::none(),
  "pinned"_a.none() = false,
  "A new uninitialised tensor: on the host (default), on device='cuda:N' (tensorwire's device pool) or in pinned "
  "host memory (pinned=True); dtype: a name, a NumPy/PyTorch/ml_dtypes dtype or a tensorwire.DType.");
  m.def("zeros", [](nb::handle shape, nb::handle dtype, nb::handle order, nb::handle device, nb::handle pinned_h) {
    const bool pinned = bool_arg(pinned_h, "pinned");
    const tw::Dims d = dims_from(shape, "shape");
    const tw::DType dt = parse_dtype(dtype);
    const tw::Device dev = target_device(device, pinned, "tensorwire.zeros");
    // (Python objects: read before the lock is released)
    const tw::MemoryOrder ord = as_python("tensorwire.zeros", [&] { return parse_order(order); });
    return as_python("tensorwire.zeros", [&] {
      ReleaseGil nogil;
      // Without a device runtime, empty() says why at once: never build (and fault in) the zeros on the host first.
      if (dev.type != kDLCPU && !tw::cuda::is_available()) return tw::Tensor::empty(d, dt, dev, ord);
      tw::Tensor host = tw::Tensor::zeros(d, dt, ord);
      return dev.type == kDLCPU ? host : host.to(dev, std::nullopt, true);
    });
  }, nb::sig("def zeros(shape: int | tuple[int, ...], dtype: object = 'float32', order: str = 'C', *, device: object = None, pinned: bool = False) -> Tensor"),
  "shape"_a, "dtype"_a.none() = "float32", "order"_a.none() = "C", nb::kw_only(), "device"_a = nb::none(),
  "pinned"_a.none() = false, "A new zero-filled tensor; dtype, device and pinned as in tensorwire.empty.");
  m.def("_copy_into", [](const tw::Tensor& src, const tw::Tensor& dst) {
    ReleaseGil nogil;
    tw::copy(src, dst);
  }, "src"_a, "dst"_a);
  m.def("cuda_driver_status", [] { return tw::cuda::driver_status(); });
  m.def("_cuda_is_available", [] { return tw::cuda::is_available(); });
  m.def("_cuda_status", [] { return tw::cuda::status(); });
  m.def("_cuda_device_count", [] { return tw::cuda::device_count(); });
  m.def("_cuda_driver_version", [] { return tw::cuda::driver_version(); });
  m.def("_cuda_kernels_built", [] { return tw::cuda::kernels_built(); });
  m.def("_cuda_pinned_pool_stats", [] { return pool_stats_dict(tw::cuda::pinned_pool_stats()); });
  m.def("_cuda_device_pool_stats", [](int device) {
    if (device < 0 || device >= std::max(tw::cuda::device_count(), 1))
      throw tw::Error(tw::ErrorCode::invalid_argument, "cuda:" + std::to_string(device) + " does not exist (" +
                                                           std::to_string(tw::cuda::device_count()) + " CUDA devices)");
    return pool_stats_dict(tw::cuda::device_pool_stats(device));
  }, "device"_a = 0);
  m.def("_cuda_empty_cache", [] {
    ReleaseGil nogil;
    tw::cuda::empty_cache();
  });
  m.attr("__version__") = tw::version();
  m.attr("DLPACK_VERSION") = nb::make_tuple(DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);
}
