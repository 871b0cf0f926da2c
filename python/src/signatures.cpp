// Runtime signatures for nanobind functions and methods.
//
// nanobind's function objects have no __text_signature__ (and their type is immutable), so inspect.signature()
// refuses them. The package wraps its public functions and methods in CPython builtins whose docstring starts with a
// text signature ("name(sig)\n--\n\n"), which is what inspect reads for builtins. A wrapper forwards its arguments
// unchanged with one vectorcall, so behaviour and errors are nanobind's; it costs ~20 ns per call.
#include <array>
#include <deque>
#include <stdexcept>
#include <utility>
#include <vector>
#include <string>

#include <nanobind/stl/string.h>

#include "convert.hpp"

namespace twpy {
namespace {

using FastKw = PyObject* (*)(PyObject*, PyObject* const*, Py_ssize_t, PyObject*);

// Definitions must outlive every wrapper made from them: they live for the life of the process.
std::deque<PyMethodDef> g_defs;
std::deque<std::string> g_texts;

PyObject* call_function(PyObject* target, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return PyObject_Vectorcall(target, args, static_cast<size_t>(nargs), kwnames);
}

// Method descriptors call their C function with the instance, not with a closure, so each wrapped method gets its
// own trampoline, indexing a fixed table of targets.
constexpr size_t kMaxMethods = 64;
PyObject* g_method_targets[kMaxMethods] = {};
size_t g_method_count = 0;

PyObject* call_method(PyObject* target, PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  const size_t nkw = kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(kwnames)) : 0;
  const size_t total = static_cast<size_t>(nargs) + nkw;
  PyObject* small[16];
  std::vector<PyObject*> big;
  PyObject** buf = small;
  if (total + 1 > 16) {
    big.resize(total + 1);
    buf = big.data();
  }
  buf[0] = self;
  for (size_t i = 0; i < total; ++i) buf[i + 1] = args[i];
  return PyObject_Vectorcall(target, buf, static_cast<size_t>(nargs) + 1, kwnames);
}

template <size_t I>
PyObject* method_trampoline(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return call_method(g_method_targets[I], self, args, nargs, kwnames);
}

template <size_t... I>
constexpr auto make_trampolines(std::index_sequence<I...>) {
  return std::array<FastKw, sizeof...(I)>{&method_trampoline<I>...};
}
constexpr auto kTrampolines = make_trampolines(std::make_index_sequence<kMaxMethods>{});

PyCFunction as_cfunction(FastKw f) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f));
}

const char* keep(std::string s) { return g_texts.emplace_back(std::move(s)).c_str(); }

}  // namespace

void register_signatures(nb::module_& m) {
  // _signed_function(func, name, doc): a builtin calling func, whose doc begins with a text signature.
  m.def("_signed_function", [](nb::object func, const std::string& name, const std::string& doc) {
    PyMethodDef& def = g_defs.emplace_back();
    def.ml_name = keep(name);
    def.ml_meth = as_cfunction([](PyObject* self, PyObject* const* a, Py_ssize_t n, PyObject* kw) {
      return call_function(self, a, n, kw);
    });
    def.ml_flags = METH_FASTCALL | METH_KEYWORDS;
    def.ml_doc = keep(doc);
    PyObject* f = PyCFunction_NewEx(&def, func.ptr(), nullptr);
    if (!f) throw nb::python_error();
    return nb::steal(f);
  });
  // _signed_method(cls, name, doc): replace cls.name (a nanobind method) with a method descriptor forwarding to it.
  m.def("_signed_method", [](nb::type_object cls, const std::string& name, const std::string& doc) {
    if (g_method_count == kMaxMethods) throw std::runtime_error("_signed_method: the trampoline table is full");
    nb::object target = nb::getattr(cls, name.c_str());
    PyMethodDef& def = g_defs.emplace_back();
    def.ml_name = keep(name);
    def.ml_meth = as_cfunction(kTrampolines[g_method_count]);
    def.ml_flags = METH_FASTCALL | METH_KEYWORDS;
    def.ml_doc = keep(doc);
    PyObject* descr = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), &def);
    if (!descr) throw nb::python_error();
    nb::object d = nb::steal(descr);
    g_method_targets[g_method_count++] = target.release().ptr();  // kept for the life of the process
    nb::setattr(cls, name.c_str(), d);
  });
}

}  // namespace twpy
