// import.cpp — tw.asarray / tw.from_dlpack: any array-like to a tw.Tensor, zero-copy whenever a view exists.
//
// Protocols are tried in this order; one that refuses (raises, or describes something we cannot take without a
// forbidden copy) falls through to the next, and the final error lists every refusal:
//  1. Arrow PyCapsules (__arrow_c_device_array__, __arrow_c_array__, __arrow_c_stream__) — through the Python
//     package's hook, when present. First because an Arrow object's schema is its own description of the data.
//  2. __dlpack__ (versioned capsule first, legacy fallback for producers that reject max_version)
//  3. __cuda_array_interface__ (v2/v3)
//  4. __array_interface__ (v3)
//  5. the buffer protocol (PEP 3118)
//  6. a raw DLPack PyCapsule
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <deque>

#include "convert.hpp"
#include "tensorwire/device_runtime.hpp"

namespace twpy {
namespace {

constexpr const char* kVersionedName = "dltensor_versioned";
constexpr const char* kLegacyName = "dltensor";

struct Refusal {
  std::string protocol;
  std::string reason;
  PyObject* type;  // the exception class that reason belongs to
};

// A refusal to record and fall through from: carries the exception class to use if it is the only one.
struct Refused {
  PyObject* type;
  std::string reason;
};

// The C++ policy's request plus the Python stream object (passed to producers' __dlpack__ as given).
struct Request {
  tw::ImportRequest policy;
  nb::handle stream{Py_None};  // (never a null handle: it is passed on to producers as the stream= keyword)
  bool immutable = false;  // the producer's arrays never change (JAX): every zero-copy view is read-only
};

// tw::finish_import with the interpreter lock released when it may copy.
tw::Tensor finish(tw::Tensor t, const Request& req, tw::ImportFacts facts) {
  if (!tw::import_may_copy(req.policy, facts)) return tw::finish_import(std::move(t), req.policy, facts);
  ReleaseGil nogil;
  return tw::finish_import(std::move(t), req.policy, facts);
}

// Imports a DLPack capsule; takes ownership (renames the capsule to used_*). Throws on malformed capsules.
tw::Tensor import_capsule(nb::handle cap) {
  if (PyCapsule_IsValid(cap.ptr(), kVersionedName)) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap.ptr(), kVersionedName));
    if (PyCapsule_SetName(cap.ptr(), "used_dltensor_versioned") != 0) throw nb::python_error();
    return tw::from_dlpack(m);
  }
  if (PyCapsule_IsValid(cap.ptr(), kLegacyName)) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), kLegacyName));
    if (PyCapsule_SetName(cap.ptr(), "used_dltensor") != 0) throw nb::python_error();
    return tw::from_dlpack(m);
  }
  if (PyCapsule_CheckExact(cap.ptr())) {
    const char* name = PyCapsule_GetName(cap.ptr());
    PyErr_Clear();
    std::string n = name ? name : "<unnamed>";
    if (n.rfind("used_", 0) == 0)
      throw tw::Error(tw::ErrorCode::invalid_argument, "the DLPack capsule was already consumed ('" + n + "')");
    throw tw::Error(tw::ErrorCode::type_mismatch,
                    "capsule named '" + n + "' is not a DLPack capsule ('dltensor_versioned' or 'dltensor')");
  }
  throw tw::Error(tw::ErrorCode::type_mismatch, std::string("__dlpack__ returned a ") + Py_TYPE(cap.ptr())->tp_name +
                                                    ", not a PyCapsule");
}

// Whether a DLPack capsule's struct says its producer made the memory for this consumer alone (IS_COPIED).
bool capsule_copied(nb::handle cap) {
  if (!PyCapsule_IsValid(cap.ptr(), kVersionedName)) return false;
  auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap.ptr(), kVersionedName));
  return m && m->version.major == DLPACK_MAJOR_VERSION && (m->flags & DLPACK_FLAG_BITMASK_IS_COPIED);
}

// Interned strings and the constant max_version tuple, made once.
struct Names {
  PyObject* dlpack;
  PyObject* dlpack_device;
  PyObject* cai;
  PyObject* ai;
  PyObject* max_version;
  PyObject* copy;
  PyObject* dl_device;
  PyObject* stream;
  PyObject* version_tuple;
  PyObject* arrow_array;
  PyObject* arrow_device_array;
  PyObject* arrow_stream;
};
Names* g_names = nullptr;

const Names& names() {
  if (!g_names) {
    g_names = new Names{PyUnicode_InternFromString("__dlpack__"),
                        PyUnicode_InternFromString("__dlpack_device__"),
                        PyUnicode_InternFromString("__cuda_array_interface__"),
                        PyUnicode_InternFromString("__array_interface__"),
                        PyUnicode_InternFromString("max_version"),
                        PyUnicode_InternFromString("copy"),
                        PyUnicode_InternFromString("dl_device"),
                        PyUnicode_InternFromString("stream"),
                        Py_BuildValue("(ii)", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION),
                        PyUnicode_InternFromString("__arrow_c_array__"),
                        PyUnicode_InternFromString("__arrow_c_device_array__"),
                        PyUnicode_InternFromString("__arrow_c_stream__")};
  }
  return *g_names;
}

bool has_attr_on_type(nb::handle obj, PyObject* name) {
  PyObject* r = _PyType_Lookup(Py_TYPE(obj.ptr()), name);
  return r != nullptr;
}

// Calls obj.__dlpack__(**kwargs) with the given keyword names/values (vectorcall, no dict). The kwnames tuple of
// the common call (max_version only) is built once.
nb::object call_dlpack(nb::handle obj, const std::pair<PyObject*, PyObject*>* kw, size_t n) {
  static PyObject* only_max_version = Py_BuildValue("(O)", names().max_version);
  PyObject* args[5];
  args[0] = obj.ptr();
  PyObject* kwnames;
  if (n == 1 && kw[0].first == names().max_version) {
    kwnames = Py_NewRef(only_max_version);
  } else {
    kwnames = PyTuple_New(static_cast<Py_ssize_t>(n));
    for (size_t i = 0; i < n; ++i) PyTuple_SET_ITEM(kwnames, static_cast<Py_ssize_t>(i), Py_NewRef(kw[i].first));
  }
  for (size_t i = 0; i < n; ++i) args[1 + i] = kw[i].second;
  PyObject* r = PyObject_VectorcallMethod(names().dlpack, args, 1, kwnames);
  Py_DECREF(kwnames);
  if (!r) throw nb::python_error();
  return nb::steal(r);
}

// (device_type, device_id) from __dlpack_device__, without the generic parse_device's type dispatch.
tw::Device dlpack_device_of(nb::handle d) {
  if (PyTuple_CheckExact(d.ptr()) && PyTuple_GET_SIZE(d.ptr()) == 2) {
    long type = PyLong_AsLong(PyTuple_GET_ITEM(d.ptr(), 0));
    long id = PyLong_AsLong(PyTuple_GET_ITEM(d.ptr(), 1));
    if (!PyErr_Occurred() && type >= INT32_MIN && type <= INT32_MAX && id >= INT32_MIN && id <= INT32_MAX)
      return tw::Device::from_dlpack(DLDevice{static_cast<DLDeviceType>(type), static_cast<int32_t>(id)});
    PyErr_Clear();
  }
  auto p = parse_device(d);
  if (!p) throw tw::Error(tw::ErrorCode::type_mismatch, "__dlpack_device__ returned None");
  return *p;
}

