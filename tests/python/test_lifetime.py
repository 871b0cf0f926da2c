"""Lifetimes: the producer's memory is held exactly as long as some tensorwire view (or an export of one) lives,
and released when the last one dies. Run under ASan+UBSan too, where a use-after-free or double free aborts."""

from __future__ import annotations

import gc
import pickle
import weakref

import numpy as np
import pytest

import tensorwire as tw
from _helpers import UNDER_ASAN, ptr, rss_bytes

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
pytestmark = pytest.mark.usefixtures("fast_gc")


class Arr(np.ndarray):
    """A weak-referenceable NumPy array."""


class Buf(bytearray):
    """A weak-referenceable buffer exporter."""


def collect():
    for _ in range(2):
        gc.collect()


def source(n=1000):
    x = np.arange(n, dtype=np.float64).view(Arr)
    return x, weakref.ref(x)


def test_numpy_source_freed_exactly_when_last_view_dies():
    x, w = source()
    t = tw.asarray(x)
    v1 = t[10:20]
    v2 = v1.T[::-1]
    v3 = t.view(10, 100).expand(3, 10, 100)
    del x
    collect()
    assert w() is not None
    del t
    collect()
    assert w() is not None
    del v1, v3
    collect()
    assert w() is not None  # v2 still views the memory
    assert np.asarray(v2).tolist() == list(range(19, 9, -1))
    del v2
    collect()
    assert w() is None


def test_torch_source_freed_exactly_when_last_view_dies():
    x = torch.arange(100.0)
    w = weakref.ref(x)
    t = tw.asarray(x)[::3]
    del x
    collect()
    assert w() is not None
    assert np.asarray(t)[2] == 6.0
    del t
    collect()
    assert w() is None


def test_buffer_protocol_export_released_with_the_last_view():
    b = Buf(b"\x00" * 16)
    w = weakref.ref(b)
    t = tw.asarray(b)
    with pytest.raises(BufferError):
        b.append(1)  # an export is held: bytearray cannot resize
    v = t[4:]
    del t
    collect()
    with pytest.raises(BufferError):
        b.append(1)
    del v
    collect()
    b.append(1)  # every export released
    del b
    collect()
    assert w() is None


def test_array_interface_producer_kept_alive():
    x, w = source()

    class AI:
        def __init__(self, a):
            self.__array_interface__ = {"version": 3, "shape": a.shape, "typestr": "<f8",
                                        "data": (ptr(a), False)}
            self.a = a

    obj = AI(x)
    wo = weakref.ref(obj)
    t = tw.asarray(obj)
    del obj, x
    collect()
    assert wo() is not None and w() is not None
    del t
    collect()
    assert wo() is None and w() is None


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_unconsumed_capsule_frees_its_tensor(max_version):
    x, w = source()
    t = tw.asarray(x)
    cap = t.__dlpack__(max_version=max_version)
    del t, x
    collect()
    assert w() is not None  # the capsule owns a reference
    del cap
    collect()
    assert w() is None


@pytest.mark.parametrize(
    "consume",
    [
        lambda t: torch.from_dlpack(t),
        lambda t: torch.utils.dlpack.from_dlpack(t.__dlpack__()),
        lambda t: np.from_dlpack(t),
        lambda t: tw.from_dlpack(t.__dlpack__(max_version=(1, 0))),
        lambda t: tw.from_dlpack(t.__dlpack__()),
        lambda t: np.asarray(t),
        lambda t: memoryview(t),
        lambda t: np.asarray(memoryview(t)),
        lambda t: t.numpy(),
        lambda t: t.metadata,
        lambda t: (lambda bufs: pickle.loads(pickle.dumps(t, protocol=5, buffer_callback=bufs.append),
                                             buffers=bufs))([]),
    ],
    ids=["torch", "torch-capsule", "numpy-dlpack", "tw-versioned", "tw-legacy", "np.asarray", "memoryview",
         "np-memoryview", "numpy()", "metadata", "pickle5-oob"],
)
def test_consumer_keeps_source_until_it_dies(consume):
    x, w = source()
    t = tw.asarray(x)
    y = consume(t)
    del t, x
    collect()
    assert w() is not None
    del y
    collect()
    assert w() is None


def test_consumed_capsule_does_not_free_twice():
    x, w = source()
    t = tw.asarray(x)
    cap = t.__dlpack__(max_version=(1, 0))
    u = tw.from_dlpack(cap)
    del t, x
    collect()
    del cap  # renamed 'used_...': its destructor must not run the deleter
    collect()
    assert w() is not None and np.asarray(u)[999] == 999.0
    del u
    collect()
    assert w() is None


def test_tensor_itself_is_weak_referenceable_and_collected():
    x, w = source()
    t = tw.asarray(x)
    wt = weakref.ref(t)
    del t
    collect()
    assert wt() is None
    del x
    collect()
    assert w() is None


def test_reference_cycle_through_metadata_owner_is_collected():
    x, w = source()
    holder = {"x": x}
    holder["t"] = tw.asarray(x)
    holder["self"] = holder
    del x, holder
    collect()
    assert w() is None


def _one_round(keep: list):
    x = np.empty(1024, dtype=np.float64).view(Arr)  # 8 KiB
    keep.append(weakref.ref(x))
    t = tw.asarray(x)
    t.metadata["i"] = len(keep)
    n = np.from_dlpack(t)
    y = torch.from_dlpack(t)
    m = memoryview(t)
    u = tw.from_dlpack(t.__dlpack__(max_version=(1, 0)))
    c = t[::2].contiguous()
    s = pickle.dumps(t, protocol=5)
    r = pickle.loads(s)
    assert n.shape == y.shape == (1024,) and m.nbytes == u.nbytes == r.nbytes and c.size == 512


def test_many_imports_and_exports_do_not_leak():
    rounds = 2_000 if UNDER_ASAN else 10_000
    refs: list = []
    for _ in range(500):  # warm up allocator pools and caches
        _one_round(refs)
    collect()
    before = rss_bytes()
    for _ in range(rounds):
        _one_round(refs)
    collect()
    grown = rss_bytes() - before
    assert sum(r() is not None for r in refs) == 0, "some sources were never released"
    if not UNDER_ASAN:  # ASan's quarantine holds freed memory, so RSS says nothing there
        # every round allocates ~8 KiB of source plus copies; a leak of any of them would be >= 80 MiB
        assert grown < 32 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over {rounds} rounds"
