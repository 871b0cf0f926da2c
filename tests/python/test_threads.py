"""The copy engine's thread pool: results independent of the thread count, the GIL released during big copies,
concurrent callers, and fork safety. No assertion here depends on timing."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

import tensorwire as tw
from _helpers import UNDER_ASAN, same_bits

BIG = 256 << 20 if not UNDER_ASAN else 64 << 20  # bytes for the GIL test (the ASan build is a slow Debug build)


def transposed_f32(n_bytes: int, seed: int = 0) -> np.ndarray:
    side = int((n_bytes // 4) ** 0.5)
    a = np.random.default_rng(seed).standard_normal((side, side), dtype=np.float32)
    return a.T


@pytest.fixture(autouse=True)
def _default_threads():
    yield
    tw.set_num_threads(0)


def test_set_and_get_num_threads():
    tw.set_num_threads(1)
    assert tw.get_num_threads() == 1
    tw.set_num_threads(3)
    assert tw.get_num_threads() == 3
    tw.set_num_threads(0)
    assert tw.get_num_threads() == os.cpu_count()
    tw.set_num_threads(-4)
    assert tw.get_num_threads() == os.cpu_count()
    tw.set_num_threads(-(2**62))  # (any n <= 0, even one beyond C int)
    assert tw.get_num_threads() == os.cpu_count()
    for n in (1025, 2**40):  # beyond C int too: a ValueError naming it, not a binding error
        with pytest.raises(ValueError, match=f"at most 1024 threads.*not {n}"):
            tw.set_num_threads(n)
    with pytest.raises(TypeError, match="must be an int"):
        tw.set_num_threads("2")


@pytest.mark.parametrize(
    "make",
    [
        lambda: transposed_f32(12 << 20),  # a 2-D transpose, 12 MiB
        lambda: np.arange(2 * 64 * 128 * 160, dtype=np.float64).reshape(2, 64, 128, 160).transpose(0, 2, 3, 1),
        lambda: np.frombuffer(np.random.default_rng(1).bytes(24 << 20), np.uint8).reshape(4096, 6144)[:, ::2],
        lambda: np.broadcast_to(np.arange(4096, dtype=np.int32), (3000, 4096)),
        lambda: np.arange(3 << 20, dtype=np.int64).reshape(1024, 3072)[::-1, 1:],
    ],
    ids=["transpose-f32", "nchw-nhwc-f64", "every-other-u8", "expand-i32", "reversed-offset-i64"],
)
def test_thread_count_does_not_change_results(make):
    v = make()
    assert v.nbytes > 8 << 20 or v.size * v.itemsize > 8 << 20
    t = tw.asarray(v)
    results = []
    for n in (1, 2, 3):
        tw.set_num_threads(n)
        c = t.contiguous()
        assert c is not t and c.is_contiguous()
        results.append(np.asarray(c).tobytes())
        f = t.copy("F")
        assert same_bits(np.asarray(f), v)
    assert results[0] == results[1] == results[2] == v.tobytes()


def test_gil_released_during_big_copy():
    """A second Python thread makes progress while contiguous() runs. The switch interval is raised so the main
    thread keeps the GIL unless it releases it: then the counter can only move during the copy if the copy
    releases the GIL."""
    v = transposed_f32(BIG)
    t = tw.asarray(v)
    counter = 0
    stop = threading.Event()
    started = threading.Event()
    tick = threading.Event()  # never set: waiting on it with a timeout releases the GIL between increments

    def spin():
        nonlocal counter
        started.set()
        while not stop.is_set():
            counter += 1
            tick.wait(0.0005)

    old = sys.getswitchinterval()
    old_threads = tw.get_num_threads()
    tw.set_num_threads(1)  # (the copy on this thread alone: a core stays free for the counting thread)
    th = threading.Thread(target=spin, daemon=True)
    advanced = []
    try:
        th.start()
        started.wait()
        sys.setswitchinterval(30.0)
        for _ in range(3):
            before = counter
            c = t.contiguous()  # the GIL must be released here...
            advanced.append(counter - before)  # ...or nothing else could have run since `before`
            del c
            if advanced[-1] > 0:
                break
    finally:
        sys.setswitchinterval(old)
        tw.set_num_threads(old_threads)
        stop.set()
        th.join()
    assert any(a > 0 for a in advanced), f"the other thread never ran during {len(advanced)} big copies"


def test_gil_held_for_small_copies_is_still_correct():
    v = np.arange(100, dtype=np.float32).reshape(10, 10).T
    assert same_bits(np.asarray(tw.asarray(v).contiguous()), np.ascontiguousarray(v))


def test_concurrent_callers_each_get_correct_results():
    tw.set_num_threads(2)
    inputs = [transposed_f32(6 << 20, seed=i) for i in range(4)]
    expected = [np.ascontiguousarray(v).tobytes() for v in inputs]
    errors: list = []

    def work(i):
        try:
            for _ in range(3):
                out = np.asarray(tw.asarray(inputs[i]).contiguous())
                if out.tobytes() != expected[i]:
                    errors.append(f"thread {i}: wrong result")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors


def test_changing_thread_count_while_copies_run():
    v = transposed_f32(8 << 20)
    expected = np.ascontiguousarray(v).tobytes()
    stop = threading.Event()
    errors: list = []

    def copier():
        while not stop.is_set():
            if np.asarray(tw.asarray(v).contiguous()).tobytes() != expected:
                errors.append("wrong result")

    th = threading.Thread(target=copier)
    th.start()
    try:
        for n in [1, 2, 3, 1, 2, 0, 2, 1]:
            tw.set_num_threads(n)
            assert np.asarray(tw.asarray(v).contiguous()).tobytes() == expected
    finally:
        stop.set()
        th.join()
    assert not errors


def _wait_child(pid: int, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child did not finish within {timeout} s (a deadlock in the thread pool after fork?)")


def _child_copy_and_exit(v: np.ndarray, expected: bytes) -> None:
    """Runs in the forked child: a parallel copy, checked, then _exit (never returns into pytest)."""
    code = 1
    try:
        tw.set_num_threads(2)
        out = np.asarray(tw.asarray(v).contiguous())
        tw.set_num_threads(3)
        out2 = np.asarray(tw.asarray(v).copy("F"))
        code = 0 if out.tobytes() == expected and same_bits(out2, v) else 2
    except BaseException:
        code = 3
    finally:
        os._exit(code)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # JAX warns that os.fork() and threads do not mix
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_fork_after_parallel_copy():
    tw.set_num_threads(2)
    v = transposed_f32(12 << 20)
    expected = np.ascontiguousarray(v).tobytes()
    assert np.asarray(tw.asarray(v).contiguous()).tobytes() == expected  # the pool now exists and has run
    pid = os.fork()
    if pid == 0:
        _child_copy_and_exit(v, expected)
    assert _wait_child(pid) == 0
    # the parent's pool still works after the fork
    assert np.asarray(tw.asarray(v).contiguous()).tobytes() == expected


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.skipif(UNDER_ASAN, reason="GCC 12's AddressSanitizer does not lock its allocator around fork(): a fork while "
                    "the other thread allocates can leave the child's allocator locked (the release run covers this)")
def test_fork_while_another_thread_copies():
    tw.set_num_threads(2)
    v = transposed_f32(12 << 20)
    expected = np.ascontiguousarray(v).tobytes()
    stop = threading.Event()
    running = threading.Event()

    def copier():
        while not stop.is_set():
            tw.asarray(v).contiguous()
            running.set()

    th = threading.Thread(target=copier)
    th.start()
    try:
        running.wait()
        codes = []
        for _ in range(3):  # fork at a few different moments of the other thread's copies
            pid = os.fork()
            if pid == 0:
                _child_copy_and_exit(v, expected)
            codes.append(_wait_child(pid))
    finally:
        stop.set()
        th.join()
    assert codes == [0, 0, 0]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_multiprocessing_fork_context():
    import multiprocessing as mp

    tw.set_num_threads(2)
    v = transposed_f32(12 << 20)
    tw.asarray(v).contiguous()
    ctx = mp.get_context("fork")
    p = ctx.Process(target=_mp_child, args=(v, np.ascontiguousarray(v).tobytes()))
    p.start()
    p.join(120)
    if p.is_alive():
        p.kill()
        p.join()
        pytest.fail("the multiprocessing child hung")
    assert p.exitcode == 0


def _mp_child(v, expected):
    tw.set_num_threads(2)
    sys.exit(0 if np.asarray(tw.asarray(v).contiguous()).tobytes() == expected else 1)


def test_a_thread_count_past_the_limit_is_a_value_error_and_changes_nothing():
    # 100000 threads once stalled the process (and the machine's thread limit) at the next large copy.
    tw.set_num_threads(2)
    try:
        for n in (1025, 100000):
            with pytest.raises(ValueError, match="at most 1024 threads"):
                tw.set_num_threads(n)
        assert tw.get_num_threads() == 2
    finally:
        tw.set_num_threads(0)
