"""Where an installed tensorwire keeps what C and C++ users need (as nanobind and pybind11 tell theirs)."""

from __future__ import annotations

import os

_PKG = os.path.dirname(os.path.abspath(__file__))


def _inside(*parts: str) -> str:
    path = os.path.join(_PKG, *parts)
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"{path} does not exist: this tensorwire ({_PKG}) is a development build without the C++ package; "
            "install tensorwire from a wheel (`make wheel`, then pip install it) or use `cmake --install` and "
            "CMAKE_PREFIX_PATH")
    return path


def cmake_dir() -> str:
    """The directory holding tensorwireConfig.cmake, for ``find_package(tensorwire CONFIG)``.

    Pass it as ``-Dtensorwire_DIR=$(python -c "import tensorwire; print(tensorwire.cmake_dir())")``, or put the
    package directory (``os.path.dirname(tensorwire.__file__)``) on CMAKE_PREFIX_PATH. Targets: tensorwire::tensorwire (static), tensorwire::tensorwire_shared,
    tensorwire::tensorwire_c (the C ABI).
    """
    return _inside("lib", "cmake", "tensorwire")


def include_dir() -> str:
    """The directory holding tensorwire/tensorwire.hpp and tensorwire/tensorwire.h."""
    return _inside("include")


def lib_dir() -> str:
    """The directory holding libtensorwire.a, libtensorwire.so and libtensorwire_c.so."""
    return _inside("lib")


def pkgconfig_dir() -> str:
    """The directory holding tensorwire.pc and tensorwire_c.pc: ``PKG_CONFIG_PATH=$(...) pkg-config tensorwire``."""
    return _inside("lib", "pkgconfig")
