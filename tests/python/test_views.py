"""Views (basic indexing, select, permute, transpose, view, reshape, expand) against NumPy, bit-exactly, and
contiguous() / is_contiguous()."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tensorwire as tw
from _helpers import ptr, same_bits


def np_view(a: np.ndarray, index) -> np.ndarray:
    """a[index] as an ndarray view even when NumPy would return a scalar (all dimensions indexed by ints)."""
    r = a[index]
    if isinstance(r, np.ndarray):
        return r
    return a[(*(index if isinstance(index, tuple) else (index,)), Ellipsis)]


def check_view(t: tw.Tensor, expected: np.ndarray) -> None:
    """t is a zero-copy view equal to the NumPy view `expected` (same memory, layout and bits)."""
    assert isinstance(expected, np.ndarray)
    assert t.shape == expected.shape
    out = np.asarray(t)
    assert same_bits(out, expected)
    if expected.size:
        assert t.data_ptr == ptr(expected)
        for n, s, e in zip(expected.shape, t.strides, expected.strides):
            if n > 1:
                assert s * expected.itemsize == e


@pytest.fixture
def a():
    return np.arange(2 * 3 * 4 * 5, dtype=np.float64).reshape(2, 3, 4, 5) * 1.25 - 7


INDICES = [
    np.s_[1],
    np.s_[-1],
    np.s_[0, 2],
    np.s_[1, -1, 3, -5],
    np.s_[:],
    np.s_[::2],
    np.s_[::-1],
    np.s_[:, ::-2],
    np.s_[:, 1:3, ::3, -2::-2],
    np.s_[..., ::-1],
    np.s_[..., 2],
    np.s_[1, ..., 0],
    np.s_[None],
    np.s_[:, None, :, None],
    np.s_[None, 1, ..., None],
    np.s_[..., None],
    np.s_[5:1],  # empty
    np.s_[:, 3:0:-1],
    np.s_[:, -100:100],
    np.s_[:, ::100],
    np.s_[1:2, :, 1:2],
    np.s_[::-1, ::-1, ::-1, ::-1],
    (),
    np.s_[...],
]


@pytest.mark.parametrize("index", INDICES, ids=[repr(i) for i in INDICES])
def test_basic_indexing_matches_numpy(a, index):
    check_view(tw.asarray(a)[index], np_view(a, index))


@given(data=st.data())
def test_random_basic_indexing_matches_numpy(data):
    shape = data.draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6))
    a = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    index = data.draw(hnp.basic_indices(shape, min_dims=0, allow_newaxis=True, allow_ellipsis=True))
    t = tw.asarray(a)[index]
    expected = np_view(a, index)
    check_view(t, expected)
    # indexing a view of a view keeps composing correctly
    if t.ndim:
        check_view(t[::-1], expected[::-1])
        check_view(t[None, ..., None], expected[None, ..., None])


def test_indexing_errors(a):
    t = tw.asarray(a)
    with pytest.raises(IndexError):
        t[2]
    with pytest.raises(IndexError):
        t[0, 0, 0, 0, 0]
    with pytest.raises(IndexError):
        t[..., ...]
    with pytest.raises(ValueError):
        t[::0]
    with pytest.raises(TypeError):
        t[[0, 1]]  # advanced indexing is NumPy's job
    with pytest.raises(TypeError):
        t[True]
    with pytest.raises(TypeError):
        t[1.0]


def test_an_array_of_integers_is_advanced_indexing_not_a_scalar_index():
    # A one-element torch or tw tensor has __index__, and was read as t[1]: a dimension silently gone, where NumPy
    # and PyTorch keep it (advanced indexing). Arrays of any rank > 0 are refused; 0-d ones are scalars.
    torch = pytest.importorskip("torch")
    a = np.arange(60.0).reshape(3, 4, 5)
    t = tw.asarray(a)
    for ix in (torch.tensor([1]), torch.tensor([[1]]), tw.asarray(np.array([1])), np.array([0, 2]), np.array([1])):
        with pytest.raises(TypeError, match="basic indexing only"):
            t[ix]
        with pytest.raises(TypeError, match="basic indexing only"):
            t[0, ix]
    for ix in (torch.tensor(1), np.array(1), np.int64(1), tw.asarray(np.array(1))):
        check_view(t[ix], a[1])


def test_select_and_slice_methods(a):
    t = tw.asarray(a)
    check_view(t.select(0, 1), a[1])
    check_view(t.select(2, -1), a[:, :, -1])
    check_view(t.slice(3, 1, None, 2), a[:, :, :, 1::2])
    check_view(t.slice(1, None, None, -1), a[:, ::-1])
    check_view(t.slice(1, -1, 0, -1), a[:, -1:0:-1])
    # extreme steps: Python clamps slice steps, the method takes any int64 (no overflow, same result as NumPy)
    check_view(t.slice(3, None, None, -(2**63)), a[:, :, :, ::-(2**63)])
    check_view(t.slice(3, None, None, 2**63 - 1), a[:, :, :, :: 2**63 - 1])
    check_view(t.slice(0, -(2**63), 2**63 - 1), a[-(2**63) : 2**63 - 1])
    check_view(t[:, :: -(2**63)], a[:, :: -(2**63)])
    # a one-element dimension may keep a stride whose byte value overflows: every consumer path must cope
    for one in (t.slice(3, None, None, -(2**63)), t[:, :: -(2**63)], t.slice(0, 1, None, 2**63 - 1)):
        expected = np.asarray(one).copy()
        assert same_bits(np.asarray(memoryview(one)), expected)
        assert same_bits(np.asarray(one.contiguous()), expected)
        assert same_bits(np.asarray(one.copy("F")), expected)
        assert same_bits(np.from_dlpack(one), expected)
        assert one.__array_interface__["shape"] == expected.shape
        assert all(n > 1 or isinstance(s, int) for n, s in zip(one.shape, one.byte_strides))
    with pytest.raises(IndexError):
        t.select(4, 0)
    with pytest.raises(IndexError):
        t.select(0, -(2**63))
    with pytest.raises(IndexError):
        t.select(0, 2)


def test_permute_transpose_T(a):
    t = tw.asarray(a)
    check_view(t.permute(3, 1, 0, 2), a.transpose(3, 1, 0, 2))
    check_view(t.permute((2, 3, 0, 1)), a.transpose(2, 3, 0, 1))
    check_view(t.transpose(0, 3), a.swapaxes(0, 3))
    check_view(t.transpose(-1, 1), a.swapaxes(-1, 1))
    check_view(t.T, a.T)
    check_view(t[:, ::-1].T, a[:, ::-1].T)
    with pytest.raises((ValueError, IndexError)):
        t.permute(0, 1, 2)
    with pytest.raises((ValueError, IndexError)):
        t.permute(0, 1, 1, 2)


def test_view_reshape(a):
    t = tw.asarray(a)
    check_view(t.view(6, 20), a.reshape(6, 20))
    check_view(t.view((-1,)), a.reshape(-1))
    check_view(t.view(2, 3, 2, 2, 5), a.reshape(2, 3, 2, 2, 5))
    # a view of a strided tensor where strides can still express the new shape
    s = a[:, :, ::2]  # (2, 3, 2, 5): the last dim stays contiguous
    check_view(tw.asarray(s).view(2, 3, 2, 5, 1), s.reshape(2, 3, 2, 5, 1))
    check_view(tw.asarray(a.transpose(1, 0, 2, 3)).view(3, 2, 20), a.transpose(1, 0, 2, 3).reshape(3, 2, 20))
    # impossible as a view: CopyError, and reshape copies instead
    with pytest.raises(tw.CopyError):
        t.T.view(-1)
    r = t.T.reshape(-1)
    assert r.is_contiguous() and r.data_ptr != t.data_ptr
    assert same_bits(np.asarray(r), a.T.reshape(-1))
    assert t.reshape(120).data_ptr == t.data_ptr  # reshape is a view when one exists
    with pytest.raises((ValueError, tw.CopyError)):
        t.view(7, 3)
    with pytest.raises(ValueError):
        t.view(-1, -1)


def test_expand_stride_zero(a):
    v = np.arange(5, dtype=np.int16)
    t = tw.asarray(v)
    e = t.expand(4, 5)
    assert e.strides == (0, 1)
    check_view(e, np.broadcast_to(v, (4, 5)))
    col = tw.asarray(v.reshape(5, 1))
    check_view(col.expand(5, 3), np.broadcast_to(v.reshape(5, 1), (5, 3)))
    check_view(col.expand(2, -1, 6), np.broadcast_to(v.reshape(5, 1), (2, 5, 6)))
    assert not e.is_contiguous("any")
    with pytest.raises(ValueError):
        t.expand(4, 6)
    c = e.contiguous()
    assert c.is_contiguous() and c.strides == (5, 1)
    assert same_bits(np.asarray(c), np.broadcast_to(v, (4, 5)).copy())


def test_contiguous_returns_same_object_when_c_contiguous(a):
    t = tw.asarray(a)
    assert t.contiguous() is t
    sub = t[1]  # C-contiguous with a byte offset
    assert sub.contiguous() is sub
    z = tw.asarray(np.zeros((0, 3)))
    assert z.contiguous() is z
    s = tw.asarray(np.float32(2.5).reshape(()))
    assert s.contiguous() is s


@pytest.mark.parametrize(
    "make",
    [lambda a: a.transpose(3, 2, 1, 0), lambda a: a[:, :, ::2], lambda a: a[::-1], lambda a: a.transpose(0, 2, 3, 1),
     lambda a: a[..., 1:4]],
    ids=["reversed-dims", "step2", "negative", "nchw-nhwc", "offset-slice"],
)
def test_contiguous_copies_once_otherwise(a, make):
    v = make(a)
    t = tw.asarray(v)
    assert not t.is_contiguous()
    c = t.contiguous()
    assert c is not t and c.is_contiguous() and c.data_ptr != t.data_ptr
    assert c.strides == np.ascontiguousarray(v).strides[:0] + tuple(
        s // v.itemsize for s in np.ascontiguousarray(v).strides)
    assert same_bits(np.asarray(c), np.ascontiguousarray(v))
    assert c.contiguous() is c
    np.asarray(c).flat[0] += 1  # the copy is independent of the source
    assert same_bits(np.asarray(t), v)


def test_copy_orders(a):
    t = tw.asarray(a[:, ::2])
    f = t.copy("F")
    assert f.is_contiguous("F") and not f.is_contiguous("C")
    assert same_bits(np.asarray(f), a[:, ::2])
    assert np.asarray(f).flags.f_contiguous
    k = tw.asarray(a.transpose(2, 0, 3, 1)).copy("any")
    assert k.is_contiguous("any") and same_bits(np.asarray(k), a.transpose(2, 0, 3, 1))
    c = t.copy()
    assert c.is_contiguous("C") and c.data_ptr != t.data_ptr
    assert tw.asarray(a).copy() is not None and tw.asarray(a).copy().data_ptr != ptr(a)


@pytest.mark.parametrize(
    "make, c, f, any_",
    [
        (lambda a: a, True, False, True),
        (lambda a: a.T, False, True, True),
        (lambda a: a.transpose(1, 0, 2, 3), False, False, True),
        (lambda a: a[:, :, ::2], False, False, False),
        (lambda a: a[::-1], False, False, False),
        (lambda a: a[0, 0, 0], True, True, True),
        (lambda a: a[0, 0, :1, :], True, True, True),
        (lambda a: a[0, 0, :, :1], False, False, False),
        (lambda a: np.broadcast_to(a[0, 0, 0], (3, 5)), False, False, False),
        (lambda a: a[1:2], True, False, True),
    ],
)
def test_is_contiguous_orders(a, make, c, f, any_):
    v = make(a)
    t = tw.asarray(v)
    assert t.is_contiguous() is c
    assert t.is_contiguous("C") is c
    assert t.is_contiguous("F") is f
    assert t.is_contiguous("any") is any_
    assert v.flags.c_contiguous == c or v.size <= 1 or 1 in v.shape
    with pytest.raises(ValueError):
        t.is_contiguous("X")


def test_views_share_memory_and_readonly(a):
    t = tw.asarray(a)
    v = t[1, ::-1, 2:]
    np.asarray(v)[0, 0, 0] = 1234.0
    assert a[1, 2, 2, 0] == 1234.0
    ro = t.as_readonly()
    assert ro.readonly and ro.data_ptr == t.data_ptr and not t.readonly
    assert ro[0].readonly and ro.T.readonly and ro.view(-1).readonly and ro.expand(2, 2, 3, 4, 5).readonly
    assert not ro.contiguous() is None and ro.contiguous().readonly  # same object: still read-only
    assert not ro.T.contiguous().readonly  # a fresh copy is the caller's own memory
    assert len(t) == 2 and len(t[0]) == 3


def test_repr_mentions_layout(a):
    r = repr(tw.asarray(a)[:, ::2])
    assert "shape=(2, 2, 4, 5)" in r and "float64" in r and "strides=" in r


def test_iteration_walks_the_first_dimension_and_a_0d_tensor_refuses_it():
    a = np.arange(24, dtype=np.int32).reshape(4, 6)[::-1, ::2]
    t = tw.asarray(a)
    rows = list(t)
    assert len(rows) == 4 and all(isinstance(r, tw.Tensor) for r in rows)
    assert [np.asarray(r).tolist() for r in rows] == a.tolist()
    assert list(tw.asarray(np.zeros((0, 3)))) == []
    # NumPy and PyTorch raise for a 0-d array; an empty iteration would silently lose the value.
    with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
        list(tw.asarray(np.array(7)))
    with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
        iter(tw.asarray(np.array(7)))


def test_an_index_out_of_range_names_the_tensors_own_dimension():
    # The count restarted after each int index (it names the view's dimension): t[0, 3] said "dimension 0".
    t = tw.zeros((2, 3, 4))
    for idx, dim, size, i in [((0, 3), 1, 3, 3), ((0, slice(None), 9), 2, 4, 9), ((Ellipsis, 5), 2, 4, 5),
                              ((None, 0, 7), 1, 3, 7), ((1, -4), 1, 3, -4), ((2,), 0, 2, 2)]:
        with pytest.raises(IndexError, match=rf"index {i} is out of range for dimension {dim} of size {size}$"):
            t[idx]
        with pytest.raises(IndexError):
            np.zeros((2, 3, 4))[idx]  # NumPy refuses the same ones


def test_arguments_of_the_wrong_type_are_named_and_numpy_integers_are_integers():
    # (each of these was nanobind's "incompatible function arguments" and a signature)
    t = tw.zeros((2, 3))
    for call, exc, text in [(lambda: t.to(None), ValueError, "device must not be None"),
                            (lambda: tw.empty((2,), pinned=1), TypeError, "pinned must be True or False, not int"),
                            (lambda: tw.zeros((2,), pinned=None), TypeError, "pinned must be True or False"),
                            (lambda: tw.empty((2,), order=None), TypeError, "order must be 'C', 'F', 'A', 'K' or 'any', not"),
                            (lambda: t.copy(order=3), TypeError, "order must be 'C', 'F', 'A', 'K' or 'any', not int"),
                            (lambda: tw.DType(None), TypeError, "dtype must be given"),
                            (lambda: t.slice(0, 2**64), ValueError, "start 18446744073709551616 does not fit"),
                            (lambda: t.select(0.5, 0), TypeError, "select: dim must be an int, not float")]:
        with pytest.raises(exc, match=text):
            call()
    assert t.slice(np.int64(1), np.int32(1)).shape == (2, 2)
    assert t.select(np.int64(0), np.uint8(1)).shape == (3,) and t.transpose(np.int64(0), 1).shape == (3, 2)
    assert tw.empty((2,), pinned=np.bool_(False)).shape == (2,)


def test_an_empty_view_of_a_reversed_array_stays_usable():
    # (its offset moved below the buffer: reshape, expand, pickle then refused "byte_offset -16 is negative")
    import pickle

    v = tw.asarray(np.arange(0.0).reshape(3, 0, 2)[::-1])[1]
    assert v.shape == (0, 2) and v.byte_offset >= 0
    assert v.reshape(0).shape == (0,) and v[None].shape == (1, 0, 2) and v.expand(4, 0, 2).shape == (4, 0, 2)
    assert pickle.loads(pickle.dumps(v)).shape == (0, 2)


def test_a_numpy_integer_is_a_shape_as_a_python_int_is():
    # (reshape(np.prod(shape)) raised "shape must be a tuple of ints, not numpy.int64"; NumPy and torch take it)
    t = tw.asarray(np.arange(6.0))
    n = np.prod((2, 3))
    assert t.reshape(n).shape == t.view(n).shape == tw.zeros(n).shape == (6,)
    assert tw.asarray(np.zeros(1)).expand(n).shape == (6,) and t.permute(np.int64(0)).shape == (6,)
    assert t.reshape(np.int32(2), n // 2).shape == (2, 3)
    with pytest.raises(TypeError, match="shape must be a tuple of ints, not bool"):
        t.reshape(True)


def test_two_ellipses_are_an_index_error_as_in_numpy():
    t = tw.asarray(np.zeros((2, 3)))
    with pytest.raises(IndexError, match="single ellipsis"):
        t[..., ...]
    with pytest.raises(IndexError):
        np.zeros((2, 3))[..., ...]


def test_view_of_a_dtype_says_tensorwire_does_not_reinterpret_and_shape_errors_name_the_method():
    # (torch users write t.view(torch.int8): it said "shape must be a tuple of ints, not torch.dtype")
    import torch

    t = tw.asarray(np.arange(12.0).reshape(3, 4))
    for dt in ["int8", np.float32, np.dtype("f2"), torch.int8, tw.DType("uint8")]:
        with pytest.raises(TypeError, match=r"tensorwire.Tensor.view takes a shape, not a dtype .*np.asarray\(t\).view"):
            t.view(dt)
    for call, text in [(lambda: t.view("x"), "tensorwire.Tensor.view: shape must be a tuple of ints, not str"),
                       (lambda: t.reshape(None), "tensorwire.Tensor.reshape: shape must be"),
                       (lambda: t.expand(2.5), "tensorwire.Tensor.expand: shape must be"),
                       (lambda: t.permute("ab"), "tensorwire.Tensor.permute: dims must be"),
                       (lambda: t.transpose(0, 1.5), "tensorwire.Tensor.transpose: dim1 must be an int"),
                       (lambda: t.slice(0, "a"), "tensorwire.Tensor.slice: start must be an int")]:
        with pytest.raises(TypeError, match=text):
            call()
    assert t.view(4, 3).shape == (4, 3) and t.view([2, 6]).shape == (2, 6)


def test_errors_name_the_python_call_and_an_index_past_64_bits_is_an_index_error():
    t = tw.asarray(np.arange(12.0).reshape(3, 4))
    for call, exc, text in [
        (lambda: t.to("cpu", stream=-1), ValueError, r"^tensorwire.Tensor.to: stream -1 is not a stream"),
        (lambda: t.to("cpu", stream="x"), TypeError, r"^tensorwire.Tensor.to: stream must be None"),
        (lambda: t.to("vulkan"), BufferError, r"^tensorwire.Tensor.to: tensorwire moves tensors"),
        (lambda: tw.asarray(t, device="vulkan"), BufferError, r"^tensorwire.asarray: tensorwire moves tensors"),
        (lambda: t[:, ::0], ValueError, r"^tensorwire.Tensor.__getitem__: slice step cannot be zero"),
        (lambda: t[2**70], IndexError, r"^tensorwire.Tensor.__getitem__: index 1180591620717411303424 does not fit "
                                       r"in 64 bits: it is out of range for dimension 0 of size 3"),
        (lambda: t[0, -(2**70)], IndexError, r"out of range for dimension 1 of size 4"),
        (lambda: t.reshape(2**70), ValueError, r"^tensorwire.Tensor.reshape: shape 1180591620717411303424 does not fit"),
    ]:
        with pytest.raises(exc, match=text):
            call()
    # (PyTorch's spelling, torch.device("cuda", 1), was nanobind's "incompatible function arguments")
    assert tw.Device("cuda", 1) == tw.Device("cuda:1") and tw.Device("cpu", 0) == tw.Device("cpu")
    with pytest.raises(ValueError, match="'cuda:0' names an index already"):
        tw.Device("cuda:0", 1)
    with pytest.raises(TypeError, match="the device type must be a str"):
        tw.Device(2, 1)
    with pytest.raises(ValueError, match=r"Device\(None\) is not a device"):
        tw.Device(None)


def test_a_zero_step_given_by_index_is_named_and_a_step_without_truth_works():
    class Step:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

        def __bool__(self):
            raise RuntimeError("no truth value")

    t = tw.asarray(np.arange(6.0))
    assert np.asarray(t[:: Step(2)]).tolist() == np.arange(6.0)[:: Step(2)].tolist() == [0.0, 2.0, 4.0]
    with pytest.raises(ValueError, match=r"^tensorwire.Tensor.__getitem__: slice step cannot be zero"):
        t[:: Step(0)]
