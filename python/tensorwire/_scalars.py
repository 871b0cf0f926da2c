"""Python scalars from one-element tensors: item(), float(), int(), complex(), operator.index() and bool() (any
one-element tensor converts, as in PyTorch; NumPy 2 converts 0-d arrays only), == / != and repr()."""

from __future__ import annotations

import numbers
from typing import Any

from ._numpy import _ml_dtype, is_packed, ndarray_view, unpacked

# DLPack type codes (dlpack.h, DLDataTypeCode): kDLInt = 0, kDLUInt = 1. kDLBool (6) is not an index type.
_INT_CODES = (0, 1)


def _host_value(self, what: str) -> Any:
    """The value of a tensor known to hold one element; `what` names the operation the caller asked for."""
    dev = self.device
    if not dev.host_accessible:
        # As torch's item() does: one element crosses to the host (Tensor.to, after the tensor's stream).
        try:
            self = self.to("cpu")
        except BufferError as e:
            raise BufferError(f"{what}: the tensor is on {dev}, which the host cannot read, and copying its element "
                              f"to the host failed: {e}") from None
    dt = self.dtype
    if dt.bits * dt.lanes < 8 and not self.subbyte_padded:
        return _packed_value(self, what)
    try:
        return ndarray_view(self).reshape(-1)[0].item()
    except BufferError as e:
        raise BufferError(f"{what}: {e}") from None


def _packed_value(self, what: str) -> Any:
    # A packed sub-byte tensor (int4, float4_e2m1fn...) holds several elements per byte, which NumPy cannot view.
    # One element can still be read: a view always starts on a byte boundary (Tensor.slice refuses any other), and
    # DLPack packs little bit-endian, so the element is the low `bits` bits of its first byte.
    dt = self.dtype
    if dt.lanes != 1:
        raise BufferError(f"{what}: NumPy has no vector type for {dt}")
    import numpy as np

    byte = memoryview(self._byte_view())[0]
    low = np.array(byte & ((1 << dt.bits) - 1), np.uint8)
    try:
        return low.view(_ml_dtype(dt.name)).item()
    except BufferError as e:
        raise BufferError(f"{what}: {e}") from None


def item(self) -> Any:
    """The value of a one-element tensor as a Python scalar (bool, int, float or complex), as ndarray.item()."""
    if self.size != 1:
        raise ValueError(f"item(): only a tensor of one element converts to a Python scalar, not one of shape "
                         f"{self.shape} ({self.size} elements)")
    return _host_value(self, "item()")


def _scalar(self, what: str) -> Any:
    if self.size != 1:
        raise TypeError(f"{what}: only a tensor of one element converts to a Python scalar, not one of shape "
                        f"{self.shape}")
    return _host_value(self, what)


def tensor_float(self) -> float:
    v = _scalar(self, "float()")
    if isinstance(v, complex):
        raise TypeError(f"float(): the tensor is {self.dtype}; take .real or use complex()")
    return float(v)


def tensor_int(self) -> int:
    v = _scalar(self, "int()")
    if isinstance(v, complex):
        raise TypeError(f"int(): the tensor is {self.dtype}; take .real first")
    return int(v)


def tensor_complex(self) -> complex:
    return complex(_scalar(self, "complex()"))


def tensor_index(self) -> int:
    dt = self.dtype
    if dt.code not in _INT_CODES or dt.lanes != 1:
        raise TypeError(f"operator.index(): only an integer tensor of one element can be used as an index; this one "
                        f"is {dt}")
    return int(_scalar(self, "operator.index()"))


def tensor_bool(self) -> bool:
    n = self.size
    if n == 1:
        return bool(_host_value(self, "bool()"))
    if n == 0:
        raise ValueError("the truth value of an empty tensor is ambiguous; test t.size instead")
    raise ValueError(f"the truth value of a tensor of {n} elements is ambiguous; use np.asarray(t).any() or .all()")


