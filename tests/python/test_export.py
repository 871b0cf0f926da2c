"""tw.Tensor as a producer: DLPack (legacy and versioned), __array__, __array_interface__, the buffer protocol and
the consumer-aware helpers, against the real consumers (NumPy, PyTorch, JAX)."""

from __future__ import annotations

import ctypes
import os
import importlib.util
import inspect
import io
import warnings

import numpy as np
import pytest

import tensorwire as tw
from _helpers import DLTensor, aligned, ptr, same_bits, NO_CUDA_DRIVER

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")

READ_ONLY, IS_COPIED, IS_SUBBYTE_TYPE_PADDED = 1, 2, 4

_capi = ctypes.pythonapi
_capi.PyCapsule_GetName.restype = ctypes.c_char_p
_capi.PyCapsule_GetName.argtypes = [ctypes.py_object]
_capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


def capsule_name(cap) -> str:
    return _capi.PyCapsule_GetName(cap).decode()


def peek(cap):
    """The struct inside an unconsumed capsule (read only; the capsule still owns it, so the caller must keep the
    capsule alive while it reads the struct)."""
    name = capsule_name(cap)
    p = _capi.PyCapsule_GetPointer(cap, name.encode())
    cls = DLManagedTensorVersioned if name == "dltensor_versioned" else DLManagedTensor
    return cls.from_address(p)


def dl_layout(dl: DLTensor):
    shape = tuple(dl.shape[i] for i in range(dl.ndim))
    strides = tuple(dl.strides[i] for i in range(dl.ndim)) if dl.strides else None
    return shape, strides


@pytest.fixture
def src():
    return np.arange(12, dtype=np.float32).reshape(3, 4)


# ---- zero-copy exports ------------------------------------------------------------------------------------------
def test_numpy_from_dlpack_zero_copy(src):
    t = tw.asarray(src)
    n = np.from_dlpack(t)
    assert ptr(n) == ptr(src) and n.shape == (3, 4) and n.dtype == np.float32
    n[1, 1] = -5
    assert src[1, 1] == -5
    src[2, 3] = 77
    assert n[2, 3] == 77


def test_torch_from_dlpack_zero_copy(src):
    t = tw.asarray(src)
    x = torch.from_dlpack(t)
    assert x.data_ptr() == ptr(src) and tuple(x.shape) == (3, 4) and x.dtype == torch.float32
    x[0, 0] = 42
    assert src[0, 0] == 42
    src[1, 2] = -3
    assert x[1, 2].item() == -3


def test_torch_from_dlpack_strided_zero_copy(src):
    t = tw.asarray(src)[:, 1::2].T
    x = torch.from_dlpack(t)
    assert x.data_ptr() == t.data_ptr and tuple(x.stride()) == t.strides
    assert np.array_equal(x.numpy(), np.asarray(t))
    x[1, 2] = 1000
    assert src[2, 3] == 1000


def test_jax_from_dlpack_zero_copy():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    jnp = jax.numpy
    a = aligned(np.arange(64, dtype=np.float32).reshape(8, 8))  # XLA copies unaligned buffers
    t = tw.asarray(a)
    j = jnp.from_dlpack(t)
    assert j.unsafe_buffer_pointer() == ptr(a)
    assert np.array_equal(np.asarray(j), a)
    a[0, 0] = 123.0  # JAX arrays are immutable to JAX, but the memory is shared
    assert float(np.asarray(j)[0, 0]) == 123.0


def test_np_asarray_and_memoryview_zero_copy(src):
    t = tw.asarray(src)
    n = np.asarray(t)
    assert ptr(n) == ptr(src)
    m = memoryview(t)
    assert m.format == "f" and m.shape == (3, 4) and m.strides == (16, 4) and not m.readonly
    assert m.itemsize == 4 and m.nbytes == 48
    m[1, 0] = 9.5
    assert src[1, 0] == 9.5
    assert ptr(np.asarray(m)) == ptr(src)
    c = ctypes.c_char.from_buffer(t)  # a writable buffer request
    assert ctypes.addressof(c) == ptr(src)
    assert io.BytesIO(np.full(12, 2.0, np.float32).tobytes()).readinto(t) == 48
    assert (src == 2.0).all()


