"""Consumer-aware exports. Each consumer accepts some layouts and not others (see README, "Consumer layouts");
these helpers copy exactly when the consumer cannot take the layout and the caller allows it, and raise
tensorwire.CopyError when copy=False forbids the copy."""

from __future__ import annotations

from ._tensorwire import CopyError, asarray


def _prepare(t, copy, consumer: str, reason):
    if copy is True:
        return t.copy(), True
    why = reason(t)
    if why is None:
        return t, False
    if copy is False:
        raise CopyError(f"{consumer} cannot take this layout ({why}) and copy=False forbids the copy")
    return t.copy(), True


def _negative(t):
    if any(s < 0 for s, n in zip(t.strides, t.shape) if n > 1):
        return f"negative strides {t.strides}"
    return None


def _torch_cannot(t):
    why = _negative(t)
    if why is not None:
        return why
    if t.readonly:
        # PyTorch has no read-only tensors (torch.from_dlpack ignores DLPack's read-only flag): a zero-copy export
        # would let an in-place op write into memory that is not ours — for a received tensor, a read-only mapping
        # of another process's buffer (SIGSEGV) that other subscribers read too.
        return "the tensor is read-only and PyTorch tensors are always writable"
    return None


def _jax_cannot(t):
    if not t.is_contiguous("any"):
        return f"strides {t.strides} for shape {t.shape} have gaps or broadcasts (XLA takes dense layouts only)"
    if t.readonly:
        return "the tensor is read-only and JAX asks for a legacy capsule, which cannot carry that flag"
    return None


def to_numpy(x, *, copy=None):
    """x as a numpy.ndarray; NumPy takes every strided layout, so this copies only when copy=True, or when the
    tensor is a packed sub-byte one (int4...), which NumPy holds one element per byte (refused with copy=False)."""
    from ._numpy import is_packed, ndarray_view, unpacked

    t = asarray(x)
    if is_packed(t):
        if copy is False:
            raise CopyError(f"NumPy cannot take a packed {t.dtype.name} tensor (it stores one element per byte) and "
                            "copy=False forbids the copy")
        return unpacked(t)
    a = ndarray_view(t)
    return a.copy() if copy else a


def to_torch(x, *, copy=None):
    """x as a torch.Tensor through DLPack. PyTorch refuses negative strides and has no read-only tensors: such
    tensors (a received tw.Subscriber message among them) are copied, or refused with copy=False."""
    import torch

    t, _ = _prepare(asarray(x), copy, "PyTorch", _torch_cannot)
    return torch.from_dlpack(t)


def to_jax(x, *, copy=None):
    """x as a jax.Array through DLPack. XLA takes dense layouts in any dimension order (no gaps, no stride 0, no
    negative strides) and asks for legacy capsules: anything else is copied (or refused with copy=False)."""
    import jax.numpy as jnp

    t = asarray(x)
    if t.dtype.bits < 8:
        # XLA's DLPack import has no sub-byte types (int4, float4_e2m1fn...): through NumPy (ml_dtypes), a copy.
        if copy is False:
            raise CopyError(f"JAX cannot take a {t.dtype.name} tensor through DLPack and copy=False forbids the copy")
        from ._numpy import tensor_array

        return jnp.array(tensor_array(t))
    t, _ = _prepare(t, copy, "JAX", _jax_cannot)
    return jnp.from_dlpack(t)
