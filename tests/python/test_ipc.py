"""tw.Publisher / tw.Subscriber across real processes (multiprocessing 'spawn'): every layout and dtype arrives with
identical values, metadata keeps its Python types, fan-out, on_full policies, faults (SIGKILL of either side),
nothing leaks (fds and mappings counted in /proc), and a long checksum run."""

from __future__ import annotations

import asyncio
import gc
import multiprocessing as mp
import os
import selectors
import signal
import threading
import time
import uuid

import numpy as np
import pytest

import tensorwire as tw

UNDER_ASAN = os.environ.get("TW_UNDER_ASAN") == "1"
CTX = mp.get_context("spawn")
TIMEOUT = 60


def topic(what: str) -> str:
    return f"pytest/{os.getpid()}/{what}/{uuid.uuid4().hex[:8]}"


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def tw_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("memfd:tensorwire" in line for line in f)


# ---- children (module level: spawn pickles them by name) ------------------------------------------------------------


def _child_collect(name, n, ready, out):
    """Receives n messages and ships back (values, dtype, shape, strides, metadata) of each, then the EOF status."""
    with tw.Subscriber(name) as sub:
        ready.set()
        for _ in range(n):
            t = sub.recv(timeout=TIMEOUT)
            a = np.asarray(t)
            out.put((a.copy(), str(t.dtype), t.shape, t.strides, t.byte_offset, dict(t.metadata), t.readonly,
                     a.flags.writeable))
        try:
            sub.recv(timeout=TIMEOUT)
            out.put("no-eof")
        except EOFError:
            out.put("eof")


def _child_sum(name, ready, out):
    """Iterates to end-of-stream, checking each message's checksum; reports (count, ok)."""
    sub = tw.Subscriber(name)
    ready.set()
    count, ok = 0, True
    for t in sub:
        a = np.asarray(t)
        ok &= int(a[0]) == count and int(a[1:].sum()) == int(a[0]) * (a.size - 1)
        count += 1
    out.put((count, bool(ok), sub.closed))


def _child_hoard(name, ready, got):
    """Receives and holds every tensor; tells the parent after each one; waits to be killed."""
    sub = tw.Subscriber(name)
    ready.set()
    held = []
    while True:
        held.append(sub.recv(timeout=TIMEOUT))
        got.put(len(held))


def _child_publish_then_hang(name, n, ready):
    pub = tw.Publisher(name)
    while pub.subscribers < 1:
        time.sleep(0.005)
    for i in range(n):
        buf = pub.loan((1000,), "int32")
        np.asarray(buf)[:] = i + 7
        pub.send(buf, metadata={"i": i})
    ready.set()
    time.sleep(3600)


def _child_publish_checksums(name, n, ready_sub):
    pub = tw.Publisher(name, depth=64)
    ready_sub.wait(TIMEOUT)
    while pub.subscribers < 1:
        time.sleep(0.001)
    for i in range(n):
        k = 1 + i % 61
        buf = pub.loan((k,), "uint64")
        np.asarray(buf)[:] = i
        pub.send(buf)
    pub.close()


