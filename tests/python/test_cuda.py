"""CUDA device tensors on a real GPU, with real libraries: PyTorch, CuPy, Numba and JAX tensors in and out (zero-copy
where the memory can be shared, proven by data pointers), host <-> device round trips bit-exact for every dtype and
for random strided layouts (hypothesis), device-side contiguous(), Tensor.to with streams and the copy policy,
stream ordering both ways (a producer's pending kernel is waited for, a consumer waits for tensorwire's copy),
pinned memory, the errors, and the device pool's bookkeeping.

Every test here skips on a machine without a CUDA device (tests/python/test_cuda_nogpu.py covers that machine).
TW_REQUIRE_CUDA=1 (scripts/test-gpu.sh sets it) makes a missing device a failure instead."""

from __future__ import annotations

import gc
import operator
import os

# JAX would otherwise take 75% of the GPU's memory when its GPU backend starts, starving the other libraries here.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tensorwire as tw
from _helpers import same_bits

REQUIRED = os.environ.get("TW_REQUIRE_CUDA") == "1"
pytestmark = pytest.mark.skipif(not REQUIRED and not tw.cuda.is_available(),
                                reason=f"no CUDA device: {tw.cuda.status()}")

CUDA0 = tw.Device("cuda:0")
# ~0.15 s of GPU time at H100 clocks: long enough that a copy not ordered after it reads the old values.
SLEEP_CYCLES = 300_000_000

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
          "float32", "float64", "complex64", "complex128"]


# ---- helpers --------------------------------------------------------------------------------------------------

def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes")
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def random_array(shape, name: str, seed: int = 0) -> np.ndarray:
    """Random bytes (fixed seed) as an array of `name`; bools are 0 or 1."""
    dt = np_dtype(name)
    n = int(np.prod(shape, dtype=np.int64))
    raw = np.random.default_rng(seed).integers(0, 256, size=n * dt.itemsize, dtype=np.uint8)
    if name == "bool":
        raw &= 1
    return raw.view(dt).reshape(shape)


def need_torch():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch has no CUDA device")
    return torch


def need_cupy():
    cp = pytest.importorskip("cupy", reason="CuPy is not installed")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("CuPy sees no CUDA device")
    except cp.cuda.runtime.CUDARuntimeError as e:
        pytest.skip(f"CuPy cannot reach the device: {e}")
    return cp


def need_numba_cuda():
    pytest.importorskip("numba", reason="Numba is not installed")
    from numba import cuda as ncuda

    if not ncuda.is_available():
        pytest.skip("Numba's CUDA target is not available")
    return ncuda


def need_jax_gpu():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as e:
        pytest.skip(f"JAX has no GPU backend: {e}")
    if not gpus:
        pytest.skip("JAX sees no GPU")
    return jax, gpus[0]


def kernels_or_skip(fn):
    """fn(), except that a build without tensorwire's strided kernels may refuse a layout the driver cannot copy."""
    try:
        return fn()
    except BufferError as e:
        if isinstance(e, tw.CopyError) or tw.cuda.kernels_built():
            raise
        pytest.skip(f"this build has no strided CUDA kernels: {e}")


def host(t: tw.Tensor) -> np.ndarray:
    """The values of a tensor on any device, as a NumPy array (one copy to the host for device memory)."""
    return np.asarray(t.to("cpu") if not t.device.host_accessible else t)


class CAI:
    """An object carrying only a CUDA Array Interface (so tensorwire cannot take another protocol)."""

    def __init__(self, d: dict, keep=None):
        self.__cuda_array_interface__ = d
        self._keep = keep


class CudaStreamProtocol:
    """An object with only the CUDA stream protocol's __cuda_stream__."""

    def __init__(self, handle: int):
        self._handle = handle

    def __cuda_stream__(self):
        return (0, self._handle)


# ---- the device ------------------------------------------------------------------------------------------------

