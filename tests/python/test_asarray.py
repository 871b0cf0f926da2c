"""tw.asarray / tw.from_dlpack: zero-copy import from every producer and protocol, the copy= contract, dtype and
device spellings, and the final error that lists every protocol's refusal."""

from __future__ import annotations

import array
import ctypes
import gc
import sys

import numpy as np
import pytest

import tensorwire as tw
from _helpers import flip_first, jax_on_cpu, ptr, same_bits, NO_CUDA_DRIVER, needs_no_cuda_driver

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")


# ---- NumPy ------------------------------------------------------------------------------------------------------
def test_numpy_zero_copy_contiguous():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = tw.asarray(a)
    assert t.data_ptr == ptr(a)
    assert t.shape == (2, 3, 4) and t.strides == (12, 4, 1)
    assert str(t.dtype) == "float32" and str(t.device) == "cpu"
    assert t.nbytes == a.nbytes and t.readonly is False
    assert t.is_contiguous() and t.ndim == 3 and t.size == 24 and t.itemsize == 4
    assert t.dtype == "float32" and t.dtype == np.dtype(np.float32) and t.dtype == tw.float32
    assert t.device == "cpu" and t.device == tw.Device("cpu")
    # a write through tensorwire's NumPy export is visible in the source
    np.asarray(t)[1, 2, 3] = -7.0
    assert a[1, 2, 3] == -7.0


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a.T,
        lambda a: a[:, ::2],
        lambda a: a[::-1, 1:],
        lambda a: a[1:, ::-2],
        lambda a: a[1, :],
    ],
    ids=["transpose", "step2", "neg-rows", "neg-step2", "row"],
)
def test_numpy_strided_views_zero_copy(make):
    base = np.arange(30, dtype=np.int64).reshape(5, 6)
    v = make(base)
    t = tw.asarray(v)
    assert t.data_ptr == ptr(v)
    assert t.shape == v.shape
    assert t.strides == tuple(s // v.itemsize for s in v.strides)
    back = np.asarray(t)
    assert ptr(back) == ptr(v) and back.strides == v.strides
    assert np.array_equal(back, v)
    # the allocation is the source's buffer, element 0 sits byte_offset bytes into it
    base_addr, size = t.allocation
    assert base_addr + t.byte_offset == t.data_ptr
    assert base_addr >= ptr(base) and base_addr + size <= ptr(base) + base.nbytes


def test_numpy_readonly_arrives_readonly():
    a = np.arange(6.0)
    a.flags.writeable = False
    t = tw.asarray(a)
    assert t.readonly is True and t.data_ptr == ptr(a)
    assert not np.asarray(t).flags.writeable
    m = memoryview(t)
    assert m.readonly
    with pytest.raises((BufferError, TypeError)):
        ctypes.c_char.from_buffer(t)  # asks for a writable buffer
    # a legacy capsule cannot say "read-only", so it is refused...
    with pytest.raises(BufferError):
        t.__dlpack__()
    # ...but a versioned one carries the flag: consumers get a read-only view of the same memory
    n = np.from_dlpack(t)
    assert ptr(n) == ptr(a) and not n.flags.writeable
    cap = t.__dlpack__(max_version=(1, 0))
    assert tw.from_dlpack(cap).readonly


def test_numpy_zero_size_and_0d():
    z = np.zeros((3, 0, 2), dtype=np.float64)
    t = tw.asarray(z)
    assert t.shape == (3, 0, 2) and t.size == 0 and t.nbytes == 0
    assert np.asarray(t).shape == (3, 0, 2)
    s = np.array(3.5, dtype=np.float32)
    t0 = tw.asarray(s)
    assert t0.shape == () and t0.strides == () and t0.ndim == 0 and t0.size == 1
    assert t0.data_ptr == ptr(s)
    assert np.asarray(t0)[()] == 3.5
    with pytest.raises(TypeError):
        len(t0)


# ---- copy= semantics --------------------------------------------------------------------------------------------
def test_copy_none_is_zero_copy_true_gives_new_memory_false_never_copies():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert tw.asarray(a, copy=None).data_ptr == ptr(a)
    assert tw.asarray(a, copy=False).data_ptr == ptr(a)
    c = tw.asarray(a, copy=True)
    assert c.data_ptr != ptr(a)
    assert np.array_equal(np.asarray(c), a)
    np.asarray(c)[0, 0] = 99
    assert a[0, 0] == 0  # independent memory
    # copy=True of a strided view gives a C-contiguous copy with the same values
    v = a[:, ::-2]
    cv = tw.asarray(v, copy=True)
    assert cv.is_contiguous() and np.array_equal(np.asarray(cv), v)
    with pytest.raises(TypeError):
        tw.asarray(a, copy="yes")


def test_copy_error_is_buffer_error_and_value_error():
    assert issubclass(tw.CopyError, BufferError)
    assert issubclass(tw.CopyError, ValueError)
    assert tw.CopyError.__module__ == "tensorwire"


@pytest.mark.parametrize("dt", [">f8", ">i4", ">u2", ">c8", ">f4"])
def test_big_endian_copy_false_refused_copy_none_swapped(dt):
    a = (np.arange(10) * 3 - 7).astype(dt)
    with pytest.raises(tw.CopyError) as ei:
        tw.asarray(a, copy=False)
    assert isinstance(ei.value, BufferError) and isinstance(ei.value, ValueError)
    assert "byte order" in str(ei.value)
    t = tw.asarray(a)  # copy=None: byte-swapped into a correct native copy
    native = a.astype(a.dtype.newbyteorder("="))
    out = np.asarray(t)
    assert out.dtype == native.dtype and out.dtype.isnative
    assert np.array_equal(out, native)
    assert t.data_ptr != ptr(a)
    t2 = tw.asarray(a, copy=True)
    assert np.array_equal(np.asarray(t2), native)


def test_big_endian_strided_view_swapped_correctly():
    a = np.arange(24, dtype=">f4").reshape(4, 6)[::-1, ::2]
    out = np.asarray(tw.asarray(a))
    assert np.array_equal(out, a.astype("=f4"))


# ---- buffer protocol ---------------------------------------------------------------------------------------------
def test_bytes_is_readonly_zero_copy():
    b = b"\x01\x02\x03\x04"
    t = tw.asarray(b)
    assert t.readonly is True and str(t.dtype) == "uint8" and t.shape == (4,)
    assert np.asarray(t).tolist() == [1, 2, 3, 4]
    assert not np.asarray(t).flags.writeable


def test_bytearray_is_writable_zero_copy():
    b = bytearray(b"\x00" * 8)
    t = tw.asarray(b)
    assert t.readonly is False and t.shape == (8,) and str(t.dtype) == "uint8"
    np.asarray(t)[3] = 42
    assert b[3] == 42
    addr = ctypes.addressof(ctypes.c_char.from_buffer(b))
    assert t.data_ptr == addr


def test_memoryview_with_strides_and_format():
    a = np.arange(24, dtype=np.int16).reshape(4, 6)
    m = memoryview(a)[::2]  # a strided memoryview: only the buffer protocol describes it
    t = tw.asarray(m)
    assert str(t.dtype) == "int16" and t.shape == (2, 6) and t.strides == (12, 1)
    assert t.data_ptr == ptr(a)
    assert np.array_equal(np.asarray(t), a[::2])
    ro = memoryview(bytes(range(6))).cast("B", (2, 3))
    tro = tw.asarray(ro)
    assert tro.readonly and tro.shape == (2, 3)


def test_array_array():
    arr = array.array("d", [1.5, -2.0, 3.25])
    t = tw.asarray(arr)
    assert str(t.dtype) == "float64" and t.shape == (3,) and not t.readonly
    addr, _ = arr.buffer_info()
    assert t.data_ptr == addr
    np.asarray(t)[1] = 8.0
    assert arr[1] == 8.0
    assert str(tw.asarray(array.array("i", [1])).dtype) == "int32"
    assert str(tw.asarray(array.array("B", [1])).dtype) == "uint8"


@pytest.mark.parametrize(
    "np_dtype, fmt, tw_name",
    [
        (np.float16, "e", "float16"),
        (np.bool_, "?", "bool"),
        (np.complex64, "Zf", "complex64"),
        (np.complex128, "Zd", "complex128"),
    ],
)
def test_pep3118_formats_from_numpy(np_dtype, fmt, tw_name):
    a = (np.arange(6) % 2 == 1) if np_dtype is np.bool_ else (np.arange(6) * 1.5 - 2).astype(np_dtype)
    m = memoryview(a)
    assert m.format == fmt
    t = tw.asarray(m)
    assert str(t.dtype) == tw_name and t.data_ptr == ptr(a)
    assert same_bits(np.asarray(t), a)


def test_pep3118_standard_sizes_and_byteswap():
    _testbuffer = pytest.importorskip("_testbuffer", reason="CPython's _testbuffer module is not built here")
    nd = _testbuffer.ndarray
    # '<i' with standard sizes is a 4-byte int on every platform
    x = nd([1, -2, 3], shape=[3], format="<i")
    t = tw.asarray(x)
    assert str(t.dtype) == "int32" and np.asarray(t).tolist() == [1, -2, 3]
    # '=l' is a standard-size (4-byte) long, unlike native 'l'
    t = tw.asarray(nd([5, 6], shape=[2], format="=l"))
    assert str(t.dtype) == "int32" and np.asarray(t).tolist() == [5, 6]
    t = tw.asarray(nd([7, 8], shape=[2], format="<q"))
    assert str(t.dtype) == "int64" and np.asarray(t).tolist() == [7, 8]
    # '>d' and '!I' are big-endian: swapped into a copy, refused with copy=False
    be = nd([1.5, -2.25, 1e300], shape=[3], format=">d")
    assert np.asarray(tw.asarray(be)).tolist() == [1.5, -2.25, 1e300]
    with pytest.raises(tw.CopyError):
        tw.asarray(be, copy=False)
    assert np.asarray(tw.asarray(nd([1, 2**31], shape=[2], format="!I"))).tolist() == [1, 2**31]


def test_pep3118_big_endian_from_numpy_memoryview():
    a = np.array([1.0, 2.0, -3.5], dtype=">f8")
    m = memoryview(a)
    assert m.format == ">d"
    assert np.asarray(tw.asarray(m)).tolist() == [1.0, 2.0, -3.5]
    with pytest.raises(tw.CopyError):
        tw.asarray(m, copy=False)


def test_pep3118_ctypes_little_endian_format():
    arr = (ctypes.c_int32 * 4)(1, 2, 3, 4)
    assert memoryview(arr).format == "<i"
    t = tw.asarray(arr)
    assert str(t.dtype) == "int32" and t.data_ptr == ctypes.addressof(arr)
    assert np.asarray(t).tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("x", [np.datetime64(1, "s"), np.timedelta64(5, "ns"), np.array([1, 2], "M8[s]"),
                               np.array([3], "m8[ms]")])
def test_datetimes_are_refused_never_reinterpreted_as_bytes(x):
    # A datetime64 scalar's buffer is its 8 raw bytes: it arrived as uint8[8]. And the array's refusal named the
    # wrong thing ("the size after the kind must be a positive integer").
    with pytest.raises(BufferError, match=r"datetime/timedelta arrays have no tensor dtype; view them as int64"):
        tw.asarray(x)
    assert tw.asarray(np.asarray(x).view("int64")).dtype == tw.int64


def test_masked_arrays_with_masked_elements_are_refused():
    # Every protocol a MaskedArray speaks exports its data and none its mask: the masked 2 arrived as a value (into
    # Arrow too, which could have held a null), silently.
    m = np.ma.masked_array([1, 2, 3], mask=[0, 1, 0])
    for convert in (tw.asarray, tw.to_arrow, tw.to_torch, tw.from_dlpack, lambda x: tw.asarray(x, copy=False)):
        with pytest.raises(TypeError, match="MaskedArray has masked elements, and a tensor has no mask"):
            convert(m)
    assert tw.asarray(m.filled(0)).tolist() == [1, 0, 3]
    assert tw.asarray(m.data).tolist() == [1, 2, 3]
    # nothing masked: nothing to lose (a view, as of any array)
    clear = np.ma.masked_array(np.arange(4.0), mask=[False] * 4)
    t = tw.asarray(clear)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0] and t.data_ptr == clear.data.ctypes.data
    assert tw.asarray(np.ma.masked_array([5, 6])).tolist() == [5, 6]
    assert tw.from_dlpack(np.ma.masked_array([5.0])).tolist() == [5.0]
    # a structured mask cannot say what it hides (its any() raises): refused, in tensorwire's words
    record = np.ma.masked_array(np.zeros(2, [("a", "i4")]), mask=[(True,), (False,)])
    with pytest.raises(TypeError, match="MaskedArray has masked elements"):
        tw.asarray(record)