def _child_interrupted(name, out):
    sub = tw.Subscriber(name)
    signal.signal(signal.SIGUSR1, lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:  # (a signal that lands just after "waiting" is put still ends as "interrupted")
        out.put("waiting")
        sub.recv()
        out.put("returned")
    except KeyboardInterrupt:
        out.put("interrupted")


# ---- helpers --------------------------------------------------------------------------------------------------------


class Child:
    def __init__(self, target, *args):
        self.p = CTX.Process(target=target, args=args, daemon=True)
        self.p.start()

    def join(self, timeout=TIMEOUT):
        self.p.join(timeout)
        assert not self.p.is_alive(), "child did not finish"
        return self.p.exitcode

    def kill(self):
        os.kill(self.p.pid, signal.SIGKILL)
        self.p.join(TIMEOUT)


def wait_for_subscribers(pub, n, timeout=TIMEOUT):
    end = time.monotonic() + timeout
    while pub.subscribers < n:
        assert time.monotonic() < end, f"only {pub.subscribers} of {n} subscribers connected"
        time.sleep(0.002)


def layouts():
    base = np.arange(5 * 6 * 7, dtype=np.float64).reshape(5, 6, 7)
    return {
        "contiguous": np.arange(12, dtype=np.float32).reshape(3, 4),
        "transposed": base.transpose(2, 0, 1),
        "negative": base[::-1, :, ::-2],
        "stride0": np.broadcast_to(np.arange(7, dtype=np.int16), (4, 7)),
        "offset": base[2:, 1:5, 3],
        "scalar": np.array(3.25),
        "empty": np.zeros((0, 4), np.int32),
        "fortran": np.asfortranarray(np.arange(20, dtype=np.int64).reshape(4, 5)),
        "channels_last": np.arange(120, dtype=np.float32).reshape(2, 4, 5, 3).transpose(0, 3, 1, 2),  # NCHW
        "big": np.arange(1 << 20, dtype=np.uint8).reshape(1024, 1024)[::3, 5:900],
    }


DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
          "float64", "complex64", "complex128"]


# ---- same process ---------------------------------------------------------------------------------------------------


def test_round_trip_in_process():
    name = topic("inproc")
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        frame = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
        pub.send(frame, metadata={"ts": 1.5})
        t = sub.recv(timeout=1.0)
        assert isinstance(t, tw.Tensor)
        assert t.readonly
        np.testing.assert_array_equal(np.asarray(t), frame)
        assert dict(t.metadata) == {"ts": 1.5}
        with pytest.raises(ValueError):
            np.asarray(t)[0, 0, 0] = 1
        with pytest.raises(TimeoutError):
            sub.recv(timeout=0.01)
        with pytest.raises(TimeoutError):
            sub.recv(timeout=0)


def test_loan_is_zero_copy_and_handed_over():
    name = topic("loan")
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        buf = pub.loan((1080, 1920, 3), "uint8")
        assert not buf.readonly
        np.asarray(buf)[:] = 9
        pub.send(buf, metadata={"frame": 1})
        with pytest.raises(ValueError):
            buf.shape  # the loan was handed over
        t = sub.recv(timeout=5)
        assert t.shape == (1080, 1920, 3) and t.metadata["frame"] == 1
        assert int(np.asarray(t).min()) == 9 == int(np.asarray(t).max())


def test_loan_with_live_exports_raises_buffer_error():
    name = topic("exports")
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        buf = pub.loan((4,), np.float32)
        arr = np.asarray(buf)
        arr[:] = 2
        with pytest.raises(BufferError):
            pub.send(buf)
        view = buf[1:]
        del arr
        with pytest.raises(BufferError):
            pub.send(buf)
        del view
        pub.send(buf)
        np.testing.assert_array_equal(np.asarray(sub.recv(timeout=5)), np.full(4, 2, np.float32))


def test_loan_passed_through_helpers_is_not_mistaken_for_an_export():
    name = topic("helper")

    def fill_and_send(pub, buf):
        np.asarray(buf)[:] = 3
        pub.send(buf)

    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        buf = pub.loan((5,), "int16")
        keep = [buf]
        fill_and_send(pub, buf)
        np.testing.assert_array_equal(np.asarray(sub.recv(timeout=5)), np.full(5, 3, np.int16))
        del keep
        buf = pub.loan((2,), "uint8")
        mv = memoryview(buf)
        holder = {"b": buf}
        with pytest.raises(BufferError):
            pub.send(buf)
        mv.release()
        del holder
        pub.send(buf)


def test_view_of_a_loan_keeps_its_strides_and_offset():
    name = topic("loanview")
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        buf = pub.loan((3, 4), "float32")
        np.asarray(buf)[:] = np.arange(12, dtype=np.float32).reshape(3, 4)
        view = buf.T[1:]
        del buf
        pub.send(view)
        t = sub.recv(timeout=5)
        assert t.strides == (1, 4) and t.byte_offset == 4
        np.testing.assert_array_equal(np.asarray(t), np.arange(12, dtype=np.float32).reshape(3, 4).T[1:])


