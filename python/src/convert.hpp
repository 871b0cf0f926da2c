// convert.hpp — Python <-> tensorwire conversions shared by the extension's translation units.
#pragma once

#include <Python.h>
#include <nanobind/nanobind.h>

#include <memory>
#include <unistd.h>
#include <string>

#include "tensorwire/tensorwire.hpp"

namespace twpy {

namespace nb = nanobind;
using namespace nb::literals;

// nb::gil_scoped_release for every wait of tensorwire's: the same, except where the GIL comes back while the
// interpreter is finalizing. A daemon thread waiting in recv then ends in PyEval_RestoreThread, which (Python
// before 3.14) exits the thread with pthread_exit: a forced unwind, which ended the process with std::terminate
// when it met nanobind's noexcept destructor (rc 134 at exit, with a daemon thread in recv: tensorwire.torch's
// DataLoader). Here the unwind is caught in the destructor and the thread sleeps until the process is gone, as
// Python 3.14 itself does with such threads. (A normal exception cannot come out of PyEval_RestoreThread.)
class ReleaseGil {
 public:
  ReleaseGil() noexcept : state_(PyEval_SaveThread()) {}
  ~ReleaseGil() {
    try {
      PyEval_RestoreThread(state_);
    } catch (...) {  // abi::__forced_unwind: never rethrown, never left
      for (;;) ::pause();
    }
  }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* state_;
};

/// tw.CopyError: subclass of BufferError and ValueError.
extern PyObject* g_copy_error;

/// The Python exception class a tw::ErrorCode maps to.
PyObject* exception_for(tw::ErrorCode code) noexcept;

/// A keep-alive that holds a strong reference to a Python object and drops it with the GIL held.
std::shared_ptr<const void> keep_python_alive(PyObject* obj);

/// Metadata values <-> Python objects (None, bool, int, float, str, bytes, list, tuple, dict with str keys).
/// Throws tw::Error(type_mismatch) naming the offending type and path.
tw::Value to_value(PyObject* obj, const std::string& path, int depth = 0);
/// A metadata= argument (None, a dict, or a mapping with keys()) as Metadata, in time linear in its size.
tw::Metadata metadata_from(nb::handle h);

// A tw::Error's text with C++ names turned into Python ones (tensorwire.Tensor.select: ...), for Python users.
std::string python_message(std::string m);

// A Python exception as one line for a message, "TypeName: text", with no traceback (nanobind's what() embeds one).
// Never throws.
std::string error_text(const nb::python_error& e);
nb::object from_value(const tw::Value& v);

/// A Python int argument as int64_t: TypeError (tw type_mismatch) for a non-int or a bool, ValueError
/// (tw overflow) when it does not fit. Never std::bad_cast, which would surface as an opaque RuntimeError.
int64_t int64_arg(nb::handle h, const std::string& what);
/// A flag: True or False (NumPy's bool too); TypeError naming `what` for anything else.
bool bool_arg(nb::handle h, const char* what);

/// The one dtype converter behind every dtype= argument: a tw.DType, a name ("float32", and what NumPy accepts:
/// "f4", "<f4", "double"), a NumPy dtype or scalar type, an ml_dtypes type, a PyTorch dtype (torch.float32), or
/// anything numpy.dtype() accepts (Python's float, JAX's jnp.bfloat16). TypeError for other types, ValueError
/// for a dtype tensorwire has no type for (non-native byte order, objects, strings, structured records).
tw::DType parse_dtype(nb::handle h);

/// Parses the `device=` argument: None, "cpu", "cuda:1", a tw.Device, or a (device_type, id) tuple.
std::optional<tw::Device> parse_device(nb::handle h);

/// Parses a `stream=` argument: None, an int handle (1 legacy default, 2 per-thread default), or a stream object
/// (__cuda_stream__, torch's .cuda_stream, CuPy's .ptr).
std::optional<intptr_t> parse_stream(nb::handle h);

/// A str key as UTF-8, whole (embedded NULs kept), or nullopt for anything that cannot be one (not a str, or a str
/// holding a lone surrogate). (nb::cast<std::string> threw a bare std::bad_cast on a surrogate, and c_str() cut a
/// key at its first NUL.)
std::optional<std::string> key_text(nb::handle k);

/// The tw.Tensor Python type, and wrapping/unwrapping.
nb::object wrap(tw::Tensor t);
bool is_tensor(nb::handle h);
tw::Tensor& unwrap(nb::handle h);
/// tw.asarray(obj) with its defaults, called directly (import.cpp): what Publisher.send does with a non-tensor.
nb::object as_tensor(nb::handle obj);

/// Registers asarray/from_dlpack and friends (import.cpp) and the exporters (export.cpp).
void register_import(nb::module_& m);
void register_export(nb::class_<tw::Tensor>& cls, nb::module_& m);
/// Registers tw.Publisher and tw.Subscriber (ipc.cpp).
void register_ipc(nb::module_& m);
void register_signatures(nb::module_& m);
/// tw.to_arrow / tw.from_arrow / tw.ArrowTensorArray and Tensor.__arrow_c_array__ (arrow.cpp); after the Tensor class.
void register_arrow(nb::module_& m);

/// Buffer-protocol slots of tw.Tensor (export.cpp).
extern PyType_Slot tensor_slots[];

/// The copy= argument (None / True / False) as the C++ policy's copy mode.
using CopyMode = tw::CopyMode;
CopyMode parse_copy(nb::handle h);

/// Imports an object through the Arrow PyCapsule interface (arrow.cpp); copy= as in tw.asarray.
nb::object arrow_import(nb::handle obj, nb::handle copy);

}  // namespace twpy
