"""The DLPack C exchange API both ways: tw.Tensor's own table (called here through ctypes, as a C consumer would),
and tw.asarray / tw.from_dlpack using a producer's table (PyTorch's) with a correct fallback to __dlpack__."""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import pytest
import tensorwire as tw
from _helpers import DLTensor, ptr
from test_policy_table import DLManagedTensorVersioned, DLPackVersion

torch = pytest.importorskip("torch")

MTV_P = ctypes.POINTER(DLManagedTensorVersioned)
SET_ERROR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)


class Header(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("prev_api", ctypes.c_void_p)]


class ExchangeAPI(ctypes.Structure):
    _fields_ = [
        ("header", Header),
        ("allocator", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(DLTensor), ctypes.POINTER(MTV_P), ctypes.c_void_p,
                                       SET_ERROR)),
        ("from_py", ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(MTV_P))),
        ("to_py", ctypes.PYFUNCTYPE(ctypes.c_int, MTV_P, ctypes.POINTER(ctypes.py_object))),
        ("dltensor_from_py", ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))),
        ("current_work_stream", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32,
                                                 ctypes.POINTER(ctypes.c_void_p))),
    ]


ctypes.pythonapi.PyCapsule_GetName.restype = ctypes.c_char_p
ctypes.pythonapi.PyCapsule_GetName.argtypes = [ctypes.py_object]
ctypes.pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
ctypes.pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
ctypes.pythonapi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
ctypes.pythonapi.Py_DecRef.argtypes = [ctypes.py_object]


def api_of(cls) -> ExchangeAPI:
    cap = cls.__dlpack_c_exchange_api__
    assert ctypes.pythonapi.PyCapsule_GetName(cap) == b"dlpack_exchange_api"
    return ExchangeAPI.from_address(ctypes.pythonapi.PyCapsule_GetPointer(cap, b"dlpack_exchange_api"))


API = api_of(tw.Tensor)


def test_tw_tensor_advertises_a_1_4_table():
    assert (API.header.version.major, API.header.version.minor) == tw.DLPACK_VERSION == (1, 4)
    assert API.header.prev_api is None
    for name in ("allocator", "from_py", "to_py", "dltensor_from_py", "current_work_stream"):
        assert getattr(API, name), name


def test_from_py_is_zero_copy_and_holds_the_memory_until_the_deleter_runs():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = tw.asarray(a)
    base = sys.getrefcount(a)
    out = MTV_P()
    assert API.from_py(t, ctypes.byref(out)) == 0
    m = out.contents
    assert m.dl_tensor.data == ptr(a) and m.flags == 0 and (m.version.major, m.version.minor) == (1, 4)
    del t
    assert sys.getrefcount(a) == base  # the tw.Tensor held it; now the struct does through the same owner
    assert np.frombuffer((ctypes.c_float * 12).from_address(m.dl_tensor.data), np.float32)[5] == 5.0
    m.deleter(out)  # exactly once: the owner goes, and with it the last reference to the NumPy array's buffer


def test_from_py_marks_read_only_and_copies_negative_strides():
    a = np.arange(12.0).reshape(3, 4)
    a.flags.writeable = False
    out = MTV_P()
    assert API.from_py(tw.asarray(a), ctypes.byref(out)) == 0
    assert out.contents.flags & 1  # READ_ONLY
    out.contents.deleter(out)
    b = np.arange(12.0)[::-1]
    assert API.from_py(tw.asarray(b), ctypes.byref(out)) == 0
    m = out.contents
    assert m.flags & 2 and m.dl_tensor.strides[0] == 1 and m.dl_tensor.data != ptr(b)  # IS_COPIED
    assert (ctypes.c_double * 12).from_address(m.dl_tensor.data)[0] == 11.0
    m.deleter(out)


def test_from_py_refuses_other_objects_with_a_python_error():
    out = MTV_P()
    with pytest.raises(TypeError, match="not a tensorwire.Tensor"):
        API.from_py(np.zeros(3), ctypes.byref(out))


def test_to_py_steals_the_struct_and_releases_it_once():
    a = np.arange(6.0)
    base = sys.getrefcount(a)
    cap = a.__dlpack__(max_version=(1, 0))
    p = ctypes.pythonapi.PyCapsule_GetPointer(cap, b"dltensor_versioned")
    assert ctypes.pythonapi.PyCapsule_SetName(cap, b"used_dltensor_versioned") == 0  # ownership leaves the capsule
    del cap
    obj = ctypes.py_object()
    assert API.to_py(ctypes.cast(p, MTV_P), ctypes.byref(obj)) == 0
    t = obj.value
    ctypes.pythonapi.Py_DecRef(t)  # the new reference to_py handed over (ctypes' py_object does not own it)
    del obj
    assert isinstance(t, tw.Tensor) and t.data_ptr == ptr(a) and t.shape == (6,)
    assert sys.getrefcount(a) == base + 1
    del t
    assert sys.getrefcount(a) == base  # NumPy's deleter ran (once: a second run would over-release the array)