// `host_known`: the caller knows the producer's memory is on the CPU (an exact numpy.ndarray), so
// __dlpack_device__ need not be asked.
// A producer's own exception from __dlpack__ (NumPy's "NumPy only supports stream=None." for a device it did not
// claim) says nothing of the call that raised it: a note on it says what tensorwire asked, and of which device.
void note_dlpack_call(nb::python_error& e, nb::handle obj, const std::pair<PyObject*, PyObject*>* kw, size_t nkw,
                      const std::optional<tw::Device>& src_dev) noexcept {
  try {
    nb::object value = nb::borrow(e.value());
    if (!value.is_valid() || !nb::hasattr(value, "add_note")) return;  // (Python < 3.11)
    std::string args;
    for (size_t i = 0; i < nkw; ++i)
      args += (i ? ", " : "") + nb::cast<std::string>(nb::str(kw[i].first)) + "=" +
              nb::cast<std::string>(nb::repr(kw[i].second));
    std::string note = std::string("(raised by ") + Py_TYPE(obj.ptr())->tp_name + ".__dlpack__(" + args +
                       "), called by tensorwire";
    if (src_dev) note += "; its __dlpack_device__() said " + src_dev->str();
    value.attr("add_note")(note + ")");
  } catch (...) {
    PyErr_Clear();  // the producer's own error is what the caller gets, with or without the note
  }
}

tw::Tensor via_dlpack(nb::handle obj, const Request& req, bool& made_copy, bool host_known = false) {
  std::optional<tw::Device> src_dev;
  if (host_known) {
    src_dev = tw::Device::cpu();
  } else if (has_attr_on_type(obj, names().dlpack_device)) {
    nb::object d = nb::steal(PyObject_CallMethodNoArgs(obj.ptr(), names().dlpack_device));
    if (!d.is_valid()) throw nb::python_error();
    src_dev = dlpack_device_of(d);
  }
  const bool host = !src_dev || src_dev->type == kDLCPU;
  // The stream passed on: the caller's, else, for CUDA memory, 1 (the legacy default stream) said explicitly. The
  // import records stream 1 for a None request; a producer that reads a missing stream= as "no synchronisation"
  // (PyTorch's __dlpack__ defaults to -1 since 2.x) would otherwise hand over data its current side stream has not
  // finished writing.
  nb::handle stream = req.stream;
  static PyObject* legacy_stream = PyLong_FromLong(1);  // (immortal for the life of the process)
  if (stream.is_none() && src_dev && (src_dev->type == kDLCUDA || src_dev->type == kDLCUDAManaged))
    stream = legacy_stream;
  // Keyword arguments for the versioned call.
  std::pair<PyObject*, PyObject*> kw[4];
  size_t nkw = 0;
  kw[nkw++] = {names().max_version, names().version_tuple};
  nb::object dl_dev;
  if (req.policy.device && src_dev && !(*req.policy.device == *src_dev)) {
    dl_dev = nb::make_tuple(static_cast<int>(req.policy.device->type), req.policy.device->id);
    kw[nkw++] = {names().dl_device, dl_dev.ptr()};
  }
  if (req.policy.copy != CopyMode::if_needed)
    kw[nkw++] = {names().copy, req.policy.copy == CopyMode::always ? Py_True : Py_False};
  if (!stream.is_none() && !host) kw[nkw++] = {names().stream, stream.ptr()};
  nb::object cap;
  bool producer_copied_on_request = false;
  try {
    cap = call_dlpack(obj, kw, nkw);
    producer_copied_on_request = req.policy.copy == CopyMode::always;
  } catch (nb::python_error& e) {
    // A producer from before DLPack 1.0 rejects the keywords: ask for a legacy capsule the old way. Argument
    // parsing (CPython's, Cython's, nanobind's) raises TypeError itself; a subclass is the producer's own refusal
    // of this array (pyarrow's ArrowTypeError: "Bit-packed boolean data type not supported by DLPack"), which a
    // legacy request would only repeat, with pyarrow's DeprecationWarning for asking it.
    if (e.type().ptr() != PyExc_TypeError) {
      note_dlpack_call(e, obj, kw, nkw, src_dev);
      throw;
    }
    if (!stream.is_none() && !host) {
      std::pair<PyObject*, PyObject*> skw[1] = {{names().stream, stream.ptr()}};
      try {
        cap = call_dlpack(obj, skw, 1);
      } catch (nb::python_error& e2) {
        // One that takes no stream= at all: only the stream this function chose (1) may be dropped, since None
        // means the same to a producer that follows DLPack; the caller's own stream may not.
        if (e2.type().ptr() != PyExc_TypeError || !req.stream.is_none()) throw;
        PyObject* r = PyObject_CallMethodNoArgs(obj.ptr(), names().dlpack);
        if (!r) throw nb::python_error();
        cap = nb::steal(r);
      }
    } else {
      PyObject* r = PyObject_CallMethodNoArgs(obj.ptr(), names().dlpack);
      if (!r) throw nb::python_error();
      cap = nb::steal(r);
    }
  }
  bool flagged_copy = false;
  if (PyCapsule_IsValid(cap.ptr(), kVersionedName)) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap.ptr(), kVersionedName));
    flagged_copy = m && m->version.major == DLPACK_MAJOR_VERSION && (m->flags & DLPACK_FLAG_BITMASK_IS_COPIED);
  }
  tw::Tensor t = import_capsule(cap);
  // DLPack made the data ready on the stream we named (None on CUDA: the legacy default stream); the tensor says
  // so, and every later use waits for that stream with an event. -1 (no sync) leaves it unknown.
  if (t.device().type == kDLCUDA || t.device().type == kDLCUDAManaged) {
    if (req.stream.is_none()) {
      tw::set_producer_stream(t, 1);  // managed memory is host-readable: waited for now, like every other path
    } else if (PyLong_Check(req.stream.ptr()) && !PyBool_Check(req.stream.ptr())) {
      const long long v = PyLong_AsLongLong(req.stream.ptr());
      if (v == -1 && PyErr_Occurred()) throw nb::python_error();
      if (v > 0) tw::set_producer_stream(t, static_cast<intptr_t>(v));  // an event on it, unless legacy
    }
  }
  made_copy = flagged_copy || producer_copied_on_request;
  if (req.immutable && !made_copy && !t.readonly()) t = t.as_readonly();
  return t;
}

// ---- what a producer's type tells us that its protocols do not ---------------------------------------------------
struct TypeInfo {
  const DLPackExchangeAPI* api = nullptr;  // its __dlpack_c_exchange_api__, when valid
  bool immutable = false;                  // JAX arrays: never written after creation
  PyObject* is_conj = nullptr;             // PyTorch tensors: the lazy-bit queries (method descriptors)
  PyObject* is_neg = nullptr;
  PyObject* resolve_conj = nullptr;
  PyObject* resolve_neg = nullptr;
  bool torch_subclass = false;             // a subclass of torch.Tensor (not torch.Tensor itself)
  bool torch = false;                      // torch.Tensor or a subclass: requires_grad is asked (see detached)
  bool masked = false;                     // numpy.ma.MaskedArray or a subclass: its mask is no protocol's
  PyObject* requires_grad = nullptr;       // its requires_grad descriptor, when a data descriptor (called directly)
};

// tensorwire.torch installs this: called with a torch.Tensor subclass instance, it returns None or the JSON-like
// description of its type and attributes, stored in the imported tensor's metadata under kSubclassKey, so that
// every transport carries it. Unset (and never called) until tensorwire.torch is imported.
nb::object g_subclass_hook;
constexpr const char* kSubclassKey = "tensorwire.torch";