def test_pep3118_suboffsets_refused():
    _testbuffer = pytest.importorskip("_testbuffer", reason="CPython's _testbuffer module is not built here")
    x = _testbuffer.ndarray(list(range(12)), shape=[3, 4], format="i",
                            flags=_testbuffer.ND_PIL | _testbuffer.ND_WRITABLE)
    assert x.suboffsets  # a PIL-style indirect array
    with pytest.raises(BufferError) as ei:
        tw.asarray(x)
    assert "buffer protocol" in str(ei.value)


def test_pep3118_bad_formats_refused():
    _testbuffer = pytest.importorskip("_testbuffer", reason="CPython's _testbuffer module is not built here")
    nd = _testbuffer.ndarray
    for fmt, items in [("ii", [1, 2]), ("T{i:a:}", None), ("3s", [b"abc"]), ("P", [0])]:
        try:
            x = nd(items, shape=[1], format=fmt) if items is not None else None
        except Exception:
            continue
        if x is None:
            continue
        with pytest.raises((BufferError, TypeError, ValueError)) as ei:
            tw.asarray(x)
        assert "buffer" in str(ei.value)


# ---- __array_interface__ ----------------------------------------------------------------------------------------
class AI:
    """An object that only carries an __array_interface__ (plus whatever keeps its memory alive)."""

    def __init__(self, d, keep=None):
        self.__array_interface__ = d
        self._keep = keep


