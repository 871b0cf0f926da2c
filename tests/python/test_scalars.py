"""Python scalars from one-element tensors (as NumPy has them), and DType / Device pickling and NumPy dtypes
(issue 14, first part)."""

from __future__ import annotations

import json
import operator
import os
import pickle
import re
import sys
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
    with pytest.raises(TypeError, match="len.. of a 0-d tensor"):
        len(tw.asarray(np.array(3.0)))


def test_index_takes_every_integer_type_of_one_lane_and_nothing_else():
    for a in (np.array(-3, np.int8), np.array([7], np.uint64), np.array(-2, ml_dtypes.int4),
              np.array(3, ml_dtypes.uint4), np.array(-1, ml_dtypes.int2), np.array(2, ml_dtypes.uint2)):
        assert operator.index(tw.asarray(a)) == a.item()
    for t in (tw.asarray(np.array(True)), tw.asarray(np.array(1.0, np.float16)), tw.zeros((1,), "int8x4")):
        with pytest.raises(TypeError, match=rf"^operator\.index\(\): only an integer tensor .* is {t.dtype}$"):
            operator.index(t)


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
    with pytest.raises(TypeError, match="^NumPy has no type for float32x4"):
        tw.DType("float32x4").dtype


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


class FakeCudaArray:
    """__cuda_array_interface__ v3 claiming that host memory is on the GPU: tensorwire imports it without a GPU when
    told the device, which is enough to test what must never read device memory (a regression that reads it shows
    values instead of crashing)."""

    def __init__(self, shape=(3,), typestr="<f4"):
        self._host = np.ones(shape, np.dtype(typestr))
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (self._host.ctypes.data, False),
                                         "version": 3, "strides": None, "stream": None}


def test_equality_with_a_tensor_an_array_or_a_number_is_refused_with_a_pointer_to_numpy():
    t = tw.asarray(np.arange(3.0))
    u = tw.asarray(np.arange(3.0))
    others = [u, t, 1, 1.0, 1j, True, np.float32(1), np.int64(1), np.bool_(True), np.arange(3.0), torch.arange(3.0),
              memoryview(np.arange(3.0)), FakeCudaArray()]
    reflected = [u, 1, 1.0, 1j, True, FakeCudaArray()]  # NumPy and PyTorch on the left convert the tensor themselves
    checks = [f for o in others for f in (lambda o=o: t == o, lambda o=o: t != o)]
    checks += [lambda o=o: o == t for o in reflected]
    for f in checks:
        with pytest.raises(TypeError, match=r"does not support == or != .*np\.array_equal"):
            f()
    with pytest.raises(TypeError, match=r"with int .* a one-element tensor's value is t\.item\(\)"):
        t == 1
    with pytest.raises(TypeError, match=r"np\.array_equal"):
        t in [u, t]  # list membership compares u == t before it reaches t itself
    assert np.array_equal(np.asarray(t), np.asarray(u))
    assert (np.asarray(t) == u).all()  # NumPy on the left converts the tensor, as for any array-like
    assert {t: 1}[t] == 1 and len({t, u}) == 2  # identity hashing, as before


def test_equality_with_anything_else_compares_identity():
    t = tw.asarray(np.arange(3.0))
    assert (t == None) is False and (t != None) is True  # noqa: E711 - the operator itself is under test
    assert (t == "x") is False and (t != "x") is True
    assert (t == [0.0, 1.0, 2.0]) is False and (t == object()) is False
    assert [None, t] == [None, t] and ["a", t] != ["b", t]
    assert t in [None, "x", t] and t not in [None, "x"]
    assert [t].index(t) == 0 and [None, t].count(t) == 1


