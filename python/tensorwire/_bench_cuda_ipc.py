"""CUDA tensors to another process (issue 10): tensorwire's publish/subscribe against torch.multiprocessing, in the
same run. Part of ``tensorwire bench --device cuda`` (rows "ipc"); ``run(..., device="cpu")`` measures the same
way with host tensors, which is how the harness is tested on machines without a GPU.

Methods (a producer in this process, a consumer in a process started with the "spawn" method):
  tw-loan          ``pub.loan(n, "uint8", device="cuda:0")`` + ``send``: tensorwire's own IPC-capable pool
  tw-send-resent   ``pub.send(x)`` of the same PyTorch CUDA tensor every message (its IPC handle opened once)
  tw-send-fresh    ``pub.send(torch.empty(n, device="cuda"))``: a new PyTorch tensor every message (PyTorch's
                   caching allocator may hand back the block the last one freed: a new tensor, not always a new
                   allocation)
  torch-resent     ``torch.multiprocessing`` Queue, the same CUDA tensor every message
  torch-fresh      ``torch.multiprocessing`` Queue, a new CUDA tensor every message
Latency: one message in flight, after PRIMING untimed ones of the same size. The producer takes ``time.perf_counter_ns()`` (CLOCK_MONOTONIC, one clock for
every process) just before sending (before ``loan()`` for tw-loan) and sends the stamp with the message (metadata;
the queue's tuple); the consumer reads its clock once the tensor is usable: a PyTorch tensor on it
(``torch.from_dlpack`` for tensorwire, ``Queue.get`` for torch) whose stream has waited for the producer's work, and
that stream synchronised. It acknowledges through a pipe, outside the timed path. tensorwire's consumer polls
``recv(timeout=0)``, torch's blocks in ``get()`` (as in ``tensorwire bench``). Throughput: after an untimed burst,
a burst of messages with no acknowledgement, messages per second from the first send to the last receive; no
method copies the payload on the GPU (each maps the producer's memory), so bytes per second are given as what the
message rate means for that size, not as bytes moved.
Targets (issue 10): tw-loan p50 within 2x across sizes; tensorwire's p50 >= 10x lower than torch.multiprocessing's
at every size (tw-loan and tw-send-resent against torch-resent); a fresh foreign tensor (tw-send-fresh against
torch-fresh) >= 5x lower.
"""

from __future__ import annotations

import statistics
import time
import traceback
import uuid

KiB, MiB = 1 << 10, 1 << 20
SIZES = [4 * KiB, 64 * KiB, MiB, 16 * MiB, 256 * MiB]
# (each of tensorwire's methods right after the torch method it is judged against: a run cut short still has pairs)
METHODS = ["tw-loan", "torch-resent", "tw-send-fresh", "torch-fresh", "tw-send-resent"]
WAIT_S = 20.0
# The consumer's start is a fresh interpreter importing torch and tensorwire (and making its CUDA context): seconds
# when warm, but measured past 20 s on a cold page cache under ASan; a hang is still caught, 120 s later.
START_WAIT_S = 120.0
# Messages of each size sent one at a time, acknowledged and not timed, before its latency series: the first
# message of a size pays for the consumer's first CUDA use, for opening a new allocation's handle, for a pool's
# growth (with 20 samples at 256 MiB, p99 would be that one cold message).
PRIMING = 3


def now() -> int:
    return time.perf_counter_ns()