def test_memoryview_of_strided_and_contiguity_requests(src):
    t = tw.asarray(src)[::-1, ::2]
    m = memoryview(t)
    assert m.strides == (-16, 8) and m.shape == (3, 2)
    assert np.array_equal(np.asarray(m), src[::-1, ::2])
    with pytest.raises(TypeError):  # CPython turns the exporter's BufferError into a TypeError here
        io.BytesIO(b"x" * 24).readinto(t)  # a simple (unstrided) buffer: only C-contiguous data has one
    tb = pytest.importorskip("_testbuffer", reason="CPython's _testbuffer module is not built here")
    for flags, word in [(tb.PyBUF_SIMPLE, "strides"), (tb.PyBUF_ND, "strides"), (tb.PyBUF_C_CONTIGUOUS, "C-contiguous"),
                        (tb.PyBUF_F_CONTIGUOUS, "Fortran"), (tb.PyBUF_ANY_CONTIGUOUS, "contiguous")]:
        with pytest.raises(BufferError) as ei:
            tb.ndarray(t, getbuf=flags)
        assert word in str(ei.value)
    full = tb.ndarray(t, getbuf=tb.PyBUF_FULL)
    assert full.strides == (-16, 8) and full.format == "f" and not full.readonly
    assert memoryview(tw.asarray(src).T).f_contiguous


def test_array_interface_on_cpu(src):
    t = tw.asarray(src)[1:, ::-1]
    ai = t.__array_interface__
    assert ai["version"] == 3 and ai["typestr"] == "<f4" and ai["shape"] == (2, 4)
    assert ai["data"] == (t.data_ptr, False) and ai["strides"] == (16, -4)
    assert tw.asarray(src).__array_interface__["strides"] is None
    # NumPy itself builds the same view from the dict alone
    class Holder:
        __array_interface__ = ai

    n = np.asarray(Holder())
    assert ptr(n) == t.data_ptr and np.array_equal(n, src[1:, ::-1])


def test_array_dunder_dtype_and_copy(src):
    t = tw.asarray(src)
    assert ptr(t.__array__()) == ptr(src)
    c = t.__array__(copy=True)
    assert ptr(c) != ptr(src) and np.array_equal(c, src)
    d = t.__array__(dtype=np.float64)
    assert d.dtype == np.float64 and np.array_equal(d, src)
    with pytest.raises(ValueError):
        t.__array__(dtype=np.float64, copy=False)
    assert np.array(t, copy=False).ctypes.data == ptr(src)
    assert np.array(t).ctypes.data != ptr(src)
    assert t.numpy().ctypes.data == ptr(src)
    assert t.tolist() == src.tolist()


# ---- __dlpack__ keyword arguments -------------------------------------------------------------------------------
def test_dlpack_max_version_none_gives_legacy_capsule(src):
    t = tw.asarray(src)
    cap = t.__dlpack__()
    assert capsule_name(cap) == "dltensor"
    m = peek(cap)
    assert m.dl_tensor.data == ptr(src) and dl_layout(m.dl_tensor) == ((3, 4), (4, 1))


@pytest.mark.parametrize("mv, minor", [((1, 0), 0), ((1, 1), 1), ((1, 99), tw.DLPACK_VERSION[1]),
                                       ((2, 0), tw.DLPACK_VERSION[1])])
def test_dlpack_versioned_capsule_version_capped(src, mv, minor):
    t = tw.asarray(src)
    cap = t.__dlpack__(max_version=mv)
    assert capsule_name(cap) == "dltensor_versioned"
    m = peek(cap)
    assert (m.major, m.minor) == (1, minor)
    assert m.flags == 0
    assert m.dl_tensor.data == ptr(src) and m.dl_tensor.byte_offset == 0
    assert dl_layout(m.dl_tensor) == ((3, 4), (4, 1))  # exports always fill strides
    assert (m.dl_tensor.device.device_type, m.dl_tensor.device.device_id) == (1, 0)
    assert (m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes) == (2, 32, 1)