class BufWithAI(bytearray):
    """A buffer exporter that also describes itself with an __array_interface__ whose data is None."""


def test_array_interface_data_pointer_tuple():
    src = np.arange(12, dtype=np.float64)
    obj = AI({"version": 3, "shape": (3, 4), "typestr": "<f8", "data": (ptr(src), False)}, keep=src)
    t = tw.asarray(obj)
    assert t.data_ptr == ptr(src) and t.shape == (3, 4) and not t.readonly
    assert np.array_equal(np.asarray(t), src.reshape(3, 4))
    ro = tw.asarray(AI({"version": 3, "shape": (12,), "typestr": "<f8", "data": (ptr(src), True)}, keep=src))
    assert ro.readonly


def test_array_interface_offset_ignored_with_pointer_tuple():
    src = np.arange(12, dtype=np.float64)
    obj = AI({"version": 3, "shape": (4,), "typestr": "<f8", "data": (ptr(src), False), "offset": 16}, keep=src)
    t = tw.asarray(obj)
    assert t.data_ptr == ptr(src)
    assert np.asarray(t).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_array_interface_data_is_buffer_offset_applies():
    buf = bytearray(np.arange(8, dtype=np.int32).tobytes())
    obj = AI({"version": 3, "shape": (3,), "typestr": "<i4", "data": buf, "offset": 8})
    t = tw.asarray(obj)
    assert np.asarray(t).tolist() == [2, 3, 4]
    assert t.data_ptr == ctypes.addressof(ctypes.c_char.from_buffer(buf)) + 8
    np.asarray(t)[0] = -1
    assert np.frombuffer(buf, np.int32)[2] == -1
    # a readonly buffer gives a readonly tensor
    tro = tw.asarray(AI({"version": 3, "shape": (2,), "typestr": "<i4", "data": bytes(8)}))
    assert tro.readonly


