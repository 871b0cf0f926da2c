// arrow.cpp — the Arrow PyCapsule interface: tw.to_arrow, tw.from_arrow, tw.ArrowTensorArray, and
// Tensor.__arrow_c_array__ / __arrow_c_device_array__. Every rule lives in the C++ library (tensorwire/arrow.hpp);
// this file moves structs in and out of capsules.
//
// Capsules follow the PyCapsule interface: names "arrow_schema", "arrow_array", "arrow_device_array",
// "arrow_array_stream"; an exported capsule's destructor calls the struct's release callback unless a consumer
// moved the struct out (release NULL), then frees the struct. Imports move the structs out of the producer's
// capsules, so each capsule can be consumed once.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "convert.hpp"

namespace twpy {
namespace {

constexpr const char* kSchemaName = "arrow_schema";
constexpr const char* kArrayName = "arrow_array";
constexpr const char* kDeviceArrayName = "arrow_device_array";
constexpr const char* kStreamName = "arrow_array_stream";

template <class T>
void release_struct(T* s) {
  if constexpr (std::is_same_v<T, ArrowDeviceArray>) {
    if (s->array.release) s->array.release(&s->array);
  } else {
    if (s->release) s->release(s);
  }
}

template <class T>
void capsule_destructor(PyObject* cap, const char* name) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  if (auto* s = static_cast<T*>(PyCapsule_GetPointer(cap, name))) {
    release_struct(s);
    delete s;
  } else {
    PyErr_Clear();
  }
  PyErr_Restore(type, value, tb);
}

void schema_destructor(PyObject* cap) { capsule_destructor<ArrowSchema>(cap, kSchemaName); }
void array_destructor(PyObject* cap) { capsule_destructor<ArrowArray>(cap, kArrayName); }
void device_array_destructor(PyObject* cap) { capsule_destructor<ArrowDeviceArray>(cap, kDeviceArrayName); }

// A capsule owning a fresh, not-yet-live struct: if filling it fails, the destructor only frees it.
template <class T>
std::pair<nb::object, T*> new_capsule(const char* name, PyCapsule_Destructor dtor) {
  auto* s = new T{};
  PyObject* cap = PyCapsule_New(s, name, dtor);
  if (!cap) {
    delete s;
    throw nb::python_error();
  }
  return {nb::steal(cap), s};
}

std::optional<bool> copy_option(nb::handle copy) {
  switch (parse_copy(copy)) {
    case CopyMode::always: return true;
    case CopyMode::never: return false;
    default: return std::nullopt;
  }
}

void refuse_extra_kwargs(const nb::kwargs& kwargs, const char* who) {
  std::string bad;
  for (auto [k, v] : kwargs)
    if (!v.is_none()) bad += (bad.empty() ? "" : ", ") + nb::cast<std::string>(nb::str(k));
  if (!bad.empty()) {
    PyErr_SetString(PyExc_NotImplementedError,
                    (std::string(who) + ": unsupported keyword argument(s): " + bad).c_str());
    throw nb::python_error();
  }
}

nb::object schema_capsule(const tw::ArrowTensorArray& a) {
  auto [cap, s] = new_capsule<ArrowSchema>(kSchemaName, schema_destructor);
  a.export_schema(s);
  return cap;
}

nb::tuple c_array(const tw::ArrowTensorArray& a) {
  auto [scap, s] = new_capsule<ArrowSchema>(kSchemaName, schema_destructor);
  auto [acap, arr] = new_capsule<ArrowArray>(kArrayName, array_destructor);
  a.export_to(s, arr);
  return nb::make_tuple(scap, acap);
}

nb::tuple c_device_array(const tw::ArrowTensorArray& a) {
  auto [scap, s] = new_capsule<ArrowSchema>(kSchemaName, schema_destructor);
  auto [acap, arr] = new_capsule<ArrowDeviceArray>(kDeviceArrayName, device_array_destructor);
  a.export_to(s, arr);
  return nb::make_tuple(scap, acap);
}

tw::ArrowTensorArray prepare(const tw::Tensor& t, std::optional<bool> copy, std::vector<std::string> dim_names) {
  tw::ArrowExportOptions o;
  o.copy = copy;
  o.dim_names = std::move(dim_names);
  ReleaseGil nogil;  // a copy may be large; nothing below touches Python
  return tw::ArrowTensorArray::from_tensor(t, o);
}

nb::handle g_asarray;  // tensorwire._tensorwire.asarray

// dim_names: None, or a sequence of str other than a str or bytes itself (a TypeError naming what it got otherwise).
std::vector<std::string> dim_names_from(nb::handle h) {
  std::vector<std::string> names;
  if (h.is_none()) return names;
  if (!PySequence_Check(h.ptr()) || PyUnicode_Check(h.ptr()) || PyBytes_Check(h.ptr()) ||
      PyByteArray_Check(h.ptr()))
    throw nb::type_error((std::string("tensorwire.to_arrow: dim_names must be a sequence of str, not ") +
                          Py_TYPE(h.ptr())->tp_name).c_str());
  nb::object items = nb::steal(PySequence_List(h.ptr()));
  if (!items.is_valid()) throw nb::python_error();
  for (nb::handle e : items) {
    if (!PyUnicode_Check(e.ptr()))
      throw nb::type_error((std::string("tensorwire.to_arrow: dim_names must be a sequence of str; it holds a ") +
                            Py_TYPE(e.ptr())->tp_name).c_str());
    names.push_back(nb::cast<std::string>(e));
  }
  return names;
}

tw::ArrowTensorArray to_arrow(nb::handle x, nb::handle copy, nb::handle dim_names) {
  const std::optional<bool> c = copy_option(copy);
  std::vector<std::string> names = dim_names_from(dim_names);
  if (PyList_Check(x.ptr()) || PyTuple_Check(x.ptr())) {
    std::vector<tw::Tensor> ts;
    for (nb::handle e : x) {
      nb::object t = is_tensor(e) ? nb::borrow(e) : g_asarray(e);
      ts.push_back(unwrap(t));
    }
    tw::ArrowExportOptions o;
    o.copy = c;
    o.dim_names = std::move(names);
    ReleaseGil nogil;
    return tw::ArrowTensorArray::from_tensors(ts, o);
  }
  nb::object t = is_tensor(x) ? nb::borrow(x) : g_asarray(x, nb::arg("copy") = (c == false ? nb::handle(Py_False) : nb::none()));
  return prepare(unwrap(t), c, std::move(names));
}

// ---- import ---------------------------------------------------------------------------------------------------
template <class T>
T* capsule_pointer(nb::handle cap, const char* name, const char* who) {
  if (!PyCapsule_IsValid(cap.ptr(), name)) {
    std::string got = Py_TYPE(cap.ptr())->tp_name;
    if (PyCapsule_CheckExact(cap.ptr())) {
      const char* n = PyCapsule_GetName(cap.ptr());
      PyErr_Clear();
      got = std::string("a capsule named '") + (n ? n : "<unnamed>") + "'";
    }
    throw tw::Error(tw::ErrorCode::type_mismatch, std::string(who) + ": expected a PyCapsule named '" + name +
                                                      "', got " + got);
  }
  return static_cast<T*>(PyCapsule_GetPointer(cap.ptr(), name));
}

tw::ArrowColumns import_pair(nb::handle pair, const tw::ArrowImportOptions& o, const char* who) {
  if (!PyTuple_Check(pair.ptr()) || PyTuple_GET_SIZE(pair.ptr()) != 2)
    throw tw::Error(tw::ErrorCode::type_mismatch, std::string(who) + ": expected a (schema, array) tuple of capsules, "
                                                  "got " + Py_TYPE(pair.ptr())->tp_name);
  nb::handle scap(PyTuple_GET_ITEM(pair.ptr(), 0)), acap(PyTuple_GET_ITEM(pair.ptr(), 1));
  auto* schema = capsule_pointer<ArrowSchema>(scap, kSchemaName, who);
  if (PyCapsule_IsValid(acap.ptr(), kDeviceArrayName))
    return tw::from_arrow_columns(schema, capsule_pointer<ArrowDeviceArray>(acap, kDeviceArrayName, who), o);
  return tw::from_arrow_columns(schema, capsule_pointer<ArrowArray>(acap, kArrayName, who), o);
}

bool has(nb::handle obj, const char* name) { return PyObject_HasAttrString(obj.ptr(), name) == 1; }

// Imports anything Arrow: an object with the PyCapsule interface, or a (schema, array) pair of capsules.
tw::ArrowColumns import_any(nb::handle obj, nb::handle copy, const char* who) {
  tw::ArrowImportOptions o;
  o.copy = copy_option(copy);
  if (PyTuple_Check(obj.ptr())) return import_pair(obj, o, who);
  if (has(obj, "__arrow_c_device_array__")) return import_pair(obj.attr("__arrow_c_device_array__")(), o, who);
  if (has(obj, "__arrow_c_array__")) return import_pair(obj.attr("__arrow_c_array__")(), o, who);
  if (has(obj, "__arrow_c_stream__")) {
    nb::object cap = obj.attr("__arrow_c_stream__")();
    return tw::from_arrow_columns(capsule_pointer<ArrowArrayStream>(cap, kStreamName, who), o);
  }
  throw tw::Error(tw::ErrorCode::type_mismatch,
                  std::string(who) + ": an object of type " + Py_TYPE(obj.ptr())->tp_name +
                      " has none of __arrow_c_device_array__, __arrow_c_array__, __arrow_c_stream__ (and is not a "
                      "(schema, array) tuple of capsules)");
}

nb::object column_object(tw::ArrowColumn& c) {
  if (!c.variable_shape) return wrap(std::move(c.tensors[0]));
  nb::list l;
  for (auto& t : c.tensors) l.append(wrap(std::move(t)));
  return l;
}

nb::object from_arrow(nb::handle obj, nb::handle copy) {
  tw::ArrowColumns all = import_any(obj, copy, "tw.from_arrow");
  if (!all.record_batch) return column_object(all.columns[0]);
  nb::dict d;
  for (size_t i = 0; i < all.columns.size(); ++i) {
    tw::ArrowColumn& c = all.columns[i];
    nb::str key(c.name.data(), c.name.size());
    if (d.contains(key)) {  // (Arrow allows repeated field names; a dict would keep the last one silently)
      size_t first = 0;
      while (all.columns[first].name != c.name) ++first;
      throw nb::value_error(("tw.from_arrow: columns " + std::to_string(first) + " and " + std::to_string(i) +
                             " are both named '" + c.name +
                             "', and a dict of columns can hold one; rename them first (e.g. "
                             "table.rename_columns([...]))")
                                .c_str());
    }
    d[key] = column_object(c);
  }
  return d;
}

}  // namespace