bool type_named(PyTypeObject* tp, const char* prefix) {
  PyObject* mro = tp->tp_mro;
  if (!mro || !PyTuple_Check(mro)) return std::strncmp(tp->tp_name, prefix, std::strlen(prefix)) == 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); ++i) {
    auto* b = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i));
    if (std::strncmp(b->tp_name, prefix, std::strlen(prefix)) == 0) return true;
  }
  return false;
}

PyObject* method_of(PyTypeObject* tp, const char* name) {
  nb::object n = nb::steal(PyUnicode_InternFromString(name));
  PyObject* m = _PyType_Lookup(tp, n.ptr());  // borrowed
  return m ? Py_NewRef(m) : nullptr;          // kept: the type is kept too
}

// Per-type facts, computed once per type (types are few; each is kept alive for the life of the process). A deque:
// callers hold the returned reference across Python code that may add types, and a deque never moves its elements.
const TypeInfo& type_info(PyTypeObject* tp) {
  static std::deque<std::pair<PyTypeObject*, TypeInfo>> cache;
  for (auto& [t, info] : cache)
    if (t == tp) return info;
  TypeInfo info;
  static PyObject* api_name = PyUnicode_InternFromString("__dlpack_c_exchange_api__");
  if (PyObject* cap = _PyType_Lookup(tp, api_name); cap && PyCapsule_IsValid(cap, "dlpack_exchange_api")) {
    auto* api = static_cast<const DLPackExchangeAPI*>(PyCapsule_GetPointer(cap, "dlpack_exchange_api"));
    if (api && api->header.version.major == DLPACK_MAJOR_VERSION && api->managed_tensor_from_py_object_no_sync) {
      Py_INCREF(cap);  // the table must outlive every use; the spec makes it static, the capsule keeps it so too
      info.api = api;
    }
  }
  PyErr_Clear();
  info.immutable = type_named(tp, "jaxlib.") || type_named(tp, "jax.");
  if (PyObject* mro = tp->tp_mro; mro && PyTuple_Check(mro))
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro) && !info.masked; ++i) {
      auto* b = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i));
      if (std::strcmp(b->tp_name, "MaskedArray") != 0) continue;
      PyObject* mod = PyObject_GetAttrString(reinterpret_cast<PyObject*>(b), "__module__");
      info.masked = mod && PyUnicode_Check(mod) && (PyUnicode_CompareWithASCIIString(mod, "numpy.ma") == 0 ||
                                                    PyUnicode_CompareWithASCIIString(mod, "numpy.ma.core") == 0);
      Py_XDECREF(mod);
      PyErr_Clear();
    }
  if (type_named(tp, "torch._C.TensorBase")) {
    info.torch = true;
    // A data descriptor (PyTorch's getset) wins over any instance attribute: calling its getter is what getattr
    // does, without the lookups (~40 ns of a ~1 us import).
    static PyObject* rg_name = PyUnicode_InternFromString("requires_grad");
    if (PyObject* d = _PyType_Lookup(tp, rg_name); d && Py_TYPE(d)->tp_descr_get && Py_TYPE(d)->tp_descr_set) {
      Py_INCREF(d);  // kept for the life of the process, as the type is
      info.requires_grad = d;
    }
    info.is_conj = method_of(tp, "is_conj");
    info.is_neg = method_of(tp, "is_neg");
    info.resolve_conj = method_of(tp, "resolve_conj");
    info.resolve_neg = method_of(tp, "resolve_neg");
    // torch.Tensor's MRO is (Tensor, TensorBase, object): TensorBase further down means a subclass of Tensor.
    PyObject* mro = tp->tp_mro;
    if (mro && PyTuple_Check(mro))
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); ++i)
        if (std::strcmp(reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i))->tp_name, "torch._C.TensorBase") == 0) {
          info.torch_subclass = i >= 2;
          break;
        }
    // nn.Parameter is a subclass with nothing to describe (tensorwire.torch's hook returns None for it): exactly
    // that type skips the hook. Subclasses of Parameter are still described.
    if (info.torch_subclass && std::strcmp(tp->tp_name, "Parameter") == 0) {
      PyObject* mod = PyObject_GetAttrString(reinterpret_cast<PyObject*>(tp), "__module__");
      if (mod && PyUnicode_Check(mod) && PyUnicode_CompareWithASCIIString(mod, "torch.nn.parameter") == 0)
        info.torch_subclass = false;
      Py_XDECREF(mod);
      PyErr_Clear();
    }
  }
  Py_INCREF(tp);
  cache.emplace_back(tp, info);
  return cache.back().second;
}

// A NumPy masked array exports its data through every protocol and its mask through none: the masked elements
// would arrive as values. Refused when any element is masked (a mask of all False hides nothing).
void refuse_masked(nb::handle obj) {
  nb::object mask = obj.attr("mask");
  int hidden = 1;  // (a mask that cannot say, a structured dtype's: refused as if it hid something)
  if (PyObject* any = PyObject_CallMethod(mask.ptr(), "any", nullptr)) {
    hidden = PyObject_IsTrue(any);
    Py_DECREF(any);
  }
  if (hidden < 0 || PyErr_Occurred()) {
    PyErr_Clear();
    hidden = 1;
  }
  if (!hidden) return;
  throw nb::type_error((std::string("tensorwire.asarray: this ") + Py_TYPE(obj.ptr())->tp_name +
                        " has masked elements, and a tensor has no mask: they would arrive as values; pass "
                        "m.filled(value) to replace them, or m.data to take the values underneath as they are")
                           .c_str());
}

bool call_flag(PyObject* method, nb::handle obj) {
  PyObject* args[1] = {obj.ptr()};
  PyObject* r = PyObject_Vectorcall(method, args, 1, nullptr);
  if (!r) throw nb::python_error();
  const bool v = r == Py_True;
  Py_DECREF(r);
  return v;
}

// PyTorch keeps conjugation and negation as lazy bits on a view; DLPack has no field for them (its exchange API
// exports such a view's raw memory, its __dlpack__ refuses conj but not neg). Resolved here with one copy by
// PyTorch itself, or refused under copy=False: never imported as wrong values. Returns the object to import.
nb::object resolve_lazy_bits(nb::handle obj, const TypeInfo& ti, const Request& req, bool& copied) {
  if (!ti.is_conj || !ti.is_neg) return nb::borrow(obj);
  const bool conj = call_flag(ti.is_conj, obj), neg = call_flag(ti.is_neg, obj);
  if (!conj && !neg) return nb::borrow(obj);
  const std::string what = conj && neg ? "conjugation and negation bits" : conj ? "conjugation bit" : "negation bit";
  if (req.policy.copy == CopyMode::never)
    throw tw::Error(tw::ErrorCode::copy_required,
                    "the PyTorch tensor has its lazy " + what + " set, which DLPack cannot carry; resolving it "
                    "takes one copy (resolve_conj()/resolve_neg()), and copy is forbidden");
  nb::object r = nb::borrow(obj);
  for (auto [flag, method] : {std::pair{conj, ti.resolve_conj}, std::pair{neg, ti.resolve_neg}}) {
    if (!flag) continue;
    PyObject* args[1] = {r.ptr()};
    PyObject* x = method ? PyObject_Vectorcall(method, args, 1, nullptr) : nullptr;
    if (!x) throw nb::python_error();
    r = nb::steal(x);
  }
  copied = true;
  return r;
}

