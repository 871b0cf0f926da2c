"""CUDA tensors between real processes (issue 10) on a GPU: the seed bug (a plane of a torch.stack result arrives
with its offset), every layout from PyTorch and CuPy producers, four subscribers, metadata, expandable segments,
ordering against a kernel still running when send returns, device loans, and SIGKILL of a subscriber with no
device memory leaked. Skips on a machine without a CUDA device (TW_REQUIRE_CUDA=1 makes that a failure); the
bookkeeping runs everywhere against a fake driver (tests/cpp/test_cuda_host.cpp, FakeDriver.Ipc*)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import uuid

import numpy as np
import pytest

import tensorwire as tw

REQUIRED = os.environ.get("TW_REQUIRE_CUDA") == "1"
pytestmark = pytest.mark.skipif(not REQUIRED and not tw.cuda.is_available(),
                                reason=f"no CUDA device: {tw.cuda.status()}")

SLEEP_CYCLES = 300_000_000  # ~0.15 s of GPU time: a consumer not ordered after it reads the old values
CTX = mp.get_context("spawn")


def topic(what: str) -> str:
    return f"test/cudaipc/{what}/{uuid.uuid4().hex[:10]}"


def _receiver(name, n, ready, out, device=None, connect=None):
    # A subscriber process: receives n tensors and sends back (values, transport, device, metadata). With
    # `connect`, a remote subscriber (UCX), ready once its publisher counts it.
    import torch

    import tensorwire as tw2
    kw = {"device": device} if device else {}
    if connect:
        kw["connect"] = connect
    sub = tw2.Subscriber(name, **kw)
    ready.set()
    for _ in range(n):
        t = sub.recv(timeout=30)
        if t.device.type == "cuda":
            y = torch.from_dlpack(t)  # waits on the publisher's event (a stream the consumer uses)
            vals = y.cpu().numpy()
        else:
            vals = np.asarray(t).copy()
        out.put((vals, t.transport, str(t.device), dict(t.metadata)))


def start_receivers(name, n, k=1, device=None):
    out = CTX.Queue()
    procs, readies = [], []
    for _ in range(k):
        ready = CTX.Event()
        p = CTX.Process(target=_receiver, args=(name, n, ready, out, device), daemon=True)
        p.start()
        procs.append(p)
        readies.append(ready)
    for r in readies:
        assert r.wait(60)
    return procs, out


def wait_subscribers(pub, k):
    deadline = time.monotonic() + 30
    while pub.subscribers < k and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pub.subscribers == k


def test_the_second_plane_of_a_stack_arrives_as_six_to_eleven():
    torch = pytest.importorskip("torch")
    name = topic("seed")
    with tw.Publisher(name) as pub:
        procs, out = start_receivers(name, 1)
        wait_subscribers(pub, 1)
        a = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)
        b = torch.arange(6, 12, dtype=torch.float32, device="cuda").reshape(2, 3)
        x = torch.stack([a, b])
        pub.send(x[1], metadata={"step": 7})
        vals, transport, device, meta = out.get(timeout=30)
        np.testing.assert_array_equal(vals, np.arange(6, 12, dtype=np.float32).reshape(2, 3))
        assert transport == "cuda-ipc"
        assert device == "cuda:0"
        assert meta == {"step": 7}
        for p in procs:
            p.join(30)


def test_a_subscriber_in_the_publishers_own_process():
    # The driver opens no IPC handle in the process that exported it (CUDA_ERROR_INVALID_CONTEXT): a subscriber
    # beside its publisher takes the publisher's event and allocation as they are (VMM loans: imported from the fd).
    torch = pytest.importorskip("torch")
    name = topic("oneprocess")
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        x = torch.stack([torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3),
                         torch.arange(6, 12, dtype=torch.float32, device="cuda").reshape(2, 3)])
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            torch.cuda._sleep(SLEEP_CYCLES)
            x.add_(1)  # still running when send returns: the receive side waits on the publisher's event
        pub.send(x[1], stream=s)
        t = sub.recv(timeout=10)
        assert t.transport == "cuda-ipc"
        torch.testing.assert_close(torch.from_dlpack(t).cpu(), torch.arange(7, 13, dtype=torch.float32).reshape(2, 3))
        buf = pub.loan((4, 5), "float32", device="cuda:0")
        torch.from_dlpack(buf).copy_(torch.arange(20, dtype=torch.float32, device="cuda").reshape(4, 5))
        pub.send(buf, stream=torch.cuda.current_stream())
        v = sub.recv(timeout=10)
        assert v.transport == "cuda-vmm"
        torch.testing.assert_close(torch.from_dlpack(v).cpu(), torch.arange(20, dtype=torch.float32).reshape(4, 5))


def test_every_layout_from_torch_and_cupy_and_four_subscribers():
    torch = pytest.importorskip("torch")
    name = topic("layouts")
    base = torch.arange(4 * 6 * 5, dtype=torch.float32, device="cuda").reshape(4, 6, 5)
    views = [base, base[1], base[:, 2:5], base.permute(2, 0, 1), base[:, ::2, 1:], base[2:3].expand(3, 6, 5),
             base[..., 3]]
    expected = [v.cpu().numpy() for v in views]
    cupy_views = []
    try:
        import cupy
        c = cupy.arange(40, dtype=cupy.int32).reshape(5, 8)
        cupy_views = [c[::-1], c[:, ::-3], c.T]
        expected += [cupy.asnumpy(v) for v in cupy_views]
    except ImportError:
        pass
    with tw.Publisher(name, depth=32) as pub:
        procs, out = start_receivers(name, len(expected), k=4)
        wait_subscribers(pub, 4)
        for v in views + cupy_views:
            pub.send(v)
        got = [out.get(timeout=30) for _ in range(4 * len(expected))]
        for p in procs:
            p.join(30)
    by_shape = {}
    for vals, transport, _, _ in got:
        assert transport in ("cuda-ipc", "cuda-vmm", "cuda-copy")
        by_shape.setdefault(vals.tobytes(), 0)
        by_shape[vals.tobytes()] += 1
    for e in expected:
        assert by_shape.get(np.ascontiguousarray(e).tobytes(), 0) >= 4, f"a {e.shape} view did not arrive intact"


def test_a_kernel_still_writing_when_send_returns_is_waited_for():
    torch = pytest.importorskip("torch")
    name = topic("order")
    with tw.Publisher(name) as pub:
        procs, out = start_receivers(name, 1)
        wait_subscribers(pub, 1)
        s = torch.cuda.Stream()
        x = torch.zeros(1 << 20, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            torch.cuda._sleep(SLEEP_CYCLES)
            x.fill_(3.0)
        pub.send(x, stream=s)  # returns at once; the subscriber's stream waits on the event
        vals, _, _, _ = out.get(timeout=30)
        assert (vals == 3.0).all()
        for p in procs:
            p.join(30)


def test_a_device_loan_crosses_without_a_copy():
    torch = pytest.importorskip("torch")
    name = topic("loan")
    with tw.Publisher(name) as pub:
        procs, out = start_receivers(name, 1)
        wait_subscribers(pub, 1)
        buf = pub.loan((8, 3, 4), "float16", device="cuda:0")
        # (a temporary view: send refuses a loan that still has live exports, which could write it after the send)
        torch.from_dlpack(buf).copy_(torch.arange(96, device="cuda", dtype=torch.float16).reshape(8, 3, 4))
        pub.send(buf, stream=torch.cuda.current_stream())
        vals, transport, _, _ = out.get(timeout=30)
        assert transport == "cuda-vmm"
        np.testing.assert_array_equal(vals, np.arange(96, dtype=np.float16).reshape(8, 3, 4))
        for p in procs:
            p.join(30)


def test_a_cpu_subscriber_receives_a_host_copy():
    torch = pytest.importorskip("torch")
    name = topic("cpu")
    with tw.Publisher(name) as pub:
        procs, out = start_receivers(name, 1, device="cpu")
        wait_subscribers(pub, 1)
        pub.send(torch.arange(10, device="cuda").reshape(2, 5).T)
        vals, transport, device, _ = out.get(timeout=30)
        assert device == "cpu" and transport == "cuda-ipc"
        np.testing.assert_array_equal(vals, np.arange(10).reshape(2, 5).T)
        for p in procs:
            p.join(30)


def _expandable_sender(name, ready, done):
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch

    import tensorwire as tw2
    with tw2.Publisher(name) as pub:
        ready.set()
        deadline = time.monotonic() + 30
        while pub.subscribers == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        x = torch.arange(1000, dtype=torch.float32, device="cuda")
        pub.send(x[100:200])
        done.wait(60)


def test_expandable_segments_cross_by_their_posix_handle():
    pytest.importorskip("torch")
    name = topic("expandable")
    ready, done = CTX.Event(), CTX.Event()
    p = CTX.Process(target=_expandable_sender, args=(name, ready, done), daemon=True)
    p.start()
    assert ready.wait(60)
    with tw.Subscriber(name) as sub:
        t = sub.recv(timeout=60)
        import torch
        vals = torch.from_dlpack(t).cpu().numpy()
        np.testing.assert_array_equal(vals, np.arange(100, 200, dtype=np.float32))
        assert t.transport in ("cuda-vmm", "cuda-copy"), t.transport
        del t
    done.set()
    p.join(30)


def test_sigkill_of_a_subscriber_leaks_no_device_memory():
    torch = pytest.importorskip("torch")
    name = topic("kill")
    free_before = torch.cuda.mem_get_info()[0]
    with tw.Publisher(name) as pub:
        procs, out = start_receivers(name, 1000)
        wait_subscribers(pub, 1)
        for _ in range(4):
            buf = pub.loan(1 << 22, "float32", device="cuda:0")
            torch.from_dlpack(buf).fill_(1.0)
            pub.send(buf, stream=torch.cuda.current_stream())
        out.get(timeout=30)
        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].join(30)
        deadline = time.monotonic() + 30
        while pub.subscribers and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pub.subscribers == 0
    torch.cuda.synchronize()
    tw.cuda.empty_cache()
    # (the killed process's context and the loans, returned by tensorwire's releaser once their work is done, are
    # freed asynchronously: bounded wait)
    deadline = time.monotonic() + 15
    while torch.cuda.mem_get_info()[0] < free_before - (64 << 20) and time.monotonic() < deadline:
        time.sleep(0.05)
    free_after = torch.cuda.mem_get_info()[0]
    assert free_after >= free_before - (64 << 20), (free_before, free_after)


def _slow_reader(name, ready, out):
    # Takes the first message, queues a long kernel and then a read of it on its stream, and drops the tensor at
    # once (PyTorch calls the DLPack deleter when the Python object goes, not when its kernels finish).
    import torch

    import tensorwire as tw2
    sub = tw2.Subscriber(name)
    ready.set()
    t = sub.recv(timeout=30)
    y = torch.from_dlpack(t)
    torch.cuda._sleep(SLEEP_CYCLES)
    z = y.clone()  # runs after the sleep: the publisher must not have rewritten the buffer by then
    del y, t
    out.put("released")
    second = sub.recv(timeout=30)
    out.put((z.cpu().numpy(), torch.from_dlpack(second).cpu().numpy()))


def test_a_lease_goes_back_only_after_the_consumers_kernels_read_it():
    torch = pytest.importorskip("torch")
    name = topic("release")
    with tw.Publisher(name, max_buffers=1) as pub:
        out, ready = CTX.Queue(), CTX.Event()
        p = CTX.Process(target=_slow_reader, args=(name, ready, out), daemon=True)
        p.start()
        assert ready.wait(60)
        wait_subscribers(pub, 1)
        buf = pub.loan(1 << 20, "float32", device="cuda:0")
        torch.from_dlpack(buf).fill_(1.0)
        pub.send(buf, stream=torch.cuda.current_stream())
        assert out.get(timeout=30) == "released"
        # The only buffer comes back once the reader's kernels are done, not when it dropped the tensor.
        buf = pub.loan(1 << 20, "float32", device="cuda:0", timeout=30)
        torch.from_dlpack(buf).fill_(2.0)
        pub.send(buf, stream=torch.cuda.current_stream())
        first, second = out.get(timeout=30)
        assert (first == 1.0).all(), "the publisher rewrote the buffer under the reader's kernel"
        assert (second == 2.0).all()
        p.join(30)


def _late_reader(name, got, go, out):
    import torch

    import tensorwire as tw2
    sub = tw2.Subscriber(name)
    t = sub.recv(timeout=30)
    got.set()
    assert go.wait(60)
    out.put(torch.from_dlpack(t).cpu().numpy())


def test_a_closed_publisher_keeps_a_torch_tensor_alive_for_its_subscriber():
    # Closing the publisher must not hand the caller's memory back to PyTorch's caching allocator while a
    # subscriber still holds the tensor: the next allocation of that size would reuse (and overwrite) it.
    torch = pytest.importorskip("torch")
    name = topic("linger")
    got, go, out = CTX.Event(), CTX.Event(), CTX.Queue()
    p = CTX.Process(target=_late_reader, args=(name, got, go, out), daemon=True)
    pub = tw.Publisher(name)
    p.start()
    wait_subscribers(pub, 1)
    x = torch.stack([torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3),
                     torch.arange(6, 12, dtype=torch.float32, device="cuda").reshape(2, 3)])
    pub.send(x[1])
    assert got.wait(60)
    pub.close()
    del pub, x
    junk = [torch.full((2, 2, 3), -1.0, device="cuda") for _ in range(64)]  # would reuse a freed block
    torch.cuda.synchronize()
    go.set()
    np.testing.assert_array_equal(out.get(timeout=30), np.arange(6, 12, dtype=np.float32).reshape(2, 3))
    del junk
    p.join(30)


def _listening_publisher(name: str, direct: bool):
    """A publisher listening on loopback, or a skip where this build or machine has no network transport. With
    TW_TEST_UCX_CUDA=1 (`direct`) a UCX was bundled for the run: a build without UCX's headers is then a failure."""
    try:
        return tw.Publisher(name, listen="127.0.0.1:0")
    except Exception as e:  # noqa: BLE001
        if "UCX is not installed" in str(e) or ("built without UCX" in str(e) and not direct):
            pytest.skip(f"no network transport here: {e}")
        raise


