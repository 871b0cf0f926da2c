"""The README's examples run as written (issue 14): every fenced block is extracted and run, type-checked or
compiled, unless a marker right above it says why not.

Markers (HTML comments, invisible on GitHub), on the line before a block:
  <!-- readme: skip (reason) -->   not run; the reason must say what tests it instead
  <!-- readme: file NAME -->       written to NAME in the working directory (for a later `run` block)
  <!-- readme: run -->             a sh block executed there, with `python` the interpreter running these tests
Unmarked ```python blocks run as standalone scripts and pass `mypy --strict`; ```cpp blocks compile against this
build and run; ```rust blocks are the Rust crate's doc tests (rust/src/lib.rs includes this README), run by
`make test-rust`; ```sh, ```cmake and ```text blocks are prose unless marked.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest

import tensorwire as tw

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(tw.__file__)))  # <build>/pkg in developer builds


@dataclass
class Block:
    lang: str
    code: str
    line: int
    marker: str  # "", "skip ...", "file NAME", "run"

    @property
    def id(self) -> str:
        return f"README.md:{self.line}:{self.lang}"


def blocks() -> list[Block]:
    out: list[Block] = []
    lines = open(README, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)", lines[i])
        if not m:
            i += 1
            continue
        start = i
        j = i + 1
        while not lines[j].startswith("```"):
            j += 1
        prev = lines[start - 1].strip() if start > 0 else ""
        mk = re.match(r"^<!-- readme: (.*?) -->$", prev)
        out.append(Block(m.group(1), "\n".join(lines[start + 1 : j]) + "\n", start + 1, mk.group(1) if mk else ""))
        i = j + 1
    return out


ALL = blocks()
PY = [b for b in ALL if b.lang == "python" and not b.marker.startswith("skip")]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([PKG_PARENT, e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e["PATH"] = os.path.dirname(sys.executable) + os.pathsep + e.get("PATH", "")
    return e


def test_every_block_is_accounted_for():
    known = {"python", "cpp", "rust", "sh", "cmake", "text"}
    for b in ALL:
        assert b.lang in known, f"{b.id}: a block needs a language ({sorted(known)}) so it is run or shown as text"
        if b.marker.startswith("skip"):
            assert re.match(r"skip \(.{10,}\)$", b.marker), f"{b.id}: a skip says why: <!-- readme: skip (reason) -->"
        if b.lang == "sh" and not b.marker:
            pytest.fail(f"{b.id}: a sh block must be marked run or skip (reason)")
    assert len(PY) >= 6 and any(b.marker == "run" for b in ALL)
    if any(b.lang == "rust" for b in ALL):  # the crate's doc tests include the README
        assert 'include_str!("../../README.md")' in open(os.path.join(ROOT, "rust", "src", "lib.rs")).read()


@pytest.mark.parametrize("block", [b for b in PY if not b.marker], ids=lambda b: b.id)
def test_python_block_runs(block, tmp_path):
    # Topic names are per-user abstract sockets: a unique suffix keeps parallel runs of this test apart.
    code = block.code.replace('Publisher("', f'Publisher("rd{os.getpid()}-').replace('Subscriber("', f'Subscriber("rd{os.getpid()}-')
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"{block.id} failed:\n{r.stdout}\n{r.stderr}"


def test_run_blocks_run_with_their_files(tmp_path):
    files = [b for b in ALL if b.marker.startswith("file ")]
    runs = [b for b in ALL if b.marker == "run"]
    assert files and runs
    for b in files:
        name = b.marker.split(" ", 1)[1]
        (tmp_path / name).write_text(b.code.replace('("camera")', f'("camera-{os.getpid()}")'))
    for b in runs:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", b.code], cwd=tmp_path, env=env(), capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, f"{b.id} failed:\n{r.stdout}\n{r.stderr}"
        if "producer.py" in b.code:  # what the README says the consumer prints
            assert "frame 0 (480, 640, 3) uint8 0" in r.stdout and "frame 4 (480, 640, 3) uint8 4" in r.stdout, r.stdout
            assert "last: (3, 2) [[0.0, 2.0], [4.0, 6.0], [8.0, 10.0]]" in r.stdout, r.stdout


@pytest.mark.skipif(os.environ.get("TW_UNDER_ASAN") == "1", reason="type checking is the same under ASan; run once")
def test_python_blocks_pass_mypy_strict(tmp_path):
    pytest.importorskip("mypy", reason="mypy is installed by `make test` (the venv's packages)")
    paths = []
    for n, b in enumerate(PY):
        p = tmp_path / f"readme_block_{n}_line{b.line}.py"
        p.write_text(b.code)
        paths.append(str(p))
    paths.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "typed_usage.py"))  # (the stub's gaps)
    cache = os.path.join(PKG_PARENT, os.pardir, "mypy-cache")
    # --strict, with two allowances for third parties: torchvision ships no type information (no py.typed), and
    # torch's __init__ re-exports from_dlpack without marking it (mypy's strict no_implicit_reexport).
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\nstrict = True\n\n[mypy-torchvision.*]\nignore_missing_imports = True\n\n"
                      "[mypy-torch]\nimplicit_reexport = True\n")
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--config-file", str(config), "--cache-dir", cache,
                        "--no-error-summary", "--python-executable", sys.executable, *paths],
                       env=dict(env(), MYPYPATH=PKG_PARENT),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"mypy --strict on the README's Python examples:\n{r.stdout}\n{r.stderr}"


@pytest.mark.skipif(os.environ.get("TW_UNDER_ASAN") == "1", reason="compiled against the release build")
@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "cpp" and not b.marker], ids=lambda b: b.id)
def test_cpp_block_compiles_and_runs(block, tmp_path):
    lib = os.path.join(PKG_PARENT, os.pardir, "libtensorwire.a")
    if not os.path.exists(lib):
        pytest.skip(f"no libtensorwire.a next to this package ({lib}): not a developer build")
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if not cxx:
        pytest.skip("no C++ compiler")
    src = tmp_path / "example.cpp"
    src.write_text(block.code)
    exe = tmp_path / "example"
    subprocess.run([cxx, "-std=c++20", "-O1", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "include"),
                    str(src), lib, "-pthread", "-ldl", "-o", str(exe)], check=True, timeout=300)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{block.id}: {r.stdout}\n{r.stderr}"