def test_torch_tensors_cross():
    torch = pytest.importorskip("torch")
    name = topic("torch")
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        x = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5).permute(2, 0, 1)[1:, :, ::2]
        pub.send(x)
        t = sub.recv(timeout=5)
        assert torch.equal(tw.to_torch(t) if hasattr(tw, "to_torch") else torch.from_numpy(np.asarray(t)), x)


def test_errors_are_clear():
    with pytest.raises(ValueError, match="at most 64"):
        tw.Publisher("x" * 65)
    with pytest.raises(ValueError):
        tw.Subscriber("has space")
    with pytest.raises(ValueError):
        tw.Publisher("")
    with pytest.raises(ValueError, match="on_full"):
        tw.Publisher(topic("bad"), on_full="sometimes")
    name = topic("closed")
    pub = tw.Publisher(name)
    with pytest.raises(ValueError, match="already running"):
        tw.Publisher(name)
    with pytest.raises(TypeError):
        pub.send(object())
    with pytest.raises(TypeError):
        pub.send(np.zeros(2), metadata={"bad": object()})
    pub.close()
    pub.close()  # idempotent
    assert pub.closed
    with pytest.raises(ValueError, match="closed"):
        pub.send(np.zeros(2))
    tw.Publisher(name).close()  # the name is free again


def test_on_full_raise_and_drop_oldest():
    name = topic("raise")
    with tw.Publisher(name, depth=2, on_full="raise") as pub, tw.Subscriber(name) as sub:
        pub.send(np.zeros(1))
        pub.send(np.zeros(1))
        with pytest.raises(BlockingIOError):
            pub.send(np.zeros(1))
        sub.recv(timeout=1)
        pub.send(np.zeros(1))
    name = topic("drop")
    with tw.Publisher(name, depth=2, on_full="drop_oldest") as pub, tw.Subscriber(name) as sub:
        for i in range(10):
            pub.send(np.array([i]))
        assert pub.dropped == 8 and sub.dropped == 8
        assert [int(np.asarray(sub.recv(timeout=1))[0]) for _ in range(2)] == [8, 9]


BIG = 3000  # float64s: 24000 bytes, more than a shared pool buffer takes (16 KiB), so a buffer of its own


def test_exhausted_pool_follows_on_full():
    name = topic("pool")
    with tw.Publisher(name, depth=8, on_full="raise", max_buffers=2) as pub, tw.Subscriber(name) as sub:
        pub.send(np.zeros(BIG))
        pub.send(np.zeros(BIG))
        held = [sub.recv(timeout=1), sub.recv(timeout=1)]
        with pytest.raises(BlockingIOError):
            pub.send(np.zeros(BIG))
        del held
        gc.collect()
        pub.send(np.zeros(BIG))  # released buffers return to the pool


def test_exhausted_pool_message_counts_its_buffers_in_english():
    name = topic("pool1")
    with tw.Publisher(name, on_full="raise", max_buffers=1) as pub, tw.Subscriber(name) as sub:
        pub.send(np.zeros(BIG))
        held = sub.recv(timeout=1)
        with pytest.raises(BlockingIOError, match=r"\(1 buffer at most, pool_bytes") as e:
            pub.send(np.zeros(BIG))
        assert f"subscriber pid {os.getpid()} holds 1 buffer of received tensors it keeps (on_full='raise')" in str(e.value)
        del held
    with tw.Publisher(name, on_full="raise", max_buffers=2) as pub, tw.Subscriber(name) as sub:
        pub.send(np.zeros(BIG))
        kept = sub.recv(timeout=1)
        pub.send(np.zeros(BIG))  # never read: it holds its buffer as much as the received one does
        with pytest.raises(BlockingIOError) as e:
            pub.send(np.zeros(BIG))
        assert (f"subscriber pid {os.getpid()} holds 2 buffers, some for messages it has not read yet (1 ring cell "
                "queued)" in str(e.value))
        del kept
    with tw.Publisher(topic("pool1-loan"), on_full="raise", max_buffers=1) as pub:  # nobody subscribes: a loan holds it
        loan = pub.loan(BIG)
        with pytest.raises(BlockingIOError) as e:
            pub.loan(BIG)
        assert "1 loan alive in this process (on_full='raise')" in str(e.value) and "subscriber" not in str(e.value)
        del loan


