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
        raise BufferError(f"a tensor on {dev} is not in host memory; NumPy cannot view it (t.to('cpu') copies it to "
                          "the host)")
    name = str(t.dtype)
    if t.dtype.lanes != 1:
        raise BufferError(f"NumPy has no vector type for {name}")
    if name in _NATIVE:
        return np.asarray(memoryview(t))
    if is_packed(t):
        raise BufferError(
            f"a packed {name} tensor stores two or more elements per byte; NumPy (ml_dtypes) stores one per byte, "
            "so it cannot be viewed without unpacking (np.asarray(t), tw.to_numpy(t) and t.tolist() unpack a copy)"
        )
    mld = _ml_dtype(name)
    raw = t._reinterpret(_UINT_OF_SIZE[t.dtype.itemsize], False)
    return np.asarray(memoryview(raw)).view(mld)


def is_packed(t) -> bool:
    """Sub-byte elements (int4, float4_e2m1fn, float6...) stored packed, several per byte."""
    return t.dtype.bits < 8 and not t.subbyte_padded


def unpacked(t) -> np.ndarray:
    """A packed sub-byte tensor's values in a new ndarray of ml_dtypes' type (one element per byte, its value in the
    low bits, as ml_dtypes stores it): a copy, since NumPy cannot view packed elements. DLPack packs little
    bit-endian: element k of the dense tensor lives in bits [k * bits, (k + 1) * bits) of its bytes."""
    dev = t.device
    if not dev.host_accessible:
        raise BufferError(f"a tensor on {dev} is not in host memory; NumPy cannot read it (t.to('cpu') copies it to "
                          "the host)")
    dt = t.dtype
    if dt.lanes != 1:
        raise BufferError(f"NumPy has no vector type for {dt.name}")
    mld = _ml_dtype(dt.name)
    n = t.size
    if n == 0:
        return np.empty(t.shape, mld)
    dense = t if t.is_contiguous() else t.contiguous()
    raw = np.asarray(memoryview(dense._byte_view()))
    bits = dt.bits
    if 8 % bits == 0:  # whole elements per byte (1, 2, 4 bits)
        shifts = np.arange(8 // bits, dtype=np.uint8) * np.uint8(bits)
        values = ((raw[:, None] >> shifts) & np.uint8((1 << bits) - 1)).reshape(-1)[:n]
    else:  # elements that straddle bytes (6 bits)
        b = np.unpackbits(raw, bitorder="little")[: n * bits].reshape(n, bits)
        values = np.packbits(b, axis=1, bitorder="little")[:, 0]
    return np.ascontiguousarray(values, dtype=np.uint8).view(mld).reshape(t.shape)


def tensor_array(self, dtype=None, copy=None):
    """ndarray protocol: zero-copy unless copy=True or a dtype conversion is asked for (or the tensor is a packed
    sub-byte one, which NumPy can only hold unpacked: a copy, refused with copy=False, and read-only unless
    copy=True, since writes into it would not reach the tensor)."""
    if is_packed(self):
        if copy is False:
            raise ValueError(f"a packed {self.dtype.name} tensor needs a copy to become an ndarray (NumPy stores one "
                             "element per byte), but copy=False")
        a = unpacked(self)
        a = a.astype(dtype) if dtype is not None and np.dtype(dtype) != a.dtype else a
        if not copy:
            # np.asarray(t) of a packed tensor is a copy where a view was asked for: a write into it would never
            # reach t (a loan filled that way sent stale pool bytes, silently). Read-only says so; np.array(t)
            # (copy=True) is the writable copy.
            a.flags.writeable = False
        return a
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
