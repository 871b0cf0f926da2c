// export.cpp — tw.Tensor as a producer: __dlpack__, __dlpack_device__, __array_interface__,
// __cuda_array_interface__ and the buffer protocol.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "convert.hpp"
#include "tensorwire/device_runtime.hpp"

namespace twpy {
namespace {

constexpr const char* kVersionedName = "dltensor_versioned";
constexpr const char* kLegacyName = "dltensor";

// Lives as long as the buffer view. It shares the tensor's Buffer, so a live buffer export counts in the Buffer's
// use count: that is how Publisher.send knows a loan still has exports (memoryviews, NumPy arrays on them).
struct BufferInfo {
  std::vector<Py_ssize_t> shape, strides;
  std::shared_ptr<const tw::Buffer> keep;
};

int tensor_getbuffer_impl(PyObject* self, Py_buffer* view, int flags) {
  view->obj = nullptr;
  const tw::Tensor& t = unwrap(self);
  auto refuse = [&](const std::string& why) {
    PyErr_SetString(PyExc_BufferError, ("tensorwire.Tensor buffer export: " + why).c_str());
    return -1;
  };
  if (!t.defined()) return refuse("the tensor is spent (a loan handed over by Publisher.send)");
  if (!t.device().is_host_accessible()) return refuse("memory on " + t.device().str() + " is not host-accessible");
  const char* fmt = tw::buffer_format_of(t.dtype());
  if (!fmt)
    return refuse(t.dtype().name() + " has no PEP 3118 format; use np.asarray(t) (ml_dtypes) or __dlpack__ instead");
  if ((flags & PyBUF_WRITABLE) == PyBUF_WRITABLE && t.readonly()) return refuse("the tensor is read-only");
  const bool c = t.is_contiguous(tw::MemoryOrder::C), f = t.is_contiguous(tw::MemoryOrder::F);
  if ((flags & PyBUF_C_CONTIGUOUS) == PyBUF_C_CONTIGUOUS && !c) return refuse("a C-contiguous buffer was requested");
  if ((flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS && !f) return refuse("a Fortran-contiguous buffer was requested");
  if ((flags & PyBUF_ANY_CONTIGUOUS) == PyBUF_ANY_CONTIGUOUS && !c && !f) return refuse("a contiguous buffer was requested");
  if ((flags & PyBUF_STRIDES) != PyBUF_STRIDES && !c)
    return refuse("the consumer did not ask for strides and the tensor is not C-contiguous");
  // byte_strides(), not strides * itemsize: a size-1 dimension may carry any stride (a one-element slice with a
  // huge step, a producer's placeholder), whose byte value can overflow; it is stated as 0.
  std::vector<int64_t> byte_strides;
  try {
    byte_strides = t.byte_strides();
  } catch (const std::exception& e) {
    return refuse(e.what());
  }
  // A consumer asking for a writable view may keep the pointer after releasing the view (torch.frombuffer does):
  // the memory counts as escaped from then on. Read-only requests (np.asarray, memoryview) do not mark it.
  if ((flags & PyBUF_WRITABLE) == PyBUF_WRITABLE) t.buffer().mark_escaped();
  auto* info = new BufferInfo();
  info->keep = t.buffer_ptr();
  const int64_t isz = static_cast<int64_t>(t.dtype().itemsize());
  for (size_t i = 0; i < t.ndim(); ++i) {
    info->shape.push_back(static_cast<Py_ssize_t>(t.shape()[i]));
    info->strides.push_back(static_cast<Py_ssize_t>(byte_strides[i]));
  }
  view->buf = t.data_ptr();
  view->obj = Py_NewRef(self);
  view->len = static_cast<Py_ssize_t>(t.numel() * isz);
  view->itemsize = static_cast<Py_ssize_t>(isz);
  view->readonly = t.readonly() ? 1 : 0;
  view->ndim = static_cast<int>(t.ndim());
  view->format = (flags & PyBUF_FORMAT) == PyBUF_FORMAT ? const_cast<char*>(fmt) : nullptr;
  view->shape = (flags & PyBUF_ND) == PyBUF_ND ? info->shape.data() : nullptr;
  view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? info->strides.data() : nullptr;
  view->suboffsets = nullptr;
  view->internal = info;
  return 0;
}

// A CPython slot: no C++ exception may leave it.
int tensor_getbuffer(PyObject* self, Py_buffer* view, int flags) noexcept {
  try {
    return tensor_getbuffer_impl(self, view, flags);
  } catch (const std::exception& e) {
    if (view->obj) Py_CLEAR(view->obj);
    PyErr_SetString(PyExc_BufferError, (std::string("tensorwire.Tensor buffer export: ") + e.what()).c_str());
    return -1;
  } catch (...) {
    if (view->obj) Py_CLEAR(view->obj);
    PyErr_SetString(PyExc_BufferError, "tensorwire.Tensor buffer export failed");
    return -1;
  }
}

void tensor_releasebuffer(PyObject*, Py_buffer* view) noexcept { delete static_cast<BufferInfo*>(view->internal); }

// Capsule destructors: an unconsumed capsule still owns its struct and must call the deleter.
void versioned_capsule_destructor(PyObject* cap) {
  if (!PyCapsule_IsValid(cap, kVersionedName)) return;  // consumed (renamed) or invalid: not ours to free
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, kVersionedName));
  if (m && m->deleter) m->deleter(m);
  PyErr_Restore(type, value, tb);
}

void legacy_capsule_destructor(PyObject* cap) {
  if (!PyCapsule_IsValid(cap, kLegacyName)) return;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, kLegacyName));
  if (m && m->deleter) m->deleter(m);
  PyErr_Restore(type, value, tb);
}

