"""The demo's inter-process rows: a stacked tensor's second plane and a transposed tensor, each sent to another
process through tw.Publisher / tw.Subscriber and checked element by element there."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import uuid

import numpy as np

import tensorwire as tw


def _receiver(name, n, ready, out):
    """Receives n tensors and ships back what arrived: values, strides, byte offset, metadata."""
    with tw.Subscriber(name) as sub:
        ready.set()
        for _ in range(n):
            t = sub.recv(timeout=60)
            out.put((np.asarray(t).copy(), t.strides, t.byte_offset, dict(t.metadata)))


def rows(rows, row) -> None:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is part of every supported set-up
        torch = None
    ctx = mp.get_context("spawn")
    name = f"demo/{os.getpid()}/{uuid.uuid4().hex[:6]}"
    ready, out = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_receiver, args=(name, 2, ready, out), daemon=True)
    child.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the receiving process did not start")
        a = np.arange(12.0, dtype=np.float32).reshape(3, 4)
        b = np.arange(100.0, 112.0, dtype=np.float32).reshape(3, 4)
        x = torch.arange(24.0).reshape(4, 6).T if torch is not None else np.arange(24.0).reshape(4, 6).T
        with tw.Publisher(name) as pub:
            deadline = time.monotonic() + 60
            while pub.subscribers < 1:
                if time.monotonic() > deadline or not child.is_alive():
                    raise RuntimeError("the receiving process never subscribed")
                child.join(0.001)
            # The stack is built in a loaned shared-memory buffer; its second plane is a view half-way into it.
            buf = pub.loan((2, 3, 4), "float32")
            np.asarray(buf)[:] = np.stack([a, b])
            plane = buf[1]
            del buf
            pub.send(plane, metadata={"what": "plane 1"})
            pub.send(x, metadata={"what": "transposed"})
        got_plane, got_t = out.get(timeout=60), out.get(timeout=60)
        ok = np.array_equal(got_plane[0], b) and got_plane[2] == 12 * 4 and got_plane[3] == {"what": "plane 1"}
        row(rows, "stacked tensor's 2nd plane sent to another process",
            "segment + byte_offset + strides in the descriptor, no copy", ok,
            f"byte_offset={got_plane[2]}, values match={np.array_equal(got_plane[0], b)}")
        want = x.numpy() if torch is not None else x
        ok = np.array_equal(got_t[0], want) and got_t[3] == {"what": "transposed"}
        row(rows, "transposed tensor sent to another process", "one copy, its strides kept (a dense layout)", ok,
            f"shape={got_t[0].shape}, strides={got_t[1]}, values match={np.array_equal(got_t[0], want)}")
    except Exception as e:  # a demo row, not a crash
        row(rows, "tensors sent to another process", "tw.Publisher / tw.Subscriber", False, f"{type(e).__name__}: {e}")
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
