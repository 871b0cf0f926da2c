"""NumPy export: zero-copy ndarrays, with ml_dtypes types for bfloat16 / float8 / int4 instead of void arrays."""

from __future__ import annotations

import numpy as np

_NATIVE = {
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
}
_UINT_OF_SIZE = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def _ml_dtype(name: str) -> np.dtype:
    try:
        import ml_dtypes
    except ImportError as e:  # pragma: no cover - ml_dtypes is installed in every supported set-up
        raise BufferError(f"NumPy has no {name} type; install ml_dtypes to export it (pip install ml_dtypes)") from e
    try:
        return np.dtype(getattr(ml_dtypes, name))
    except AttributeError:
        raise BufferError(f"ml_dtypes {ml_dtypes.__version__} has no {name} type") from None


def numpy_dtype(dt) -> np.dtype:
    """The NumPy dtype of a tw.DType: NumPy's own where it has the type, ml_dtypes' for bfloat16, float8, int4...
    Raises TypeError for a type neither has (vector lanes such as float32x4)."""
    name = dt.name
    if dt.lanes == 1 and name in _NATIVE:
        return np.dtype(name)
    try:
        return _ml_dtype(name)
    except BufferError as e:
        raise TypeError(f"NumPy has no type for {name}: {e}") from None


def ndarray_view(t) -> np.ndarray:
    """A zero-copy ndarray over a host-accessible tensor (same memory, same strides)."""
    dev = t.device
    if not dev.host_accessible:
        raise BufferError(f"a tensor on {dev} is not in host memory; NumPy cannot view it")
    name = str(t.dtype)
    if t.dtype.lanes != 1:
        raise BufferError(f"NumPy has no vector type for {name}")
    if name in _NATIVE:
        return np.asarray(memoryview(t))
    if t.dtype.bits < 8 and not t.subbyte_padded:
        raise BufferError(
            f"a packed {name} tensor stores two or more elements per byte; NumPy (ml_dtypes) stores one per byte, "
            "so it cannot be viewed without unpacking"
        )
    mld = _ml_dtype(name)
    raw = t._reinterpret(_UINT_OF_SIZE[t.dtype.itemsize], False)
    return np.asarray(memoryview(raw)).view(mld)


def tensor_array(self, dtype=None, copy=None):
    """ndarray protocol: zero-copy unless copy=True or a dtype conversion is asked for."""
    a = ndarray_view(self)
    if dtype is not None and np.dtype(dtype) != a.dtype:
        if copy is False:
            raise ValueError(f"converting {a.dtype} to {np.dtype(dtype)} needs a copy, but copy=False")
        return a.astype(dtype)
    if copy:
        return a.copy()
    return a


def tensor_numpy(self) -> np.ndarray:
    """The tensor as a zero-copy ndarray (read-only when the tensor is)."""
    return ndarray_view(self)
