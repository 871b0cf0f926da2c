"""CUDA Array Interface parsing without a GPU: plain objects carrying a __cuda_array_interface__ dict.

The pointers are fake (0xdead0000): every test here would crash if tensorwire dereferenced device memory. Tests
that rely on "no driver" skip when a CUDA driver is actually present."""

from __future__ import annotations

import pytest

import tensorwire as tw
from _helpers import FAKE_PTR

NO_DRIVER = "could not be loaded" in tw._tensorwire.cuda_driver_status()

# With a driver, the fake pointers, streams and devices here would reach it (an event recorded on a made-up stream
# handle, a copy from a made-up address: the driver checks neither, and may crash the process). The real producers
# (PyTorch, CuPy, Numba, JAX) are tested on a GPU by test_cuda.py.
pytestmark = pytest.mark.skipif(
    not NO_DRIVER, reason="a CUDA driver is loaded: these tests' fake pointers and streams would reach it")


class CAI:
    """An object that only carries a CUDA Array Interface."""

    def __init__(self, **d):
        self.__cuda_array_interface__ = d


def base(**over):
    d = {"shape": (2, 3), "typestr": "<f4", "data": (FAKE_PTR, False), "version": 3}
    d.update(over)
    return d


def imp(d, device="cuda:0", **kw):
    return tw.asarray(CAI(**d), device=device, **kw)


def test_basic_import_records_layout_and_device():
    t = imp(base(), device="cuda:1")
    assert str(t.device) == "cuda:1" and t.device.type == "cuda" and t.device.index == 1
    assert t.data_ptr == FAKE_PTR
    assert t.shape == (2, 3) and t.strides == (3, 1) and str(t.dtype) == "float32"
    assert t.readonly is False and t.nbytes == 24
    ro = imp(base(data=(FAKE_PTR, True)))
    assert ro.readonly is True


@pytest.mark.parametrize("present", [False, True])
def test_stream_absent_or_none_is_no_sync(present):
    d = base(stream=None) if present else base()
    t = imp(d)
    assert t.stream is None


@pytest.mark.parametrize("s", [1, 2, 0x7F00_0000_1234])
def test_stream_default_streams_and_handles_recorded(s):
    assert imp(base(stream=s)).stream == s


def test_stream_zero_refused():
    with pytest.raises(ValueError) as ei:
        imp(base(stream=0))
    assert "'stream' is 0" in str(ei.value)


def test_stream_negative_or_wrong_type_refused():
    with pytest.raises(ValueError):
        imp(base(stream=-5))
    with pytest.raises(TypeError) as ei:
        imp(base(stream="1"))
    assert "stream" in str(ei.value)


def test_strides_none_is_c_order():
    t = imp(base(shape=(4, 5, 6), strides=None))
    assert t.strides == (30, 6, 1) and t.is_contiguous()


def test_explicit_strides_in_bytes():
    t = imp(base(shape=(3, 4), typestr="<f8", strides=(8, 24)))  # Fortran order
    assert t.strides == (1, 3)
    assert t.is_contiguous("F") and not t.is_contiguous("C")
    t = imp(base(shape=(3, 4), typestr="<i2", strides=(16, 4)))  # gaps
    assert t.strides == (8, 2) and not t.is_contiguous("any")


def test_negative_strides_keep_the_pointer_as_element_zero():
    t = imp(base(shape=(4,), typestr="<f4", strides=(-4,)))
    assert t.data_ptr == FAKE_PTR and t.strides == (-1,)
    assert t.allocation[0] == FAKE_PTR - 12  # the block starts at the lowest element
    assert t.byte_offset == 12


def test_strides_not_multiple_of_itemsize_refused():
    with pytest.raises(BufferError) as ei:
        imp(base(strides=(12, 2)))
    assert "multiple of the item size" in str(ei.value)


def test_mask_refused():
    with pytest.raises(BufferError) as ei:
        imp(base(mask=(FAKE_PTR, False)))
    assert "mask" in str(ei.value)
    assert imp(base(mask=None)).shape == (2, 3)  # a None mask is no mask