// A PyTorch tensor that requires grad is imported through detach() (the same memory, outside autograd: what
// torch's own __dlpack__, __cuda_array_interface__ and numpy() demand, each refusing such a tensor) and read-only,
// since a write through tensorwire would change values autograd saved without bumping their version counter (wrong
// gradients, silently). Returns the object to import; sets req.immutable for such a tensor.
nb::object detached(nb::handle obj, const TypeInfo& ti, Request& req) {
  if (!ti.torch) return nb::borrow(obj);
  static PyObject* requires_grad = PyUnicode_InternFromString("requires_grad");
  static PyObject* detach = PyUnicode_InternFromString("detach");
  PyObject* rg = ti.requires_grad ? Py_TYPE(ti.requires_grad)->tp_descr_get(ti.requires_grad, obj.ptr(),
                                                                            reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr())))
                                   : PyObject_GetAttr(obj.ptr(), requires_grad);
  if (!rg) throw nb::python_error();
  const bool grad = rg == Py_True;
  Py_DECREF(rg);
  if (!grad) return nb::borrow(obj);
  PyObject* d = PyObject_CallMethodNoArgs(obj.ptr(), detach);
  if (!d) throw nb::python_error();
  req.immutable = true;
  return nb::steal(d);
}

// The DLPack C exchange API: one C call instead of __dlpack__'s method call, capsule and keyword parsing.
// PyTorch's lazy bits are checked here, after the export, so that the conjugation query (which only a complex
// tensor can need) is skipped for the others; a tensor with a bit set is released and resolved first.
// nullopt when the caller asked for a device (req.policy.device) and the producer's tensor is elsewhere: that move
// is left to __dlpack__(dl_device=), which lets the producer make it.
std::optional<tw::Tensor> via_exchange(nb::handle obj_in, const TypeInfo& ti, const Request& req) {
  const DLPackExchangeAPI* api = ti.api;
  nb::object obj = nb::borrow(obj_in);
  bool already_copied = false;
  DLManagedTensorVersioned* m = nullptr;
  if (api->managed_tensor_from_py_object_no_sync(obj.ptr(), &m) != 0) throw nb::python_error();
  if (!m)
    throw tw::Error(tw::ErrorCode::invalid_argument, "the producer's exchange API reported success but returned no tensor");
  if (ti.is_neg && ti.is_conj) {
    bool lazy = false;
    try {
      const bool complex = m->dl_tensor.dtype.code == kDLComplex;
      lazy = call_flag(ti.is_neg, obj) || (complex && call_flag(ti.is_conj, obj));
    } catch (...) {
      m->deleter(m);
      throw;
    }
    if (lazy) {
      m->deleter(m);
      obj = resolve_lazy_bits(obj, ti, req, already_copied);
      m = nullptr;
      if (api->managed_tensor_from_py_object_no_sync(obj.ptr(), &m) != 0) throw nb::python_error();
      if (!m)
        throw tw::Error(tw::ErrorCode::invalid_argument,
                        "the producer's exchange API reported success but returned no tensor");
    }
  }
  const bool flagged_copy = m->version.major == DLPACK_MAJOR_VERSION && (m->flags & DLPACK_FLAG_BITMASK_IS_COPIED);
  tw::Tensor t = tw::from_dlpack(m);
  const tw::Device dev = t.device();
  if (req.policy.device && !(*req.policy.device == dev)) return std::nullopt;
  if (dev.type != kDLCPU && api->current_work_stream) {
    // "NoSync": the data is ordered on the producer's current stream; the tensor says which.
    void* stream = nullptr;
    if (api->current_work_stream(dev.type, dev.id, &stream) != 0) throw nb::python_error();
    // A NULL handle is the default stream (PyTorch's current_stream() on its default stream is handle 0, CUDA's
    // legacy default stream); other handles get an event, since the stream may go.
    const bool cuda = dev.type == kDLCUDA || dev.type == kDLCUDAManaged || dev.type == kDLCUDAHost;
    if (stream) tw::set_producer_stream(t, reinterpret_cast<intptr_t>(stream));
    else if (cuda) tw::set_producer_stream(t, 1);
  }
  const bool copied = flagged_copy || already_copied;
  if (req.immutable && !copied && !t.readonly()) t = t.as_readonly();
  return finish(std::move(t), req, {copied, false});
}

// ---- dict helpers with precise type errors ------------------------------------------------------------------
[[noreturn]] void dict_type_error(const std::string& proto, const char* key, const std::string& want, nb::handle got) {
  throw Refused{PyExc_TypeError, "'" + std::string(key) + "' must be " + want + ", not " +
                                     std::string(Py_TYPE(got.ptr())->tp_name)};
  (void)proto;
}

int64_t dict_int(const std::string& proto, const char* key, nb::handle v) {
  if (PyBool_Check(v.ptr()) || !PyLong_Check(v.ptr())) dict_type_error(proto, key, "an int", v);
  int overflow = 0;
  long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (overflow) throw Refused{PyExc_ValueError, "'" + std::string(key) + "' does not fit in 64 bits"};
  return x;
}

std::vector<int64_t> dict_ints(const std::string& proto, const char* key, nb::handle v) {
  if (!PyTuple_Check(v.ptr()) && !PyList_Check(v.ptr())) dict_type_error(proto, key, "a tuple of ints", v);
  std::vector<int64_t> out;
  for (nb::handle x : v) {
    if (PyBool_Check(x.ptr()) || !PyLong_Check(x.ptr()))
      throw Refused{PyExc_TypeError, "'" + std::string(key) + "' must hold ints, found " + Py_TYPE(x.ptr())->tp_name};
    int overflow = 0;
    long long y = PyLong_AsLongLongAndOverflow(x.ptr(), &overflow);
    if (overflow) throw Refused{PyExc_ValueError, "'" + std::string(key) + "' holds a value that does not fit in 64 bits"};
    out.push_back(y);
  }
  return out;
}

nb::handle dict_get(nb::handle d, const char* key) {
  PyObject* v = PyDict_GetItemString(d.ptr(), key);  // borrowed
  return nb::handle(v);
}

// Reads (ptr, readonly) from a 'data' tuple.
void read_data_tuple(const std::string& proto, nb::handle data, tw::InterfaceDesc& desc) {
  if (!PyTuple_Check(data.ptr()) || PyTuple_GET_SIZE(data.ptr()) != 2)
    dict_type_error(proto, "data", "a (pointer, read_only) tuple", data);
  nb::handle p = nb::handle(PyTuple_GET_ITEM(data.ptr(), 0)), ro = nb::handle(PyTuple_GET_ITEM(data.ptr(), 1));
  if (PyBool_Check(p.ptr()) || !PyLong_Check(p.ptr())) dict_type_error(proto, "data[0]", "an int address", p);
  if (!PyBool_Check(ro.ptr())) dict_type_error(proto, "data[1]", "a bool", ro);
  unsigned long long addr = PyLong_AsUnsignedLongLong(p.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    throw Refused{PyExc_ValueError, "'data' address is negative or does not fit in 64 bits"};
  }
  desc.data = static_cast<uintptr_t>(addr);
  desc.readonly = ro.ptr() == Py_True;
}

