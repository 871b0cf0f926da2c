"""Arrow interop against PyArrow and nanoarrow as independent consumers and producers.

Zero-copy is proven by pointer identity, lifetimes by export counters, PyArrow's memory pool and weak references to
the producer's memory, and malformed input by editing real exported structs through ctypes.

A note on PyArrow (26) and `permutation`: the canonical extension says logical dim i of a row is physical dim
permutation[i]. tensorwire follows that text. PyArrow's FixedShapeTensorArray.from_numpy_ndarray writes the inverse
permutation and its to_numpy_ndarray builds wrong strides for permutations that are not their own inverse, so those
cases are checked against the spec (the physical storage and the type's fields), not against PyArrow's numpy view.
"""

from __future__ import annotations

import ctypes
import gc
import warnings
import weakref

import numpy as np
import pytest

import tensorwire as tw
from _helpers import needs_no_cuda_driver

pa = pytest.importorskip("pyarrow")
na = pytest.importorskip("nanoarrow")

DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
          "bool"]
PA_TYPES = {"int8": pa.int8(), "uint8": pa.uint8(), "int16": pa.int16(), "uint16": pa.uint16(), "int32": pa.int32(),
            "uint32": pa.uint32(), "int64": pa.int64(), "uint64": pa.uint64(), "float16": pa.float16(),
            "float32": pa.float32(), "float64": pa.float64(), "bool": pa.bool8()}


def sample(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    return (rng.standard_normal(shape) * 50).astype(dtype)


def collect():
    for _ in range(3):
        gc.collect()


def _width(typ) -> int:
    return (typ.storage_type if isinstance(typ, pa.BaseExtensionType) else typ).byte_width


def storage_address(arr) -> int:
    """Address of the first value of a PyArrow fixed-shape tensor (or primitive) array, offsets applied."""
    if isinstance(arr.type, pa.BaseExtensionType) and arr.type.extension_name == "arrow.fixed_shape_tensor":
        arr = arr.storage.flatten()  # the values of the array's rows (list offset applied)
    return arr.buffers()[1].address + arr.offset * _width(arr.type)


# ---- ctypes views of the C structs, to build malformed input from real exports ----------------------------------------
class ArrowSchema(ctypes.Structure):
    pass


ArrowSchema._fields_ = [
    ("format", ctypes.c_char_p), ("name", ctypes.c_char_p), ("metadata", ctypes.c_void_p), ("flags", ctypes.c_int64),
    ("n_children", ctypes.c_int64), ("children", ctypes.POINTER(ctypes.POINTER(ArrowSchema))),
    ("dictionary", ctypes.POINTER(ArrowSchema)), ("release", ctypes.c_void_p), ("private_data", ctypes.c_void_p),
]


class ArrowArray(ctypes.Structure):
    pass


ArrowArray._fields_ = [
    ("length", ctypes.c_int64), ("null_count", ctypes.c_int64), ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64), ("n_children", ctypes.c_int64), ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowArray))), ("dictionary", ctypes.POINTER(ArrowArray)),
    ("release", ctypes.c_void_p), ("private_data", ctypes.c_void_p),
]

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def struct_in(capsule, name, typ):
    return typ.from_address(_get_pointer(capsule, name.encode()))


def pa_capsules(arr):
    return arr.__arrow_c_array__()


