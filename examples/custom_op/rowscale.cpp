// rowscale.cpp — y[i, j] = x[i, j] * w[j] and its backward, written against tensorwire's C++ API.
//
// Like many hand-written kernels (DeepMD-kit's among them), the loops below index raw pointers and are correct only
// for C-contiguous inputs. The kernels say so instead of computing garbage: a strided input is a clear error.
// rowscale.py decorates the Python functions with tensorwire.torch.contiguous_inputs, which hands them
// C-contiguous tensors (free when they already are) — including the expanded (stride-0) and transposed gradients
// autograd produces.
//
// Tensors cross as DLPack capsules: torch's `x.__dlpack__()` in, a capsule `torch.from_dlpack` takes out.
#include <nanobind/nanobind.h>

#include <tensorwire/tensorwire.hpp>

#include <string>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// A DLPack capsule (versioned or legacy) as a tw::Tensor; the capsule is marked consumed, as the spec requires.
tw::Tensor from_capsule(nb::handle cap, const char* what) {
  PyObject* c = cap.ptr();
  if (PyCapsule_IsValid(c, "dltensor_versioned")) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(c, "dltensor_versioned"));
    PyCapsule_SetName(c, "used_dltensor_versioned");  // first: from_dlpack owns m from here, even when it throws
    return tw::from_dlpack(m);
  }
  if (PyCapsule_IsValid(c, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
    PyCapsule_SetName(c, "used_dltensor");  // first: from_dlpack owns m from here, even when it throws
    return tw::from_dlpack(m);
  }
  throw nb::type_error((std::string(what) + ": expected a DLPack capsule (x.__dlpack__())").c_str());
}

void capsule_deleter(PyObject* c) {
  if (PyCapsule_IsValid(c, "dltensor")) {  // never consumed: we still own it
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, "dltensor"));
    if (m && m->deleter) m->deleter(m);
  }
}

nb::object to_capsule(const tw::Tensor& t) {
  DLManagedTensor* m = tw::to_dlpack_unversioned(t);
  PyObject* c = PyCapsule_New(m, "dltensor", capsule_deleter);
  if (!c) {
    m->deleter(m);
    throw nb::python_error();
  }
  return nb::steal(c);
}

void require(const tw::Tensor& t, const char* name, size_t ndim) {
  if (t.dtype() != tw::DType::float32() || t.ndim() != ndim)
    throw nb::value_error((std::string("rowscale: ") + name + " must be a " + std::to_string(ndim) +
                           "-D float32 tensor").c_str());
  if (t.device() != tw::Device::cpu()) throw nb::value_error((std::string("rowscale: ") + name + " must be on the CPU").c_str());
  if (!t.is_contiguous())
    throw nb::value_error((std::string("rowscale: ") + name + " must be C-contiguous, got strides " +
                           t.strides().str() + " (decorate the caller with tensorwire.torch.contiguous_inputs)")
                              .c_str());
}

nb::object mul_rows(nb::handle xc, nb::handle wc) {
  const tw::Tensor x = from_capsule(xc, "mul_rows(x)"), w = from_capsule(wc, "mul_rows(w)");
  require(x, "x", 2);
  require(w, "w", 1);
  const int64_t n = x.shape()[0], m = x.shape()[1];
  if (w.shape()[0] != m) throw nb::value_error("rowscale.mul_rows: w must have x.shape[1] elements");
  tw::Tensor y = tw::Tensor::empty(x.shape(), tw::DType::float32());
  const float* px = x.data<const float>();
  const float* pw = w.data<const float>();
  float* py = y.data<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) py[i * m + j] = px[i * m + j] * pw[j];
  return to_capsule(y);
}

// Returns (grad_x, grad_w) for y = mul_rows(x, w) and the gradient g of y.
nb::tuple mul_rows_backward(nb::handle gc, nb::handle xc, nb::handle wc) {
  const tw::Tensor g = from_capsule(gc, "g"), x = from_capsule(xc, "x"), w = from_capsule(wc, "w");
  require(g, "g", 2);
  require(x, "x", 2);
  require(w, "w", 1);
  const int64_t n = x.shape()[0], m = x.shape()[1];
  if (g.shape() != x.shape() || w.shape()[0] != m)
    throw nb::value_error("rowscale.mul_rows_backward: shapes of g, x and w disagree");
  tw::Tensor gx = tw::Tensor::empty(x.shape(), tw::DType::float32());
  tw::Tensor gw = tw::Tensor::empty(w.shape(), tw::DType::float32());
  const float *pg = g.data<const float>(), *px = x.data<const float>(), *pw = w.data<const float>();
  float *pgx = gx.data<float>(), *pgw = gw.data<float>();
  for (int64_t j = 0; j < m; ++j) pgw[j] = 0.0f;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      pgx[i * m + j] = pg[i * m + j] * pw[j];
      pgw[j] += pg[i * m + j] * px[i * m + j];
    }
  return nb::make_tuple(to_capsule(gx), to_capsule(gw));
}

}  // namespace

NB_MODULE(_rowscale, mod) {
  mod.def("mul_rows", &mul_rows, "x"_a, "w"_a);
  mod.def("mul_rows_backward", &mul_rows_backward, "g"_a, "x"_a, "w"_a);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const tw::Error& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });
}
