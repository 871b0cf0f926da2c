"""The shared-memory transport under misuse and faults: no peer, misuse or fault may corrupt, crash, hang or starve it.

Each test here failed on the transport as it first landed: touching a sent loan aborted the interpreter, a getter
deadlocked against a blocked send, a huge loan woke the OOM killer, a subscriber keeping tensors deadlocked both
sides, writing through tw.to_torch(received) was a SIGSEGV, counters reset at close(), a SIGKILLed subscriber could
leave a send blocked forever, stale writes into a sent loan corrupted messages, delivery could be partial, and a
fork()ed child kept the publisher's sockets. Scenarios that could take the test process down run in a child
interpreter; every wait is bounded.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import tensorwire as tw

UNDER_ASAN = os.environ.get("TW_UNDER_ASAN") == "1"
CTX = mp.get_context("spawn")


sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "soak"))
from ipc_soak import topic, tw_mappings  # noqa: E402  (the soak script's helpers: one definition)


def run_child(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter with this one's import path; a hang is killed by the watchdog inside the
    child (faulthandler prints every thread's stack) and by `timeout` here."""
    prelude = "import faulthandler, sys; faulthandler.dump_traceback_later(%d, exit=True)\n" % int(timeout * 0.8)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_an_interpreter_exits_cleanly_while_daemon_threads_wait_in_recv_and_send():
    # Python before 3.14 ends a daemon thread that takes the GIL back during finalization with pthread_exit; the
    # forced unwind met a noexcept destructor and std::terminate aborted the process (rc 134) at every exit with a
    # thread in recv: tensorwire.torch's DataLoader runs its receivers that way.
    r = run_child("""
        import threading, time, numpy as np, tensorwire as tw
        sub = tw.Subscriber("exit-daemon-%d" % __import__("os").getpid())
        pub = tw.Publisher("exit-daemon-full-%d" % __import__("os").getpid(), depth=1)
        sub2 = tw.Subscriber(pub.name)
        def receive():
            while True:
                try:
                    sub.recv(timeout=0.05)
                except TimeoutError:
                    pass
        def send():  # blocks on the full ring nobody reads
            while True:
                pub.send(np.zeros(4))
        for f in (receive, receive, send):
            threading.Thread(target=f, daemon=True).start()
        time.sleep(0.3)
        print("end", flush=True)
    """)
    assert r.returncode == 0 and r.stdout.strip() == "end", (r.returncode, r.stdout, r.stderr)
    assert "terminate called" not in r.stderr, r.stderr


# ---- 1. a spent loan raises, never aborts ------------------------------------------------------------------------


def test_every_slot_of_a_sent_loan_raises_and_repr_never_does():
    r = run_child(f"""
        import numpy as np, tensorwire as tw
        name = {topic("spent")!r}
        with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
            b = pub.loan((3,), "uint8")
            pub.send(b)
            assert "spent" in repr(b), repr(b)
            for what, f in [("asarray", lambda: np.asarray(b)), ("memoryview", lambda: memoryview(b)),
                            ("from_dlpack", lambda: np.from_dlpack(b)), ("shape", lambda: b.shape),
                            ("array_interface", lambda: b.__array_interface__), ("dlpack", lambda: b.__dlpack__()),
                            ("contiguous", lambda: b.contiguous()), ("send again", lambda: pub.send(b)),
                            ("slice", lambda: b[1:]), ("nbytes", lambda: b.nbytes),
                            # (these answered as for an empty tensor, and metadata writes were lost)
                            ("metadata", lambda: dict(b.metadata)), ("set metadata", lambda: b.metadata.update(x=1)),
                            ("assign metadata", lambda: setattr(b, "metadata", {{"x": 1}})),
                            ("readonly", lambda: b.readonly), ("stream", lambda: b.stream),
                            ("transport", lambda: b.transport), ("tw.asarray", lambda: tw.asarray(b))]:
                try:
                    f()
                except (ValueError, BufferError) as e:
                    assert "spent" in str(e), (what, str(e))
                else:
                    raise SystemExit(what + " did not raise")
            print("OK")
    """)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


# ---- 2. no internal lock is taken with the GIL held while a send waits --------------------------------------------


def test_getters_send_and_close_never_deadlock_against_a_blocked_send():
    r = run_child(f"""
        import threading, time, numpy as np, tensorwire as tw
        name = {topic("gil")!r}
        pub = tw.Publisher(name, depth=1)
        sub = tw.Subscriber(name)          # never reads: its ring of one fills at once
        pub.send(np.zeros(4, np.float32))
        outcome = []
        def blocked():
            try:
                pub.send(np.ones(4, np.float32))      # waits for room, forever unless closed
                outcome.append("sent")
            except Exception as e:
                outcome.append(type(e).__name__)
        a = threading.Thread(target=blocked)
        a.start()
        time.sleep(0.3)
        assert a.is_alive()
        # With the GIL held by this thread: none of these may wait for the lock the blocked send used to hold.
        assert pub.subscribers == 1 and pub.dropped == 0 and pub.pool_buffers >= 1
        t = tw.asarray(np.arange(3.0))
        try:
            pub.send(t, timeout=0.2)
        except TimeoutError as e:
            # (behind the blocked send, which says why it waits once it has reached its wait: under ASan on a
            # loaded machine it may still be on its way there)
            assert "unread messages" in str(e) or "behind another send" in str(e), e
        else:
            raise SystemExit("a send into a full ring did not time out")
        pub.close()
        a.join(10)
        assert not a.is_alive() and outcome == ["ValueError"], outcome
        print("OK")
    """)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