# ---- export: PyArrow consumes tensorwire ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_round_trips_through_pyarrow_zero_copy(dtype):
    x = sample((5, 3, 4), dtype)
    t = tw.asarray(x)
    arr = pa.array(t)  # Tensor.__arrow_c_array__ / __arrow_c_device_array__
    assert arr.type.extension_name == "arrow.fixed_shape_tensor"
    assert arr.type.shape == [3, 4]
    assert arr.type.value_type == PA_TYPES[dtype]
    assert len(arr) == 5
    assert storage_address(arr) == t.data_ptr  # PyArrow reads our memory
    back = tw.asarray(arr)
    assert back.data_ptr == t.data_ptr  # and we read it back: no copy either way
    assert back.shape == (5, 3, 4) and back.dtype == dtype and back.readonly
    np.testing.assert_array_equal(np.asarray(back), x)
    if dtype != "bool":
        np.testing.assert_array_equal(arr.to_numpy_ndarray(), x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_dimensional_tensors_are_primitive_arrays(dtype):
    x = sample((7,), dtype)
    t = tw.asarray(x)
    arr = pa.array(tw.to_arrow(t, copy=False))
    assert arr.type == PA_TYPES[dtype]
    assert storage_address(arr) == t.data_ptr
    back = tw.from_arrow(arr)
    assert back.data_ptr == t.data_ptr
    np.testing.assert_array_equal(np.asarray(back), x)


def test_zero_dimensional_tensor_raises_value_error():
    t = tw.asarray(np.array(3.0))
    with pytest.raises(ValueError, match="0-d"):
        tw.to_arrow(t)
    with pytest.raises(ValueError, match="0-d"):
        pa.array(t)


@pytest.mark.parametrize("perm", [(0, 2, 3, 1), (0, 3, 1, 2), (0, 1, 3, 2), (0, 3, 2, 1), (0, 2, 1, 3)])
def test_dense_permuted_layouts_export_with_permutation_and_no_copy(perm):
    nchw = sample((4, 3, 5, 6), "float32")
    base = tw.asarray(nchw)
    view = base.permute(perm)
    a = tw.to_arrow(view, copy=False)
    assert not a.copied
    arr = pa.array(a)
    logical = view.shape[1:]
    physical = tuple(nchw.shape[1:])
    assert tuple(arr.type.shape) == physical
    p = arr.type.permutation
    if list(perm[1:]) == [1, 2, 3]:
        assert p is None or list(p) == [0, 1, 2]
    else:
        assert tuple(physical[i] for i in p) == logical  # the spec: logical i = physical permutation[i]
    assert storage_address(arr) == base.data_ptr
    # The storage is the physical memory, row-major.
    np.testing.assert_array_equal(arr.storage.values.to_numpy(), nchw.ravel())
    back = tw.from_arrow(arr)
    assert back.data_ptr == base.data_ptr and back.shape == view.shape and back.strides == view.strides
    np.testing.assert_array_equal(np.asarray(back), np.transpose(nchw, perm))
    # tw.asarray reads the Arrow schema first: PyArrow's own DLPack view of this array has wrong strides.
    again = tw.asarray(arr)
    assert again.data_ptr == base.data_ptr and again.strides == view.strides
    if p is not None and all(p[p[i]] == i for i in range(len(p))):
        # PyArrow's own reader is right for permutations that are their own inverse.
        np.testing.assert_array_equal(arr.to_numpy_ndarray(), np.transpose(nchw, perm))


def test_the_issue_example_nchw_to_nhwc():
    torch = pytest.importorskip("torch")
    batch_nchw = torch.randn(8, 3, 16, 16)
    batch = tw.asarray(batch_nchw)
    arr = pa.array(batch)
    assert tw.asarray(arr).data_ptr == batch_nchw.data_ptr()
    assert tw.asarray(arr).shape == (8, 3, 16, 16)
    nhwc = pa.array(tw.asarray(batch_nchw.permute(0, 2, 3, 1)))
    assert storage_address(nhwc) == batch_nchw.data_ptr()
    for back in (tw.from_arrow(nhwc), tw.asarray(nhwc)):
        assert back.shape == (8, 16, 16, 3) and back.data_ptr == batch_nchw.data_ptr()
        np.testing.assert_array_equal(np.asarray(back), batch_nchw.permute(0, 2, 3, 1).numpy())
    with pytest.raises(tw.CopyError):
        tw.to_arrow(tw.asarray(batch_nchw)[:, :, ::2], copy=False)


@pytest.mark.parametrize("make", [
    lambda t: t[:, :, ::2],             # gaps inside a row
    lambda t: t[::2],                   # a row stride of two rows
    lambda t: t[:, ::-1],               # negative stride
    lambda t: t[:1].expand((4, 3, 4)),  # zero stride: broadcast rows
    lambda t: t.permute(1, 0, 2),       # rows not outermost
], ids=["gaps", "row-stride", "negative", "broadcast", "rows-inner"])
def test_layouts_arrow_cannot_describe_copy_once_or_raise_copy_error(make):
    x = sample((4, 3, 4), "float64")
    v = make(tw.asarray(x))
    with pytest.raises(tw.CopyError):
        tw.to_arrow(v, copy=False)
    a = tw.to_arrow(v)
    assert a.copied
    expected = np.asarray(v).copy()
    np.testing.assert_array_equal(np.asarray(tw.from_arrow(pa.array(a))), expected)
    # The protocol has no copy argument: the tensor's own export copies silently.
    np.testing.assert_array_equal(np.asarray(tw.asarray(pa.array(v))), expected)


def test_copy_true_always_copies():
    t = tw.asarray(sample((2, 3), "int32"))
    a = tw.to_arrow(t, copy=True)
    assert a.copied and storage_address(pa.array(a)) != t.data_ptr


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "complex64", "complex128"])
def test_dtypes_without_canonical_arrow_type_are_refused(dtype):
    t = tw.zeros((2, 3), dtype=dtype)
    with pytest.raises(BufferError, match=dtype):
        tw.to_arrow(t)
    with pytest.raises(BufferError, match="no canonical Arrow type"):
        pa.array(t)


