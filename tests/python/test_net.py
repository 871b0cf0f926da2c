"""tw.Publisher(listen=...) / tw.Subscriber(connect=...): publish/subscribe across machines over UCX (issue 12).

  loopback    one process, the UCX path on 127.0.0.1: every dtype and layout bit-exact, read-only, metadata with its
              Python types, a hypothesis property over random shapes, strides and dtypes, loan views that cross as
              the iov of their runs or packed (t.transport says which), messages of several tensors, credits under
              each on_full policy, a restarted publisher, a refused topic, bad arguments, and no fd or thread left
              behind after 20 create/connect/send/close cycles.
  fan-out     one publisher serves a local shared-memory subscriber and two remote subscriber processes at once.
  two hosts   two network namespaces joined by a veth pair (UCX_TLS=tcp: namespaces do not isolate shared memory),
              a process in each: strided tensors and metadata, the token rules, SIGKILL and SIGSTOP of either
              side, a restarted publisher, garbage sent to the listening port. Skipped where namespaces can't be made.

Processes are "agents": a fresh interpreter (in a namespace through `ip netns exec`) that runs the Python snippets
this process sends it, one at a time, and answers with the value of the last expression or the exception raised.
Every wait is bounded; every process is killed in a finally.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import math
import os
import pathlib
import pickle
import queue
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tensorwire as tw
from _helpers import same_bits

TIMEOUT = 10.0  # bound on one wait for something that takes milliseconds
FAULT_BOUND = 15.0  # bound on noticing a dead or silent peer (the issue: "within a bounded time")

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
          "float64", "complex64", "complex128"]


def _ucx_missing() -> str | None:
    try:
        tw.Publisher(f"pytest/{os.getpid()}/probe", listen="127.0.0.1:0").close()
    except Exception as e:  # noqa: BLE001 - only the "not installed" case skips; anything else fails the tests
        if "UCX is not installed" in str(e):
            return str(e)
    return None


_MISSING = _ucx_missing()
if _MISSING:
    pytest.skip(f"no network transport here: {_MISSING}", allow_module_level=True)


def topic(what: str) -> str:
    return f"pytest/{os.getpid()}/{what}/{uuid.uuid4().hex[:8]}"


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def task_count() -> int:
    return len(os.listdir("/proc/self/task"))


def wait_until(pred, timeout=TIMEOUT, what="condition"):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"{what}: not true within {timeout} s"
        time.sleep(0.005)


@contextlib.contextmanager
def port_nobody_listens_on():
    """A loopback port that refuses connections for as long as the block runs: bound (without SO_REUSEADDR) and never
    listening, so no listener of this run can be given it meanwhile (a port bound and released at once could go to
    the next listen on port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def dead_port():
    """port_nobody_listens_on() for a whole test."""
    with port_nobody_listens_on() as port:
        yield port


def random_array(shape, dtype, rng) -> np.ndarray:
    """Random bits of `dtype` (floats: any bit pattern, NaN payloads, -0.0, subnormals and all; bool: 0 or 1)."""
    dt = np.dtype(dtype)
    raw = rng.integers(0, 256, int(np.prod(shape, dtype=np.int64)) * dt.itemsize, dtype=np.uint8)
    if dt == np.bool_:
        return (raw & 1).view(np.bool_).reshape(shape)
    return raw.view(dt).reshape(shape)


def layouts(dtype, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    base = random_array((5, 6, 7), dtype, rng)
    return {
        "contiguous": random_array((3, 4), dtype, rng),
        "transposed": base.transpose(2, 0, 1),
        "steps": base[::2, 1::3, ::3],
        "negative": base[::-1, :, ::-2],
        "broadcast": np.broadcast_to(random_array((7,), dtype, rng), (4, 7)),
        "broadcast-inner": np.broadcast_to(random_array((3, 1), dtype, rng), (3, 5)),
        "0-d": random_array((), dtype, rng),
        "0-d-view": base[1, 2, 3, ...],
        "empty": random_array((0, 4), dtype, rng),
        "empty-strided": base[:, 3:3, ::2],
        "offset": base[2:, 1:5, 3],
        "offset-rows": base[3:],
        "fortran": np.asfortranarray(random_array((4, 5), dtype, rng)),
        "single-column": base[:, :, 4:5],
    }


def assert_received(t, expected: np.ndarray, sent_was_a_copy=True):
    """`t` (a received tw.Tensor) holds exactly `expected`: shape, dtype, every bit, read-only; its transport says
    honestly what happened to the layout."""
    got = np.asarray(t)
    assert got.shape == expected.shape and tuple(t.shape) == expected.shape
    assert got.dtype == expected.dtype and str(t.dtype) == str(expected.dtype)
    assert same_bits(got, expected), f"bits differ: {got!r} != {expected!r}"
    assert t.readonly and not got.flags.writeable
    with pytest.raises(ValueError):
        got[...] = got  # read-only
    check_transport(t.transport, got.strides, expected, sent_was_a_copy)


def c_contiguous(shape, strides, itemsize) -> bool:
    expect = itemsize
    for n, s in reversed(list(zip(shape, strides))):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def dense_in_some_order(shape, strides, itemsize) -> bool:
    """No gaps, no overlap, no negative stride: a permutation of a C-contiguous layout (Fortran, a transpose)."""
    dims = sorted((s, n) for n, s in zip(shape, strides) if n != 1)
    expect = itemsize
    for s, n in dims:
        if s != expect:
            return False
        expect *= n
    return True


def check_transport(transport, got_strides, sent: np.ndarray, sent_was_a_copy: bool):
    """'ucx' keeps the sender's layout; 'ucx-packed' is dense. A tensor that is not a loan crosses as its span when
    it is dense in some order (C, Fortran, a transpose) and packed otherwise (README, "Across machines")."""
    assert transport in ("ucx", "ucx-packed"), transport
    if sent.size == 0:
        return
    if transport == "ucx":  # the sender's strides (those of extent-1 dimensions carry nothing: not compared)
        assert [s for n, s in zip(sent.shape, got_strides) if n > 1] == \
            [s for n, s in zip(sent.shape, sent.strides) if n > 1], (got_strides, sent.strides)
    else:
        assert c_contiguous(sent.shape, got_strides, sent.itemsize), got_strides
    if sent_was_a_copy:
        kept = sent.flags.c_contiguous or dense_in_some_order(sent.shape, sent.strides, sent.itemsize)
        assert transport == ("ucx" if kept else "ucx-packed"), (transport, sent.strides)


class Pair:
    """A publisher listening on loopback and one remote subscriber connected to it, in this process."""

    def __init__(self, what="pair", sub_kw=None, **pub_kw):
        self.name = topic(what)
        self.pub = tw.Publisher(self.name, listen="127.0.0.1:0", **pub_kw)
        try:
            self.sub = tw.Subscriber(self.name, connect=self.pub.address, **(sub_kw or {}))
            wait_until(lambda: self.pub.remote_subscribers == 1 and self.sub.connected, what="loopback connect")
        except BaseException:
            self.pub.close()
            raise

    def roundtrip(self, obj, metadata=None):
        assert self.pub.send(obj, metadata, timeout=TIMEOUT) == 1
        return self.sub.recv(timeout=TIMEOUT)

    def close(self):
        self.sub.close()
        self.pub.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- agents: interpreters in other processes (and namespaces) that run what they are sent --------------------------

AGENT = r'''
import ast, base64, faulthandler, os, pickle, random, signal, socket, sys, threading, time, traceback
faulthandler.dump_traceback_later(int(sys.argv[1]), exit=True)   # an orphan never outlives the test run for long
reply = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # anything else written to stdout (UCX's own messages included) goes to stderr
sys.stdout = sys.stderr
import numpy as np
import tensorwire as tw


def snap(m):
    """What a received message holds, as plain data: each tensor's values (a copy), layout, transport, metadata."""
    if isinstance(m, dict):
        return {k: snap(v) for k, v in m.items()}
    if isinstance(m, (list, tuple)):
        return type(m)(snap(v) for v in m)
    a = np.asarray(m)
    return {"array": a.copy(), "view_strides": a.strides, "transport": m.transport, "meta": dict(m.metadata),
            "readonly": m.readonly, "writeable": a.flags.writeable}


class Collector:
    """Receives on a thread until end of stream (or an error), keeping snapshots and, with keep, the tensors."""

    def __init__(self, sub, keep=False):
        self.sub, self.keep, self.got, self.held, self.end, self.stop = sub, keep, [], [], None, False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop:
            try:
                m = self.sub.recv(timeout=0.05)
            except TimeoutError:
                continue
            except BaseException as e:
                self.end = (type(e).__name__, str(e), time.monotonic())
                return
            self.got.append(snap(m))
            if self.keep:
                self.held.append(m)

    def wait(self, n, timeout):
        end = time.monotonic() + timeout
        while len(self.got) < n and self.end is None and time.monotonic() < end:
            time.sleep(0.002)
        return len(self.got)

    def wait_end(self, timeout):
        self.thread.join(timeout)
        return self.end


def wait_until(pred, timeout):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError("condition not reached within %s s" % timeout)
        time.sleep(0.005)
    return True


env = dict(globals())
reply.write("READY %d\n" % os.getpid())
reply.flush()
for line in sys.stdin:
    code, values = pickle.loads(base64.b64decode(line))
    env.update(values)
    try:
        tree = ast.parse(code)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "<agent>", "exec"), env)
        result = eval(compile(ast.Expression(last.value), "<agent>", "eval"), env) if last else None
        out = pickle.dumps(("ok", result))
    except BaseException as e:
        traceback.print_exc()
        out = pickle.dumps(("err", type(e).__name__, str(e)))
    reply.write(base64.b64encode(out).decode() + "\n")
    reply.flush()
'''


class RemoteError(Exception):
    """An exception an agent's snippet raised: its type's name (kind) and message."""

    def __init__(self, kind: str, msg: str):
        super().__init__(f"{kind}: {msg}")
        self.kind, self.msg = kind, msg


class Agent:
    def __init__(self, registry: list, prefix=(), extra_env=None, watchdog=240):
        self.err = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **(extra_env or {}))
        self.p = subprocess.Popen([*prefix, sys.executable, "-c", AGENT, str(watchdog)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=self.err, env=env)
        registry.append(self)  # killed by its owner however the rest of this goes
        self.lines: queue.Queue = queue.Queue()
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()
        line = self._line(60)
        assert line.startswith("READY"), line
        self.pid = int(line.split()[1])
        assert self.pid == self.p.pid  # `ip netns exec` execs: signals reach the interpreter itself

    def _pump(self):
        for line in self.p.stdout:
            self.lines.put(line.decode())
        self.lines.put(None)

    def _line(self, timeout):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the agent said nothing for {timeout} s; its stderr:\n{self.stderr()}") from None
        if line is None:
            raise AssertionError(f"the agent died (exit status {self.p.wait(5)}); its stderr:\n{self.stderr()}")
        return line

    def __call__(self, code: str, timeout: float = 30, **values):
        self.p.stdin.write(base64.b64encode(pickle.dumps((textwrap.dedent(code), values))) + b"\n")
        self.p.stdin.flush()
        r = pickle.loads(base64.b64decode(self._line(timeout)))
        if r[0] == "err":
            raise RemoteError(r[1], r[2])
        return r[1]

    def signal(self, sig):
        os.kill(self.p.pid, sig)

    def alive(self) -> bool:
        return self.p.poll() is None

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")[-6000:]

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        try:
            self.p.wait(10)
        finally:
            self.pump.join(5)
            for f in (self.p.stdin, self.p.stdout, self.err):
                try:
                    f.close()
                except OSError:
                    pass


@pytest.fixture
def agents():
    """agents(prefix=(), extra_env=None) starts an agent; all of them are SIGKILLed when the test ends."""
    made: list[Agent] = []

    def make(prefix=(), extra_env=None):
        return Agent(made, prefix, extra_env)

    try:
        yield make
    finally:
        for a in made:
            a.kill()


# ==== 5. bad input ===================================================================================================


@pytest.mark.parametrize("listen", ["nonsense", "1.2.3.4:99999", "127.0.0.1:-1", "127.0.0.1:http", "[::1"])
def test_a_malformed_listen_address_is_a_value_error_naming_listen(listen):
    with pytest.raises(ValueError, match="listen="):
        tw.Publisher(topic("badlisten"), listen=listen)


@pytest.mark.parametrize("connect", ["host:", "nonsense", "127.0.0.1:65536", "127.0.0.1:x", ":"])
def test_a_malformed_connect_address_is_a_value_error_naming_connect(connect):
    with pytest.raises(ValueError, match="connect="):
        tw.Subscriber(topic("badconnect"), connect=connect)


def test_a_depth_no_remote_subscriber_takes_is_refused_when_listening():
    # Remote subscribers take at most 4096 messages in flight: a deeper publisher that listens is a ValueError at
    # once, not a "protocol broken" error at each subscriber that tries to join.
    with pytest.raises(ValueError, match="depth of at most 4096"):
        tw.Publisher(topic("deep"), listen="127.0.0.1:0", depth=5000)


_HOSTILE_LISTENER = """
import os, re, socket, struct, sys, time, numpy as np, tensorwire as tw
pub = tw.Publisher(sys.argv[1], listen="127.0.0.1:0")
sub = tw.Subscriber(sys.argv[1], connect=pub.address)  # (UCX's own ports open once a connection is made)
deadline = time.monotonic() + 10
while pub.remote_subscribers < 1 and time.monotonic() < deadline:
    time.sleep(0.01)
assert pub.remote_subscribers == 1


def listening_ports():  # every TCP port this process listens on: the publisher's, and UCX's transports' own
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            m = re.match(r"socket:\\[(\\d+)\\]", os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
        if m:
            inodes.add(m.group(1))
    found = set()
    for line in open("/proc/net/tcp").readlines()[1:]:
        f = line.split()
        if f[3] == "0A" and f[9] in inodes:  # LISTEN
            ip, port = f[1].split(":")
            found.add((socket.inet_ntoa(bytes.fromhex(ip)[::-1]), int(port, 16)))
    return sorted(found)


ports = listening_ports()
assert ("127.0.0.1", int(pub.address.rsplit(":", 1)[1])) in ports, (pub.address, ports)
# Garbage, and frames that pass UCX's first check: its TCP transport's magic number (0xCAFEBABE12345678, uct/tcp)
# followed by an absurd length.
magic = struct.pack("<Q", 0xCAFEBABE12345678)
payloads = [b"\\xff" * 16, b"\\xff" * 100, bytes(100000), bytes(range(256)) * 20,
            magic + b"\\xff" * 200, magic + bytes(8) + b"\\x01" * 300]
for host, port in ports:
    for payload in payloads:
        try:
            s = socket.create_connection((host, port), timeout=5)
        except OSError:
            continue  # (a port that refuses now: fine)
        try:
            s.sendall(payload)
        except OSError:
            pass  # (hung up on: fine)
        time.sleep(0.2)
        s.close()
print("attacked", len(ports), "ports", flush=True)
pub.send(np.arange(5), timeout=10)
print("served", np.asarray(sub.recv(timeout=10)).tolist())
late = tw.Subscriber(sys.argv[1], connect=pub.address)  # and a new subscriber is still taken
deadline = time.monotonic() + 10
while pub.remote_subscribers < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
pub.send(np.arange(3), timeout=10)
print("served late", np.asarray(late.recv(timeout=10)).tolist())
"""


def _ucx_builds():
    builds = [pytest.param(None, id="default-ucx"),  # what `import tensorwire` picks: the libucx wheel where installed
              pytest.param("libucp.so.0", id="system-ucx")]
    bundled = pathlib.Path(__file__).resolve().parents[2] / "third_party" / "ucx" / "lib" / "libucp.so.0"
    if bundled.exists():  # `make gpu-bundle`'s UCX 1.22
        builds.append(pytest.param(str(bundled), id="bundled-ucx"))
    return builds


# UCX 1.13, the one Debian 12 ships, checks the framing of what arrives on its listening ports with assertions
# compiled into its build: the process aborts inside UCX before tensorwire sees a byte, on its TCP connection
# manager's port (tcp_sockcm_ep.c) and on its TCP transport's own (tcp_ep.c). This is why `import tensorwire` prefers
# the libucx wheel's UCX (README, "Security").
_UCX_113_ABORT = re.compile(r"(tcp_sockcm_ep|tcp_ep)\.c:\d+ +Assertion")


@pytest.mark.parametrize("ucx_lib", _ucx_builds())
def test_hostile_bytes_on_every_listening_port_leave_the_publisher_serving(ucx_lib):
    env = dict(os.environ)
    env.pop("TW_UCX_LIBRARY", None)
    if ucx_lib:
        env["TW_UCX_LIBRARY"] = ucx_lib
    probe = subprocess.run([sys.executable, "-c", "import tensorwire as tw; i = tw._ext._ucx_info(); "
                            "print(i['version'] or '', i['why'] or '', sep='|')"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0 and "|" in probe.stdout, probe.stdout + probe.stderr
    version, why = probe.stdout.strip().split("|", 1)
    if not version:
        if ucx_lib is None:
            pytest.fail(f"no UCX: {why}")
        pytest.skip(f"{ucx_lib} cannot be loaded here: {why}")
    r = subprocess.run([sys.executable, "-c", _HOSTILE_LISTENER, topic("hostile")], env=env, capture_output=True,
                       text=True, timeout=180)
    out = r.stdout + r.stderr
    major, minor = (int(x) for x in version.split(".")[:2])
    if r.returncode != 0 and _UCX_113_ABORT.search(out) and (major, minor) < (1, 18) and ucx_lib is None:
        import importlib.util

        if importlib.util.find_spec("libucx") is None:  # (make venv installs it: then this must serve)
            pytest.skip(f"the default UCX here is {version}, which aborts on crafted bytes, and the libucx wheel "
                        "that tensorwire would prefer is not installed (pip install 'tensorwire[ucx]')")
    if r.returncode != 0 and _UCX_113_ABORT.search(out) and (major, minor) < (1, 18) and ucx_lib == "libucp.so.0":
        pytest.xfail(f"the system's UCX {version} aborts on crafted bytes sent to its listening ports (an "
                     "assertion in its TCP code, before tensorwire is involved); tensorwire prefers the libucx wheel")
    assert r.returncode == 0, out
    assert "served [0, 1, 2, 3, 4]" in r.stdout and "served late [0, 1, 2]" in r.stdout, out


_WARNS = """
import sys, warnings, tensorwire as tw
a_topic, b_topic = sys.argv[1], sys.argv[2]
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    a = tw.Publisher(a_topic, listen="0.0.0.0:0", insecure=True)
    b = tw.Publisher(b_topic, listen="127.0.0.1:0")  # (loopback: never warned about)
print("warnings", [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)])
a.close()
warnings.simplefilter("error", RuntimeWarning)
try:
    tw.Publisher(a_topic, listen="0.0.0.0:0", insecure=True)
    print("made")
except RuntimeWarning:
    print("raised")
tw.Publisher(a_topic, listen="127.0.0.1:0")  # the topic is free: a publisher refused by the warning is undone
print("ok")
"""


@pytest.mark.parametrize("ucx_lib", [None, "libucp.so.0"], ids=["default-ucx", "system-ucx"])
def test_a_reachable_listener_on_a_ucx_that_crafted_bytes_abort_is_warned_about(ucx_lib):
    env = dict(os.environ)
    env.pop("TW_UCX_LIBRARY", None)
    if ucx_lib:
        env["TW_UCX_LIBRARY"] = ucx_lib
    r = subprocess.run([sys.executable, "-c", _WARNS, topic("warn-a"), topic("warn-b")], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    info = eval(subprocess.run([sys.executable, "-c", "import tensorwire as tw; print(tw._ext._ucx_info())"], env=env,
                               capture_output=True, text=True, timeout=60, check=True).stdout)
    abortable = tuple(int(x) for x in info["version"].split(".")[:2]) < (1, 18)
    warned = eval(lines[0][len("warnings "):])
    if abortable:
        assert len(warned) == 1 and "0.0.0.0:" in warned[0] and info["version"] in warned[0], warned
        assert "tensorwire[ucx]" in warned[0], warned
        assert lines[1:] == ["raised", "ok"], lines
    else:
        assert warned == [] and lines[1:] == ["made", "ok"], lines


def test_the_libucx_wheel_is_preferred_and_TW_UCX_LIBRARY_overrides_it():
    import importlib.util

    env = dict(os.environ)
    env.pop("TW_UCX_LIBRARY", None)
    code = "import tensorwire as tw; print(tw._ext._ucx_info())"
    spec = importlib.util.find_spec("libucx")
    if spec is None:
        pytest.skip("the libucx wheel is not installed in this Python (make venv installs it)")
    info = eval(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                               timeout=60, check=True).stdout)
    wheel_dir = pathlib.Path(list(spec.submodule_search_locations)[0]).resolve()
    assert info["why"] is None, info
    assert pathlib.Path(info["library"]).resolve().parent == wheel_dir / "lib", info
    assert tuple(int(x) for x in info["version"].split(".")[:2]) >= (1, 18), info
    # A UCX the process already has wins over the wheel (two builds would mix their libraries by name), whichever
    # of its libraries came first.
    import ctypes.util

    if ctypes.util.find_library("ucp"):  # (a system UCX to load first)
        for first in ("libucp.so.0", "libucs.so.0"):
            out = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({first!r}); " + code], env=env,
                                 capture_output=True, text=True, timeout=60, check=True).stdout
            system = eval(out)
            assert pathlib.Path(system["library"]).resolve().parent != wheel_dir / "lib", (first, system)
            assert system["why"] is None, system
        wheel_ucs = str(wheel_dir / "lib" / "libucs.so.0")
        out = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({wheel_ucs!r}); " + code], env=env,
                             capture_output=True, text=True, timeout=60, check=True).stdout
        assert pathlib.Path(eval(out)["library"]).resolve().parent == wheel_dir / "lib", out
    # TW_UCX_LIBRARY wins, and one that cannot be loaded is an error naming it (no silent fallback)
    env["TW_UCX_LIBRARY"] = "/nonexistent/libucp.so.0"
    r = subprocess.run([sys.executable, "-c", "import tensorwire as tw\n"
                        "print(tw._ext._ucx_info()['why'])\n"
                        "tw.Publisher('x', listen='127.0.0.1:0')"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert r.stdout.count("TW_UCX_LIBRARY='/nonexistent/libucp.so.0' cannot be loaded") == 1, r.stdout
    assert "TW_UCX_LIBRARY='/nonexistent/libucp.so.0' cannot be loaded" in r.stderr, r.stderr


_IPV6_ROUND_TRIP = """
import sys, time, numpy as np, tensorwire as tw
name = sys.argv[1]
for refused in ("127.0.0.1:0", "0.0.0.0:0"):  # IPv4 with UCX's TCP interfaces on IPv6: refused, never a hang
    try:
        tw.Publisher(name, listen=refused, insecure=True)
        print("made", refused)
    except ValueError as e:
        assert "UCX_TCP_AF_PRIO=inet6" in str(e) and "IPv4 address" in str(e), e
try:
    tw.Publisher(name, listen="[::]:0")
    print("made an open IPv6 listener without a token")
except ValueError as e:
    assert "token=" in str(e), e
with tw.Publisher(name, listen=":0") as pub:  # no host: IPv6 loopback now
    assert pub.address.startswith("[::1]:"), pub.address
    with tw.Subscriber(name, connect=pub.address) as sub:
        end = time.monotonic() + 30
        while pub.remote_subscribers < 1:
            assert time.monotonic() < end, "the IPv6 subscriber never connected"
            time.sleep(0.01)
        a = np.arange(24, dtype=np.int16).reshape(4, 6)[:, ::-2]
        pub.send(a, metadata={"v6": True})
        t = sub.recv(timeout=30)
        assert np.array_equal(np.asarray(t), a) and t.metadata["v6"] is True
print("ok")
"""


def test_ipv6_addresses_need_ucx_tcp_interfaces_of_their_family():
    # UCX's TCP transport corrupts the heap (glibc aborts the publisher as a subscriber connects) when the
    # connection manager's address is IPv6 and its interfaces IPv4, UCX_TCP_AF_PRIO's default: such an address is a
    # ValueError saying what to set, whether given as a number or a name, on either side.
    for kw in ({"listen": "[::1]:0"}, {"listen": "[::]:0", "insecure": True}, {"listen": "ip6-localhost:0"}):
        host = kw["listen"].rsplit(":", 1)[0].strip("[]")
        try:
            socket.getaddrinfo(host, 0, socket.AF_INET)
            continue  # (a name with an IPv4 address too resolves to that one)
        except socket.gaierror:
            pass
        try:
            socket.getaddrinfo(host, 0, socket.AF_INET6)
        except socket.gaierror:
            continue  # (no such name here)
        with pytest.raises(ValueError, match=r"is an IPv6 address .* UCX_TCP_AF_PRIO=inet6"):
            tw.Publisher(topic("v6"), **kw)
    with pytest.raises(ValueError, match=r"connect='\[::1\]:7447': '::1' is an IPv6 address .* UCX_TCP_AF_PRIO"):
        tw.Subscriber(topic("v6"), connect="[::1]:7447")
    # With UCX_TCP_AF_PRIO=inet6 (in a process of its own: UCX reads it once), IPv6 works end to end and IPv4 is
    # refused instead, on a UCX that can (1.22; Debian's 1.13 never connects over IPv6).
    try:
        with socket.socket(socket.AF_INET6) as s6:
            s6.bind(("::1", 0))
    except OSError as e:
        pytest.skip(f"this machine has no IPv6 loopback: {e}")
    version = tw._ext._ucx_info()["version"]
    if tuple(int(x) for x in version.split(".")[:2]) < (1, 18):
        pytest.skip(f"UCX {version} does not connect over IPv6 (1.22, the libucx wheel's, does)")
    env = dict(os.environ, UCX_TCP_AF_PRIO="inet6")
    r = subprocess.run([sys.executable, "-c", _IPV6_ROUND_TRIP, topic("v6")], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.splitlines() == ["ok"], (r.returncode, r.stdout, r.stderr[-3000:])


def test_connect_to_port_zero_is_a_value_error():
    # Port 0 means "any free port" for a listener; nothing can ever be reached at it, so a Subscriber that retries
    # it forever is a typo left silent.
    with pytest.raises(ValueError, match="connect="):
        tw.Subscriber(topic("port0"), connect="127.0.0.1:0")


def test_empty_token_and_bad_keepalive_are_value_errors():
    with pytest.raises(ValueError, match="token"):
        tw.Publisher(topic("tok"), listen="127.0.0.1:0", token="")
    with pytest.raises(ValueError, match="token"):
        tw.Subscriber(topic("tok"), connect="127.0.0.1:1", token="")
    with pytest.raises(ValueError, match="listen"):
        tw.Publisher(topic("tok"), token="secret")  # a token with nothing to guard
    with pytest.raises(ValueError, match="connect"):
        tw.Subscriber(topic("tok"), token="secret")
    for bad in (0, -1.0, 0.01):
        with pytest.raises(ValueError, match="keepalive"):
            tw.Publisher(topic("ka"), listen="127.0.0.1:0", keepalive=bad)
        with pytest.raises(ValueError, match="keepalive"):
            tw.Subscriber(topic("ka"), connect="127.0.0.1:1", keepalive=bad)


def test_a_listener_other_machines_can_reach_needs_a_token_or_insecure():
    for addr in ("0.0.0.0:0",):  # ("[::]:0": test_ipv6_addresses_need_ucx_tcp_interfaces_of_their_family)
        with pytest.raises(ValueError, match="token="):
            tw.Publisher(topic("open"), listen=addr)
    for host in (":0", "0", "localhost:0", "127.0.0.1:0"):  # no host, or a loopback one: no token needed
        with tw.Publisher(topic("lo"), listen=host) as pub:
            assert pub.address.startswith("127.0.0.1:") and int(pub.address.rsplit(":", 1)[1]) > 0
    with tw.Publisher(topic("open"), listen="0.0.0.0:0", insecure=True) as pub:
        assert pub.address.startswith("0.0.0.0:")
    with tw.Publisher(topic("open"), listen="0.0.0.0:0", token="s3cret") as pub:
        assert pub.address.startswith("0.0.0.0:")
    for no in (None, ""):  # shared memory only
        with tw.Publisher(topic("shm"), listen=no) as pub:
            assert pub.address is None and pub.remote_subscribers == 0


def test_a_port_number_is_an_address_on_loopback_for_listen_and_connect():
    # listen=7447 / connect=7447, as socket APIs take a port: loopback on both ends, like ':7447'.
    with tw.Publisher(topic("intport"), listen=0) as pub:
        assert pub.address.startswith("127.0.0.1:")
        port = int(pub.address.rsplit(":", 1)[1])
        with tw.Subscriber(pub.name, connect=port) as sub:
            wait_until(lambda: pub.remote_subscribers == 1, what="the subscriber that connected to a port number")
            pub.send(np.arange(6, dtype=np.int32), metadata={"port": port})
            t = sub.recv(timeout=TIMEOUT)
            assert np.asarray(t).tolist() == list(range(6)) and t.metadata["port"] == port
    for bad in (65536, -1, 2**70):
        with pytest.raises(ValueError, match="listen=.*port must be a number from 0 to 65535"):
            tw.Publisher(topic("intport"), listen=bad)
        with pytest.raises(ValueError, match="connect=.*port must be a number from 0 to 65535"):
            tw.Subscriber(topic("intport"), connect=bad)
    for bad in (7447.0, True, b"127.0.0.1:7447", ("127.0.0.1", 7447)):
        with pytest.raises(TypeError, match="'host:port', ':port' or a port number"):
            tw.Publisher(topic("intport"), listen=bad)
        with pytest.raises(TypeError, match="'host:port', ':port' or a port number"):
            tw.Subscriber(topic("intport"), connect=bad)
    with pytest.raises(ValueError, match="connect="):
        tw.Subscriber(topic("intport"), connect=0)  # nothing is ever at port 0


def test_connect_to_a_port_nobody_listens_on_times_out_unconnected():
    with port_nobody_listens_on() as port, tw.Subscriber(topic("nobody"), connect=f"127.0.0.1:{port}") as sub:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            sub.recv(timeout=0.5)
        assert 0.45 <= time.monotonic() - t0 < 3
        assert sub.connected is False and sub.closed is False
        with pytest.raises(TimeoutError):
            sub.recv(timeout=0)


def test_a_subscriber_of_another_topic_is_refused_naming_it():
    with tw.Publisher(topic("mine"), listen="127.0.0.1:0") as pub:
        with tw.Subscriber(topic("other"), connect=pub.address) as sub:
            with pytest.raises(ValueError, match="serves topic"):
                sub.recv(timeout=TIMEOUT)
            assert not sub.connected
        assert pub.remote_subscribers == 0


def test_a_message_larger_than_max_message_bytes_disconnects_without_stalling_the_publisher():
    with Pair("maxmsg", sub_kw={"max_message_bytes": 1000}) as p:
        assert_received(p.roundtrip(np.arange(10.0)), np.arange(10.0))
        p.pub.send(np.zeros(10000), timeout=TIMEOUT)
        with pytest.raises(ValueError, match=r"max_message_bytes \(1000\)"):
            p.sub.recv(timeout=TIMEOUT)
        wait_until(lambda: p.pub.remote_subscribers == 0, what="the refusing subscriber is dropped")
        assert p.pub.send(np.zeros(3), timeout=1) == 0


# ==== 1. loopback: layouts, dtypes, metadata =========================================================================


@pytest.fixture(scope="module")
def pair():
    with Pair("shared", depth=64) as p:
        yield p


@pytest.fixture
def lo(pair):
    """The module's loopback pair, with nothing left unread by an earlier test."""
    while True:
        try:
            pair.sub.recv(timeout=0)
        except TimeoutError:
            break
    return pair


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_layout_of_every_dtype_round_trips_bit_exact(lo, dtype):
    for case, a in layouts(dtype, seed=DTYPES.index(dtype)).items():
        t = lo.roundtrip(a, {"case": case})
        assert t.metadata["case"] == case
        assert_received(t, a)


def test_the_sender_may_change_its_array_after_send():
    with Pair("after") as p:
        a = np.arange(1 << 16, dtype=np.int32)
        assert p.pub.send(a, timeout=TIMEOUT) == 1
        a[:] = -1
        assert_received(p.sub.recv(timeout=TIMEOUT), np.arange(1 << 16, dtype=np.int32))


def test_large_tensors_round_trip(lo):
    rng = np.random.default_rng(7)
    big = random_array((2048, 2048), "float32", rng)  # 16 MiB
    assert_received(lo.roundtrip(big), big)
    assert_received(lo.roundtrip(big[::3, 1::2]), big[::3, 1::2])


def test_metadata_round_trips_with_its_python_types(lo):
    meta = {
        "none": None, "t": True, "f": False, "int": -(2**63), "uint": 2**63 - 1, "float": 1.5, "neg0": -0.0,
        "big": 1e308, "tiny": 5e-324, "inf": float("-inf"), "nan": float("nan"), "str": "héllo wörld ✓",
        "empty": "", "bytes": b"\x00\xff\x00", "list": [1, [2, (3, b"4")], {"k": None}], "tuple": (1, "a", (2.5,)),
        "dict": {"nested": {"deep": [(), [], {}], "x": {"y": {"z": 1.25}}}},
    }
    t = tw.asarray(np.arange(6, dtype=np.int16).reshape(2, 3))
    t.metadata["own"] = "mine"
    t.metadata["str"] = "overridden by send's"
    got = lo.roundtrip(t, meta).metadata
    got = dict(got)
    assert list(got)[0] == "own"
    assert math.isnan(got.pop("nan"))
    want = {"own": "mine", **{k: v for k, v in meta.items() if k != "nan"}}
    assert got == want
    assert math.copysign(1.0, got["neg0"]) == -1.0
    assert type(got["tuple"]) is tuple and type(got["list"][1][1]) is tuple and type(got["bytes"]) is bytes
    assert type(got["int"]) is int and type(got["float"]) is float and got["t"] is True and got["none"] is None
    assert type(got["dict"]["nested"]["deep"][0]) is tuple and type(got["dict"]["nested"]["deep"][1]) is list


@st.composite
def strided_arrays(draw):
    """(array, description): random dtype, shape, slice steps (negative too), axis order, and broadcast axes."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=7))
    base = random_array(shape, dtype, np.random.default_rng(draw(st.integers(0, 2**32 - 1))))
    index = draw(hnp.basic_indices(shape, allow_newaxis=False, allow_ellipsis=True))
    view = base[index]
    if view.ndim > 1:
        view = view.transpose(draw(st.permutations(range(view.ndim))))
    if draw(st.booleans()):
        reps = draw(st.integers(0, 3))
        view = np.broadcast_to(view, (reps, *view.shape))
    return view, (dtype, shape, index)


def test_random_layouts_and_dtypes_round_trip_bit_exact():
    with Pair("property", depth=4) as p:

        @given(strided_arrays())
        def check(case):
            a, _ = case
            t = p.roundtrip(a, {"shape": list(a.shape)})
            assert t.metadata["shape"] == list(a.shape)
            assert_received(t, a)

        check()


# ==== 1. loopback: loans, transports, messages of several tensors ====================================================


def send_loan_view(pub, shape, dtype, view_of):
    """Loans `shape`, fills it with 0, 1, 2..., sends view_of(loan) as the loan's only handle; returns the values
    and byte strides the view had."""
    loan = pub.loan(shape, dtype)
    arr = np.asarray(loan)
    arr[...] = np.arange(arr.size).reshape(arr.shape).astype(dtype)
    del arr
    view = view_of(loan)
    del loan
    expected = np.asarray(view).copy()
    strides = np.asarray(view).strides
    assert pub.send(view, timeout=TIMEOUT) >= 1
    return expected, strides


@pytest.mark.parametrize("iov", ["1", "0"])
def test_loan_views_cross_as_their_runs_or_packed(monkeypatch, iov):
    # TW_NET_IOV=1 makes the publisher use the iov path on any transport (it is read when a subscriber joins), so
    # the 2 KiB rule is what decides; TW_NET_IOV=0 packs every strided view.
    monkeypatch.setenv("TW_NET_IOV", iov)
    with Pair("loanviews", depth=16) as p:
        cases = [
            # (loan shape, dtype, view, transport with TW_NET_IOV=1)
            ((8, 512), "float32", lambda x: x[::2], "ucx"),  # every other row, rows of 2048 bytes
            ((8, 512), "float32", lambda x: x[1::2], "ucx"),  # the same with an offset
            ((6, 4096), "uint8", lambda x: x[::3, 1:3000], "ucx"),  # runs of 2999 bytes, offset into the row
            ((8, 2048), "uint8", lambda x: x[::2, :2047], "ucx-packed"),  # runs of 2047 bytes: too short
            ((8, 512), "float32", lambda x: x[:, ::2], "ucx-packed"),  # every other column: 4-byte runs
            ((8, 2048), "uint8", lambda x: x[::-2], "ucx-packed"),  # negative stride, not dense
        ]
        for shape, dtype, view_of, with_iov in cases:
            expected, strides = send_loan_view(p.pub, shape, dtype, view_of)
            t = p.sub.recv(timeout=TIMEOUT)
            want = with_iov if iov == "1" else "ucx-packed"
            assert t.transport == want, (shape, dtype, expected.shape, strides, t.transport)
            got = np.asarray(t)
            assert same_bits(got, expected)
            assert t.readonly and not got.flags.writeable
            if want == "ucx":
                assert got.strides == strides  # the loan's own layout, nothing packed
            else:
                assert got.flags.c_contiguous
        # Dense loan views in any order, negative strides included, cross as their span whatever the transport.
        for view_of in (lambda x: x.T, lambda x: x[::-1], lambda x: x[2:5], lambda x: x[3], lambda x: x):
            expected, strides = send_loan_view(p.pub, (6, 4), "int16", view_of)
            t = p.sub.recv(timeout=TIMEOUT)
            assert t.transport == "ucx" and np.asarray(t).strides == strides
            assert same_bits(np.asarray(t), expected)


def test_a_packed_loan_views_loan_is_free_while_its_remote_send_waits(agents):
    # The remote side of a packed loan view reads the packed copy only, so the loan goes back to the pool as soon as
    # its caller drops it, not when the remote subscriber has the bytes (holding it doubled the pool a burst of packed
    # views needed; the page faults of that growth showed in `tensorwire bench --net`).
    name = topic("packedloan")
    pub = tw.Publisher(name, listen="127.0.0.1:0", depth=4, max_buffers=2)
    try:
        sub = agents()
        sub("sub = tw.Subscriber(name, connect=addr); col = Collector(sub)", name=name, addr=pub.address)
        wait_until(lambda: pub.remote_subscribers == 1, what="the remote subscriber")
        sub.signal(signal.SIGSTOP)  # connected but silent: a 16 MiB message cannot complete its send
        try:
            loan = pub.loan((1024, 4096), "int64")  # 32 MiB; every other column is 16 MiB of 8-byte runs
            np.asarray(loan)[...] = np.arange(1024 * 4096, dtype=np.int64).reshape(1024, 4096)
            view = loan[:, ::2]
            del loan
            expected = np.asarray(view).copy()
            assert pub.send(view, timeout=TIMEOUT) == 1
            del view
            # Two buffers in all: the packed copy waits for the stopped subscriber in one; the other is free.
            again = pub.loan((1024, 4096), "int64", timeout=2.0)
            assert again.shape == (1024, 4096)
            del again
        finally:
            sub.signal(signal.SIGCONT)
        assert sub("col.wait(1, tmo)", tmo=TIMEOUT) == 1
        got = sub("col.got[0]")
        assert got["transport"] == "ucx-packed"
        assert same_bits(got["array"], expected)
    finally:
        pub.close()


def test_a_dict_list_or_tuple_message_arrives_as_one_with_each_layout():
    with Pair("group", depth=16) as p:
        rng = np.random.default_rng(3)
        img = random_array((4, 5, 3), "uint8", rng)
        boxes = random_array((6, 4), "float32", rng)[:, ::-1]
        loans = p.pub.loan({"mask": ((3, 4), "bool"), "rows": ((4, 1024), "int32")})
        np.asarray(loans["mask"])[...] = np.eye(3, 4, dtype=bool)
        np.asarray(loans["rows"])[...] = np.arange(4096).reshape(4, 1024)
        rows = loans.pop("rows")
        rows_view = rows[::2]
        del rows
        assert p.pub.send({"image": img, "boxes": boxes, "mask": loans["mask"], "rows": rows_view},
                          {"frame": 7}, timeout=TIMEOUT) == 1
        del rows_view
        m = p.sub.recv(timeout=TIMEOUT)
        assert isinstance(m, dict) and list(m) == ["image", "boxes", "mask", "rows"]
        assert_received(m["image"], img)
        assert_received(m["boxes"], boxes)
        assert_received(m["mask"], np.eye(3, 4, dtype=bool), sent_was_a_copy=False)
        assert same_bits(np.asarray(m["rows"]), np.arange(4096, dtype=np.int32).reshape(4, 1024)[::2])
        assert all(v.metadata["frame"] == 7 for v in m.values())
        pair_list = [np.zeros(3), np.arange(4.0).reshape(2, 2).T]
        assert p.pub.send(pair_list, timeout=TIMEOUT) == 1
        m = p.sub.recv(timeout=TIMEOUT)
        assert type(m) is list and len(m) == 2
        for t, a in zip(m, pair_list):
            assert_received(t, a)
        assert p.pub.send((np.full(1, 9.0),), timeout=TIMEOUT) == 1
        m = p.sub.recv(timeout=TIMEOUT)
        assert type(m) is tuple and len(m) == 1 and float(np.asarray(m[0])[0]) == 9.0


def test_received_tensors_outlive_their_subscriber_and_publisher():
    p = Pair("outlive")
    kept = [p.roundtrip(np.full((64, 64), i, np.float64)[::2]) for i in range(5)]
    p.pub.close()
    with pytest.raises(EOFError):
        p.sub.recv(timeout=TIMEOUT)
    assert p.sub.closed
    p.sub.close()
    del p
    gc.collect()
    for i, t in enumerate(kept):
        assert_received(t, np.full((64, 64), i, np.float64)[::2])


# ==== 1. loopback: credits and on_full for a remote subscriber =======================================================


def test_on_full_block_waits_for_a_remote_subscribers_credit_then_times_out_naming_it():
    with Pair("block", depth=2) as p:
        p.pub.send(np.array([0]), timeout=TIMEOUT)
        p.pub.send(np.array([1]), timeout=TIMEOUT)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="remote subscriber"):
            p.pub.send(np.array([2]), timeout=0.3)
        assert time.monotonic() - t0 < 3
        assert int(np.asarray(p.sub.recv(timeout=TIMEOUT))[0]) == 0
        p.pub.send(np.array([3]), timeout=TIMEOUT)  # the credit came back: room again
        assert [int(np.asarray(p.sub.recv(timeout=TIMEOUT))[0]) for _ in range(2)] == [1, 3]


def test_credit_goes_back_in_batches_of_half_the_depth_and_a_remainder_still_arrives():
    # depth 8: credit returns 4 at a time, and what is left under 4 within ~10 ms of the engine's next tick.
    with Pair("batch", depth=8) as p:
        for i in range(8):
            p.pub.send(np.array([i]), timeout=TIMEOUT)
        with pytest.raises(TimeoutError, match="remote subscriber"):
            p.pub.send(np.array([-1]), timeout=0.2)
        taken = [int(np.asarray(p.sub.recv(timeout=TIMEOUT))[0]) for _ in range(3)]  # a remainder: 3 < 4
        for i in range(8, 11):  # exactly 3 more fit, once the remainder came back
            p.pub.send(np.array([i]), timeout=TIMEOUT)
        with pytest.raises(TimeoutError, match="remote subscriber"):
            p.pub.send(np.array([-1]), timeout=0.2)  # the count stays exact: nothing more than was taken
        taken += [int(np.asarray(p.sub.recv(timeout=TIMEOUT))[0]) for _ in range(8)]
        assert taken == list(range(11))
        for i in range(11, 60):  # a long stream under batched credit never stalls
            p.pub.send(np.array([i]), timeout=TIMEOUT)
            assert int(np.asarray(p.sub.recv(timeout=TIMEOUT))[0]) == i


def _readable(fd) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_fileno_of_a_remote_subscriber_reads_as_set_exactly_while_a_message_waits():
    # The eventfd is kept only once fileno() was asked for (it costs two system calls a message): asked for after
    # messages arrived, it must already read as set.
    with Pair("fileno") as p:
        for i in range(2):
            p.pub.send(np.array([i]), timeout=TIMEOUT)
        time.sleep(0.2)  # (they have most likely landed by now, unwatched; either way fileno must read as set)
        fd = p.sub.fileno()
        got = []
        for _ in range(2):
            wait_until(lambda: _readable(fd), what="fileno readable with a message waiting")
            got.append(int(np.asarray(p.sub.recv(timeout=0))[0]))
        assert got == [0, 1]
        assert not _readable(fd)
        p.pub.send(np.array([7]), timeout=TIMEOUT)
        wait_until(lambda: _readable(fd), what="fileno readable after the next message")
        assert int(np.asarray(p.sub.recv(timeout=0))[0]) == 7
        assert not _readable(fd)
        p.pub.close()
        wait_until(lambda: _readable(fd), what="fileno readable at the end of the stream")


def test_on_full_raise_and_drop_oldest_for_a_remote_subscriber():
    with Pair("raise", depth=2, on_full="raise") as p:
        p.pub.send(np.array([0]))
        p.pub.send(np.array([1]))
        with pytest.raises(BlockingIOError, match="remote subscriber"):
            p.pub.send(np.array([2]))
        p.sub.recv(timeout=TIMEOUT)
        wait_until(lambda: _try_send(p.pub, np.array([3])), what="room after a recv")
    with Pair("drop", depth=2, on_full="drop_oldest") as p:
        for i in range(100):
            p.pub.send(np.array([i]), timeout=TIMEOUT)
        # Nothing read: the publisher's queue for it and the subscriber's own each keep the newest, `depth` at most;
        # the subscriber counts every message it missed, in either queue (the publisher's numbering has gaps).
        wait_until(lambda: p.sub.dropped == 98, what=f"98 dropped (the subscriber says {p.sub.dropped})")
        assert p.pub.dropped <= 98
        got = []
        _drain(p.sub, got)
        assert got == [98, 99]


def _try_send(pub, a):
    try:
        pub.send(a)
        return True
    except BlockingIOError:
        return False


def _drain(sub, into):
    while True:
        try:
            into.append(int(np.asarray(sub.recv(timeout=0.01))[0]))
        except TimeoutError:
            return bool(into)


def test_max_subscribers_counts_local_and_remote_subscribers_together():
    name = topic("cap")
    with tw.Publisher(name, listen="127.0.0.1:0", max_subscribers=1) as pub, tw.Subscriber(name):
        assert pub.subscribers == 1
        with tw.Subscriber(name, connect=pub.address) as remote:
            end = time.monotonic() + TIMEOUT
            with pytest.raises(ValueError, match="max_subscribers"):
                while time.monotonic() < end:
                    try:
                        remote.recv(timeout=0.05)
                    except TimeoutError:
                        assert not remote.connected, f"accepted: the publisher now serves {pub.subscribers}"
            assert pub.subscribers == 1


# ==== 1. loopback: restart, leaks =====================================================================================


def test_a_publisher_closed_with_subscribers_restarts_on_the_same_address_at_once():
    name = topic("restart")
    pub = tw.Publisher(name, listen="127.0.0.1:0")
    addr = pub.address
    try:
        with tw.Subscriber(name, connect=addr) as sub:
            wait_until(lambda: pub.remote_subscribers == 1)
            pub.send(np.ones(3), timeout=TIMEOUT)
            sub.recv(timeout=TIMEOUT)
            pub.close()  # the publisher hangs up first: its side of the connection lingers in TIME_WAIT
            with pytest.raises(EOFError):
                sub.recv(timeout=TIMEOUT)
        pub = tw.Publisher(name, listen=addr)  # a server restarted on its port must be able to listen again
        with tw.Subscriber(name, connect=addr) as sub:
            wait_until(lambda: pub.remote_subscribers == 1)
            pub.send(np.full(2, 5.0), timeout=TIMEOUT)
            assert_received(sub.recv(timeout=TIMEOUT), np.full(2, 5.0))
    finally:
        pub.close()


def test_create_connect_send_close_cycles_leave_no_fds_or_threads(dead_port):
    refused_name = topic("leak-refused")

    def cycle(i, kept):
        name = topic("leak")
        with tw.Publisher(name, listen="127.0.0.1:0", token="s3cret") as pub:
            with tw.Subscriber(name, connect=pub.address, token="s3cret") as sub, \
                    tw.Subscriber(name, connect=pub.address, token="wrong") as refused, \
                    tw.Subscriber(refused_name, connect=f"127.0.0.1:{dead_port}") as never:
                wait_until(lambda: pub.remote_subscribers == 1)
                pub.send(np.full((100, 10), i, np.int32)[:, ::2], timeout=TIMEOUT)
                kept.append(sub.recv(timeout=TIMEOUT))
                with pytest.raises(ValueError, match="wrong token"):
                    refused.recv(timeout=TIMEOUT)
                assert not never.connected

    warm: list = []
    for i in range(2):  # UCX's context and its own threads are made once per process
        cycle(i, warm)
    del warm
    gc.collect()
    fds0, tasks0 = fd_count(), task_count()
    kept: list = []
    for i in range(20):
        cycle(i, kept)
    # Received tensors outlive everything that made them.
    assert [int(np.asarray(t)[0, 0]) for t in kept] == list(range(20))
    del kept
    gc.collect()
    deadline = time.monotonic() + 5  # threads already told to stop may take a moment to be gone from /proc
    while (fd_count() > fds0 + 2 or task_count() > tasks0 + 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fd_count() <= fds0 + 2, f"fds: {fds0} before, {fd_count()} after 20 cycles"
    assert task_count() <= tasks0 + 1, f"threads: {tasks0} before, {task_count()} after 20 cycles"


def net_threads() -> int:
    """tensorwire's network threads in this process (the engine names its thread)."""
    n = 0
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                n += f.read().strip() == "tensorwire-net"
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return n


def test_one_network_thread_serves_every_publisher_and_subscriber_and_goes_when_they_do():
    # One UCX worker per process (src/net/engine.hpp): before UCX 1.18 a socket closed by one worker while its fd
    # number was reopened by another could abort the process (an assertion in UCX's async code). Refused and
    # closing subscribers next to live ones, in rounds, are what opened that window.
    gc.collect()
    idle = net_threads() == 0  # (an earlier test may still hold a session: then the thread stays at the end)
    name, other = topic("engine"), topic("engine-2")
    with tw.Publisher(name, listen="127.0.0.1:0", token="t") as pub, \
            tw.Publisher(other, listen="127.0.0.1:0") as pub2:
        live = [tw.Subscriber(name, connect=pub.address, token="t") for _ in range(3)]
        live.append(tw.Subscriber(other, connect=pub2.address))
        wait_until(lambda: pub.remote_subscribers == 3 and pub2.remote_subscribers == 1, what="four subscribers")
        assert net_threads() == 1
        for r in range(5):
            refused = [tw.Subscriber(name, connect=pub.address, token="wrong" if i % 2 else None) for i in range(4)]
            for i, s in enumerate(refused):
                with pytest.raises(ValueError, match="wrong token" if i % 2 else "requires a token"):
                    s.recv(timeout=TIMEOUT)
            assert pub.send(np.full(4, r), timeout=TIMEOUT) == 3
            assert pub2.send(np.full(2, -r), timeout=TIMEOUT) == 1
            for s in refused:
                s.close()
            for s in live[:3]:
                assert_received(s.recv(timeout=TIMEOUT), np.full(4, r))
            assert_received(live[3].recv(timeout=TIMEOUT), np.full(2, -r))
            assert net_threads() == 1
        for s in live:
            s.close()
    if idle:
        wait_until(lambda: net_threads() == 0, timeout=5, what="the network thread gone once all closed")


# ==== 2. fan-out: a local subscriber and two remote subscriber processes =============================================


def test_fan_out_to_a_local_and_two_remote_subscriber_processes(agents):
    name = topic("fanout")
    n = 40
    rng = np.random.default_rng(11)
    pub = tw.Publisher(name, listen="127.0.0.1:0", depth=4)
    local = tw.Subscriber(name)
    try:
        remotes = [agents(), agents()]
        for r in remotes:
            r("sub = tw.Subscriber(name, connect=addr); col = Collector(sub)", name=name, addr=pub.address)
        wait_until(lambda: pub.subscribers == 3 and pub.remote_subscribers == 2, what="three subscribers")
        sent = []
        for i in range(n):
            kind = i % 4
            if kind == 0:
                a = random_array((1 + i, 7), "float64", rng)
                obj = expected = a
            elif kind == 1:
                a = random_array((16, 9), "int16", rng)[::-3, 1::2]
                obj = expected = a
            elif kind == 2:
                loan = pub.loan((4, 1024), "uint32")
                np.asarray(loan)[...] = i
                obj, expected = loan, np.full((4, 1024), i, np.uint32)
                del loan
            else:
                loan = pub.loan((8, 640), "float32")
                np.asarray(loan)[...] = random_array((8, 640), "float32", rng)
                view = loan[1::2, ::2]
                del loan
                expected = np.asarray(view).copy()
                obj = view
                del view
            sent.append(expected)
            assert pub.send(obj, {"i": i}, timeout=TIMEOUT) == 3
            del obj
            t = local.recv(timeout=TIMEOUT)
            assert t.transport == ("shm" if kind >= 2 else "shm-copy") and t.metadata["i"] == i
            assert same_bits(np.asarray(t), expected)
        pub.close()
        with pytest.raises(EOFError):
            local.recv(timeout=TIMEOUT)
        for r in remotes:
            end = r("col.wait_end(tmo)", timeout=TIMEOUT + 5, tmo=TIMEOUT)
            assert end is not None and end[0] == "EOFError", end
            got = r("col.got")
            assert [g["meta"]["i"] for g in got] == list(range(n))  # every message, in order, nothing else
            for g, expected in zip(got, sent):
                assert same_bits(g["array"], expected)
                assert g["transport"] in ("ucx", "ucx-packed") and g["readonly"] and not g["writeable"]
    finally:
        local.close()
        pub.close()


# ==== 3. two hosts: network namespaces joined by a veth pair =========================================================


class TwoHosts:
    """Namespaces A and B, veth A<->B with 10.X.Y.1/24 in A and 10.X.Y.2/24 in B, loopback up in both."""

    def __init__(self):
        pid, tag = os.getpid(), secrets.token_hex(2)
        self.ns = (f"twtest-{pid}-{tag}-a", f"twtest-{pid}-{tag}-b")
        self.veth = (f"twt{pid}{tag[:2]}a", f"twt{pid}{tag[:2]}b")  # at most 15 characters
        self.ip = (f"10.{201 + pid % 50}.{(pid // 50) % 250 + 1}.1", f"10.{201 + pid % 50}.{(pid // 50) % 250 + 1}.2")
        self.made: list[str] = []

    @staticmethod
    def _ip(*args):
        return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)

    def up(self):
        if shutil.which("ip") is None:
            pytest.skip("two-host tests need the `ip` command (iproute2), which is not installed")
        for ns in self.ns:
            r = self._ip("netns", "add", ns)
            if r.returncode != 0:
                pytest.skip(f"two-host tests need network namespaces, and `ip netns add {ns}` failed "
                            f"({(r.stderr or r.stdout).strip()}): run as root (CAP_SYS_ADMIN and CAP_NET_ADMIN)")
            self.made.append(ns)
        steps = [("link", "add", self.veth[0], "netns", self.ns[0], "type", "veth", "peer", "name", self.veth[1],
                  "netns", self.ns[1])]
        for ns, veth, ip in zip(self.ns, self.veth, self.ip):
            steps += [("-n", ns, "addr", "add", f"{ip}/24", "dev", veth), ("-n", ns, "link", "set", "lo", "up"),
                      ("-n", ns, "link", "set", veth, "up")]
        for step in steps:
            r = self._ip(*step)
            if r.returncode != 0:
                pytest.skip(f"two-host tests: `ip {' '.join(step)}` failed: {(r.stderr or r.stdout).strip()}")
        # A veth has no carrier for a moment after both ends are up; UCX lists only running interfaces when a
        # process creates its context, so an agent must not start before.
        for ns, veth in zip(self.ns, self.veth):
            wait_until(lambda: (lambda s: "state UP" in s and "NO-CARRIER" not in s)(
                self._ip("-n", ns, "-o", "link", "show", "dev", veth).stdout), what=f"carrier on {veth}")

    def down(self):
        errors = []
        for ns in reversed(self.made):
            r = self._ip("netns", "del", ns)
            if r.returncode != 0:
                errors.append(f"ip netns del {ns}: {r.stderr.strip()}")
        self.made.clear()
        assert not errors, errors

    def prefix(self, side: int):
        return ("ip", "netns", "exec", self.ns[side])


@pytest.fixture(scope="class")
def hosts():
    h = TwoHosts()
    try:
        h.up()
        yield h
    finally:
        h.down()


@pytest.fixture
def on(hosts, agents):
    """on(0) / on(1): a new agent in namespace A / B, UCX held to TCP."""
    return lambda side: agents(hosts.prefix(side), {"UCX_TLS": "tcp"})


def _listen(agent, name, token=None, insecure=False, port=0, **kw):
    """Starts `pub` in the agent listening on 0.0.0.0:port; returns the port."""
    addr = agent("pub = tw.Publisher(name, listen=f'0.0.0.0:{port}', token=token, insecure=insecure, **kw)\n"
                 "pub.address", name=name, token=token, insecure=insecure, port=port, kw=kw)
    return int(addr.rsplit(":", 1)[1])


def _subscribe(agent, var, name, addr, token=None, keep=False, **kw):
    agent(f"{var} = tw.Subscriber(name, connect=addr, token=token, **kw); col_{var} = Collector({var}, keep=keep)",
          name=name, addr=addr, token=token, keep=keep, kw=kw)


def _wait_subscribers(agent, n, timeout=TIMEOUT, attr="remote_subscribers"):
    return agent(f"wait_until(lambda: pub.{attr} == n, tmo)", timeout=timeout + 5, n=n, tmo=timeout)


@pytest.mark.usefixtures("hosts")
class TestTwoHosts:
    def test_strided_tensors_and_metadata_cross_bit_exact(self, hosts, on):
        a, b = on(0), on(1)
        name, token = topic("hosts"), secrets.token_hex(8)
        port = _listen(a, name, token=token, depth=16)
        a("local = tw.Subscriber(name)", name=name)  # machine A's own subscriber, from the same publisher
        _subscribe(b, "sub", name, f"{hosts.ip[0]}:{port}", token=token)
        _wait_subscribers(a, 1)
        assert a("pub.subscribers") == 2
        rng = np.random.default_rng(5)
        points = random_array((1000, 4), "float32", rng)
        nan_bits = random_array((64, 64), "float64", rng)  # NaN payloads among them, bit-exact or not at all
        big = random_array((1 << 20,), "float32", rng)  # 4 MiB: many TCP segments
        meta = {"ts": 1.5, "frame": {"id": 3, "tags": ["a", "b"], "raw": b"\x01\x02", "pose": (0.5, -0.0)}}
        # (base, view): pickling would make any view contiguous, so the agent takes the view itself
        cases = {"points": (points, "lambda b: b[:, ::2]"),
                 "neg": (random_array((9, 11), "int16", rng), "lambda b: b[::-1, ::-3]"),
                 "nan": (nan_bits, "lambda b: b.T[3:40:2]"), "big": (big, "lambda b: b"),
                 "0-d": (np.array(2.5 + 1j, np.complex64), "lambda b: b"),
                 "bcast": (np.arange(5, dtype=np.uint16), "lambda b: np.broadcast_to(b, (3, 5))")}
        arrays = {k: eval(view)(base) for k, (base, view) in cases.items()}
        for k, (base, view) in cases.items():
            assert a("pub.send(eval(view)(base), meta, timeout=10)", base=base, view=view,
                     meta={**meta, "case": k}) == 2
        a("""
            loan = pub.loan((64, 4096), "uint8"); np.asarray(loan)[...] = 7; view = loan[::2]; del loan
            pub.send(view, {"case": "loan"}, timeout=10); del view
        """)
        a("pub.send({'x': arr, 'y': arr.T}, {'case': 'dict'}, timeout=10)", arr=points[:3])
        assert b("col_sub.wait(n, 10)", n=len(arrays) + 2) == len(arrays) + 2
        got = b("col_sub.got")
        for g, (k, arr) in zip(got, arrays.items()):
            assert g["meta"] == {**meta, "case": k}
            assert same_bits(g["array"], arr), k
            assert g["readonly"] and not g["writeable"]
            check_transport(g["transport"], g["view_strides"], arr, True)
        loan = got[len(arrays)]
        assert loan["meta"] == {"case": "loan"} and same_bits(loan["array"], np.full((32, 4096), 7, np.uint8))
        assert loan["transport"] in ("ucx", "ucx-packed")
        if loan["transport"] == "ucx":
            assert loan["view_strides"] == (8192, 1)
        d = got[-1]
        assert list(d) == ["x", "y"] and same_bits(d["x"]["array"], points[:3]) \
            and same_bits(d["y"]["array"], points[:3].T) and d["x"]["meta"] == {"case": "dict"}
        # and machine A's local subscriber got all of it through shared memory
        local = a("[snap(local.recv(timeout=10)) for _ in range(n)]", n=len(arrays) + 2)
        assert {g["transport"] for g in local[:-2]} == {"shm-copy"}  # arrays: packed into the pool once
        assert local[-2]["transport"] == "shm"  # the loan: no copy
        assert all(same_bits(g["array"], arr) for g, arr in zip(local, arrays.values()))

    def test_a_reachable_listener_needs_a_token_unless_insecure(self, hosts, on):
        a, b = on(0), on(1)
        name = topic("insecure")
        for addr in ("0.0.0.0:0", f"{hosts.ip[0]}:0"):
            with pytest.raises(RemoteError) as e:
                a("tw.Publisher(name, listen=addr)", name=name, addr=addr)
            assert e.value.kind == "ValueError" and "token" in e.value.msg
        port = _listen(a, name, insecure=True)
        addr = f"{hosts.ip[0]}:{port}"
        _subscribe(b, "sub", name, addr)
        _wait_subscribers(a, 1)
        a("pub.send(np.arange(6).reshape(2, 3).T, timeout=10)")
        assert b("col_sub.wait(1, 10)") == 1
        assert same_bits(b("col_sub.got[0]['array']"), np.arange(6).reshape(2, 3).T)
        # A subscriber that has a token refuses a publisher that cannot prove it knows it.
        _subscribe(b, "strict", name, addr, token="mine")
        end = b("col_strict.wait_end(10)")
        assert end is not None and end[0] == "ValueError" and "token" in end[1], end
        assert b("strict.connected") is False

    def test_the_right_token_connects_a_wrong_or_missing_one_is_refused(self, hosts, on):
        a, b = on(0), on(1)
        name, token = topic("token"), secrets.token_hex(8)
        port = _listen(a, name, token=token)
        addr = f"{hosts.ip[0]}:{port}"
        _subscribe(b, "good", name, addr, token=token)
        _subscribe(b, "wrong", name, addr, token=token + "x")
        _subscribe(b, "none", name, addr)
        for var, words in (("wrong", "wrong token"), ("none", "requires a token")):
            end = b(f"col_{var}.wait_end(10)")
            assert end is not None and end[0] == "ValueError" and words in end[1], (var, end)
            assert b(f"{var}.connected") is False
            with pytest.raises(RemoteError) as e:  # and it stays refused
                b(f"{var}.recv(timeout=1)")
            assert e.value.kind == "ValueError" and words in e.value.msg
        _wait_subscribers(a, 1)
        assert a("pub.send(np.full(3, 4.5), timeout=10)") == 1
        assert b("col_good.wait(1, 10)") == 1 and same_bits(b("col_good.got[0]['array']"), np.full(3, 4.5))
        assert a("pub.subscribers") == 1

    def test_sigkill_of_a_subscriber_drops_it_without_stalling_the_publisher(self, hosts, on):
        a, victim, live = on(0), on(1), on(1)
        name = topic("killsub")
        port = _listen(a, name, insecure=True, depth=2, on_full="block")
        addr = f"{hosts.ip[0]}:{port}"
        victim("sub = tw.Subscriber(name, connect=addr)", name=name, addr=addr)  # connected, never reads
        _subscribe(live, "sub", name, addr)
        _wait_subscribers(a, 2)
        sent = []
        for i in range(2):
            assert a("pub.send(np.full(100, i), {'i': i}, timeout=10)", i=i) == 2
            sent.append(i)
        with pytest.raises(RemoteError) as e:  # the victim's credits are spent: a send waits for it
            a("pub.send(np.full(100, -1), {'i': -1}, timeout=0.3)")
        assert e.value.kind == "TimeoutError"
        victim.signal(signal.SIGKILL)
        t0 = time.monotonic()
        assert a("pub.send(np.full(100, 2), {'i': 2}, timeout=ft)", ft=FAULT_BOUND) == 1
        sent.append(2)
        _wait_subscribers(a, 1, timeout=FAULT_BOUND)
        assert time.monotonic() - t0 < FAULT_BOUND
        for i in range(3, 23):  # no stall: each send has room at once, the live subscriber keeps receiving
            assert a("pub.send(np.full(100, i), {'i': i}, timeout=2)", i=i) == 1
            sent.append(i)
        assert live("col_sub.wait(n, 10)", n=len(sent)) == len(sent)
        got = live("col_sub.got")
        assert [g["meta"]["i"] for g in got] == sent
        assert all(int(g["array"][0]) == g["meta"]["i"] for g in got)
        live("sub.close()")
        _wait_subscribers(a, 0, timeout=FAULT_BOUND, attr="subscribers")

    def test_a_silent_subscriber_is_dropped_after_the_keepalive(self, hosts, on):
        a, victim, live = on(0), on(1), on(1)
        name = topic("stopsub")
        port = _listen(a, name, insecure=True, depth=2, keepalive=1.5)
        addr = f"{hosts.ip[0]}:{port}"
        victim("sub = tw.Subscriber(name, connect=addr)", name=name, addr=addr)
        _subscribe(live, "sub", name, addr)
        _wait_subscribers(a, 2)
        for i in range(2):
            a("pub.send(np.full(10, i), timeout=10)", i=i)
        victim.signal(signal.SIGSTOP)  # alive, its sockets open, but silent: no credits, no pings
        t0 = time.monotonic()
        assert a("pub.send(np.full(10, 2), timeout=ft)", ft=FAULT_BOUND) == 1  # waits only until it is dropped
        assert time.monotonic() - t0 < 1.5 + 8  # (the keepalive, not FAULT_BOUND; slack for a loaded machine)
        assert a("pub.remote_subscribers") == 1
        for i in range(3, 13):
            assert a("pub.send(np.full(10, i), timeout=2)", i=i) == 1
        assert live("col_sub.wait(13, 10)") == 13
        assert [int(g["array"][0]) for g in live("col_sub.got")] == list(range(13))

    def test_sigkill_of_the_publisher_ends_the_stream_and_received_tensors_stay_valid(self, hosts, on):
        a, b = on(0), on(1)
        name, token = topic("killpub"), secrets.token_hex(8)
        port = _listen(a, name, token=token, depth=8)
        addr = f"{hosts.ip[0]}:{port}"
        b("sub = tw.Subscriber(name, connect=addr, token=token)", name=name, addr=addr, token=token)
        _wait_subscribers(a, 1)
        rng = np.random.default_rng(9)
        base = random_array((50, 40), "float32", rng)
        sent = [base[::2, ::-3], random_array((7,), "int64", rng)]
        a("pub.send(base[::2, ::-3], timeout=10)", base=base)
        a("pub.send(arr, timeout=10)", arr=sent[1])
        a("loan = pub.loan((4, 4096), 'uint8'); np.asarray(loan)[...] = 42; pub.send(loan, timeout=10); del loan")
        sent.append(np.full((4, 4096), 42, np.uint8))
        b("held = [sub.recv(timeout=10) for _ in range(3)]")
        a.signal(signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(RemoteError) as e:
            b("sub.recv(timeout=ft)", timeout=FAULT_BOUND + 10, ft=FAULT_BOUND)
        assert e.value.kind == "EOFError", e.value
        assert time.monotonic() - t0 < FAULT_BOUND
        assert b("sub.closed") is True
        b("import gc; gc.collect()")
        after = b("[np.asarray(t).copy() for t in held]")  # read after the publisher is gone
        for got, arr in zip(after, sent):
            assert same_bits(got, arr)

        # A publisher restarted on the same address: a new Subscriber, made before it listens, reaches it.
        b("sub2 = tw.Subscriber(name, connect=addr, token=token); col2 = Collector(sub2)")
        time.sleep(0.3)
        assert b("sub2.connected") is False
        a2 = on(0)
        _listen(a2, name, token=token, port=port)
        _wait_subscribers(a2, 1, timeout=FAULT_BOUND)
        a2("pub.send(np.arange(5.0), timeout=10)")
        assert b("col2.wait(1, 10)") == 1 and same_bits(b("col2.got[0]['array']"), np.arange(5.0))
        with pytest.raises(RemoteError) as e:  # the old stream stays ended
            b("sub.recv(timeout=0.2)")
        assert e.value.kind == "EOFError"

    def test_a_silent_publisher_ends_the_stream_after_the_keepalive(self, hosts, on):
        a, b = on(0), on(1)
        name = topic("stoppub")
        port = _listen(a, name, insecure=True)
        _subscribe(b, "sub", name, f"{hosts.ip[0]}:{port}", keep=True, keepalive=1.5)
        _wait_subscribers(a, 1)
        a("pub.send(np.arange(1000, dtype=np.int32)[::3], timeout=10)")
        assert b("col_sub.wait(1, 10)") == 1
        a.signal(signal.SIGSTOP)  # its machine "vanished": the connection stays open, nothing comes
        t0 = time.monotonic()
        end = b("col_sub.wait_end(ft)", timeout=FAULT_BOUND + 10, ft=FAULT_BOUND)
        assert end is not None and end[0] == "EOFError", end
        assert time.monotonic() - t0 < 1.5 + 8  # (the keepalive, not FAULT_BOUND; slack for a loaded machine)
        assert same_bits(b("np.asarray(col_sub.held[0]).copy()"), np.arange(1000, dtype=np.int32)[::3])

    def test_garbage_sent_to_the_port_does_not_hurt_the_publisher(self, hosts, on):
        a, b = on(0), on(1)
        name, token = topic("garbage"), secrets.token_hex(8)
        port = _listen(a, name, token=token)
        host = hosts.ip[0]
        b("""
            outcome = []
            s = socket.create_connection((host, port), timeout=5)
            try:
                s.sendall(random.Random(7).randbytes(65536))  # 64 KiB of random bytes (seeded: replayable)
                outcome.append("sent")
            except OSError as e:               # the publisher may hang up on it: that is fine
                outcome.append(type(e).__name__)
            s.close()
            socket.create_connection((host, port), timeout=5).close()   # connects, says nothing, goes
            silent = socket.create_connection((host, port), timeout=5)  # connects, says nothing, stays
        """, host=host, port=port)
        time.sleep(0.3)
        assert a.alive(), a.stderr()
        assert a("pub.remote_subscribers") == 0
        _subscribe(b, "sub", name, f"{host}:{port}", token=token)
        _wait_subscribers(a, 1)
        assert a("pub.send(np.eye(3), timeout=10)") == 1
        assert b("col_sub.wait(1, 10)") == 1 and same_bits(b("col_sub.got[0]['array']"), np.eye(3))
        b("silent.close()")
        for i in range(3):  # and again, interleaved with a live subscriber
            b("s = socket.create_connection((host, port), timeout=5); s.sendall(random.Random(seed).randbytes(4096)); s.close()",
              host=host, port=port, seed=i)
        assert a("pub.send(np.ones(2), timeout=10)") == 1
        assert b("col_sub.wait(2, 10)") == 2
        assert a.alive() and a("pub.subscribers") == 1 and a("pub.closed") is False


@pytest.mark.parametrize("pub_keepalive, sub_keepalive", [(10.0, 0.3), (0.3, 10.0)])
def test_an_idle_link_outlives_a_keepalive_shorter_on_one_side(pub_keepalive, sub_keepalive):
    # Each side pinged after min(1 s, its own keepalive / 3) of silence, so a side whose keepalive was under a
    # second gave up on a healthy, idle peer (a subscriber with keepalive=0.3 saw end of stream after ~0.3 s).
    # HELLO and AUTH now carry both, and each side pings often enough for the shorter one.
    p = Pair("ka-mismatch", sub_kw={"keepalive": sub_keepalive}, keepalive=pub_keepalive)
    try:
        end = time.monotonic() + 2.0  # several of the short keepalives, idle
        while time.monotonic() < end:
            assert p.pub.remote_subscribers == 1 and p.sub.connected
            time.sleep(0.05)
        got = p.roundtrip(np.arange(5.0))
        assert np.asarray(got).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    finally:
        p.sub.close()
        p.pub.close()


_LOOPBACK_ONLY = r"""
import os, socket, struct, sys, time
import numpy as np
import tensorwire as tw

def listening():
    # This process's listening TCP sockets, as (ip, port): /proc/net/tcp{,6} rows in state 0A whose inode is ours.
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(link[8:-1])
    out = []
    for path, fam in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with open(path) as f:
            for row in f.readlines()[1:]:
                col = row.split()
                if col[3] != "0A" or col[9] not in mine:
                    continue
                addr, port = col[1].split(":")
                raw = bytes.fromhex(addr)
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word host-order
                out.append((socket.inet_ntop(fam, raw), int(port, 16)))
    return out

name = sys.argv[1]
assert tw._ext._ucx_info()["why"] is None  # a status query first makes UCX's context, for every interface
pub = tw.Publisher(name, listen=":0")
sub = tw.Subscriber(name, connect=pub.address)
end = time.monotonic() + 30
while pub.remote_subscribers < 1:
    assert time.monotonic() < end, "never connected"
    time.sleep(0.01)
pub.send(np.arange(3.0))
assert np.asarray(sub.recv(timeout=30)).tolist() == [0.0, 1.0, 2.0]
socks = listening()
assert socks and all(ip in ("127.0.0.1", "::1") for ip, _ in socks), socks
try:
    tw.Subscriber(name + "-far", connect="192.0.2.1:7447")  # (TEST-NET-1: never reached, refused before)
    print("a non-loopback subscriber was made beside open loopback ones")
except ValueError as e:
    assert "serves loopback only" in str(e) and "UCX_NET_DEVICES" in str(e), e
sub.close()
pub.close()
# With nothing open, a listener other machines can reach is made (its context again, for every interface).
with tw.Publisher(name + "-open", listen="0.0.0.0:0", insecure=True) as wide:
    port = int(wide.address.rsplit(":", 1)[1])
    with tw.Subscriber(name + "-open", connect=f"127.0.0.1:{port}") as s2:
        end = time.monotonic() + 30
        while wide.remote_subscribers < 1:
            assert time.monotonic() < end, "never connected"
            time.sleep(0.01)
        wide.send(np.arange(2.0))
        assert np.asarray(s2.recv(timeout=30)).tolist() == [0.0, 1.0]
print("ok")
"""


def test_a_loopback_publisher_and_subscriber_open_no_port_on_other_interfaces():
    # UCX's TCP transport listens for its data connections on every interface of UCX_NET_DEVICES (all by default),
    # so listen=":7447" ("loopback only") left a UCX port open on eth0, which other machines could reach (and
    # Debian's UCX 1.13 aborted on crafted bytes sent there). A process whose network publishers and subscribers
    # are loopback ones now runs UCX with NET_DEVICES=lo.
    env = {k: v for k, v in os.environ.items() if k != "UCX_NET_DEVICES"}
    r = subprocess.run([sys.executable, "-c", _LOOPBACK_ONLY, topic("lo-only")], env=env, capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0 and r.stdout.splitlines() == ["ok"], (r.returncode, r.stdout, r.stderr[-3000:])


_FORK_AFTER_NET = r"""
import os, sys, time
import tensorwire as tw
name = sys.argv[1]
pub = tw.Publisher(name, listen=":0")
pid = os.fork()
if pid == 0:
    try:
        tw.Publisher(name + "-child", listen=":0")
        print("the child started UCX again")
    except Exception as e:
        print(type(e).__name__, str(e))
    os._exit(0)
os.waitpid(pid, 0)
pub.close()
"""


def test_a_forked_child_of_a_process_that_started_ucx_is_told_why_it_cannot():
    # (it timed out connecting, "no answer to the handshake ... (is it a tensorwire publisher?)")
    r = subprocess.run([sys.executable, "-c", _FORK_AFTER_NET, topic("fork")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "a fork() of pid" in r.stdout and "'spawn' or 'forkserver'" in r.stdout, r.stdout


def test_a_remote_end_of_stream_says_why():
    p = Pair("why-eof")
    try:
        p.pub.close()
        with pytest.raises(EOFError, match=rf"end of stream: the publisher at {re.escape(p.pub.address)} closed the "
                                           r"topic$"):
            p.sub.recv(timeout=TIMEOUT)
    finally:
        p.sub.close()
        p.pub.close()
    code = ("import time, tensorwire as tw; p = tw.Publisher(%r, listen='127.0.0.1:0'); print(p.address, flush=True);"
            " time.sleep(120)")
    name = topic("why-silent")
    pr = subprocess.Popen([sys.executable, "-c", code % name], stdout=subprocess.PIPE, text=True)
    try:
        addr = pr.stdout.readline().strip()
        with tw.Subscriber(name, connect=addr, keepalive=0.5) as sub:
            wait_until(lambda: sub.connected, what="connect")
            os.kill(pr.pid, signal.SIGSTOP)  # alive, silent
            with pytest.raises(EOFError, match=r"the publisher at .* was silent for longer than the keepalive "
                                               r"\(0\.5 s\)"):
                sub.recv(timeout=TIMEOUT)
    finally:
        pr.kill()
        pr.wait()


def test_closing_a_remote_subscriber_says_how_many_queued_messages_it_discarded():
    # (a local subscriber said so; a remote one said only "this subscriber was closed")
    with Pair("closeq") as p:
        for i in range(3):
            assert p.pub.send({"a": np.zeros(3), "b": np.full(2, i)}, timeout=TIMEOUT) == 1
        p.pub.close()  # its BYE comes after the three messages: once it is in, they are all queued here
        wait_until(lambda: not p.sub.connected, what="the publisher's close")
        p.sub.close()
        with pytest.raises(EOFError, match=r"this subscriber was closed with 3 unread messages queued; close\(\) "
                                           r"discarded them$"):
            p.sub.recv(timeout=1)
