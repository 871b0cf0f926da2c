"""Consumer-aware exports. Each consumer accepts some layouts and not others (see README, "Consumer layouts");
these helpers copy exactly when the consumer cannot take the layout and the caller allows it, and raise
tensorwire.CopyError when copy=False forbids the copy."""

from __future__ import annotations

from ._tensorwire import CopyError, Tensor, asarray


def check_copy(copy, who: str) -> None:
    """Raises TypeError unless copy is None, True or False (what every copy= here takes)."""
    if copy is not None and not isinstance(copy, bool):
        raise TypeError(f"{who}: copy must be True, False or None, not {type(copy).__name__}")


def _prepare(t, copy, consumer: str, reason, order="C"):
    """t, or a copy of it in `order` ("any": a dense layout's own order, never a negative stride) when copy=True or
    the consumer cannot take t (`reason` says why)."""
    if copy is True:
        return t.copy(order=order), True
    why = reason(t)
    if why is None:
        return t, False
    if copy is False:
        raise CopyError(f"{consumer} cannot take this layout ({why}) and copy=False forbids the copy")
    return t.copy(order=order), True


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


# The DLPack devices handed to torch.from_dlpack: PyTorch 2.13 aborts the process on some others (opencl: "INTERNAL
# ASSERT FAILED ... grandfathered Caffe2 device type", then SIGBUS) instead of raising.
_TORCH_DEVICES = ("cpu", "cuda", "cuda_host", "cuda_managed")


def check_torch_device(t, who: str) -> None:
    """Raises BufferError for a tensor on a device tensorwire does not hand to PyTorch."""
    if t.device.type not in _TORCH_DEVICES:
        raise BufferError(f"{who}: a tensor on {t.device} cannot go to PyTorch through tensorwire (it hands PyTorch "
                          f"tensors on {', '.join(_TORCH_DEVICES)} only; PyTorch aborts on some other DLPack devices)")


def _jax_cannot(t):
    if not t.is_contiguous("any"):
        return f"strides {t.strides} for shape {t.shape} have gaps or broadcasts (XLA takes dense layouts only)"
    if t.readonly:
        return "the tensor is read-only and JAX asks for a legacy capsule, which cannot carry that flag"
    if t.device.type == "cpu" and t.nbytes and (off := t.data_ptr % _XLA_CPU_ALIGN):
        return (f"its data starts {off} byte{'s' if off > 1 else ''} past a {_XLA_CPU_ALIGN}-byte boundary; XLA "
                "on the CPU takes only aligned buffers in place")
    return None


# XLA's CPU client imports a DLPack buffer in place only at this alignment and copies it otherwise (jaxlib 0.10:
# an offset of 16, 32 or 48 bytes was copied, 0 and 64 were not). A copy JAX makes anyway is also caught after the
# import (_jax_zero_copy), whatever the rule of the jaxlib at hand.
_XLA_CPU_ALIGN = 64


def _jax_zero_copy(j, t):
    """Raises CopyError when JAX copied t on import although copy=False (a rule of XLA's not modelled above)."""
    if not t.nbytes or len(j.devices()) != 1:
        return
    try:
        ptr = j.unsafe_buffer_pointer()
    except Exception:  # (a backend without raw pointers: nothing to compare)
        return
    if ptr != t.data_ptr:
        raise CopyError("JAX copied this tensor on import (XLA's rule for its layout or address) and copy=False "
                        "forbids the copy")


# The dtypes whose DLPack codes came with version 1.1 (float8, float6, float4).
_DLPACK_1_1_FLOATS = ("float8", "float6", "float4")


def torch_from_dlpack(t, what="tensorwire.to_torch"):
    """torch.from_dlpack(t), and float8 and float4 too: torch.from_dlpack asks producers for DLPack 1.0 at most, which has no
    float8 codes (tensorwire refuses to hand a code to a consumer that does not claim to know it), yet PyTorch reads
    them from a 1.1 capsule given directly. The capsule is made ready on torch's current stream, as from_dlpack
    would ask (DLPack: 1 for the legacy default stream). A dtype PyTorch cannot take is a BufferError naming it
    (PyTorch's own words were "Unsupported code 7")."""
    import torch

    try:
        if not t.dtype.name.startswith(_DLPACK_1_1_FLOATS):
            return torch.from_dlpack(t)
        stream = None
        if t.device.type == "cuda":
            s = torch.cuda.current_stream(t.device.index).cuda_stream
            stream = 1 if s == 0 else s
        return torch.from_dlpack(t.__dlpack__(max_version=(1, 1), stream=stream))
    except BufferError as e:
        if "Unsupported" not in str(e) and "needs DLPack" not in str(e):
            raise  # (not about the dtype: tensorwire's own words already say what)
        name = t.dtype.name
        raise BufferError(f"{what}: PyTorch {torch.__version__.split('+')[0]} cannot take {name} tensors ({e}); "
                          f"tw.to_numpy(t) gives it to NumPy (through ml_dtypes)") from None