// tw::import_interface for host memory, with the interpreter lock released when it must copy (byte swap,
// copy=True): a copy of a large array must not hold up other Python threads.
tw::Tensor import_host(const tw::InterfaceDesc& desc_in, std::shared_ptr<const void> keep, const Request& req) {
  tw::InterfaceDesc desc = desc_in;
  desc.readonly = desc.readonly || req.immutable;
  const char swapped = std::endian::native == std::endian::little ? '>' : '<';
  if (req.policy.copy != CopyMode::always && (desc.typestr.empty() || desc.typestr[0] != swapped))
    return tw::import_interface(desc, std::move(keep), req.policy);
  std::shared_ptr<const void> k = std::move(keep);
  ReleaseGil nogil;  // `k` may be a Python keep-alive: it is released with the lock held (see its deleter)
  return tw::import_interface(desc, k, req.policy);
}

// ml_dtypes arrays describe most of their types as void typestrs ('<V2' bfloat16, '<V1' float8_e4m3fn, int4...)
// but float8_e5m2 as '<f1', a float size NumPy itself does not have. Either way the dtype's name says what it is.
// ml_dtypes' complex32 / bcomplex32 say '<W4', a kind NumPy does not define.
bool typestr_needs_dtype_name(const std::string& ts) {
  return ts.size() > 2 && (ts[1] == 'V' || ts[1] == 'W' || (ts[1] == 'f' && ts.substr(2) == "1"));
}

std::optional<tw::DType> dtype_from_name_attr(nb::handle obj) {
  PyObject* dt = PyObject_GetAttrString(obj.ptr(), "dtype");
  if (!dt) {
    PyErr_Clear();
    return std::nullopt;
  }
  nb::object dto = nb::steal(dt);
  PyObject* nm = PyObject_GetAttrString(dt, "name");
  if (!nm) {
    PyErr_Clear();
    return std::nullopt;
  }
  nb::object n = nb::steal(nm);
  if (!PyUnicode_Check(nm)) return std::nullopt;
  try {
    return tw::DType::from_name(nb::cast<std::string>(n));
  } catch (const tw::Error&) {
    return std::nullopt;
  }
}

// Reads an interface dict's fields common to both interfaces (version, shape, typestr, strides, mask), with a
// TypeError naming any field of the wrong type. Returns the dict; 'data' and the rest are the caller's.
nb::object read_interface_dict(nb::handle obj, PyObject* attr, const std::string& proto, tw::InterfaceDesc& desc) {
  PyObject* raw = PyObject_GetAttr(obj.ptr(), attr);
  if (!raw) throw nb::python_error();
  nb::object d = nb::steal(raw);
  if (!PyDict_Check(d.ptr())) dict_type_error(proto, proto.c_str(), "a dict", d);
  desc.protocol = proto;
  nb::handle v;
  if (!(v = dict_get(d, "version")).is_valid()) throw Refused{PyExc_TypeError, "'version' is missing"};
  desc.version = static_cast<int>(dict_int(proto, "version", v));
  if (!(v = dict_get(d, "shape")).is_valid()) throw Refused{PyExc_TypeError, "'shape' is missing"};
  desc.shape = dict_ints(proto, "shape", v);
  if (!(v = dict_get(d, "typestr")).is_valid()) throw Refused{PyExc_TypeError, "'typestr' is missing"};
  if (!PyUnicode_Check(v.ptr())) dict_type_error(proto, "typestr", "a str", v);
  desc.typestr = nb::cast<std::string>(v);
  if ((v = dict_get(d, "strides")).is_valid() && !v.is_none()) desc.byte_strides = dict_ints(proto, "strides", v);
  if ((v = dict_get(d, "mask")).is_valid() && !v.is_none()) desc.has_mask = true;
  return d;
}

// A (pointer, read_only) interface's memory is kept by the object and by its dict: NumPy's scalars describe a
// temporary array that only the dict holds (its "__ref" entry), so keeping the scalar alone left the tensor on
// freed memory.
std::shared_ptr<const void> keep_interface_alive(nb::handle obj, nb::handle dict) {
  nb::object both = nb::steal(PyTuple_Pack(2, obj.ptr(), dict.ptr()));
  if (!both.is_valid()) throw nb::python_error();
  return keep_python_alive(both.ptr());
}

tw::Tensor via_cuda_interface(nb::handle obj, const Request& req) {
  const std::string proto = "__cuda_array_interface__";
  tw::InterfaceDesc desc;
  nb::object d = read_interface_dict(obj, names().cai, proto, desc);
  nb::handle v;
  if (!(v = dict_get(d, "data")).is_valid()) throw Refused{PyExc_TypeError, "'data' is missing"};
  read_data_tuple(proto, v, desc);
  // stream and device: the C++ policy applies the interface's rules (tw::import_interface).
  if ((v = dict_get(d, "stream")).is_valid() && !v.is_none()) desc.stream = dict_int(proto, "stream", v);
  desc.device.reset();
  desc.readonly = desc.readonly || req.immutable;
  if (typestr_needs_dtype_name(desc.typestr)) desc.dtype = dtype_from_name_attr(obj);
  return tw::import_interface(desc, keep_interface_alive(obj, d), req.policy);
}

struct PyBufferOwner {
  Py_buffer view;
  ~PyBufferOwner() {
    if (!Py_IsInitialized()) return;
    PyGILState_STATE s = PyGILState_Ensure();
    PyBuffer_Release(&view);
    PyGILState_Release(s);
  }
};

std::shared_ptr<PyBufferOwner> get_buffer(nb::handle obj, int flags_rw, int flags_ro) {
  auto owner = std::make_shared<PyBufferOwner>();
  owner->view.obj = nullptr;  // PyBuffer_Release ignores a view that was never filled
  if (PyObject_GetBuffer(obj.ptr(), &owner->view, flags_rw) != 0) {
    PyErr_Clear();
    if (PyObject_GetBuffer(obj.ptr(), &owner->view, flags_ro) != 0) throw nb::python_error();
  }
  return owner;
}

tw::Tensor via_array_interface(nb::handle obj, const Request& req) {
  const std::string proto = "__array_interface__";
  tw::InterfaceDesc desc;
  nb::object d = read_interface_dict(obj, names().ai, proto, desc);
  nb::handle v;
  int64_t offset = 0;
  if ((v = dict_get(d, "offset")).is_valid() && !v.is_none()) offset = dict_int(proto, "offset", v);
  if (typestr_needs_dtype_name(desc.typestr)) {
    desc.dtype = dtype_from_name_attr(obj);
    if (nb::handle descr = dict_get(d, "descr"); descr.is_valid() && PyList_Check(descr.ptr()) && nb::len(descr) > 1)
      throw Refused{PyExc_BufferError, "structured (record) arrays have no tensor dtype"};
  }
  nb::handle data = dict_get(d, "data");
  std::shared_ptr<const void> keep;
  if (data.is_valid() && PyTuple_Check(data.ptr())) {
    // (pointer, read_only): 'offset' does not apply.
    read_data_tuple(proto, data, desc);
    keep = keep_interface_alive(obj, d);
  } else {
    // None: the object itself exposes a buffer; otherwise 'data' is a buffer-like object. 'offset' applies.
    nb::handle src = (!data.is_valid() || data.is_none()) ? obj : data;
    std::shared_ptr<PyBufferOwner> owner;
    try {
      owner = get_buffer(src, PyBUF_SIMPLE | PyBUF_WRITABLE, PyBUF_SIMPLE);
    } catch (nb::python_error& e) {
      throw Refused{PyExc_BufferError, std::string("'data' ") + (src.ptr() == obj.ptr() ? "is None and the object" : "object") +
                                           " exposes no contiguous buffer: " + error_text(e)};
    }
    if (offset < 0 || offset > owner->view.len)
      throw Refused{PyExc_ValueError, "'offset' " + std::to_string(offset) + " lies outside the " +
                                          std::to_string(owner->view.len) + "-byte buffer"};
    desc.data = reinterpret_cast<uintptr_t>(owner->view.buf) + static_cast<uintptr_t>(offset);
    desc.readonly = owner->view.readonly != 0;
    desc.buffer_extent = owner->view.len - offset;
    desc.buffer_before = offset;
    keep = owner;
  }
  return import_host(desc, std::move(keep), req);
}