def test_dim_names_are_written_in_physical_order():
    x = sample((2, 3, 4, 5), "float32")
    v = tw.asarray(x).permute(0, 2, 3, 1)  # logical H, W, C
    arr = pa.array(tw.to_arrow(v, dim_names=["H", "W", "C"]))
    assert arr.type.dim_names == ["C", "H", "W"]
    a = tw.to_arrow(v, dim_names=["H", "W", "C"])
    assert a.dim_names == ("H", "W", "C") and a.shape == (4, 5, 3) and a.physical_shape == (3, 4, 5)


def test_the_array_can_be_exported_many_times():
    t = tw.asarray(sample((3, 2), "float32"))
    a = tw.to_arrow(t)
    first, second = pa.array(a), pa.array(a)
    assert storage_address(first) == storage_address(second) == t.data_ptr


# ---- import: PyArrow produces ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [d for d in DTYPES if d not in ("bool", "float16")])
def test_pyarrow_fixed_shape_tensors_import_zero_copy(dtype):
    x = sample((6, 2, 5), dtype)
    arr = pa.FixedShapeTensorArray.from_numpy_ndarray(x)
    t = tw.asarray(arr)
    assert t.data_ptr == storage_address(arr) == x.__array_interface__["data"][0]
    np.testing.assert_array_equal(np.asarray(t), x)
    sliced = arr.slice(2, 3)  # offsets are honoured
    s = tw.from_arrow(sliced)
    assert s.data_ptr == storage_address(sliced)
    np.testing.assert_array_equal(np.asarray(s), x[2:5])


def test_pyarrow_involutive_permutation_imports_as_strided_view():
    x = sample((3, 4, 5), "float32")
    logical = x.transpose(0, 2, 1)
    arr = pa.FixedShapeTensorArray.from_numpy_ndarray(logical)
    assert arr.type.permutation == [1, 0]
    t = tw.from_arrow(arr)
    assert t.shape == logical.shape and not t.is_contiguous()
    np.testing.assert_array_equal(np.asarray(t), logical)


def test_pyarrow_non_involutive_permutation_is_read_as_the_spec_says():
    phys = sample((2, 3, 4, 5), "float32")
    typ = pa.fixed_shape_tensor(pa.float32(), [3, 4, 5], permutation=[1, 2, 0])
    storage = pa.FixedSizeListArray.from_arrays(pa.array(phys.ravel()), 60)
    arr = pa.ExtensionArray.from_storage(typ, storage)
    t = tw.from_arrow(arr)
    np.testing.assert_array_equal(np.asarray(t), phys.transpose(0, 2, 3, 1))
    assert t.data_ptr == storage_address(arr)


