"""tensorwire: move a tensor across any boundary without copying where no copy is needed, without corrupting it
where one is, and without losing its dtype, layout, device, stream or metadata.

    >>> import numpy as np, tensorwire as tw
    >>> t = tw.asarray(np.arange(6.0).reshape(2, 3).T)   # zero-copy, strided
    >>> t.shape, t.strides, t.is_contiguous()
    ((3, 2), (1, 3), False)
"""

from __future__ import annotations

from . import _tensorwire as _ext
from ._tensorwire import (
    DLPACK_VERSION,
    CopyError,
    Device,
    DType,
    Publisher,
    Subscriber,
    Tensor,
    asarray,
    buffer_cache_stats,
    empty,
    from_dlpack,
    get_buffer_cache_limit,
    get_num_threads,
    set_buffer_cache_limit,
    set_num_threads,
    zeros,
)
from ._metadata import Metadata
from . import _exporters, _pickle, _numpy, _scalars, _signatures, cuda
from ._exporters import to_jax, to_numpy, to_torch
from ._paths import cmake_dir, include_dir, lib_dir, pkgconfig_dir

__version__: str = _ext.__version__


def _prefer_wheel_ucx() -> None:
    # The network layer (listen=, connect=) loads UCX when first used. When the libucx wheel is installed
    # (pip install libucx-cu13, or tensorwire[ucx]), its UCX is preferred over the system's: Debian 12's UCX 1.13
    # is built with assertions that abort the whole process on crafted bytes sent to its listening ports, and the
    # wheel's (1.18 and later) does not. TW_UCX_LIBRARY (a path or library name) overrides both. The package is
    # found, not imported.
    import importlib.util
    import os

    if os.environ.get("TW_UCX_LIBRARY"):
        return
    try:
        spec = importlib.util.find_spec("libucx")
    except (ImportError, ValueError):
        return
    for d in (spec.submodule_search_locations or []) if spec else []:
        lib = os.path.join(d, "lib", "libucp.so.0")
        if os.path.isfile(lib):
            _ext._prefer_ucx_library(lib)
            return


_prefer_wheel_ucx()

CopyError.__module__ = "tensorwire"


def _get_metadata(self: Tensor) -> Metadata:
    return Metadata(self)


def _set_metadata(self: Tensor, value) -> None:
    if not hasattr(value, "keys"):
        raise TypeError(f"metadata must be a mapping with str keys, not {type(value).__name__}")
    self._meta_replace(value)  # converted whole before it replaces anything; linear in the number of keys


Tensor.metadata = property(
    _get_metadata,
    _set_metadata,
    doc="A live mutable mapping of str keys to JSON-like values (None, bool, int, float, str, bytes, and lists, "
    "tuples and dicts of these). Views and copies carry a deep copy.",
)
Tensor.__array__ = _numpy.tensor_array
Tensor.numpy = _numpy.tensor_numpy
def _tolist(self):
    """The values as nested Python lists (a Python scalar for a 0-d tensor), as ndarray.tolist()."""
    if _numpy.is_packed(self):
        return _numpy.unpacked(self).tolist()
    return _numpy.tensor_numpy(self).tolist()


Tensor.tolist = _tolist


def _jax_array(self):
    """jnp.asarray(t) and jnp.array(t) take a tensor through this: tw.to_jax(t) (zero-copy where XLA can take the
    layout). Without it, JAX asks NumPy for the dtype of `t.dtype`, a tw.DType NumPy 2 refuses. (JAX 0.10 no longer
    calls it inside jnp functions such as jnp.sin: convert first.) A 64-bit tensor while JAX's 64-bit types are
    off becomes 32-bit, as jnp.asarray does with a NumPy array (tw.to_jax refuses it instead)."""
    return _exporters.jax_array(self, None, True)


Tensor.__jax_array__ = _jax_array


def _iter(self):
    """Iterates over the first dimension (views), as NumPy and PyTorch do; a 0-d tensor raises TypeError."""
    if self.ndim == 0:
        raise TypeError("iteration over a 0-d tensor")
    return (self[i] for i in range(self.shape[0]))


Tensor.__iter__ = _iter
Tensor.__eq__ = _scalars.tensor_eq
Tensor.__ne__ = _scalars.tensor_eq
Tensor.__hash__ = object.__hash__  # identity, as before: tensors stay usable as dict keys and set members
if "_native_repr" not in Tensor.__dict__:  # importlib.reload(tensorwire) must not wrap the wrapper again
    Tensor._native_repr = Tensor.__repr__
Tensor.__repr__ = _scalars.make_repr(Tensor._native_repr)
Tensor.item = _scalars.item
Tensor.__float__ = _scalars.tensor_float
Tensor.__int__ = _scalars.tensor_int
Tensor.__complex__ = _scalars.tensor_complex
Tensor.__index__ = _scalars.tensor_index
Tensor.__bool__ = _scalars.tensor_bool
Tensor.__format__ = _scalars.tensor_format
Tensor.__reduce_ex__ = _pickle.reduce_ex
Tensor.__reduce__ = lambda self: _pickle.reduce_ex(self, 2)

# DType and Device pickle by name; np.dtype(tw.float32) works where NumPy (or ml_dtypes) has the type.
DType.__reduce__ = lambda self: (DType, (self.name,))
Device.__reduce__ = lambda self: (Device, (str(self),))


DType.dtype = property(_numpy.numpy_dtype,
                       doc="The NumPy dtype of this type (ml_dtypes' for bfloat16, float8, int4...).")

# dtype constants: tw.float32, tw.bfloat16, ...
_DTYPE_NAMES = (
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 bfloat16 complex32 complex64 "
    "complex128 bcomplex32 "
    "float8_e3m4 float8_e4m3 float8_e4m3b11fnuz float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz "
    "float8_e8m0fnu float6_e2m3fn float6_e3m2fn float4_e2m1fn int2 int4 uint2 uint4"
).split()
for _n in _DTYPE_NAMES:
    globals()["bool_" if _n == "bool" else _n] = DType(_n)
del _n

try:  # Arrow interop registers itself as an import protocol when present
    from . import _arrow  # noqa: F401
    from ._arrow import ArrowTensorArray, from_arrow, to_arrow
except ImportError:  # pragma: no cover - the module ships with the package
    pass

_signatures.install(globals())  # inspect.signature() for the native functions (asarray, empty, ...) and methods

__all__ = [
    "Tensor",
    "DType",
    "Device",
    "Metadata",
    "CopyError",
    "asarray",
    "buffer_cache_stats",
    "get_buffer_cache_limit",
    "set_buffer_cache_limit",
    "Publisher",
    "Subscriber",
    "from_dlpack",
    "empty",
    "zeros",
    "set_num_threads",
    "get_num_threads",
    "to_numpy",
    "to_torch",
    "to_jax",
    "to_arrow",
    "from_arrow",
    "ArrowTensorArray",
    "DLPACK_VERSION",
    "cmake_dir",
    "include_dir",
    "lib_dir",
    "pkgconfig_dir",
    "__version__",
]

del annotations  # (the __future__ import binds the name: not part of the public namespace)