def test_array_interface_data_none_uses_object_buffer_with_offset():
    b = BufWithAI(np.arange(6, dtype=np.int16).tobytes())
    b.__array_interface__ = {"version": 3, "shape": (2, 2), "typestr": "<i2", "data": None, "offset": 4}
    t = tw.asarray(b)
    assert np.asarray(t).tolist() == [[2, 3], [4, 5]]
    assert t.data_ptr == ctypes.addressof(ctypes.c_char.from_buffer(b)) + 4


def test_array_interface_span_outside_buffer_refused():
    buf = bytearray(16)
    with pytest.raises((ValueError, IndexError, BufferError)) as ei:
        tw.asarray(AI({"version": 3, "shape": (5,), "typestr": "<i4", "data": buf}))
    assert "__array_interface__" in str(ei.value)
    with pytest.raises(ValueError):
        tw.asarray(AI({"version": 3, "shape": (1,), "typestr": "<i4", "data": buf, "offset": 17}))


def test_array_interface_strides_and_negative_strides():
    src = np.arange(12, dtype=np.float32)
    # last element first, stride -4 bytes: the pointer is element 0
    obj = AI({"version": 3, "shape": (4,), "typestr": "<f4", "data": (ptr(src) + 44, False), "strides": (-4,)},
             keep=src)
    t = tw.asarray(obj)
    assert t.strides == (-1,) and t.data_ptr == ptr(src) + 44
    assert np.asarray(t).tolist() == [11.0, 10.0, 9.0, 8.0]


@pytest.mark.parametrize(
    "patch, exc, key",
    [
        ({"shape": "ab"}, TypeError, "shape"),
        ({"typestr": 4}, TypeError, "typestr"),
        ({"data": [1, False]}, (TypeError, BufferError), "data"),
        ({"data": (1.5, False)}, TypeError, "data"),
        ({"data": (16, 1)}, TypeError, "data"),
        ({"version": "3"}, TypeError, "version"),
        ({"strides": (1.5,)}, TypeError, "strides"),
        ({"version": 2}, BufferError, "version"),
        ({"shape": (-2,)}, ValueError, "negative"),
        ({"typestr": "|O8"}, BufferError, "typestr"),
        ({"strides": (3,)}, BufferError, "multiple of the item size"),
        ({"mask": object()}, BufferError, "mask"),
    ],
)
def test_array_interface_malformed(patch, exc, key):
    src = np.arange(8, dtype=np.float64)
    d = {"version": 3, "shape": (4,), "typestr": "<f8", "data": (ptr(src), False)}
    d.update(patch)
    with pytest.raises(exc) as ei:
        tw.asarray(AI(d, keep=src))
    assert key in str(ei.value)


# ---- ml_dtypes --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                                  "int4", "uint4"])
def test_ml_dtypes_numpy_arrays_import_with_their_dtype(name):
    if not hasattr(ml_dtypes, name):
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {name}")
    dt = np.dtype(getattr(ml_dtypes, name))
    a = np.arange(-3, 9).astype(dt).reshape(3, 4)
    t = tw.asarray(a)
    assert str(t.dtype) == name and t.dtype == dt
    assert t.data_ptr == ptr(a)
    back = np.asarray(t)
    assert back.dtype == dt and ptr(back) == ptr(a) and same_bits(back, a)
    # strided views keep the dtype too
    v = a[::-1, 1::2]
    tv = tw.asarray(v)
    assert str(tv.dtype) == name and tv.data_ptr == ptr(v) and same_bits(np.asarray(tv), v)


def test_torch_bfloat16_import():
    x = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    t = tw.asarray(x)
    assert str(t.dtype) == "bfloat16" and t.data_ptr == x.data_ptr()
    back = np.asarray(t)
    assert back.dtype == np.dtype(ml_dtypes.bfloat16)
    assert back.astype(np.float32).tolist() == x.float().tolist()


def test_torch_float8_import():
    x = torch.arange(6, dtype=torch.float32).to(torch.float8_e4m3fn)
    t = tw.asarray(x)
    assert str(t.dtype) == "float8_e4m3fn" and t.data_ptr == x.data_ptr()
    assert np.asarray(t).dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    assert np.asarray(t).astype(np.float32).tolist() == x.float().tolist()


# ---- PyTorch ----------------------------------------------------------------------------------------------------
def test_torch_permuted_non_contiguous_zero_copy():
    x = torch.arange(24.0).reshape(2, 3, 4).permute(2, 0, 1)
    t = tw.asarray(x)
    assert t.data_ptr == x.data_ptr()
    assert t.shape == (4, 2, 3) and t.strides == (1, 12, 4) == tuple(x.stride())
    assert t.byte_offset == 0 and t.nbytes == 96 and t.readonly is False
    assert str(t.dtype) == "float32" and str(t.device) == "cpu"
    assert not t.is_contiguous() and not t.is_contiguous("F") and t.is_contiguous("any")
    assert np.array_equal(np.asarray(t), x.numpy())
    np.asarray(t)[3, 1, 2] = -1.0
    assert x[3, 1, 2].item() == -1.0


def test_torch_storage_offset_becomes_byte_offset():
    base = torch.arange(20, dtype=torch.float64)
    x = base[5:].reshape(3, 5)[:, 1:]
    t = tw.asarray(x)
    assert t.data_ptr == x.data_ptr()
    assert t.allocation[0] + t.byte_offset == t.data_ptr
    assert np.array_equal(np.asarray(t), x.numpy())