def test_pyarrow_bool8_and_bitpacked_boolean():
    flags = np.array([True, False, True, True])
    b8 = pa.ExtensionArray.from_storage(pa.bool8(), pa.array(flags.astype(np.int8)))
    t = tw.asarray(b8)
    assert t.dtype == "bool" and t.data_ptr == storage_address(b8)
    np.testing.assert_array_equal(np.asarray(t), flags)
    packed = pa.array(flags)  # Arrow's boolean: one bit per value
    np.testing.assert_array_equal(np.asarray(tw.asarray(packed)), flags)
    with pytest.raises(tw.CopyError, match="bit-packed"):
        tw.asarray(packed, copy=False)
    with pytest.raises(tw.CopyError):
        tw.from_arrow(packed, copy=False)


def test_a_producers_own_refusal_is_not_retried_as_a_legacy_request():
    # pyarrow refuses bit-packed booleans in __dlpack__ with ArrowTypeError, a TypeError subclass. Only argument
    # parsing's own TypeError means "a producer from before DLPack 1.0": a legacy retry would repeat the refusal
    # and draw pyarrow's DeprecationWarning for asking for an unversioned capsule.
    packed = pa.array(np.array([True, False, True]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(tw.CopyError) as e:
            tw.asarray(packed, copy=False)
        with pytest.raises(TypeError, match="Bit-packed boolean"):
            tw.from_dlpack(packed)
    assert "Bit-packed boolean data type not supported by DLPack" in str(e.value)
    assert [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)] == []


def test_nulls_are_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="null"):
        tw.from_arrow(pa.array([1.0, None, 3.0]))
    fixed = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.int32(), [2]),
                                           pa.array([[1, 2], None], pa.list_(pa.int32(), 2)))
    with pytest.raises(ValueError, match="null"):
        tw.from_arrow(fixed)
    # A slice without the null row imports.
    assert tw.from_arrow(fixed.slice(0, 1)).shape == (1, 2)


def test_unsupported_arrow_types_say_what_they_are():
    with pytest.raises(BufferError, match="string"):
        tw.from_arrow(pa.array(["a", "b"]))
    with pytest.raises(BufferError, match="dictionary"):
        tw.from_arrow(pa.array(["a", "b"]).dictionary_encode())
    with pytest.raises(TypeError, match="__arrow_c_array__"):
        tw.from_arrow(object())


def test_chunked_arrays_and_table_columns():
    x = sample((6, 2, 3), "float32")
    a1 = pa.FixedShapeTensorArray.from_numpy_ndarray(x[:2])
    a2 = pa.FixedShapeTensorArray.from_numpy_ndarray(x[2:])
    one = pa.chunked_array([a1])
    assert tw.asarray(one).data_ptr == storage_address(a1)  # one chunk: zero-copy
    two = pa.chunked_array([a1, a2])
    np.testing.assert_array_equal(np.asarray(tw.asarray(two)), x)
    with pytest.raises(tw.CopyError, match="chunks"):
        tw.asarray(two, copy=False)
    with pytest.raises(tw.CopyError, match="chunks"):
        tw.from_arrow(two, copy=False)
    table = pa.table({"images": two, "ids": pa.chunked_array([pa.array([0, 1]), pa.array([2, 3, 4, 5])])})
    np.testing.assert_array_equal(np.asarray(tw.asarray(table["images"])), x)
    cols = tw.from_arrow(table)
    assert set(cols) == {"images", "ids"}
    np.testing.assert_array_equal(np.asarray(cols["ids"]), np.arange(6))
    np.testing.assert_array_equal(np.asarray(cols["images"]), x)
    with pytest.raises(BufferError, match="tw.from_arrow"):
        tw.asarray(table)