// tw.asarray's Arrow path (convert.hpp): one tensor, or a refusal that names tw.from_arrow.
nb::object arrow_import(nb::handle obj, nb::handle copy) {
  tw::ArrowColumns all = import_any(obj, copy, "tw.asarray");
  if (all.record_batch)
    throw tw::Error(tw::ErrorCode::unsupported,
                    "a record batch (a struct of " + std::to_string(all.columns.size()) +
                        " columns) is not one tensor; use tw.from_arrow, which returns a dict of columns");
  if (all.columns[0].variable_shape)
    throw tw::Error(tw::ErrorCode::unsupported,
                    "an arrow.variable_shape_tensor array holds tensors of different shapes, not one tensor; use "
                    "tw.from_arrow, which returns a list of tensors");
  return wrap(std::move(all.columns[0].tensors[0]));
}

namespace {

nb::object optional_tuple(const std::vector<int64_t>& v, bool none_if_empty) {
  if (v.empty() && none_if_empty) return nb::none();
  nb::list l;
  for (int64_t x : v) l.append(x);
  return nb::tuple(l);
}

std::string kind_name(const tw::ArrowTensorArray& a) {
  switch (a.type().kind) {
    case tw::ArrowTensorType::Kind::fixed_shape: return std::string(tw::kArrowFixedShapeTensor);
    case tw::ArrowTensorType::Kind::variable_shape: return std::string(tw::kArrowVariableShapeTensor);
    default: return a.type().bool8 ? std::string(tw::kArrowBool8) : std::string();
  }
}

}  // namespace