def _counts(size: int, n_lat: int) -> tuple[int, int, int]:
    """(latency messages, warm-up messages, burst messages) for one size: fewer of the largest. The warm-up is a
    burst as long as the measured one, so that pools have grown to what a burst needs before it is timed."""
    if size >= 64 * MiB:
        return max(10, n_lat // 10), 10, 10
    burst = max(20, n_lat // 2)
    return n_lat, burst, burst


def _usable(torch, device: str):
    """What makes a received tensor usable at the consumer: its stream synchronised (CUDA), nothing (host)."""
    if device == "cpu":
        return lambda x: None
    return lambda x: torch.cuda.current_stream().synchronize()


def _consumer(method: str, topic: str, device: str, plan: list, q, conn, ready) -> None:
    """The consumer process: receives every message of `plan` and reports through `conn` (an error as ("error",
    its traceback), which the producer raises at once instead of waiting out WAIT_S)."""
    try:
        _consume(method, topic, device, plan, q, conn, ready)
    except BaseException:  # noqa: BLE001 - sent to the producer, which reports it
        try:
            conn.send(("error", traceback.format_exc()))
        finally:
            raise


def _consume(method: str, topic: str, device: str, plan: list, q, conn, ready) -> None:
    import torch

    usable = _usable(torch, device)
    if method.startswith("tw-"):
        import tensorwire as tw

        sub = tw.Subscriber(topic)
        ready.set()

        def get():
            deadline = time.monotonic() + WAIT_S
            while True:
                try:
                    t = sub.recv(timeout=0)  # a busy consumer
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise
            x = torch.from_dlpack(t)
            usable(x)
            t1 = now()
            stamp = int(t.metadata["stamp"])
            del x, t  # the lease goes back
            return stamp, t1
    else:
        ready.set()

        def get():
            x, stamp = q.get(timeout=WAIT_S)
            usable(x)
            t1 = now()
            del x
            return stamp, t1

    for size, n_lat, n_warm, n_burst in plan:
        for _ in range(PRIMING):  # (untimed: the first of a size opens handles and grows pools)
            get()
            conn.send(b"p")
        lat = []
        for _ in range(n_lat):
            stamp, t1 = get()
            lat.append(t1 - stamp)
            conn.send(b"k")
        for _ in range(n_warm):
            get()
        conn.send(b"w")
        first = last = None
        for i in range(n_burst):
            stamp, t1 = get()
            if i == 0:
                first = stamp
            last = t1
        conn.send((size, lat, first, last))
    conn.close()


class _Producer:
    def __init__(self, method: str, topic: str, device: str, torch, tw):
        self.method, self.device, self.torch = method, device, torch
        self.pub = tw.Publisher(topic, depth=16) if method.startswith("tw-") else None
        self.q = None
        self.x = None

    def prepare(self, size: int) -> None:
        self.x = self.torch.zeros(size, dtype=self.torch.uint8, device=self.device)
        if self.device != "cpu":
            self.torch.cuda.synchronize()
        elif self.method == "torch-resent":
            self.x.share_memory_()

    def send(self, size: int) -> None:
        m, torch = self.method, self.torch
        if m == "tw-loan":
            t0 = now()
            buf = self.pub.loan((size,), "uint8", device=self.device if self.device != "cpu" else None,
                                timeout=WAIT_S)
            self.pub.send(buf, {"stamp": t0}, timeout=WAIT_S)
            return
        if m.endswith("-fresh"):
            x = torch.empty(size, dtype=torch.uint8, device=self.device)
        else:
            x = self.x
        t0 = now()
        if m.startswith("tw-"):
            self.pub.send(x, {"stamp": t0}, timeout=WAIT_S)
        else:
            self.q.put((x, t0))

    def close(self) -> None:
        if self.pub is not None:
            self.pub.close()


def _wait(conn, what: str, proc):
    """The consumer's next report, in slices: a consumer that died or failed is seen at once, not after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not conn.poll(0.25):
        if proc.exitcode is not None and not conn.poll(0):
            raise RuntimeError(f"the consumer exited with {proc.exitcode} before sending its {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the consumer sent no {what} within {WAIT_S:.0f} s")
    msg = conn.recv()
    if isinstance(msg, tuple) and msg[:1] == ("error",):
        last = [line for line in str(msg[1]).strip().splitlines() if line.strip()][-1:]
        raise RuntimeError(f"the consumer failed: {last[0] if last else '?'}")
    return msg


def run_method(method: str, sizes, n_lat: int, device: str = "cuda:0", log=print) -> list[dict]:
    """One method, every size, in one pair of processes. Returns a row per size."""
    import torch
    import torch.multiprocessing as tmp

    import tensorwire as tw

    ctx = tmp.get_context("spawn")
    topic = f"tw-bench-cuda-ipc-{uuid.uuid4().hex[:8]}"
    plan = [(s, *_counts(s, n_lat)) for s in sizes]
    prod = _Producer(method, topic, device, torch, tw)
    here, there = ctx.Pipe()
    ready = ctx.Event()
    q = ctx.Queue() if not method.startswith("tw-") else None
    prod.q = q
    proc = ctx.Process(target=_consumer, args=(method, topic, device, plan, q, there, ready), daemon=True)
    proc.start()
    there.close()  # (this process's copy: the consumer's end is its own now)
    rows = []
    ok = False
    try:
        deadline = time.monotonic() + START_WAIT_S
        while not ready.wait(0.25):
            if proc.exitcode is not None:
                msg = here.recv() if here.poll(0) else None
                why = msg[1].strip().splitlines()[-1] if isinstance(msg, tuple) and msg[:1] == ("error",) else ""
                raise RuntimeError(f"{method}: the consumer exited with {proc.exitcode} at start {why}".rstrip())
            if time.monotonic() > deadline:
                raise TimeoutError(f"{method}: the consumer did not start within {START_WAIT_S:.0f} s")
        if prod.pub is not None:
            deadline = time.monotonic() + WAIT_S
            while prod.pub.subscribers < 1:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{method}: no subscriber within {WAIT_S:.0f} s")
                time.sleep(0.001)
        for size, lat_n, warm_n, burst_n in plan:
            prod.prepare(size)
            for _ in range(PRIMING):
                prod.send(size)
                _wait(here, "acknowledgement", proc)
            for _ in range(lat_n):
                prod.send(size)
                _wait(here, "acknowledgement", proc)
            for _ in range(warm_n):
                prod.send(size)
            _wait(here, "end of the warm-up", proc)
            for _ in range(burst_n):
                prod.send(size)
            got_size, lat, first, last = _wait(here, "result", proc)
            if got_size != size:
                raise RuntimeError(f"{method}: results out of order ({got_size} for {size})")
            lat_us = sorted(v / 1e3 for v in lat)
            secs = max(last - first, 1) / 1e9
            row = {"row": "ipc", "method": method, "device": device, "bytes": size, "n": len(lat_us),
                   "p50_us": statistics.median(lat_us),
                   "p99_us": lat_us[min(len(lat_us) - 1, int(0.99 * len(lat_us)))],
                   "msgs_per_s": burst_n / secs, "GBps_equiv": burst_n * size / secs / 1e9}
            rows.append(row)
            log(f"  {method:15s} {size:>10d} B  p50 {row['p50_us']:9.1f} us  p99 {row['p99_us']:9.1f} us  "
                f"{row['msgs_per_s']:9.0f} msg/s")
        ok = True
    finally:
        prod.close()
        if not ok:  # (the consumer would wait for messages that will not come)
            proc.kill()
        proc.join(timeout=WAIT_S)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)
    if proc.exitcode not in (0, None):
        if not rows:
            raise RuntimeError(f"{method}: the consumer exited with {proc.exitcode}")
        for r in rows:  # (measured before it failed at exit: kept, and the exit said)
            r["consumer_exitcode"] = proc.exitcode
    return rows


def run(sizes=None, methods=None, n_lat: int = 200, device: str = "cuda:0", log=print,
        on_rows=None) -> list[dict]:
    """Every method; a method that fails gives one row saying why (the others still run). on_rows(rows so far) is
    called after each method (the caller saves them: a run cut short keeps what it measured)."""
    rows: list[dict] = []
    for m in methods or METHODS:
        try:
            rows += run_method(m, sizes or SIZES, n_lat, device, log)
        except Exception as e:  # noqa: BLE001 - reported as a row, never hidden
            rows.append({"row": "ipc", "method": m, "device": device, "error": f"{type(e).__name__}: {e}"})
            log(f"  {m}: failed: {type(e).__name__}: {e}")
        if on_rows is not None:
            on_rows(rows)
    return rows


def judge(rows: list[dict]) -> list[dict]:
    """Issue 10's targets against the rows of one run: one verdict per target and size."""
    p50 = {(r["method"], r["bytes"]): r["p50_us"] for r in rows if "p50_us" in r}
    out = []
    loan = [v for (m, _), v in p50.items() if m == "tw-loan"]
    if loan:
        spread = max(loan) / min(loan)
        out.append({"target": "tw-loan p50 within 2x across sizes", "value": spread, "hit": spread <= 2.0})
    for ours, theirs, factor in (("tw-loan", "torch-resent", 10.0), ("tw-send-resent", "torch-resent", 10.0),
                                 ("tw-send-fresh", "torch-fresh", 5.0)):
        for (m, size), v in sorted(p50.items()):
            if m != ours or (theirs, size) not in p50:
                continue
            ratio = p50[(theirs, size)] / v
            out.append({"target": f"{ours} p50 >= {factor:g}x lower than {theirs}", "bytes": size,
                        "value": ratio, "hit": ratio >= factor})
    return out