def test_record_batches_import_one_column_per_field():
    x = sample((3, 2, 2), "float64")
    rb = pa.record_batch([pa.FixedShapeTensorArray.from_numpy_ndarray(x), pa.array([1, 2, 3], pa.int16())],
                         names=["t", "n"])
    cols = tw.from_arrow(rb)
    np.testing.assert_array_equal(np.asarray(cols["t"]), x)
    assert cols["n"].dtype == "int16"
    sliced = tw.from_arrow(rb.slice(1))
    np.testing.assert_array_equal(np.asarray(sliced["t"]), x[1:])
    # Arrow allows a field name twice; the dict kept the last column and dropped the first, silently.
    for dup in (pa.table([pa.array([1.0]), pa.array([2.0]), pa.array([3.0])], names=["x", "y", "x"]),
                pa.record_batch([pa.array([1]), pa.array([2])], names=["", ""])):
        with pytest.raises(ValueError, match=r"columns 0 and (2|1) are both named"):
            tw.from_arrow(dup)


# ---- variable shapes ----------------------------------------------------------------------------------------------
def test_list_of_tensors_becomes_variable_shape_tensor():
    xs = [sample((2, 3), "float32", 1), sample((4, 3), "float32", 2), sample((1, 3), "float32", 3)]
    a = tw.to_arrow([tw.asarray(x) for x in xs])
    assert a.type_name == "arrow.variable_shape_tensor" and len(a) == 3 and a.copied
    arr = pa.array(a)
    assert arr.type.extension_name == "arrow.variable_shape_tensor"
    storage = arr.storage
    assert storage.field("shape").to_pylist() == [[2, 3], [4, 3], [1, 3]]
    np.testing.assert_array_equal(storage.field("data").values.to_numpy(), np.concatenate([x.ravel() for x in xs]))
    back = tw.from_arrow(arr)
    assert isinstance(back, list) and len(back) == 3
    for b, x in zip(back, xs):
        np.testing.assert_array_equal(np.asarray(b), x)
    with pytest.raises(BufferError, match="tw.from_arrow"):
        tw.asarray(arr)
    with pytest.raises(tw.CopyError):
        tw.to_arrow([tw.asarray(x) for x in xs], copy=False)


def test_variable_shape_keeps_a_common_permuted_layout():
    xs = [sample((3, 2, 5), "int16", i) for i in range(3)]
    views = [tw.asarray(x).permute(1, 2, 0) for x in xs]  # each (2, 5, 3), dense, channels-first in memory
    a = tw.to_arrow(views)
    assert a.permutation == (1, 2, 0)
    arr = pa.array(a)
    assert arr.storage.field("shape").to_pylist()[0] == [3, 2, 5]  # physical
    for b, x in zip(tw.from_arrow(arr), xs):
        np.testing.assert_array_equal(np.asarray(b), x.transpose(1, 2, 0))


def test_variable_shape_from_a_pyarrow_built_array():
    typ = pa.array(tw.to_arrow([tw.zeros((1, 2), dtype="float64"), tw.zeros((2, 3), dtype="float64")])).type
    assert typ.extension_name == "arrow.variable_shape_tensor"
    data = pa.array([[1.0, 2.0], [3.0, 4.0, 5.0, 6.0, 7.0, 8.0]], pa.list_(pa.float64()))
    shape = pa.array([[1, 2], [3, 2]], pa.list_(pa.int32(), 2))
    arr = pa.ExtensionArray.from_storage(typ, pa.StructArray.from_arrays([data, shape], names=["data", "shape"]))
    back = tw.from_arrow(arr)
    np.testing.assert_array_equal(np.asarray(back[0]), [[1.0, 2.0]])
    np.testing.assert_array_equal(np.asarray(back[1]), np.arange(3.0, 9.0).reshape(3, 2))
    assert back[1].data_ptr == back[0].data_ptr + 16  # views into PyArrow's one values buffer
    bad = pa.ExtensionArray.from_storage(typ, pa.StructArray.from_arrays(
        [data, pa.array([[1, 2], [3, 3]], pa.list_(pa.int32(), 2))], names=["data", "shape"]))
    with pytest.raises(ValueError, match="holds 9 elements but its data list holds 6"):
        tw.from_arrow(bad)