def test_threads_receiving_on_one_subscriber_all_make_progress():
    name = topic("threads")
    n_threads, per = 4, 200
    with tw.Publisher(name, depth=64) as pub, tw.Subscriber(name) as sub:
        got = []
        lock = threading.Lock()

        def worker():
            while True:
                try:
                    t = sub.recv(timeout=10)
                except EOFError:
                    return
                with lock:
                    got.append(int(np.asarray(t)[0]))

        ts = [threading.Thread(target=worker) for _ in range(n_threads)]
        for t in ts:
            t.start()
        for i in range(n_threads * per):
            pub.send(np.array([i], np.int64), timeout=10)
        pub.close()
        for t in ts:
            t.join(30)
        assert not any(t.is_alive() for t in ts)
    assert sorted(got) == list(range(n_threads * per))


# ---- 3. a request the machine cannot satisfy is a MemoryError ------------------------------------------------------


def test_a_huge_loan_raises_memory_error():
    with tw.Publisher(topic("huge")) as pub:
        want = r"^tensorwire\.Publisher\.loan on .* needs 1099511627776 bytes of shared memory"
        with pytest.raises(MemoryError, match=want):
            pub.loan((1 << 40,), "uint8")
        assert pub.pool_buffers == 0
        small = pub.loan((16,), "uint8")  # the publisher still works
        assert small.nbytes == 16


@pytest.mark.skipif(UNDER_ASAN, reason="ASan reserves terabytes of address space: RLIMIT_AS cannot be lowered under it")
def test_a_loan_beyond_the_address_space_limit_raises_memory_error():
    r = run_child(f"""
        import resource, tensorwire as tw
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
        with tw.Publisher({topic("rlimit")!r}) as pub:
            try:
                pub.loan((8 << 30,), "uint8")
            except MemoryError as e:
                print("OK", e)
    """)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


# ---- 4. back-pressure is visible and bounded ----------------------------------------------------------------------


def test_a_subscriber_keeping_tensors_grows_the_pool_then_a_timeout_names_it():
    name = topic("keep")
    # 20000-byte messages: each takes a 32 KiB buffer of its own (small ones share buffers: test_ipc.py).
    with tw.Publisher(name, pool_bytes=8 << 20) as pub, tw.Subscriber(name) as sub:
        kept = []
        for i in range(200):  # more than the 64 buffers the pool used to stop at
            pub.send(np.full(5000, i, np.int32), timeout=5)
            kept.append(sub.recv(timeout=5))
        assert pub.pool_buffers == 200
        with pytest.raises(TimeoutError, match=rf"subscriber pid {os.getpid()} holds \d+ .*copies"):
            for i in range(100):
                pub.send(np.full(5000, i, np.int32), timeout=0.2)
                kept.append(sub.recv(timeout=5))
        assert [int(np.asarray(t)[0]) for t in kept[:200]] == list(range(200))
        del kept
        pub.send(np.zeros(5000, np.int32), timeout=5)  # released buffers return to the pool
        assert sub.recv(timeout=5).shape == (5000,)


def test_delivery_is_all_or_none_when_one_subscriber_is_full():
    name = topic("allornone")
    with tw.Publisher(name, depth=1) as pub, tw.Subscriber(name) as full, tw.Subscriber(name) as idle:
        pub.send(np.zeros(2))
        assert idle.recv(timeout=5) is not None
        with pytest.raises(TimeoutError, match=rf"subscriber pid {os.getpid()} has 1 unread messages"):
            pub.send(np.ones(2), timeout=0.2)
        with pytest.raises(TimeoutError, match="no message waiting"):
            idle.recv(timeout=0)  # the idle subscriber did not get the message nobody else got
        assert full.recv(timeout=5) is not None
        pub.send(np.full(2, 7.0), timeout=5)
        assert float(np.asarray(idle.recv(timeout=5))[0]) == 7.0
        assert float(np.asarray(full.recv(timeout=5))[0]) == 7.0


def test_loan_times_out_naming_who_holds_the_pool():
    name = topic("loanwait")
    with tw.Publisher(name, max_buffers=2) as pub:
        a = pub.loan((4,), "uint8")
        b = pub.loan((4,), "uint8")
        with pytest.raises(TimeoutError, match="2 loan"):
            pub.loan((4,), "uint8", timeout=0.1)
        del a
        assert pub.loan((4,), "uint8", timeout=1).shape == (4,)
        del b


# ---- 5. writing through a consumer that ignores read-only --------------------------------------------------------


