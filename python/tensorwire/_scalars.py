"""Python scalars from one-element tensors, as NumPy gives them: item(), float(), int(), complex(),
operator.index() and bool()."""

from __future__ import annotations

from typing import Any

from ._numpy import ndarray_view

_INDEX_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "int2", "int4", "uint2",
                 "uint4"}


def _host_view(self, what: str):
    dev = self.device
    if dev.type not in ("cpu", "cuda_host", "cuda_managed", "rocm_host"):
        raise TypeError(f"{what}: the tensor is on {dev}, not in host memory; copy it to the CPU first")
    return ndarray_view(self)


def item(self) -> Any:
    """The value of a one-element tensor as a Python scalar (bool, int, float or complex), as ndarray.item()."""
    if self.size != 1:
        raise ValueError(f"item(): only a tensor of one element converts to a Python scalar, not one of shape "
                         f"{self.shape} ({self.size} elements)")
    return _host_view(self, "item()").reshape(-1)[0].item()


def _scalar(self, what: str) -> Any:
    if self.size != 1:
        raise TypeError(f"{what}: only a tensor of one element converts to a Python scalar, not one of shape "
                        f"{self.shape}")
    return item(self)


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
    if str(self.dtype) not in _INDEX_DTYPES:
        raise TypeError(f"only an integer tensor of one element can be used as an index, not a {self.dtype} tensor")
    return int(_scalar(self, "operator.index()"))


def tensor_bool(self) -> bool:
    n = self.size
    if n == 1:
        return bool(item(self))
    if n == 0:
        raise ValueError("the truth value of an empty tensor is ambiguous; test t.size instead")
    raise ValueError(f"the truth value of a tensor of {n} elements is ambiguous; use np.asarray(t).any() or .all()")


def tensor_eq(self, other: Any) -> Any:
    """tensorwire tensors are views, not arrays with arithmetic: == and != are refused rather than comparing
    identity (the default) or guessing elementwise semantics without an engine for them."""
    raise TypeError(
        "tensorwire.Tensor does not support == or != (it would compare identity, not values): compare values with "
        "np.array_equal(np.asarray(t), np.asarray(u)) or elementwise with np.asarray(t) == np.asarray(u), and "
        "identity with `t is u`"
    )


_HOST = ("cpu", "cuda_host", "cuda_managed", "rocm_host")


def make_repr(c_repr):
    """repr(t): the values as NumPy shows them (summarised beyond 1000 elements), then the layout. Never raises and
    never reads device memory from the host: a spent loan, a tensor in device memory or one NumPy cannot show gets
    the layout alone (C++'s repr, which never raises)."""

    def tensor_repr(self) -> str:
        head = c_repr(self)
        try:
            if head.startswith("tensorwire.Tensor(<"):
                return head  # a spent loan
            if self.device.type not in _HOST:
                return head[:-1] + ", values in device memory not shown)"
            import numpy as np

            a = ndarray_view(self)
            prefix = "tensorwire.Tensor("
            body = np.array2string(a, separator=", ", prefix=prefix, threshold=1000, edgeitems=3)
            return prefix + body + ", " + head[len(prefix):]
        except Exception:  # noqa: BLE001 - repr must not raise; the layout is still right
            return head

    return tensor_repr