def test_dltensor_from_py_is_a_borrowed_view():
    a = np.arange(12, dtype=np.int16).reshape(3, 4)[:, 1:]
    t = tw.asarray(a)
    dl = DLTensor()
    assert API.dltensor_from_py(t, ctypes.byref(dl)) == 0
    assert dl.data == ptr(a) and dl.ndim == 2 and (dl.shape[0], dl.shape[1]) == (3, 3)
    assert (dl.strides[0], dl.strides[1]) == (4, 1) and (dl.dtype.code, dl.dtype.bits) == (0, 16)


def test_dltensor_from_py_refuses_read_only():
    a = np.zeros(4)
    a.flags.writeable = False
    dl = DLTensor()
    with pytest.raises(BufferError, match="read-only"):
        API.dltensor_from_py(tw.asarray(a), ctypes.byref(dl))
    with pytest.raises(tw.CopyError, match="negative"):
        API.dltensor_from_py(tw.asarray(np.zeros(4)[::-1]), ctypes.byref(dl))


def test_allocator_makes_a_host_tensor_and_reports_errors_through_set_error():
    shape = (ctypes.c_int64 * 2)(2, 3)
    proto = DLTensor()
    proto.ndim, proto.shape = 2, shape
    proto.device.device_type, proto.dtype.code, proto.dtype.bits, proto.dtype.lanes = 1, 2, 32, 1
    out = MTV_P()
    errors = []
    cb = SET_ERROR(lambda ctx, kind, msg: errors.append((kind, msg)))
    assert API.allocator(ctypes.byref(proto), ctypes.byref(out), None, cb) == 0 and not errors
    m = out.contents
    assert m.dl_tensor.ndim == 2 and (m.dl_tensor.strides[0], m.dl_tensor.strides[1]) == (3, 1)
    m.deleter(out)
    proto.dtype.code = 99
    assert API.allocator(ctypes.byref(proto), ctypes.byref(out), None, cb) == -1
    assert errors and b"99" in errors[0][1]
    stream = ctypes.c_void_p(1)
    assert API.current_work_stream(1, 0, ctypes.byref(stream)) == 0 and stream.value is None


# ---- tensorwire as the consumer of PyTorch's table ----------------------------------------------------------


class NoDunderDLPack(torch.Tensor):
    """A subclass whose __dlpack__ fails: only the exchange API (inherited from torch.Tensor) can import it."""

    def __dlpack__(self, *args, **kwargs):
        raise AssertionError("__dlpack__ was called although the exchange API could serve")


class NoExchange(torch.Tensor):
    __dlpack_c_exchange_api__ = None  # opts out: tensorwire must fall back to __dlpack__


def test_asarray_takes_the_exchange_path_for_torch_tensors():
    x = torch.arange(12.0).reshape(3, 4)
    for spy in (x.as_subclass(NoDunderDLPack),):
        t = tw.asarray(spy)
        assert t.data_ptr == x.data_ptr() and t.shape == (3, 4) and not t.readonly
        u = tw.from_dlpack(spy)
        assert u.data_ptr == x.data_ptr()


def test_asarray_falls_back_to_dunder_dlpack_without_a_table():
    x = torch.arange(6.0).as_subclass(NoExchange)
    t = tw.asarray(x)
    assert t.data_ptr == x.data_ptr() and np.asarray(t).tolist() == list(range(6))


def test_exchange_import_keeps_the_torch_memory_alive():
    x = torch.arange(1 << 16, dtype=torch.float64)
    t = tw.asarray(x)
    del x
    import gc

    gc.collect()
    assert np.asarray(t)[-1] == (1 << 16) - 1


@pytest.mark.parametrize("route", ["asarray", "asarray-device", "asarray-never", "from_dlpack", "dunder"])
def test_a_tensor_that_requires_grad_arrives_read_only_and_zero_copy(route):
    # torch's own __dlpack__ and numpy() refuse such a tensor; its exchange API once handed out a writable view, and
    # a write through it changed what autograd saved without bumping the version counter (wrong gradients).
    p = torch.nn.Parameter(torch.arange(6.0))
    x = p.as_subclass(NoExchange) if route == "dunder" else p
    version = p._version
    t = {"asarray": lambda: tw.asarray(x), "asarray-device": lambda: tw.asarray(x, device="cpu"),
         "asarray-never": lambda: tw.asarray(x, copy=False), "from_dlpack": lambda: tw.from_dlpack(x),
         "dunder": lambda: tw.asarray(x)}[route]()
    assert t.readonly and t.data_ptr == p.data_ptr()
    assert np.asarray(t).tolist() == list(range(6))
    with pytest.raises(ValueError, match="read-only"):
        np.asarray(t)[0] = 5.0
    with torch.no_grad():  # the optimizer's in-place step: the view sees it (same memory)
        p.add_(1.0)
    assert np.asarray(t).tolist() == [float(i + 1) for i in range(6)]
    assert p._version == version + 1 and p.requires_grad


