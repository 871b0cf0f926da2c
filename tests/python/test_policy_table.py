"""One table of import/export policy cases, run through Python and through the C ABI (libtensorwire_c via ctypes):
both must take the same decision (the same result, or the same error with the same text), because both call the
one C++ policy (tw::export_dlpack / tw::import_dlpack)."""

from __future__ import annotations

import ctypes
import itertools
import pathlib

import numpy as np
import pytest
import tensorwire as tw
from _helpers import DLDataType, DLDevice, DLTensor, ptr


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))),
    ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor)))]


class ExportOptions(ctypes.Structure):  # tw_export_options
    _fields_ = [("struct_size", ctypes.c_uint32), ("copy", ctypes.c_int32), ("consumer", ctypes.c_int32),
                ("has_device", ctypes.c_int32), ("device", DLDevice), ("has_stream", ctypes.c_int32),
                ("stream", ctypes.c_int64), ("max_version", DLPackVersion)]


class ImportOptions(ctypes.Structure):  # tw_import_options
    _fields_ = [("struct_size", ctypes.c_uint32), ("copy", ctypes.c_int32), ("has_device", ctypes.c_int32),
                ("device", DLDevice)]


def _find_c_library() -> pathlib.Path:
    native = pathlib.Path(tw._tensorwire.__file__).resolve()
    for d in [native.parent, *native.parents]:
        cand = d / "libtensorwire_c.so"
        if cand.exists():
            return cand
    raise FileNotFoundError(f"libtensorwire_c.so not found above {native} (make build makes it)")


LIB = ctypes.CDLL(str(_find_c_library()))
P = ctypes.c_void_p
LIB.tw_last_error.restype = ctypes.c_char_p
LIB.tw_tensor_from_blob.argtypes = [P, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
                                    DLDataType, DLDevice, P, P, ctypes.POINTER(P)]
LIB.tw_tensor_as_readonly.argtypes = [P, ctypes.POINTER(P)]
LIB.tw_tensor_free.argtypes = [P]
# The header's tw_*_options_init are inline wrappers passing sizeof: ctypes calls the exported *_init_sized.
LIB.tw_export_options_init_sized.argtypes = [ctypes.POINTER(ExportOptions), ctypes.c_size_t]
LIB.tw_import_options_init_sized.argtypes = [ctypes.POINTER(ImportOptions), ctypes.c_size_t]
LIB.tw_tensor_export_dlpack.argtypes = [P, ctypes.POINTER(ExportOptions),
                                        ctypes.POINTER(ctypes.POINTER(DLManagedTensorVersioned)),
                                        ctypes.POINTER(ctypes.c_int)]
LIB.tw_tensor_export_dlpack_legacy.argtypes = [P, ctypes.POINTER(ExportOptions),
                                               ctypes.POINTER(ctypes.POINTER(DLManagedTensor))]
LIB.tw_tensor_import_dlpack.argtypes = [ctypes.c_void_p, ctypes.POINTER(ImportOptions), ctypes.POINTER(P)]
LIB.tw_tensor_data.argtypes = [P]
LIB.tw_tensor_data.restype = P
LIB.tw_tensor_readonly.argtypes = [P]
LIB.tw_tensor_ndim.argtypes = [P]
LIB.tw_tensor_strides.argtypes = [P]
LIB.tw_tensor_strides.restype = ctypes.POINTER(ctypes.c_int64)

# tw_status -> the Python exception class the binding raises for the same tw::ErrorCode.
STATUS_CLASS = {1: ValueError, 2: TypeError, 3: IndexError, 4: ValueError, 5: BufferError, 6: tw.CopyError,
                7: BufferError, 8: BufferError, 9: ValueError, 11: MemoryError}

ctypes.pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
ctypes.pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
ctypes.pythonapi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _sources():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    ro = a.copy()
    ro.flags.writeable = False
    return {
        "contiguous": a,
        "transposed": a.T,
        "negative": a[::-1, 1::2],
        "broadcast": np.broadcast_to(a[:1], (4, 6)),  # read-only in NumPy, stride 0
        "readonly": ro,
        "readonly-negative": ro[:, ::-1],
    }


SOURCES = _sources()