def test_dlpack_old_max_version_gives_legacy(src):
    assert capsule_name(tw.asarray(src).__dlpack__(max_version=(0, 8))) == "dltensor"


def test_dlpack_copy_true_gives_new_memory_flagged_copied(src):
    t = tw.asarray(src)
    cap = t.__dlpack__(max_version=(1, 0), copy=True)
    m = peek(cap)
    assert m.dl_tensor.data != ptr(src) and m.flags & IS_COPIED
    n = np.from_dlpack(tw.from_dlpack(cap))
    assert np.array_equal(n, src)
    n[0, 0] = -1
    assert src[0, 0] == 0
    legacy = t.__dlpack__(copy=True)
    assert peek(legacy).dl_tensor.data != ptr(src)
    x = torch.from_dlpack(t, copy=True)
    assert x.data_ptr() != ptr(src) and np.array_equal(x.numpy(), src)


def test_dlpack_copy_false_is_zero_copy(src):
    t = tw.asarray(src)
    cap = t.__dlpack__(max_version=(1, 0), copy=False)
    m = peek(cap)
    assert m.dl_tensor.data == ptr(src) and not m.flags & IS_COPIED


def test_dlpack_readonly_flag_and_legacy_refusal(src):
    t = tw.asarray(src).as_readonly()
    assert t.readonly
    cap = t.__dlpack__(max_version=(1, 0))
    assert peek(cap).flags & READ_ONLY
    with pytest.raises(BufferError) as ei:
        t.__dlpack__()
    assert "read-only" in str(ei.value)
    # with copy=True the consumer owns a fresh writable copy, so a legacy capsule is fine
    cap = t.__dlpack__(copy=True)
    assert capsule_name(cap) == "dltensor" and peek(cap).dl_tensor.data != ptr(src)
    n = np.from_dlpack(t)
    assert not n.flags.writeable and ptr(n) == ptr(src)


def test_readonly_refuses_writable_buffer(src):
    t = tw.asarray(src).as_readonly()
    assert memoryview(t).readonly
    with pytest.raises(TypeError):  # CPython turns the exporter's BufferError into a TypeError here
        io.BytesIO(b"x" * 48).readinto(t)  # asks for a writable buffer
    assert src[0, 0] == 0
    tb = pytest.importorskip("_testbuffer", reason="CPython's _testbuffer module is not built here")
    with pytest.raises(BufferError) as ei:
        tb.ndarray(t, getbuf=tb.PyBUF_FULL)  # PyBUF_FULL includes PyBUF_WRITABLE
    assert "read-only" in str(ei.value)
    assert tb.ndarray(t, getbuf=tb.PyBUF_FULL_RO).readonly
    assert not np.asarray(t).flags.writeable
    with pytest.raises(ValueError):
        np.asarray(t)[0, 0] = 1
    assert src[0, 0] == 0


def test_dlpack_dl_device(src):
    t = tw.asarray(src)
    assert t.__dlpack_device__() == (1, 0)
    cap = t.__dlpack__(max_version=(1, 0), dl_device=(1, 0))
    assert peek(cap).dl_tensor.data == ptr(src)
    cap = t.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)
    assert peek(cap).dl_tensor.data == ptr(src)
    if NO_CUDA_DRIVER:
        with pytest.raises(BufferError):
            t.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
    else:  # a GPU machine: a copy made there for the consumer
        assert peek(t.__dlpack__(max_version=(1, 0), dl_device=(2, 0))).dl_tensor.device.device_type == 2
    with pytest.raises(tw.CopyError):
        t.__dlpack__(max_version=(1, 0), dl_device=(2, 0), copy=False)


def test_dlpack_stream_rules_on_cpu(src):
    t = tw.asarray(src)
    assert capsule_name(t.__dlpack__(stream=None)) == "dltensor"
    assert capsule_name(t.__dlpack__(stream=-1)) == "dltensor"
    for bad in (0, 1, 2, 12345):
        with pytest.raises(ValueError) as ei:
            t.__dlpack__(stream=bad)
        assert "stream" in str(ei.value)
    with pytest.raises(TypeError):
        t.__dlpack__(stream="1")
    with pytest.raises(TypeError):
        t.__dlpack__(stream=True)
    with pytest.raises(ValueError) as ei:
        t.__dlpack__(stream=2**70)  # a precise error, not an opaque RuntimeError from a failed C++ cast
    assert "64 bits" in str(ei.value)


