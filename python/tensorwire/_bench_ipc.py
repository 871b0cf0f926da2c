"""`tensorwire bench`: one-way latency (p50/p99) and throughput of moving a tensor to another process, for
tensorwire and the usual alternatives, all measured in the same run on the same machine.

Methods (each a producer in this process and a consumer in a spawned process):
  tw-send        tw.Publisher.send(ndarray): one copy into a pooled shared-memory buffer
  tw-loan        tw.Publisher.loan() + send(): no copy at all
  mp-queue       multiprocessing.Queue of ndarrays (pickled through a pipe)
  shm-names      multiprocessing.shared_memory: a new segment per message, its name through a Queue
  torch-fresh    torch.multiprocessing Queue, a new CPU tensor per message (as a producer has)
  torch-resent   torch.multiprocessing Queue, the same shared tensor sent again and again
  iceoryx2       iceoryx2's Python package, when installed

Latency: the producer stamps time.perf_counter_ns() (CLOCK_MONOTONIC, one clock for all processes) into the first
8 bytes of the payload just before sending (before loan() for tw-loan); the consumer subtracts it from its own
clock as soon as it can read the payload. One message in flight at a time (the consumer acknowledges through a
pipe, outside the timed path). tensorwire's consumer is busy (polls recv(timeout=0)); the others block in get().
Throughput: after an untimed warm-up burst (pools reach their steady state), a burst of messages with no
acknowledgement. A method that copies the payload reports the payload bytes delivered per second (each of them
copied at least once): bytes / (last receive - first send). A zero-copy method (tw-loan, torch-resent, iceoryx2:
the consumer maps the producer's buffer and only the 8-byte stamp is written) does not move the payload, so bytes
per second would count bytes nobody copied; it reports messages per second instead, and its rows say zero_copy.

    tensorwire bench [--full] [--sizes 64,4K,1M] [--methods tw-send,mp-queue] [--json FILE] [--plot FILE.png]

With no arguments it runs the quick mode (6 sizes, about a minute); --full measures every size from 64 B to 256 MiB.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import time
import uuid

import numpy as np

KiB, MiB = 1 << 10, 1 << 20
ALL_SIZES = [64, 256, KiB, 4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB]
QUICK_SIZES = [64, 4 * KiB, 64 * KiB, MiB, 16 * MiB, 64 * MiB]
METHODS = ["tw-send", "tw-loan", "mp-queue", "shm-names", "torch-fresh", "torch-resent", "iceoryx2"]
# Methods whose consumer gets the producer's buffer itself: the payload is not moved (see the docstring above).
# Decided by what each method does, never by the numbers it measures.
ZERO_COPY = frozenset({"tw-loan", "torch-resent", "iceoryx2"})


def parse_size(s: str) -> int:
    """A byte count such as 64, 4K, 4KiB, 1.5M or 256MB; ValueError naming the text when it is not one."""
    t = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": KiB, "M": MiB, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if t[-1:] in "KMG" else t) * mult)
    except (ValueError, OverflowError):
        raise ValueError(f"{s!r} is not a size (bytes, optionally with K, M or G: 64, 4K, 1.5M, 256M)") from None


def parse_sizes(p: argparse.ArgumentParser, text: str | None, flag: str = "--sizes") -> list[int] | None:
    """A --sizes value as byte counts (None when not given); a usage error (exit 2) for anything else."""
    if text is None:
        return None
    try:
        return [parse_size(x) for x in text.split(",")]
    except ValueError as e:
        p.error(f"{flag}: {e}")
        raise  # (p.error exits)


def check_writable(p: argparse.ArgumentParser, flag: str, path: str | None) -> None:
    """Refuses an output path that cannot be written before anything is measured (a --full run takes a while)."""
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        p.error(f"{flag} {path}: there is no directory {folder}")
    if os.path.isdir(path) or not os.access(path if os.path.exists(path) else folder, os.W_OK):
        p.error(f"{flag} {path}: cannot write there")


def result_kind(data: dict) -> str:
    """'net' or 'ipc': which `tensorwire bench` wrote a results file (files before 'kind' existed: by their keys)."""
    if isinstance(data.get("kind"), str):
        return data["kind"]
    rows = data.get("rows") or []
    return "net" if "ucx_tls" in data or "skipped_all" in data or any("latency" in r for r in rows) else "ipc"


def load_results(p: argparse.ArgumentParser, path: str, kind: str) -> dict:
    """A previous run's JSON for --from-json: usage errors for a missing file, non-JSON, or another mode's file."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        p.error(f"--from-json {path}: {e.strerror or e}")
    except (ValueError, UnicodeDecodeError) as e:
        p.error(f"--from-json {path}: not JSON ({e})")
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or \
            not all(isinstance(r, dict) for r in data["rows"]):
        p.error(f"--from-json {path}: not a `tensorwire bench` result (no list of rows)")
    actual = result_kind(data)
    if actual != kind:
        other = {"net": "tensorwire bench --net", "ipc": "tensorwire bench"}.get(actual, f"a {actual!r} benchmark")
        p.error(f"--from-json {path}: this file is a `{other}` result; read it with `{other} --from-json {path}`")
    return data


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def fmt_size(n: int) -> str:
    """A byte count in binary units: 64 B, 4 KiB, 1 MiB, 256 MiB (1.5 KiB when not a whole multiple)."""
    for unit, k in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", KiB)):
        if n >= k:
            return f"{n // k} {unit}" if n % k == 0 else f"{n / k:.1f} {unit}"
    return f"{n} B"