def test_torch_keeps_source_alive():
    x = torch.arange(1000.0)
    addr = x.data_ptr()
    t = tw.asarray(x)
    del x
    gc.collect()
    junk = [torch.full((1000,), 5.0) for _ in range(20)]  # would reuse the memory if it had been freed
    assert t.data_ptr == addr
    assert np.asarray(t)[999] == 999.0
    del junk


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "float32", "float64",
                                   "complex64", "complex128", "bfloat16"])
def test_torch_dtypes_and_names(dtype):
    tdt = getattr(torch, dtype)
    x = torch.zeros((2, 3), dtype=tdt)
    t = tw.asarray(x)
    assert str(t.dtype) == dtype
    assert t.dtype == tw.DType(dtype)


def test_dtype_names_and_constants():
    assert str(tw.DType("float32")) == "float32"
    assert str(tw.bfloat16) == "bfloat16" and tw.bfloat16.bits == 16
    assert str(tw.float8_e4m3fn) == "float8_e4m3fn" and tw.float8_e4m3fn.itemsize == 1
    assert str(tw.bool_) == "bool" and tw.bool_ == "bool"
    assert tw.DType("complex128").itemsize == 16
    assert hash(tw.DType("int8")) == hash(tw.int8)
    assert tw.DType("float32") != tw.DType("float64")
    with pytest.raises((ValueError, TypeError, BufferError)):
        tw.DType("float33")


def test_device_strings():
    assert str(tw.Device("cpu")) == "cpu"
    d = tw.Device("cuda:1")
    assert str(d) == "cuda:1" and d.type == "cuda" and d.index == 1
    assert tw.Device((1, 0)) == "cpu"
    assert tw.Device(torch.device("cpu")) == "cpu"
    t = tw.asarray(np.zeros(2), device="cpu")
    assert str(t.device) == "cpu" and t.device.type == "cpu"
    if NO_CUDA_DRIVER:
        with pytest.raises(BufferError):
            tw.asarray(np.zeros(2), device="cuda:0")
    else:  # a GPU machine: the array is copied there
        assert str(tw.asarray(np.zeros(2), device="cuda:0").device) == "cuda:0"
    with pytest.raises((ValueError, TypeError)):
        tw.asarray(np.zeros(2), device="tpu:x")
    with pytest.raises(ValueError):
        tw.Device((2**40, 0))  # out of range: a precise error, not a failed C++ cast
    with pytest.raises(ValueError):
        tw.Device((2, -1))
    with pytest.raises(BufferError):
        tw.Device((999, 0))
    assert tw.Device((2, 3)) == "cuda:3"


# ---- JAX --------------------------------------------------------------------------------------------------------
def test_jax_zero_copy():
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    with jax_on_cpu():
        x = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4)
        jb = jnp.ones((2, 2), dtype=jnp.bfloat16)
    t = tw.asarray(x)
    assert t.data_ptr == x.unsafe_buffer_pointer()
    assert t.shape == (3, 4) and str(t.dtype) == "float32"
    assert np.array_equal(np.asarray(t), np.asarray(x))
    tb = tw.asarray(jb)
    assert str(tb.dtype) == "bfloat16" and tb.data_ptr == jb.unsafe_buffer_pointer()


# ---- DLPack -----------------------------------------------------------------------------------------------------
def test_from_dlpack_signature_and_zero_copy():
    x = torch.arange(10.0)[::2]
    t = tw.from_dlpack(x, device=None, copy=None)
    assert t.data_ptr == x.data_ptr() and t.strides == (2,)
    c = tw.from_dlpack(x, copy=True)
    assert c.data_ptr != x.data_ptr() and np.array_equal(np.asarray(c), x.numpy())
    with pytest.raises(TypeError):
        tw.from_dlpack(np.arange(3).tolist())
    a = np.arange(4.0)
    assert tw.from_dlpack(a).data_ptr == ptr(a)


def test_raw_dlpack_capsule_from_torch():
    x = torch.arange(6.0).reshape(2, 3)
    cap = x.__dlpack__()
    t = tw.asarray(cap)
    assert t.data_ptr == x.data_ptr() and t.shape == (2, 3)
    assert np.array_equal(np.asarray(t), x.numpy())
    # the capsule was consumed: both entry points refuse it with a precise message
    with pytest.raises(ValueError) as ei:
        tw.asarray(cap)
    assert "consumed" in str(ei.value)
    with pytest.raises(ValueError) as ei:
        tw.from_dlpack(cap)
    assert "consumed" in str(ei.value)


def test_raw_versioned_capsule_from_torch():
    x = torch.arange(6.0)
    cap = x.__dlpack__(max_version=(1, 0))
    t = tw.from_dlpack(cap)
    assert t.data_ptr == x.data_ptr()
    flip = np.asarray(t)
    flip[0] = 100.0
    assert x[0].item() == 100.0


def test_non_dlpack_capsule_refused():
    import datetime

    cap = datetime.datetime_CAPI
    with pytest.raises(TypeError) as ei:
        tw.asarray(cap)
    assert "not a DLPack capsule" in str(ei.value)


# ---- the final error ----------------------------------------------------------------------------------------------
def test_no_protocol_is_type_error():
    with pytest.raises(TypeError) as ei:
        tw.asarray(object())
    msg = str(ei.value)
    for proto in ["__dlpack__", "__cuda_array_interface__", "__array_interface__", "buffer protocol"]:
        assert proto in msg
    # (lists, tuples and Python scalars are converted as NumPy converts them: test_python_lists_tuples_and_...)