def test_to_torch_of_a_received_tensor_is_a_private_copy():
    torch = pytest.importorskip("torch")
    name = topic("torchwrite")
    with tw.Publisher(name) as pub, tw.Subscriber(name) as s1, tw.Subscriber(name) as s2:
        pub.send(np.arange(8, dtype=np.float32))
        t1, t2 = s1.recv(timeout=5), s2.recv(timeout=5)
        x = tw.to_torch(t1)
        x.mul_(2)  # PyTorch has no read-only tensors: this must write into a copy, not the shared buffer
        assert torch.equal(x, torch.arange(8, dtype=torch.float32) * 2)
        np.testing.assert_array_equal(np.asarray(t1), np.arange(8, dtype=np.float32))
        np.testing.assert_array_equal(np.asarray(t2), np.arange(8, dtype=np.float32))
        with pytest.raises(tw.CopyError, match="read-only"):
            tw.to_torch(t1, copy=False)
    a = np.arange(4.0)
    a.flags.writeable = False  # any read-only producer, not only a received message
    x = tw.to_torch(a)
    assert x.data_ptr() != a.ctypes.data
    x.add_(1)
    np.testing.assert_array_equal(a, np.arange(4.0))


# ---- 6. counters after close ---------------------------------------------------------------------------------------


def test_subscriber_dropped_stays_readable_after_close():
    name = topic("dropped")
    with tw.Publisher(name, depth=1, on_full="drop_oldest") as pub:
        sub = tw.Subscriber(name)
        for i in range(5):
            pub.send(np.array([i]))
        assert sub.dropped == 4
        sub.close()
        assert sub.dropped == 4 and sub.closed


# ---- 6a. a SIGKILLed subscriber never leaves a send blocked -------------------------------------------------------


def _child_hold(name, n, ready):
    sub = tw.Subscriber(name)
    ready.set()
    held = [sub.recv(timeout=30) for _ in range(n)]
    ready.set()
    time.sleep(120)
    del held


def test_send_blocked_on_a_pool_held_by_a_killed_subscriber_returns():
    name = topic("killhold")
    with tw.Publisher(name, max_buffers=2) as pub:
        ready = CTX.Event()
        child = CTX.Process(target=_child_hold, args=(name, 2, ready))
        child.start()
        try:
            assert ready.wait(30)
            ready.clear()
            deadline = time.monotonic() + 30
            while pub.subscribers < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            for i in range(2):  # (20000 bytes: a buffer each; small messages share one)
                pub.send(np.full(20000, i, np.uint8), timeout=10)
            assert ready.wait(30)  # the child holds both buffers
            outcome = []

            def blocked():
                # Bounded: without the fix it waits for the dead subscriber's buffers until TimeoutError.
                outcome.append(pub.send(np.full(20000, 9, np.uint8), timeout=30))

            th = threading.Thread(target=blocked)
            th.start()
            time.sleep(0.3)
            assert th.is_alive()
            late = tw.Subscriber(name)  # a subscriber connecting meanwhile (this used to freeze the monitor)
            os.kill(child.pid, signal.SIGKILL)
            th.join(40)
            assert not th.is_alive() and outcome == [1]  # delivered, to the late subscriber
            assert int(np.asarray(late.recv(timeout=5))[0]) == 9
            late.close()
        finally:
            child.kill()
            child.join()


# ---- 6b. a stale write into a sent loan faults instead of corrupting --------------------------------------------


def _subscribe_then_report(name, ready, out):
    with tw.Subscriber(name) as sub:
        ready.set()
        t = sub.recv(timeout=30)
        time.sleep(0.5)  # the publisher writes (and dies) meanwhile
        out.put(np.asarray(t).copy())


@pytest.mark.parametrize("how", ["array_interface", "torch_frombuffer"])
def test_a_stale_write_into_a_sent_loan_faults_and_subscribers_keep_their_data(how):
    if how == "torch_frombuffer":
        pytest.importorskip("torch")
    if UNDER_ASAN:
        pytest.skip("ASan turns the intended SIGSEGV into its own report and exit code")
    name = topic("stale")
    ready, out = CTX.Event(), CTX.Queue()
    child = CTX.Process(target=_subscribe_then_report, args=(name, ready, out))
    child.start()
    try:
        assert ready.wait(30)
        r = run_child(f"""
            import ctypes, time, numpy as np, tensorwire as tw
            pub = tw.Publisher({name!r})
            deadline = time.monotonic() + 20
            while pub.subscribers < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            buf = pub.loan((4096,), "uint8")
            if {how!r} == "array_interface":
                ptr = buf.__array_interface__["data"][0]
                stale = (ctypes.c_uint8 * 4096).from_address(ptr)   # a raw pointer: no export to count
                for i in range(4096): stale[i] = 7
            else:
                import torch
                stale = torch.frombuffer(buf, dtype=torch.uint8)    # releases its buffer view at once
                stale.fill_(7)
            pub.send(buf)
            print("sent", flush=True)
            if {how!r} == "array_interface":
                stale[0] = 9
            else:
                stale.fill_(9)
            print("wrote after send", flush=True)
        """)
        assert "sent" in r.stdout, r.stdout + r.stderr
        assert "wrote after send" not in r.stdout and r.returncode == -signal.SIGSEGV, (r.returncode, r.stdout, r.stderr)
        got = out.get(timeout=30)
        assert (got == 7).all()
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()