def test_zero_size_with_null_pointer():
    t = tw.asarray(CAI(**base(shape=(0, 3), data=(0, False))))
    assert t.shape == (0, 3) and t.size == 0 and t.device.type == "cuda"
    t = imp(base(shape=(5, 0), data=(0, False)), device="cuda:3")
    assert str(t.device) == "cuda:3"


def test_null_pointer_with_elements_refused():
    with pytest.raises(ValueError) as ei:
        imp(base(data=(0, False)))
    assert "data pointer is 0" in str(ei.value)


@pytest.mark.parametrize("v", [2, 3])
def test_versions_2_and_3_accepted(v):
    assert imp(base(version=v)).shape == (2, 3)


@pytest.mark.parametrize("v", [0, 1, 4])
def test_other_versions_refused(v):
    with pytest.raises(BufferError) as ei:
        imp(base(version=v))
    assert f"version {v}" in str(ei.value)


@pytest.mark.parametrize(
    "over, key",
    [
        ({"shape": "ab"}, "shape"),
        ({"shape": (2, "3")}, "shape"),
        ({"shape": 6}, "shape"),
        ({"data": FAKE_PTR}, "data"),
        ({"data": [FAKE_PTR, False]}, "data"),
        ({"data": (float(FAKE_PTR), False)}, "data[0]"),
        ({"data": (FAKE_PTR, 0)}, "data[1]"),
        ({"typestr": 4}, "typestr"),
        ({"typestr": b"<f4"}, "typestr"),
        ({"version": "3"}, "version"),
        ({"version": 3.0}, "version"),
        ({"strides": "x"}, "strides"),
        ({"strides": (4.0, 4)}, "strides"),
        ({"stream": 1.0}, "stream"),
    ],
)
def test_wrong_types_name_the_key(over, key):
    with pytest.raises(TypeError) as ei:
        imp(base(**over))
    assert f"'{key}'" in str(ei.value)


@pytest.mark.parametrize("missing", ["shape", "typestr", "data", "version"])
def test_missing_keys_named(missing):
    d = base()
    del d[missing]
    with pytest.raises(TypeError) as ei:
        imp(d)
    assert f"'{missing}' is missing" in str(ei.value)


def test_not_a_dict():
    class Bad:
        __cuda_array_interface__ = [("shape", (1,))]

    with pytest.raises(TypeError) as ei:
        tw.asarray(Bad(), device="cuda:0")
    assert "__cuda_array_interface__" in str(ei.value)


def test_negative_shape_refused():
    with pytest.raises(ValueError) as ei:
        imp(base(shape=(2, -3)))
    assert "negative" in str(ei.value)


def test_overflowing_shape_refused():
    with pytest.raises(ValueError):
        imp(base(shape=(2**62, 2**62)))
    with pytest.raises(ValueError):
        imp(base(shape=(2**70,)))


def test_pointer_out_of_range_refused():
    with pytest.raises(ValueError):
        imp(base(data=(-16, False)))
    with pytest.raises(ValueError):
        imp(base(data=(2**64 + 5, False)))
    with pytest.raises((ValueError, IndexError)):
        imp(base(data=(2**64 - 8, False)))  # the elements would wrap around the address space


def test_bad_typestr_refused():
    for ts in ["<f3", "|O8", "<U4", "f4", "<V2"]:
        with pytest.raises(BufferError) as ei:
            imp(base(typestr=ts))
        assert ts in str(ei.value)


def test_big_endian_on_device_refused():
    with pytest.raises(BufferError) as ei:
        imp(base(typestr=">f4"))
    assert "byte order" in str(ei.value)


def test_without_device_and_without_driver_buffer_error_says_what_to_do():
    with pytest.raises(BufferError) as ei:
        tw.asarray(CAI(**base()))
    assert "device='cuda:N'" in str(ei.value)


def test_device_must_be_cuda():
    with pytest.raises(BufferError) as ei:
        imp(base(), device="cpu")
    assert "cpu" in str(ei.value)