# (suffix, scale) from the largest down; a value takes the first scale it reaches (the last when smaller than all).
TIME_UNITS = ((" s", 1e6), (" ms", 1e3), (" us", 1.0))  # of microseconds
BYTE_RATE_UNITS = ((" GB/s", 1e9), (" MB/s", 1e6), (" kB/s", 1e3), (" B/s", 1.0))  # of bytes per second (decimal)
MSG_RATE_UNITS = (("M msg/s", 1e6), ("k msg/s", 1e3), (" msg/s", 1.0))  # of messages per second


def fmt_unit(value: float, units, tick: bool = False) -> str:
    """value in the first of `units` it reaches, to 3 significant digits, or as short as possible for a tick label
    (fmt_unit(94152, TIME_UNITS) == "94.2 ms", fmt_unit(1000, TIME_UNITS, tick=True) == "1 ms")."""
    if not tick:  # pick the unit after rounding to 3 digits, so 999.7 us reads "1.00 ms", not "1000 us"
        value = float(f"{value:.3g}")
    suffix, k = next((u for u in units if abs(value) >= u[1]), units[-1])
    v = value / k
    if tick:
        return f"{v:g}{suffix}"
    return (f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 100 else f"{v:.0f}") + suffix


def now() -> int:
    return time.perf_counter_ns()


# ---- consumers (run in a spawned process) --------------------------------------------------------------------------


def _stamp_of(buf) -> int:
    return int(np.frombuffer(buf, dtype=np.int64, count=1)[0])


def _warmup(n_burst: int) -> int:
    return min(n_burst, 16)


def _consumer(method: str, name: str, plan: list, ctrl, ready) -> None:
    """plan: [(size, n_latency, n_burst)]. Reports [(latencies_ns, burst_end_ns)] per size through ctrl."""
    try:
        recv = _make_receiver(method, name, ready)
        for size, n_lat, n_burst in plan:
            lats = []
            for _ in range(n_lat):
                t0, t1 = recv()
                lats.append(t1 - t0)
                ctrl.send_bytes(b"a")
            for _ in range(_warmup(n_burst)):  # fills the pools to their steady state (not timed)
                recv()
            ctrl.send_bytes(b"w")
            end = 0
            for _ in range(n_burst):
                _, end = recv()
            ctrl.send(("size", lats, end))
    except BaseException as e:  # report, never hang the producer
        ctrl.send(("error", f"{type(e).__name__}: {e}", 0))


