"""Hand-built DLPack capsules (ctypes structs with a counting deleter): tensorwire takes ownership the moment it
imports a capsule, calls the producer's deleter exactly once - when the last view dies on success, before the
exception leaves on failure - and validates every field without dereferencing `data`."""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest

import tensorwire as tw
from _helpers import DLDataType, DLDevice, DLTensor, ptr

pytestmark = pytest.mark.usefixtures("fast_gc")


class Versioned(ctypes.Structure):
    pass


class Legacy(ctypes.Structure):
    pass


VDELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(Versioned))
LDELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(Legacy))
Versioned._fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                      ("deleter", VDELETER), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]
Legacy._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", LDELETER)]

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]

CALLS: list[int] = []


@VDELETER
def _vdeleter(p):
    CALLS.append(ctypes.addressof(p.contents))


@LDELETER
def _ldeleter(p):
    CALLS.append(ctypes.addressof(p.contents))


class Producer:
    """Owns a NumPy array and the ctypes structs describing it; makes capsules without destructors (so only the
    consumer can call the deleter)."""

    def __init__(self, a: np.ndarray):
        self.a = a
        self.keep: list = []

    def capsule(self, *, legacy=False, shape=None, strides=None, code=None, bits=None, lanes=1, ndim=None,
                major=1, minor=3, flags=0, byte_offset=0, data=None, device=(1, 0)):
        a = self.a
        shape = a.shape if shape is None else shape
        sh = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        st = None if strides is None else (ctypes.c_int64 * max(1, len(strides)))(*strides)
        m = Legacy() if legacy else Versioned()
        if not legacy:
            m.major, m.minor, m.flags = major, minor, flags
        m.deleter = _ldeleter if legacy else _vdeleter
        dl = m.dl_tensor
        dl.data = ptr(a) if data is None else data
        dl.device = DLDevice(*device)
        dl.ndim = len(shape) if ndim is None else ndim
        kind = {"f": 2, "i": 0, "u": 1, "b": 6, "c": 5}[a.dtype.kind]
        dl.dtype = DLDataType(kind if code is None else code, a.itemsize * 8 if bits is None else bits, lanes)
        dl.shape = ctypes.cast(sh, ctypes.POINTER(ctypes.c_int64))
        dl.strides = None if st is None else ctypes.cast(st, ctypes.POINTER(ctypes.c_int64))
        dl.byte_offset = byte_offset
        self.keep.append((m, sh, st))
        name = b"dltensor" if legacy else b"dltensor_versioned"
        return _new_capsule(ctypes.addressof(m), name, None), ctypes.addressof(m)