def test_a_cuda_tensor_crosses_to_a_remote_subscriber_and_says_how():
    # Debian's UCX has no CUDA transports (issue 12): the tensor crosses packed into pinned host memory and goes
    # back to its device on the other side, or stays in host memory for a subscriber that asked for the CPU. With
    # a UCX that has them (scripts/test-gpu.sh puts the libucx-cu13 wheel's first on the library path and sets
    # TW_TEST_UCX_CUDA=1), it crosses from device memory to device memory: "ucx-cuda".
    torch = pytest.importorskip("torch")
    direct = os.environ.get("TW_TEST_UCX_CUDA") == "1"
    name = topic("remote")
    pub = _listening_publisher(name, direct)
    with pub:
        sub = tw.Subscriber(name, connect=pub.address)
        host = tw.Subscriber(name, connect=pub.address, device="cpu")
        deadline = time.monotonic() + 20
        while pub.remote_subscribers < 2:
            assert time.monotonic() < deadline, "the remote subscribers did not connect"
            time.sleep(0.005)
        x = torch.arange(24, dtype=torch.float32, device="cuda").reshape(4, 6).t()[1::2]  # strided, offset
        pub.send(x, {"k": 5})
        t = sub.recv(timeout=20)
        # (24 bytes: UCX may deliver them eagerly, in its host memory, and then they are staged on this side)
        assert t.transport in (("ucx-cuda", "ucx-staged") if direct else ("ucx-staged",))
        assert str(t.device) == "cuda:0"
        assert t.metadata["k"] == 5
        assert torch.equal(torch.from_dlpack(t), x)
        h = host.recv(timeout=20)
        assert h.transport == "ucx-staged" and str(h.device) == "cpu"
        np.testing.assert_array_equal(np.asarray(h), x.cpu().numpy())
        # 4 KiB (eager or not, as UCX decides) and 16 MiB (a rendezvous: device memory to device memory, direct).
        for n in (1 << 10, 1 << 22):
            y = torch.arange(n, dtype=torch.float32, device="cuda") * 3 - 1
            pub.send(y)
            t = sub.recv(timeout=20)
            if direct and n > 1 << 10:
                assert t.transport == "ucx-cuda"
            else:
                assert t.transport in (("ucx-cuda", "ucx-staged") if direct else ("ucx-staged",))
            assert torch.equal(torch.from_dlpack(t), y)
            np.testing.assert_array_equal(np.asarray(host.recv(timeout=20)), y.cpu().numpy())
        # Ordering: a kernel still writing when send is called. The staging copy runs after it, on stream= or on
        # the stream current at send (the one the tensor is imported with); a copy not ordered after the kernel
        # would stage the zeros.
        s = torch.cuda.Stream()
        for how in ("stream=", "current stream"):
            y = torch.zeros(1 << 16, device="cuda")
            torch.cuda.synchronize()
            with torch.cuda.stream(s):
                torch.cuda._sleep(SLEEP_CYCLES)
                y.fill_(7.0)
                if how == "current stream":
                    pub.send(y)
            if how == "stream=":
                pub.send(y, stream=s)
            got = host.recv(timeout=20)
            assert (np.asarray(got) == 7.0).all(), f"the staging copy ({how}) read before the kernel wrote"
            assert (torch.from_dlpack(sub.recv(timeout=20)) == 7.0).all()
        sub.close()
        host.close()