# ---- 6c / 10. fork() without exec ----------------------------------------------------------------------------------


@pytest.mark.skipif(UNDER_ASAN, reason="fork() of a multi-threaded ASan process is not supported by the runtime")
def test_a_forked_child_cannot_send_and_does_not_keep_the_publishers_socket():
    name = topic("fork")
    pub = tw.Publisher(name)
    sub = tw.Subscriber(name)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: refuses to send on the parent's publisher, then lingers
        code = 1
        try:
            pub.send(np.zeros(1))
        except ValueError as e:
            code = 0 if "fork" in str(e) else 2
        os.write(w, bytes([code]))
        time.sleep(5)
        os._exit(0)
    try:
        assert os.read(r, 1) == b"\x00"
        pub.send(np.ones(1))  # the parent still publishes
        assert float(np.asarray(sub.recv(timeout=5))[0]) == 1.0
        pub.close()
        with pytest.raises(EOFError):
            sub.recv(timeout=5)
        # The child still lives; had it kept a copy of the listening socket, the name would still be taken.
        again = tw.Publisher(name)
        again.close()
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        os.close(w)
        sub.close()


@pytest.mark.skipif(UNDER_ASAN, reason="fork() of a multi-threaded ASan process is not supported by the runtime")
def test_a_forked_childs_writes_to_an_inherited_loan_stay_the_childs():
    # The child's mapping of the pool was the parent's shared one: writing a loan it inherited changed what a
    # subscriber had already received, read-only, from the parent.
    name = topic("forkloan")
    pub = tw.Publisher(name)
    sub = tw.Subscriber(name)
    assert sub.connected
    loan = pub.loan(1 << 16, "uint8")
    np.asarray(loan)[:] = 1
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: once the parent has sent the loan, writes its own copy of it
        code = 1
        try:
            os.read(go_r, 1)
            view = np.asarray(loan)
            view[:] = 99
            code = 0 if int(view.min()) == 99 == int(view.max()) else 2  # its writes are its own to read
        finally:
            os.write(done_w, bytes([code]))
            os._exit(0)
    try:
        pub.send(loan)
        got = sub.recv(timeout=5)
        os.write(go_w, b"x")
        assert os.read(done_r, 1) == b"\x00"
        assert np.array_equal(np.unique(np.asarray(got)), [1]), "the child's writes reached the subscriber"
        pub.send(np.full(8, 7, np.uint8))  # the parent's pool still serves it
        assert np.asarray(sub.recv(timeout=5)).tolist() == [7] * 8
    finally:
        os.waitpid(pid, 0)
        for fd in (go_r, go_w, done_r, done_w):
            os.close(fd)
        sub.close()
        pub.close()


