"""Python scalars from one-element tensors (as NumPy has them), and DType / Device pickling and NumPy dtypes
(issue 14, first part)."""

from __future__ import annotations

import operator
import os
import pickle
import warnings

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorwire as tw


@pytest.mark.parametrize(
    "a",
    [np.array(2.5), np.array([[7]], np.int16), np.array(True), np.array([-3], np.int64), np.array(1 + 2j, np.complex64),
     np.array(1.5, ml_dtypes.bfloat16), np.array(200, np.uint8)],
    ids=lambda a: f"{a.dtype}{a.shape}",
)
def test_one_element_tensors_convert_as_numpy_does(a):
    t = tw.asarray(a)
    assert t.item() == a.item() and type(t.item()) is type(a.item())
    if a.dtype.kind != "c":
        # any one-element tensor converts, as in PyTorch (NumPy 2 converts 0-d arrays only)
        assert float(t) == float(a.item()) and int(t) == int(a.item())
        assert bool(t) == bool(a.item())
    assert complex(t) == complex(a.item())
    if a.dtype.kind in "iu":
        assert operator.index(t) == operator.index(a.reshape(()))


def test_a_view_element_converts():
    t = tw.asarray(np.arange(6.0).reshape(2, 3))
    assert float(t[1, 2]) == 5.0 and int(t[1, 2]) == 5 and t[1, 2].item() == 5.0
    assert float(t.T[2, 1]) == 5.0
    x = tw.asarray(torch.arange(10, dtype=torch.int32)[::3])
    assert [int(x[i]) for i in range(len(x))] == [0, 3, 6, 9]
    assert list(range(20))[x[2]] == 6  # __index__


def test_errors_name_the_problem():
    t = tw.asarray(np.arange(6.0).reshape(2, 3))
    with pytest.raises(ValueError, match="ambiguous"):
        bool(t)
    with pytest.raises(ValueError, match="empty tensor is ambiguous"):
        bool(tw.asarray(np.zeros(0)))
    with pytest.raises(ValueError, match=r"one element .* shape \(2, 3\)"):
        t.item()
    with pytest.raises(TypeError, match="one element"):
        float(t)
    with pytest.raises(TypeError, match="one element"):
        int(t)
    with pytest.raises(TypeError, match="integer tensor"):
        operator.index(t[0, 0])
    with pytest.raises(TypeError, match="integer tensor"):
        operator.index(tw.asarray(np.array(True)))
    with pytest.raises(TypeError, match="complex"):
        float(tw.asarray(np.array(1j)))
    with pytest.raises(TypeError):
        len(tw.asarray(np.array(3.0)))


def test_dtype_and_device_pickle():
    for d in (tw.float32, tw.bfloat16, tw.int4, tw.bool_, tw.DType("complex64")):
        assert pickle.loads(pickle.dumps(d)) == d
    for dev in (tw.Device("cpu"), tw.Device("cuda:1"), tw.Device("cuda_host")):
        back = pickle.loads(pickle.dumps(dev))
        assert back == dev and str(back) == str(dev)


def test_numpy_dtype_of_a_dtype():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.dtype(tw.float32) == np.float32
        assert np.dtype(tw.uint16) == np.uint16
        assert np.dtype(tw.bfloat16) == ml_dtypes.bfloat16
        assert np.dtype(tw.float8_e4m3fn) == ml_dtypes.float8_e4m3fn
        assert np.zeros(2, dtype=tw.int8).dtype == np.int8
    assert tw.float32 == np.float32 and tw.float32 == np.dtype("float32") and tw.float32 == torch.float32
    assert tw.float32 != np.float64 and tw.int64 != torch.int32


