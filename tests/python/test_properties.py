"""Property tests: random dtypes, shapes (0-d and zero-size included) and strided views (negative steps, stride 0
from broadcasting, offset slices, permutations) go through every path that supports their layout and come back
bit-exactly; zero-copy is proven by pointer identity and by a write through a writable side."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tensorwire as tw
from _helpers import flip_first, ptr, same_bits

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")

NUMPY_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
                "float64", "complex64", "complex128"]
ML_DTYPES = [n for n in ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                         "float8_e4m3b11fnuz", "float8_e3m4", "float8_e4m3", "float8_e8m0fnu", "float6_e2m3fn",
                         "float6_e3m2fn", "float4_e2m1fn", "int2", "int4", "uint2", "uint4"] if hasattr(ml_dtypes, n)]
TORCH_DTYPES = set(NUMPY_DTYPES) | {"bfloat16"}  # float8 needs a DLPack 1.1 consumer; PyTorch 2.13 asks for 1.0


def np_dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name)) if name in ML_DTYPES else np.dtype(name)


@st.composite
def base_arrays(draw, dtypes=NUMPY_DTYPES + ML_DTYPES):
    name = draw(st.sampled_from(dtypes))
    dt = np_dtype(name)
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6))
    n = int(np.prod(shape))
    raw = np.frombuffer(draw(st.binary(min_size=n * dt.itemsize, max_size=n * dt.itemsize)), dtype=np.uint8)
    if name == "bool":
        raw = raw & 1  # every byte a valid bool
    a = np.empty(shape, dtype=dt)
    a.reshape(-1).view(np.uint8)[:] = raw
    return name, a


def np_view(a: np.ndarray, index) -> np.ndarray:
    r = a[index]
    return r if isinstance(r, np.ndarray) else a[(*(index if isinstance(index, tuple) else (index,)), Ellipsis)]


@st.composite
def strided(draw, dtypes=NUMPY_DTYPES + ML_DTYPES, allow_negative=True):
    """(dtype name, a NumPy view of random bytes with a random layout)."""
    name, v = draw(base_arrays(dtypes))
    for _ in range(draw(st.integers(0, 2))):
        op = draw(st.sampled_from(["index", "permute", "broadcast", "offset"]))
        if op == "index":
            idx = draw(hnp.basic_indices(v.shape, min_dims=0, allow_newaxis=True, allow_ellipsis=True))
            if not allow_negative:
                idx = tuple(slice(s.start, s.stop, abs(s.step or 1)) if isinstance(s, slice) else s
                            for s in (idx if isinstance(idx, tuple) else (idx,)))
            v = np_view(v, idx)
        elif op == "permute" and v.ndim > 1:
            v = v.transpose(draw(st.permutations(range(v.ndim))))
        elif op == "broadcast":
            lead = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
            target = lead + tuple(draw(st.integers(0, 4)) if s == 1 else s for s in v.shape)
            v = np.broadcast_to(v, target)
        elif op == "offset" and v.ndim and v.shape[0] > 1:
            v = v[draw(st.integers(1, v.shape[0] - 1)):]
    return name, v


def element_strides(v: np.ndarray):
    return tuple(s // v.itemsize for s in v.strides)


def strides_match(t, v) -> bool:
    """Strides agree wherever they matter (a dimension of size <= 1 is never stepped through)."""
    return v.size == 0 or all(n <= 1 or ts == vs for n, ts, vs in zip(v.shape, t.strides, element_strides(v)))


def has_negative(v) -> bool:
    return any(n > 1 and s < 0 for n, s in zip(v.shape, v.strides))


def assert_write_through(write_side: np.ndarray, *watchers):
    """Flips a bit through `write_side` and checks that every watcher (a function returning bytes) sees it."""
    before = [w() for w in watchers]
    flip_first(write_side)
    try:
        after = [w() for w in watchers]
        assert all(a != b for a, b in zip(after, before)), "a write through one side is not visible on the other"
    finally:
        flip_first(write_side)
    assert [w() for w in watchers] == before


# ---- import from NumPy, export back to NumPy ----------------------------------------------------------------------
@given(strided())
def test_numpy_asarray_roundtrip_is_zero_copy(case):
    name, v = case
    t = tw.asarray(v)
    assert str(t.dtype) == name and t.shape == v.shape and t.size == v.size
    assert t.readonly == (not v.flags.writeable)
    assert strides_match(t, v)
    back = np.asarray(t)
    assert back.dtype == v.dtype and same_bits(back, v)
    if v.size:
        assert t.data_ptr == ptr(v) == ptr(back)
        assert back.strides == v.strides or strides_match(tw.asarray(back), v)
        if v.flags.writeable:
            assert_write_through(back, v.tobytes)
    # the buffer protocol and the array interface describe the same memory for NumPy's own types
    if name in NUMPY_DTYPES:
        m = np.asarray(memoryview(t))
        assert same_bits(m, v) and (not v.size or ptr(m) == ptr(v))


@given(strided())
def test_contiguous_and_is_contiguous_agree_with_numpy(case):
    _, v = case
    t = tw.asarray(v)
    if v.size:
        assert t.is_contiguous("C") == v.flags.c_contiguous
        assert t.is_contiguous("F") == v.flags.f_contiguous
    c = t.contiguous()
    assert same_bits(np.asarray(c), v.copy(order="C"))
    assert c.is_contiguous("C")
    if t.is_contiguous():
        assert c is t
    else:
        assert c is not t and not c.readonly and (not v.size or c.data_ptr != t.data_ptr)
        assert c.strides == element_strides(v.copy(order="C"))


@given(strided(), st.sampled_from(["C", "F", "any"]))
def test_copy_orders_roundtrip(case, order):
    _, v = case
    t = tw.asarray(v)
    c = t.copy(order)
    assert same_bits(np.asarray(c), v)
    assert c.is_contiguous({"C": "C", "F": "F", "any": "any"}[order])
    if v.size:
        assert c.data_ptr != t.data_ptr
    if order == "F":
        assert np.asarray(c).flags.f_contiguous


@given(strided(NUMPY_DTYPES))
def test_numpy_from_dlpack(case):
    _, v = case
    t = tw.asarray(v)
    n = np.from_dlpack(t)
    assert same_bits(n, v)
    if v.size and not has_negative(v):
        assert ptr(n) == ptr(v)  # zero-copy
        assert n.flags.writeable == v.flags.writeable
        if v.flags.writeable:
            assert_write_through(n, v.tobytes)
    elif v.size:
        assert ptr(n) != ptr(v)  # negative strides are exported as a copy


def torch_bytes(x) -> bytes:
    """The elements' bytes in C order (a fresh tensor: PyTorch's contiguous() keeps odd strides of size-1 dims)."""
    y = torch.empty(tuple(x.shape), dtype=x.dtype)
    y.copy_(x)
    return y.reshape(-1).view(torch.uint8).numpy().tobytes()


@given(strided(sorted(TORCH_DTYPES)))
def test_torch_from_dlpack(case):
    _, v = case
    t = tw.asarray(v)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch warns when it is handed read-only memory
        x = torch.from_dlpack(t)
    assert tuple(x.shape) == v.shape
    assert torch_bytes(x) == v.tobytes()
    if v.size and not has_negative(v):
        assert x.data_ptr() == t.data_ptr == ptr(v)
        assert all(n <= 1 or a == b for n, a, b in zip(v.shape, x.stride(), t.strides))
        if v.flags.writeable:
            assert_write_through(np.asarray(t), v.tobytes, lambda: torch_bytes(x))


@given(strided(), st.sampled_from([2, 4, 5]))
def test_pickle_roundtrip(case, protocol):
    name, v = case
    t = tw.asarray(v)
    t.metadata["name"] = name
    if protocol == 5:
        bufs = []
        r = pickle.loads(pickle.dumps(t, protocol=5, buffer_callback=bufs.append), buffers=bufs)
        if v.size and t.is_contiguous():
            assert r.data_ptr == t.data_ptr  # out of band and rebuilt in place: no copy at all
    else:
        r = pickle.loads(pickle.dumps(t, protocol=protocol))
    assert str(r.dtype) == name and r.shape == v.shape and r.readonly == t.readonly
    assert r.metadata["name"] == name
    assert same_bits(np.asarray(r), v)


@given(strided(allow_negative=False), st.booleans())
def test_tw_dlpack_to_tw(case, versioned):
    """tensorwire as both producer and consumer: the same view comes back, zero-copy."""
    _, v = case
    t = tw.asarray(v)
    if not versioned and (t.readonly or t.dtype.bits < 8):
        # a legacy capsule can say neither "read-only" nor "one sub-byte element per byte": refused, not guessed
        with pytest.raises(BufferError):
            t.__dlpack__()
        return
    cap = t.__dlpack__(max_version=(1, 3) if versioned else None)
    u = tw.from_dlpack(cap)
    assert u.shape == t.shape and u.dtype == t.dtype and u.readonly == t.readonly
    assert same_bits(np.asarray(u), v)
    if v.size:
        assert u.data_ptr == t.data_ptr and strides_match(u, v)


@given(st.data())
def test_torch_views_import_zero_copy(data):
    name = data.draw(st.sampled_from(["float32", "int64", "uint8", "bfloat16", "bool", "float16", "complex64"]))
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5))
    n = int(np.prod(shape))
    x = torch.arange(n, dtype=torch.int64).reshape(shape)
    x = (x % 2 == 0) if name == "bool" else x.to(getattr(torch, name))
    if len(shape) > 1:
        x = x.permute(*data.draw(st.permutations(range(len(shape)))))
    d = data.draw(st.integers(0, x.ndim - 1))
    step = data.draw(st.integers(1, 3))
    start = data.draw(st.integers(0, max(0, x.shape[d] - 1)))
    x = x.narrow(d, start, x.shape[d] - start)[(slice(None),) * d + (slice(None, None, step),)]
    t = tw.asarray(x)
    assert t.shape == tuple(x.shape) and t.strides == tuple(x.stride()) and str(t.dtype) == name
    if x.numel():
        assert t.data_ptr == x.data_ptr()
    assert np.asarray(t).tobytes() == torch_bytes(x)
