"""One contract over every way a tensor enters tensorwire from Python, with one shared destruction counter:
DLPack versioned and legacy capsules, the C exchange API (PyTorch), __array_interface__, the buffer protocol,
Arrow, and publish/subscribe.

(1) values, dtype and shape arrive exactly; (2) a zero-copy path shares the producer's memory and keeps it alive
after the producer's own object is gone; (3) the producer's memory is released exactly once, when the last view
dies; (4) read-only stays read-only."""

from __future__ import annotations

import gc
import uuid
import weakref

import numpy as np
import pytest
import tensorwire as tw
from _helpers import ptr

torch = pytest.importorskip("torch")


class Counter:
    def __init__(self):
        self.released = 0

    def watch(self, obj):
        weakref.finalize(obj, self._hit)

    def _hit(self):
        self.released += 1


class ArrayInterfaceOnly:
    def __init__(self, a):
        self.__array_interface__ = a.__array_interface__
        self._keep = a


def _pubsub(x):
    name = f"contract-{uuid.uuid4().hex[:8]}"
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        pub.send(x)
        return sub.recv(timeout=5.0)


# name -> (import function, zero-copy?, keeps read-only?)
PATHS = {
    "dlpack-versioned": (lambda x: tw.from_dlpack(x.__dlpack__(max_version=(1, 4))), True, True),
    "dlpack-legacy": (lambda x: tw.from_dlpack(x.__dlpack__()), True, False),
    "exchange-api": (lambda x: tw.asarray(torch.from_numpy(x) if x.flags.writeable else torch.from_numpy(x.copy())), True, False),
    "array-interface": (lambda x: tw.asarray(ArrayInterfaceOnly(x)), True, True),
    "buffer-protocol": (lambda x: tw.asarray(memoryview(x)), True, True),
    "asarray": (lambda x: tw.asarray(x), True, True),
    "arrow": (lambda x: tw.from_arrow(tw.to_arrow(tw.asarray(x))), False, True),
    "pubsub": (_pubsub, False, True),
}


def source(readonly=False):
    base = np.empty((4, 12), dtype=np.float32)  # owns its memory: the views' .base
    base[...] = (np.arange(48, dtype=np.float32) * 0.5 - 3.0).reshape(4, 12)
    view = base[:, 1::2]
    assert view.base is base
    if readonly:
        view.flags.writeable = False
    return base, view


@pytest.mark.parametrize("path", PATHS)
def test_values_shape_and_dtype_arrive_exactly(path):
    fn, zero_copy, _ = PATHS[path]
    _, x = source()
    if path in ("dlpack-legacy", "exchange-api", "buffer-protocol"):
        x = np.ascontiguousarray(x) if path == "buffer-protocol" else x
    t = fn(x)
    assert t.dtype == tw.float32 and t.shape == x.shape
    assert np.asarray(t).tobytes() == x.tobytes()
    if zero_copy:
        assert t.data_ptr == ptr(x)  # aliasing: the producer's memory itself


@pytest.mark.parametrize("path", [p for p in PATHS if PATHS[p][1] and p != "exchange-api"])
def test_memory_is_released_exactly_once_when_the_last_view_dies(path):
    fn = PATHS[path][0]
    counter = Counter()
    base, x = source()
    if path == "buffer-protocol":
        x = base[:, :6]  # memoryview of a non-contiguous view works too, but keep it simple for the C-order check
    counter.watch(base)
    t = fn(x)
    del base, x
    gc.collect()
    assert counter.released == 0, "released while tensorwire still views it"
    v = t[1:3]
    del t
    gc.collect()
    assert counter.released == 0
    assert np.asarray(v).size > 0
    del v
    gc.collect()
    assert counter.released == 1


class ExchangeOnly(torch.Tensor):
    """Importable through PyTorch's C exchange API only: its __dlpack__ fails if tensorwire falls back to it."""

    def __dlpack__(self, *args, **kwargs):
        raise AssertionError("__dlpack__ was called although the exchange API could serve")


def test_exchange_api_keeps_the_torch_storage_alive():
    # PyTorch's exchange API holds the storage, not the Python object. The storage of a torch.from_numpy tensor owns
    # a reference to the NumPy array, so the array's destruction is the storage's: counted, it proves tensorwire
    # alone keeps the memory alive after every Python object of the producer is gone, and lets it go exactly once.
    counter = Counter()
    a = np.arange(48.0, dtype=np.float32).reshape(4, 12)
    counter.watch(a)
    first = a.ctypes.data
    x = torch.from_numpy(a)[:, 1::2].as_subclass(ExchangeOnly)
    t = tw.asarray(x)
    assert t.data_ptr == first + 4  # zero-copy: the view starts one element in
    del x, a
    gc.collect()
    assert counter.released == 0, "released while tensorwire still views it"
    assert np.asarray(t)[3, 5] == 47.0
    del t
    gc.collect()
    assert counter.released == 1


@pytest.mark.parametrize("path", [p for p in PATHS if PATHS[p][2]])
def test_read_only_stays_read_only(path):
    fn = PATHS[path][0]
    _, x = source(readonly=True)
    t = fn(x)
    if PATHS[path][1]:
        assert t.readonly
        with pytest.raises(ValueError):
            np.asarray(t)[0, 0] = 1.0
    assert np.asarray(t).tobytes() == x.tobytes()