def test_repr_shows_values_like_numpy_and_never_raises():
    t = tw.asarray(np.arange(6.0).reshape(2, 3))
    r = repr(t)
    assert r.startswith("tensorwire.Tensor([[0., 1., 2.],") and "[3., 4., 5.]]" in r
    assert r.endswith("shape=(2, 3), dtype=float64, device=cpu)")
    assert "strides=(1, 3)" in repr(t.T) and "[[0., 3.]," in repr(t.T)
    big = repr(tw.asarray(np.arange(10**6, dtype=np.int32)))
    assert "..." in big and "999999]" in big and len(big) < 300  # summarised
    assert repr(tw.asarray(np.array(2.5))).startswith("tensorwire.Tensor(2.5, shape=()")
    # packed elements, unpacked for the repr (it showed the layout alone), unless there are very many of them
    assert repr(tw.zeros((2, 2), "int4")) == ("tensorwire.Tensor([[0, 0],\n                   [0, 0]], shape=(2, 2), "
                                              "dtype=int4, device=cpu)")
    assert repr(tw.empty((1 << 21,), "int4")) == "tensorwire.Tensor(shape=(2097152,), dtype=int4, device=cpu)"
    padded = tw.asarray(np.array([1, -2, 7], ml_dtypes.int4))  # ml_dtypes stores one element per byte
    assert padded.subbyte_padded
    assert repr(padded) == "tensorwire.Tensor([1, -2, 7], shape=(3,), dtype=int4, device=cpu)"
    f4 = tw.asarray(np.array([[0.5, -6.0]], ml_dtypes.float4_e2m1fn))
    assert repr(f4) == "tensorwire.Tensor([[0.5, -6]], shape=(1, 2), dtype=float4_e2m1fn, device=cpu)"
    name = f"t14r.{id(t)}"
    with tw.Subscriber(name) as sub, tw.Publisher(name) as pub:
        loan = pub.loan((2,), "float32")
        pub.send(loan)
        assert repr(loan) == "tensorwire.Tensor(<spent: a loan handed over by Publisher.send>)"
        got = sub.recv(timeout=10)
        assert "readonly=True" in repr(got)
        del got


def test_repr_reads_plain_host_memory_only_and_says_why_not_otherwise():
    cuda = tw.asarray(FakeCudaArray((2, 3)), device="cuda:0")
    assert repr(cuda) == ("tensorwire.Tensor(shape=(2, 3), dtype=float32, device=cuda:0, values in device memory not "
                          "shown)")
    managed = tw.asarray(FakeCudaArray((4,)), device="cuda_managed:0")
    assert managed.device.host_accessible  # the host could read it, but that could migrate pages off the GPU
    assert repr(managed) == ("tensorwire.Tensor(shape=(4,), dtype=float32, device=cuda_managed:0, values not shown: "
                             "managed memory may be resident on the device, and reading it from the host would migrate "
                             "its pages)")


def test_reloading_the_package_does_not_wrap_repr_twice():
    import importlib

    t = tw.asarray(np.arange(3.0))
    want = "tensorwire.Tensor([0., 1., 2.], shape=(3,), dtype=float64, device=cpu)"
    assert repr(t) == want
    for _ in range(2):
        importlib.reload(tw)
        assert repr(t) == want


@pytest.mark.skipif(tw.cuda.is_available(), reason="a CUDA device is present: the element is copied (test_cuda.py)")
def test_scalar_conversions_of_device_memory_copy_the_element_or_say_why_not():
    # As torch's item(): the element is copied to the host (Tensor.to). Here, with no driver, the error names the
    # operation and why. (It used to say tensorwire "does not copy device memory yet", after Tensor.to existed.)
    t = tw.asarray(FakeCudaArray((1,)), device="cuda:0")
    route = r"cuda:0, which the host cannot read, and copying its element to the host failed: .*CUDA is unavailable"
    for f, name in ((float, "float()"), (int, "int()"), (bool, "bool()"), (complex, "complex()"),
                    (tw.Tensor.item, "item()")):
        with pytest.raises(BufferError, match=rf"^{re.escape(name)}: the tensor is on {route}"):
            f(t)
    i = tw.asarray(FakeCudaArray((), "<i8"), device="cuda:0")
    with pytest.raises(BufferError, match=rf"^operator\.index\(\): the tensor is on {route}"):
        operator.index(i)


