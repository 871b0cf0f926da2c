"""Soak and fault runs of tw.Publisher / tw.Subscriber across real processes.

  fanout   one publisher, N subscriber processes; every message carries its sequence number and a payload derived
           from it (random sizes and layouts from a seeded generator; some are loans, some messages of two tensors). Each subscriber checks that nothing is lost,
           duplicated, reordered or corrupted.
  kill     rounds that SIGKILL the subscriber or the publisher process at a random point (seeded). The survivor
           must never hang (every wait is bounded), must see what the protocol promises (a live publisher goes on
           and gets its buffers back; a subscriber sees end-of-stream with every received tensor intact), and must
           end each round with the fds, tensorwire mappings and /dev/shm entries it started with.

The outcome never depends on timing: the kill points are random, the assertions hold at every one of them. `make test`
runs a bounded version (tests/python/test_ipc_soak.py); `make soak` runs long ones:

    python tests/soak/ipc_soak.py fanout --subscribers 4 --messages 200000 --seed 1
    python tests/soak/ipc_soak.py kill --rounds 500 --seed 1
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import sys
import time
import uuid
import zlib

import numpy as np

import tensorwire as tw

CTX = mp.get_context("spawn")
WAIT = 30.0  # bound on every single wait


def topic(what: str) -> str:
    return f"soak/{os.getpid()}/{what}/{uuid.uuid4().hex[:8]}"


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def tw_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("memfd:tensorwire" in line for line in f)


def shm_entries() -> int:
    """Entries of tensorwire's in /dev/shm: there must never be any (its memory is memfds, unnamed)."""
    try:
        return sum("tensorwire" in e or e.startswith("tw") for e in os.listdir("/dev/shm"))
    except FileNotFoundError:
        return 0


def fd_targets() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return sorted(out)


def payload(seq: int, rng: random.Random) -> np.ndarray:
    """A message whose content is a function of seq; some are strided views (reversed, every other column)."""
    n = rng.choice([1, 7, 64, 1000, 4096, 70000])
    base = (np.arange(n, dtype=np.uint32) * 2654435761 + seq) & 0xFFFFFFFF
    kind = rng.randrange(3)
    if kind == 1:
        return base[::-1]
    if kind == 2 and n % 2 == 0:
        return base.reshape(2, -1)[:, ::2]
    return base


def checksum(a: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(a).tobytes())


# ---- fan-out ---------------------------------------------------------------------------------------------------------


def _fanout_subscriber(name: str, ready, out) -> None:
    errors, count, expect = [], 0, 0
    with tw.Subscriber(name) as sub:
        ready.set()
        while True:
            try:
                t = sub.recv(timeout=WAIT)
            except EOFError:
                break
            except TimeoutError:
                errors.append(f"no message within {WAIT}s after {count}")
                break
            if isinstance(t, dict):  # a message of two tensors: the payload and a loaned copy of it, reversed
                seq = t["x"].metadata["seq"]
                if t["rev"].metadata["seq"] != seq or not np.array_equal(np.asarray(t["rev"]), np.asarray(t["x"])[::-1]):
                    errors.append(f"message {seq}: the parts of a message disagree")
                t = t["x"]
            seq = t.metadata["seq"]
            if seq != expect:
                errors.append(f"expected message {expect}, got {seq}")
                expect = seq
            if checksum(np.asarray(t)) != t.metadata["crc"]:
                errors.append(f"message {seq}: checksum mismatch")
            expect += 1
            count += 1
    out.put((count, errors[:10]))


def fanout(subscribers: int, messages: int, seed: int) -> None:
    rng = random.Random(seed)
    name = topic("fanout")
    ready = [CTX.Event() for _ in range(subscribers)]
    out = CTX.Queue()
    procs = [CTX.Process(target=_fanout_subscriber, args=(name, ready[i], out)) for i in range(subscribers)]
    with tw.Publisher(name, depth=16) as pub:
        for p in procs:
            p.start()
        for e in ready:
            assert e.wait(WAIT), "a subscriber did not start"
        deadline = time.monotonic() + WAIT
        while pub.subscribers < subscribers:
            assert time.monotonic() < deadline, "subscribers did not connect"
            time.sleep(0.01)
        for seq in range(messages):
            a = payload(seq, rng)
            meta = {"seq": seq, "crc": checksum(a)}
            if seq % 5 == 4:  # one message of two tensors (one of them a loan), delivered atomically
                rev = pub.loan(a.shape, "uint32", timeout=WAIT)
                np.asarray(rev)[...] = a[::-1]
                sent = pub.send({"x": a, "rev": rev}, metadata=meta, timeout=WAIT)
            elif seq % 3 == 0:  # a loan now and then: zero-copy path
                buf = pub.loan(a.shape, "uint32", timeout=WAIT)
                np.asarray(buf)[...] = a
                sent = pub.send(buf, metadata=meta, timeout=WAIT)
            else:
                sent = pub.send(a, metadata=meta, timeout=WAIT)
            assert sent == subscribers, f"message {seq} reached {sent} of {subscribers} subscribers"
    results = [out.get(timeout=WAIT * 2) for _ in procs]
    for p in procs:
        p.join(WAIT)
        assert p.exitcode == 0, f"a subscriber exited with {p.exitcode}"
    for count, errors in results:
        assert not errors, errors
        assert count == messages, f"a subscriber received {count} of {messages}"
    print(f"fanout: {subscribers} subscribers x {messages} messages, nothing lost, duplicated, reordered or corrupted")