def _make_receiver(method, name, ready):
    if method in ("tw-send", "tw-loan"):
        import tensorwire as tw

        sub = tw.Subscriber(name)
        ready.set()

        def recv():
            while True:
                try:
                    t = sub.recv(timeout=0)  # busy subscriber
                    break
                except TimeoutError:
                    continue
            a = np.asarray(t)
            t1 = now()
            t0 = _stamp_of(a[:8])
            del a, t  # release the lease
            return t0, t1

        return recv
    if method in ("mp-queue", "shm-names"):
        q = name
        ready.set()
        if method == "mp-queue":

            def recv():
                a = q.get()
                t1 = now()
                return _stamp_of(a[:8]), t1

            return recv
        from multiprocessing import shared_memory

        def recv():
            seg = q.get()
            shm = shared_memory.SharedMemory(name=seg)
            a = np.ndarray((shm.size,), np.uint8, shm.buf)
            t1 = now()
            t0 = _stamp_of(a[:8])
            del a
            shm.close()
            shm.unlink()
            return t0, t1

        return recv
    if method.startswith("torch"):
        q = name
        ready.set()

        def recv():
            x = q.get()
            t1 = now()
            t0 = int(x[:8].view(__import__("torch").int64)[0])
            del x
            return t0, t1

        return recv
    if method == "iceoryx2":
        return _iceoryx2_receiver(name, ready)
    raise ValueError(method)


def _iox2_service(name):
    import ctypes

    import iceoryx2 as iox2

    node = iox2.NodeBuilder.new().create(iox2.ServiceType.Ipc)
    service = (node.service_builder(iox2.ServiceName.new("tw-bench-" + name.replace("/", "-")))
               .publish_subscribe(iox2.Slice[ctypes.c_uint8])
               .enable_safe_overflow(False).subscriber_max_buffer_size(8).history_size(0).open_or_create())
    return iox2, node, service


def _iceoryx2_receiver(name, ready):
    import ctypes

    iox2, node, service = _iox2_service(name)
    sub = service.subscriber_builder().buffer_size(8).create()
    ready.set()

    def recv():
        while True:
            s = sub.receive()
            if s is not None:
                break
        t1 = now()
        t0 = ctypes.c_int64.from_address(s.payload().data_ptr).value
        s.delete()
        return t0, t1

    recv.keep = (node, service, sub)
    return recv


# ---- producers -------------------------------------------------------------------------------------------------------


class _Producer:
    """send(size) stamps and sends one message of `size` bytes; close() ends the stream."""

    def __init__(self, method, name, max_size):
        self.method = method
        self.src = np.zeros(max(max_size, 64), np.uint8)
        self.src[8:] = 1
        if method in ("tw-send", "tw-loan"):
            import tensorwire as tw

            self.pub = tw.Publisher(name, depth=8)
        elif method == "torch-resent":
            import torch

            self.shared = {}
            self.torch = torch
        elif method == "torch-fresh":
            import torch

            self.torch = torch
        elif method == "iceoryx2":
            iox2, self.node, self.service = _iox2_service(name)
            self.pub = (self.service.publisher_builder().initial_max_slice_len(max(max_size, 64))
                        .allocation_strategy(iox2.AllocationStrategy.PowerOfTwo)
                        .backpressure_strategy(iox2.BackpressureStrategy.RetryUntilDelivered).create())
        self.q = name

    def send(self, size):
        m = self.method
        if m == "tw-send":
            a = self.src[:size]
            a[:8].view(np.int64)[0] = now()
            self.pub.send(a)
        elif m == "tw-loan":
            t0 = now()
            buf = self.pub.loan((size,), "uint8")
            memoryview(buf).cast("B")[:8] = t0.to_bytes(8, "little")
            self.pub.send(buf)
        elif m == "mp-queue":
            a = self.src[:size]
            a[:8].view(np.int64)[0] = now()
            self.q.put(a)
        elif m == "shm-names":
            from multiprocessing import shared_memory

            t0 = now()
            shm = shared_memory.SharedMemory(create=True, size=size)
            shm.buf[:size] = self.src[:size].data
            shm.buf[:8] = t0.to_bytes(8, "little")
            self.q.put(shm.name)
            shm.close()  # the consumer unlinks it (the resource tracker is shared with spawned children)
        elif m == "torch-fresh":
            x = self.torch.from_numpy(self.src[:size]).clone()  # the producer's new tensor (not timed)
            x[:8].view(self.torch.int64)[0] = now()
            self.q.put(x)
        elif m == "torch-resent":
            x = self.shared.get(size)
            if x is None:
                x = self.shared[size] = self.torch.from_numpy(self.src[:size]).clone().share_memory_()
            x[:8].view(self.torch.int64)[0] = now()
            self.q.put(x)
        elif m == "iceoryx2":
            import ctypes

            t0 = now()
            s = self.pub.loan_slice_uninit(size)  # uninitialised like tw-loan: only the stamp is written
            ctypes.c_int64.from_address(s.payload().data_ptr).value = t0
            s.assume_init().send()

    def close(self):
        if self.method in ("tw-send", "tw-loan"):
            self.pub.close()
        elif self.method == "iceoryx2":
            self.pub.delete()