def _import_copy(copy):
    """What the import may do under the export's copy=: copy=False forbids a copy in either step (a byte-swapped or
    Python-list source needs one to import at all), while copy=True copies once, on the way out."""
    return False if copy is False else None


def _per_part(x, convert, copy):
    """A received message (a dict of parts, or a list / tuple holding tensors), converted part by part with the
    structure Subscriber.recv gave it; None for anything else. (asarray of such a list stacked the parts into one
    array, promoting mixed dtypes: uint64 and float32 parts came back as float64, rounded.)"""
    if isinstance(x, dict):
        return {k: convert(v, copy=copy) for k, v in x.items()}
    if isinstance(x, (list, tuple)) and any(isinstance(e, Tensor) for e in x):
        return type(x)(convert(e, copy=copy) for e in x) if type(x) in (list, tuple) else \
            [convert(e, copy=copy) for e in x]
    return None


def to_numpy(x, *, copy=None):
    """x as a numpy.ndarray; NumPy takes every strided layout, so this copies only when copy=True, or when the
    tensor is a packed sub-byte one (int4...), which NumPy holds one element per byte (refused with copy=False).
    A received message (a dict, list or tuple of tensors) converts part by part, keeping its structure."""
    check_copy(copy, "to_numpy")
    if (parts := _per_part(x, to_numpy, copy)) is not None:
        return parts
    from ._numpy import is_packed, ndarray_view, unpacked

    t = asarray(x, copy=_import_copy(copy))
    if is_packed(t):
        if copy is False:
            raise CopyError(f"NumPy cannot take a packed {t.dtype.name} tensor (it stores one element per byte) and "
                            "copy=False forbids the copy")
        a = unpacked(t)
        a.flags.writeable = bool(copy)  # (a write into an unasked-for copy would not reach t: read-only says so)
        return a
    a = ndarray_view(t)
    return a.copy() if copy else a


def to_torch(x, *, copy=None):
    """x as a torch.Tensor through DLPack. PyTorch refuses negative strides and has no read-only tensors: such
    tensors (a received tw.Subscriber message among them) are copied, or refused with copy=False. A message of
    several tensors (a dict, list or tuple) converts part by part, keeping its structure."""
    check_copy(copy, "to_torch")
    if (parts := _per_part(x, to_torch, copy)) is not None:
        return parts
    import torch

    t = asarray(x, copy=_import_copy(copy))
    check_torch_device(t, "to_torch")
    # (PyTorch takes any strides: a copy keeps a dense layout's order, as torch's clone() keeps a memory format)
    t, _ = _prepare(t, copy, "PyTorch", _torch_cannot, order="any")
    return torch_from_dlpack(t)


def jax_narrows(t):
    """The dtype JAX would turn t's into (int64 -> int32, float64 -> float32, ...: 64-bit types while
    jax_enable_x64 is off, JAX's default), or None when it keeps it."""
    import jax

    from ._numpy import numpy_dtype

    try:
        src = numpy_dtype(t.dtype)
    except TypeError:
        return None
    canon = jax.dtypes.canonicalize_dtype(src)
    return None if canon == src else canon


def to_jax(x, *, copy=None):
    """x as a jax.Array through DLPack. XLA takes dense layouts in any dimension order (no gaps, no stride 0, no
    negative strides) and asks for legacy capsules: anything else is copied (or refused with copy=False). A 64-bit
    tensor while JAX's 64-bit types are off (jax_enable_x64, off by default) is refused with TypeError: JAX would
    make it 32-bit, wrapping or rounding its values. A message of several tensors (a dict, list or tuple)
    converts part by part, keeping its structure."""
    check_copy(copy, "to_jax")
    if (parts := _per_part(x, to_jax, copy)) is not None:
        return parts
    return jax_array(x, copy, False)


def jax_array(x, copy, _narrow_as_jax_does):
    """to_jax; _narrow_as_jax_does: jnp.asarray(t) (Tensor.__jax_array__) lets JAX narrow 64-bit types, as it does
    with a NumPy array, on whatever device t is."""
    import jax.numpy as jnp

    t = asarray(x, copy=_import_copy(copy))
    narrowed = None if _narrow_as_jax_does else jax_narrows(t)
    if narrowed is not None:
        raise TypeError(f"to_jax: JAX's 64-bit types are off (jax_enable_x64), so this {t.dtype.name} tensor would "
                        f"arrive as {narrowed.name}, its values wrapped or rounded; enable them "
                        "(jax.config.update('jax_enable_x64', True)) or convert first (e.g. "
                        f"jnp.asarray(np.asarray(t), jnp.{narrowed.name}))")
    if t.dtype.bits < 8:
        # XLA's DLPack import has no sub-byte types (int4, float4_e2m1fn...): through NumPy (ml_dtypes), a copy.
        if copy is False:
            raise CopyError(f"JAX cannot take a {t.dtype.name} tensor through DLPack and copy=False forbids the copy")
        from ._numpy import tensor_array

        return jnp.array(tensor_array(t))
    t, _ = _prepare(t, copy, "JAX", _jax_cannot)
    j = jnp.from_dlpack(t)
    if copy is False:
        _jax_zero_copy(j, t)
    return j