def test_a_cuda_tensor_reaches_a_remote_subscriber_in_another_process():
    # The same across processes (what issue 12 is for): a device loan, filled on a stream, and the second plane of a
    # stack, 16 MiB each, received by a subscriber process over UCX. With a UCX that moves CUDA memory
    # (TW_TEST_UCX_CUDA=1) they cross device memory to device memory; else staged. Either way, values, device and
    # metadata arrive as sent.
    torch = pytest.importorskip("torch")
    direct = os.environ.get("TW_TEST_UCX_CUDA") == "1"
    name = topic("remote-proc")
    pub = _listening_publisher(name, direct)
    with pub:
        out = CTX.Queue()
        ready = CTX.Event()
        p = CTX.Process(target=_receiver, args=(name, 2, ready, out, None, pub.address), daemon=True)
        p.start()
        assert ready.wait(60)
        deadline = time.monotonic() + 30
        while pub.remote_subscribers < 1:
            assert time.monotonic() < deadline, "the remote subscriber process did not connect"
            time.sleep(0.01)
        n = 1 << 22
        loan = pub.loan((n,), "float32", device="cuda:0")
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            torch.cuda._sleep(SLEEP_CYCLES)  # still writing when send is called: send waits for stream=
            torch.from_dlpack(loan).copy_(torch.arange(n, dtype=torch.float32, device="cuda"))
        pub.send(loan, {"step": 1}, stream=s)
        a = torch.arange(n, dtype=torch.float32, device="cuda")
        stacked = torch.stack([a, a * 2 + 1])
        pub.send(stacked[1], {"step": 2})
        want = {1: np.arange(n, dtype=np.float32), 2: np.arange(n, dtype=np.float32) * 2 + 1}
        for _ in range(2):
            vals, transport, device, meta = out.get(timeout=30)
            assert device == "cuda:0"
            assert transport == ("ucx-cuda" if direct else "ucx-staged")
            np.testing.assert_array_equal(vals, want[meta["step"]])
        p.join(30)
        assert p.exitcode == 0