tw::Tensor via_buffer(nb::handle obj, const Request& req) {  std::shared_ptr<PyBufferOwner> owner;
  try {
    owner = get_buffer(obj, PyBUF_RECORDS, PyBUF_RECORDS_RO);
  } catch (nb::python_error& e) {
    throw Refused{PyExc_BufferError, error_text(e)};
  }
  const Py_buffer& b = owner->view;
  if (b.suboffsets)
    for (int i = 0; i < b.ndim; ++i)
      if (b.suboffsets[i] >= 0)
        throw Refused{PyExc_BufferError, "the buffer uses suboffsets (PIL-style indirect arrays), which no tensor can view"};
  tw::ParsedType pt = tw::parse_buffer_format(b.format ? b.format : "B", b.itemsize);
  // Express as an interface description so one validator checks every protocol.
  tw::InterfaceDesc desc;
  desc.protocol = "buffer protocol";
  desc.version = 3;
  const char order = pt.byteswap ? (std::endian::native == std::endian::little ? '>' : '<') : '=';
  char kind = 'u';
  switch (pt.dtype.code) {
    case kDLInt: kind = 'i'; break;
    case kDLUInt: kind = 'u'; break;
    case kDLFloat: kind = 'f'; break;
    case kDLComplex: kind = 'c'; break;
    case kDLBool: kind = 'b'; break;
    default: break;
  }
  desc.typestr = std::string(1, order) + kind + std::to_string(pt.itemsize);
  for (int i = 0; i < b.ndim; ++i) desc.shape.push_back(b.shape ? b.shape[i] : b.len / b.itemsize);
  if (b.strides) {
    std::vector<int64_t> st;
    for (int i = 0; i < b.ndim; ++i) st.push_back(b.strides[i]);
    desc.byte_strides = st;
  }
  desc.data = reinterpret_cast<uintptr_t>(b.buf);
  desc.readonly = b.readonly != 0;
  return import_host(desc, owner, req);
}

// Final error after every protocol refused: one class when all agree, else BufferError (CopyError when any
// refusal was a forbidden copy).
// `why`, when not empty, is the reason that explains every refusal (a device= that cannot be served here): it leads.
[[noreturn]] void raise_refusals(nb::handle obj, const std::vector<Refusal>& refusals, const std::string& why = {}) {
  std::string msg = std::string("tensorwire.asarray: cannot import an object of type ") + Py_TYPE(obj.ptr())->tp_name;
  if (!why.empty()) msg += " (" + why + ")";
  if (refusals.empty()) {
    msg += ": it supports none of __dlpack__, __cuda_array_interface__, __array_interface__, the buffer protocol, "
           "the Arrow PyCapsule interface, or a DLPack capsule";
    throw nb::type_error(msg.c_str());
  }
  PyObject* type = refusals[0].type;
  bool any_copy = false;
  for (const auto& r : refusals) {
    if (r.type != type) type = PyExc_BufferError;
    any_copy = any_copy || r.type == g_copy_error;
  }
  if (any_copy) type = g_copy_error;
  msg += "; every protocol it offers refused:";
  for (const auto& r : refusals) msg += "\n  - " + r.protocol + ": " + r.reason;
  PyErr_SetString(type, msg.c_str());
  throw nb::python_error();
}


// True for numpy.ndarray itself (not subclasses): the type is remembered the first time one is seen, so NumPy is
// never imported here.
bool is_exact_ndarray(nb::handle obj) {
  static PyTypeObject* ndarray = nullptr;
  PyTypeObject* tp = Py_TYPE(obj.ptr());
  if (tp == ndarray) return true;
  if (ndarray == nullptr && std::strcmp(tp->tp_name, "numpy.ndarray") == 0) {
    ndarray = tp;
    Py_INCREF(tp);  // kept for the life of the process
    return true;
  }
  return false;
}

// A torch.Tensor subclass keeps its type and attributes in the imported tensor's metadata (see g_subclass_hook).
tw::Tensor annotate(nb::handle obj, const TypeInfo& ti, tw::Tensor t) {
  if (!ti.torch_subclass || !g_subclass_hook.is_valid() || g_subclass_hook.is_none()) return t;
  nb::object hook = g_subclass_hook;  // a local reference: the hook may be replaced while it runs
  nb::object desc = hook(obj);
  if (!desc.is_none()) t.metadata().set(kSubclassKey, to_value(desc.ptr(), std::string("metadata['") + kSubclassKey + "']"));
  return t;
}