def test_one_element_of_a_packed_sub_byte_tensor_converts():
    # two int4 per byte, element 0 in the low nibble (DLPack's bit order): bytes 0x21 0xF3 hold 1, 2, 3, -1
    packed = tw.asarray(np.array([0x21, 0xF3], np.uint8))._from_bytes("int4", (4,), False)
    assert not packed.subbyte_padded
    with pytest.raises(BufferError, match="packed int4"):
        packed.numpy()  # a zero-copy view cannot be
    with pytest.raises(ValueError, match="packed int4 .* copy=False"):
        np.asarray(packed, copy=False)
    assert np.asarray(packed).tolist() == packed.tolist() == [1, 2, 3, -1]  # unpacked into a copy
    assert [packed[i].item() for i in (0, 2)] == [1, 3]  # a view starts on a byte boundary: even indices only
    assert int(packed.reshape(2, 2)[1, 0]) == 3 and operator.index(packed[2]) == 3 and float(packed[0]) == 1.0
    last = tw.asarray(np.array([0xF3], np.uint8))._from_bytes("int4", (1,), False)  # the high nibble is padding
    assert last.item() == 3 and type(last.item()) is int
    assert tw.asarray(np.array([0x0F], np.uint8))._from_bytes("int4", (1,), False).item() == -1  # sign-extended
    assert tw.asarray(np.array([0x0F], np.uint8))._from_bytes("uint4", (1,), False).item() == 15
    assert tw.asarray(np.array([0xF7], np.uint8))._from_bytes("float4_e2m1fn", (1,), False).item() == 6.0
    assert tw.asarray(np.array([0x3F], np.uint8))._from_bytes("int2", (1,), False).item() == -1
    with pytest.raises(ValueError, match=r"^item\(\): only a tensor of one element .* \(4,\)"):
        packed.item()
    vector = tw.zeros((1,), "float32x4")  # what cannot be converted says which operation was asked for
    for f, name in ((tw.Tensor.item, "item()"), (float, "float()"), (bool, "bool()")):
        with pytest.raises(BufferError, match=rf"^{re.escape(name)}: NumPy has no vector type for float32x4"):
            f(vector)


def test_metadata_takes_int_and_str_enum_members_as_their_values():
    import enum

    class Level(enum.IntEnum):
        HIGH = 3

    class Mode(str, enum.Enum):
        FAST = "fast"

    class Perm(enum.IntFlag):
        R = 4

    class Plain(enum.Flag):
        X = 1

    t = tw.asarray(np.zeros(1))
    t.metadata.update({"level": Level.HIGH, "mode": Mode.FAST, "perm": Perm.R})
    got = dict(t.metadata)
    assert got == {"level": 3, "mode": "fast", "perm": 4}
    assert [type(got[k]) for k in ("level", "mode", "perm")] == [int, str, int]  # stored as the plain value
    with pytest.raises(TypeError, match=r"enum member \(<Plain\.X: 1>\).* \.value or \.name"):
        t.metadata["plain"] = Plain.X


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
    shown = [("unlimited" if n == resource.RLIM_INFINITY else n) for n in resource.getrlimit(resource.RLIMIT_NOFILE)]
    assert d["limits"]["RLIMIT_NOFILE"] == {"soft": shown[0], "hard": shown[1]}
    with open("/proc/sys/vm/max_map_count") as f:
        assert d["limits"]["vm.max_map_count"] == int(f.read())
    assert d["cuda"]["available"] is tw.cuda.is_available()
    assert d["cuda"]["kernels_built"] is tw.cuda.kernels_built()
    if tw.cuda.is_available():
        assert d["cuda"]["driver"] == tw.cuda.status() and d["cuda"]["devices"] == tw.cuda.device_count() >= 1
    else:
        # null, and the reason under "why" (e.g. "no NVIDIA driver (libcuda.so.1 could not be loaded)")
        assert d["cuda"]["driver"] is None and d["cuda"]["why"]["driver"] == tw.cuda.status() != ""
        assert d["cuda"]["devices"] is None and d["cuda"]["why"]["devices"].endswith(tw.cuda.status())
    cuda = d["cuda"]  # the rule of every section (see below)
    assert all((v is None) == (k in cuda["why"]) for k, v in cuda.items() if k != "why"), cuda
    # Every section follows one rule: a check's value, or null and its reason under the section's "why".
    deps = d["dependencies"]
    assert all((v is None) == (k in deps["why"]) for k, v in deps.items() if k != "why"), deps
    ucx = tw._ext._ucx_info()  # the UCX listen=/connect= load, as the doctor must report it
    assert d["ucx"]["present"] == (ucx["version"] is not None)
    assert isinstance(d["ucx"]["why"], dict) and (d["ucx"]["version"] is None) == ("version" in d["ucx"]["why"])
    assert d["ucx"]["usable"] == (ucx["version"] is not None and not ucx["why"])
    assert d["ucx"]["usable"] or d["ucx"]["why"], d["ucx"]  # unusable: the section says why
    assert (d["ucx"]["version"], d["ucx"]["library"]) == (ucx["version"], ucx["library"])
    if ucx["version"]:
        old = tuple(int(x) for x in ucx["version"].split(".")[:2]) < (1, 18)
        assert ("warning" in d["ucx"]) == old, d["ucx"]
    human = _cli("doctor")
    assert human.returncode == 0 and "memfd + seals:   yes" in human.stdout and "CUDA:" in human.stdout
    assert f"UCX:             {ucx['version']} ({ucx['library']})" in human.stdout or not ucx["version"]