def test_small_copies_share_pool_buffers_and_a_held_one_holds_only_its_own_buffer():
    name = topic("shared")
    with tw.Publisher(name, depth=512, max_buffers=4) as pub, tw.Subscriber(name) as sub:
        # 500 unread 1 KiB messages fit two shared buffers (256 KiB each) where each used to take one of its own.
        for i in range(500):
            pub.send(np.full(256, i, np.float32), timeout=5)
        assert pub.pool_buffers == 2
        got = [sub.recv(timeout=5) for _ in range(500)]
        assert [float(np.asarray(t)[0]) for t in got] == list(range(500))
        assert all((np.asarray(t) == i).all() for i, t in enumerate(got))  # no part overlaps another
        # 64-byte aligned parts, each exactly as large as it needs (rounded up to the alignment).
        addresses = sorted(np.asarray(t).ctypes.data for t in got)
        assert all(a % 64 == 0 for a in addresses)
        assert min(b - a for a, b in zip(addresses, addresses[1:])) == 1024
        kept = got[499]  # the last one holds its shared buffer; the others go back
        del got
        gc.collect()
        for i in range(2000):  # with the rest reused from its start, the pool does not grow
            pub.send(np.full(256, -i, np.float32), timeout=5)
            assert float(np.asarray(sub.recv(timeout=5))[0]) == -i
        assert pub.pool_buffers <= 3 and (np.asarray(kept) == 499).all()
        # A message of more than 16 KiB takes a buffer of its own, as before.
        pub.send(np.full(5000, 3, np.float32), timeout=5)
        assert (np.asarray(sub.recv(timeout=5)) == 3).all()


def test_a_timeout_says_why_nothing_arrived():
    name = topic("why")
    with tw.Subscriber(name) as early:
        with pytest.raises(TimeoutError, match=f"no message within the timeout \\(no publisher of '{name}' is running\\)"):
            early.recv(timeout=0.01)
    with tw.Publisher(name) as pub:
        pub.send(np.zeros(3))  # nobody subscribed yet: nobody receives it (there is no history)
        with tw.Subscriber(name) as late:
            with pytest.raises(TimeoutError, match="a subscriber receives only the messages sent after it subscribed"):
                late.recv(timeout=0.02)
            pub.send(np.ones(3))
            assert np.asarray(late.recv(timeout=5)).tolist() == [1.0, 1.0, 1.0]


def test_fileno_with_selectors_and_asyncio():
    name = topic("fileno")
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        sel = selectors.DefaultSelector()
        sel.register(sub.fileno(), selectors.EVENT_READ)
        assert sel.select(timeout=0) == []
        pub.send(np.ones(3))
        assert len(sel.select(timeout=5)) == 1
        sub.recv(timeout=0)
        assert sel.select(timeout=0) == []
        sel.close()

        async def main():
            loop = asyncio.get_running_loop()
            got = asyncio.Queue()
            loop.add_reader(sub.fileno(), lambda: got.put_nowait(sub.recv(timeout=0)))
            loop.call_later(0.05, pub.send, np.full(2, 5.0))
            t = await asyncio.wait_for(got.get(), 5)
            loop.remove_reader(sub.fileno())
            return np.asarray(t).tolist()

        assert asyncio.run(main()) == [5.0, 5.0]