class Everything:
    """Offers four protocols, each broken in its own way."""

    def __dlpack__(self, **kw):
        raise BufferError("producer says no")

    def __dlpack_device__(self):
        return (1, 0)

    __cuda_array_interface__ = {"version": 3, "shape": (2,), "typestr": "<f4", "data": (0xDEAD0000, False),
                                "stream": 0}
    __array_interface__ = {"version": 3, "shape": (2,), "typestr": "<f4", "data": (0, False)}


def test_final_error_lists_every_refusal():
    with pytest.raises(Exception) as ei:
        tw.asarray(Everything(), device="cuda:0")
    msg = str(ei.value)
    assert "__dlpack__: " in msg and "producer says no" in msg
    assert "__cuda_array_interface__: " in msg and "'stream' is 0" in msg
    assert "__array_interface__: " in msg
    assert isinstance(ei.value, (BufferError, ValueError, TypeError))
    with pytest.raises(Exception) as ei:
        tw.asarray(Everything())
    msg = str(ei.value)
    assert msg.count("\n  - ") == 3, msg


class CaiStream:
    def __init__(self, stream):
        self.__cuda_array_interface__ = {"version": 3, "shape": (2,), "typestr": "<f4", "data": (0xDEAD0000, False),
                                         "stream": stream}


@pytest.mark.parametrize("stream", [3, 7, 4095])
def test_a_cuda_array_interface_stream_that_cannot_be_a_handle_is_refused_before_the_driver(stream):
    # A handle is the address of the driver's stream object, never in the first page; the driver does not check
    # handles, so a stream index passed as one (3) must never reach it.
    with pytest.raises(ValueError, match=f"'stream' {stream} is neither 1 .* nor a stream handle"):
        tw.asarray(CaiStream(stream), device="cuda:0")


@pytest.mark.parametrize("stream", ["x", 1.5, True, b"1"])
def test_asarray_refuses_a_stream_that_is_no_stream_even_for_host_memory(stream):
    # (a CPU producer is never handed a stream, so stream='x' was silently ignored)
    with pytest.raises(TypeError, match=rf"asarray: stream must be None, an int .* not {type(stream).__name__}"):
        tw.asarray(np.ones(3), stream=stream)
    # a stream is a CUDA producer's business: ignored for host memory, but checked as Tensor.to checks it
    for ok in (-1, 1, 2, 0x7F0000001000):
        assert tw.asarray(np.ones(3), stream=ok).shape == (3,)


@pytest.mark.parametrize("stream, text", [(0, "stream 0 is ambiguous"), (3, "stream 3 is neither 1"),
                                          (-5, "stream -5 is not a stream"), (2**70, "stream")])
def test_asarray_refuses_a_stream_value_no_producer_may_be_handed(stream, text):
    # (these were passed on as given: PyTorch asserts on 0, and a value like 3 reaches the driver as a handle)
    with pytest.raises((ValueError, OverflowError), match=text):
        tw.asarray(np.ones(3), stream=stream)


class _Stream:
    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


class _FakeCuda:
    """Claims CUDA memory and records what its __dlpack__ is asked (the capsule is a CPU one: it is never read)."""

    def __init__(self):
        self.calls = []

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, **kw):
        self.calls.append(kw)
        raise BufferError("_FakeCuda: recorded")


def test_asarray_hands_a_cuda_producer_the_stream_objects_handle_as_an_int():
    # (a stream object was passed on as the object, which PyTorch's __dlpack__ refuses: "stream must be int")
    for given, handed in [(_Stream(0x7F0000002000), 0x7F0000002000), (_Stream(0), 1), (2, 2), (-1, -1)]:
        p = _FakeCuda()
        with pytest.raises(BufferError):
            tw.asarray(p, stream=given)
        assert p.calls and p.calls[0]["stream"] == handed and type(p.calls[0]["stream"]) is int


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11's")
def test_a_producers_own_dlpack_error_says_what_tensorwire_asked_of_it():
    class ClaimsCuda:  # says CUDA, hands NumPy's capsule: NumPy refuses the stream a CUDA producer gets
        def __dlpack__(self, **kw):
            return np.zeros(3).__dlpack__(**kw)

        def __dlpack_device__(self):
            return (2, 0)

    with pytest.raises(RuntimeError, match="NumPy only supports stream=None") as e:
        tw.from_dlpack(ClaimsCuda())
    assert e.value.__notes__ == ["(raised by ClaimsCuda.__dlpack__(max_version=" + repr(tw.DLPACK_VERSION) +
                                 ", stream=1), called by tensorwire; its __dlpack_device__() said cuda:0)"]


@pytest.mark.parametrize("stream", [3, 4095])
def test_a_stream_argument_that_cannot_be_a_handle_is_refused(stream):
    with pytest.raises(ValueError, match=f"stream {stream} is neither 1 .* nor a stream handle"):
        tw.asarray(np.ones(3)).to("cpu", stream=stream)


def test_write_through_import_is_visible():
    a = np.arange(8, dtype=np.uint16)
    t = tw.asarray(a)
    flip_first(np.asarray(t))
    assert a[0] == 1


def test_asarray_of_tensor_returns_it_or_copies():
    t = tw.asarray(np.arange(4.0))
    assert tw.asarray(t) is t
    assert tw.asarray(t, copy=False) is t
    c = tw.asarray(t, copy=True)
    assert c is not t and c.data_ptr != t.data_ptr
    assert np.array_equal(np.asarray(c), np.asarray(t))


def test_version_attributes():
    assert isinstance(tw.__version__, str) and tw.__version__.count(".") >= 1
    assert tw.DLPACK_VERSION >= (1, 0)
    assert sys.getrefcount(tw) > 0