def test_metadata_takes_numpy_scalars_and_0d_arrays_as_python_values():
    import datetime
    import enum

    t = tw.asarray(np.zeros(2))
    t.metadata["f"] = np.float32(1.5)
    t.metadata["i"] = np.int64(-3)
    t.metadata["u"] = np.array(5, np.uint64)
    t.metadata["b"] = np.bool_(True)
    t.metadata["s"] = np.str_("x")
    t.metadata["n"] = {"deep": [np.int8(1), np.array(2.5)]}
    got = dict(t.metadata)
    assert got == {"f": 1.5, "i": -3, "u": 5, "b": True, "s": "x", "n": {"deep": [1, 2.5]}}
    assert [type(got[k]) for k in "fiubs"] == [float, int, int, bool, str]

    class Color(enum.Enum):
        RED = 1

    for value, msg in (
        (np.arange(3), r"NumPy array of shape \(3,\); store a.tolist\(\)"),
        (np.complex64(1j), r"complex64 .* store \[x.real, x.imag\]"),
        (np.datetime64("2020-01-01"), "datetime64"),
        (datetime.datetime(2020, 1, 1), r"datetime.datetime.*isoformat"),
        (datetime.timedelta(seconds=3), "total_seconds"),
        (Color.RED, r"enum member .* \.value or \.name"),
    ):
        with pytest.raises(TypeError, match=msg):
            t.metadata["bad"] = value
    assert "bad" not in t.metadata
    name = f"t14.{id(t)}"
    with tw.Subscriber(name) as sub, tw.Publisher(name) as pub:
        pub.send(np.zeros(1), metadata={"step": np.int64(7), "loss": np.float64(0.25)})
        assert dict(sub.recv(timeout=10).metadata) == {"step": 7, "loss": 0.25}


def test_command_line_version():
    import subprocess
    import sys

    for args in (["--version"], ["version"]):
        out = subprocess.run([sys.executable, "-m", "tensorwire", *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"tensorwire {tw.__version__} (DLPack {tw.DLPACK_VERSION[0]}.{tw.DLPACK_VERSION[1]})"


def test_errors_name_python_functions_not_cpp_ones():
    t = tw.asarray(np.arange(6.0).reshape(2, 3))
    cases = [
        (lambda: t.reshape(4), ValueError, r"^tensorwire\.Tensor\.reshape: shape \(4,\) holds 4 elements"),
        (lambda: t.T.view(6), tw.CopyError, r"^tensorwire\.Tensor\.view: "),
        (lambda: t.select(5, 0), IndexError, r"^tensorwire\.Tensor\.select: dimension 5"),
        (lambda: t.permute(0, 0), ValueError, r"^tensorwire\.Tensor\.permute: "),
        (lambda: t.expand(3, 3), ValueError, r"^tensorwire\.Tensor\.expand: "),
        (lambda: tw.empty((1 << 46,), "float64"), MemoryError, r"^tensorwire\.empty: "),
    ]
    for f, exc, msg in cases:
        with pytest.raises(exc, match=msg) as info:
            f()
        assert "::" not in str(info.value)


def test_equality_is_refused_with_a_pointer_to_numpy():
    t = tw.asarray(np.arange(3.0))
    u = tw.asarray(np.arange(3.0))
    for f in (lambda: t == u, lambda: t != u, lambda: t == t, lambda: t == 1.0):
        with pytest.raises(TypeError, match=r"np\.array_equal"):
            f()
    assert np.array_equal(np.asarray(t), np.asarray(u))
    assert (np.asarray(t) == u).all()  # NumPy on the left converts the tensor, as for any array-like
    assert t in [t] and {t: 1}[t] == 1 and len({t, u}) == 2  # identity hashing, as before


def test_repr_shows_values_like_numpy_and_never_raises():
    t = tw.asarray(np.arange(6.0).reshape(2, 3))
    r = repr(t)
    assert r.startswith("tensorwire.Tensor([[0., 1., 2.],") and "[3., 4., 5.]]" in r
    assert r.endswith("shape=(2, 3), dtype=float64, device=cpu)")
    assert "strides=(1, 3)" in repr(t.T) and "[[0., 3.]," in repr(t.T)
    big = repr(tw.asarray(np.arange(10**6, dtype=np.int32)))
    assert "..." in big and "999999]" in big and len(big) < 300  # summarised
    assert repr(tw.asarray(np.array(2.5))).startswith("tensorwire.Tensor(2.5, shape=()")
    assert repr(tw.empty((3,), "int4")) == "tensorwire.Tensor(shape=(3,), dtype=int4, device=cpu)"  # packed: layout only
    name = f"t14r.{id(t)}"
    with tw.Subscriber(name) as sub, tw.Publisher(name) as pub:
        loan = pub.loan((2,), "float32")
        pub.send(loan)
        assert repr(loan) == "tensorwire.Tensor(<spent: a loan handed over by Publisher.send>)"
        got = sub.recv(timeout=10)
        assert "readonly=True" in repr(got)
        del got


def _cli(*args, timeout=120):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "tensorwire", *args], capture_output=True, text=True, timeout=timeout)