void register_arrow(nb::module_& m) {
  g_asarray = nb::object(m.attr("asarray")).release();

  nb::class_<tw::ArrowTensorArray>(
      m, "ArrowTensorArray",
      "Tensors prepared as an Arrow array: arrow.fixed_shape_tensor (a batch, rows first), a primitive array (1-D), "
      "arrow.bool8 (bool), or arrow.variable_shape_tensor (a list). Any copy the layout needed was made when it was "
      "created (see `copied`); each __arrow_c_array__ / __arrow_c_device_array__ call exports the same memory "
      "again, zero-copy, so pa.array(x) can be called any number of times.")
      .def("__arrow_c_array__", [](const tw::ArrowTensorArray& a, nb::handle) { return c_array(a); },
           "requested_schema"_a = nb::none(),
           "(schema, array) PyCapsules (C Data Interface, host memory). requested_schema is ignored (best effort).")
      .def("__arrow_c_device_array__", [](const tw::ArrowTensorArray& a, nb::handle, nb::kwargs kwargs) {
        refuse_extra_kwargs(kwargs, "__arrow_c_device_array__");
        return c_device_array(a);
      }, "requested_schema"_a = nb::none(), "kwargs"_a,
           "(schema, device array) PyCapsules (C Device Data Interface: any device; CUDA sets sync_event).")
      .def("__arrow_c_schema__", [](const tw::ArrowTensorArray& a) { return schema_capsule(a); },
           "The field (type, extension metadata, tensorwire metadata) as an 'arrow_schema' PyCapsule.")
      .def("__len__", [](const tw::ArrowTensorArray& a) { return a.length(); })
      .def_prop_ro("type_name", [](const tw::ArrowTensorArray& a) -> nb::object {
        std::string k = kind_name(a);
        if (k.empty()) return nb::none();
        return nb::str(k.c_str());
      }, "'arrow.fixed_shape_tensor', 'arrow.variable_shape_tensor', 'arrow.bool8', or None for a primitive array.")
      .def_prop_ro("dtype", [](const tw::ArrowTensorArray& a) { return a.type().dtype; }, "The element type of the tensors.")
      .def_prop_ro("device", [](const tw::ArrowTensorArray& a) { return a.device(); }, "Where the array's memory lives.")
      .def_prop_ro("copied", &tw::ArrowTensorArray::copied, "True when creating it copied the data.")
      .def_prop_ro("shape", [](const tw::ArrowTensorArray& a) -> nb::object {
        if (a.type().kind == tw::ArrowTensorType::Kind::variable_shape) return nb::none();
        return optional_tuple(a.type().logical_shape(), false);
      }, "One row's logical shape (() for a primitive array); None for a variable-shape list.")
      .def_prop_ro("physical_shape", [](const tw::ArrowTensorArray& a) -> nb::object {
        if (a.type().kind == tw::ArrowTensorType::Kind::variable_shape) return nb::none();
        return optional_tuple(a.type().shape, false);
      }, "One row's shape as stored (row-major): the extension's `shape`.")
      .def_prop_ro("permutation", [](const tw::ArrowTensorArray& a) { return optional_tuple(a.type().permutation, true); },
                   "The extension's `permutation` (logical dim i = physical dim permutation[i]), or None.")
      .def_prop_ro("dim_names", [](const tw::ArrowTensorArray& a) -> nb::object {
        auto n = a.type().logical_dim_names();
        if (n.empty()) return nb::none();
        return nb::tuple(nb::cast(n));  // a tuple, like shape and permutation
      }, "One row's dimension names in logical order (a tuple), or None.")
      .def_prop_ro("data", [](const tw::ArrowTensorArray& a) { return a.data().as_readonly(); },
                   "The exported memory as a read-only tensor: the batch in its exported layout, or a list's packed "
                   "1-D elements.")
      .def("__repr__", [](const tw::ArrowTensorArray& a) {
        std::string k = kind_name(a);
        return "tensorwire.ArrowTensorArray(" + (k.empty() ? std::string("primitive") : k) + ", length=" +
               std::to_string(a.length()) + ", dtype=" + a.type().dtype.name() + ", device=" + a.device().str() +
               (a.copied() ? ", copied=True" : "") + ")";
      });

  m.def("to_arrow", &to_arrow,
        nb::sig("def to_arrow(x: object, *, copy: bool | None = None, dim_names: collections.abc.Sequence[str] | None "
                "= None) -> ArrowTensorArray"),
        "x"_a, nb::kw_only(), "copy"_a = nb::none(), "dim_names"_a = nb::none(),
        "x as a tw.ArrowTensorArray (pa.array(), nanoarrow and any PyCapsule consumer take it).\n\n"
        "A tensor's first dimension is the row dimension: rank >= 2 exports arrow.fixed_shape_tensor (dense permuted "
        "layouts keep their layout, described by `permutation`), rank 1 a primitive array, bool as arrow.bool8; a "
        "0-d tensor raises ValueError. A list (or tuple) of tensors exports arrow.variable_shape_tensor, its data "
        "packed into one buffer (a copy). copy=None copies only when needed, copy=False raises tw.CopyError instead, "
        "copy=True always copies. dim_names names one row's logical dimensions. The tensor's metadata travels in the "
        "field metadata under 'tensorwire.metadata'.");
  m.def("from_arrow", &from_arrow, "obj"_a, nb::kw_only(), "copy"_a = nb::none(),
        "Import an Arrow array, chunked array, record batch, table or stream (__arrow_c_device_array__, "
        "__arrow_c_array__, __arrow_c_stream__, or a (schema, array) tuple of capsules).\n\n"
        "Returns a Tensor (rows first; zero-copy and read-only), a list of Tensors for arrow.variable_shape_tensor, "
        "or a dict of column name to either for a record batch / table. Several chunks are concatenated, which "
        "copies (tw.CopyError with copy=False). copy=True returns writable copies. Metadata written by tw.to_arrow "
        "is restored wherever the consumer kept the field.");
  m.def("_arrow_exports_alive", &tw::arrow_exports_alive,
        "Exported ArrowArray structs (children included) not yet released; for leak tests.");

  // Tensor as an Arrow producer. The protocol has no copy argument: layouts Arrow cannot describe are copied.
  nb::handle tensor_type = nb::type<tw::Tensor>();
  nb::setattr(tensor_type, "__arrow_c_array__",
              nb::cpp_function([](const tw::Tensor& t, nb::handle) { return c_array(prepare(t, std::nullopt, {})); },
                               nb::is_method(), nb::scope(tensor_type), nb::name("__arrow_c_array__"),
                               "requested_schema"_a = nb::none(),
                               "Arrow PyCapsules for this tensor (see tw.to_arrow). Layouts Arrow cannot describe "
                               "(gaps, negative or zero strides) are exported as a copy: the protocol has no copy "
                               "argument; use tw.to_arrow(t, copy=False) to refuse instead. Host memory only."));
  nb::setattr(tensor_type, "__arrow_c_device_array__",
              nb::cpp_function([](const tw::Tensor& t, nb::handle, nb::kwargs kwargs) {
                refuse_extra_kwargs(kwargs, "__arrow_c_device_array__");
                return c_device_array(prepare(t, std::nullopt, {}));
              }, nb::is_method(), nb::scope(tensor_type), nb::name("__arrow_c_device_array__"),
                 "requested_schema"_a = nb::none(), "kwargs"_a,
                 "Arrow device PyCapsules for this tensor on any device (CUDA sets sync_event); copies like "
                 "__arrow_c_array__ when the layout needs it (host memory only)."));
}

}  // namespace twpy