def test_variable_shape_errors():
    with pytest.raises(ValueError, match="empty list"):
        tw.to_arrow([])
    with pytest.raises(TypeError, match="dtype"):
        tw.to_arrow([tw.zeros((2,)), tw.zeros((2,), dtype="int32")])
    with pytest.raises(ValueError, match="rank"):
        tw.to_arrow([tw.zeros((2,)), tw.zeros((2, 1))])


# ---- metadata ---------------------------------------------------------------------------------------------------
def test_metadata_survives_wherever_the_consumer_keeps_the_field():
    t = tw.asarray(sample((3, 4), "float32"))
    t.metadata["frame"] = 12
    t.metadata["calib"] = {"fx": 1.5, "ids": (1, 2), "raw": b"\x00\x01"}
    expected = dict(t.metadata)
    a = tw.to_arrow(t)
    assert a.__arrow_c_schema__ is not None
    # nanoarrow keeps the schema with the array
    c = na.c_array(a)
    assert dict(tw.from_arrow(c).metadata) == expected
    # a PyArrow field and record batch keep field metadata
    field = pa.field(a)
    assert b"tensorwire.metadata" in field.metadata
    rb = pa.record_batch([pa.array(a)], schema=pa.schema([field.with_name("x")]))
    assert dict(tw.from_arrow(rb)["x"].metadata) == expected
    # a stream of record batches
    reader = pa.RecordBatchReader.from_batches(rb.schema, [rb, rb])
    assert dict(tw.from_arrow(reader)["x"].metadata) == expected
    # a nanoarrow stream
    assert dict(tw.from_arrow(na.c_array_stream(a)).metadata) == expected
    # a bare pa.array keeps only the type: metadata is gone, the data is not
    assert dict(tw.from_arrow(pa.array(a)).metadata) == {}


def test_variable_shape_metadata_and_mismatch():
    ts = [tw.zeros((1, 2)), tw.zeros((3, 2))]
    for x in ts:
        x.metadata["src"] = "cam0"
    back = tw.from_arrow(na.c_array(tw.to_arrow(ts)))
    assert all(dict(b.metadata) == {"src": "cam0"} for b in back)
    ts[1].metadata["src"] = "cam1"
    with pytest.raises(ValueError, match="metadata"):
        tw.to_arrow(ts)


# ---- nanoarrow as producer and consumer ---------------------------------------------------------------------------
def test_nanoarrow_producer_fixed_shape_zero_copy():
    x = np.arange(24, dtype=np.float32)
    schema = na.extension_type(na.fixed_size_list(na.float32(), 6), "arrow.fixed_shape_tensor",
                               '{"shape":[2,3],"permutation":[1,0]}')
    c = na.c_array_from_buffers(schema, 4, [None], children=[na.c_array_from_buffers(na.float32(), 24, [None, x])])
    t = tw.from_arrow(c)
    assert t.data_ptr == x.__array_interface__["data"][0]
    np.testing.assert_array_equal(np.asarray(t), x.reshape(4, 2, 3).transpose(0, 2, 1))


def test_nanoarrow_consumer_sees_our_types():
    t = tw.asarray(sample((2, 3, 4), "int32"))
    c = na.c_array(tw.to_arrow(t))
    assert c.schema.format == "+w:12"
    assert c.schema.metadata[b"ARROW:extension:name"] == b"arrow.fixed_shape_tensor"
    assert c.schema.metadata[b"ARROW:extension:metadata"] == b'{"shape":[3,4]}'
    view = na.Array(tw.to_arrow(tw.asarray(np.arange(5, dtype=np.int64))))
    assert view.to_pylist() == [0, 1, 2, 3, 4]
    b8 = na.c_array(tw.to_arrow(tw.asarray(np.array([True, False]))))
    assert b8.schema.metadata[b"ARROW:extension:name"] == b"arrow.bool8"


