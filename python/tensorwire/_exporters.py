"""Consumer-aware exports. Each consumer accepts some layouts and not others (see README, "Consumer layouts");
these helpers copy exactly when the consumer cannot take the layout and the caller allows it, and raise
tensorwire.CopyError when copy=False forbids the copy."""

from __future__ import annotations

from ._tensorwire import CopyError, asarray


def _needs(t, reason_if_bad):
    reason = reason_if_bad(t)
    return reason


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


def _not_dense(t):
    if not t.is_contiguous("C"):
        return f"strides {t.strides} for shape {t.shape} are not row-major dense"
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
    """x as a jax.Array through DLPack. XLA takes only row-major dense buffers on CPU: anything else is copied
    (or refused with copy=False)."""
    import jax.numpy as jnp

    t, _ = _prepare(asarray(x), copy, "JAX", _not_dense)
    return jnp.from_dlpack(t)
