"""`tensorwire bench --net`: latency (p50/p99) and throughput of moving a tensor between two hosts, for tensorwire
over UCX and, in the same run, UCX's own benchmark (the engine's limit over the same transport) and what users do
today (torch.distributed with gloo, pickled arrays over a socket).

The two hosts are two network namespaces joined by a veth pair, made for the run and deleted when it ends however
it ends: tw-bench-<pid>-a and -b, veth twb<pid>a / twb<pid>b (MTU 1500 unless --mtu), 10.77.N.1/24 and
10.77.N.2/24, loopback up in both. It needs root (`ip netns add`); where namespaces cannot be made it says why and
measures nothing. Every process runs in one of them through `ip netns exec` (which keeps the environment): the
sending side in A (it listens), the receiving side in B (it connects). UCX is held to TCP (UCX_TLS=tcp, and
UCX_NET_DEVICES names the veth): namespaces do not isolate shared memory, so UCX would otherwise move the data
through it and measure no network. gloo is pinned to the veth with GLOO_SOCKET_IFNAME. Every UCX process runs
the same UCX: the one tensorwire loads (TW_UCX_LIBRARY, else the libucx wheel where installed, else the system's),
and ucx_perftest from the same installation (the wheel's bin/, else the one on PATH).

Methods:
  ucx_perftest     UCX's own benchmark, UCP active messages (ucp_am_lat, ucp_am_bw): server in A, client in B
  tw-send          tw.Publisher.send(ndarray): an ordinary contiguous uint8 array (not from the pool)
  tw-loan          tw.Publisher.loan() + send(): the payload in the publisher's pool, only the stamp written
  tw-strided-loan  send(loan[:, ::2]): every other column of an int64 loan twice the payload's size (8-byte runs,
                   rows of up to 1024 columns); may cross as an iov of its runs, nothing packed (t.transport "ucx")
  tw-strided-send  send(a[:, ::2]) of an ordinary int64 ndarray of the same shape (the sender packs: "ucx-packed")
  tw-cpp-loan      latency only: the same publish/subscribe through tensorwire's C++ API (loan + send, recv with a
                   zero timeout), a ping-pong like ucx_perftest's, by the tw_net_pingpong program of the build
                   (found next to the library the imported tensorwire uses, or named by TW_NET_PINGPONG)
  torch-gloo       torch.distributed send/recv, gloo backend, rank 0 in A, rank 1 in B; received into a tensor
                   allocated beforehand (gloo must be told the size: the most favourable case for it)
  mp-pickle        multiprocessing.connection Listener / Client (authkey), conn.send(ndarray): a pickle per message

Latency: one message in flight. tensorwire (from Python), gloo and pickle are one-way, as in `tensorwire bench`: the sender
stamps time.perf_counter_ns() (CLOCK_MONOTONIC: network namespaces share the machine's clock) into the first 8
bytes of the payload just before sending (before loan() for the loan methods); the receiver subtracts it from its
own clock as soon as it can read the payload, then acknowledges through a socketpair the two processes share
(outside the network and the timed path). tensorwire's receiver polls recv(timeout=0) (--tw-recv block: waits in
recv), like ucx_perftest's; gloo's and pickle's block. ucx_perftest's latency is its ping-pong figure, which is
half a round trip (its own definition); p50 and p99 come from two runs (-R 50 and -R 99), each the percentile of
its timing window. The strided methods' payload is the view's bytes (half the loan's); their stamp is element
[0, 0].
tensorwire's methods from Python are also measured as a ping-pong, after their one-way series: side B sends
each message back, the same way and size, from a publisher of its own, and both sides poll: half a round trip,
ucx_perftest's own definition of its latency, which the latency target is judged on (as is tw-cpp-loan's).
Throughput: after an untimed warm-up burst, a burst of messages with no acknowledgement: payload bytes delivered
per second, bytes / (last receive - first send). ucx_perftest: the overall bandwidth ucp_am_bw reports (its
"MB/s" are 2^20 bytes; converted to bytes). Over a network every method moves the payload, so every row is in
bytes per second.
ucx_perftest runs first and again last: the reference is the better figure of the two, and where they differ by
more than 25% the run says so (the machine's speed changed under it: ratios measured across it are uncertain).
Every method runs its sizes in turn, one method after the other, each pair of processes started afresh.

    tensorwire bench --net [--full] [--sizes 64,4K,1M] [--methods tw-send,torch-gloo] [--json FILE] [--markdown]

With no arguments it runs the quick mode (5 sizes, one to two minutes); --full measures every power of 4 from 64 B to
256 MiB. The targets of issue 12 are judged at the end.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import math
import os
import platform
import queue
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np

from tensorwire._bench_ipc import (
    ALL_SIZES,
    BYTE_RATE_UNITS,
    TIME_UNITS,
    TIME_UNITS_MICRO,
    KiB,
    MiB,
    check_writable,
    fmt_size,
    fmt_unit,
    load_results,
    parse_sizes,
    plural,
)

QUICK_SIZES = [64, 4 * KiB, 64 * KiB, MiB, 16 * MiB]
METHODS = ["ucx_perftest", "tw-send", "tw-loan", "tw-strided-loan", "tw-strided-send", "tw-cpp-loan", "torch-gloo",
           "mp-pickle"]
CPP_PINGPONG = "tw-cpp-loan"  # latency only: tensorwire's C++ API, a ping-pong (tw_net_pingpong)
TW_METHODS = ("tw-send", "tw-loan", "tw-strided-loan", "tw-strided-send")
STRIDED = ("tw-strided-loan", "tw-strided-send")
STRIDED_COLS = 512  # columns of the int64 view (the loan or array has twice as many): rows of 8 KiB
WAIT_S = 60.0  # the longest any one wait of a child may last (a message, an acknowledgement, a connection)
PERFTEST = "ucx_perftest"
LINE_TAG = "@tw-bench-net "  # a child's result lines on stdout (libraries may print there too)


def now() -> int:
    return time.perf_counter_ns()


def strided_shape(size: int) -> tuple[int, int]:
    """(rows, cols) of the int64 view whose bytes are `size`; the loan or array it views is (rows, 2 * cols)."""
    elems = size // 8
    cols = min(STRIDED_COLS, elems & -elems)  # the largest power of two (up to 512) that divides the elements
    return elems // cols, cols


def pingpong_warmup(n_lat: int) -> int:
    """Round trips before the timed ones of a ping-pong (connections and pools reach their steady state)."""
    return max(2, n_lat // 10)


def _burst_bytes(quick) -> int:
    return (1 if quick else 2) << 30


def plan_for(sizes, quick) -> list[tuple[int, int, int, int]]:
    """[(size, n_latency, n_warmup, n_burst)]: the latency counts of `tensorwire bench`; bursts of up to 1 GiB
    (2 GiB with --full), long enough at network rates to be more than noise."""
    budget = (64 if quick else 512) * MiB  # bytes per latency series
    plan = []
    for s in sizes:
        n_lat = int(min(300 if quick else 2000, max(8 if quick else 12, budget // s)))
        n_burst = int(min(1000 if quick else 5000, max(4 if quick else 6, _burst_bytes(quick) // s)))
        plan.append((s, n_lat, min(n_burst, 16), n_burst))
    return plan


# ---- the two sides of a pair method (each in its own namespace, started with --role) --------------------------------


class _Ctrl:
    """Newline-delimited JSON over the socketpair the parent hands to both sides (not the network being measured)."""

    def __init__(self, fd: int):
        self.sock = socket.socket(fileno=fd)
        self.buf = b""

    def send(self, obj) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def recv(self, timeout: float = WAIT_S):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the other side said nothing for {timeout:.0f} s")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                continue
            if not chunk:
                raise EOFError("the other side closed the control channel (it exited)")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        obj = json.loads(line)
        if isinstance(obj, dict) and "error" in obj:
            raise RuntimeError(obj["error"])  # "producer: ..." or "consumer: ...": the other side failed
        return obj

    def expect(self, what: str, timeout: float = WAIT_S) -> None:
        got = self.recv(timeout)
        if got != what:
            raise RuntimeError(f"protocol: expected {what!r}, got {got!r}")


def _token() -> str:
    return os.environ["TW_BENCH_NET_TOKEN"]


def _tw_error(e: Exception) -> RuntimeError:
    if isinstance(e, TypeError) and ("listen" in str(e) or "connect" in str(e) or "token" in str(e)):
        return RuntimeError(f"this tensorwire has no network transport ({e}): build it with UCX (libucx-dev)")
    return e if isinstance(e, RuntimeError) else RuntimeError(f"{type(e).__name__}: {e}")


class _TwSender:
    receiver_first = True

    def __init__(self, method, addr, max_size, topic=None):
        import tensorwire as tw

        self.method = method
        try:
            self.pub = tw.Publisher(topic or _topic(method), listen=addr, token=_token())
        except Exception as e:
            raise _tw_error(e) from e
        self.src = np.ones(max(max_size, 64), np.uint8)  # tw-send's ordinary array
        self.view = None

    def start(self):
        deadline = time.monotonic() + WAIT_S
        while self.pub.subscribers < 1:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no remote subscriber within {WAIT_S:.0f} s")
            time.sleep(0.001)

    def prepare(self, size):
        if self.method == "tw-strided-send":
            rows, cols = strided_shape(size)
            self.view = np.ones((rows, 2 * cols), np.int64)[:, ::2]
        elif self.method == "tw-strided-loan":
            self.shape = strided_shape(size)

    def send(self, size):
        m = self.method
        if m == "tw-send":
            a = self.src[:size]
            a[:8].view(np.int64)[0] = now()
            self.pub.send(a, timeout=WAIT_S)
        elif m == "tw-loan":
            t0 = now()
            buf = self.pub.loan((size,), "uint8")
            a = np.asarray(buf)
            a[:8].view(np.int64)[0] = t0
            del a  # a loan is sent with no other export alive
            self.pub.send(buf, timeout=WAIT_S)
        elif m == "tw-strided-loan":
            rows, cols = self.shape
            t0 = now()
            buf = self.pub.loan((rows, 2 * cols), "int64")
            a = np.asarray(buf)
            a[0, 0] = t0
            del a
            view = buf[:, ::2]
            del buf
            self.pub.send(view, timeout=WAIT_S)
        else:  # tw-strided-send
            self.view[0, 0] = now()
            self.pub.send(self.view, timeout=WAIT_S)

    def close(self):
        self.pub.close()


class _TwReceiver:
    def __init__(self, method, addr, busy, topic=None):
        import tensorwire as tw

        self.method, self.busy = method, busy
        try:
            self.sub = tw.Subscriber(topic or _topic(method), connect=addr, token=_token())
        except Exception as e:
            raise _tw_error(e) from e
        self.seen: dict[str, int] = {}
        self.layout = None

    def prepare(self, size):
        self.seen, self.layout = {}, None
        self.shape = strided_shape(size) if self.method in STRIDED else (size,)

    def _recv(self):
        if not self.busy:
            return self.sub.recv(timeout=WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                return self.sub.recv(timeout=0)
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no message within {WAIT_S:.0f} s") from None

    def recv(self, size):
        t = self._recv()
        a = np.asarray(t)
        t1 = now()
        t0 = int(a[0, 0]) if a.ndim == 2 else int(a[:8].view(np.int64)[0])
        tr = getattr(t, "transport", "?")
        self.seen[tr] = self.seen.get(tr, 0) + 1
        if self.layout is None:
            if a.shape != self.shape:
                raise RuntimeError(f"received shape {a.shape}, sent {self.shape}")
            if a.ndim == 2:
                rows, cols = self.shape
                self.layout = ("as sent" if a.strides == (16 * cols, 16) else "dense" if a.strides == (8 * cols, 8)
                               else f"strides {a.strides}")
            else:
                self.layout = "contiguous"
        del a, t  # release the message
        return t0, t1

    def close(self):
        self.sub.close()


def _topic(method) -> str:
    return f"bench/net/{os.environ['TW_BENCH_NET_RUN']}/{method}"


def _topic_for_run(method) -> str:  # (in the parent, which has no TW_BENCH_NET_RUN: its pid is the run)
    return f"bench/net/{os.getpid()}/{method}"


def _back_topic(method) -> str:  # the ping-pong's way back, from B to A
    return _topic(method) + "/back"


class _GlooSender:
    receiver_first = False

    def __init__(self, method, addr, max_size):
        import torch

        self.torch, self.addr = torch, addr
        self.src = np.ones(max(max_size, 64), np.uint8)
        self.t = torch.from_numpy(self.src)  # the same memory

    def start(self):
        import datetime

        import torch.distributed as dist

        self.dist = dist
        dist.init_process_group("gloo", init_method=f"tcp://{self.addr}", rank=0, world_size=2,
                                timeout=datetime.timedelta(seconds=WAIT_S))

    def prepare(self, size):
        pass

    def send(self, size):
        self.src[:8].view(np.int64)[0] = now()
        self.dist.send(self.t[:size], dst=1)

    def close(self):
        self.dist.destroy_process_group()


class _GlooReceiver:
    def __init__(self, method, addr, busy):
        import datetime

        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo", init_method=f"tcp://{addr}", rank=1, world_size=2,
                                timeout=datetime.timedelta(seconds=WAIT_S))
        self.seen, self.layout = {}, None

    def prepare(self, size):
        self.buf = self.torch.empty(size, dtype=self.torch.uint8)
        self.view = self.buf.numpy()
        self.view[:] = 0  # faulted in before the first message, as a reused buffer would be

    def recv(self, size):
        self.dist.recv(self.buf, src=0)
        t1 = now()
        return int(self.view[:8].view(np.int64)[0]), t1

    def close(self):
        self.dist.destroy_process_group()


class _PickleSender:
    receiver_first = False

    def __init__(self, method, addr, max_size):
        from multiprocessing.connection import Listener

        host, port = addr.rsplit(":", 1)
        self.listener = Listener((host, int(port)), authkey=_token().encode())
        self.src = np.ones(max(max_size, 64), np.uint8)

    def start(self):
        self.conn = self.listener.accept()  # bounded by the parent's deadline (Listener.accept takes no timeout)

    def prepare(self, size):
        pass

    def send(self, size):
        a = self.src[:size]
        a[:8].view(np.int64)[0] = now()
        self.conn.send(a)

    def close(self):
        self.conn.close()
        self.listener.close()


class _PickleReceiver:
    def __init__(self, method, addr, busy):
        from multiprocessing.connection import Client

        host, port = addr.rsplit(":", 1)
        self.conn = Client((host, int(port)), authkey=_token().encode())
        self.seen, self.layout = {}, None

    def prepare(self, size):
        pass

    def recv(self, size):
        if not self.conn.poll(WAIT_S):
            raise TimeoutError(f"no message within {WAIT_S:.0f} s")
        a = self.conn.recv()
        t1 = now()
        return int(a[:8].view(np.int64)[0]), t1

    def close(self):
        self.conn.close()


def _sender(method, addr, max_size):
    if method in TW_METHODS:
        return _TwSender(method, addr, max_size)
    return {"torch-gloo": _GlooSender, "mp-pickle": _PickleSender}[method](method, addr, max_size)


def _receiver(method, addr, busy):
    if method in TW_METHODS:
        return _TwReceiver(method, addr, busy)
    return {"torch-gloo": _GlooReceiver, "mp-pickle": _PickleReceiver}[method](method, addr, busy)


def _emit(obj) -> None:
    print(LINE_TAG + json.dumps(obj), flush=True)


def _producer(args, ctrl: _Ctrl) -> None:
    plan = json.loads(args.plan)
    sender = _sender(args.method, args.addr, max(p[0] for p in plan))
    ctrl.send("ready")  # listening: the receiver may connect
    if sender.receiver_first:  # its failure to connect arrives here at once, not after a wait for it
        ctrl.expect("ready")
        sender.start()
    else:  # gloo's and pickle's connections complete only once this side takes part (rendezvous, challenge)
        sender.start()
        ctrl.expect("ready")
    # tensorwire's ping-pong: B sends each message back (same method, same size) on a publisher of its own, which
    # listens before B says "ready"; this side polls for it, as ucx_perftest's ping-pong does.
    back = _TwReceiver(args.method, args.addr2, True, _back_topic(args.method)) if args.method in TW_METHODS else None
    for size, n_lat, n_warm, n_burst in plan:
        sender.prepare(size)
        ctrl.expect("prepared")
        for _ in range(n_lat):
            sender.send(size)
            ctrl.expect("a")
        rtts = []
        if back is not None:
            back.prepare(size)
            ctrl.expect("pp")
            for _ in range(n_lat + pingpong_warmup(n_lat)):
                t0 = now()
                sender.send(size)
                back.recv(size)
                rtts.append(now() - t0)
            rtts = rtts[pingpong_warmup(n_lat):]
        for _ in range(n_warm):  # pools and buffers reach their steady state (not timed)
            sender.send(size)
        ctrl.expect("w", timeout=10 * WAIT_S)
        t_start = now()
        for _ in range(n_burst):
            sender.send(size)
        res = ctrl.recv(timeout=10 * WAIT_S)
        lats = np.sort(np.asarray(res["lats"], dtype=np.float64)) / 1000.0
        msgs_per_s = n_burst / max(res["end"] - t_start, 1) * 1e9
        row = {"method": args.method, "bytes": size, "n": len(lats), "n_burst": n_burst,
               "p50_us": float(np.percentile(lats, 50)), "p99_us": float(np.percentile(lats, 99)),
               "latency": "one-way", "zero_copy": False, "msgs_per_s": msgs_per_s,
               "throughput_GBps": msgs_per_s * size / 1e9}
        if rtts:  # half a round trip, both sides polling: ucx_perftest's definition of its latency
            half = np.asarray(rtts, dtype=np.float64) / 2000.0
            row.update(pp_p50_us=float(np.percentile(half, 50)), pp_p99_us=float(np.percentile(half, 99)),
                       pp_n=len(rtts))
        if res.get("transport"):
            row["transport"] = res["transport"]
        if res.get("layout"):
            row["layout"] = res["layout"]
        _emit({"row": row})
    sender.close()
    if back is not None:
        back.close()
    _emit({"done": True})


def _consumer(args, ctrl: _Ctrl) -> None:
    plan = json.loads(args.plan)
    ctrl.expect("ready")
    receiver = _receiver(args.method, args.addr, args.tw_recv == "busy")
    back = None
    if args.method in TW_METHODS:
        back = _TwSender(args.method, args.addr2, max(p[0] for p in plan), _back_topic(args.method))
    ctrl.send("ready")
    if back is not None:
        back.start()  # A connects right after "ready"
    for size, n_lat, n_warm, n_burst in plan:
        receiver.prepare(size)
        ctrl.send("prepared")
        lats = []
        for _ in range(n_lat):
            t0, t1 = receiver.recv(size)
            lats.append(t1 - t0)
            ctrl.send("a")
        if back is not None:  # the ping-pong (always polling, whatever --tw-recv says)
            back.prepare(size)
            busy, receiver.busy = receiver.busy, True
            ctrl.send("pp")
            for _ in range(n_lat + pingpong_warmup(n_lat)):
                receiver.recv(size)
                back.send(size)
            receiver.busy = busy
        for _ in range(n_warm):
            receiver.recv(size)
        ctrl.send("w")
        end = 0
        for _ in range(n_burst):
            _, end = receiver.recv(size)
        ctrl.send({"lats": lats, "end": end,
                   "transport": ",".join(f"{k}" for k in sorted(receiver.seen)) if receiver.seen else None,
                   "layout": receiver.layout})
    receiver.close()
    if back is not None:
        back.close()


def _child_main(args) -> int:
    ctrl = _Ctrl(args.ctrl_fd)
    try:
        (_producer if args.role == "producer" else _consumer)(args, ctrl)
    except BaseException as e:  # say why on both channels, never leave the other side waiting for nothing
        msg = f"{type(e).__name__}: {e}"
        try:
            ctrl.send({"error": f"{args.role}: {msg}"})
        except OSError:
            pass
        _emit({"error": msg})
        return 1
    return 0


# ---- the parent: namespaces, child processes, ucx_perftest ---------------------------------------------------------


_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:  # preexec_fn: a child (ip, then the program it execs) is killed when we die
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG, kept across exec


class _Proc:
    """A child process whose stdout lines and stderr tail are collected by two threads; every wait has a deadline."""

    def __init__(self, name, argv, env, pass_fds=()):
        self.name, self.argv = name, argv
        self.p = subprocess.Popen(argv, env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, pass_fds=pass_fds, text=True, errors="replace",
                                  preexec_fn=_die_with_parent)
        self.lines: queue.Queue = queue.Queue()
        self.out: list[str] = []
        self.err: collections.deque = collections.deque(maxlen=30)
        self.threads = [threading.Thread(target=self._read, args=(self.p.stdout, True), daemon=True),
                        threading.Thread(target=self._read, args=(self.p.stderr, False), daemon=True)]
        for t in self.threads:
            t.start()

    def _read(self, f, is_out):
        for line in f:
            if is_out:
                self.out.append(line)
                self.lines.put(line)
            else:
                self.err.append(line.rstrip("\n"))
        if is_out:
            self.lines.put(None)

    def line(self, deadline: float) -> str | None:
        """The next stdout line, None at its end; TimeoutError past the deadline."""
        try:
            return self.lines.get(timeout=max(deadline - time.monotonic(), 0))
        except queue.Empty:
            raise TimeoutError(f"{self.name}: no result in time") from None

    def wait(self, deadline: float) -> int:
        try:
            rc = self.p.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"{self.name} did not finish in time (killed)") from None
        for t in self.threads:
            t.join(5)
        return rc

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for t in self.threads:
            t.join(5)

    def tail(self, n: int = 6) -> str:
        return " | ".join(list(self.err)[-n:])


class Skip(Exception):
    """Raised when the two hosts cannot be made: the reason, for the user."""


class Net:
    """Two network namespaces joined by a veth pair; up() makes them, down() deletes them (and with them the veth)."""

    def __init__(self, mtu: int = 1500, ucx_tls: str = "tcp"):
        pid = os.getpid()
        self.ns = (f"tw-bench-{pid}-a", f"tw-bench-{pid}-b")
        self.veth = (f"twb{pid}a", f"twb{pid}b")  # an interface name is 15 characters at most
        octet = pid % 250 + 1
        self.ip = (f"10.77.{octet}.1", f"10.77.{octet}.2")
        self.mtu, self.ucx_tls = mtu, ucx_tls
        self.made: list[str] = []
        self._port = 17000
        self.token = secrets.token_hex(16)

    def _ip(self, *args) -> None:
        r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise Skip(f"`ip {' '.join(args)}` failed: {(r.stderr or r.stdout).strip()}")

    def up(self) -> None:
        if shutil.which("ip") is None:
            raise Skip("the `ip` command (iproute2) is not installed")
        if os.geteuid() != 0:
            raise Skip("making network namespaces needs root (ip netns add): run it as root")
        for ns in self.ns:
            self._ip("netns", "add", ns)
            self.made.append(ns)
        # Created inside the namespaces: the pair never exists in this one, and goes with them.
        self._ip("link", "add", self.veth[0], "netns", self.ns[0], "mtu", str(self.mtu), "type", "veth",
                 "peer", "name", self.veth[1], "netns", self.ns[1], "mtu", str(self.mtu))
        for ns, veth, ip in zip(self.ns, self.veth, self.ip):
            self._ip("-n", ns, "addr", "add", f"{ip}/24", "dev", veth)
            self._ip("-n", ns, "link", "set", "lo", "up")
            self._ip("-n", ns, "link", "set", veth, "up")
        # A veth has no carrier for a moment after both ends are up; UCX lists only running interfaces, so a
        # process started in that moment finds no device ("network device ... is not available").
        deadline = time.monotonic() + 10
        for ns, veth in zip(self.ns, self.veth):
            while True:
                r = subprocess.run(["ip", "-n", ns, "-o", "link", "show", "dev", veth], capture_output=True,
                                   text=True, timeout=30)
                if "state UP" in r.stdout and "NO-CARRIER" not in r.stdout:
                    break
                if time.monotonic() > deadline:
                    raise Skip(f"the veth {veth} in {ns} has no carrier after 10 s: {r.stdout.strip()}")
                time.sleep(0.02)

    def down(self) -> list[str]:
        """Deletes what up() made; returns the errors (a namespace a process still holds is gone from the list
        anyway and vanishes when that process exits)."""
        errors = []
        for ns in reversed(self.made):
            r = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                errors.append(f"ip netns del {ns}: {r.stderr.strip()}")
        self.made.clear()
        return errors

    def port(self) -> int:
        self._port += 1
        return self._port

    def env(self, side: int) -> dict:
        import tensorwire

        env = dict(os.environ)
        pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(tensorwire.__file__)))
        paths = [pkg_parent] + [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env.update(PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)), UCX_TLS=self.ucx_tls,
                   UCX_NET_DEVICES=self.veth[side], GLOO_SOCKET_IFNAME=self.veth[side], LC_ALL="C",
                   UCX_WARN_UNUSED_ENV_VARS="n", TW_BENCH_NET_TOKEN=self.token, TW_BENCH_NET_RUN=str(os.getpid()))
        lib = tw_ucx().get("library")
        if lib:  # (the C++ ping-pong program too: it would load the library path's UCX)
            env["TW_UCX_LIBRARY"] = lib
        return env

    def exec(self, side: int, *argv) -> list[str]:
        return ["ip", "netns", "exec", self.ns[side], *argv]


def _deadline_s(plan, method) -> float:
    """Generous: start-up (importing torch takes seconds) plus every message at 20 MB/s and 5 ms."""
    return 120 + sum((3 * n_lat + 2 * pingpong_warmup(n_lat) + n_warm + n_burst) * (size / 20e6 + 0.005)
                     for size, n_lat, n_warm, n_burst in plan)


def run_pair(net: Net, method: str, plan, tw_recv: str, log) -> tuple[list[dict], str | None]:
    """One pair method: the sending side in namespace A, the receiving side in B. Returns (rows, error)."""
    a_ctrl, b_ctrl = socket.socketpair()
    addr, addr2 = f"{net.ip[0]}:{net.port()}", f"{net.ip[1]}:{net.port()}"
    common = ["--method", method, "--addr", addr, "--addr2", addr2, "--plan", json.dumps(plan), "--tw-recv", tw_recv]
    mod = [sys.executable, "-m", "tensorwire._bench_net"]
    prod = _Proc(f"{method} sending side",
                 net.exec(0, *mod, "--role", "producer", "--ctrl-fd", str(a_ctrl.fileno()), *common),
                 net.env(0), pass_fds=(a_ctrl.fileno(),))
    cons = _Proc(f"{method} receiving side",
                 net.exec(1, *mod, "--role", "consumer", "--ctrl-fd", str(b_ctrl.fileno()), *common),
                 net.env(1), pass_fds=(b_ctrl.fileno(),))
    a_ctrl.close()  # the children hold the only ends: one side exiting ends the other's waits
    b_ctrl.close()
    deadline = time.monotonic() + _deadline_s(plan, method)
    rows, error = [], None
    try:
        while True:
            line = prod.line(deadline)
            if line is None:
                break
            if not line.startswith(LINE_TAG):
                continue
            msg = json.loads(line[len(LINE_TAG):])
            if "row" in msg:
                rows.append(msg["row"])
                log(msg["row"])
            elif "error" in msg:
                error = msg["error"]
            elif msg.get("done"):
                break
        rc_p = prod.wait(deadline)
        rc_c = cons.wait(deadline)
        if error is not None and rc_c != 0 and cons.tail(2):
            error += f" (receiving side: {cons.tail(2)})"
        if error is None and rc_p != 0:
            error = f"sending side exited with status {rc_p}: {prod.tail()}"
        if error is None and rc_c != 0:
            error = f"receiving side exited with status {rc_c}: {cons.tail()}"
    except TimeoutError as e:
        error = f"{e}; sending side: {prod.tail(3) or '-'}; receiving side: {cons.tail(3) or '-'}"
    finally:
        prod.kill()
        cons.kill()
    return rows, error


# ucx_perftest prints a table whose last line is the result: "Final:" (or nothing, with -f) then 8 numbers.
PERFTEST_FIELDS = ("iterations", "lat_typical_us", "lat_avg_us", "lat_overall_us", "bw_avg_MiBps",
                   "bw_overall_MiBps", "msgrate_avg", "msgrate_overall")
# A column may read inf or nan (ucx_perftest's "average" over a last report interval with no iteration in it).
_NUMBER = re.compile(r"^[-+]?((\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?|inf|nan)$", re.IGNORECASE)


def parse_perftest(text: str) -> dict:
    """The summary of ucx_perftest's output (plain, -f or 'Final:' form): its 8 columns by name, and `percentile`
    (the rank of the first latency column, from its header: "50.0%ile"; None when the header says "typical").
    Latency columns are microseconds (half a round trip in ping-pong tests); bandwidth "MB/s" are 2^20 bytes per
    second. Raises ValueError when no result line is found."""
    found = None
    for line in text.splitlines():
        toks = line.replace("|", " ").split()
        if toks[:1] == ["Final:"]:
            toks = toks[1:]
        if len(toks) == len(PERFTEST_FIELDS) and all(_NUMBER.match(t) for t in toks):
            found = toks
    if found is None:
        raise ValueError(f"no result line in ucx_perftest's output: {text.strip()[-400:]!r}")
    d = {k: (v if math.isfinite(v) else None) for k, v in zip(PERFTEST_FIELDS, map(float, found))}  # JSON-safe
    if d["bw_overall_MiBps"] is None or d["lat_typical_us"] is None:
        raise ValueError(f"ucx_perftest's result has no usable figure: {' '.join(found)}")
    m = re.search(r"(\d+(?:\.\d+)?)%ile", text)
    d["percentile"] = float(m.group(1)) if m else None
    d["bytes_per_s"] = d["bw_overall_MiBps"] * MiB
    return d


def tw_ucx() -> dict:
    """The UCX tensorwire loads in this process: {"library", "version", "why"} (tensorwire._ext._ucx_info())."""
    import tensorwire

    return tensorwire._ext._ucx_info()


def perftest_program() -> tuple[str | None, str | None]:
    """(ucx_perftest of the UCX tensorwire loads, the library directory it must be run with or None): the wheel's
    bin/ucx_perftest beside its lib/ (it finds its libraries on the library path), else the one on PATH when
    tensorwire loads the system's UCX."""
    lib = tw_ucx().get("library")
    if lib:
        libdir = os.path.dirname(os.path.realpath(lib))
        cand = os.path.join(os.path.dirname(libdir), "bin", "ucx_perftest")
        if os.access(cand, os.X_OK):
            return cand, libdir
    return shutil.which(PERFTEST), None