@pytest.fixture
def producer():
    CALLS.clear()
    p = Producer(np.arange(12, dtype=np.float32))
    yield p
    gc.collect()


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize(
    "kw, shape, strides",
    [
        ({}, (12,), (1,)),
        ({"strides": (1,)}, (12,), (1,)),
        ({"shape": (3, 4)}, (3, 4), (4, 1)),  # NULL strides: C order (legacy and pre-1.2 producers)
        ({"shape": (4, 3), "strides": (1, 4)}, (4, 3), (1, 4)),
        ({"shape": (2, 2), "strides": (6, 2), "byte_offset": 4}, (2, 2), (6, 2)),
        ({"shape": (0, 5), "data": 0}, (0, 5), (5, 1)),
        ({"shape": (), "ndim": 0}, (), ()),
    ],
)
def test_valid_capsules_import_and_deleter_runs_once_at_the_last_view(producer, legacy, kw, shape, strides):
    cap, addr = producer.capsule(legacy=legacy, **kw)
    t = tw.from_dlpack(cap)
    assert t.shape == shape and t.strides == strides
    assert _capsule_name(cap).startswith(b"used_")
    if "data" not in kw:
        assert t.data_ptr == ptr(producer.a) + kw.get("byte_offset", 0)
        assert np.array_equal(np.asarray(t).reshape(-1)[:1], producer.a[kw.get("byte_offset", 0) // 4:][:1])
    v = t[...]
    del t
    gc.collect()
    assert CALLS == []  # a view still holds the producer's memory
    del v
    gc.collect()
    assert CALLS == [addr]
    del cap
    gc.collect()
    assert CALLS == [addr]  # the consumed capsule never calls it again


BAD = [
    ({"shape": (-1,)}, ValueError, "shape"),
    ({"code": 99}, BufferError, "code"),
    ({"bits": 7}, BufferError, ""),
    ({"lanes": 0}, (BufferError, ValueError), "lanes"),
    ({"ndim": -1}, ValueError, "ndim"),
    ({"ndim": 1000}, ValueError, "ndim"),
    ({"shape": (2**62, 2**62)}, ValueError, ""),
    ({"shape": (3,), "strides": (2**62,)}, ValueError, ""),
    ({"data": 0}, ValueError, "NULL"),
    ({"byte_offset": 2**63 + 5}, ValueError, "byte_offset"),
    ({"major": 2}, BufferError, "version"),
    ({"major": 0}, BufferError, "version"),
    ({"device": (999, 0)}, (BufferError, ValueError), "device"),
]


@pytest.mark.parametrize("kw, exc, word", BAD, ids=[str(b[0]) for b in BAD])
def test_malformed_capsules_refused_and_deleter_called_before_the_error(producer, kw, exc, word):
    cap, addr = producer.capsule(**kw)
    with pytest.raises(exc) as ei:
        tw.from_dlpack(cap)
    assert word.lower() in str(ei.value).lower()
    assert CALLS == [addr]  # ownership passed to tensorwire, which released it exactly once
    gc.collect()
    assert CALLS == [addr]


def test_malformed_legacy_capsule_also_released(producer):
    cap, addr = producer.capsule(legacy=True, shape=(-3,))
    with pytest.raises(ValueError):
        tw.asarray(cap)
    assert CALLS == [addr]


def test_flags(producer):
    cap, addr = producer.capsule(flags=1)  # READ_ONLY
    t = tw.from_dlpack(cap)
    assert t.readonly and not np.asarray(t).flags.writeable
    with pytest.raises(BufferError):
        t.__dlpack__()  # and it stays read-only on re-export
    del t
    gc.collect()
    assert CALLS == [addr]


def test_subbyte_padded_flag(producer):
    p = Producer(np.zeros(8, dtype=np.uint8))
    cap, _ = p.capsule(code=0, bits=4, flags=4)  # int4, one element per byte
    t = tw.from_dlpack(cap)
    assert str(t.dtype) == "int4" and t.subbyte_padded and t.shape == (8,)
    cap2, _ = p.capsule(code=0, bits=4, shape=(16,))  # packed: two elements per byte
    u = tw.from_dlpack(cap2)
    assert str(u.dtype) == "int4" and not u.subbyte_padded and u.nbytes == 8
    del t, u
    gc.collect()


def test_future_minor_version_accepted(producer):
    cap, addr = producer.capsule(minor=99)
    assert tw.from_dlpack(cap).shape == (12,)
    gc.collect()
    assert CALLS == [addr]


def test_consumed_and_foreign_capsules(producer):
    cap, _ = producer.capsule()
    tw.asarray(cap)
    with pytest.raises(ValueError) as ei:
        tw.asarray(cap)
    assert "already consumed" in str(ei.value)
    other = _new_capsule(ptr(producer.a), b"not_dltensor", None)
    with pytest.raises(TypeError) as ei:
        tw.from_dlpack(other)
    assert "not_dltensor" in str(ei.value)


def test_negative_strides_through_a_capsule_never_dereferenced(producer):
    # element 0 is the last float; strides walk backwards through the array
    cap, _ = producer.capsule(shape=(12,), strides=(-1,), data=ptr(producer.a) + 44)
    t = tw.from_dlpack(cap)
    assert t.strides == (-1,) and np.asarray(t).tolist() == producer.a[::-1].tolist()


def test_huge_stride_on_a_size_one_dimension(producer):
    """A stride that is never stepped through may be anything a producer likes, even one whose byte value does
    not fit in 64 bits; every export of such a tensor must still work (no overflow, no crash)."""
    cap, _ = producer.capsule(shape=(1, 3), strides=(2**62, 1))
    t = tw.from_dlpack(cap)
    assert t.shape == (1, 3) and t.strides[1] == 1
    expected = producer.a[:3].reshape(1, 3)
    assert np.array_equal(np.asarray(t), expected)
    assert np.array_equal(np.asarray(memoryview(t)), expected)
    assert np.array_equal(np.asarray(t.contiguous()), expected)
    assert np.array_equal(np.asarray(t.copy("F")), expected)
    assert np.array_equal(np.from_dlpack(t), expected)
    assert t.byte_strides[1] == 4
    del t


@pytest.mark.parametrize("device", [(4, 0), (7, 0), (9, 0), (12, 0)])  # opencl, vulkan, vpi, ext_dev
def test_to_torch_refuses_a_device_pytorch_would_abort_on(producer, device):
    # PyTorch 2.13 aborts the process (INTERNAL ASSERT, then SIGBUS) when from_dlpack gets an OpenCL tensor: the
    # exporters hand it cpu and cuda tensors only, and say so.
    torch = pytest.importorskip("torch")
    import tensorwire.torch as twt

    cap, _ = producer.capsule(device=device)
    t = tw.from_dlpack(cap)
    assert (t.device.device_type, t.device.index) == device
    for to_torch in (tw.to_torch, twt.to_torch):
        with pytest.raises(BufferError, match="cannot go to PyTorch"):
            to_torch(t)
        with pytest.raises(BufferError, match="cannot go to PyTorch"):
            to_torch(t, copy=True)
    assert isinstance(tw.to_torch(np.zeros(2)), torch.Tensor)  # (and the usual devices still go)