def test_nanoarrow_bad_json_and_bad_shape_are_refused():
    x = np.zeros(12, dtype=np.float32)

    def build(meta, size=6):
        schema = na.extension_type(na.fixed_size_list(na.float32(), size), "arrow.fixed_shape_tensor", meta)
        return na.c_array_from_buffers(schema, 2, [None],
                                       children=[na.c_array_from_buffers(na.float32(), 2 * size, [None, x])])

    with pytest.raises(ValueError, match="invalid JSON"):
        tw.from_arrow(build('{"shape": [2, 3]'))
    with pytest.raises(ValueError, match="duplicate key"):
        tw.from_arrow(build('{"shape": [2, 3], "shape": [6]}'))
    with pytest.raises(ValueError, match="FixedSizeList size is 6"):
        tw.from_arrow(build('{"shape": [2, 4]}'))
    with pytest.raises(ValueError, match="permutation"):
        tw.from_arrow(build('{"shape": [2, 3], "permutation": [1, 1]}'))
    with pytest.raises(ValueError, match="tensorwire.metadata"):
        meta_schema = na.c_schema(pa.field("x", pa.int32(), metadata={"tensorwire.metadata": b"TWMD\x09"}))
        tw.from_arrow(na.c_array_from_buffers(meta_schema, 1, [None, np.zeros(1, np.int32)]))


# ---- malformed structs from real exports (edited through ctypes) ------------------------------------------------------
def fixed_shape_capsules():
    return pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((4, 2, 3), np.float32)).__arrow_c_array__()


def test_wrong_format_strings_are_refused():
    for fmt, match in [(b"+w:abc", "fixed-size list format"), (b"+w:7", "FixedSizeList size is 7"),
                       (b"+l", "FixedSizeList")]:
        scap, acap = fixed_shape_capsules()
        buf = ctypes.create_string_buffer(fmt)  # outlives the import below
        struct_in(scap, "arrow_schema", ArrowSchema).format = ctypes.cast(buf, ctypes.c_char_p)
        with pytest.raises(ValueError, match=match):
            tw.from_arrow((scap, acap))
        assert struct_in(acap, "arrow_array", ArrowArray).release is None  # moved out and released: no leak


def test_inconsistent_lengths_and_short_buffers_are_refused():
    cases = {
        "child too short": (lambda a: setattr(a.children[0].contents, "length", 23), "length is 23"),
        "missing data buffer": (lambda a: setattr(a.children[0].contents, "n_buffers", 1), "n_buffers"),
        "null data pointer": (lambda a: a.children[0].contents.buffers.__setitem__(1, None), "data buffer is NULL"),
        "negative length": (lambda a: setattr(a, "length", -2), "negative length"),
        "offset past the end": (lambda a: setattr(a, "offset", 3), r"needs slots \[18, 42\) but the array's length is 24"),
        "claimed nulls without bitmap": (lambda a: setattr(a, "null_count", 2), "validity bitmap is NULL"),
    }
    for name, (edit, match) in cases.items():
        scap, acap = fixed_shape_capsules()
        edit(struct_in(acap, "arrow_array", ArrowArray))
        with pytest.raises(ValueError, match=match):
            tw.from_arrow((scap, acap))
        assert struct_in(acap, "arrow_array", ArrowArray).release is None, name
        assert struct_in(scap, "arrow_schema", ArrowSchema).release is None, name


def test_consumed_capsules_cannot_be_imported_twice():
    scap, acap = fixed_shape_capsules()
    tw.from_arrow((scap, acap))
    with pytest.raises(ValueError, match="released"):
        tw.from_arrow((scap, acap))
    with pytest.raises(TypeError, match="arrow_schema"):
        tw.from_arrow((acap, scap))


