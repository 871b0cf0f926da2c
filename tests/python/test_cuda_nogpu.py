"""CUDA on a machine without a CUDA device (CI): tensorwire says so, every CUDA operation raises an error naming why
(never a crash, never a silent host tensor), and everything host-side, Tensor.to("cpu") included, works.
Skipped where a device is present (tests/python/test_cuda.py covers that machine)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

import tensorwire as tw

pytestmark = pytest.mark.skipif(tw.cuda.is_available(), reason="a CUDA device is present: see test_cuda.py")

STATS_KEYS = {"reserved_bytes", "in_use_bytes", "cached_blocks", "hits", "misses"}


def status() -> str:
    return tw.cuda.status()


def test_reports_no_device_and_why():
    assert tw.cuda.is_available() is False
    s = status()
    assert isinstance(s, str) and s.strip()
    assert tw.cuda.device_count() == 0
    assert isinstance(tw.cuda.driver_version(), int)
    assert isinstance(tw.cuda.kernels_built(), bool)


def test_pool_stats_are_dicts_of_counters():
    for stats in (tw.cuda.pinned_pool_stats(), tw.cuda.device_pool_stats(0), tw.cuda.device_pool_stats()):
        assert isinstance(stats, dict)
        assert set(stats) >= STATS_KEYS
        assert all(isinstance(stats[k], int) and stats[k] >= 0 for k in STATS_KEYS)


def _raises_naming_why(fn):
    with pytest.raises(Exception) as ei:
        fn()
    assert not isinstance(ei.value, tw.CopyError), ei.value
    assert isinstance(ei.value, (BufferError, RuntimeError, ValueError)), repr(ei.value)
    assert status() in str(ei.value), f"{ei.value!s} does not say why: {status()!r}"
    return ei.value


@pytest.mark.parametrize("make", [
    lambda: tw.empty((2, 2), "float32", device="cuda:0"),
    lambda: tw.zeros((2, 2), "float32", device="cuda:0"),
    lambda: tw.empty((2, 2), "float32", pinned=True),
    lambda: tw.asarray(np.ones(3), device="cuda:0"),
    lambda: tw.asarray(np.ones(3), device="cuda_host"),
    lambda: tw.asarray(np.ones(3)).to("cuda:0"),
    lambda: tw.asarray(np.ones(3)).to("cuda_host"),
    lambda: tw.asarray(np.ones(3)).pin(),
], ids=["empty", "zeros", "empty-pinned", "asarray", "asarray-cuda_host", "to", "to-cuda_host", "pin"])
def test_cuda_operations_raise_the_device_unavailable_error(make):
    _raises_naming_why(make)


def test_asarray_to_cuda_leads_with_why_before_each_protocols_refusal():
    # Every protocol refuses for the same reason; the message says it first, not after NumPy's own words.
    msg = str(_raises_naming_why(lambda: tw.asarray(np.ones(3), device="cuda:0")))
    head = msg.splitlines()[0]
    assert "device=cuda:0 needs CUDA, which is unavailable here" in head, msg
    assert status() in head, msg


@pytest.mark.parametrize("device", ["cuda:0", "cuda_host"])
@pytest.mark.parametrize("remote", [False, True], ids=["shm", "ucx"])
def test_a_subscriber_for_a_cuda_device_is_refused_when_made(device, remote):
    # Not at its first recv: a device this process cannot use never appears later.
    name = f"test/nogpu/{uuid.uuid4().hex[:12]}"
    kw = {"connect": "127.0.0.1:9"} if remote else {}
    err = _raises_naming_why(lambda: tw.Subscriber(name, device=device, **kw))
    assert isinstance(err, BufferError), repr(err)
    assert f"Subscriber('{name}', device={device}" in str(err), err
    with tw.Subscriber(name, device="cpu") as sub:  # cpu always works
        with pytest.raises(TimeoutError):
            sub.recv(timeout=0.01)


def test_to_cpu_on_cpu():
    a = np.arange(6.0).reshape(2, 3)
    t = tw.asarray(a)
    same = t.to("cpu")
    assert same is t or same.data_ptr == t.data_ptr
    assert t.to(tw.Device("cpu")) is t or t.to(tw.Device("cpu")).data_ptr == t.data_ptr
    assert t.to("cpu", copy=False) is t or t.to("cpu", copy=False).data_ptr == t.data_ptr
    c = t.to("cpu", copy=True)
    assert c.data_ptr != t.data_ptr
    assert c.device == tw.Device("cpu")
    assert np.array_equal(np.asarray(c), a)
    assert not t.pinned and t.stream is None
    # A stream orders CUDA work: naming one for a host-to-host move is a mistake said at once (as DLPack export
    # on the CPU says it), not ignored.
    for copy in (None, True):
        with pytest.raises(ValueError, match=r"stream=1 orders CUDA work, and a move from cpu to cpu has none"):
            t.to("cpu", stream=1, copy=copy)


def test_to_another_device_without_copy_raises_copy_error():
    t = tw.asarray(np.ones(3))
    with pytest.raises(tw.CopyError):
        t.to("cuda:0", copy=False)


@pytest.mark.parametrize("kw", [{"device": "cuda:0"}, {"pinned": True}])
def test_zeros_says_why_before_building_anything_on_the_host(kw):
    # tw.zeros made the zero-filled host tensor first and only then tried to move it: 3 GiB of page faults before
    # "CUDA is unavailable", and a MemoryError (about host memory) for sizes the host could not hold.
    for n in (3 << 30, 1 << 45):
        with pytest.raises(BufferError, match="tensorwire.zeros: .*CUDA is unavailable"):
            tw.zeros((n,), "uint8", **kw)


def test_device_pool_stats_takes_the_device_as_every_other_call_does():
    # (a "cuda:0" string was nanobind's "incompatible function arguments" for a private name)
    assert tw.cuda.device_pool_stats("cuda:0") == tw.cuda.device_pool_stats(tw.Device("cuda:0")) \
        == tw.cuda.device_pool_stats(np.int64(0)) == tw.cuda.device_pool_stats()
    with pytest.raises(ValueError, match="cpu is not a CUDA device"):
        tw.cuda.device_pool_stats("cpu")
    with pytest.raises(ValueError, match="does not exist"):
        tw.cuda.device_pool_stats(2**40)
    with pytest.raises(TypeError, match="device must be an int, 'cuda:N' or a tw.Device, not NoneType"):
        tw.cuda.device_pool_stats(None)


@pytest.mark.parametrize("device", ["cpu:1", (1, 3)])
def test_a_cpu_device_other_than_the_one_host_does_not_exist(device):
    # ("cpu:1" was accepted: to("cpu:1") copied and returned a tensor on cpu, and to("cpu:1", copy=False) raised)
    with pytest.raises(ValueError, match="does not exist: the host is one device"):
        tw.asarray(np.ones(2)).to(device)
    with pytest.raises(ValueError, match="does not exist"):
        tw.empty(3, device=device)
    assert tw.asarray(np.ones(2)).to("cpu:0").device == tw.Device("cpu")


def test_from_dlpack_to_a_cuda_device_says_cuda_is_unavailable_before_what_the_producer_said():
    # (NumPy's bare "unsupported device requested" led, and PyTorch's RuntimeError passed through as it was)
    with pytest.raises(BufferError, match=r"^from_dlpack: device=cuda:0 needs CUDA, which is unavailable here: .*"
                                          r"\(the producer's __dlpack__ said: BufferError: "):
        tw.from_dlpack(np.ones(2), device="cuda:0")
