"""Helpers shared by the test modules (imported as a plain module: pytest puts this folder on sys.path)."""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

UNDER_ASAN = os.environ.get("TW_UNDER_ASAN") == "1" or "libasan" in os.environ.get("LD_PRELOAD", "")

# A fake device pointer for CUDA Array Interface tests: nothing may ever dereference it.
FAKE_PTR = 0xDEAD0000


def _no_cuda_driver() -> bool:
    import tensorwire as tw

    return "could not be loaded" in tw._tensorwire.cuda_driver_status()


# True where no NVIDIA driver loads (CI, this project's machines). Tests that build CUDA tensors over FAKE_PTR or
# made-up stream handles run only there: with a driver, those would reach it (a copy from a made-up address, an
# event on a made-up stream; the driver checks neither). test_cuda*.py test the real producers on a GPU.
NO_CUDA_DRIVER = _no_cuda_driver()
needs_no_cuda_driver = pytest.mark.skipif(
    not NO_CUDA_DRIVER, reason="a CUDA driver is loaded: this test's fake device pointers and streams would reach it")


def ptr(a: np.ndarray) -> int:
    """Address of element 0 of a NumPy array."""
    return a.__array_interface__["data"][0]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Same shape, same dtype, same bytes element by element (NaN payloads and -0.0 included)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def bits_view(a: np.ndarray) -> np.ndarray:
    """A view of `a` as unsigned integers of the element's size (complex: of its real part), same strides."""
    if a.dtype.kind == "c":
        a = a.real
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def flip_first(a: np.ndarray) -> None:
    """Flips the lowest bit of element (0, ..., 0) in place (a valid bool stays a valid bool)."""
    u = bits_view(a)
    u[(0,) * a.ndim] ^= 1


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def jax_on_cpu():
    """A context in which new JAX arrays go to the CPU. The host tests that make JAX arrays are about host memory,
    and where JAX has a GPU (`make test-gpu` runs them there) `jnp.arange` would put them on it."""
    import jax

    return jax.default_device(jax.devices("cpu")[0])


def aligned(a: np.ndarray, alignment: int = 64) -> np.ndarray:
    """A C-contiguous copy of `a` whose data starts on an `alignment`-byte boundary (XLA copies unaligned buffers
    instead of viewing them)."""
    raw = np.empty(a.nbytes + alignment, dtype=np.uint8)
    off = (-ptr(raw)) % alignment
    out = raw[off : off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


# The DLPack 1.3 C structs as ctypes declarations, for tests that build or inspect capsules by hand.
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]