def test_doctor_reports_this_machine():
    import json
    import resource

    out = _cli("doctor", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["tensorwire"]["version"] == tw.__version__
    assert d["dependencies"]["numpy"] == np.__version__
    assert d["dependencies"]["torch"] == torch.__version__.split("+")[0] or d["dependencies"]["torch"] == torch.__version__
    assert d["memfd"]["ok"] is True and d["memfd"]["seals"] is True
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert d["limits"]["RLIMIT_NOFILE"] == {"soft": soft, "hard": hard}
    with open("/proc/sys/vm/max_map_count") as f:
        assert d["limits"]["vm.max_map_count"] == int(f.read())
    assert isinstance(d["cuda"]["driver"], str) and d["cuda"]["available"] == (d["cuda"]["driver"] == "ok")
    assert "present" in d["ucx"]
    human = _cli("doctor")
    assert human.returncode == 0 and "memfd + seals:   yes" in human.stdout and "CUDA:" in human.stdout


def test_help_lists_the_modes_and_bench_defaults_to_quick():
    h = _cli("--help")
    assert h.returncode == 0
    for mode in ("demo", "bench", "doctor", "version", "--full"):
        assert mode in h.stdout
    b = _cli("bench", "--help")
    assert b.returncode == 0 and "--full" in b.stdout and "quick" in b.stdout
    both = _cli("bench", "--quick", "--full")
    assert both.returncode != 0 and "exclude each other" in both.stderr


def test_public_functions_and_methods_have_docstrings_with_signatures():
    for f in (tw.empty, tw.zeros, tw.asarray, tw.from_dlpack, tw.to_numpy, tw.to_torch):
        assert f.__doc__ and len(f.__doc__) > 40, f
    for name in ("reshape", "view", "permute", "transpose", "expand", "select", "slice", "contiguous", "copy",
                 "as_readonly", "is_contiguous", "numpy", "tolist", "item"):
        doc = getattr(tw.Tensor, name).__doc__ or ""
        assert len(doc) > 40, name
    assert tw.Tensor.reshape.__doc__.startswith("reshape(self, *shape: int) -> Tensor")
    assert tw.Tensor.select.__doc__.startswith("select(self, dim: int, index: int)")


def test_an_import_refusal_lists_each_protocols_reason_on_one_line_without_tracebacks():
    class Broken:
        def __dlpack__(self, **kwargs):
            raise RuntimeError("exporter exploded\nsecond line")

        def __dlpack_device__(self):
            return (1, 0)

        @property
        def __array_interface__(self):
            raise KeyError("no interface today")

    with pytest.raises(BufferError) as info:
        tw.asarray(Broken())
    msg = str(info.value)
    assert "Traceback" not in msg and 'File "' not in msg, msg
    lines = msg.splitlines()
    assert lines[0].startswith("tensorwire.asarray: cannot import an object of type Broken")
    assert any(l.startswith("  - __dlpack__: RuntimeError: exporter exploded second line") for l in lines), lines
    assert any(l.startswith("  - __array_interface__: KeyError:") for l in lines), lines
    assert len(lines) == 3, lines


def test_wrong_types_and_values_get_the_exceptions_python_users_expect():
    sub = tw.Subscriber(f"errors-{os.getpid()}")
    try:
        with pytest.raises(TypeError, match="timeout must be None or a number of seconds, not str"):
            sub.recv(timeout="1")
        with pytest.raises(ValueError, match="timeout"):
            sub.recv(timeout=-1.0)
    finally:
        sub.close()
    assert sub.dropped == 0 and sub.connected is False and sub.closed  # counters stay readable after close()
    pub = tw.Publisher(f"errors-{os.getpid()}-p")
    pub.close()
    assert (pub.dropped, pub.subscribers, pub.pool_buffers, pub.closed) == (0, 0, 0, True)
    with pytest.raises(TypeError, match="shape must be a tuple of ints"):
        tw.empty("abc")
    with pytest.raises(TypeError, match="dtype must be"):
        tw.empty((2,), 5)
    with pytest.raises(ValueError, match="unknown dtype name 'float33'"):
        tw.empty((2,), "float33")
    with pytest.raises(MemoryError):
        tw.zeros((1 << 45,), "float32")
    with pytest.raises(ValueError, match="overflow"):
        tw.empty((1 << 62, 1 << 62))
    with pytest.raises(TypeError):
        tw.Publisher(5)
    with pytest.raises(ValueError, match="on_full"):
        tw.Publisher("x", on_full="sometimes")
    with pytest.raises(TypeError, match="copy must be None, True or False"):
        tw.asarray(np.zeros(3), copy="yes")
