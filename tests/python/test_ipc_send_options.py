"""Publisher.send's copy= and stream=, loan(device=), Subscriber(device=) and Tensor.transport, on any machine
(the CUDA paths of the same options: tests/python/test_cuda_ipc.py on a GPU, and the fake driver's tests in
tests/cpp/test_cuda_host.cpp)."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest

import tensorwire as tw


@pytest.fixture
def pair():
    name = f"test/sendopts/{uuid.uuid4().hex[:12]}"
    pub = tw.Publisher(name)
    sub = tw.Subscriber(name)
    deadline = time.monotonic() + 5
    while pub.subscribers == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert pub.subscribers == 1
    yield pub, sub
    sub.close()
    pub.close()


def test_a_loan_arrives_as_shm_and_a_packed_array_as_shm_copy(pair):
    pub, sub = pair
    loan = pub.loan((2, 3), "int16")
    np.asarray(loan)[:] = np.arange(6).reshape(2, 3)
    pub.send(loan)
    t = sub.recv(timeout=5)
    assert t.transport == "shm"
    np.testing.assert_array_equal(np.asarray(t), np.arange(6).reshape(2, 3))
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    pub.send(a[:, ::2])
    t = sub.recv(timeout=5)
    assert t.transport == "shm-copy"
    np.testing.assert_array_equal(np.asarray(t), a[:, ::2])


def test_copy_false_refuses_what_is_not_a_loan_and_nobody_gets_it(pair):
    pub, sub = pair
    with pytest.raises(tw.CopyError, match="loan"):
        pub.send(np.zeros(4), copy=False)
    with pytest.raises(TimeoutError):
        sub.recv(timeout=0)
    loan = pub.loan(4, "float64")
    np.asarray(loan)[:] = 2.5
    assert pub.send(loan, copy=False) == 1
    t = sub.recv(timeout=5)
    assert t.transport == "shm"
    assert np.asarray(t).tolist() == [2.5] * 4


def test_copy_false_refuses_without_subscribers_too():
    with tw.Publisher(f"test/sendopts/{uuid.uuid4().hex[:12]}") as pub:
        with pytest.raises(tw.CopyError):
            pub.send(np.zeros(3), copy=False)


def test_copy_true_copies_a_loan_and_leaves_it_usable(pair):
    pub, sub = pair
    loan = pub.loan(3, "int32")
    np.asarray(loan)[:] = [1, 2, 3]
    pub.send(loan, copy=True)
    t = sub.recv(timeout=5)
    assert t.transport == "shm-copy"
    np.asarray(loan)[:] = [7, 8, 9]  # the loan is still ours: the message holds a copy
    assert np.asarray(t).tolist() == [1, 2, 3]
    pub.send(loan)
    assert np.asarray(sub.recv(timeout=5)).tolist() == [7, 8, 9]


def test_stream_is_refused_for_host_tensors(pair):
    pub, sub = pair
    with pytest.raises(ValueError, match="stream"):
        pub.send(np.zeros(2), stream=1)
    with pytest.raises(TypeError):
        pub.send(np.zeros(2), stream="fast")


def test_a_subscriber_on_cpu_receives_host_tensors_without_a_copy():
    name = f"test/sendopts/{uuid.uuid4().hex[:12]}"
    with tw.Publisher(name) as pub, tw.Subscriber(name, device="cpu") as sub:
        deadline = time.monotonic() + 5
        while pub.subscribers == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        loan = pub.loan((2, 2), "uint8")
        np.asarray(loan)[:] = 9
        pub.send(loan)
        t = sub.recv(timeout=5)
        assert t.device == tw.Device("cpu")
        assert t.transport == "shm"


@pytest.mark.skipif(tw.cuda.is_available(), reason="this machine has a GPU (test_cuda_ipc.py covers it)")
def test_a_device_loan_without_a_gpu_says_why():
    with tw.Publisher(f"test/sendopts/{uuid.uuid4().hex[:12]}") as pub:
        with pytest.raises(BufferError, match="cuda:0"):
            pub.loan((2, 2), "float32", device="cuda:0")


def test_bad_devices_are_named():
    with tw.Publisher(f"test/sendopts/{uuid.uuid4().hex[:12]}") as pub:
        with pytest.raises(ValueError, match="unknown device"):
            pub.loan(2, device="gpu7")
    with pytest.raises(ValueError, match="unknown device"):
        tw.Subscriber("x", device="bogus")


@pytest.mark.parametrize("kw", ["depth", "max_metadata_bytes", "max_buffers", "pool_bytes", "max_subscribers"])
def test_publisher_sizes_that_are_not_counts_are_named(kw):
    # (nanobind's own answer to -1 for a size was "incompatible function arguments", naming nothing)
    name = f"tw-test-sizes-{uuid.uuid4().hex[:8]}"
    rule = {"depth": "between 1 and 1048576", "max_buffers": "between 1 and 65536", "pool_bytes": "at least 1",
            "max_subscribers": "at least 1"}.get(kw, ">= 0")  # (the words 0 gets, where 0 is refused too)
    with pytest.raises(ValueError, match=f"{kw} must be {rule}, not -1"):
        tw.Publisher(name, **{kw: -1})
    with pytest.raises(ValueError, match=f"{kw} .* does not fit in 64 bits"):
        tw.Publisher(name, **{kw: 2**70})
    with pytest.raises(TypeError, match=f"{kw} must be an int, not float"):
        tw.Publisher(name, **{kw: 2.0})
    with pytest.raises(ValueError, match="max_message_bytes must be >= 0, not -1"):
        tw.Subscriber(name, max_message_bytes=-1)