def _perftest_env(net: Net, side: int) -> dict:
    env = net.env(side)
    libdir = perftest_program()[1]
    if libdir:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([libdir] + [p for p in env.get("LD_LIBRARY_PATH", "").split(
            os.pathsep) if p])
    return env


def _perftest_once(net: Net, test: str, size: int, n: int, warm: int, extra=()) -> dict:
    deadline = time.monotonic() + 60 + n * (size / 20e6 + 0.002) * (2 if "lat" in test else 1)
    tries = 0
    while True:
        port = net.port()
        prog = perftest_program()[0]
        server = _Proc("ucx_perftest server", net.exec(0, prog, "-p", str(port)), _perftest_env(net, 0))
        try:
            time.sleep(0.2)  # the server has no readiness signal we can rely on (stdout is block-buffered)
            client = _Proc(f"ucx_perftest {test} client",
                           net.exec(1, prog, net.ip[0], "-p", str(port), "-t", test, "-s", str(size),
                                    "-n", str(n), "-w", str(warm), "-f", *extra), _perftest_env(net, 1))
            rc = client.wait(deadline)
            out = "".join(client.out)
            if rc == 0:
                try:  # the server ends with the test; the result is the client's, a lingering server is killed
                    server.wait(min(deadline, time.monotonic() + 10))
                except TimeoutError:
                    pass
                d = parse_perftest(out)
                d["iterations_asked"] = n
                return d
            tries += 1
            why = (out + " ".join(client.err)).strip()
            if "refused" in why.lower() and tries < 10 and time.monotonic() < deadline:
                continue
            raise RuntimeError(f"ucx_perftest {test} -s {size} exited with status {rc}: {why[-400:]}")
        finally:
            server.kill()