def test_fileno_of_a_subscriber_created_before_its_publisher():
    name = topic("fileno-early")
    with tw.Subscriber(name) as sub, tw.Publisher(name) as pub:
        sel = selectors.DefaultSelector()
        sel.register(sub.fileno(), selectors.EVENT_READ)
        assert sel.select(timeout=0) == []
        pub.send(np.arange(3))
        assert len(sel.select(timeout=5)) == 1
        np.testing.assert_array_equal(np.asarray(sub.recv(timeout=0)), np.arange(3))
        assert sel.select(timeout=0) == []
        sel.close()


def test_recv_is_interruptible():
    class Stop(Exception):
        pass

    def handler(*_):
        raise Stop

    old = signal.signal(signal.SIGALRM, handler)
    try:
        with tw.Subscriber(topic("intr")) as sub:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            t0 = time.monotonic()
            with pytest.raises(Stop):
                sub.recv()
            assert time.monotonic() - t0 < 10  # (the alarm comes at 0.2 s; a recv that ignored it waits forever)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_recv_in_a_child_is_interrupted_by_a_signal():
    out = CTX.Queue()
    c = Child(_child_interrupted, topic("intr-child"), out)
    assert out.get(timeout=TIMEOUT) == "waiting"
    time.sleep(0.2)
    os.kill(c.p.pid, signal.SIGUSR1)
    assert out.get(timeout=TIMEOUT) == "interrupted"
    assert c.join() == 0


def test_iteration_ends_at_end_of_stream():
    name = topic("iter")
    pub = tw.Publisher(name)
    sub = tw.Subscriber(name)
    for i in range(5):
        pub.send(np.array([i]))
    pub.close()
    assert [int(np.asarray(t)[0]) for t in sub] == list(range(5))
    assert sub.closed
    with pytest.raises(EOFError):
        sub.recv(timeout=0)


def test_nothing_leaks():
    gc.collect()
    fds0, maps0 = fd_count(), tw_mappings()
    name = topic("leak")
    pub = tw.Publisher(name)
    subs = [tw.Subscriber(name) for _ in range(3)]
    kept = []
    for i in range(40):
        pub.send(np.zeros(100 + 5000 * (i % 5), np.float32), metadata={"i": i})
        for s in subs:
            kept.append(s.recv(timeout=5))
    for s in subs:
        s.close()
    assert float(np.asarray(kept[-1]).sum()) == 0.0  # received tensors outlive their subscriber
    kept.clear()
    pub.close()
    gc.collect()
    assert fd_count() == fds0  # closed is enough: the objects may live on
    assert tw_mappings() == maps0
    del pub, subs
    gc.collect()
    assert fd_count() == fds0
    assert tw_mappings() == maps0
    assert not any(f.startswith("tensorwire") for f in os.listdir("/dev/shm"))


# ---- across processes ----------------------------------------------------------------------------------------------


def _collect(pub_sends, n, name):
    ready, out = CTX.Event(), CTX.Queue()
    c = Child(_child_collect, name, n, ready, out)
    assert ready.wait(TIMEOUT)
    with tw.Publisher(name) as pub:
        wait_for_subscribers(pub, 1)
        pub_sends(pub)
    results = [out.get(timeout=TIMEOUT) for _ in range(n + 1)]
    assert c.join() == 0
    return results


def test_every_layout_arrives_identical():
    cases = layouts()
    name = topic("layouts")
    results = _collect(lambda pub: [pub.send(a, metadata={"case": k}) for k, a in cases.items()], len(cases), name)
    assert results[-1] == "eof"
    for (k, a), (vals, dtype, shape, strides, off, meta, ro, writeable) in zip(cases.items(), results):
        assert meta == {"case": k}
        assert shape == a.shape and dtype == str(a.dtype)
        np.testing.assert_array_equal(vals, a)
        assert ro and not writeable
        # A copy keeps a dense layout's order (Fortran, a transpose: it was packed C-contiguous, losing
        # channels_last), and packs anything else C-contiguous. (Strides of extent-1 dimensions carry nothing.)
        if a.size == 0:
            continue  # (nothing laid out)
        kept = _dense_in_some_order(a)
        want = a.strides if kept else np.ascontiguousarray(a).strides
        assert [s * a.itemsize for n, s in zip(a.shape, strides) if n > 1] == \
            [s for n, s in zip(a.shape, want) if n > 1], (k, strides)