# ---- what asarray asks a DLPack producer for --------------------------------------------------------------------
class RecordingProducer:
    """Forwards __dlpack__ to a real producer and records the keyword arguments it was called with."""

    def __init__(self, inner, device=None):
        self.inner = inner
        self.calls: list[dict] = []
        self.device = device

    def __dlpack__(self, **kw):
        self.calls.append(dict(kw))
        if self.device is not None:  # a device tensor: forward only what its producer accepts for a host check
            return self.inner.__dlpack__(max_version=kw.get("max_version"), stream=kw.get("stream"))
        return self.inner.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.device if self.device is not None else self.inner.__dlpack_device__()


class LegacyProducer:
    """A pre-DLPack-1.0 producer: __dlpack__ takes only `stream` and returns a legacy capsule."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0

    def __dlpack__(self, stream=None):
        self.calls += 1
        return self.inner.__dlpack__()

    def __dlpack_device__(self):
        return (1, 0)


def test_asarray_asks_for_a_versioned_capsule_first():
    a = np.arange(6, dtype=np.float32)
    p = RecordingProducer(a)
    t = tw.asarray(p)
    assert t.data_ptr == ptr(a)
    assert p.calls[0]["max_version"] == tw.DLPACK_VERSION
    assert "copy" not in p.calls[0] and "stream" not in p.calls[0] and "dl_device" not in p.calls[0]
    p.calls.clear()
    c = tw.asarray(p, copy=True)
    assert p.calls[0]["copy"] is True and c.data_ptr != ptr(a)
    assert np.array_equal(np.asarray(c), a)
    p.calls.clear()
    tw.asarray(p, copy=False)
    assert p.calls[0]["copy"] is False
    p.calls.clear()
    tw.asarray(p, stream=0x7F0000001000)  # a CPU producer is never handed a stream
    assert "stream" not in p.calls[0]


def test_asarray_falls_back_to_legacy_producers():
    a = np.arange(6, dtype=np.int64)
    p = LegacyProducer(a)
    t = tw.asarray(p)
    assert p.calls == 1 and t.data_ptr == ptr(a)
    assert tw.from_dlpack(LegacyProducer(a)).data_ptr == ptr(a)


@needs_no_cuda_driver
def test_asarray_passes_the_stream_to_a_cuda_producer():
    class CAI:
        __cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (0xDEAD0000, False), "version": 3}

    dev = tw.asarray(CAI(), device="cuda:0")
    p = RecordingProducer(dev, device=(2, 0))
    t = tw.asarray(p, stream=0x7F0000003000)
    assert p.calls[0]["stream"] == 0x7F0000003000 and t.data_ptr == 0xDEAD0000 and str(t.device) == "cuda:0"
    assert t.stream == 0x7F0000003000  # the data is ready on the consumer's stream: the tensor says so
    p.calls.clear()
    t = tw.asarray(p, stream=_Stream(0x7F0000004000))  # a stream object: its handle, recorded the same way
    assert p.calls[0]["stream"] == 0x7F0000004000 and t.stream == 0x7F0000004000
    p.calls.clear()
    tw.asarray(p)  # no stream: the legacy default stream, said explicitly (PyTorch reads a missing one as -1: no sync)
    assert p.calls[0]["stream"] == 1


@needs_no_cuda_driver
def test_a_cuda_producer_without_a_stream_keyword_still_imports():
    class CAI:
        __cuda_array_interface__ = {"shape": (3,), "typestr": "<f4", "data": (0xDEAD0000, False), "version": 3}

    dev = tw.asarray(CAI(), device="cuda:0")

    class Bare:  # takes no keyword at all: the implicit stream=1 is dropped, a caller's stream is not
        def __dlpack__(self):
            return dev.__dlpack__()

        def __dlpack_device__(self):
            return (2, 0)

    t = tw.asarray(Bare())
    assert t.data_ptr == 0xDEAD0000 and str(t.device) == "cuda:0" and t.stream == 1
    with pytest.raises(TypeError):
        tw.asarray(Bare(), stream=0x7F0000003000)


@pytest.mark.parametrize("device_type", [2, 3, 4, 7, 10, 13])
@pytest.mark.parametrize("how", ["from_dlpack", "from_dlpack_device", "asarray"])
def test_a_producer_on_a_device_this_process_cannot_reach_is_refused_not_crashed(device_type, how):
    # A producer that reports a non-CPU device and whose __dlpack__ refuses: tw.from_dlpack once passed a null
    # stream= keyword to that __dlpack__ call (a segfault); every route must end in a clear Python error.
    class Remote:
        def __dlpack_device__(self):
            return (device_type, 0)

        def __dlpack__(self, **kw):
            raise BufferError("this producer exports nothing")

    with pytest.raises((BufferError, TypeError, ValueError, RuntimeError)) as e:
        if how == "from_dlpack":
            tw.from_dlpack(Remote())
        elif how == "from_dlpack_device":
            tw.from_dlpack(Remote(), device="cpu")
        else:
            tw.asarray(Remote())
    assert str(e.value)


@pytest.mark.parametrize("device", ["rocm:0", "metal:0", "oneapi:0"])
def test_a_device_tensorwire_does_not_move_to_is_named_as_such_not_as_missing_cuda(device):
    with pytest.raises(BufferError) as e:
        tw.asarray(np.zeros(3), device=device)
    head = str(e.value).splitlines()[0]
    assert f"device={device}: tensorwire moves tensors to cpu, cuda:N and cuda_host (pinned) only" in head, head
    assert "needs CUDA" not in str(e.value)


def test_byte_strides_no_tensor_can_view_are_copied_when_a_copy_is_allowed():
    # A field of a record array (byte stride 12 for 8-byte items) or an ndarray over a buffer with odd strides has
    # no element strides: copy=None takes the producer's copy (as copy=True does), copy=False refuses.
    rec = np.zeros(5, dtype=[("a", "i4"), ("b", "f8")])
    rec["b"] = np.linspace(-1.5, 2.5, 5)
    field = rec["b"]
    assert field.strides == (12,)
    t = tw.asarray(field)
    assert t.dtype == tw.float64 and t.shape == (5,) and same_bits(np.asarray(t), field.copy())
    rec["b"] = 0  # a copy: the record array's later writes do not show
    assert np.asarray(t).tolist() == np.linspace(-1.5, 2.5, 5).tolist()
    odd = np.ndarray((3,), np.int32, np.arange(20, dtype=np.int16).tobytes(), 0, (6,))
    assert np.asarray(tw.asarray(odd)).tolist() == odd.tolist()
    for x in (field, odd):  # a forbidden copy, as every other: `except tw.CopyError` catches it
        with pytest.raises(tw.CopyError, match="not a multiple of the item size.*copy=False forbids one"):
            tw.asarray(x, copy=False)


@pytest.mark.parametrize("value", [[1, 2, 3], [[1.5, -2.0], [3.0, 4.25]], (1, 2), 2.5, 7, True, 1 - 2j, []])
def test_python_lists_tuples_and_scalars_become_tensors_as_numpy_makes_them(value):
    want = np.asarray(value)
    t = tw.asarray(value)
    assert t.dtype == tw.asarray(want).dtype and t.shape == want.shape
    assert same_bits(np.asarray(t), want) and not t.readonly
    assert tw.asarray(value, copy=True).shape == want.shape
    with pytest.raises(tw.CopyError, match="copy=False forbids it"):
        tw.asarray(value, copy=False)


NOT_NUMBERS, NO_TYPE = r"not all numbers", r"no tensor type can hold \(.*ints beyond 64 bits\)"


@pytest.mark.parametrize("value,want", [(["a", "b"], NOT_NUMBERS), ([1, "a"], NOT_NUMBERS), ([None, 1.0], NO_TYPE),
                                        ([2**70], NO_TYPE), (2**70, NO_TYPE), ([1, 2**64], NO_TYPE)])
def test_lists_of_values_that_are_not_numbers_are_a_type_error_naming_numpys_dtype(value, want):
    # (an int beyond 64 bits is a number, but no tensor type holds it: the message says so rather than "not numbers")
    with pytest.raises(TypeError, match=want + r" \(NumPy makes an? .* array of it\)"):
        tw.asarray(value)


@pytest.mark.parametrize("scalar", [np.int64(7), np.int8(-3), np.uint16(65535), np.float32(1.5), np.float16(-2.0),
                                    np.bool_(True), np.complex64(1 - 2j), np.float64(0.25), np.complex128(3j)])
def test_a_numpy_scalar_imports_as_its_value_and_its_memory_outlives_the_call(scalar):
    # NumPy's scalar __array_interface__ points into a temporary array that only the interface dict holds; the
    # import kept the scalar alone, so the tensor read (and wrote) freed memory: 198 of 200 tries read garbage.
    for _ in range(50):
        t = tw.asarray(scalar)
        junk = [np.full(1, 99, dtype=scalar.dtype) for _ in range(20)]
        assert t.shape == () and t.dtype == scalar.dtype
        assert t.item() == scalar.item(), (t.item(), scalar)
        del junk
    np.asarray(t)[()] = 0  # the tensor's own memory (a copy, as np.asarray's): the scalar stays as it was
    assert t.item() == 0 and np.asarray(scalar).item() == scalar.item()


def test_argument_errors_name_the_function_called():
    # NumPy's bare "setting an array element with a sequence", an order message without its function (and without
    # 'A' and 'K', which are accepted), and nanobind's "incompatible function arguments" for dim_names=[1].
    with pytest.raises(ValueError, match=r"^tensorwire\.asarray: NumPy cannot make an array of this list: setting"):
        tw.asarray([[1, 2], [3]])
    with pytest.raises(TypeError, match=r"NumPy makes an object array of it"):
        tw.asarray([1, None])
    for f, name in ((lambda o: tw.zeros(3, order=o), "zeros"), (lambda o: tw.empty(3, order=o), "empty"),
                    (lambda o: tw.zeros(3).copy(order=o), "Tensor.copy"),
                    (lambda o: tw.zeros(3).is_contiguous(o), "Tensor.is_contiguous")):
        with pytest.raises(ValueError, match=rf"^tensorwire\.{name}: order must be 'C', 'F', 'A', 'K' or 'any'"):
            f("X")
        f("K")
    for bad, says in (([1], "it holds a int"), ("hw", "not str"), (b"hw", "not bytes"), (3, "not int")):
        with pytest.raises(TypeError, match=rf"^tensorwire\.to_arrow: dim_names must be a sequence of str.*{says}"):
            tw.to_arrow(np.zeros((2, 3)), dim_names=bad)
    import collections
    assert tw.to_arrow(np.zeros((2, 3)), dim_names=collections.UserList(["w"])).dim_names == ("w",)