// Converts __dlpack__'s arguments into the C++ policy's request; the rules themselves are tw::export_dlpack's.
nb::object dlpack(nb::handle self, nb::handle stream, nb::handle max_version, nb::handle dl_device, nb::handle copy) {
  const tw::Tensor& t = unwrap(self);
  tw::ExportRequest req;
  req.copy = parse_copy(copy);
  if (!stream.is_none()) {
    if (PyBool_Check(stream.ptr()) || !PyLong_Check(stream.ptr()))
      throw tw::Error(tw::ErrorCode::type_mismatch,
                      std::string("__dlpack__: stream must be None or an int, not ") + Py_TYPE(stream.ptr())->tp_name);
    req.stream = int64_arg(stream, "__dlpack__: stream");
  }
  if (!dl_device.is_none()) req.device = parse_device(dl_device);
  bool versioned = false;
  if (!max_version.is_none()) {
    if (!PyTuple_Check(max_version.ptr()) || nb::len(max_version) != 2)
      throw tw::Error(tw::ErrorCode::type_mismatch, "__dlpack__: max_version must be None or a (major, minor) tuple");
    auto part = [&](int i) {  // a huge version number is as good as the largest one
      nb::handle x = nb::borrow<nb::tuple>(max_version)[i];
      if (PyBool_Check(x.ptr()) || !PyLong_Check(x.ptr()))
        throw tw::Error(tw::ErrorCode::type_mismatch, "__dlpack__: max_version must hold ints, not " +
                                                          std::string(Py_TYPE(x.ptr())->tp_name));
      int overflow = 0;
      const long long r = PyLong_AsLongLongAndOverflow(x.ptr(), &overflow);
      return overflow > 0 ? INT64_MAX : overflow < 0 ? INT64_MIN : static_cast<int64_t>(r);
    };
    const int64_t major = part(0), minor = part(1);
    if (major >= 1) {
      versioned = true;
      req.max_version = DLPackVersion{static_cast<uint32_t>(std::min<int64_t>(major, UINT32_MAX)),
                                      static_cast<uint32_t>(std::clamp<int64_t>(minor, 0, UINT32_MAX))};
    }
  }
  // A copy (a device move, copy=True, negative strides) of a large tensor must not hold the interpreter lock.
  const bool may_copy = req.copy == CopyMode::always || req.device.has_value() || t.layout().has_negative_stride();
  if (versioned) {
    DLManagedTensorVersioned* m;
    if (may_copy) {
      ReleaseGil nogil;
      m = tw::export_dlpack(t, req);
    } else {
      m = tw::export_dlpack(t, req);
    }
    PyObject* cap = PyCapsule_New(m, kVersionedName, versioned_capsule_destructor);
    if (!cap) {
      m->deleter(m);
      throw nb::python_error();
    }
    return nb::steal(cap);
  }
  DLManagedTensor* m;
  if (may_copy) {
    ReleaseGil nogil;
    m = tw::export_dlpack_legacy(t, req);
  } else {
    m = tw::export_dlpack_legacy(t, req);
  }
  PyObject* cap = PyCapsule_New(m, kLegacyName, legacy_capsule_destructor);
  if (!cap) {
    m->deleter(m);
    throw nb::python_error();
  }
  return nb::steal(cap);
}