def _dense_in_some_order(a: np.ndarray) -> bool:
    dims = sorted((s, n) for n, s in zip(a.shape, a.strides) if n != 1)
    expect = a.itemsize
    for s, n in dims:
        if s != expect:
            return False
        expect *= n
    return True


def test_every_dtype_arrives_identical():
    rng = np.random.default_rng(0)
    arrays = {d: (rng.integers(0, 2, (3, 5)) if d == "bool" else rng.integers(-100, 100, (3, 5))).astype(d).T
              for d in DTYPES}
    ml = pytest.importorskip("ml_dtypes")
    arrays["bfloat16"] = np.arange(6, dtype=np.float32).astype(ml.bfloat16)[::-1]
    name = topic("dtypes")
    results = _collect(lambda pub: [pub.send(a) for a in arrays.values()], len(arrays), name)
    for (d, a), r in zip(arrays.items(), results):
        assert r[1] == d
        if d == "bfloat16":
            np.testing.assert_array_equal(r[0].astype(np.float32), a.astype(np.float32))
        else:
            np.testing.assert_array_equal(r[0], a)


def test_metadata_round_trips_with_exact_types():
    meta = {
        "none": None, "t": True, "f": False, "int": -(2**63), "float": 1.5, "str": "héllo", "bytes": b"\x00\xff",
        "list": [1, [2, (3, b"4")], {"k": None}], "tuple": (1, "a", (2.5,)), "dict": {"nested": {"deep": [()]}},
    }
    name = topic("meta")

    def send(pub):
        t = tw.asarray(np.zeros(3))
        t.metadata["own"] = "mine"
        t.metadata["str"] = "overridden"
        pub.send(t, metadata=meta)

    results = _collect(send, 1, name)
    got = results[0][5]
    assert got == {"own": "mine", **meta}
    assert type(got["tuple"]) is tuple and type(got["list"][1][1]) is tuple and type(got["bytes"]) is bytes
    assert list(got)[0] == "own"  # the tensor's own keys first, in order


def test_fan_out_to_four_subscribers():
    name = topic("fanout")
    ready = [CTX.Event() for _ in range(4)]
    out = CTX.Queue()
    kids = [Child(_child_sum, name, r, out) for r in ready]
    for r in ready:
        assert r.wait(TIMEOUT)
    n = 300
    with tw.Publisher(name) as pub:
        wait_for_subscribers(pub, 4)
        for i in range(n):
            buf = pub.loan((1 + i % 17,), "int64")
            np.asarray(buf)[:] = i
            pub.send(buf)
    for _ in kids:
        assert out.get(timeout=TIMEOUT) == (n, True, True)
    for k in kids:
        assert k.join() == 0


def test_subscriber_started_before_publisher():
    name = topic("early")
    ready, out = CTX.Event(), CTX.Queue()
    c = Child(_child_sum, name, ready, out)
    assert ready.wait(TIMEOUT)
    time.sleep(0.1)
    with tw.Publisher(name, depth=4) as pub:
        assert pub.subscribers == 1  # found the waiting subscriber when it started
        for i in range(50):
            pub.send(np.full(4, i, np.int64))
    assert out.get(timeout=TIMEOUT) == (50, True, True)
    assert c.join() == 0