def run_perftest(net: Net, sizes, quick, log) -> tuple[list[dict], str | None]:
    rows, errors = [], []
    budget = (64 if quick else 512) * MiB
    for s in sizes:
        try:
            n_lat = int(min(3000 if quick else 20000, max(20, budget // s)))
            n_bw = int(min(20000 if quick else 100000, max(20, _burst_bytes(quick) // s)))
            p50 = _perftest_once(net, "ucp_am_lat", s, n_lat, max(5, n_lat // 10), ("-R", "50"))
            p99 = _perftest_once(net, "ucp_am_lat", s, n_lat, max(5, n_lat // 10), ("-R", "99"))
            bw = _perftest_once(net, "ucp_am_bw", s, n_bw, max(5, n_bw // 10))
            # The columns mean what we read: bandwidth = message rate x size (the rate is printed rounded to 1/s).
            rate, got = bw["msgrate_overall"], bw["bytes_per_s"]
            if rate is not None and abs(got - rate * s) > 0.02 * got + 0.5 * s + 0.01 * MiB:
                raise RuntimeError(f"ucx_perftest's columns do not read as expected: {bw}")
            row = {"method": PERFTEST, "bytes": s, "n": int(p50["iterations"]), "n_burst": int(bw["iterations"]),
                   "p50_us": p50["lat_typical_us"], "p99_us": p99["lat_typical_us"], "latency": "half round trip",
                   "zero_copy": False, "msgs_per_s": got / s, "throughput_GBps": got / 1e9,
                   "perftest": {"lat_p50": p50, "lat_p99": p99, "bw": bw}}
            rows.append(row)
            log(row)
        except (RuntimeError, ValueError, TimeoutError) as e:  # one size failing must not lose the others
            errors.append(f"{fmt_size(s)}: {e}")
    return rows, "; ".join(errors) or None


def merge_perftest(first, last) -> tuple[list[dict], list[str]]:
    """ucx_perftest's rows from the start and the end of the run, as one row per size holding the better figure of
    each (the engine's limit on this machine), and a warning wherever the two differ by more than 25%."""
    by_first, by_last = {r["bytes"]: r for r in first}, {r["bytes"]: r for r in last}
    rows, warnings = [], []
    for size in sorted(by_first.keys() | by_last.keys()):
        a, b = by_first.get(size), by_last.get(size)
        if a is None or b is None:  # measured once only (the other run failed at this size)
            rows.append(a if a is not None else by_last[size])
            continue
        m = dict(a, runs=2, perftest={"first": a["perftest"], "last": b["perftest"]})
        m["p50_us"], m["p99_us"] = min(a["p50_us"], b["p50_us"]), min(a["p99_us"], b["p99_us"])
        best = max(a, b, key=lambda r: r["throughput_GBps"])
        m["throughput_GBps"], m["msgs_per_s"] = best["throughput_GBps"], best["msgs_per_s"]
        for key, fmt in (("throughput_GBps", fmt_throughput), ("p50_us", lambda r: fmt_unit(r["p50_us"], TIME_UNITS))):
            if max(a[key], b[key]) > 1.25 * min(a[key], b[key]):
                what = "throughput" if key == "throughput_GBps" else "latency p50"
                warnings.append(f"  ucx_perftest {fmt_size(a['bytes'])} {what}: {fmt(a)} at the start, {fmt(b)} at "
                                f"the end")
        rows.append(m)
    return rows, warnings


# ---- output --------------------------------------------------------------------------------------------------------

LATENCY_TITLE = ("latency p50 / p99, one message in flight (one-way from a stamp in the payload, the sender woken "
                 "from a wait before each; ucx_perftest: half a ping-pong round trip)")
PINGPONG_TITLE = ("latency p50 / p99, ping-pong: half a round trip, both sides polling (ucx_perftest's own definition; "
                  "tensorwire's way back is the same method from a publisher in B)")
THROUGHPUT_TITLE = "burst throughput: payload bytes delivered per second"


def one_way(row) -> bool:  # rows with a one-way latency and a throughput (all but the C++ ping-pong's)
    return row["method"] != CPP_PINGPONG


def has_pingpong(row) -> bool:
    return row["method"] == PERFTEST or "pp_p50_us" in row


def fmt_pingpong(row, units=TIME_UNITS) -> str:
    if row["method"] == PERFTEST:
        return fmt_latency(row, units)
    return f"{fmt_unit(row['pp_p50_us'], units)} / {fmt_unit(row['pp_p99_us'], units)}"


def fmt_latency(row, units=TIME_UNITS) -> str:
    return f"{fmt_unit(row['p50_us'], units)} / {fmt_unit(row['p99_us'], units)}"


def fmt_throughput(row) -> str:
    return fmt_unit(row["throughput_GBps"] * 1e9, BYTE_RATE_UNITS)


def _grid(rows, cell, keep=lambda r: True):
    rows = [r for r in rows if keep(r)]
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    by = {(r["method"], r["bytes"]): r for r in rows}
    head = ["size"] + methods
    body = [[fmt_size(s)] + [cell(by[m, s]) if (m, s) in by else "-" for m in methods]
            for s in sorted({r["bytes"] for r in rows})]
    return head, body


def transports(rows) -> list[str]:
    """One line per tensorwire method: how its messages crossed (t.transport) and, when strided, in what layout."""
    out = []
    for m in TW_METHODS:
        rs = sorted((r for r in rows if r["method"] == m), key=lambda r: r["bytes"])
        if rs:
            out.append(f"  {m}: " + ", ".join(f"{fmt_size(r['bytes'])} {r.get('transport', '?')}" +
                                              (f" ({r['layout']})" if m in STRIDED and r.get("layout") else "")
                                              for r in rs))
    return out


def judge(rows) -> list[dict]:
    """The targets of issue 12, each compared where both of its rows were measured."""
    by = {(r["method"], r["bytes"]): r for r in rows}
    out = []

    def add(target, method, size, ratio, goal, hit):
        out.append({"target": target, "method": method, "bytes": size, "ratio": ratio, "goal": goal, "hit": hit})

    ref = by.get((PERFTEST, 16 * MiB))
    for methods, goal, what in ((("tw-send", "tw-loan"), 0.9, "16 MiB contiguous"),
                                (STRIDED, 0.8, "16 MiB every-other-column view")):
        for m in methods:
            r = by.get((m, 16 * MiB))
            if r and ref:
                ratio = r["throughput_GBps"] / ref["throughput_GBps"]
                add(f"{what}: throughput >= {goal}x ucx_perftest's", m, 16 * MiB, ratio, f">= {goal}x", ratio >= goal)
    ref = by.get((PERFTEST, 4 * KiB))
    for m in ("tw-send", "tw-loan", CPP_PINGPONG):
        r = by.get((m, 4 * KiB))
        if r and ref and "pp_p50_us" in r:  # measured as ucx_perftest measures: half a ping-pong round trip
            ratio = r["pp_p50_us"] / ref["p50_us"]
            add("4 KiB latency p50 <= 1.5x ucx_perftest's (both half a ping-pong round trip)", m, 4 * KiB, ratio,
                "<= 1.5x", ratio <= 1.5)
    for what, ratio_of in (("throughput >= 2x torch.distributed's (gloo)",
                            lambda r, g: r["throughput_GBps"] / g["throughput_GBps"]),
                           ("latency p50 <= 1/2 torch.distributed's (gloo); shown: gloo's / tensorwire's",
                            lambda r, g: g["p50_us"] / r["p50_us"])):
        for m in TW_METHODS:
            for s in sorted({r["bytes"] for r in rows if r["bytes"] >= MiB}):
                r, g = by.get((m, s)), by.get(("torch-gloo", s))
                if r and g:
                    ratio = ratio_of(r, g)
                    add(f"every size >= 1 MiB: {what}", m, s, ratio, ">= 2x", ratio >= 2)
    return out


def fmt_targets(judged) -> list[str]:
    out, last = [], None
    for t in judged:
        if t["target"] != last:
            out.append(f"  {t['target']}:")
            last = t["target"]
        out.append(f"    {t['method']:>16} {fmt_size(t['bytes']):>8}: {t['ratio']:6.2f}x  "
                   f"{'hit' if t['hit'] else 'MISSED'}")
    return out


def table(rows) -> str:
    if not rows:
        return "nothing was measured"
    out = []
    for title, cell, keep in ((LATENCY_TITLE, fmt_latency, one_way),
                              (PINGPONG_TITLE, fmt_pingpong, has_pingpong),
                              (THROUGHPUT_TITLE, fmt_throughput, one_way)):
        if not any(keep(r) for r in rows):
            continue
        head, body = _grid(rows, cell, keep)
        widths = [max(len(line[i]) for line in [head] + body) for i in range(len(head))]
        lines = [" | ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [head] + body]
        out += [title, "", lines[0], "-" * len(lines[0])] + lines[1:] + [""]
    tr = transports(rows)
    if tr:
        out += ["how tensorwire's messages arrived (t.transport):"] + tr + [""]
    judged = judge(rows)
    if judged:
        out += ["targets (issue 12):"] + fmt_targets(judged)
    return "\n".join(out).rstrip("\n")


def markdown(rows) -> str:
    if not rows:
        return "nothing was measured"
    out = []
    for title, cell, keep in ((LATENCY_TITLE, lambda r: fmt_latency(r, TIME_UNITS_MICRO), one_way),
                              (PINGPONG_TITLE, lambda r: fmt_pingpong(r, TIME_UNITS_MICRO), has_pingpong),
                              (THROUGHPUT_TITLE, fmt_throughput, one_way)):
        if not any(keep(r) for r in rows):
            continue
        head, body = _grid(rows, cell, keep)
        out += [f"{title}:", "", "| " + " | ".join(head) + " |", "|---:|" + "---:|" * (len(head) - 1)]
        out += ["| " + " | ".join(line) + " |" for line in body] + [""]
    return "\n".join(out).rstrip("\n")


# ---- main ----------------------------------------------------------------------------------------------------------


def _tw_missing() -> str | None:
    try:
        import tensorwire as tw
    except ImportError as e:
        return f"tensorwire does not import: {e}"
    doc = (tw.Publisher.__doc__ or "") + (getattr(tw.Publisher.__init__, "__doc__", None) or "")
    if "listen" not in doc:
        return ("this tensorwire has no network transport (tw.Publisher takes no listen=): build it with UCX "
                "(libucx-dev)")
    return None


def _unavailable(method) -> str | None:
    if method == PERFTEST:
        return None if perftest_program()[0] else "ucx_perftest is not installed (Debian: apt install ucx-utils)"
    if method == "torch-gloo":
        try:
            import torch.distributed as dist
        except ImportError as e:
            return f"torch is not installed ({e})"
        return None if dist.is_available() and dist.is_gloo_available() else "this torch has no gloo backend"
    if method in TW_METHODS:
        return _tw_missing()
    if method == CPP_PINGPONG:
        return None if pingpong_program() else ("no tw_net_pingpong program: build tensorwire (make build), or name "
                                                "it in TW_NET_PINGPONG")
    return None


def pingpong_program() -> str | None:
    """tw_net_pingpong: TW_NET_PINGPONG, or the build's, beside the library the imported tensorwire package loads
    (build/release/pkg/tensorwire -> build/release/tw_net_pingpong)."""
    named = os.environ.get("TW_NET_PINGPONG")
    if named:
        return named if os.access(named, os.X_OK) else None
    try:
        import tensorwire
    except ImportError:
        return None
    pkg = os.path.dirname(os.path.abspath(tensorwire.__file__))
    for cand in (os.path.join(pkg, "..", "..", "tw_net_pingpong"), os.path.join(pkg, "tw_net_pingpong")):
        if os.access(cand, os.X_OK):
            return os.path.normpath(cand)
    return None


def run_cpp_pingpong(net: Net, plan, log) -> tuple[list[dict], str | None]:
    """tw-cpp-loan: tw_net_pingpong's side A in namespace A, side B in B, every size in one pair of processes."""
    prog = pingpong_program()
    a_addr, b_addr = f"{net.ip[0]}:{net.port()}", f"{net.ip[1]}:{net.port()}"
    iters = max(n_lat for _, n_lat, _, _ in plan)
    common = ["--topic", _topic_for_run(CPP_PINGPONG), "--sizes", ",".join(str(p[0]) for p in plan),
              "--iters", str(max(iters, 200))]
    b = _Proc("tw_net_pingpong side B", net.exec(1, prog, "--side", "b", "--listen", b_addr, "--connect", a_addr,
                                                 *common), net.env(1))
    a = _Proc("tw_net_pingpong side A", net.exec(0, prog, "--side", "a", "--listen", a_addr, "--connect", b_addr,
                                                 *common), net.env(0))
    deadline = time.monotonic() + 120 + sum(2 * max(iters, 200) * (s / 20e6 + 0.001) for s, *_ in plan)
    rows, error = [], None
    try:
        rc_a = a.wait(deadline)
        rc_b = b.wait(deadline)
        for line in a.out:
            line = line.strip()
            if line.startswith("{"):
                d = json.loads(line)
                row = {"method": CPP_PINGPONG, "bytes": d["bytes"], "n": d["n"], "latency": "half round trip",
                       "p50_us": d["p50_us"], "p99_us": d["p99_us"], "pp_p50_us": d["p50_us"],
                       "pp_p99_us": d["p99_us"], "pp_n": d["n"], "transport": "ucx"}
                rows.append(row)
                log(row)
        if rc_a != 0 or rc_b != 0:
            error = f"tw_net_pingpong exited with {rc_a} (A) / {rc_b} (B): {a.tail(2) or '-'}; {b.tail(2) or '-'}"
    except TimeoutError as e:
        error = f"{e}; side A: {a.tail(3) or '-'}; side B: {b.tail(3) or '-'}"
    finally:
        a.kill()
        b.kill()
    return rows, error


def _versions() -> dict:
    v = {}
    try:
        import tensorwire

        v["tensorwire"] = tensorwire.__version__
    except ImportError:
        pass
    try:
        import torch

        v["torch"] = torch.__version__
    except ImportError:
        pass
    try:
        u = tw_ucx()
        if u.get("version"):
            v["ucx"] = f"{u['version']} ({u['library']})"
    except ImportError:
        pass
    return v


def _log_row(r) -> None:
    extra = f"  [{r['transport']}" + (f", {r['layout']}" if r.get("layout") else "") + "]" if r.get("transport") else ""
    if r["method"] == CPP_PINGPONG:
        print(f"  {r['method']:>16} {fmt_size(r['bytes']):>8}: ping-pong p50 {r['pp_p50_us']:8.1f} us  "
              f"p99 {r['pp_p99_us']:8.1f} us", flush=True)
        return
    pp = f"  ping-pong p50 {r['pp_p50_us']:8.1f} us" if "pp_p50_us" in r else ""
    print(f"  {r['method']:>16} {fmt_size(r['bytes']):>8}: p50 {r['p50_us']:10.1f} us  p99 {r['p99_us']:10.1f} us"
          f"{pp}  {fmt_throughput(r):>11}{extra}", flush=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--role" in argv:  # one side of a pair method, started by the parent in a namespace
        c = argparse.ArgumentParser(prog="tensorwire._bench_net")
        c.add_argument("--role", choices=("producer", "consumer"), required=True)
        for flag in ("--method", "--addr", "--addr2", "--plan"):
            c.add_argument(flag, required=True)
        c.add_argument("--ctrl-fd", type=int, required=True)
        c.add_argument("--tw-recv", choices=("busy", "block"), default="busy")
        return _child_main(c.parse_args(argv))
    p = argparse.ArgumentParser(prog="tensorwire bench --net", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="5 sizes, fewer messages (the default)")
    p.add_argument("--full", action="store_true", help="every power of 4 from 64 B to 256 MiB, more messages")
    p.add_argument("--sizes", help="comma-separated payload sizes, e.g. 64,4K,1M,256M")
    p.add_argument("--methods", help="comma-separated subset of: " + ",".join(METHODS))
    p.add_argument("--json", metavar="FILE", help="write every measurement (and the targets, judged) as JSON")
    p.add_argument("--markdown", action="store_true", help="also print the tables as Markdown")
    p.add_argument("--from-json", metavar="FILE", help="print a previous run's JSON instead of measuring")
    p.add_argument("--mtu", type=int, default=1500, help="the veth's MTU (1500)")
    p.add_argument("--ucx-tls", default="tcp", help="UCX_TLS for every UCX process (tcp: see above)")
    p.add_argument("--tw-recv", choices=("busy", "block"), default="busy",
                   help="tensorwire's receiver polls recv(timeout=0) (busy, the default) or waits in recv")
    args = p.parse_args(argv)
    if args.quick and args.full:
        p.error("--quick and --full exclude each other")
    sizes = parse_sizes(p, args.sizes) or (ALL_SIZES if args.full else QUICK_SIZES)
    if min(sizes) < 64:
        p.error("sizes must be at least 64 bytes (the timestamp takes 8)")
    methods = args.methods.split(",") if args.methods else METHODS
    for m in methods:
        if m not in METHODS:
            p.error(f"unknown method {m!r}; choose from {', '.join(METHODS)}")
    check_writable(p, "--json", args.json)
    if args.from_json:
        data = load_results(p, args.from_json, "net")
        print(f"tensorwire bench --net: {args.from_json}, measured on {data.get('platform', '?')}, "
              f"{data.get('cpus', '?')} CPUs, {data.get('versions', {})}")
        print()
        print(table(data["rows"]))
        if args.markdown:
            print()
            print(markdown(data["rows"]))
        for m, why in data.get("skipped", {}).items():
            print(f"{m}: {why}")
        return 0
    if not args.full and not args.sizes:
        print("tensorwire bench --net: quick mode (5 sizes); `tensorwire bench --net --full` measures every size",
              flush=True)
    net = Net(args.mtu, args.ucx_tls)
    rows: list[dict] = []
    skipped: dict[str, str] = {}
    first_perftest: list[dict] = []
    warnings: list[str] = []
    old_term = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(143)))
    try:
        try:
            net.up()
        except (Skip, OSError, subprocess.TimeoutExpired) as e:
            print(f"tensorwire bench --net: skipped: cannot make two hosts from network namespaces: {e}",
                  file=sys.stderr)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"kind": "net", "skipped_all": str(e), "rows": [], "skipped": {}}, f, indent=1)
            return 0
        print(f"tensorwire bench --net: {plural(len(methods), 'method')} x {plural(len(sizes), 'size')} between namespaces {net.ns[0]} "
              f"({net.ip[0]}) and {net.ns[1]} ({net.ip[1]}), veth MTU {net.mtu}, UCX_TLS={net.ucx_tls}; "
              f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}", flush=True)
        u = tw_ucx()
        print(f"UCX {u.get('version') or '-'} ({u.get('library') or u.get('why')}); ucx_perftest: "
              f"{perftest_program()[0] or 'none'}", flush=True)
        plan = plan_for(sizes, not args.full)
        for m in methods:
            why = _unavailable(m)
            if why:
                skipped[m] = why
                print(f"  {m}: skipped ({why})", flush=True)
                continue
            if m in STRIDED:
                bad = [s for s in sizes if s % 8]
                if bad:
                    skipped[m] = f"sizes not a multiple of 8 bytes: {bad}"
                    continue
            if m == PERFTEST:
                got, error = run_perftest(net, sizes, not args.full, _log_row)
                first_perftest = got
            elif m == CPP_PINGPONG:
                got, error = run_cpp_pingpong(net, plan, _log_row)
                rows += got
            else:
                got, error = run_pair(net, m, plan, args.tw_recv, _log_row)
                rows += got
            if error:
                skipped[m] = f"failed: {error}" + (f" (after {len(got)} of {len(sizes)} sizes)" if got else "")
                print(f"  {m}: failed ({error})", flush=True)
        if first_perftest and len(methods) > 1:
            # Once more at the end: a machine whose speed changed during the run (another job) shows up here
            # instead of silently skewing every ratio; the reference is the better of the two runs.
            print("  ucx_perftest again, after the other methods:", flush=True)
            last, error = run_perftest(net, sizes, not args.full, _log_row)
            if error:
                print(f"  {PERFTEST} (again): failed ({error})", flush=True)
            first_perftest, warnings = merge_perftest(first_perftest, last)
        rows = first_perftest + rows
    finally:
        errors = net.down()
        signal.signal(signal.SIGTERM, old_term)
        for err in errors:
            print(f"tensorwire bench --net: cleanup: {err}", file=sys.stderr)
    print()
    print(table(rows))
    if args.markdown:
        print()
        print(markdown(rows))
    for m, why in skipped.items():
        print(f"{m}: {why}")
    if warnings:
        print("\nthe machine's speed changed during the run (another job?), so ratios are less certain; the reference "
              "is the better of the two ucx_perftest runs:\n" + "\n".join(warnings))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kind": "net", "platform": platform.platform(), "cpus": os.cpu_count(),
                       "python": platform.python_version(), "versions": _versions(), "mtu": net.mtu, "ucx_tls": net.ucx_tls, "tw_recv": args.tw_recv,
                       "rows": rows, "skipped": skipped, "targets": judge(rows), "warnings": warnings}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
