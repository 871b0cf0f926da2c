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


def _jax_cannot(t):
    if not t.is_contiguous("any"):
        return f"strides {t.strides} for shape {t.shape} have gaps or broadcasts (XLA takes dense layouts only)"
    if t.readonly:
        return "the tensor is read-only and JAX asks for a legacy capsule, which cannot carry that flag"
    return None


def to_numpy(x, *, copy=None):
    """x as a numpy.ndarray; NumPy takes every strided layout, so this copies only when copy=True."""
    from ._numpy import ndarray_view

    t = asarray(x)
    a = ndarray_view(t)
    return a.copy() if copy else a


def to_torch(x, *, copy=None):
    """x as a torch.Tensor through DLPack. PyTorch refuses negative strides: such views are copied (or refused
    with copy=False)."""
    import torch

    t, _ = _prepare(asarray(x), copy, "PyTorch", _negative)
    return torch.from_dlpack(t)


def to_jax(x, *, copy=None):
    """x as a jax.Array through DLPack. XLA takes dense layouts in any dimension order (no gaps, no stride 0, no
    negative strides) and asks for legacy capsules: anything else is copied (or refused with copy=False)."""
    import jax.numpy as jnp

    t, _ = _prepare(asarray(x), copy, "JAX", _jax_cannot)
    return jnp.from_dlpack(t)