// __dlpack__ as a plain METH_FASTCALL | METH_KEYWORDS method. Every consumer calls it with keywords only, and
// matching them by interned-string identity skips nanobind's general keyword dispatch, which was ~40 ns of the
// ~160 ns each np.from_dlpack(t) spent in here.
PyObject* dlpack_fastcall(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) noexcept {
  static PyObject* const keys[4] = {PyUnicode_InternFromString("stream"), PyUnicode_InternFromString("max_version"),
                                    PyUnicode_InternFromString("dl_device"), PyUnicode_InternFromString("copy")};
  if (nargs != 0) {
    PyErr_SetString(PyExc_TypeError, "__dlpack__() takes keyword arguments only (stream, max_version, dl_device, copy)");
    return nullptr;
  }
  PyObject* vals[4] = {Py_None, Py_None, Py_None, Py_None};
  const Py_ssize_t nk = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nk; ++i) {
    PyObject* k = PyTuple_GET_ITEM(kwnames, i);
    int slot = -1;
    for (int j = 0; j < 4 && slot < 0; ++j)
      if (k == keys[j]) slot = j;
    for (int j = 0; j < 4 && slot < 0; ++j)  // a keyword name that was not interned
      if (PyUnicode_Compare(k, keys[j]) == 0) slot = j;
    if (slot < 0) {
      PyErr_Format(PyExc_TypeError, "__dlpack__() got an unexpected keyword argument '%U'", k);
      return nullptr;
    }
    vals[slot] = args[i];
  }
  try {
    return dlpack(self, vals[0], vals[1], vals[2], vals[3]).release().ptr();
  } catch (nb::python_error& e) {
    e.restore();
  } catch (const tw::Error& e) {
    PyErr_SetString(exception_for(e.code()), python_message(e.what()).c_str());
  } catch (const std::bad_cast& e) {  // nb::cast_error
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

PyMethodDef dlpack_method = {
    "__dlpack__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(dlpack_fastcall)),
    METH_FASTCALL | METH_KEYWORDS,
    "__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
    "Export as a DLPack capsule ('dltensor_versioned' when max_version >= (1, 0), else legacy 'dltensor'). "
    "Strided layouts are exported as they are, except negative strides, which most consumers cannot take "
    "(PyTorch): those are copied into a dense tensor (flagged IS_COPIED), or refused with tw.CopyError under "
    "copy=False; copy=True always exports a copy (flagged IS_COPIED)."};

// ---- the DLPack C exchange API (tw.Tensor.__dlpack_c_exchange_api__) -------------------------------------------
// Consumers that know it skip __dlpack__'s method call, keyword parsing and capsule. Called with the GIL held;
// 0 on success, -1 with a Python exception set (the allocator reports through SetError instead).

template <class F>
int exchange_guard(F&& fn) noexcept {
  try {
    fn();
    return 0;
  } catch (nb::python_error& e) {
    e.restore();
  } catch (const tw::Error& e) {
    PyErr_SetString(exception_for(e.code()), python_message(e.what()).c_str());
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return -1;
}

bool exact_tensor(void* obj) { return obj && is_tensor(nb::handle(static_cast<PyObject*>(obj))); }

int exchange_from_py(void* obj, DLManagedTensorVersioned** out) noexcept {
  if (!out || !exact_tensor(obj)) {
    PyErr_SetString(PyExc_TypeError, "tensorwire exchange API: the object is not a tensorwire.Tensor");
    return -1;
  }
  *out = nullptr;
  return exchange_guard([&] {
    // The portable profile, as __dlpack__ without arguments: negative strides are copied (flagged IS_COPIED).
    const tw::Tensor& t = unwrap(nb::handle(static_cast<PyObject*>(obj)));
    *out = tw::export_dlpack(t, tw::ExportRequest{});
    // "no_sync": the consumer orders its own work, on a stream it does not name here, so a received CUDA tensor's
    // lease waits for the whole device before it goes back (Buffer::note_stream_use).
    t.buffer().note_stream_use(-1);
  });
}

int exchange_dltensor_from_py(void* obj, DLTensor* out) noexcept {
  if (!out || !exact_tensor(obj)) {
    PyErr_SetString(PyExc_TypeError, "tensorwire exchange API: the object is not a tensorwire.Tensor");
    return -1;
  }
  return exchange_guard([&] {
    // A non-owning view: no struct to carry READ_ONLY or a copy, so what needs either is refused.
    const tw::Tensor& t = unwrap(nb::handle(static_cast<PyObject*>(obj)));
    if (!t.defined())
      throw tw::Error(tw::ErrorCode::invalid_argument, "DLPack export: the tensor is undefined (a spent loan)");
    if (t.readonly())
      throw tw::Error(tw::ErrorCode::unsupported, "DLPack export: a non-owning DLTensor cannot mark a read-only "
                                                  "tensor read-only; use managed_tensor_from_py_object_no_sync");
    if (t.layout().has_negative_stride())
      throw tw::Error(tw::ErrorCode::copy_required, "DLPack export: strides " + t.strides().str() +
                                                        " are negative and a non-owning DLTensor cannot hold the copy "
                                                        "consumers need; use managed_tensor_from_py_object_no_sync");
    if (t.subbyte_padded())
      throw tw::Error(tw::ErrorCode::unsupported, "DLPack export: a padded sub-byte tensor needs the versioned "
                                                  "struct's flag; use managed_tensor_from_py_object_no_sync");
    t.buffer().mark_escaped();  // a raw pointer nobody counts: a loan holding it is protected when sent
    // The consumer orders its work after exchange_current_stream's (the legacy default stream): that stream waits
    // for the tensor's data, as for every other export.
    const DLDeviceType dt = t.device().type;
    if (dt == kDLCUDA || dt == kDLCUDAManaged) tw::order_after(t, 1);
    out->data = t.numel() == 0 ? nullptr : t.data_ptr();
    out->device = t.device().to_dlpack();
    out->ndim = static_cast<int32_t>(t.ndim());
    out->dtype = t.dtype().to_dlpack();
    out->shape = t.ndim() ? const_cast<int64_t*>(t.shape().data()) : nullptr;  // valid while the object lives
    out->strides = t.ndim() ? const_cast<int64_t*>(t.strides().data()) : nullptr;
    out->byte_offset = 0;
  });
}

int exchange_to_py(DLManagedTensorVersioned* m, void** out) noexcept {
  if (!out) {
    if (m && m->deleter) m->deleter(m);
    PyErr_SetString(PyExc_ValueError, "tensorwire exchange API: out_py_object is NULL");
    return -1;
  }
  *out = nullptr;
  return exchange_guard([&] { *out = wrap(tw::from_dlpack(m)).release().ptr(); });  // from_dlpack owns m
}

int exchange_allocator(DLTensor* proto, DLManagedTensorVersioned** out, void* error_ctx,
                       void (*set_error)(void*, const char*, const char*)) noexcept {
  const auto fail = [&](const char* kind, const char* msg) {
    if (set_error) set_error(error_ctx, kind, msg);
    return -1;
  };
  if (!proto || !out) return fail("ValueError", "tensorwire exchange API: prototype or out is NULL");
  *out = nullptr;
  try {
    const tw::Device dev = tw::Device::from_dlpack(proto->device);
    if (dev.type != kDLCPU)  // pinned, managed and device memory are not plain host memory: never mislabel them
      return fail("BufferError", ("tensorwire exchange API: cannot allocate on " + dev.str() +
                                  " (tensorwire's device and pinned memory arrive with its CUDA support)").c_str());
    if (proto->ndim < 0 || (proto->ndim > 0 && !proto->shape))
      return fail("ValueError", "tensorwire exchange API: the prototype's shape is NULL or ndim is negative");
    tw::Shape shape(proto->shape, static_cast<size_t>(proto->ndim));
    tw::Tensor t = tw::Tensor::empty(shape, tw::DType::from_dlpack(proto->dtype));
    *out = tw::to_dlpack(t);
    return 0;
  } catch (const tw::Error& e) {
    return fail(e.code() == tw::ErrorCode::out_of_memory ? "MemoryError" : "ValueError", e.what());
  } catch (const std::bad_alloc&) {
    return fail("MemoryError", "tensorwire exchange API: out of memory");
  } catch (const std::exception& e) {
    return fail("RuntimeError", e.what());
  }
}

int exchange_current_stream(DLDeviceType, int32_t, void** out) noexcept {
  // tensorwire keeps no current stream: its work is ordered by the streams tensors carry. NULL = the default.
  if (out) *out = nullptr;
  return 0;
}

const DLPackExchangeAPI g_exchange_api = {
    {{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION}, nullptr},
    exchange_allocator,
    exchange_from_py,
    exchange_to_py,
    exchange_dltensor_from_py,
    exchange_current_stream,
};

nb::object byte_strides_or_none(const tw::Tensor& t) {
  if (t.is_contiguous()) return nb::none();
  nb::list l;
  for (int64_t s : t.byte_strides()) l.append(s);
  return nb::tuple(l);
}

nb::tuple shape_tuple(const tw::Tensor& t) {
  nb::list l;
  for (int64_t s : t.shape()) l.append(s);
  return nb::tuple(l);
}

}  // namespace

PyType_Slot tensor_slots[] = {
    {Py_bf_getbuffer, reinterpret_cast<void*>(tensor_getbuffer)},
    {Py_bf_releasebuffer, reinterpret_cast<void*>(tensor_releasebuffer)},
    {0, nullptr},
};

void register_export(nb::class_<tw::Tensor>& cls, nb::module_&) {
  {
    PyObject* descr = PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), &dlpack_method);
    if (!descr || PyObject_SetAttrString(cls.ptr(), "__dlpack__", descr) != 0) {
      Py_XDECREF(descr);
      throw nb::python_error();
    }
    Py_DECREF(descr);
  }
  {
    PyObject* cap = PyCapsule_New(const_cast<DLPackExchangeAPI*>(&g_exchange_api), "dlpack_exchange_api", nullptr);
    if (!cap || PyObject_SetAttrString(cls.ptr(), "__dlpack_c_exchange_api__", cap) != 0) {
      Py_XDECREF(cap);
      throw nb::python_error();
    }
    Py_DECREF(cap);
  }
  cls.def("__dlpack_device__", [](const tw::Tensor& t) {
    return nb::make_tuple(static_cast<int>(t.device().type), t.device().id);
  });
  cls.def_prop_ro("__array_interface__", [](const tw::Tensor& t) -> nb::dict {
    if (!t.device().is_host_accessible())
      throw nb::attribute_error("__array_interface__: the tensor is not in host memory");
    std::string ts = tw::typestr_of(t.dtype());
    if (ts.empty() || t.layout().is_packed_subbyte())
      throw nb::attribute_error(("__array_interface__: NumPy has no built-in type for " + t.dtype().name() +
                                 "; np.asarray() uses __array__ and returns an ml_dtypes array")
                                    .c_str());
    t.buffer().mark_escaped();  // a raw address, held by whoever reads the dict: not countable
    nb::dict d;
    d["version"] = 3;
    d["shape"] = shape_tuple(t);
    d["typestr"] = ts;
    d["descr"] = nb::make_tuple(nb::make_tuple("", ts));
    d["data"] = nb::make_tuple(reinterpret_cast<uintptr_t>(t.data_ptr()), t.readonly());
    d["strides"] = byte_strides_or_none(t);
    return d;
  });
  cls.def_prop_ro("__cuda_array_interface__", [](const tw::Tensor& t) -> nb::dict {
    const DLDeviceType dt = t.device().type;
    if (dt != kDLCUDA && dt != kDLCUDAManaged)
      throw nb::attribute_error("__cuda_array_interface__: the tensor is not in CUDA device memory");
    std::string ts = tw::typestr_of(t.dtype());
    if (ts.empty() || t.layout().is_packed_subbyte())
      throw nb::attribute_error(("__cuda_array_interface__ has no typestr for " + t.dtype().name() + "; use __dlpack__").c_str());
    t.buffer().mark_escaped();
    nb::dict d;
    d["version"] = 3;
    d["shape"] = shape_tuple(t);
    d["typestr"] = ts;
    d["descr"] = nb::make_tuple(nb::make_tuple("", ts));
    d["data"] = nb::make_tuple(t.numel() ? reinterpret_cast<uintptr_t>(t.data_ptr()) : 0, t.readonly());
    d["strides"] = byte_strides_or_none(t);
    // A foreign producer's stream may be gone by now: a tensor with a ready event names tensorwire's stream after it.
    if (auto s = tw::stream_for_consumers(t)) d["stream"] = *s;
    else d["stream"] = nb::none();
    return d;
  });
}

}  // namespace twpy
