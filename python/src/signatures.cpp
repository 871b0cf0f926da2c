// Runtime signatures for nanobind functions and methods.
//
// nanobind's function objects have no __text_signature__ (and their type is immutable), so inspect.signature()
// refuses them. The package wraps its public functions and methods in CPython builtins whose docstring starts with a
// text signature ("name(sig)\n--\n\n"), which is what inspect reads for builtins. A wrapper forwards its arguments
// unchanged with one vectorcall, so behaviour and errors are nanobind's; it costs ~20 ns per call.
#include <array>
#include <deque>
#include <memory>
#include <new>
#include <stdexcept>
#include <utility>
#include <string>

#include <nanobind/stl/string.h>

#include "convert.hpp"

namespace twpy {
namespace {

using FastKw = PyObject* (*)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*);

// Definitions must outlive every wrapper made from them: they live for the life of the process.
std::deque<PyMethodDef> g_defs;
std::deque<std::string> g_texts;

// CPython calls a builtin's C function with its __self__ (for functions: the module, so that they are "built-in
// functions" that pickle by name; for method descriptors: the instance), never with a closure. So each wrapper gets
// its own trampoline, indexing a fixed table of targets.
constexpr size_t kMaxWrapped = 128;
PyObject* g_targets[kMaxWrapped] = {};
size_t g_count = 0;

PyObject* call_method(PyObject* target, PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  const size_t nkw = kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(kwnames)) : 0;
  const size_t total = static_cast<size_t>(nargs) + nkw;
  PyObject* small[16];
  std::unique_ptr<PyObject*[]> big;
  PyObject** buf = small;
  if (total + 1 > 16) {
    big.reset(new (std::nothrow) PyObject*[total + 1]);
    if (!big) return PyErr_NoMemory();
    buf = big.get();
  }
  buf[0] = self;
  for (size_t i = 0; i < total; ++i) buf[i + 1] = args[i];
  return PyObject_Vectorcall(target, buf, static_cast<size_t>(nargs) + 1, kwnames);
}

template <size_t I>
PyObject* function_trampoline(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return PyObject_Vectorcall(g_targets[I], args, static_cast<size_t>(nargs), kwnames);
}
template <size_t I>
PyObject* method_trampoline(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return call_method(g_targets[I], self, args, nargs, kwnames);
}

template <size_t... I>
constexpr auto make_function_trampolines(std::index_sequence<I...>) {
  return std::array<FastKw, sizeof...(I)>{&function_trampoline<I>...};
}
template <size_t... I>
constexpr auto make_method_trampolines(std::index_sequence<I...>) {
  return std::array<FastKw, sizeof...(I)>{&method_trampoline<I>...};
}
constexpr auto kFunctionTrampolines = make_function_trampolines(std::make_index_sequence<kMaxWrapped>{});
constexpr auto kMethodTrampolines = make_method_trampolines(std::make_index_sequence<kMaxWrapped>{});

PyCFunction as_cfunction(FastKw f) { return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f)); }

const char* keep(std::string s) { return g_texts.emplace_back(std::move(s)).c_str(); }

// Takes a table slot for target (a new reference, kept for the life of the process) and fills a definition.
PyMethodDef& define(nb::handle target, const std::string& name, const std::string& doc, FastKw trampoline) {
  PyMethodDef& def = g_defs.emplace_back();
  def.ml_name = keep(name);
  def.ml_meth = as_cfunction(trampoline);
  def.ml_flags = METH_FASTCALL | METH_KEYWORDS;
  def.ml_doc = keep(doc);
  g_targets[g_count++] = nb::borrow(target).release().ptr();
  return def;
}

void check_room(const char* who) {
  if (g_count == kMaxWrapped) throw std::runtime_error(std::string(who) + ": the trampoline table is full");
}

}  // namespace

void register_signatures(nb::module_& m) {
  // _signed_function(func, name, doc): a builtin function of this module calling func, whose doc begins with a
  // text signature.
  m.def("_signed_function", [m](nb::object func, const std::string& name, const std::string& doc) {
    check_room("_signed_function");
    PyMethodDef& def = define(func, name, doc, kFunctionTrampolines[g_count]);
    nb::object modname = nb::getattr(m, "__name__");
    PyObject* f = PyCFunction_NewEx(&def, m.ptr(), modname.ptr());
    if (!f) throw nb::python_error();
    return nb::steal(f);
  });
  // _signed_method(cls, name, doc): replace cls.name (a nanobind method) with a method descriptor forwarding to it.
  m.def("_signed_method", [](nb::type_object cls, const std::string& name, const std::string& doc) {
    check_room("_signed_method");
    nb::object target = nb::getattr(cls, name.c_str());
    PyMethodDef& def = define(target, name, doc, kMethodTrampolines[g_count]);
    PyObject* descr = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), &def);
    if (!descr) throw nb::python_error();
    nb::setattr(cls, name.c_str(), nb::steal(descr));
  });
}

}  // namespace twpy