# ---- lifetimes -----------------------------------------------------------------------------------------------------
def test_exports_are_released_exactly_when_consumers_let_go():
    base = tw._tensorwire._arrow_exports_alive()
    t = tw.asarray(sample((3, 4), "float32"))
    a = tw.to_arrow(t)
    arr = pa.array(a)
    assert tw._tensorwire._arrow_exports_alive() > base
    del a, t
    collect()
    np.testing.assert_array_equal(tw.asarray(arr).shape, (3, 4))  # PyArrow's array keeps our memory alive
    del arr
    collect()
    assert tw._tensorwire._arrow_exports_alive() == base
    # Capsules never consumed are released by their destructors.
    caps = tw.to_arrow(tw.zeros((2, 2))).__arrow_c_array__()
    assert tw._tensorwire._arrow_exports_alive() > base
    del caps
    collect()
    assert tw._tensorwire._arrow_exports_alive() == base


def test_imports_release_the_producer_once_the_last_view_dies():
    pool_before = pa.total_allocated_bytes()
    arr = pa.array(np.arange(1 << 16, dtype=np.int64).tolist(), pa.int64())  # PyArrow-owned memory
    assert pa.total_allocated_bytes() - pool_before >= 8 << 16
    t = tw.from_arrow(arr)
    view = t[10:20]
    held = pa.total_allocated_bytes() - pool_before  # the data and PyArrow's export bookkeeping
    del arr, t
    collect()
    assert pa.total_allocated_bytes() - pool_before == held  # the view keeps PyArrow's buffer
    assert np.asarray(view).tolist() == list(range(10, 20))
    del view
    collect()
    assert pa.total_allocated_bytes() == pool_before


def test_nanoarrow_producer_memory_lives_as_long_as_the_tensor():
    x = np.arange(8, dtype=np.float64)
    ref = weakref.ref(x)
    c = na.c_array_from_buffers(na.float64(), 8, [None, x])
    del x
    t = tw.from_arrow(c)
    del c
    collect()
    assert ref() is not None
    assert np.asarray(t).sum() == 28.0
    del t
    collect()
    assert ref() is None


# ---- device interface -------------------------------------------------------------------------------------------------
def test_device_array_protocol_on_cpu():
    t = tw.asarray(sample((2, 2), "float32"))
    a = tw.to_arrow(t)
    scap, dcap = a.__arrow_c_device_array__()
    back = tw.from_arrow((scap, dcap))
    assert back.data_ptr == t.data_ptr and back.device == "cpu"
    with pytest.raises(NotImplementedError, match="future_option"):
        a.__arrow_c_device_array__(future_option=1)
    a.__arrow_c_device_array__(future_option=None)  # None-valued keywords are accepted, per the spec
    arr = pa.array(a)
    assert arr.is_cpu


def test_pyarrow_device_export_imports():
    x = sample((3, 2), "int64")
    arr = pa.FixedShapeTensorArray.from_numpy_ndarray(x)
    back = tw.from_arrow(arr.__arrow_c_device_array__())
    np.testing.assert_array_equal(np.asarray(back), x)


@needs_no_cuda_driver
def test_cuda_tensors_export_through_the_device_interface_only():
    """A CUDA tensor over a fake device pointer (nothing may read it): CPU capsules are refused, device capsules
    carry the device, and importing them gives the same pointer back on the same device."""

    class CAI:
        def __init__(self, **d):
            self.__cuda_array_interface__ = d

    fake = 0xDEAD0000
    t = tw.asarray(CAI(shape=(4, 2, 3), typestr="<f4", data=(fake, False), version=3), device="cuda:0")
    with pytest.raises(BufferError, match="Device Data Interface"):
        t.__arrow_c_array__()
    with pytest.raises(BufferError, match="Device Data Interface"):
        tw.to_arrow(t).__arrow_c_array__()
    scap, dcap = t.__arrow_c_device_array__()
    assert _get_pointer(dcap, b"arrow_device_array")
    back = tw.from_arrow((scap, dcap))
    assert back.data_ptr == fake and str(back.device) == "cuda:0" and back.shape == (4, 2, 3)
    with pytest.raises(BufferError):  # a layout that needs a copy cannot be copied by the host
        t[:, :, ::2].__arrow_c_device_array__()