def tensor_format(self, spec: str) -> str:
    """f"{t:.3f}": a 0-d tensor formats as its value, as NumPy's and PyTorch's do; an empty spec is str(t)."""
    if not spec:
        return str(self)
    if self.ndim != 0:
        raise TypeError(f"format spec {spec!r} applies to a 0-d tensor's value; this tensor has shape {self.shape}: "
                        f"format its elements (t.tolist()) or use str(t)")
    return format(_host_value(self, "format()"), spec)


# The protocols tw.asarray imports from: an object offering one is array-like, and t == obj would be read as a
# comparison of values.
_ARRAY_PROTOCOLS = ("__array__", "__array_interface__", "__array_struct__", "__dlpack__", "__cuda_array_interface__",
                    "__arrow_c_array__", "__arrow_c_device_array__")


def _values_expected(other: Any) -> bool:
    """True when `t == other` would read as a comparison of values: other is a tensor or array, or a number."""
    if isinstance(other, (numbers.Number, memoryview)):  # bool, int, float, complex, NumPy numbers, Fraction...
        return True
    if (type(other).__module__ or "").partition(".")[0] in ("numpy", "torch"):  # np.bool_, np.dtype, torch.dtype...
        return True
    for name in _ARRAY_PROTOCOLS:
        try:
            if hasattr(other, name):
                return True
        except Exception:  # noqa: BLE001 - a protocol that fails when asked is still a protocol on offer
            return True
    return False


def tensor_eq(self, other: Any) -> Any:
    """tensorwire tensors are views, not arrays with arithmetic. Against a tensor, an array-like or a number, == and
    != are refused rather than comparing identity or guessing elementwise semantics without an engine for them;
    against anything else (None, a str, a list) they return NotImplemented, so Python compares identity:
    `t == None` is False, and `x in [t, None]` works."""
    if not _values_expected(other):
        return NotImplemented
    raise TypeError(
        f"tensorwire.Tensor does not support == or != with {type(other).__name__} (it would compare identity, not "
        "values): compare values with np.array_equal(np.asarray(t), np.asarray(u)) or elementwise with "
        "np.asarray(t) == np.asarray(u), and identity with `t is u`"
        + ("; a one-element tensor's value is t.item()" if isinstance(other, numbers.Number) else "")
    )


# Memory the host reads without side effects. Managed memory is refused too: it may be resident on a device, and
# reading it from the host migrates its pages back (and races a kernel still writing it).
_SHOWN = ("cpu", "cuda_host", "rocm_host")


def _not_shown(dev) -> str | None:
    if dev.type in _SHOWN:
        return None
    if dev.type == "cuda_managed":
        return ("values not shown: managed memory may be resident on the device, and reading it from the host would "
                "migrate its pages")
    return "values in device memory not shown"


def make_repr(c_repr):
    """repr(t): the values as NumPy shows them (summarised beyond 1000 elements), then the layout. Never raises and
    never reads device memory from the host (managed memory included): a spent loan, a tensor outside plain host
    memory or one NumPy cannot show gets the layout alone (C++'s repr, which never raises), the second with the
    reason its values are not shown."""

    def tensor_repr(self) -> str:
        head = c_repr(self)
        try:
            if head.startswith("tensorwire.Tensor(<"):
                return head  # a spent loan
            why = _not_shown(self.device)
            if why is not None:
                return f"{head[:-1]}, {why})"
            import numpy as np

            if is_packed(self):  # NumPy cannot view packed elements: a copy of them, when that is small
                if self.size > (1 << 20):
                    return head
                a = unpacked(self)
            else:
                a = ndarray_view(self)
            prefix = "tensorwire.Tensor("
            body = np.array2string(a, separator=", ", prefix=prefix, threshold=1000, edgeitems=3)
            return prefix + body + ", " + head[len(prefix):]
        except Exception:  # noqa: BLE001 - repr must not raise; the layout is still right
            return head

    return tensor_repr
