"""Pickling: protocol 5 hands CPU data out of band (zero-copy), every protocol from 2 round-trips values, dtypes,
shapes, metadata and the read-only flag."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import tensorwire as tw
from _helpers import ptr, same_bits, needs_no_cuda_driver

ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")


def pb_address(pb: pickle.PickleBuffer) -> int:
    return ptr(np.frombuffer(pb.raw(), dtype=np.uint8)) if pb.raw().nbytes else 0


def oob_roundtrip(t):
    bufs = []
    data = pickle.dumps(t, protocol=5, buffer_callback=bufs.append)
    return pickle.loads(data, buffers=bufs), bufs, data


def test_protocol5_out_of_band_is_zero_copy():
    a = np.arange(1 << 16, dtype=np.float32).reshape(256, 256)
    t = tw.asarray(a)
    t.metadata["k"] = "v"
    r, bufs, data = oob_roundtrip(t)
    assert len(bufs) == 1 and isinstance(bufs[0], pickle.PickleBuffer)
    assert bufs[0].raw().nbytes == a.nbytes
    assert len(data) < 1024  # the payload is not in the pickle stream
    # the buffer is the tensor's own memory, and the rebuilt tensor views the buffer: no copy on either side
    assert pb_address(bufs[0]) == t.data_ptr == ptr(a)
    assert r.data_ptr == pb_address(bufs[0])
    assert r.shape == (256, 256) and str(r.dtype) == "float32" and not r.readonly
    assert r.metadata["k"] == "v"
    np.asarray(r)[3, 4] = -1.0  # same memory: a write through the copy-free rebuild shows in the source
    assert a[3, 4] == -1.0


def test_protocol5_out_of_band_of_a_strided_view_packs_once():
    a = np.arange(64, dtype=np.int64).reshape(8, 8)
    t = tw.asarray(a)[::2, ::-3]
    r, bufs, _ = oob_roundtrip(t)
    assert len(bufs) == 1
    assert r.data_ptr == pb_address(bufs[0]) != t.data_ptr
    assert r.is_contiguous() and same_bits(np.asarray(r), a[::2, ::-3])


def test_protocol5_readonly_out_of_band():
    a = np.arange(10, dtype=np.uint8)
    a.flags.writeable = False
    t = tw.asarray(a)
    r, bufs, _ = oob_roundtrip(t)
    assert bufs[0].raw().readonly
    assert r.readonly and r.data_ptr == ptr(a)
    assert same_bits(np.asarray(r), a)


def test_protocol5_out_of_band_buffer_of_another_format_or_shape():
    # A receiver hands the buffers back as whatever it made of the bytes (a float64 or 2-D view of them): NumPy's
    # unpickler takes any C-contiguous buffer; tensorwire's raised "_from_bytes needs a contiguous 1-D uint8 tensor".
    t = tw.asarray(np.arange(8, dtype=np.float32))
    bufs = []
    data = pickle.dumps(t, protocol=5, buffer_callback=bufs.append)
    raw = np.frombuffer(bytes(bufs[0].raw()), np.uint8)
    for back in (raw.view(np.float64), raw.reshape(4, 8), bytearray(raw.tobytes())):
        u = pickle.loads(data, buffers=[back])
        assert u.dtype == tw.float32 and u.tolist() == t.tolist()
    for strided in (raw.reshape(4, 8).T, np.frombuffer(raw.tobytes() * 2, np.uint8)[::2]):
        with pytest.raises(ValueError, match="not C-contiguous, so it is not the bytes that were pickled"):
            pickle.loads(data, buffers=[strided])
    empty = []
    nothing = pickle.dumps(tw.asarray(np.zeros((0, 3), np.float32)), protocol=5, buffer_callback=empty.append)
    assert pickle.loads(nothing, buffers=[np.zeros((0, 3), np.float32)]).shape == (0, 3)
    with pytest.raises(ValueError, match="pickled data holds 16 bytes but \\(8,\\) float32 needs 32"):
        pickle.loads(data, buffers=[raw[:16]])


def test_protocol5_without_callback_is_in_band():
    a = np.arange(1000, dtype=np.float64)
    t = tw.asarray(a)
    data = pickle.dumps(t, protocol=5)
    assert len(data) > a.nbytes
    r = pickle.loads(data)
    assert r.data_ptr != ptr(a) and not r.readonly
    assert same_bits(np.asarray(r), a)
    np.asarray(r)[0] = 5  # writable and independent
    assert a[0] == 0


DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64", "complex64", "complex128", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int4"]


def make(dtype: str, shape=(3, 4)) -> np.ndarray:
    dt = np.dtype(getattr(ml_dtypes, dtype)) if hasattr(ml_dtypes, dtype) and not hasattr(np, dtype) else np.dtype(dtype)
    n = int(np.prod(shape))
    if dt == np.bool_:
        return (np.arange(n) % 3 == 0).reshape(shape)
    return (np.arange(n) % 7 - 3).astype(dt).reshape(shape)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_protocol(protocol, dtype):
    a = make(dtype)
    t = tw.asarray(a)[:, ::-1]
    t.metadata["dtype"] = dtype
    t.metadata["tuple"] = (1, (2.5, None))
    r = pickle.loads(pickle.dumps(t, protocol=protocol))
    assert isinstance(r, tw.Tensor)
    assert str(r.dtype) == dtype and r.shape == t.shape and r.readonly is False
    assert same_bits(np.asarray(r), a[:, ::-1])
    assert r.metadata["dtype"] == dtype and r.metadata["tuple"] == (1, (2.5, None))


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_round_trip_readonly(protocol):
    t = tw.asarray(np.arange(6, dtype=np.int16)).as_readonly()
    r = pickle.loads(pickle.dumps(t, protocol=protocol))
    assert r.readonly is True
    assert np.asarray(r).tolist() == list(range(6))
    bufs = []
    r5 = pickle.loads(pickle.dumps(t, protocol=5, buffer_callback=bufs.append), buffers=bufs)
    assert r5.readonly is True


@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1,), (2, 1, 3)])
def test_round_trip_odd_shapes(protocol, shape):
    a = make("float32", shape)
    r = pickle.loads(pickle.dumps(tw.asarray(a), protocol=protocol))
    assert r.shape == shape and same_bits(np.asarray(r), a)
    bufs = []
    r5 = pickle.loads(pickle.dumps(tw.asarray(a), protocol=5, buffer_callback=bufs.append), buffers=bufs)
    assert r5.shape == shape and same_bits(np.asarray(r5), a)


def test_broadcast_tensor_pickles_its_values():
    t = tw.asarray(np.arange(3, dtype=np.float32)).expand(4, 3)
    r = pickle.loads(pickle.dumps(t, protocol=5))
    assert r.strides == (3, 1) and same_bits(np.asarray(r), np.broadcast_to(np.arange(3, dtype=np.float32), (4, 3)))


def test_shared_references_stay_shared():
    t = tw.asarray(np.arange(4.0))
    x, y = pickle.loads(pickle.dumps([t, t], protocol=5))
    assert x is y


def test_copy_and_deepcopy_give_independent_memory():
    a = np.arange(5, dtype=np.int32)
    t = tw.asarray(a)
    t.metadata["m"] = [1]
    for c in (copy.copy(t), copy.deepcopy(t)):
        assert c.data_ptr != t.data_ptr and same_bits(np.asarray(c), a)
        assert c.metadata["m"] == [1]
        np.asarray(c)[0] = 99
        assert a[0] == 0


def test_nan_payloads_survive():
    bits = np.array([0x7FC00001, 0xFFC12345, 0x7F800001, 0x80000000], dtype=np.uint32)
    a = bits.view(np.float32)
    for protocol in (2, 5):
        r = pickle.loads(pickle.dumps(tw.asarray(a), protocol=protocol))
        assert np.asarray(r).view(np.uint32).tolist() == bits.tolist()


@needs_no_cuda_driver
def test_device_tensor_refuses_to_pickle():
    class CAI:
        __cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "data": (0xDEAD0000, False), "version": 3}

    t = tw.asarray(CAI(), device="cuda:0")
    with pytest.raises(TypeError) as ei:
        pickle.dumps(t)
    assert "cuda:0" in str(ei.value)