def test_cuda_is_available_and_says_what_it_is():
    assert tw.cuda.is_available(), tw.cuda.status()
    assert tw.cuda.device_count() >= 1
    assert tw.cuda.driver_version() >= 1000
    assert "CUDA" in tw.cuda.status()
    assert isinstance(tw.cuda.kernels_built(), bool)
    if os.environ.get("TW_EXPECT_CUDA_KERNELS") == "1":
        assert tw.cuda.kernels_built(), "the build had nvcc but the library carries no kernels"
    for stats in (tw.cuda.pinned_pool_stats(), tw.cuda.device_pool_stats(0), tw.cuda.device_pool_stats()):
        assert set(stats) >= {"reserved_bytes", "in_use_bytes", "cached_blocks", "hits", "misses"}
        assert stats["reserved_bytes"] >= stats["in_use_bytes"] >= 0


# ---- NumPy <-> device, every dtype -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", DTYPES)
def test_asarray_to_device_and_back_is_bit_exact(name):
    a = random_array((3, 5, 7), name, seed=DTYPES.index(name))
    t = tw.asarray(a, device="cuda:0")
    assert t.device == CUDA0 and t.shape == a.shape and t.dtype == a.dtype
    assert t.data_ptr != a.__array_interface__["data"][0]
    back = t.to("cpu")
    assert back.device == tw.Device("cpu")
    assert same_bits(np.asarray(back), a)
    # and a strided view of it, taken on the device
    v = t[::-1, 1::2, ::3]
    assert v.device == CUDA0 and v.data_ptr != t.data_ptr
    assert same_bits(host(kernels_or_skip(lambda: v.contiguous())), a[::-1, 1::2, ::3])


def test_asarray_copy_false_to_another_device_raises_copy_error():
    a = np.arange(6.0)
    with pytest.raises(tw.CopyError):
        tw.asarray(a, device="cuda:0", copy=False)
    t = tw.asarray(a, device="cuda:0")
    with pytest.raises(tw.CopyError):
        tw.asarray(t, device="cpu", copy=False)


def test_large_strided_round_trip():
    a = random_array((2048, 4096), "float32", seed=7)  # 32 MiB
    v = a[::-1, ::3]
    assert same_bits(host(tw.asarray(v).to("cuda:0")), v)
    p = tw.asarray(a).pin()
    d = p.to("cuda:0")
    assert same_bits(host(d), a)


# ---- hypothesis: random dtype, rank 0..5, strides (negative, zero, offsets) ------------------------------------

PROPERTY_DTYPES = [n for n in DTYPES if n != "bfloat16"]
try:
    import ml_dtypes  # noqa: F401

    PROPERTY_DTYPES.append("bfloat16")
except ImportError:
    pass


@st.composite
def views(draw):
    """(base array, ops, the NumPy view the ops give): ops replay the same view on a tensorwire tensor."""
    name = draw(st.sampled_from(PROPERTY_DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=5))
    base = random_array(shape, name, seed=draw(st.integers(0, 2**32 - 1)))
    v = base
    ops = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["index", "permute", "broadcast", "offset"]))
        if kind == "index":
            idx = draw(hnp.basic_indices(v.shape, min_dims=0, max_dims=5, allow_newaxis=True, allow_ellipsis=True))
            r = v[idx]
            if not isinstance(r, np.ndarray):  # a NumPy scalar: keep a 0-d view instead
                idx = (*(idx if isinstance(idx, tuple) else (idx,)), Ellipsis)
                r = v[idx]
            ops.append(("index", idx))
            v = r
        elif kind == "permute" and v.ndim > 1:
            perm = tuple(draw(st.permutations(range(v.ndim))))
            ops.append(("permute", perm))
            v = v.transpose(perm)
        elif kind == "broadcast" and v.ndim < 5:
            lead = tuple(draw(st.lists(st.integers(1, 3), max_size=5 - v.ndim)))
            target = lead + tuple(draw(st.integers(1, 4)) if s == 1 else s for s in v.shape)
            ops.append(("broadcast", target))
            v = np.broadcast_to(v, target)
        elif kind == "offset" and v.ndim and v.shape[0] > 1:
            k = draw(st.integers(1, v.shape[0] - 1))
            ops.append(("offset", k))
            v = v[k:]
    return base, ops, v


def replay(t: tw.Tensor, ops) -> tw.Tensor:
    for kind, arg in ops:
        if kind == "index":
            t = t[arg]
        elif kind == "permute":
            t = t.permute(arg)
        elif kind == "broadcast":
            t = t.expand(arg)
        else:
            t = t[arg:]
    return t