def test_help_lists_the_modes_and_bench_defaults_to_quick():
    h = _cli("--help")
    assert h.returncode == 0
    # argparse's own list of subcommands, not the description (which names them too): whitespace-normalised, since
    # argparse wraps to the terminal's width
    section = " ".join(h.stdout.split("positional arguments:")[1].split("options:")[0].split())
    assert section == "{demo,bench,doctor,version}", section  # described once, in the description above it
    description = h.stdout.split("positional arguments:")[0]
    for mode in ("demo ", "bench ", "doctor ", "version "):
        assert description.count("\n  " + mode) == 1, (mode, description)
    for mode in ("demo", "bench", "doctor", "version"):  # each mode's own --help says what it does
        m = _cli(mode, "--help")
        assert m.returncode == 0 and f"usage: tensorwire {mode}" in m.stdout, m.stdout
    b = _cli("bench", "--help")
    assert b.returncode == 0 and "--full" in b.stdout and "quick" in b.stdout
    both = _cli("bench", "--quick", "--full")
    assert both.returncode != 0 and "exclude each other" in both.stderr


def test_bench_without_its_module_says_so_instead_of_a_traceback(monkeypatch, capsys):
    from tensorwire.__main__ import main

    monkeypatch.setitem(sys.modules, "tensorwire._bench_ipc", None)  # the next import of it raises ImportError
    for argv in (["bench"], ["bench", "--full"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("tensorwire bench is unavailable: ") and "tensorwire._bench_ipc" in err, err


@pytest.fixture
def doctor_with(monkeypatch):
    """The doctor's report with some /proc and /sys files missing or holding garbage, and a chosen RLIMIT_NOFILE."""
    import errno
    import resource

    from tensorwire import _doctor

    def configure(files: dict[str, str | None], nofile=None):
        real = _doctor._read

        def fake_read(path):
            if path not in files:
                return real(path)
            if files[path] is None:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            return files[path]

        monkeypatch.setattr(_doctor, "_read", fake_read)
        if nofile is not None:
            monkeypatch.setattr(resource, "getrlimit", lambda which: nofile)
        d = _doctor.collect()
        return d, _doctor.render(d), json.loads(json.dumps(d))

    return configure


def test_doctor_says_unlimited_for_an_infinite_fd_limit_and_warns_only_when_low(doctor_with):
    import resource

    inf = resource.RLIM_INFINITY
    d, text, j = doctor_with({}, nofile=(inf, inf))
    assert j["limits"]["RLIMIT_NOFILE"] == {"soft": "unlimited", "hard": "unlimited"}
    line = next(line for line in text.splitlines() if line.startswith("RLIMIT_NOFILE:"))
    assert line == "RLIMIT_NOFILE:   soft unlimited, hard unlimited"
    _, text, _ = doctor_with({}, nofile=(1024, inf))
    line = next(line for line in text.splitlines() if line.startswith("RLIMIT_NOFILE:"))
    assert line.startswith("RLIMIT_NOFILE:   soft 1024, hard unlimited  (low: ") and "ulimit -n" in line


def test_doctor_gives_the_reason_for_every_missing_or_unreadable_setting(doctor_with):
    missing = "No such file or directory"
    files = {
        "/proc/sys/vm/max_map_count": "lots\n",
        "/proc/sys/vm/overcommit_memory": None,
        "/sys/fs/cgroup/memory.max": None,
        "/proc/meminfo": None,
        "/sys/kernel/mm/transparent_hugepage/enabled": None,
        "/sys/kernel/mm/transparent_hugepage/shmem_enabled": "never",
    }
    d, text, j = doctor_with(files)  # nothing raises
    lim, hp = j["limits"], j["huge_pages"]
    assert lim["vm.max_map_count"] is None
    assert lim["why"]["vm.max_map_count"] == "not available: /proc/sys/vm/max_map_count holds 'lots\\n', not an integer"
    for key, path in (("vm.overcommit_memory", "/proc/sys/vm/overcommit_memory"),
                      ("cgroup memory.max", "/sys/fs/cgroup/memory.max"), ("MemAvailable_bytes", "/proc/meminfo")):
        assert lim[key] is None and lim["why"][key] == f"not available: {path}: {missing}"
    assert hp["shmem_transparent"] == "never" and "shmem_transparent" not in hp["why"]
    assert hp["why"]["transparent"] == f"not available: /sys/kernel/mm/transparent_hugepage/enabled: {missing}"
    for key in ("HugePages_Total", "HugePages_Free", "Hugepagesize_bytes"):
        assert hp[key] is None and hp["why"][key] == f"not available: /proc/meminfo: {missing}"
    assert "None" not in text, text
    assert "vm.max_map_count: not available: /proc/sys/vm/max_map_count holds 'lots\\n', not an integer" in text
    assert (f"overcommit:      vm.overcommit_memory=not available: /proc/sys/vm/overcommit_memory: {missing}; "
            f"cgroup memory.max=not available: /sys/fs/cgroup/memory.max: {missing}; "
            f"available not available: /proc/meminfo: {missing}") in text
    assert (f"huge pages:      THP not available: /sys/kernel/mm/transparent_hugepage/enabled: {missing}; "
            f"shmem THP never; reserved not available: /proc/meminfo: {missing}") in text


def test_doctor_names_a_meminfo_field_that_is_absent(doctor_with):
    d, text, j = doctor_with({"/proc/meminfo": "MemTotal: 1024 kB\nHugePages_Total: garbage\nHugePages_Free: 0\n"
                                               "Hugepagesize: 2048 kB"})
    assert j["limits"]["why"]["MemAvailable_bytes"] == "not available: /proc/meminfo has no MemAvailable line"
    assert j["huge_pages"]["why"]["HugePages_Total"] == "not available: /proc/meminfo has no HugePages_Total line"
    assert j["huge_pages"]["HugePages_Free"] == 0 and j["huge_pages"]["Hugepagesize_bytes"] == 2048 * 1024
    assert "available not available: /proc/meminfo has no MemAvailable line" in text
    assert "reserved not available: /proc/meminfo has no HugePages_Total line" in text


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


def test_a_dtypes_repr_names_the_class_it_is_made_with():
    # (it said tensorwire.dtype('float32'), a name the package does not have)
    for dt in (tw.float32, tw.bfloat16, tw.bool_, tw.int4):
        r = repr(dt)
        assert r == f"tensorwire.DType('{dt.name}')"
        assert eval(r, {"tensorwire": tw}) == dt


def test_a_0d_tensor_formats_as_its_value_as_numpy_and_torch_do():
    # (f"{loss:.3f}" raised "unsupported format string passed to Tensor.__format__")
    assert f"{tw.asarray(np.array(1.5)):.2f}" == f"{np.array(1.5):.2f}" == "1.50"
    assert f"{tw.asarray(np.array(3, np.int16)):04d}" == "0003" and f"{tw.asarray(np.array(255)):x}" == "ff"
    assert f"{tw.asarray(np.array(2 + 1j, np.complex64)):.1f}" == "2.0+1.0j"
    t = tw.asarray(np.arange(3.0))
    assert f"{t}" == str(t)
    with pytest.raises(TypeError, match=r"format spec '.2f' applies to a 0-d tensor's value; this tensor has shape \(3,\)"):
        f"{t:.2f}"


def test_a_packed_tensors_unpacked_copy_is_read_only_unless_a_copy_was_asked_for():
    # (np.asarray(loan)[...] = data on an int4 loan wrote into a throwaway copy: the loan went out with stale pool
    # bytes, silently)
    import ml_dtypes

    t = tw.zeros((4,), "int4")
    for a in (np.asarray(t), tw.to_numpy(t)):
        assert not a.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            a[:] = ml_dtypes.int4(3)
    for a in (np.array(t), tw.to_numpy(t, copy=True), np.asarray(t, copy=True)):
        assert a.flags.writeable and a.tolist() == [0, 0, 0, 0]
    name = f"pytest/{os.getpid()}/int4loan"
    with tw.Publisher(name) as pub:
        loan = pub.loan((6,), "int4")
        with pytest.raises(ValueError, match="read-only"):
            np.asarray(loan)[:] = ml_dtypes.int4(1)