nb::object asarray(nb::handle obj_in, nb::handle device, nb::handle copy, nb::handle stream) {
  nb::handle obj = obj_in;
  Request req;
  req.policy.device = parse_device(device);
  req.policy.copy = parse_copy(copy);
  // The consumer's stream, checked and made an int whatever the memory (a CPU producer is never handed one, but a
  // stream that cannot be one is refused all the same): DLPack's -1 (no synchronisation), or what Tensor.to takes
  // (1, 2, a handle, or a stream object, whose handle is what a producer's __dlpack__ takes). A copy the import
  // makes to or on a CUDA device is queued on it.
  nb::object stream_int;
  if (!stream.is_none()) {
    const bool no_sync = PyLong_Check(stream.ptr()) && !PyBool_Check(stream.ptr()) &&
                         PyLong_AsLongLong(stream.ptr()) == -1 && !PyErr_Occurred();
    PyErr_Clear();
    try {
      req.policy.stream = no_sync ? intptr_t{-1} : *parse_stream(stream);
    } catch (const tw::Error& e) {
      throw tw::Error(e.code(), std::string("tensorwire.asarray: ") + e.what() +
                                    " (DLPack's -1, no synchronisation, is also accepted)");
    }
    stream_int = nb::int_(static_cast<int64_t>(*req.policy.stream));
    req.stream = stream_int;
  }
  if (is_tensor(obj)) {
    const tw::Tensor& t = unwrap(obj);
    if (!t.defined()) (void)t.layout();  // a spent loan: raises, naming it (it was returned as it was)
    if (!tw::import_may_copy(req.policy, {}) && (!req.policy.device || *req.policy.device == t.device()))
      return nb::borrow(obj);
    try {
      return wrap(finish(t, req, {}));
    } catch (const tw::Error& e) {  // (the caller called asarray, not the Tensor.to that moved it)
      std::string m = e.what();
      const size_t colon = m.find(": ");
      if (colon != std::string::npos && m.find("::") < colon) m = m.substr(colon + 2);
      throw tw::Error(e.code(), "tensorwire.asarray: " + m);
    }
  }
  // The common case, a NumPy array with no device or copy request: NumPy memory is on the CPU and an ndarray has no
  // Arrow capsules, so go straight to __dlpack__ without probing the other protocols or asking __dlpack_device__
  // (~40% of tw.asarray's time). Anything NumPy's __dlpack__ refuses (ml_dtypes, ...) takes the general path below,
  // which asks again and reports every protocol's answer.
  if (req.policy.copy == CopyMode::if_needed && !req.policy.device && is_exact_ndarray(obj)) {
    try {
      bool copied = false;
      tw::Tensor t = via_dlpack(obj, req, copied, /*host_known=*/true);
      return wrap(std::move(t));
    } catch (nb::python_error& e) {
      if (!e.matches(PyExc_Exception)) throw;
    } catch (const tw::Error&) {
    } catch (const Refused&) {
    }
  }
  // Python values with no memory to view (nested lists and tuples, scalars): NumPy builds an array of them, as
  // np.asarray / torch.as_tensor do. That is a copy: copy=False refuses it.
  if (PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr()) || PyLong_Check(obj.ptr()) || PyFloat_Check(obj.ptr()) ||
      PyComplex_Check(obj.ptr())) {
    if (req.policy.copy == CopyMode::never) {
      PyErr_Format(g_copy_error, "tensorwire.asarray: a %s has no memory a tensor can view; making an array of it is "
                   "a copy, and copy=False forbids it", Py_TYPE(obj.ptr())->tp_name);
      throw nb::python_error();
    }
    // (numpy.asarray looked up once: an import per call, and str(dtype), which NumPy implements in Python, made
    // tw.asarray([1.0, 2.0]) cost 7 us against NumPy's 0.6)
    static PyObject* np_asarray = nb::object(nb::module_::import_("numpy").attr("asarray")).release().ptr();
    nb::object arr = nb::steal(PyObject_CallOneArg(np_asarray, obj.ptr()));
    if (!arr.is_valid()) {  // (a ragged list: NumPy's words, said to be about tensorwire.asarray's argument)
      nb::python_error e;
      if (!e.matches(PyExc_ValueError)) throw e;
      throw nb::value_error((std::string("tensorwire.asarray: NumPy cannot make an array of this ") +
                             Py_TYPE(obj.ptr())->tp_name + ": " + nb::cast<std::string>(nb::str(e.value())))
                                .c_str());
    }
    nb::object dtype = arr.attr("dtype");
    nb::object kind = dtype.attr("kind");
    const char* k = PyUnicode_AsUTF8(kind.ptr());
    if (!k || std::strlen(k) != 1 || !std::strchr("biufc", k[0])) {
      nb::object dtype_name = nb::steal(PyObject_Str(dtype.ptr()));
      if (!dtype_name) throw nb::python_error();
      // (an object array may be of ints alone: ints beyond 64 bits, which no tensor type holds either)
      const std::string what = k[0] == 'O' ? " holds values no tensor type can hold (strings, None, other objects, or "
                                             "ints beyond 64 bits)"
                                           : " holds values that are not all numbers";
      throw nb::type_error((std::string("tensorwire.asarray: this ") + Py_TYPE(obj.ptr())->tp_name + what +
                            " (NumPy makes " + (k[0] == 'O' || k[0] == 'U' ? "an " : "a ") +
                            PyUnicode_AsUTF8(dtype_name.ptr()) + " array of it)").c_str());
    }
    return asarray(arr, device, nb::none(), stream);  // (copy=True: the new array is that copy)
  }
  // What the type says beyond its protocols: an immutable producer, PyTorch's lazy bits, an exchange API.
  const TypeInfo& ti = type_info(Py_TYPE(obj.ptr()));
  if (ti.masked) refuse_masked(obj);
  req.immutable = ti.immutable;
  nb::object grad_free = detached(obj, ti, req);
  obj = grad_free;
  std::vector<Refusal> refusals;
  auto attempt = [&](const char* proto, auto&& fn) -> std::optional<tw::Tensor> {
    try {
      return fn();
    } catch (const Refused& r) {
      refusals.push_back({proto, r.reason, r.type});
    } catch (const tw::Error& e) {
      refusals.push_back({proto, python_message(e.what()), exception_for(e.code())});
    } catch (nb::python_error& e) {
      if (!e.matches(PyExc_Exception)) throw;  // KeyboardInterrupt, SystemExit...
      PyObject* type = e.type().ptr();
      std::string text = error_text(e);
      if (e.matches(g_copy_error)) type = g_copy_error;  // a forbidden copy from a Python-level protocol (Arrow hook)
      else if (e.matches(PyExc_BufferError)) type = PyExc_BufferError;
      else if (e.matches(PyExc_TypeError)) type = PyExc_TypeError;
      else if (e.matches(PyExc_ValueError)) type = PyExc_ValueError;
      else type = PyExc_BufferError;
      refusals.push_back({proto, text, type});
    }
    return std::nullopt;
  };

  // Arrow first: an Arrow producer's own schema carries what its DLPack view loses or gets wrong (PyArrow 26 exports
  // permuted arrow.fixed_shape_tensor arrays through DLPack with wrong strides), plus chunking and metadata.
  // The capsule methods are looked up on the type, as Python looks up protocol methods: getattr on an object
  // without them raises and clears an AttributeError each time, which cost every NumPy import ~1.4 us.
  if ((has_attr_on_type(obj, names().arrow_array) ||
                                  has_attr_on_type(obj, names().arrow_device_array) ||
                                  has_attr_on_type(obj, names().arrow_stream))) {
    auto t = attempt("Arrow PyCapsule interface", [&] {
      nb::object r = arrow_import(obj, copy);
      return finish(unwrap(r), req, {req.policy.copy == CopyMode::always, false});
    });
    if (t) return wrap(std::move(*t));
  }
  // The exchange API serves requests that need nothing of the producer: no device move (a device= its tensor is
  // already on is none), no stream to order on (those go to __dlpack__, which takes dl_device and stream).
  if (ti.api && req.stream.is_none()) {
    auto t = attempt("DLPack C exchange API", [&] { return via_exchange(obj, ti, req); });
    if (t) return wrap(annotate(obj_in, ti, std::move(*t)));
  }
  bool lazy_copied = false;
  nb::object resolved = resolve_lazy_bits(obj, ti, req, lazy_copied);
  if (lazy_copied) obj = resolved;
  if (has_attr_on_type(obj, names().dlpack)) {
    auto t = attempt("__dlpack__", [&] {
      bool copied = false;
      tw::Tensor r = via_dlpack(obj, req, copied);
      return finish(std::move(r), req, {copied || lazy_copied, false});
    });
    if (t) return wrap(annotate(obj_in, ti, std::move(*t)));
  }
  // On the type (a property whose getter raises is a refusal to report, which PyObject_HasAttr would hide), or in
  // the instance dict (classes that assign the interface per object).
  if (has_attr_on_type(obj, names().cai) || PyObject_HasAttr(obj.ptr(), names().cai)) {
    auto t = attempt("__cuda_array_interface__", [&] { return via_cuda_interface(obj, req); });
    if (t) return wrap(std::move(*t));
  }
  bool typed_refusal = false;  // the interface said what the elements are, and no tensor dtype is that
  if (has_attr_on_type(obj, names().ai) || PyObject_HasAttr(obj.ptr(), names().ai)) {
    auto t = attempt("__array_interface__", [&] { return via_array_interface(obj, req); });
    if (t) return wrap(std::move(*t));
    // A datetime64 / timedelta64 scalar's buffer is its 8 raw bytes (format 'B'): imported, it arrived as uint8[8].
    typed_refusal = !refusals.empty() && refusals.back().reason.find("datetime/timedelta") != std::string::npos;
  }
  if (!typed_refusal && PyObject_CheckBuffer(obj.ptr())) {
    auto t = attempt("buffer protocol", [&] { return via_buffer(obj, req); });
    if (t) return wrap(std::move(*t));
  }
  if (PyCapsule_CheckExact(obj.ptr())) {
    auto t = attempt("DLPack capsule", [&] {
      const bool copied = capsule_copied(obj);
      return finish(import_capsule(obj), req, {copied, false});
    });
    if (t) return wrap(std::move(*t));
  }
  // A layout no tensor can view (byte strides that are not whole items: a field of a NumPy record array, an
  // ndarray made over a buffer with odd strides) when the caller allows a copy: the producer makes one (DLPack's
  // copy=True), as copy=True would have asked, so copy=None copies exactly when no zero-copy view exists.
  if (req.policy.copy == CopyMode::if_needed && has_attr_on_type(obj, names().dlpack) &&
      std::any_of(refusals.begin(), refusals.end(),
                  [](const Refusal& r) { return r.reason.find("is not a multiple of the item size") != std::string::npos; })) {
    Request again = req;
    again.policy.copy = CopyMode::always;
    auto t = attempt("__dlpack__(copy=True)", [&] {
      bool copied = false;
      tw::Tensor r = via_dlpack(obj, again, copied);
      return finish(std::move(r), req, {true, false});
    });
    if (t) return wrap(annotate(obj_in, ti, std::move(*t)));
  }
  // Under copy=False, such a layout is a forbidden copy (copy=None copies it): tw.CopyError, as every other one is.
  if (req.policy.copy == CopyMode::never && has_attr_on_type(obj, names().dlpack)) {
    for (auto& r : refusals)
      if (r.reason.find("is not a multiple of the item size") != std::string::npos) {
        r.type = g_copy_error;
        r.reason += " (only a copy can hold it as a tensor, and copy=False forbids one)";
      }
  }
  // A device= naming CUDA on a machine where CUDA is unavailable explains every protocol's refusal: say it first
  // (it cannot be refused up front: a foreign CUDA array may still be imported as it is).
  std::string why;
  const auto type = req.policy.device ? req.policy.device->type : kDLCPU;
  if ((type == kDLCUDA || type == kDLCUDAHost || type == kDLCUDAManaged) && !tw::device_runtime().available())
    why = "device=" + req.policy.device->str() + " needs CUDA, which is unavailable here: " +
          tw::device_runtime().status();
  else if (type != kDLCPU && type != kDLCUDA && type != kDLCUDAHost && type != kDLCUDAManaged)
    why = "device=" + req.policy.device->str() + ": tensorwire moves tensors to cpu, cuda:N and cuda_host "
          "(pinned) only";
  raise_refusals(obj, refusals, why);
}

}  // namespace