@settings(max_examples=60, deadline=None)
@given(views())
def test_property_host_view_through_the_device_is_bit_exact(case):
    base, ops, v = case
    t = tw.asarray(v)
    d = t.to("cuda:0")
    assert d.device == CUDA0 and d.shape == v.shape
    dc = kernels_or_skip(lambda: d.contiguous())
    assert dc.device == CUDA0 and dc.is_contiguous()
    back = dc.to("cpu")
    assert same_bits(np.asarray(back), v)
    direct = tw.asarray(v, device="cuda:0")
    assert direct.device == CUDA0
    assert same_bits(host(direct), v)


@settings(max_examples=60, deadline=None)
@given(views())
def test_property_device_view_to_host_and_contiguous_is_bit_exact(case):
    base, ops, v = case
    dv = replay(tw.asarray(base, device="cuda:0"), ops)
    assert dv.device == CUDA0
    assert dv.shape == v.shape
    assert same_bits(host(kernels_or_skip(lambda: dv.to("cpu"))), v)
    dc = kernels_or_skip(lambda: dv.contiguous())
    assert dc.is_contiguous() and dc.device == CUDA0
    assert same_bits(host(dc), v)


# ---- PyTorch ---------------------------------------------------------------------------------------------------

def test_torch_permuted_is_zero_copy_both_ways():
    torch = need_torch()
    torch.manual_seed(0)
    x = torch.randn(64, 3, 224, 224, device="cuda").permute(0, 2, 3, 1)
    t = tw.asarray(x)
    assert t.data_ptr == x.data_ptr()
    assert t.device == CUDA0
    assert t.shape == tuple(x.shape) and t.strides == x.stride() and t.dtype == "float32"
    y = torch.from_dlpack(t)
    assert y.device.type == "cuda" and y.data_ptr() == x.data_ptr() and y.stride() == x.stride()
    assert torch.equal(y, x)
    assert same_bits(host(t), x.cpu().numpy())


def test_torch_contiguous_equals_torch_contiguous():
    torch = need_torch()
    torch.manual_seed(1)
    x = torch.randn(8, 3, 32, 40, device="cuda").permute(0, 2, 3, 1)
    c = kernels_or_skip(lambda: tw.asarray(x).contiguous())
    assert c.device == CUDA0 and c.is_contiguous()
    y = torch.from_dlpack(c)
    assert y.is_contiguous() and y.data_ptr() == c.data_ptr
    assert torch.equal(y, x.contiguous())


@pytest.mark.parametrize("name", ["bool", "uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
                                  "float64", "complex64", "complex128"])
def test_torch_export_of_a_device_tensor(name):
    torch = need_torch()
    a = random_array((4, 6), name, seed=3)  # random bits: NaNs included, so compare bytes, not values
    t = tw.asarray(a, device="cuda:0")
    y = torch.from_dlpack(t)
    assert y.device.type == "cuda" and y.data_ptr() == t.data_ptr and tuple(y.shape) == a.shape
    assert str(y.dtype) == f"torch.{name}"
    z = y.cpu().contiguous()
    if z.is_complex():
        z = torch.view_as_real(z)
    assert z.reshape(-1).view(torch.uint8).numpy().tobytes() == a.tobytes()


def test_asarray_with_another_device_copies_once():
    torch = need_torch()
    x = torch.arange(12, dtype=torch.float64, device="cuda").reshape(3, 4)
    h = tw.asarray(x, device="cpu")
    assert h.device == tw.Device("cpu")
    assert np.array_equal(np.asarray(h), x.cpu().numpy())


@pytest.mark.parametrize("how", ["object", "int", "protocol"])
def test_to_with_a_torch_stream_carries_it(how):
    torch = need_torch()
    s = torch.cuda.Stream()
    arg = {"object": s, "int": s.cuda_stream, "protocol": CudaStreamProtocol(s.cuda_stream)}[how]
    a = random_array((64, 33), "float32", seed=11)
    d = tw.asarray(a).to("cuda:0", stream=arg)
    assert d.stream == s.cuda_stream
    assert d.device == CUDA0
    assert same_bits(np.asarray(d.to("cpu")), a)  # default: ordered after the tensor's own stream
    assert same_bits(np.asarray(d.to("cpu", stream=arg)), a)
    p = tw.asarray(a).pin().to("cuda:0", stream=arg).to("cuda_host", stream=arg)
    assert p.pinned and p.stream is None  # host memory: the data is there when to() returns
    assert same_bits(np.asarray(p), a)  # no synchronize: a pinned result is complete