@pytest.mark.skipif(UNDER_ASAN, reason="fork() of a multi-threaded ASan process is not supported by the runtime")
def test_fork_while_another_thread_makes_pool_buffers_does_not_deadlock():
    # fork()'s prepare handlers took the pool-mapping registry's lock, then waited for the publisher's lock, which a
    # thread making a pool segment held while it waited for the registry's: both waited forever (in a subprocess
    # here, so that a deadlock fails the test instead of hanging the run).
    code = f"""
import os, threading, tensorwire as tw
pub = tw.Publisher({topic("forkchurn")!r}, max_buffers=1)
pub.loan(1 << 20, "uint8")  # (a first segment, dropped at once)
stop = False
def churn():
    n = 0
    while not stop:
        x = pub.loan((1 << 16) if n % 2 else (1 << 20), "uint8")  # other size classes: retire and create
        del x
        n += 1
th = threading.Thread(target=churn, daemon=True)
th.start()
for _ in range(400):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
stop = True
th.join()
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


# ---- misc. from the review ------------------------------------------------------------------------------------------


def test_timeouts_of_the_wrong_type_are_type_errors():
    name = topic("badtimeout")
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        with pytest.raises(TypeError, match="timeout"):
            sub.recv(timeout="1")
        with pytest.raises(TypeError, match="timeout"):
            pub.send(np.zeros(1), timeout="1")
        # any real number is a timeout: np.float32 was refused where np.int64 and 0-d arrays were taken
        for t in (np.float32(0.01), np.int64(0), np.array(0.01), 0):
            with pytest.raises(TimeoutError, match=f"Subscriber\\('{name}'\\): no message"):
                sub.recv(timeout=t)
        for bad in (True, 1j, b"1", np.bool_(False), np.complex64(1), np.timedelta64(1, "s")):
            with pytest.raises(TypeError, match="timeout must be None or a number of seconds"):
                sub.recv(timeout=bad)


@pytest.mark.parametrize("option,says", [("depth", "depth must be between 1 and 1048576"),
                                          ("max_subscribers", "max_subscribers must be at least 1"),
                                          ("max_buffers", "max_buffers must be between 1 and 65536"),
                                          ("pool_bytes", "pool_bytes must be at least 1")])
def test_a_publisher_limit_of_zero_is_refused_naming_it(option, says):
    # (pool_bytes=0 was accepted and served one buffer at a time, where the other two limits were refused)
    with pytest.raises(ValueError, match=says):
        tw.Publisher(topic("zero"), **{option: 0})
    with pytest.raises(ValueError, match=f"{says}, not -1"):  # (-1 was told "must be >= 0")
        tw.Publisher(topic("zero"), **{option: -1})


def test_closing_a_subscriber_says_how_many_queued_messages_it_discarded():
    # (a message of several tensors is several ring cells: it was counted once per cell, "6 unread messages" for 2)
    name = topic("closeq")
    with tw.Publisher(name) as pub:
        sub = tw.Subscriber(name)
        deadline = time.monotonic() + 30
        while not (sub.connected and pub.subscribers == 1):  # (connected takes the handshake a step each time)
            assert time.monotonic() < deadline, "never connected"
            time.sleep(0.001)
        pub.send({"a": np.zeros(3), "b": np.ones(3)})
        pub.send([np.zeros(2), np.ones(2), np.ones(1)])
        pub.send(np.arange(4))
        sub.close()
        with pytest.raises(EOFError, match=r"this subscriber was closed with 3 unread messages queued; close\(\) "
                                           r"discarded them$"):
            sub.recv(timeout=1)


def test_too_many_subscribers_are_refused_with_a_clear_error():
    name = topic("cap")
    with tw.Publisher(name, max_subscribers=1) as pub, tw.Subscriber(name):
        with pytest.raises(ValueError, match="max_subscribers"):
            tw.Subscriber(name)
        assert pub.subscribers == 1


def test_a_subscriber_refused_later_says_so_at_every_recv():
    # Made before its publisher, a subscriber hears of the refusal at its first recv; the next said "the publisher
    # broke the protocol". (Which of the two the publisher takes first is its choice: the other one is refused.)
    name = topic("caplater")
    subs = [tw.Subscriber(name), tw.Subscriber(name)]
    with tw.Publisher(name, max_subscribers=1) as pub:
        deadline = time.monotonic() + 10
        while not any([s.connected for s in subs]) and time.monotonic() < deadline:  # (a handshake step each)
            time.sleep(0.005)
        refused = [s for s in subs if not s.connected]
        assert pub.subscribers == 1 and len(refused) == 1
        with pytest.raises(ValueError, match="refused this subscriber: it already serves its max_subscribers"):
            refused[0].recv(timeout=2)
        for _ in range(2):
            with pytest.raises(EOFError, match="refused this subscriber: it already serves its max_subscribers"):
                refused[0].recv(timeout=2)
    for s in subs:
        s.close()


# ---- 9. a slow reader of control messages: the on_full policy, never dropped, never freed --------------------------
# Each new pool buffer is announced to each subscriber over its control socket, which it reads as it receives the
# messages that use the buffers. One that reads nothing while a few hundred new buffers are made fills that socket:
# the send then treats it as a full ring (block waits, raise refuses, drop_oldest drops the message for it). It was
# stopped for good, even under block.

OWN = 20000  # bytes: a buffer of its own per message (copies of at most 16 KiB share buffers)


def test_a_subscriber_too_slow_for_control_messages_is_skipped_under_drop_oldest_and_its_tensors_stay_intact():
    name = topic("slowctl")
    # A pool that holds the kept 4 KiB buffer and one 64 KiB buffer, but not a free 4 KiB one as well (and no
    # 256 KiB shared buffer: small copies get buffers of their own here).
    with tw.Publisher(name, depth=1, on_full="drop_oldest", pool_bytes=(72 << 10) - 1) as pub, \
            tw.Subscriber(name) as sub:
        pub.send(np.full(1024, 7, np.int32))
        kept = sub.recv(timeout=5)
        # Sizes that never fit each other's buffers: every send retires a segment and announces a new one, two
        # control packets this subscriber does not read (it does not call recv), until its socket buffer is full.
        sizes = [4096, 65536]
        for i in range(4000):
            pub.send(np.full(sizes[i % len(sizes)] // 4, i, np.int32), timeout=5)
            assert pub.subscribers == 1  # never stopped
        # The last messages were dropped for it (its ring is empty: the socket was full), and counted.
        with pytest.raises(TimeoutError):
            sub.recv(timeout=0.3)  # (reads its socket meanwhile: announcements reach it again)
        assert pub.dropped >= 3999 and sub.dropped == pub.dropped
        # Its lease was honoured: the buffer under `kept` was never reused.
        assert (np.asarray(kept) == 7).all()
        pub.send(np.full(1024, 9, np.int32), timeout=5)
        assert (np.asarray(sub.recv(timeout=5)) == 9).all()


def _fill_control_socket(pub, limit=2000):
    """Sends OWN-byte messages that nobody reads until one is refused; returns how many went, and the error."""
    sent = 0
    while sent < limit:
        try:
            pub.send(np.full(OWN, sent % 251, np.uint8), timeout=0.3)
        except (TimeoutError, BlockingIOError) as e:
            return sent, e
        sent += 1
    pytest.skip(f"this kernel's socket buffers held all {sent} announcements: nothing was ever refused")


def test_a_subscriber_too_slow_for_control_messages_is_waited_for_under_block():
    name = topic("slowctl-block")
    with tw.Publisher(name, depth=4096) as pub, tw.Subscriber(name) as sub:
        sent, e = _fill_control_socket(pub)
        assert isinstance(e, TimeoutError)
        assert f"subscriber pid {os.getpid()} has not read the announcements of new pool buffers" in str(e)
        assert "nobody received this message" in str(e) and pub.subscribers == 1
        # It reads: everything sent arrives in order (the refused message never does), and sends go on.
        got = [int(np.asarray(sub.recv(timeout=5))[0]) for _ in range(sent)]
        assert got == [i % 251 for i in range(sent)]
        with pytest.raises(TimeoutError):
            sub.recv(timeout=0)
        pub.send(np.full(OWN, 5, np.uint8), timeout=5)
        assert (np.asarray(sub.recv(timeout=5)) == 5).all()
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:  # a publisher that closes: the plain end
        pub.send(np.zeros(2))
        pub.close()
        sub.recv(timeout=10)
        with pytest.raises(EOFError) as e:
            sub.recv(timeout=10)
        assert str(e.value).endswith(f"end of stream: the publisher (pid {os.getpid()}) closed the topic")



def test_a_publisher_that_closes_after_a_message_was_received_closed_the_topic():
    # The ring, closed by the publisher and emptied, ended the stream before the BYE on the socket was read: the
    # subscriber said the publisher "went away without closing the topic (it exited, crashed or was killed)".
    name = topic("closed-after-recv")
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        pub.send(np.zeros(2))
        sub.recv(timeout=10)
        pub.close()
        with pytest.raises(EOFError) as e:
            sub.recv(timeout=10)
        assert str(e.value).endswith(f"end of stream: the publisher (pid {os.getpid()}) closed the topic"), e.value


def test_a_subscriber_too_slow_for_control_messages_is_refused_under_raise():
    name = topic("slowctl-raise")
    with tw.Publisher(name, depth=4096, on_full="raise") as pub, tw.Subscriber(name) as sub:
        sent, e = _fill_control_socket(pub)
        assert isinstance(e, BlockingIOError)
        assert "has not read the announcements of new pool buffers" in str(e) and "on_full='raise'" in str(e)
        got = [int(np.asarray(sub.recv(timeout=5))[0]) for _ in range(sent)]
        assert got == [i % 251 for i in range(sent)]
        pub.send(np.full(OWN, 5, np.uint8), timeout=5)
        assert (np.asarray(sub.recv(timeout=5)) == 5).all()


def test_a_slow_reader_under_block_gets_every_message_however_many_buffers_are_new():
    name = topic("slowctl-reader")
    n = 1000
    with tw.Publisher(name, depth=n) as pub, tw.Subscriber(name) as sub:
        got = []

        def reader():
            time.sleep(0.5)  # the publisher is hundreds of new buffers ahead by then
            for _ in range(n):
                got.append(int(np.asarray(sub.recv(timeout=30))[0]))

        th = threading.Thread(target=reader)
        th.start()
        for i in range(n):
            pub.send(np.full(OWN, i % 251, np.uint8), timeout=30)
        th.join(60)
        assert got == [i % 251 for i in range(n)] and pub.dropped == 0


def test_mappings_go_at_end_of_stream_not_at_close():
    name = topic("eosmaps")
    before = tw_mappings()
    sub = tw.Subscriber(name)
    with tw.Publisher(name) as pub:
        for i in range(4):
            pub.send(np.full(100000 + i * 70000, i, np.uint8))  # four segment sizes
        got = [sub.recv(timeout=5) for _ in range(4)]
        del got
    with pytest.raises(EOFError):
        sub.recv(timeout=5)
    assert tw_mappings() == before  # nothing of the ended stream is still mapped, though sub is not closed
    sub.close()


# ---- 15. one message, several tensors ------------------------------------------------------------------------------


def _collect_groups(name, n, ready, out):
    with tw.Subscriber(name) as sub:
        ready.set()
        for _ in range(n):
            m = sub.recv(timeout=30)
            if isinstance(m, dict):
                out.put(("dict", {k: (np.asarray(v).copy(), v.strides, dict(v.metadata)) for k, v in m.items()}))
            else:
                out.put((type(m).__name__, [np.asarray(v).copy() for v in m]))


def test_a_dict_of_tensors_arrives_as_one_message_with_each_layout_and_metadata():
    name = topic("group")
    ready, out = CTX.Event(), CTX.Queue()
    child = CTX.Process(target=_collect_groups, args=(name, 3, ready, out))
    child.start()
    try:
        assert ready.wait(30)
        with tw.Publisher(name) as pub:
            deadline = time.monotonic() + 30
            while pub.subscribers < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            img = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
            boxes = np.arange(8, dtype=np.float32).reshape(2, 4)[:, ::-1]
            loans = pub.loan({"mask": ((3, 4), "bool"), "stack": ((2, 5), "int64")})
            np.asarray(loans["mask"])[:] = np.eye(3, 4, dtype=bool)
            np.asarray(loans["stack"])[:] = np.arange(10).reshape(2, 5)
            stack = loans.pop("stack")
            view = stack.transpose(0, 1)  # a strided view of a loan crosses as it is (once it is its only handle)
            del stack
            m = {"image": img, "boxes": boxes, "mask": loans["mask"], "stackT": view}
            del view
            assert pub.send(m, metadata={"frame": 7}, timeout=10) == 1
            assert "spent" in repr(loans["mask"])  # sent loans are handed over
            assert pub.send([np.zeros(3), np.ones((2, 2))], timeout=10) == 1
            assert pub.send((np.full(1, 9.0),), timeout=10) == 1
        kind, got = out.get(timeout=30)
        assert kind == "dict" and list(got) == ["image", "boxes", "mask", "stackT"]
        np.testing.assert_array_equal(got["image"][0], img)
        np.testing.assert_array_equal(got["boxes"][0], boxes)
        np.testing.assert_array_equal(got["mask"][0], np.eye(3, 4, dtype=bool))
        np.testing.assert_array_equal(got["stackT"][0], np.arange(10).reshape(2, 5).T)
        assert got["stackT"][1] == (1, 5)  # the loan view's own strides, zero-copy
        assert all(v[2] == {"frame": 7} for v in got.values())
        kind, got = out.get(timeout=30)
        assert kind == "list" and [a.shape for a in got] == [(3,), (2, 2)]
        kind, got = out.get(timeout=30)
        assert kind == "tuple" and float(got[0][0]) == 9.0
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()


def test_messages_of_several_tensors_are_dropped_whole_and_never_interleave():
    name = topic("groupdrop")
    with tw.Publisher(name, depth=7, on_full="drop_oldest") as pub, tw.Subscriber(name) as sub:
        for i in range(20):  # 3 cells each: the ring of 7 keeps the last two messages
            pub.send({"a": np.full(2, i), "b": np.full(3, i)})
        got = []
        while True:
            try:
                m = sub.recv(timeout=0)
            except TimeoutError:
                break
            assert int(np.asarray(m["a"])[0]) == int(np.asarray(m["b"])[0])  # never half of one and half of another
            got.append(int(np.asarray(m["a"])[0]))
        assert got == [18, 19] and sub.dropped == 18


def test_a_list_of_numbers_is_array_data_and_a_list_of_arrays_a_message():
    # send takes what tw.asarray takes: [1, 2, 3] is one 1-d tensor, as tw.asarray([1, 2, 3]) is; a list or tuple
    # holding arrays is a message of several tensors.
    name = topic("numbers")
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        # NumPy's scalars are numbers too: [np.float32(1), np.float32(2)] was a message of two 0-d tensors where
        # [np.float64(1), np.float64(2)] (a float subclass) was one array
        for x in ([1, 2, 3], [[1.5, 2.5], [3.5, 4.5]], (True, False), [1 + 2j, 3], [[], []],
                  [np.float32(1), np.float32(2)], [np.int64(1), 2], [[1, 2], [np.float32(3), 4]],
                  (np.bool_(True), False), [np.float64(0.5), np.uint8(3)]):
            pub.send(x)
            got = sub.recv(timeout=5)
            assert isinstance(got, tw.Tensor)
            want = np.asarray(x)
            assert got.shape == want.shape and np.asarray(got).dtype == want.dtype
            assert np.array_equal(np.asarray(got), want)
        pub.send([np.zeros(2), 1])
        got = sub.recv(timeout=5)
        assert isinstance(got, list) and [t.shape for t in got] == [(2,), ()]
        pub.send([np.array(1.0), np.array(2.0)])  # 0-d arrays are arrays: a message of two
        got = sub.recv(timeout=5)
        assert isinstance(got, list) and [t.shape for t in got] == [(), ()]
        with pytest.raises(ValueError, match="np.empty"):
            pub.send([])


def test_a_message_larger_than_the_ring_is_refused_clearly():
    name = topic("groupbig")
    with tw.Publisher(name, depth=2) as pub, tw.Subscriber(name):
        with pytest.raises(ValueError, match="depth"):
            pub.send([np.zeros(1)] * 2)
        with pytest.raises(ValueError, match="empty"):
            pub.send([])


def test_message_dict_keys_cross_whole_and_a_bad_part_is_named():
    name = topic("keys")
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        # A key with a NUL arrived cut at it ('a'); a lone surrogate gave "basic_string: construction from null".
        pub.send({"a\x00b": np.zeros(2), "é": np.ones(1)})
        assert list(sub.recv(timeout=5).keys()) == ["a\x00b", "é"]
        with pytest.raises(ValueError, match=r"message dict key 'a\\udc80' is not valid Unicode text"):
            pub.send({"a\udc80": np.zeros(2)})
        with pytest.raises(TypeError, match="keys of a message dict must be str, not int"):
            pub.loan({1: (3,)})  # refused at loan, as send would refuse it
        # Which part could not be made a tensor, by key or index, with the error's own type.
        with pytest.raises(TypeError, match=r"the message's part 'b': tensorwire.asarray: cannot import an object of "
                                            r"type object"):
            pub.send({"a": np.zeros(3), "b": object()})
        with pytest.raises(TypeError, match=r"the message's part 1: .* holds values no tensor type can hold"):
            pub.send([np.zeros(3), ["x", None]])
        with pytest.raises(ValueError, match=r"the message's part 'r': "):
            pub.send({"r": [[1, 2], [3]]})  # ragged: NumPy's own ValueError, chained
        with pytest.raises(TypeError, match=r"Publisher.send: nothing to send \(None\)"):
            pub.send(None)  # (was nanobind's "incompatible function arguments")
        with pytest.raises(TimeoutError):
            sub.recv(timeout=0)  # none of the refused messages went


def test_constructor_arguments_of_the_wrong_type_are_named_in_the_error():
    # (nanobind's own answer to each was "__init__(): incompatible function arguments" and both signatures)
    bad = [
        ((None,), {}, TypeError, r"Publisher: the topic name must be a str, not NoneType"),
        ((b"topic",), {}, TypeError, r"Publisher: the topic name must be a str, not bytes"),
        (("\ud800",), {}, ValueError, r"topic name '\\ud800' is not valid Unicode text"),
        (("tw-args",), {"on_full": None}, TypeError, r"on_full must be a str, not NoneType"),
        (("tw-args",), {"token": 5}, TypeError, r"token must be None or a str"),
        (("tw-args",), {"token": ""}, ValueError, r"token must not be empty"),
        (("tw-args",), {"insecure": 1}, TypeError, r"insecure must be True or False, not int"),
        (("tw-args",), {"protect_sent_loans": None}, TypeError, r"protect_sent_loans must be True or False"),
        (("tw-args",), {"keepalive": "10"}, TypeError, r"keepalive must be a number of seconds, not str"),
        (("tw-args",), {"keepalive": float("nan")}, ValueError, r"keepalive must be a number of seconds from"),
    ]
    for args, kw, exc, text in bad:
        with pytest.raises(exc, match=text):
            tw.Publisher(*args, **kw)
    with pytest.raises(TypeError, match=r"Subscriber: the topic name must be a str, not NoneType"):
        tw.Subscriber(None)
    with pytest.raises(TypeError, match=r"keepalive must be a number of seconds, not NoneType"):
        tw.Subscriber("tw-args", keepalive=None)
    # what the checks accept: NumPy's bool for a flag, an int for seconds, NumPy's integers for counts and seconds
    with tw.Publisher("tw-args", protect_sent_loans=np.bool_(False), keepalive=5, depth=np.int64(4)) as pub, \
            tw.Subscriber("tw-args", keepalive=np.int32(5)) as sub:
        assert repr(pub) == "tensorwire.Publisher('tw-args')"
        with pytest.raises(TypeError, match="copy must be None, True or False, not int"):
            pub.send(np.zeros(2), copy=1)
        assert pub.send(np.zeros(2), timeout=np.int64(1)) == 1
        assert sub.recv(timeout=np.int64(0)).shape == (2,)


def test_end_of_stream_says_why_it_ended():
    # (EOFError said "end of stream" alone, whether the publisher closed, was killed, or this subscriber closed)
    code = "import time, tensorwire as tw; p = tw.Publisher(%r); print('up', flush=True); time.sleep(120)"
    name = topic("why-eof")
    pr = subprocess.Popen([sys.executable, "-c", code % name], stdout=subprocess.PIPE, text=True)
    try:
        assert pr.stdout.readline().strip() == "up"
        sub = tw.Subscriber(name)
        end = time.monotonic() + 30
        while not sub.connected:
            assert time.monotonic() < end, "never connected"
            with pytest.raises(TimeoutError):
                sub.recv(timeout=0.05)
        os.kill(pr.pid, signal.SIGKILL)
        with pytest.raises(EOFError, match=rf"end of stream: the publisher \(pid {pr.pid}\) went away without "
                                           r"closing the topic \(it exited, crashed or was killed\)$"):
            sub.recv(timeout=30)
    finally:
        pr.kill()
        pr.wait()
    sub.close()
    with pytest.raises(EOFError, match=r"end of stream: this subscriber was closed$"):
        sub.recv(timeout=1)


def test_closing_a_subscriber_that_never_polled_still_counts_what_its_publisher_sent_it():
    # (the handshake was never finished on our side: close() said only "this subscriber was closed")
    name = topic("closeearly")
    sub = tw.Subscriber(name)
    with tw.Publisher(name) as pub:
        deadline = time.monotonic() + 30
        while pub.subscribers < 1:
            assert time.monotonic() < deadline, "never counted"
            time.sleep(0.001)
        assert pub.send(np.zeros(3)) == 1 and pub.send(np.ones(3)) == 1
        sub.close()
        with pytest.raises(EOFError, match=r"closed with 2 unread messages queued; close\(\) discarded them$"):
            sub.recv(timeout=1)
