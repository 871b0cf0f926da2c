"""CUDA in tensorwire: whether it is there, and its memory pools.

tensorwire loads the CUDA driver at run time: on a machine without a driver or a GPU everything host-side works,
``is_available()`` is False and ``status()`` says why; every CUDA operation then raises an error naming that reason.

    >>> import tensorwire as tw
    >>> tw.cuda.is_available() or bool(tw.cuda.status())
    True
"""

from __future__ import annotations

from . import _tensorwire as _ext

__all__ = [
    "is_available",
    "status",
    "device_count",
    "driver_version",
    "kernels_built",
    "pinned_pool_stats",
    "device_pool_stats",
    "empty_cache",
]


def is_available() -> bool:
    """True when the CUDA driver loaded, initialised, and sees at least one device."""
    return _ext._cuda_is_available()


def status() -> str:
    """What CUDA there is ("1 CUDA device, driver 13.0"), or why there is none, in words."""
    return _ext._cuda_status()


def device_count() -> int:
    """CUDA devices this process sees (0 without a driver)."""
    return _ext._cuda_device_count()


def driver_version() -> int:
    """The driver's CUDA version as 1000 * major + 10 * minor (13000 for 13.0); 0 without a driver."""
    return _ext._cuda_driver_version()


def kernels_built() -> bool:
    """True when this build carries tensorwire's strided-copy kernels (it was built with nvcc)."""
    return _ext._cuda_kernels_built()


def pinned_pool_stats() -> dict:
    """The pinned host pool: reserved_bytes, in_use_bytes, cached_blocks, hits, misses."""
    return _ext._cuda_pinned_pool_stats()


def device_pool_stats(device: int | str | _ext.Device = 0) -> dict:
    """cuda:``device``'s pool (an index, "cuda:N" or a tw.Device): reserved_bytes, in_use_bytes, cached_blocks,
    hits, misses."""
    if isinstance(device, (str, _ext.Device)):
        d = _ext.Device(device) if isinstance(device, str) else device
        if d.type != "cuda":
            raise ValueError(f"tensorwire.cuda.device_pool_stats: {d} is not a CUDA device (cuda:N)")
        index = d.index
    elif isinstance(device, bool) or not hasattr(device, "__index__"):
        raise TypeError("tensorwire.cuda.device_pool_stats: device must be an int, 'cuda:N' or a tw.Device, not "
                        f"{type(device).__name__}")
    else:
        index = device.__index__()
    if not 0 <= index < 2**31:
        raise ValueError(f"tensorwire.cuda.device_pool_stats: cuda:{index} does not exist")
    return _ext._cuda_device_pool_stats(index)


def empty_cache() -> None:
    """Returns every cached block of the pools to the driver, once the work queued on it is done."""
    _ext._cuda_empty_cache()

del annotations  # (the __future__ import binds the name: not part of the public namespace)
