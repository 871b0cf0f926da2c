"""Interop core: DLPack 1.4 types and version capping, the one dtype converter, and the two wrong results that
DLPack alone cannot prevent (an immutable producer, PyTorch's lazy conjugation/negation bits)."""

from __future__ import annotations

import ctypes
import uuid

import ml_dtypes
import numpy as np
import pytest
import tensorwire as tw
from _helpers import jax_on_cpu, ptr
from test_policy_table import DLManagedTensorVersioned

torch = pytest.importorskip("torch")
jnp = pytest.importorskip("jax.numpy")


# ---- DLPack 1.4 -------------------------------------------------------------------------------------------------


def test_dlpack_version_is_1_4():
    assert tw.DLPACK_VERSION == (1, 4)


@pytest.mark.parametrize("name", ["bcomplex32", "complex32"])
def test_ml_dtypes_complex_types_round_trip_zero_copy(name):
    ml = getattr(ml_dtypes, name)
    a = (np.arange(6) - 2j * np.arange(6)).astype(ml).reshape(2, 3)[:, ::2]
    t = tw.asarray(a)
    assert t.dtype == getattr(tw, name) and t.data_ptr == ptr(a) and t.dtype.itemsize == 4
    back = np.asarray(t)
    assert back.dtype == np.dtype(ml) and back.tobytes() == a.tobytes() and ptr(back) == ptr(a)
    # and through DLPack itself, tensorwire to tensorwire
    u = tw.from_dlpack(t.__dlpack__(max_version=(1, 4)))
    assert u.dtype == t.dtype and u.data_ptr == t.data_ptr


def test_bcomplex32_is_refused_to_a_consumer_that_predates_it():
    t = tw.zeros(3, tw.bcomplex32)
    with pytest.raises(BufferError, match=r"bcomplex32 needs DLPack 1\.4 but the consumer understands at most 1\.3"):
        t.__dlpack__(max_version=(1, 3))
    cap = t.__dlpack__(max_version=(1, 4))
    m = DLManagedTensorVersioned.from_address(ctypes.pythonapi.PyCapsule_GetPointer(cap, b"dltensor_versioned"))
    assert (m.version.major, m.version.minor) == (1, 4)
    assert (m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes) == (18, 32, 1)  # kDLBcomplex


def test_float16_complex_crosses_to_and_from_pytorch():
    x = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex32)
    t = tw.asarray(x)
    assert t.dtype == tw.complex32 and t.data_ptr == x.data_ptr()
    y = torch.from_dlpack(t)
    assert y.dtype == torch.complex32 and torch.equal(y.to(torch.complex64), x.to(torch.complex64))
    assert np.asarray(t).dtype == np.dtype(ml_dtypes.complex32)


def test_newer_devices_are_descriptors():
    for name, code in (("tpu", 19), ("tpu_host", 20), ("ascend", 21)):
        d = tw.Device(f"{name}:1")
        assert (d.type, d.index, d.device_type, str(d)) == (name, 1, code, f"{name}:1")


# ---- one dtype converter ------------------------------------------------------------------------------------------

SAME_TYPE = [
    ("float32", "float32"), ("f4", "float32"), ("<f8", "float64"), (np.float32, "float32"),
    (np.dtype("int16"), "int16"), (ml_dtypes.bfloat16, "bfloat16"), (np.dtype(ml_dtypes.float8_e4m3fn), "float8_e4m3fn"),
    (torch.bfloat16, "bfloat16"), (torch.complex32, "complex32"), (torch.uint16, "uint16"), (torch.bool, "bool"),
    (tw.int8, "int8"), (bool, "bool"), (jnp.bfloat16, "bfloat16"), (ml_dtypes.bcomplex32, "bcomplex32"),
]


@pytest.mark.parametrize("dtype,name", SAME_TYPE, ids=[repr(d) for d, _ in SAME_TYPE])
def test_every_dtype_argument_takes_every_spelling(dtype, name):
    assert tw.empty((2, 2), dtype).dtype.name == name
    assert tw.zeros(3, dtype=dtype).dtype.name == name
    assert tw.DType(dtype).name == name
    assert tw.DType(name) == dtype
    with tw.Publisher(f"dtype-{uuid.uuid4().hex[:8]}") as pub:
        assert pub.loan((2,), dtype).dtype.name == name
        assert pub.loan({"x": ((2,), dtype)})["x"].dtype.name == name


@pytest.mark.parametrize("bad,exc,text", [
    (">f4", ValueError, "non-native byte order"), (object, ValueError, "no tensorwire type"),
    ("U5", ValueError, "no tensorwire type"), (3, TypeError, "dtype must be"), (None, TypeError, "dtype must be"),
    (torch.float4_e2m1fn_x2, ValueError, "torch.float4_e2m1fn_x2"), ("nonsense", ValueError, "nonsense"),
])
def test_bad_dtype_arguments_are_named(bad, exc, text):
    with pytest.raises(exc, match=text):
        tw.zeros(2, bad)
    assert not (tw.float32 == bad)


