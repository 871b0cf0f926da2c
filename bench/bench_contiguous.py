#!/usr/bin/env python3
"""tensorwire `contiguous()` against NumPy and PyTorch, and against memcpy of the same bytes, in one process.

Every implementation reads the *same* source memory (the NumPy array, viewed zero-copy by PyTorch and tensorwire)
and its timings are interleaved with the others' round by round, in a rotating order, so the ratios compare like
with like even on a noisy machine. Timing is best-of-N with time.perf_counter; small copies are timed in batches
(after one untimed call) so the clock's resolution and the previous implementation's cache leftovers do not
matter. GB/s is always bytes of the *result* per second (what memcpy of the result would move).

Layouts (the result is C-contiguous in each):
  transpose    a 2-D C-contiguous array, transposed (a.T)
  slice2       every other column of a 2-D array (a[:, ::2])
  nchw_nhwc    an NCHW array permuted to NHWC (C = 64)
  expand_row   a row vector broadcast down the rows (stride 0 on the outer dim)
  expand_col   a column vector broadcast along the rows (stride 0 on the inner dim)
  dense_offset a contiguous 1-D slice starting one element into its buffer, copied (t.copy(), x.copy(), x.clone():
               contiguous() of a contiguous tensor is free, so the copy is what is measured)

Two operations:
  contiguous   allocates the result: tw `t.contiguous()` (`t.copy()` for dense_offset), `np.ascontiguousarray`,
               `torch.Tensor.contiguous()`; "alloc+memcpy" is NumPy's copy of a contiguous array of the same bytes
  into         writes into a preallocated, already-touched result: `tw._ext._copy_into`, `np.copyto`,
               `torch.Tensor.copy_` (the copy kernel alone, without the allocator and page faults)
"memcpy" is ctypes.memmove of the result's bytes between two preallocated, already-touched buffers.

    python bench/bench_contiguous.py --quick                 # a few sizes, float32, 1 thread (CI / demo)
    python bench/bench_contiguous.py --json results.json     # everything (RESULTS.md)

This is a measurement, not a test: it asserts nothing about speed. It does check that every result is right.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import sys
import time

import numpy as np
import torch

import tensorwire as tw

KiB, MiB = 1 << 10, 1 << 20
CASES = ("transpose", "slice2", "nchw_nhwc", "expand_row", "expand_col", "dense_offset")
DTYPES = ("float32", "float64", "uint8")
FULL_SIZES = (4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB)
QUICK_SIZES = (4 * KiB, 1 * MiB, 64 * MiB)


def fmt_size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def split2(elems: int) -> tuple[int, int]:
    """A near-square (rows, cols) with rows * cols == elems (elems is a power of two here)."""
    rows = 1 << (int(math.log2(elems)) // 2)
    return rows, elems // rows


def make_case(case: str, dtype: str, nbytes: int):
    """Returns (numpy view, torch view, result shape) over one shared NumPy buffer."""
    dt = np.dtype(dtype)
    elems = nbytes // dt.itemsize
    rng = np.random.default_rng(0)

    def fill(shape):
        if dt.kind == "u":
            return rng.integers(0, 256, size=shape, dtype=dt)
        return rng.standard_normal(size=shape, dtype=np.float64).astype(dt)

    if case == "transpose":
        rows, cols = split2(elems)
        base = fill((cols, rows))
        return base.T, torch.from_numpy(base).T
    if case == "slice2":
        rows, cols = split2(elems)
        base = fill((rows, 2 * cols))
        return base[:, ::2], torch.from_numpy(base)[:, ::2]
    if case == "nchw_nhwc":
        c = 64
        hw = elems // c
        n = max(1, hw // (128 * 128))
        h, w = split2(hw // n)
        base = fill((n, c, h, w))
        return base.transpose(0, 2, 3, 1), torch.from_numpy(base).permute(0, 2, 3, 1)
    if case == "expand_row":
        rows, cols = split2(elems)
        v = fill((1, cols))
        return np.broadcast_to(v, (rows, cols)), torch.from_numpy(v).expand(rows, cols)
    if case == "expand_col":
        rows, cols = split2(elems)
        v = fill((rows, 1))
        return np.broadcast_to(v, (rows, cols)), torch.from_numpy(v).expand(rows, cols)
    if case == "dense_offset":
        base = fill((elems + 1,))
        return base[1:], torch.from_numpy(base)[1:]
    raise ValueError(case)


class Timer:
    """Interleaved best-of-N timing of several callables: each round times one batch of each."""

    def __init__(self, min_time: float, max_rounds: int, min_rounds: int):
        self.min_time, self.max_rounds, self.min_rounds = min_time, max_rounds, min_rounds

    def run(self, fns: dict) -> dict:
        # Warm up (allocator caches, page tables, lazy initialisation) and size the batches: aim for >= 1 ms each.
        batch, rewarm = {}, {}
        for name, f in fns.items():
            f()
            t0 = time.perf_counter()
            f()
            one = max(time.perf_counter() - t0, 1e-7)
            batch[name] = max(1, min(10_000, int(1e-3 / one)))
            # Each batch starts from the caches its own last call left, not from whatever the previous
            # implementation left: otherwise the one timed right after another that read the same source finds it
            # in the LLC (up to ~1.4x at 4 MiB here). Skipped where a call takes long enough for that not to matter.
            rewarm[name] = one < 0.05
        best = {name: math.inf for name in fns}
        start = time.perf_counter()
        rounds = 0
        names = list(fns)
        while rounds < self.min_rounds or (rounds < self.max_rounds and time.perf_counter() - start < self.min_time):
            # Rotate the order every round: what ran just before matters even after a warm-up call (a 4 MiB memcpy
            # leaves dirty lines in the LLC that whoever runs next pays to write back: ~0.7x here), so each
            # implementation must also get rounds that follow each of the others.
            for name in names[rounds % len(names):] + names[:rounds % len(names)]:
                f, k = fns[name], batch[name]
                if rewarm[name]:
                    f()
                t0 = time.perf_counter()
                for _ in range(k):
                    f()
                dt = (time.perf_counter() - t0) / k
                best[name] = min(best[name], dt)
            rounds += 1
        return best


def memmove_fn(nbytes: int):
    a = np.ones(nbytes, dtype=np.uint8)
    b = np.zeros(nbytes, dtype=np.uint8)
    pa, pb = a.ctypes.data, b.ctypes.data
    return (lambda: ctypes.memmove(pb, pa, nbytes)), (a, b)


def check(result, expected: np.ndarray, who: str):
    got = np.asarray(result) if not isinstance(result, torch.Tensor) else result.numpy()
    if got.shape != expected.shape or not np.array_equal(got, expected):
        raise AssertionError(f"{who} produced a wrong result")


def bench_one(case, dtype, nbytes, op, threads, timer, default_threads):
    x_np, x_t = make_case(case, dtype, nbytes)
    x_tw = tw.asarray(x_np)
    assert x_tw.data_ptr == x_np.ctypes.data, "tw.asarray must be zero-copy here"
    expected = np.array(x_np, order="C")
    out_bytes = expected.nbytes
    n_threads = 1 if threads == "1" else default_threads
    tw.set_num_threads(n_threads)
    torch.set_num_threads(n_threads)

    fns = {}
    keep = []
    if op == "contiguous":
        if case == "dense_offset":
            fns["tw"] = lambda: x_tw.copy()
            fns["numpy"] = lambda: x_np.copy()
            fns["torch"] = lambda: x_t.clone()
        else:
            fns["tw"] = lambda: x_tw.contiguous()
            fns["numpy"] = lambda: np.ascontiguousarray(x_np)
            fns["torch"] = lambda: x_t.contiguous()
        dense = np.ones(out_bytes, dtype=np.uint8)
        fns["alloc+memcpy"] = lambda: dense.copy()
        keep.append(dense)
        for who in ("tw", "numpy", "torch"):
            check(fns[who](), expected, who)
    else:
        out_np = np.zeros_like(expected)
        out_tw = tw.asarray(out_np)
        out_t = torch.from_numpy(out_np)
        fns["tw"] = lambda: tw._ext._copy_into(x_tw, out_tw)
        fns["numpy"] = lambda: np.copyto(out_np, x_np)
        fns["torch"] = lambda: out_t.copy_(x_t)
        for who in ("tw", "numpy", "torch"):
            out_np[...] = 0
            fns[who]()
            check(out_np, expected, who)
    mm, bufs = memmove_fn(out_bytes)
    fns["memcpy"] = mm
    keep.append(bufs)
    best = timer.run(fns)
    gbps = {k: out_bytes / v / 1e9 for k, v in best.items()}
    rec = {
        "case": case,
        "dtype": dtype,
        "bytes": out_bytes,
        "shape": list(expected.shape),
        "src_strides": list(x_np.strides),
        "op": op,
        "threads": n_threads,
        "seconds": best,
        "gbps": gbps,
        "ratio": {
            "vs_numpy": best["numpy"] / best["tw"],
            "vs_torch": best["torch"] / best["tw"],
            "vs_memcpy": best["memcpy"] / best["tw"],
        },
    }
    if "alloc+memcpy" in best:
        rec["ratio"]["vs_alloc_memcpy"] = best["alloc+memcpy"] / best["tw"]
    tw.set_num_threads(0)
    return rec


def machine_info() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "tensorwire": tw.__version__,
        "platform": platform.platform(),
    }


HEADER = ("case", "dtype", "size", "op", "thr", "tw GB/s", "numpy", "torch", "memcpy", "alloc+cp", "tw/np",
          "tw/torch", "tw/memcpy")


def print_header():
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "|".join("---" for _ in HEADER) + "|")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few sizes, float32 only, 1 thread, contiguous() only")
    p.add_argument("--json", metavar="FILE", help="write every measurement (and the machine) as JSON")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--dtypes", default=None, help="comma-separated; default all (float32 with --quick)")
    p.add_argument("--sizes", default=None, help="comma-separated result sizes in KiB; default 4 KiB .. 256 MiB")
    p.add_argument("--threads", default=None, help="'1', 'default' or '1,default' (default: both; 1 with --quick)")
    p.add_argument("--ops", default=None, help="'contiguous', 'into' or both (default: both; contiguous with --quick)")
    p.add_argument("--min-time", type=float, default=None, help="seconds of timing per measurement (per impl)")
    args = p.parse_args(argv)

    quick = args.quick
    cases = args.cases.split(",")
    dtypes = (args.dtypes or ("float32" if quick else ",".join(DTYPES))).split(",")
    sizes = [int(s) * KiB for s in args.sizes.split(",")] if args.sizes else (QUICK_SIZES if quick else FULL_SIZES)
    threads = (args.threads or ("1" if quick else "1,default")).split(",")
    ops = (args.ops or ("contiguous" if quick else "contiguous,into")).split(",")
    min_time = args.min_time if args.min_time is not None else (0.1 if quick else 0.4)
    timer = Timer(min_time=min_time, max_rounds=200, min_rounds=5 if quick else 7)
    default_threads = os.cpu_count() or 1
    for c in cases:
        if c not in CASES:
            p.error(f"unknown case {c!r}; choose from {', '.join(CASES)}")

    info = machine_info()
    print(f"# {info['cpu']} ({info['cpus']} CPUs), Python {info['python']}, NumPy {info['numpy']}, "
          f"PyTorch {info['torch']}, tensorwire {info['tensorwire']}")
    print("# GB/s = bytes of the result per second; ratios > 1 mean tensorwire is faster\n")
    records = []
    print_header()
    for case in cases:
        for dtype in dtypes:
            for nbytes in sizes:
                for op in ops:
                    for th in threads:
                        r = bench_one(case, dtype, nbytes, op, th, timer, default_threads)
                        records.append(r)
                        print_table_row(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "argv": sys.argv, "records": records}, f, indent=1)
    return records


def print_table_row(r):
    g, q = r["gbps"], r["ratio"]
    row = (r["case"], r["dtype"], fmt_size(r["bytes"]), r["op"], str(r["threads"]), f"{g['tw']:.2f}",
           f"{g['numpy']:.2f}", f"{g['torch']:.2f}", f"{g['memcpy']:.2f}",
           f"{g['alloc+memcpy']:.2f}" if "alloc+memcpy" in g else "-",
           f"{q['vs_numpy']:.2f}x", f"{q['vs_torch']:.2f}x", f"{q['vs_memcpy']:.2f}x")
    print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