def c_tensor(view: np.ndarray):
    """The same memory as a tw_tensor handle (read-only when the view is)."""
    isz = view.itemsize
    shape = (ctypes.c_int64 * view.ndim)(*view.shape)
    strides = (ctypes.c_int64 * view.ndim)(*[s // isz for s in view.strides])
    h = P()
    rc = LIB.tw_tensor_from_blob(ptr(view), view.ndim, shape, strides, DLDataType(2, 32, 1), DLDevice(1, 0),
                                 None, None, ctypes.byref(h))
    assert rc == 0, LIB.tw_last_error()
    if not view.flags.writeable:
        r = P()
        assert LIB.tw_tensor_as_readonly(h, ctypes.byref(r)) == 0
        LIB.tw_tensor_free(h)
        h = r
    return h


def describe(dl: DLTensor, version=None, flags=None, origin=0):
    n = dl.ndim
    return ("ok", version, flags, tuple(dl.shape[i] for i in range(n)), tuple(dl.strides[i] for i in range(n)),
            dl.data == origin, (dl.device.device_type, dl.device.device_id))


COPIES = [None, True, False]
VERSIONS = [None, (1, 0), (1, 4), (2, 0)]
DEVICES = [None, (1, 0), (2, 0)]
STREAMS = [None, -1, 5]
EXPORT_CASES = list(itertools.product(SOURCES, COPIES, VERSIONS, DEVICES, STREAMS))


def python_export(view, copy, version, device, stream):
    t = tw.asarray(view)
    try:
        cap = t.__dlpack__(stream=stream, max_version=version, dl_device=device, copy=copy)
    except Exception as e:  # noqa: BLE001 - the outcome is the comparison
        return ("error", type(e), str(e))
    if version is None:
        p = ctypes.pythonapi.PyCapsule_GetPointer(cap, b"dltensor")
        m = DLManagedTensor.from_address(p)
        return describe(m.dl_tensor, origin=ptr(view))
    p = ctypes.pythonapi.PyCapsule_GetPointer(cap, b"dltensor_versioned")
    m = DLManagedTensorVersioned.from_address(p)
    return describe(m.dl_tensor, (m.version.major, m.version.minor), m.flags, ptr(view))


def c_export(view, copy, version, device, stream):
    h = c_tensor(view)
    try:
        o = ExportOptions()
        LIB.tw_export_options_init_sized(ctypes.byref(o), ctypes.sizeof(o))
        o.copy = {None: 0, True: 1, False: 2}[copy]
        if device is not None:
            o.has_device, o.device = 1, DLDevice(*device)
        if stream is not None:
            o.has_stream, o.stream = 1, stream
        if version is None:
            out = ctypes.POINTER(DLManagedTensor)()
            rc = LIB.tw_tensor_export_dlpack_legacy(h, ctypes.byref(o), ctypes.byref(out))
            if rc:
                return ("error", STATUS_CLASS[rc], LIB.tw_last_error().decode())
            r = describe(out.contents.dl_tensor, origin=ptr(view))
            out.contents.deleter(out)
            return r
        o.max_version = DLPackVersion(*version)
        out = ctypes.POINTER(DLManagedTensorVersioned)()
        copied = ctypes.c_int(-1)
        rc = LIB.tw_tensor_export_dlpack(h, ctypes.byref(o), ctypes.byref(out), ctypes.byref(copied))
        if rc:
            return ("error", STATUS_CLASS[rc], LIB.tw_last_error().decode())
        m = out.contents
        r = describe(m.dl_tensor, (m.version.major, m.version.minor), m.flags, ptr(view))
        assert copied.value == int(bool(m.flags & 2))
        m.deleter(out)
        return r
    finally:
        LIB.tw_tensor_free(h)


@pytest.mark.parametrize("source,copy,version,device,stream", EXPORT_CASES)
def test_export_decisions_agree(source, copy, version, device, stream):
    view = SOURCES[source]
    py = python_export(view, copy, version, device, stream)
    c = c_export(view, copy, version, device, stream)
    if py[0] == "error":
        assert issubclass(py[1], c[1]) if c[0] == "error" else False, (py, c)
    assert py[0] == c[0] and (py[2:] if py[0] == "error" else py) == (c[2:] if c[0] == "error" else c), (py, c)


def test_the_table_covers_every_decision():
    """The table is only worth running if it reaches each rule: zero-copy, copies, and each kind of refusal."""
    outcomes = [c_export(SOURCES[s], *rest) for s, *rest in EXPORT_CASES]
    errors = {o[1] for o in outcomes if o[0] == "error"}
    assert {tw.CopyError, BufferError, ValueError} <= errors
    assert any(o[0] == "ok" and o[5] for o in outcomes) and any(o[0] == "ok" and not o[5] for o in outcomes)
    texts = {o[2] for o in outcomes if o[0] == "error"}
    assert any("negative" in t for t in texts) and any("read-only" in t for t in texts)
    assert any("stream" in t for t in texts) and any("copy is forbidden" in t for t in texts)


IMPORT_CASES = list(itertools.product(["contiguous", "readonly", "negative"], COPIES, DEVICES))


def numpy_capsule(view):
    cap = view.__dlpack__(max_version=(1, 0))
    p = ctypes.pythonapi.PyCapsule_GetPointer(cap, b"dltensor_versioned")
    return cap, p


@pytest.mark.parametrize("source,copy,device", IMPORT_CASES)
def test_import_decisions_agree(source, copy, device):
    view = SOURCES[source]
    cap, _ = numpy_capsule(view)
    try:
        t = tw.from_dlpack(cap, copy=copy, device=device)
        py = ("ok", t.data_ptr == ptr(view), t.readonly, t.strides)
    except Exception as e:  # noqa: BLE001
        py = ("error", type(e), str(e))
    cap, p = numpy_capsule(view)
    assert ctypes.pythonapi.PyCapsule_SetName(cap, b"used_dltensor_versioned") == 0  # the C ABI owns it now
    o = ImportOptions()
    LIB.tw_import_options_init_sized(ctypes.byref(o), ctypes.sizeof(o))
    o.copy = {None: 0, True: 1, False: 2}[copy]
    if device is not None:
        o.has_device, o.device = 1, DLDevice(*device)
    h = P()
    rc = LIB.tw_tensor_import_dlpack(p, ctypes.byref(o), ctypes.byref(h))
    if rc:
        c = ("error", STATUS_CLASS[rc], LIB.tw_last_error().decode())
    else:
        st = LIB.tw_tensor_strides(h)
        c = ("ok", LIB.tw_tensor_data(h) == ptr(view), bool(LIB.tw_tensor_readonly(h)),
             tuple(st[i] for i in range(LIB.tw_tensor_ndim(h))))
        LIB.tw_tensor_free(h)
    if py[0] == "error" and c[0] == "error":
        assert issubclass(py[1], c[1]) and py[2].endswith(c[2]), (py, c)
    else:
        assert py == c