def test_dlpack_max_version_validation(src):
    t = tw.asarray(src)
    with pytest.raises(TypeError):
        t.__dlpack__(max_version=1)
    with pytest.raises(TypeError):
        t.__dlpack__(max_version=(1,))
    with pytest.raises(TypeError) as ei:
        t.__dlpack__(max_version=("1", 0))
    assert "max_version" in str(ei.value)
    cap = t.__dlpack__(max_version=(2**70, 0))  # a consumer from the far future gets our newest version
    assert capsule_name(cap) == "dltensor_versioned" and (peek(cap).major, peek(cap).minor) == (1, tw.DLPACK_VERSION[1])
    cap = t.__dlpack__(max_version=(1, -5))
    assert (peek(cap).major, peek(cap).minor) == (1, 0)


def test_dlpack_capsule_consumed_once(src):
    t = tw.asarray(src)
    cap = t.__dlpack__(max_version=(1, 0))
    u = tw.from_dlpack(cap)
    assert u.data_ptr == ptr(src)
    assert capsule_name(cap) == "used_dltensor_versioned"
    with pytest.raises(ValueError):
        tw.from_dlpack(cap)
    legacy = t.__dlpack__()
    x = torch.utils.dlpack.from_dlpack(legacy)
    assert x.data_ptr() == ptr(src)
    assert capsule_name(legacy) == "used_dltensor"


# ---- dtypes NumPy lacks ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "int4"])
def test_ml_dtypes_out_to_numpy_never_void(name):
    dt = np.dtype(getattr(ml_dtypes, name))
    a = np.arange(-4, 8).astype(dt).reshape(3, 4)
    t = tw.asarray(a)
    for out in (np.asarray(t), t.numpy(), tw.to_numpy(t), np.array(t, copy=False)):
        assert out.dtype == dt and out.dtype.type is not np.void  # an ml_dtypes type, not raw bytes
        assert ptr(out) == ptr(a) and same_bits(out, a)
    v = np.asarray(t[::-1, ::2])
    assert v.dtype == dt and same_bits(v, a[::-1, ::2])
    c = np.asarray(t, dtype=np.float32)
    assert np.array_equal(c, a.astype(np.float32))
    with pytest.raises(BufferError):
        memoryview(t)  # no PEP 3118 format exists for these types
    assert not hasattr(t, "__array_interface__")