# ---- kills -----------------------------------------------------------------------------------------------------------


def _sub_holding(name: str, hold: int, ready) -> None:
    sub = tw.Subscriber(name)
    ready.set()
    held = []
    while True:
        try:
            t = sub.recv(timeout=WAIT)
        except (EOFError, TimeoutError):
            return
        held.append(t)
        if len(held) > hold:
            held.pop(0)


def _pub_sending(name: str, seed: int, ready) -> None:
    rng = random.Random(seed)
    with tw.Publisher(name, depth=8) as pub:
        ready.set()
        deadline = time.monotonic() + WAIT
        while pub.subscribers < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        seq = 0
        while True:
            a = payload(seq, rng)
            pub.send(a, metadata={"seq": seq, "crc": checksum(a)}, timeout=WAIT)
            seq += 1


def kill_subscriber_round(rng: random.Random) -> None:
    """The subscriber dies holding buffers; the publisher never hangs and gets them back."""
    name = topic("killsub")
    fds, maps, shm = fd_count(), tw_mappings(), shm_entries()
    before = fd_targets()
    ready = CTX.Event()
    pub = tw.Publisher(name, depth=4, max_buffers=8)
    child = CTX.Process(target=_sub_holding, args=(name, rng.randrange(0, 8), ready))
    child.start()
    try:
        assert ready.wait(WAIT)
        deadline = time.monotonic() + WAIT
        while pub.subscribers < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        kill_at = time.monotonic() + rng.uniform(0, 0.05)
        killed = False
        seq = 0
        t_end = time.monotonic() + 0.3
        while time.monotonic() < t_end:
            if not killed and time.monotonic() >= kill_at:
                os.kill(child.pid, signal.SIGKILL)
                killed = True
            a = payload(seq, rng)
            try:
                pub.send(a, timeout=WAIT)  # bounded: TimeoutError here is a hang and fails the round
            except BlockingIOError:
                pass
            seq += 1
        if not killed:
            os.kill(child.pid, signal.SIGKILL)
        child.join(WAIT)
        # The dead subscriber's leases are void: the pool serves again at once.
        deadline = time.monotonic() + WAIT
        while pub.subscribers != 0:
            assert time.monotonic() < deadline, "a SIGKILLed subscriber was never noticed"
            time.sleep(0.001)
        for _ in range(16):
            buf = pub.loan((1024,), "uint8", timeout=WAIT)
            pub.send(buf, timeout=WAIT)
    finally:
        child.kill()
        child.join(WAIT)
        child.close()
        pub.close()
        del pub
    after = (fd_count(), tw_mappings(), shm_entries())
    assert after == (fds, maps, shm), (f"the publisher leaked: fds, mappings, /dev/shm {(fds, maps, shm)} -> {after}"
                                       f"; fds {before} -> {fd_targets()}")


def kill_publisher_round(rng: random.Random) -> None:
    """The publisher dies mid-stream; the subscriber keeps valid data and sees end-of-stream in bounded time."""
    name = topic("killpub")
    fds, maps, shm = fd_count(), tw_mappings(), shm_entries()
    ready = CTX.Event()
    sub = tw.Subscriber(name)
    seed = rng.randrange(1 << 30)
    child = CTX.Process(target=_pub_sending, args=(name, seed, ready))
    child.start()
    kept = []
    t = None
    try:
        assert ready.wait(WAIT)
        kill_at = time.monotonic() + rng.uniform(0, 0.1)
        killed = False
        expect = 0
        while True:
            if not killed and time.monotonic() >= kill_at:
                os.kill(child.pid, signal.SIGKILL)
                killed = True
            try:
                t = sub.recv(timeout=WAIT)
            except EOFError:
                break
            assert t.metadata["seq"] == expect, (t.metadata["seq"], expect)
            assert checksum(np.asarray(t)) == t.metadata["crc"], f"message {expect} corrupted"
            expect += 1
            if rng.random() < 0.2:
                kept.append(t)
        assert killed
        # Tensors received before the death stay valid after it.
        assert all(checksum(np.asarray(k)) == k.metadata["crc"] for k in kept)
    finally:
        child.kill()
        child.join(WAIT)
        child.close()
        kept.clear()
        t = None
        sub.close()
        del sub
    after = (fd_count(), tw_mappings(), shm_entries())
    assert after == (fds, maps, shm), f"the subscriber leaked: fds, mappings, /dev/shm {(fds, maps, shm)} -> {after}"


def kill(rounds: int, seed: int) -> None:
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()  # its pipe opens once, on first use: not a leak of any round
    rng = random.Random(seed)
    counts = {"subscriber": 0, "publisher": 0}
    for _ in range(rounds):
        if rng.random() < 0.5:
            kill_subscriber_round(rng)
            counts["subscriber"] += 1
        else:
            kill_publisher_round(rng)
            counts["publisher"] += 1
    print(f"kill: {rounds} rounds ({counts['subscriber']} subscribers, {counts['publisher']} publishers SIGKILLed), "
          "no hang, no corruption, no leak")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sp = ap.add_subparsers(dest="what", required=True)
    f = sp.add_parser("fanout")
    f.add_argument("--subscribers", type=int, default=4)
    f.add_argument("--messages", type=int, default=20000)
    f.add_argument("--seed", type=int, default=1)
    k = sp.add_parser("kill")
    k.add_argument("--rounds", type=int, default=50)
    k.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    if a.what == "fanout":
        fanout(a.subscribers, a.messages, a.seed)
    else:
        kill(a.rounds, a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