def test_killed_subscriber_leases_are_reclaimed():
    name = topic("killsub")
    ready, got = CTX.Event(), CTX.Queue()
    pub = tw.Publisher(name, max_buffers=4)
    c = Child(_child_hoard, name, ready, got)
    assert ready.wait(TIMEOUT)
    wait_for_subscribers(pub, 1)
    for i in range(3):
        pub.send(np.full(1000, i))
        assert got.get(timeout=TIMEOUT) == i + 1
    c.kill()
    # the three hoarded buffers come back: many more messages flow through a pool of four
    with tw.Subscriber(name) as other:
        deadline = time.monotonic() + 10
        while pub.subscribers != 1:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        for i in range(200):
            pub.send(np.full(1000, i))
            assert int(np.asarray(other.recv(timeout=5))[0]) == i
        assert pub.pool_buffers <= 4
    pub.close()


def test_killed_publisher_leaves_data_valid_then_eof():
    name = topic("killpub")
    ready = CTX.Event()
    sub = tw.Subscriber(name)
    c = Child(_child_publish_then_hang, name, 3, ready)
    assert ready.wait(TIMEOUT)
    first = sub.recv(timeout=5)
    c.kill()
    rest = [sub.recv(timeout=5), sub.recv(timeout=5)]
    t0 = time.monotonic()
    with pytest.raises(EOFError):
        sub.recv(timeout=10)
    assert time.monotonic() - t0 < 2
    assert sub.closed
    assert [int(np.asarray(t)[-1]) for t in [first] + rest] == [7, 8, 9]
    assert [t.metadata["i"] for t in [first] + rest] == [0, 1, 2]
    # a new publisher of the same name works
    with tw.Publisher(name) as pub, tw.Subscriber(name) as fresh:
        pub.send(np.ones(2))
        np.testing.assert_array_equal(np.asarray(fresh.recv(timeout=5)), np.ones(2))


def _checksum_run(n):
    name = topic("checksums")
    ready = CTX.Event()
    c = Child(_child_publish_checksums, name, n, ready)
    sub = tw.Subscriber(name)
    ready.set()
    count, ok = 0, True
    for t in sub:
        a = np.asarray(t)
        ok = ok and int(a[0]) == count and int(a.sum()) == count * a.size
        count += 1
    assert c.join() == 0
    assert ok and count == n


def test_100k_messages_with_checksums():
    _checksum_run(10_000 if UNDER_ASAN else 100_000)


@pytest.mark.skipif(os.environ.get("TW_IPC_1M") != "1", reason="release-build run: set TW_IPC_1M=1 (about a minute)")
def test_1m_messages_with_checksums():
    _checksum_run(1_000_000)


def test_a_request_larger_than_pool_bytes_waits_for_an_empty_pool_and_the_timeout_says_so():
    with tw.Publisher(topic("oversize"), pool_bytes=4 << 20) as pub, tw.Subscriber(pub.name) as sub:
        pub.send(np.zeros(10))
        held = sub.recv(timeout=5)
        with pytest.raises(TimeoutError, match=r"This request alone \(8\.0 MiB\) is larger than pool_bytes"):
            pub.send(np.zeros(8 << 20, np.uint8), timeout=0.3)
        del held  # the pool empties: the same request is served
        assert pub.send(np.zeros(8 << 20, np.uint8), timeout=5) == 1
        assert sub.recv(timeout=5).shape == (8 << 20,)


def test_a_nested_list_of_arrays_is_refused_not_stacked_into_one_part():
    # [[a, b]] arrived as one (2, n) tensor (the inner list went through asarray); a nested dict was refused.
    name = topic("nested")
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        for bad in ([[np.ones(2), np.zeros(2)]], [np.ones(2), (np.ones(1),)]):
            with pytest.raises(TypeError, match=r"the message's part \d is a (list|tuple) of arrays: .* not nested"):
                pub.send(bad)
        pub.send([np.ones(2), [1, 2, 3], [[1, 2], [3, 4]], [], [np.float64(1), np.float64(2)]])  # numbers: array data
        got = sub.recv(timeout=5)
        assert [tuple(t.shape) for t in got] == [(2,), (3,), (2, 2), (0,), (2,)]
