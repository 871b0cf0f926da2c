"""tensorwire's C++ headers next to another project's DLPack header (what a C++ extension bridging ATen sees)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = r"""
#include <ATen/dlpack.h>  // PyTorch's copy of the official header (DLPack 1.3): its guard skips tensorwire's
#include <tensorwire/tensorwire.hpp>

static_assert(DLPACK_MINOR_VERSION == 3, "the premise: an older official header came first");
static_assert(tw::DType::bcomplex32().code == 18 && tw::DType::bcomplex32().bits == 32);
static_assert(tw::DLPackExportOptions{}.max_version.minor == 4, "exports default to the version tensorwire speaks");
static_assert(tw::ExportRequest{}.max_version.minor == 4);
int main() { return tw::DType::bcomplex32().name().empty(); }
"""


def test_headers_compile_after_pytorchs_older_dlpack_header(tmp_path):
    # <ATen/dlpack.h> first made tensorwire's 1.4 declarations a no-op: "kDLBcomplex was not declared", and the
    # export defaults would have been capped at 1.3 in that translation unit.
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler on this machine")
    include = os.path.join(os.path.dirname(torch.__file__), "include")
    if not os.path.exists(os.path.join(include, "ATen", "dlpack.h")):
        pytest.skip("this PyTorch ships no C++ headers")
    src = tmp_path / "aten_first.cpp"
    src.write_text(PROGRAM)
    r = subprocess.run([cxx, "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                        "-I", os.path.join(ROOT, "include"), "-isystem", include, str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