_SUBBYTE = ["int4", "uint4", "int2", "uint2", "int1", "uint1", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"]


def _pack_little(codes: list[int], bits: int) -> bytes:
    """The reference packing, one bit at a time: element k's bit j is bit k*bits+j of the stream, little-endian."""
    out = bytearray((len(codes) * bits + 7) // 8)
    for k, c in enumerate(codes):
        for j in range(bits):
            if (c >> j) & 1:
                pos = k * bits + j
                out[pos // 8] |= 1 << (pos % 8)
    return bytes(out)


@pytest.mark.parametrize("name", _SUBBYTE)
def test_packed_sub_byte_tensors_unpack_bit_exactly_into_numpy_copies(name):
    # NumPy (ml_dtypes) stores one element per byte, its bits in the low bits of the byte: a packed tensor cannot be
    # viewed, so np.asarray / np.array / tw.to_numpy / tolist unpack it into a copy (copy=False refuses), for every
    # layout a view of it can have.
    bits = tw.zeros(1, name).dtype.bits
    mld = np.dtype(getattr(ml_dtypes, name))
    rng = np.random.default_rng(bits)
    for shape in [(37,), (5, 8), (3, 4, 8), (), (0, 3)]:
        n = int(np.prod(shape, dtype=np.int64))
        codes = rng.integers(0, 1 << bits, n).tolist()
        t = tw.asarray(_pack_little(codes, bits))._from_bytes(name, shape, False) if n else tw.zeros(shape, name)
        assert not t.subbyte_padded
        want = np.array(codes, np.uint8).reshape(shape)
        for out in (np.asarray(t), np.array(t), np.array(t, copy=True), tw.to_numpy(t), tw.to_numpy(t, copy=True)):
            assert out.dtype == mld and out.shape == tuple(shape)
            assert out.view(np.uint8).tolist() == want.tolist()
        # A copy asked for is writable; one made where a view was asked for is read-only (writes would be lost)
        assert np.array(t).flags.writeable and tw.to_numpy(t, copy=True).flags.writeable
        assert not np.asarray(t).flags.writeable and not tw.to_numpy(t).flags.writeable
        if "float" not in name:  # (float codes include NaNs, which compare unequal)
            assert t.tolist() == want.view(mld).tolist()
        with pytest.raises(ValueError, match=f"packed {name} .* copy=False"):
            np.asarray(t, copy=False)
        with pytest.raises(tw.CopyError, match=f"packed {name}"):
            tw.to_numpy(t, copy=False)
        with pytest.raises(BufferError, match="without unpacking"):
            t.numpy()
        if len(shape) >= 2 and n:
            views = {"transposed": (t.T, want.T), "reversed": (t[::-1], want[::-1]), "rows": (t[1:], want[1:])}
            if shape[-1] * bits % 16 == 0:  # every other byte-aligned column block
                k = 8 // bits if 8 % bits == 0 else 4
                views["column block"] = (t[..., k:], want[..., k:])
            for what, (v, w) in views.items():
                assert np.asarray(v).view(np.uint8).tolist() == w.tolist(), what


def test_jax_takes_tensors_through_jax_array_sub_byte_ones_through_numpy():
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = tw.asarray(a)
    # NumPy 2 refuses a .dtype that is not an np.dtype, and JAX asks NumPy for it unless the object says
    # __jax_array__: with it, jnp.asarray / jnp.array take a tensor in any layout.
    for src, want in ((t, a), (t[:, ::-1], a[:, ::-1]), (t.T, a.T), (t[::2, 1::2], a[::2, 1::2])):
        j = jnp.asarray(src)
        assert j.dtype == jnp.float32 and np.array_equal(np.asarray(j), want)
    assert jnp.array(t, dtype=jnp.int32).dtype == jnp.int32
    for name in ("int4", "uint4", "int2", "float4_e2m1fn"):
        mld = np.dtype(getattr(ml_dtypes, name))
        padded = np.arange(6).astype(mld).reshape(2, 3)
        codes = np.asarray(padded).view(np.uint8).reshape(-1).tolist()
        bits = tw.zeros(1, name).dtype.bits
        packed = tw.asarray(_pack_little([c & ((1 << bits) - 1) for c in codes], bits))._from_bytes(name, (2, 3), False)
        for src in (tw.asarray(padded), packed):
            j = jnp.asarray(src)
            assert j.dtype == mld and np.array_equal(np.asarray(j).astype(np.float32), padded.astype(np.float32))
        with pytest.raises(tw.CopyError, match=f"{name} tensor through DLPack"):
            tw.to_jax(packed, copy=False)


def test_bfloat16_to_torch():
    a = np.arange(6).astype(ml_dtypes.bfloat16)
    t = tw.asarray(a)
    x = torch.from_dlpack(t)
    assert x.dtype == torch.bfloat16 and x.data_ptr() == ptr(a)
    assert x.float().tolist() == a.astype(np.float32).tolist()


def test_float8_to_torch_follows_dlpack_versions():
    """float8 codes exist from DLPack 1.1; torch.from_dlpack(t) asks for at most 1.0, so that export is refused
    clearly (never handed out with a code the consumer does not claim to know). A 1.1 consumer gets it, and
    tw.to_torch hands PyTorch a 1.1 capsule, which it reads (zero-copy)."""
    a = np.arange(6).astype(ml_dtypes.float8_e4m3fn)
    t = tw.asarray(a)
    cap = t.__dlpack__(max_version=(1, 1))
    m = peek(cap)
    assert (m.major, m.minor) == (1, 1) and m.dl_tensor.data == ptr(a)
    with pytest.raises(BufferError) as ei:
        t.__dlpack__(max_version=(1, 0))
    assert "1.1" in str(ei.value)
    u = tw.from_dlpack(t.__dlpack__(max_version=(1, 1)))
    assert str(u.dtype) == "float8_e4m3fn" and u.data_ptr == ptr(a)
    import tensorwire.torch as twt
    for x in (tw.to_torch(t), tw.to_torch(a), twt.to_torch(t)):
        assert x.dtype == torch.float8_e4m3fn and x.data_ptr() == ptr(a)
        assert x.view(torch.uint8).tolist() == a.view(np.uint8).tolist()


def test_a_dtype_pytorch_cannot_take_is_named_by_to_torch():
    # (PyTorch's own words reached the caller alone: "Unsupported code 7", "Unsupported kInt bits 4")
    import tensorwire.torch as twt

    for name in ("int4", "float8_e3m4"):
        t = tw.zeros(4, name)
        for conv, who in ((tw.to_torch, "tensorwire.to_torch"), (twt.to_torch, "tensorwire.torch.to_torch")):
            with pytest.raises(BufferError, match=rf"{who}: PyTorch \S+ cannot take {name} tensors \(.+\); "
                                                  r"tw.to_numpy\(t\) gives it"):
                conv(t)
        assert tw.to_numpy(t).dtype == np.dtype(getattr(ml_dtypes, name))


def test_copy_false_forbids_a_copy_on_the_way_in_too():
    # to_numpy / to_torch / to_jax imported with copy=None, so a source that needed a copy to import at all came back
    # as a silent copy under copy=False: writes never reached the source.
    import pyarrow as pa
    import tensorwire.torch as twt
    be = np.arange(3, dtype=">f4")  # byte-swapped: the import converts
    for f in (tw.to_numpy, tw.to_torch, twt.to_torch):
        with pytest.raises(tw.CopyError):
            f(be, copy=False)
        with pytest.raises(tw.CopyError):
            f([1.0, 2.0], copy=False)
    with pytest.raises(tw.CopyError):
        tw.to_numpy(pa.chunked_array([pa.array([1.0]), pa.array([2.0])]), copy=False)
    with pytest.raises(tw.CopyError):
        tw.to_torch(torch.tensor([1j]).conj(), copy=False)
    for f in (tw.to_numpy, tw.to_torch, twt.to_torch):  # what may copy still does
        assert np.asarray(f(be)).tolist() == [0.0, 1.0, 2.0]
        assert np.asarray(f(be, copy=True)).tolist() == [0.0, 1.0, 2.0]
    if importlib.util.find_spec("jax") is not None:
        with pytest.raises(tw.CopyError):
            tw.to_jax(np.arange(3, dtype=">f4"), copy=False)
    assert str(inspect.signature(tw.to_jax)) == "(x, *, copy=None)"  # (no private parameter in help())


# ---- layouts consumers cannot take ------------------------------------------------------------------------------
def test_negative_strides_torch_gets_a_correct_copy(src):
    t = tw.asarray(src)[::-1, ::-1]
    x = torch.from_dlpack(t)
    assert np.array_equal(x.numpy(), src[::-1, ::-1])
    assert x.data_ptr() != t.data_ptr  # a copy: PyTorch cannot take negative strides
    x[0, 0] = -100
    assert src[2, 3] == 11  # the copy is independent
    cap = t.__dlpack__(max_version=(1, 0))
    m = peek(cap)
    assert m.flags & IS_COPIED and all(s >= 0 for s in dl_layout(m.dl_tensor)[1])


def test_negative_strides_copy_false_refused(src):
    t = tw.asarray(src)[:, ::-1]
    with pytest.raises(BufferError) as ei:
        t.__dlpack__(max_version=(1, 0), copy=False)
    assert isinstance(ei.value, tw.CopyError) and "negative" in str(ei.value)
    with pytest.raises(BufferError):
        t.__dlpack__(copy=False)
    # a size-1 dimension's stride is never used: not a reason to copy
    one = tw.asarray(src)[:1, :][::-1]
    cap = one.__dlpack__(copy=False)
    assert peek(cap).dl_tensor.data == one.data_ptr


def test_negative_strides_numpy_views_without_copy(src):
    t = tw.asarray(src)[::-1, ::-2]
    n = np.asarray(t)
    assert ptr(n) == t.data_ptr and n.strides == (-16, -8)
    assert np.array_equal(n, src[::-1, ::-2])
    n2 = np.from_dlpack(t)  # DLPack export copies (negative strides), still correct
    assert np.array_equal(n2, src[::-1, ::-2])


def test_broadcast_stride0_exported_as_is():
    a = np.arange(4, dtype=np.int32)
    t = tw.asarray(a).expand((3, 4))
    assert t.strides == (0, 1)
    x = torch.from_dlpack(t)
    assert tuple(x.stride()) == (0, 1) and x.data_ptr() == ptr(a)
    assert np.array_equal(x.numpy(), np.broadcast_to(a, (3, 4)))
    n = np.asarray(t)
    assert n.strides == (0, 4) and ptr(n) == ptr(a)


# ---- helpers ----------------------------------------------------------------------------------------------------
def test_to_numpy(src):
    t = tw.asarray(src)[:, ::-1]
    n = tw.to_numpy(t)
    assert ptr(n) == t.data_ptr and np.array_equal(n, src[:, ::-1])
    c = tw.to_numpy(t, copy=True)
    assert ptr(c) != t.data_ptr and np.array_equal(c, src[:, ::-1])
    assert ptr(tw.to_numpy(src)) == ptr(src)
    assert ptr(tw.to_numpy(torch.from_numpy(src))) == ptr(src)


def test_to_torch(src):
    x = tw.to_torch(src)
    assert isinstance(x, torch.Tensor) and x.data_ptr() == ptr(src)
    y = tw.to_torch(tw.asarray(src)[::-1])
    assert np.array_equal(y.numpy(), src[::-1]) and y.data_ptr() != ptr(src)
    with pytest.raises(tw.CopyError):
        tw.to_torch(tw.asarray(src)[::-1], copy=False)
    z = tw.to_torch(src, copy=True)
    assert z.data_ptr() != ptr(src) and np.array_equal(z.numpy(), src)
    assert tw.to_torch(src, copy=False).data_ptr() == ptr(src)


def test_to_jax(src):
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    a = aligned(np.arange(64, dtype=np.float32).reshape(8, 8))
    j = tw.to_jax(a)
    assert j.unsafe_buffer_pointer() == ptr(a) and np.array_equal(np.asarray(j), a)
    gappy = tw.asarray(a)[:, ::2]
    with pytest.raises(tw.CopyError):
        tw.to_jax(gappy, copy=False)
    jg = tw.to_jax(gappy)
    assert np.array_equal(np.asarray(jg), a[:, ::2])
    jn = tw.to_jax(tw.asarray(a)[::-1])
    assert np.array_equal(np.asarray(jn), a[::-1])
    jc = tw.to_jax(a, copy=True)
    assert jc.unsafe_buffer_pointer() != ptr(a) and np.array_equal(np.asarray(jc), a)
    assert isinstance(j, type(jnp.zeros(1)))


def test_to_jax_copy_false_refuses_what_xla_would_copy_for_its_address(monkeypatch):
    # XLA on the CPU copies a buffer that is not 64-byte aligned: copy=False silently gave JAX a copy (writes to the
    # source no longer seen), which most NumPy arrays (16-byte aligned) and every offset view would hit.
    pytest.importorskip("jax", reason="JAX is not installed")
    from tensorwire import _exporters

    a = aligned(np.arange(32, dtype=np.float32))
    view = a[1:17]
    with pytest.raises(tw.CopyError, match="4 bytes past a 64-byte boundary"):
        tw.to_jax(view, copy=False)
    j = tw.to_jax(view)  # a copy, as copy=None allows
    assert np.array_equal(np.asarray(j), view)
    assert tw.to_jax(a, copy=False).unsafe_buffer_pointer() == ptr(a)
    # a copy JAX makes by a rule tensorwire does not model is caught after the import
    monkeypatch.setattr(_exporters, "_XLA_CPU_ALIGN", 1)
    with pytest.raises(tw.CopyError, match="JAX copied this tensor"):
        tw.to_jax(view, copy=False)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # (JAX's own narrowing of 1e300)
@pytest.mark.parametrize("dtype,value", [("int64", 2**40 + 1), ("uint64", 2**64 - 1), ("float64", 1e300),
                                         ("complex128", 1 + 1e-10j)])
def test_to_jax_refuses_what_jax_would_narrow_and_jnp_asarray_narrows_as_jax_does(dtype, value):
    # With JAX's 64-bit types off (its default) a 64-bit array would arrive 32-bit, its values wrapped or rounded:
    # tw.to_jax says so instead. jnp.asarray(t) keeps JAX's own convention (what it does with a NumPy array).
    jax = pytest.importorskip("jax")
    a = np.array([value, 1], dtype)
    with jax.enable_x64(False):
        for copy in (None, False, True):
            with pytest.raises(TypeError, match=f"jax_enable_x64.*{dtype}"):
                tw.to_jax(a, copy=copy)
        j = jax.numpy.asarray(tw.asarray(a))
        assert j.dtype == jax.numpy.asarray(a).dtype and np.array_equal(np.asarray(j), np.asarray(jax.numpy.asarray(a)))
    with jax.enable_x64(True):
        j = tw.to_jax(a)
        assert str(j.dtype) == dtype and np.array_equal(np.asarray(j), a)


def test_roundtrip_torch_to_tw_to_numpy_keeps_identity():
    x = torch.arange(24.0).reshape(2, 3, 4).permute(2, 0, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        n = np.from_dlpack(tw.asarray(x))
    assert ptr(n) == x.data_ptr() and n.strides == tuple(4 * s for s in x.stride())
    assert np.array_equal(n, x.numpy())


@pytest.mark.parametrize("to", ["to_numpy", "to_torch", "to_jax"])
@pytest.mark.parametrize("copy", ["x", 5, 1.0])
def test_exporters_refuse_a_copy_that_is_not_a_bool(to, copy):
    # (copy="x" was taken as truthy: a copy the caller never asked for in words it would understand)
    with pytest.raises(TypeError, match=f"{to}: copy must be True, False or None, not {type(copy).__name__}"):
        getattr(tw, to)(np.zeros(2, np.float32), copy=copy)


def test_a_received_message_converts_part_by_part():
    # tw.to_numpy / to_torch of a list message stacked its parts into one array (mixed dtypes promoted: a uint64
    # beyond 2**53 came back rounded in float64); a dict message was refused as an unknown object.
    big = np.array([2**63 + 1], np.uint64)
    half = np.array([1.5], np.float32)
    name = f"parts-{os.getpid()}"
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        pub.send([big, half])
        msg = sub.recv(timeout=5)
        pub.send({"big": big, "half": half})
        named = sub.recv(timeout=5)
    got = tw.to_numpy(msg)
    assert isinstance(got, list) and got[0].dtype == np.uint64 and got[0].tolist() == big.tolist()
    assert got[1].tolist() == [1.5]
    # each part a view of its received tensor (zero-copy, read-only as received), unless a copy is asked for
    assert [g.ctypes.data for g in got] == [m.data_ptr for m in msg] and not got[0].flags.writeable
    copied = tw.to_numpy(msg, copy=True)
    assert all(c.ctypes.data != m.data_ptr for c, m in zip(copied, msg)) and copied[0].flags.writeable
    t = tw.to_torch(tuple(msg))
    # PyTorch has no read-only tensors: each received part is copied, or refused as a whole with copy=False
    assert all(p.data_ptr() != m.data_ptr for p, m in zip(t, msg))
    with pytest.raises(tw.CopyError, match="read-only"):
        tw.to_torch(msg, copy=False)
    assert isinstance(t, tuple) and t[0].dtype == torch.uint64 and t[1].dtype == torch.float32
    d = tw.to_numpy(named)
    assert list(d) == ["big", "half"] and d["big"].tolist() == big.tolist()
    assert tw.to_torch(named)["half"].tolist() == [1.5]
    assert tw.to_numpy([1, 2, 3]).tolist() == [1, 2, 3]  # array data is still one array