def test_cuda_managed_device_accepted():
    t = imp(base(), device=tw.Device((13, 2)))  # kDLCUDAManaged
    assert t.device.device_type == 13 and t.device.index == 2


def test_reexport_cuda_array_interface_v3_with_stream():
    t = imp(base(shape=(4, 5), typestr="<f8", strides=(8, 32), stream=2), device="cuda:1")
    cai = t.__cuda_array_interface__
    assert cai["version"] == 3
    assert "stream" in cai and cai["stream"] == 2
    assert cai["data"] == (FAKE_PTR, False)
    assert cai["shape"] == (4, 5) and cai["typestr"] == "<f8" and cai["strides"] == (8, 32)
    # C-contiguous: strides None; no stream recorded: stream key present and None
    c = imp(base()).__cuda_array_interface__
    assert c["strides"] is None and "stream" in c and c["stream"] is None
    # a consumer that reads the re-export gets the same description back
    again = tw.asarray(CAI(**cai), device="cuda:1")
    assert again.data_ptr == FAKE_PTR and again.strides == (1, 4) and again.stream == 2
    # views re-export their own pointer
    v = t[1:, ::2]
    assert v.__cuda_array_interface__["data"][0] == FAKE_PTR + 8
    assert v.__cuda_array_interface__["strides"] == (8, 64)


def test_readonly_and_zero_size_reexport():
    assert imp(base(data=(FAKE_PTR, True))).__cuda_array_interface__["data"] == (FAKE_PTR, True)
    z = imp(base(shape=(0,), data=(0, False)))
    assert z.__cuda_array_interface__["data"][0] == 0


def test_device_tensor_exports_no_host_protocols():
    t = imp(base(), device="cuda:0")
    assert not hasattr(t, "__array_interface__")
    assert t.__dlpack_device__() == (2, 0)
    with pytest.raises(BufferError):
        memoryview(t)
    import numpy as np

    with pytest.raises(BufferError):
        np.asarray(t)
    with pytest.raises(TypeError):
        import pickle

        pickle.dumps(t)


def test_host_tensor_has_no_cuda_interface():
    import numpy as np

    assert not hasattr(tw.asarray(np.zeros(2)), "__cuda_array_interface__")


def test_views_and_metadata_on_device_tensors_never_touch_memory():
    t = imp(base(shape=(4, 6)), device="cuda:2")
    v = t.T[::-1, 1:3]
    assert v.data_ptr == FAKE_PTR + 4 * (5 * 1 + 1 * 6)
    assert v.shape == (6, 2) and v.strides == (-1, 6)
    t.metadata["k"] = [1, 2]
    assert t[1:].metadata["k"] == [1, 2]
    # copies need the device: refused, never attempted on the host
    with pytest.raises(BufferError):
        t.T.contiguous()
    with pytest.raises(BufferError):
        t.copy()
    with pytest.raises(BufferError):
        tw.asarray(CAI(**base()), device="cuda:0", copy=True)
    assert t.contiguous() is t  # already C-contiguous: no copy needed, so none attempted


def test_dlpack_export_of_device_tensor_stream_rules():
    t = imp(base(), device="cuda:0")
    with pytest.raises(ValueError):
        t.__dlpack__(max_version=(1, 0), stream=0)
    for s in (None, -1, 1, 2):
        cap = t.__dlpack__(max_version=(1, 0), stream=s)
        u = tw.from_dlpack(cap)
        assert u.data_ptr == FAKE_PTR and str(u.device) == "cuda:0"
    with pytest.raises(BufferError):
        t[:, ::-1].__dlpack__(max_version=(1, 0))  # negative strides cannot be copied on the host
    with pytest.raises(BufferError):
        t.__dlpack__(max_version=(1, 0), dl_device=(1, 0))


@pytest.mark.usefixtures("fast_gc")
def test_keeps_the_producer_alive():
    import gc
    import weakref

    obj = CAI(**base())
    w = weakref.ref(obj)
    t = tw.asarray(obj, device="cuda:0")
    del obj
    gc.collect()
    assert w() is not None
    del t
    gc.collect()
    assert w() is None