nb::object as_tensor(nb::handle obj) { return asarray(obj, nb::none(), nb::none(), nb::none()); }

void register_import(nb::module_& m) {
  m.def("_set_subclass_hook", [](nb::object f) { g_subclass_hook = std::move(f); }, "hook"_a.none(),
        "Installed by tensorwire.torch: f(torch_subclass_instance) -> None or a JSON-like dict, kept in the imported "
        "tensor's metadata under 'tensorwire.torch'.");
  // The hook must not outlive the interpreter's objects it refers to.
  nb::module_::import_("atexit").attr("register")(nb::cpp_function([] { g_subclass_hook = nb::object(); }));
  m.def("asarray", &asarray,
        nb::sig("def asarray(obj: object, *, device: object = None, copy: bool | None = None, stream: object = None) "
                "-> Tensor"),
        "obj"_a.none(), nb::kw_only(), "device"_a = nb::none(), "copy"_a = nb::none(),
        "stream"_a = nb::none(),
        "Any array-like as a tensorwire.Tensor: an object with an array protocol (zero-copy where the layout "
        "allows), or nested lists/tuples and Python numbers (as np.asarray makes them: a copy). copy=None copies only "
        "when no zero-copy view exists; copy=False "
        "never copies (raises tensorwire.CopyError instead); copy=True always copies. device='cuda:0' / 'cpu' / "
        "'cuda_host' (or a tw.Device): the tensor on that device, moved by one copy when it is elsewhere. stream: "
        "the CUDA stream the caller will use it on (an int in DLPack's numbering: -1 none, 1 legacy default, 2 "
        "per-thread, else a handle; or a stream object): the producer's work is ordered before it, and a copy the "
        "import makes is queued on it.");
  m.def("from_dlpack", [](nb::handle x, nb::handle device, nb::handle copy) -> nb::object {
    if (PyCapsule_CheckExact(x.ptr())) {
      Request req;
      req.policy.device = parse_device(device);
      req.policy.copy = parse_copy(copy);
      try {
        const bool copied = capsule_copied(x);
        return wrap(finish(import_capsule(x), req, {copied, false}));
      } catch (const Refused& r) {
        PyErr_SetString(r.type, ("from_dlpack: " + r.reason).c_str());
        throw nb::python_error();
      }
    }
    if (!has_attr_on_type(x, names().dlpack))
      throw nb::type_error((std::string("from_dlpack: an object of type ") + Py_TYPE(x.ptr())->tp_name +
                            " has no __dlpack__ method (and is not a DLPack capsule)").c_str());
    Request req;
    req.policy.device = parse_device(device);
    req.policy.copy = parse_copy(copy);
    try {
      const TypeInfo& ti = type_info(Py_TYPE(x.ptr()));
      if (ti.masked) refuse_masked(x);
      req.immutable = ti.immutable;
      const nb::object src_in = detached(x, ti, req);
      if (ti.api) {
        try {
          if (auto t = via_exchange(src_in, ti, req)) return wrap(std::move(*t));
        } catch (nb::python_error& e) {  // the exchange API refused: __dlpack__ may still serve (and say why not)
          if (!e.matches(PyExc_Exception)) throw;
        } catch (const tw::Error& e) {
          if (e.code() == tw::ErrorCode::copy_required) throw;  // a lazy bit under copy=False: final
        }
      }
      bool lazy_copied = false;
      nb::object src = resolve_lazy_bits(src_in, ti, req, lazy_copied);
      bool copied = false;
      try {
        tw::Tensor t = via_dlpack(src, req, copied);
        return wrap(finish(std::move(t), req, {copied || lazy_copied, false}));
      } catch (nb::python_error& e) {
        // A device= naming CUDA where CUDA is unavailable explains the producer's refusal ("unsupported device
        // requested"): say it first, as asarray does.
        const auto type = req.policy.device ? req.policy.device->type : kDLCPU;
        if (!e.matches(PyExc_Exception) || !(type == kDLCUDA || type == kDLCUDAHost || type == kDLCUDAManaged) ||
            tw::device_runtime().available())
          throw;
        const std::string said = error_text(e);
        PyErr_SetString(PyExc_BufferError, ("from_dlpack: device=" + req.policy.device->str() + " needs CUDA, which "
                                            "is unavailable here: " + tw::device_runtime().status() +
                                            " (the producer's __dlpack__ said: " + said + ")").c_str());
        throw nb::python_error();
      }
    } catch (const Refused& r) {
      PyErr_SetString(r.type, ("from_dlpack: " + r.reason).c_str());
      throw nb::python_error();
    }
  }, "x"_a.none(), nb::kw_only(), "device"_a = nb::none(), "copy"_a = nb::none(),
  "Import through DLPack only (the array API's from_dlpack).");
}

}  // namespace twpy