def _available(method) -> str | None:
    try:
        if method.startswith("torch"):
            import torch  # noqa: F401
        if method == "iceoryx2":
            import iceoryx2  # noqa: F401
        if method.startswith("tw"):
            import tensorwire  # noqa: F401
    except ImportError as e:
        return str(e)
    return None


def run_method(method, sizes, quick, log) -> list[dict]:
    if method.startswith("torch"):
        import torch.multiprocessing as tmp

        ctx = tmp.get_context("spawn")
    else:
        ctx = mp.get_context("spawn")
    budget = (64 if quick else 512) * MiB  # bytes per latency series
    plan = []
    for s in sizes:
        n_lat = int(min(300 if quick else 2000, max(8 if quick else 12, budget // s)))
        n_burst = int(min(1000 if quick else 5000, max(4 if quick else 6, 4 * budget // s)))
        plan.append((s, n_lat, n_burst))
    name = f"bench/{os.getpid()}/{method}/{uuid.uuid4().hex[:6]}"
    q = ctx.Queue() if method in ("mp-queue", "shm-names", "torch-fresh", "torch-resent") else None
    ctrl_parent, ctrl_child = ctx.Pipe()
    ready = ctx.Event()
    proc = ctx.Process(target=_consumer, args=(method, q if q is not None else name, plan, ctrl_child, ready),
                       daemon=True)
    proc.start()
    rows = []
    try:
        if not ready.wait(60):
            raise RuntimeError("consumer did not start")
        prod = _Producer(method, q if q is not None else name, max(sizes))
        if method.startswith("tw"):
            deadline = time.monotonic() + 30
            while prod.pub.subscribers < 1 and time.monotonic() < deadline:
                time.sleep(0.001)
        for size, n_lat, n_burst in plan:
            for _ in range(n_lat):
                prod.send(size)
                while not ctrl_parent.poll(60):
                    if not proc.is_alive():
                        raise RuntimeError("consumer died")
                msg = ctrl_parent.recv_bytes()
                if msg != b"a":
                    raise RuntimeError(f"consumer: {msg!r}")
            for _ in range(_warmup(n_burst)):
                prod.send(size)
            if not ctrl_parent.poll(600) or ctrl_parent.recv_bytes() != b"w":
                raise RuntimeError("consumer did not finish the warm-up")
            t_start = now()
            for _ in range(n_burst):
                prod.send(size)
            if not ctrl_parent.poll(600):
                raise RuntimeError("consumer did not finish the burst")
            kind, lats, end = ctrl_parent.recv()
            if kind == "error":
                raise RuntimeError(lats)
            lats = np.sort(np.asarray(lats, dtype=np.float64)) / 1000.0
            msgs_per_s = n_burst / max(end - t_start, 1) * 1e9
            row = {
                "method": method, "bytes": size, "n": len(lats),
                "p50_us": float(np.percentile(lats, 50)), "p99_us": float(np.percentile(lats, 99)),
                "zero_copy": method in ZERO_COPY, "msgs_per_s": msgs_per_s,
            }
            if not row["zero_copy"]:  # payload bytes delivered per second, every one of them copied
                row["throughput_GBps"] = msgs_per_s * size / 1e9
            rows.append(row)
            log(row)
        prod.close()
    finally:
        if q is not None:
            q.close()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return rows


# ---- output --------------------------------------------------------------------------------------------------------

ZERO_COPY_NOTE = ("zero-copy: the consumer maps the producer's buffer and only the 8-byte stamp is written, so the "
                  "payload is not moved: messages/s, not GB/s")
TIME_UNITS_MICRO = ((" s", 1e6), (" ms", 1e3), (" µs", 1.0))  # TIME_UNITS for the plot and Markdown


def normalized(row: dict) -> dict:
    """A row as this version writes it, from this or an older version's JSON: `zero_copy` from the row, else from
    the method's definition; `msgs_per_s` present; `throughput_GBps` only where the payload was copied (an older
    version computed one for zero-copy methods too: it counted bytes nobody moved, so it is dropped)."""
    r = dict(row)
    r["zero_copy"] = bool(r.get("zero_copy", r["method"] in ZERO_COPY))
    if "msgs_per_s" not in r:
        r["msgs_per_s"] = r["throughput_GBps"] * 1e9 / r["bytes"]
    if r["zero_copy"]:
        r.pop("throughput_GBps", None)
    elif "throughput_GBps" not in r:
        r["throughput_GBps"] = r["msgs_per_s"] * r["bytes"] / 1e9
    return r


def fmt_throughput(row: dict) -> str:
    """Payload bytes copied per second ("1.31 GB/s", "348 kB/s"), or messages per second for a zero-copy row."""
    r = normalized(row)
    if r["zero_copy"]:
        return fmt_unit(r["msgs_per_s"], MSG_RATE_UNITS)
    return fmt_unit(r["throughput_GBps"] * 1e9, BYTE_RATE_UNITS)


def fmt_latency(row: dict, units=TIME_UNITS) -> str:
    return f"{fmt_unit(row['p50_us'], units)} / {fmt_unit(row['p99_us'], units)}"


def _grid(rows, cell):
    """A header and one line per size of size x method cells: cell(row), or "-" where nothing was measured."""
    rows = [normalized(r) for r in rows]
    zero = {r["method"] for r in rows if r["zero_copy"]}
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    by = {(r["method"], r["bytes"]): r for r in rows}
    head = ["size"] + [m + " (zero-copy)" if m in zero else m for m in methods]
    body = [[fmt_size(s)] + [cell(by[m, s]) if (m, s) in by else "-" for m in methods]
            for s in sorted({r["bytes"] for r in rows})]
    return head, body, bool(zero)


LATENCY_TITLE = "one-way latency p50 / p99 (one message in flight)"
THROUGHPUT_TITLE = "burst throughput: payload bytes copied per second, or messages per second for zero-copy methods"


def table(rows) -> str:
    out = []
    for title, cell in ((LATENCY_TITLE, fmt_latency), (THROUGHPUT_TITLE, fmt_throughput)):
        head, body, any_zero = _grid(rows, cell)
        widths = [max(len(line[i]) for line in [head] + body) for i in range(len(head))]
        lines = [" | ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [head] + body]
        out += [title, "", lines[0], "-" * len(lines[0])] + lines[1:] + [""]
    if any_zero:
        out.append(ZERO_COPY_NOTE)
    by = {(r["method"], r["bytes"]): r for r in rows}
    ratios = []
    for s in sorted({r["bytes"] for r in rows}):
        t = by.get(("torch-fresh", s)), by.get(("torch-resent", s)), by.get(("tw-loan", s)), by.get(("tw-send", s))
        if t[0] and t[2] and t[3]:
            ratios.append(f"{fmt_size(s):>9}: torch-fresh/tw-loan {t[0]['p50_us'] / t[2]['p50_us']:7.1f}x   "
                          f"torch-fresh/tw-send {t[0]['p50_us'] / t[3]['p50_us']:6.1f}x" +
                          (f"   torch-resent/tw-loan {t[1]['p50_us'] / t[2]['p50_us']:6.1f}x" if t[1] else ""))
    if ratios:
        out += ["", "p50 ratios (higher: tensorwire faster)"] + ratios
    return "\n".join(out).rstrip("\n")


def markdown(rows) -> str:
    """The two tables of table() as Markdown: latency p50 / p99, then throughput, one line per size."""
    out = []
    for title, cell in ((LATENCY_TITLE, lambda r: fmt_latency(r, TIME_UNITS_MICRO)),
                        (THROUGHPUT_TITLE, fmt_throughput)):
        head, body, any_zero = _grid(rows, cell)
        out += [f"{title}:", "", "| " + " | ".join(head) + " |", "|---:|" + "---:|" * (len(head) - 1)]
        out += ["| " + " | ".join(line) + " |" for line in body] + [""]
    if any_zero:
        out.append(ZERO_COPY_NOTE[0].upper() + ZERO_COPY_NOTE[1:] + ".")
    return "\n".join(out).rstrip("\n")


def label_sizes(ax, sizes) -> None:
    """Log2 x axis with ticks at the measured sizes only, labelled in binary units (64 B, 4 KiB, 1 MiB)."""
    from matplotlib.ticker import NullLocator

    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [fmt_size(s) for s in sizes])
    ax.xaxis.set_minor_locator(NullLocator())


def _label_values(ax, units) -> None:
    """The y axis of `ax` logarithmic, its ticks labelled with units ("10 µs", "1 ms"): every decade, and 2 and 5
    times each when the data span less than three decades (else a narrow plot would show one label or none)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    low, high = ax.get_ylim()
    if high < 1000 * low:
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_unit(v, units, tick=True)))
    ax.yaxis.set_minor_formatter(NullFormatter())


def plot(rows, path=None):
    """Latency p50 (solid) and p99 (dashed, same colour) of every method above; below, the throughput of the
    copying methods in bytes/s and the message rate of the zero-copy ones (their payload is not moved, so they
    have no bytes/s). Returns the matplotlib Figure, also written to `path` when one is given."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    rows = [normalized(r) for r in rows]
    sizes = sorted({r["bytes"] for r in rows})
    fig = Figure(figsize=(13, 9.5), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=(1.15, 1))
    lat, copied, rate = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    handles = []
    for i, m in enumerate(METHODS):
        rs = sorted((r for r in rows if r["method"] == m), key=lambda r: r["bytes"])
        if not rs:
            continue
        colour, zero = f"C{i}", rs[0]["zero_copy"]
        label = m + " (zero-copy)" if zero else m
        x = [r["bytes"] for r in rs]
        handles += lat.plot(x, [r["p50_us"] for r in rs], "-o", color=colour, markersize=4, label=label)
        lat.plot(x, [r["p99_us"] for r in rs], "--", color=colour, alpha=0.55, linewidth=1.2)
        if zero:
            rate.plot(x, [r["msgs_per_s"] for r in rs], "-o", color=colour, markersize=4, label=label)
        else:
            copied.plot(x, [r["throughput_GBps"] * 1e9 for r in rs], "-o", color=colour, markersize=4, label=label)
    handles += [Line2D([], [], color="grey", linestyle="-", label="p50"),
                Line2D([], [], color="grey", linestyle="--", alpha=0.55, label="p99")]
    lat.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    panels = ((lat, "one-way latency: p50 solid, p99 dashed (one message in flight)", TIME_UNITS_MICRO),
              (copied, "copying methods: payload bytes delivered per second", BYTE_RATE_UNITS),
              (rate, "zero-copy methods: messages per second\n(the payload is not moved, so no bytes/s)",
               MSG_RATE_UNITS))
    for ax, title, units in panels:
        _label_values(ax, units)
        label_sizes(ax, sizes)
        ax.set_xlabel("payload size")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        if not ax.lines:
            ax.text(0.5, 0.5, "no such method measured", ha="center", va="center", transform=ax.transAxes)
        elif ax is not lat:
            ax.legend(fontsize=8)
    for ax in (copied, rate):
        ax.tick_params(axis="x", labelrotation=45)
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--device" in argv:  # the CUDA paths against PyTorch's: tensorwire._bench_cuda
        k = argv.index("--device")
        if argv[k + 1 : k + 2] != ["cuda"]:
            print("tensorwire bench: --device takes 'cuda'", file=sys.stderr)
            return 2
        from ._bench_cuda import main as cuda_main

        return cuda_main(argv[:k] + argv[k + 2 :])
    if "--net" in argv:  # between two network namespaces, over UCX: tensorwire._bench_net
        from tensorwire._bench_net import main as net_main

        return net_main([a for a in argv if a != "--net"])
    p = argparse.ArgumentParser(prog="tensorwire bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    # (--device and --net are taken before this parser: named here so that --help shows them)
    p.add_argument("--device", choices=["cuda"], help="CUDA paths vs PyTorch's instead (tensorwire bench --device "
                   "cuda --help: its own options, results with --out/--json FILE)")
    p.add_argument("--net", action="store_true", help="across two network namespaces over UCX instead "
                   "(tensorwire bench --net --help)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and messages, about a minute (the default)")
    p.add_argument("--full", action="store_true", help="every size from 64 B to 256 MiB, more messages")
    p.add_argument("--sizes", help="comma-separated payload sizes, e.g. 64,4K,1M,256M")
    p.add_argument("--methods", help="comma-separated subset of: " + ",".join(METHODS))
    p.add_argument("--json", metavar="FILE", help="write every measurement as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="latency p50/p99 and throughput (messages/s for zero-copy methods) vs size (matplotlib)")
    p.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    p.add_argument("--from-json", metavar="FILE", help="print (and plot) a previous run's JSON instead of measuring")
    args = p.parse_args(argv)
    if args.quick and args.full:
        p.error("--quick and --full exclude each other")
    args.quick = not args.full  # quick unless --full: a first run should not take many minutes
    sizes = parse_sizes(p, args.sizes) or (ALL_SIZES if args.full else QUICK_SIZES)
    if min(sizes) < 64:
        p.error("sizes must be at least 64 bytes (the timestamp takes 8)")
    methods = args.methods.split(",") if args.methods else METHODS
    for m in methods:
        if m not in METHODS:
            p.error(f"unknown method {m!r}; choose from {', '.join(METHODS)}")
    check_writable(p, "--json", args.json)
    check_writable(p, "--plot", args.plot)
    if not args.full and not args.sizes and not args.from_json:
        print("tensorwire bench: quick mode (6 sizes); `tensorwire bench --full` measures every size", flush=True)
    rows, skipped = [], {}
    if args.from_json:
        data = load_results(p, args.from_json, "ipc")
        try:
            rows = [normalized(r) for r in data["rows"]]
        except (KeyError, TypeError, ValueError) as e:
            p.error(f"--from-json {args.from_json}: a row lacks {e} (not a `tensorwire bench` result?)")
        skipped, methods = data.get("skipped", {}), []
        print(f"tensorwire bench: {args.from_json}, measured on {data.get('platform', '?')}, {data.get('cpus', '?')} "
              f"CPUs, Python {data.get('python', '?')}", flush=True)
    else:
        print(f"tensorwire bench: {plural(len(methods), 'method')} x {plural(len(sizes), 'size')}; {platform.platform()}, "
              f"{os.cpu_count()} CPUs, Python {platform.python_version()}", flush=True)
    for m in methods:
        why = _available(m)
        if why:
            skipped[m] = why
            print(f"  {m}: skipped ({why})", flush=True)
            continue
        try:
            rows += run_method(m, sizes, args.quick, lambda r: print(
                f"  {r['method']:>13} {fmt_size(r['bytes']):>8}: p50 {r['p50_us']:9.1f} us  p99 {r['p99_us']:9.1f} us"
                f"  {fmt_throughput(r):>12}", flush=True))
        except Exception as e:  # one method failing must not lose the others
            skipped[m] = f"failed: {e}"
            print(f"  {m}: failed ({e})", flush=True)
    print()
    print(table(rows))
    if args.markdown:
        print()
        print(markdown(rows))
    for m, why in skipped.items():
        print(f"{m}: {why}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kind": "ipc", "platform": platform.platform(), "cpus": os.cpu_count(),
                       "python": platform.python_version(), "rows": rows, "skipped": skipped}, f, indent=1)
    if args.plot:
        try:
            plot(rows, args.plot)
            print(f"plot written to {args.plot}")
        except ImportError:
            print("--plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