def _stale_unless_ordered(torch, n):
    """x (zeros) and a side stream on which a long sleep then x.fill_(7) are queued, nothing synchronised."""
    x = torch.zeros(n, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())  # the zeros first (ordering, not a host wait)
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.fill_(7.0)
    return x, s


@pytest.mark.parametrize("via", ["cai", "dlpack", "cupy"])
def test_import_is_ordered_after_the_producer_stream(via):
    torch = need_torch()
    cp = need_cupy() if via == "cupy" else None  # (its first import takes longer than the producer's kernel)
    x, s = _stale_unless_ordered(torch, 1 << 22)
    if via == "cai":
        d = dict(x.__cuda_array_interface__, version=3, stream=s.cuda_stream)
        t = tw.asarray(CAI(d, keep=x))
        assert t.stream == s.cuda_stream
    elif via == "dlpack":
        with torch.cuda.stream(s):  # torch's current stream is the producer's: the import orders on it
            t = tw.asarray(x)
    else:
        with cp.cuda.ExternalStream(s.cuda_stream):
            a = cp.asarray(x)
            cai = a.__cuda_array_interface__
        if cai.get("stream") != s.cuda_stream:
            pytest.skip(f"CuPy exported stream {cai.get('stream')!r}, not its current stream")
        t = tw.asarray(CAI(cai, keep=a))
        assert t.stream == s.cuda_stream
    assert t.data_ptr == x.data_ptr()
    back = np.asarray(t.to("cpu"))  # no synchronize anywhere: only the recorded stream orders this
    assert (back == 7).all(), f"read {np.unique(back)[:4]}: the copy did not wait for the producer's stream"


def test_an_import_on_torchs_default_stream_orders_a_consumer_on_another_stream():
    # PyTorch's default stream is handle 0 (the legacy default stream): an import made while it is current must
    # still order its consumers after it, not leave the tensor without a stream.
    torch = need_torch()
    x = torch.zeros(1 << 22, device="cuda")
    torch.cuda._sleep(SLEEP_CYCLES)  # on the default stream, still running when the import returns
    x.fill_(7.0)
    t = tw.asarray(x)
    assert t.stream == 1, t.stream
    c = torch.cuda.Stream()  # a non-blocking stream: nothing orders it after the legacy stream but an event
    with torch.cuda.stream(c):
        got = torch.from_dlpack(t).clone()  # t.__dlpack__(stream=c) makes c wait
    c.synchronize()
    assert (got == 7).all(), f"read {torch.unique(got)[:4]}: the consumer's stream did not wait"