def test_an_activation_that_requires_grad_is_read_only_and_detach_is_the_writable_view():
    w = torch.ones(4, requires_grad=True)
    y = w * 3.0
    t = tw.asarray(y)
    assert t.readonly and t.data_ptr == y.data_ptr() and np.asarray(t).tolist() == [3.0] * 4
    d = tw.asarray(y.detach())
    assert not d.readonly and d.data_ptr == y.data_ptr()
    c = tw.asarray(w, copy=True)  # a copy is the caller's own: writable
    assert not c.readonly and c.data_ptr != w.data_ptr()
    y.sum().backward()  # autograd is untouched by the imports
    assert w.grad.tolist() == [3.0] * 4


def test_a_tensor_that_requires_grad_can_be_sent():
    p = torch.nn.Parameter(torch.arange(4.0))
    name = f"tw-test-grad-{id(p)}"
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        pub.send({"w": p})
        got = sub.recv(timeout=5.0)
    assert np.asarray(got["w"]).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_device_moves_and_stream_requests_go_through_dunder_dlpack():
    x = torch.arange(4.0).as_subclass(NoDunderDLPack)
    with pytest.raises(BufferError, match="__dlpack__ was called"):
        tw.asarray(x, device="cpu", copy=None, stream=0x7F0000001000)
    with pytest.raises(BufferError, match="__dlpack__ was called"):
        tw.asarray(x, device="cuda:0")  # a move: the producer makes it (dl_device=)
    # A device the tensor is already on asks nothing of the producer: the exchange API serves it (it once went
    # through torch's Python-level __dlpack__, 9.7 us against 1.2).
    for t in (tw.asarray(x, device="cpu"), tw.from_dlpack(x, device="cpu"), tw.asarray(x, device="cpu", copy=True)):
        assert str(t.device) == "cpu" and np.asarray(t).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert tw.asarray(x, device="cpu").data_ptr == x.data_ptr()
    assert tw.asarray(x, device="cpu", copy=True).data_ptr != x.data_ptr()


def test_allocator_refuses_devices_other_than_the_cpu():
    shape = (ctypes.c_int64 * 1)(4)
    proto = DLTensor()
    proto.ndim, proto.shape = 1, shape
    proto.dtype.code, proto.dtype.bits, proto.dtype.lanes = 2, 32, 1
    errors = []
    cb = SET_ERROR(lambda ctx, kind, msg: errors.append((kind, msg.decode())))
    out = MTV_P()
    proto.device.device_type = 1  # the control: the same request on the CPU succeeds, with no error reported
    assert API.allocator(ctypes.byref(proto), ctypes.byref(out), None, cb) == 0 and errors == []
    m = out.contents
    assert m.dl_tensor.device.device_type == 1 and m.dl_tensor.data and m.dl_tensor.shape[0] == 4
    (ctypes.c_float * 4).from_address(m.dl_tensor.data)[3] = 1.5  # host memory: writable from here
    m.deleter(out)
    for dev, name in ((3, "cuda_host:0"), (13, "cuda_managed:0"), (2, "cuda:0")):  # never mislabelled host memory
        proto.device.device_type = dev
        assert API.allocator(ctypes.byref(proto), ctypes.byref(out), None, cb) == -1
        kind, msg = errors.pop()
        assert kind == b"BufferError", (kind, msg)
        assert msg.startswith(f"tensorwire exchange API: cannot allocate on {name} ("), msg
    assert errors == []


@pytest.mark.parametrize("make", [lambda: torch.eye(2).to_sparse(), lambda: torch.empty(2, device="meta")],
                         ids=["sparse", "meta"])
def test_a_refusal_from_pytorchs_cpp_side_is_one_line_without_its_backtrace(make):
    # PyTorch's C++ errors end in c10's backtrace ("Exception raised from ... frame #0: ..."), which made the
    # exchange API's line of the refusal some 2 000 characters of addresses.
    with pytest.raises(BufferError) as e:
        tw.asarray(make())
    text = str(e.value)
    assert "Exception raised from" not in text and "frame #" not in text, text
    line = next(x for x in text.splitlines() if "DLPack C exchange API" in x)
    assert len(line) < 200 and "RuntimeError: " in line, line