# ---- what DLPack cannot say ---------------------------------------------------------------------------------------


def test_jax_arrays_arrive_read_only():
    with jax_on_cpu():
        j = jnp.arange(4.0)
    t = tw.asarray(j)
    assert t.readonly
    view = np.asarray(t)
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0] = 7.0
    assert float(j[0]) == 0.0
    assert not tw.asarray(j, copy=True).readonly  # a copy is ours to write


@pytest.mark.parametrize("make,expect", [
    (lambda x: x.conj().imag, [-2.0, 1.0]),
    (lambda x: x.conj(), [1 - 2j, 3 + 1j]),
    (lambda x: torch._neg_view(x.real), [-1.0, -3.0]),
    (lambda x: torch._neg_view(x.conj()), [-1 + 2j, -3 - 1j]),
])
@pytest.mark.parametrize("entry", ["asarray", "from_dlpack"])
def test_pytorch_lazy_bits_are_resolved_not_lost(make, expect, entry):
    x = torch.tensor([1 + 2j, 3 - 1j])
    v = make(x)
    t = getattr(tw, entry)(v)
    assert np.asarray(t).tolist() == expect == v.resolve_conj().resolve_neg().tolist()
    with pytest.raises(tw.CopyError, match="lazy .*bit"):
        getattr(tw, entry)(v, copy=False)


def test_a_publisher_sends_resolved_values():
    x = torch.tensor([1 + 2j, 3 - 1j])
    name = f"lazy-{uuid.uuid4().hex[:8]}"
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        pub.send(x.conj().imag)
        got = sub.recv(timeout=5.0)
        assert np.asarray(got).tolist() == [-2.0, 1.0]
        with jax_on_cpu():
            j = jnp.arange(3.0)
        pub.send(j)
        assert np.asarray(sub.recv(timeout=5.0)).tolist() == [0.0, 1.0, 2.0]


def test_plain_torch_tensors_stay_zero_copy_and_writable():
    x = torch.arange(6.0).reshape(2, 3).t()
    t = tw.asarray(x)
    assert t.data_ptr == x.data_ptr() and not t.readonly and t.strides == (1, 3)
    np.asarray(t)[0, 0] = 42.0
    assert x[0, 0] == 42.0


def test_byte_swapped_bcomplex32_swaps_each_half():
    a = (np.arange(4) - 1j * np.arange(4)).astype(ml_dtypes.bcomplex32)
    # ml_dtypes 0.6's own byteswap() of bcomplex32 swaps only the real half: build the big-endian bytes by hand
    be = np.frombuffer(a.view(np.uint16).byteswap().tobytes(), dtype=a.dtype.newbyteorder(">"))
    assert be.__array_interface__["typestr"] == ">W4"
    t = tw.asarray(be)
    assert np.asarray(t).tobytes() == a.tobytes()
    with pytest.raises(tw.CopyError, match="byte order"):
        tw.asarray(be, copy=False)


def test_a_capsule_flagged_is_copied_is_not_copied_again():
    src = tw.asarray(np.arange(6.0))
    cap = src.__dlpack__(max_version=(1, 4), copy=True)  # IS_COPIED: made for us alone
    m = DLManagedTensorVersioned.from_address(ctypes.pythonapi.PyCapsule_GetPointer(cap, b"dltensor_versioned"))
    assert m.flags & 2
    data = m.dl_tensor.data
    t = tw.from_dlpack(cap, copy=True)
    assert t.data_ptr == data and t.data_ptr != src.data_ptr


def test_a_jax_array_on_another_host_device_imports_as_the_cpu():
    # JAX with several host devices says (kDLCPU, 2) for an array on its third: imported as cpu:2, a device
    # tensorwire itself says does not exist (its pickle would not load; to("cpu", copy=False) raised CopyError).
    pytest.importorskip("jax", reason="JAX is not installed")
    import os
    import subprocess
    import sys

    code = """
import jax, jax.numpy as jnp, pickle, tensorwire as tw
assert len(jax.devices("cpu")) == 4
e = jax.device_put(jnp.arange(4.0), jax.devices("cpu")[2])
t = tw.asarray(e)
assert t.device == tw.Device("cpu"), t.device
assert t.data_ptr == e.unsafe_buffer_pointer()
assert pickle.loads(pickle.dumps(t.device)) == t.device
assert t.to("cpu", copy=False).tolist() == [0.0, 1.0, 2.0, 3.0]
print("ok")
"""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