def test_a_device_request_the_torch_tensor_already_meets_is_zero_copy_and_ordered():
    # device="cuda:0" for a tensor already there takes PyTorch's DLPack C exchange API, as no device= does (since
    # 2026-11-29; before, any device= went through __dlpack__): zero-copy, with the producer's current stream
    # recorded, so a later copy waits for the kernel still writing. A move (device="cpu") is still __dlpack__'s.
    torch = need_torch()
    x = torch.zeros(1 << 22, device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.fill_(7.0)
        t = tw.asarray(x, device="cuda:0")
    assert t.data_ptr == x.data_ptr() and t.device == CUDA0
    assert t.stream == s.cuda_stream, t.stream
    back = np.asarray(t.to("cpu"))  # no synchronize: only the recorded stream orders this
    assert (back == 7).all(), f"read {np.unique(back)[:4]}: the copy did not wait for the producer's stream"
    s.synchronize()
    h = tw.asarray(x, device="cpu")
    assert str(h.device) == "cpu" and (np.asarray(h) == 7).all()


@pytest.mark.parametrize("consumer", ["torch", "cupy", "cpu"])
def test_a_producers_stream_may_be_destroyed_once_its_tensor_is_imported(consumer):
    """CuPy destroys a stream when its object goes; a tensor imported with it still orders its consumers after the
    producer's work (an event recorded at import), and never names the dead stream to anyone. One consumer per run:
    each must be the first to read while the producer's work still runs."""
    torch = need_torch()
    cp = need_cupy()
    # tensorwire's own stream exists before the producer's is made, so the driver cannot hand out the dead
    # producer's handle value for it later (that would make the check below fail for no fault of the code).
    warm = torch.ones(4, device="cuda")
    torch.cuda.synchronize()
    w = torch.cuda.Stream()
    warm_cai = dict(warm.__cuda_array_interface__, version=3, stream=w.cuda_stream)
    assert tw.asarray(CAI(warm_cai, keep=warm)).__cuda_array_interface__["stream"] != w.cuda_stream
    x = torch.zeros(1 << 22, device="cuda")
    torch.cuda.synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    handle = s.ptr
    with torch.cuda.stream(torch.cuda.ExternalStream(handle)):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.fill_(7.0)
    t = tw.asarray(CAI(dict(x.__cuda_array_interface__, version=3, stream=handle), keep=x))
    assert t.stream == handle  # still says whose stream it was
    del s  # cudaStreamDestroy: the queued work still runs, the handle is gone (no gc.collect: it takes longer
    # than the producer's kernel, which must still run when the consumer reads)
    if consumer == "torch":
        got = torch.from_dlpack(t)  # torch's current stream waits on the import's event
        assert (got == 7).all().item(), "the consumer did not wait for the producer's work"
    elif consumer == "cupy":
        cai = t.__cuda_array_interface__
        assert cai["stream"] not in (None, handle), "a consumer must not be told to wait for a destroyed stream"
        assert (cp.asarray(t) == 7).all().item(), "CuPy did not wait on the exported stream"
    else:
        assert (np.asarray(t.to("cpu")) == 7).all(), "the copy did not wait for the producer's work"


@pytest.mark.parametrize("consumer", ["torch", "cupy"])
def test_export_makes_the_consumer_wait_for_tensorwire_copy(consumer):
    torch = need_torch()
    a = random_array((1 << 22,), "float32", seed=13)  # 16 MiB
    p = tw.asarray(a).pin()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(SLEEP_CYCLES)
    d = p.to("cuda:0", stream=s)  # queued after the sleep; returns at once
    assert d.stream == s.cuda_stream
    if consumer == "torch":
        got = torch.from_dlpack(d).cpu().numpy()  # the current (default) stream must wait for `s`
    else:
        cp = need_cupy()
        got = cp.asnumpy(cp.asarray(d))
    assert same_bits(got, a)


# ---- CuPy ------------------------------------------------------------------------------------------------------

def test_cupy_import_through_the_cuda_array_interface_with_its_stream():
    cp = need_cupy()
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        a = cp.arange(4 * 9, dtype=cp.float32).reshape(4, 9)[:, ::2]
        cai = a.__cuda_array_interface__
        t = tw.asarray(CAI(cai, keep=a))
    assert t.data_ptr == a.data.ptr
    assert t.strides == tuple(st_ // a.itemsize for st_ in a.strides)
    assert t.stream == cai.get("stream")
    assert t.device == CUDA0
    assert np.array_equal(host(t), cp.asnumpy(a))
    t2 = tw.asarray(a)  # whichever protocol tensorwire prefers: the same memory
    assert t2.data_ptr == a.data.ptr and np.array_equal(host(t2), cp.asnumpy(a))


def test_cupy_exports_zero_copy():
    cp = need_cupy()
    a = random_array((5, 6), "float64", seed=5)
    t = tw.asarray(a, device="cuda:0")
    cai = t.__cuda_array_interface__
    assert cai["version"] == 3
    if t.stream is not None:
        assert cai["stream"] == t.stream
    else:
        assert cai.get("stream") in (None, 1, 2)
    assert cai["data"][0] == t.data_ptr and tuple(cai["shape"]) == a.shape
    b = cp.asarray(t)
    assert b.data.ptr == t.data_ptr
    assert np.array_equal(cp.asnumpy(b), a)
    c = cp.from_dlpack(t)
    assert c.data.ptr == t.data_ptr
    assert np.array_equal(cp.asnumpy(c), a)
    v = t[:, ::-2]
    assert np.array_equal(cp.asnumpy(cp.asarray(v)), a[:, ::-2])


# ---- Numba -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("with_stream", [False, True])
def test_numba_device_arrays(with_stream):
    ncuda = need_numba_cuda()
    a = random_array((6, 7), "int32", seed=17)
    stream = ncuda.stream() if with_stream else 0
    d = ncuda.to_device(a, stream=stream)
    cai = d.__cuda_array_interface__
    t = tw.asarray(d)
    assert t.data_ptr == cai["data"][0]
    assert t.stream == cai.get("stream")
    assert t.device == CUDA0
    assert np.array_equal(host(t), a)
    back = ncuda.as_cuda_array(t)  # numba reads tensorwire's CUDA Array Interface: the same memory
    assert back.__cuda_array_interface__["data"][0] == t.data_ptr
    assert np.array_equal(back.copy_to_host(), a)


# ---- JAX -------------------------------------------------------------------------------------------------------

def test_jax_gpu_arrays_import_read_only():
    jax, gpu = need_jax_gpu()
    a = random_array((8, 5), "float32", seed=19)
    x = jax.device_put(a, gpu)
    x.block_until_ready()
    t = tw.asarray(x)
    assert t.device == tw.Device(f"cuda:{gpu.id}")
    assert t.readonly
    assert t.data_ptr == x.unsafe_buffer_pointer()
    assert same_bits(host(t), a)
    # Back to JAX: a read-only tensor refuses a legacy (unversioned) capsule, which cannot say read-only, with a
    # BufferError naming why (what JAX asks for depends on its version: a versioned request gets the tensor,
    # marked read-only); tw.to_jax hands JAX a copy instead.
    asked = []

    class Spy:
        def __dlpack__(self, **kw):
            asked.append(kw)
            return t.__dlpack__(**kw)

        def __dlpack_device__(self):
            return t.__dlpack_device__()

    try:
        z = jax.numpy.from_dlpack(Spy())
    except Exception as e:  # noqa: BLE001 (which one depends on who refused)
        assert asked, "JAX never called __dlpack__"
        if tuple(asked[-1].get("max_version") or (0, 0)) < (1, 0):
            assert isinstance(e, BufferError) and "read-only" in str(e), repr(e)  # tensorwire's refusal
        else:  # a versioned capsule marked read-only, which this JAX may refuse itself
            assert "read" in str(e).lower(), repr(e)
    else:
        assert asked and tuple(asked[-1].get("max_version") or (0, 0)) >= (1, 0), asked
        assert np.array_equal(np.asarray(z), a)
    y = tw.to_jax(t)
    assert y.devices() == {gpu}
    assert np.array_equal(np.asarray(y), a)


# ---- pinned memory and allocation ------------------------------------------------------------------------------

def test_pin_keeps_metadata_and_layout():
    h = tw.asarray(np.arange(24.0).reshape(4, 6))[:, 1::2]
    h.metadata["k"] = 1
    p = h.pin()
    assert p.pinned and not h.pinned
    assert p.device == tw.Device("cuda_host")
    assert p.metadata["k"] == 1
    assert p.shape == h.shape and p.strides == h.strides and p.dtype == h.dtype
    assert p.data_ptr != h.data_ptr
    assert np.array_equal(np.asarray(p.to("cpu")), np.asarray(h))
    assert p.pin() is p


def test_empty_and_zeros_on_the_device_and_pinned():
    e = tw.empty((4, 4), "float32", device="cuda:0")
    assert e.device == CUDA0 and e.shape == (4, 4) and e.strides == (4, 1) and not e.pinned
    f = tw.empty((4, 4), "float32", "F", device="cuda:0")
    assert f.is_contiguous("F")
    p = tw.empty((4, 4), "float32", pinned=True)
    assert p.pinned and p.device == tw.Device("cuda_host")
    assert np.asarray(p).shape == (4, 4)  # host-accessible
    q = tw.asarray(np.full((4, 4), 3.0, dtype=np.float32)).pin()
    assert np.array_equal(np.asarray(q.to("cuda:0").to("cpu")), np.full((4, 4), 3.0, dtype=np.float32))
    z = tw.zeros((3, 5), "int32", device="cuda:0")
    assert z.device == CUDA0 and np.array_equal(host(z), np.zeros((3, 5), np.int32))
    zp = tw.zeros((3,), "float64", pinned=True)
    assert zp.pinned and np.array_equal(np.asarray(zp), np.zeros(3))


def test_to_same_device_and_copy():
    a = random_array((5, 5), "float32", seed=23)
    d = tw.asarray(a, device="cuda:0")
    assert d.to("cuda:0") is d
    assert d.to(CUDA0, copy=False) is d
    c = d.to("cuda:0", copy=True)
    assert c.data_ptr != d.data_ptr and c.device == CUDA0
    assert same_bits(host(c), a)


# ---- errors ----------------------------------------------------------------------------------------------------

def test_host_only_exports_refuse_device_memory():
    t = tw.asarray(np.ones((2, 3), np.float32), device="cuda:0")
    with pytest.raises((TypeError, BufferError, ValueError)) as ei:
        np.asarray(t)
    assert "cuda" in str(ei.value).lower()
    with pytest.raises((TypeError, BufferError)):
        memoryview(t)


def test_invalid_device_index_is_refused_naming_it():
    h = tw.asarray(np.ones(3))
    for make in (lambda: tw.empty((2,), "float32", device="cuda:99"), lambda: h.to("cuda:99"),
                 lambda: tw.asarray(np.ones(3), device="cuda:99"),
                 lambda: tw.Subscriber("test/cuda/nosuchdevice", device="cuda:99")):
        with pytest.raises((ValueError, BufferError, IndexError)) as ei:
            make()
        assert not isinstance(ei.value, tw.CopyError)
        assert "99" in str(ei.value)


def test_copy_false_across_devices_raises_copy_error():
    h = tw.asarray(np.ones(4))
    with pytest.raises(tw.CopyError):
        h.to("cuda:0", copy=False)
    with pytest.raises(tw.CopyError):
        h.to("cuda_host", copy=False)
    d = h.to("cuda:0")
    with pytest.raises(tw.CopyError):
        d.to("cpu", copy=False)


# ---- the pool's bookkeeping ------------------------------------------------------------------------------------

def test_device_memory_is_returned_to_the_pool():
    gc.collect()
    tw.cuda.empty_cache()  # (earlier tests' copies may still hold blocks until the next allocation polls them)
    before = tw.cuda.device_pool_stats(0)["in_use_bytes"]
    pinned_before = tw.cuda.pinned_pool_stats()["in_use_bytes"]
    a = random_array((256, 300), "float32", seed=29)
    keep = []
    for _ in range(3):
        d = tw.asarray(a, device="cuda:0")
        keep += [d, d.T, kernels_or_skip(lambda: d.T.contiguous()), tw.empty((1000,), "uint8", device="cuda:0"),
                 tw.asarray(a).pin(), d.to("cuda_host")]
    assert tw.cuda.device_pool_stats(0)["in_use_bytes"] > before
    try:
        torch = need_torch()
    except pytest.skip.Exception:
        torch = None
    if torch is not None:
        y = torch.from_dlpack(keep[0])
        assert y.data_ptr() == keep[0].data_ptr
        keep.append(y)
    del d, keep
    if torch is not None:
        del y
    gc.collect()
    tw.cuda.empty_cache()  # (waits for this test's copies, whose buffers are held until they are done)
    assert tw.cuda.device_pool_stats(0)["in_use_bytes"] == before
    assert tw.cuda.pinned_pool_stats()["in_use_bytes"] == pinned_before


def test_scalar_conversions_of_a_device_tensor_copy_its_element():
    # As torch's item(): one element crosses to the host, after the tensor's stream.
    g = tw.asarray(np.array([[1.5, -2.0], [3.25, 4.0]]), device="cuda:0")
    assert g[1, 0].item() == 3.25 and float(g[0, 1]) == -2.0
    i = tw.asarray(np.array([7], np.int64), device="cuda:0")
    assert int(i) == 7 and operator.index(i[0]) == 7 and bool(i)
