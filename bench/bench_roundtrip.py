#!/usr/bin/env python3
"""The cost of passing a tensor *through* tensorwire: import (tw.asarray) + export (__dlpack__ to a consumer),
against the consumer importing the original directly. Every path is zero-copy, so the cost is per call and does
not depend on the size; a few layouts are measured because strides and offsets change the work a little.

Pairs measured in one process, interleaved round by round, best-of-N with time.perf_counter:
  numpy -> numpy   np.from_dlpack(tw.asarray(a))        vs  np.from_dlpack(a)
  torch -> torch   torch.from_dlpack(tw.asarray(x))     vs  torch.from_dlpack(x)
  numpy -> torch   torch.from_dlpack(tw.asarray(a))     vs  torch.from_dlpack(a)
  torch -> numpy   np.from_dlpack(tw.asarray(x))        vs  np.from_dlpack(x)
plus the two halves alone (tw.asarray(a); np.from_dlpack(t) of a ready tensor).

    python bench/bench_roundtrip.py [--json FILE] [--min-time SECONDS]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

import numpy as np
import torch

import tensorwire as tw


def best_ns(fns: dict, min_time: float, rounds_min: int = 7) -> dict:
    """Interleaved best-of-N: each round times a batch of each callable; returns ns per call."""
    batch = {}
    for name, f in fns.items():
        for _ in range(100):
            f()
        t0 = time.perf_counter()
        for _ in range(100):
            f()
        one = (time.perf_counter() - t0) / 100
        batch[name] = max(100, int(2e-3 / max(one, 1e-8)))
    best = {name: math.inf for name in fns}
    start, rounds = time.perf_counter(), 0
    while rounds < rounds_min or (time.perf_counter() - start < min_time and rounds < 500):
        for name, f in fns.items():
            k = batch[name]
            t0 = time.perf_counter()
            for _ in range(k):
                f()
            best[name] = min(best[name], (time.perf_counter() - t0) / k * 1e9)
        rounds += 1
    return best


def layouts():
    base = np.arange(4096 * 256, dtype=np.float32).reshape(4096, 256)
    yield "contiguous 1-D (4 KiB)", np.arange(1024, dtype=np.float32)
    yield "contiguous 2-D (4 MiB)", base
    yield "transposed 2-D", base.T
    yield "sliced (offset, step 2)", base[3:, ::2]
    yield "4-D NCHW", np.zeros((8, 16, 32, 32), dtype=np.float32)


def run(min_time: float):
    records = []
    for name, a in layouts():
        x = torch.from_numpy(a)
        # Check once that every path is zero-copy and bit-exact.
        for out in (np.from_dlpack(tw.asarray(a)), torch.from_dlpack(tw.asarray(x)).numpy()):
            assert out.ctypes.data == a.ctypes.data and out.strides == a.strides and np.array_equal(out, a), name
        t = tw.asarray(a)
        pairs = {
            "numpy -> numpy": ((lambda: np.from_dlpack(tw.asarray(a))), (lambda: np.from_dlpack(a))),
            "torch -> torch": ((lambda: torch.from_dlpack(tw.asarray(x))), (lambda: torch.from_dlpack(x))),
            "numpy -> torch": ((lambda: torch.from_dlpack(tw.asarray(a))), (lambda: torch.from_dlpack(a))),
            "torch -> numpy": ((lambda: np.from_dlpack(tw.asarray(x))), (lambda: np.from_dlpack(x))),
        }
        fns = {}
        for pname, (via, direct) in pairs.items():
            fns[pname + " via tw"] = via
            fns[pname + " direct"] = direct
        fns["tw.asarray(numpy)"] = lambda: tw.asarray(a)
        fns["tw.asarray(torch)"] = lambda: tw.asarray(x)
        fns["np.from_dlpack(tw)"] = lambda: np.from_dlpack(t)
        fns["torch.from_dlpack(tw)"] = lambda: torch.from_dlpack(t)
        ns = best_ns(fns, min_time)
        for pname in pairs:
            via, direct = ns[pname + " via tw"], ns[pname + " direct"]
            rec = {"layout": name, "path": pname, "via_tw_ns": via, "direct_ns": direct, "ratio": via / direct}
            records.append(rec)
            print(f"| {name} | {pname} | {via:8.0f} | {direct:8.0f} | {via / direct:5.2f}x |", flush=True)
        for part in ("tw.asarray(numpy)", "tw.asarray(torch)", "np.from_dlpack(tw)", "torch.from_dlpack(tw)"):
            records.append({"layout": name, "path": part, "ns": ns[part]})
            print(f"| {name} | {part} | {ns[part]:8.0f} | | |", flush=True)
    return records


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--min-time", type=float, default=0.3, help="seconds of timing per layout (all paths)")
    args = p.parse_args(argv)
    info = {"cpu": platform.processor(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "torch": torch.__version__, "tensorwire": tw.__version__}
    print(f"# Python {info['python']}, NumPy {info['numpy']}, PyTorch {info['torch']}, tensorwire {info['tensorwire']}")
    print("# ns per call (best of N); ratio = via tensorwire / direct (target: <= 2x for numpy -> numpy)\n")
    print("| layout | path | via tw (ns) | direct (ns) | ratio |")
    print("|---|---|---|---|---|")
    records = run(args.min_time)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "argv": sys.argv, "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
