#!/usr/bin/env python3
"""Hand-off costs of tensorwire's import/export against the peers' own, measured in one process.

Every row is a pair (or triple) of calls timed round-robin, best-of-N batches of `--number` calls, so the ratios
compare like with like on a noisy machine. Small tensors (4x4 float32): what is measured is the hand-off itself.

    python bench/bench_interop.py                       # table
    python bench/bench_interop.py --json results.json   # and the raw numbers

Rows (issue 8's targets):
  asarray(torch)   tw.asarray(t) (PyTorch's DLPack C exchange API)   vs  torch.from_dlpack(t)
  torch<-tw        torch.from_dlpack(tw_tensor)                         vs  torch.from_dlpack(numpy_array)
  numpy round trip np.from_dlpack(tw.asarray(a))                        vs  np.from_dlpack(a)
Rows of Python call overheads (no target of their own; each beside the peer call or the tensorwire call it should
cost about as much as):
  asarray(list)    tw.asarray([...16 floats])     vs  np.asarray(same)  vs  torch.as_tensor(same)
  dtype=np.float32 tw.empty((4, 4), np.float32)   vs  tw.empty((4, 4), "float32")  vs  np.empty((4, 4), np.float32)
  device=cpu       tw.asarray(t, device="cpu")    vs  tw.asarray(t)   (t: a CPU torch tensor)
  send(numpy)      Publisher.send(4 KiB ndarray)  vs  Publisher.send(4 KiB tw.Tensor)  (a subscriber that never
                   reads, on_full="drop_oldest": each send copies into the pool)
  metadata.get     t.metadata.get(missing key)    vs  dict.get(missing key)
This is a measurement, not a test: it asserts nothing about speed (it does check the results are views).
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
import torch

import tensorwire as tw


def best_ns(fn, number: int) -> float:
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number * 1e9


def measure(fns: dict, number: int, rounds: int) -> dict:
    best = {k: float("inf") for k in fns}
    for r in range(rounds):
        keys = list(fns)
        keys = keys[r % len(keys):] + keys[: r % len(keys)]  # rotate the order round by round
        for k in keys:
            best[k] = min(best[k], best_ns(fns[k], number))
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args()

    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    t = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    w = tw.asarray(a)
    assert tw.asarray(t).data_ptr == t.data_ptr() and torch.from_dlpack(w).data_ptr() == w.data_ptr
    assert np.from_dlpack(tw.asarray(a)).__array_interface__["data"][0] == a.__array_interface__["data"][0]

    rows = {
        "asarray(torch)": {"tw.asarray(t)": lambda: tw.asarray(t), "torch.from_dlpack(t)": lambda: torch.from_dlpack(t)},
        "torch<-tw": {"torch.from_dlpack(tw)": lambda: torch.from_dlpack(w),
                      "torch.from_dlpack(numpy)": lambda: torch.from_dlpack(a)},
        "numpy round trip": {"np.from_dlpack(tw.asarray(a))": lambda: np.from_dlpack(tw.asarray(a)),
                             "np.from_dlpack(a)": lambda: np.from_dlpack(a),
                             "tw.asarray(a)": lambda: tw.asarray(a)},
    }
    floats = [float(i) for i in range(16)]
    assert tw.asarray(floats).shape == (16,) and tw.asarray(t, device="cpu").data_ptr == t.data_ptr()
    topic = f"bench-interop-{time.monotonic_ns()}"
    pub = tw.Publisher(topic, on_full="drop_oldest")
    sub = tw.Subscriber(topic)  # (never reads: every send still copies into the pool)
    page = np.ones(1024, np.float32)
    page_tw = tw.asarray(page)
    md, plain = w.metadata, {}
    rows.update({
        "asarray(list)": {"tw.asarray(list)": lambda: tw.asarray(floats), "np.asarray(list)": lambda: np.asarray(floats),
                          "torch.as_tensor(list)": lambda: torch.as_tensor(floats)},
        "dtype=np.float32": {"tw.empty(np.float32)": lambda: tw.empty((4, 4), np.float32),
                             "tw.empty('float32')": lambda: tw.empty((4, 4), "float32"),
                             "np.empty(np.float32)": lambda: np.empty((4, 4), np.float32)},
        "device=cpu": {"tw.asarray(t, device='cpu')": lambda: tw.asarray(t, device="cpu"),
                       "tw.asarray(t)": lambda: tw.asarray(t)},
        "send(numpy)": {"send(4 KiB ndarray)": lambda: pub.send(page), "send(4 KiB tw.Tensor)": lambda: pub.send(page_tw)},
        "metadata.get": {"t.metadata.get(missing)": lambda: md.get("stamp"), "dict.get(missing)": lambda: plain.get("stamp")},
    })
    out = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
           "numpy": np.__version__, "torch": torch.__version__, "tensorwire": tw.__version__, "rows": {}}
    print(f"{'row':18s} {'call':34s} {'ns':>8s}")
    for name, fns in rows.items():
        res = measure(fns, args.number, args.rounds)
        out["rows"][name] = res
        for k, v in res.items():
            print(f"{name:18s} {k:34s} {v:8.0f}")
    r = out["rows"]
    ratios = {
        "tw.asarray(torch) / torch.from_dlpack(torch)": r["asarray(torch)"]["tw.asarray(t)"] / r["asarray(torch)"]["torch.from_dlpack(t)"],
        "torch.from_dlpack(tw) / torch.from_dlpack(numpy)": r["torch<-tw"]["torch.from_dlpack(tw)"] / r["torch<-tw"]["torch.from_dlpack(numpy)"],
        "np.from_dlpack(tw.asarray(a)) / np.from_dlpack(a)": r["numpy round trip"]["np.from_dlpack(tw.asarray(a))"] / r["numpy round trip"]["np.from_dlpack(a)"],
    }
    ratios.update({
        "tw.asarray(list) / np.asarray(list)": r["asarray(list)"]["tw.asarray(list)"] / r["asarray(list)"]["np.asarray(list)"],
        "tw.empty(np.float32) / tw.empty('float32')":
            r["dtype=np.float32"]["tw.empty(np.float32)"] / r["dtype=np.float32"]["tw.empty('float32')"],
        "tw.asarray(t, device='cpu') / tw.asarray(t)":
            r["device=cpu"]["tw.asarray(t, device='cpu')"] / r["device=cpu"]["tw.asarray(t)"],
        "send(ndarray) / send(tw.Tensor)": r["send(numpy)"]["send(4 KiB ndarray)"] / r["send(numpy)"]["send(4 KiB tw.Tensor)"],
    })
    sub.close()
    pub.close()
    out["ratios"] = ratios
    for k, v in ratios.items():
        print(f"{k:52s} {v:6.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
