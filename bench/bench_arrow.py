#!/usr/bin/env python3
"""tensorwire's Arrow export + import against PyArrow's own FixedShapeTensorArray conversions, in one process.

Both sides start from the same NumPy batch and end with the same kinds of objects, so the ratios compare like with
like:
  export   batch -> pyarrow.FixedShapeTensorArray
             tw:      pa.array(tw.to_arrow(x))      (tw.asarray, then the PyCapsule interface)
             pyarrow: pa.FixedShapeTensorArray.from_numpy_ndarray(x)
  import   pyarrow.FixedShapeTensorArray -> tensor
             tw:      tw.from_arrow(arr)            (a tw.Tensor)
             tw+np:   np.asarray(tw.from_arrow(arr))  (a numpy.ndarray, as PyArrow returns)
             pyarrow: arr.to_numpy_ndarray()
  round    export then import (tw: tw.from_arrow(pa.array(tw.to_arrow(x))); pyarrow: from_numpy + to_numpy)

Batches (float32, rows first):
  contiguous  NCHW, C-contiguous
  nhwc        an NCHW buffer viewed as NHWC (a dense permuted layout: exported with `permutation`)
  transposed  a batch of matrices, each transposed (an involutive permutation)

Each side is checked against the source values. PyArrow 26's conversions are wrong for `nhwc` (from_numpy_ndarray
writes the inverse permutation and to_numpy_ndarray builds strides that are not the layout's): those PyArrow rows are
timed but marked "wrong".

Timing is best-of-N with time.perf_counter, the implementations interleaved round by round; small batches are timed
in loops so the clock's resolution does not matter.

    python bench/bench_arrow.py            # the table in bench/RESULTS.md
    python bench/bench_arrow.py --quick    # fewer sizes and rounds
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
import pyarrow as pa

import tensorwire as tw

SHAPES = {  # (N, C, H, W)
    "1x3x224x224": (1, 3, 224, 224),
    "32x3x224x224": (32, 3, 224, 224),
    "4096x3x4x4": (4096, 3, 4, 4),
}
QUICK = ("1x3x224x224", "32x3x224x224")


def make(layout: str, shape):
    n, c, h, w = shape
    rng = np.random.default_rng(0)
    base = rng.standard_normal((n, c, h, w), dtype=np.float32)
    if layout == "contiguous":
        return base
    if layout == "nhwc":
        return base.transpose(0, 2, 3, 1)
    if layout == "transposed":
        return base.reshape(n, c * h, w).transpose(0, 2, 1)
    raise ValueError(layout)


def best_of(fn, rounds: int, min_time: float = 2e-3) -> float:
    """Seconds per call: the best of `rounds` timings, each a loop long enough to measure."""
    loops = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_time or loops >= 1 << 16:
            break
        loops *= 4
    best = dt / loops
    for _ in range(rounds - 1):
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter() - t0) / loops)
    return best


def run(names, rounds):
    rows = []
    for name in names:
        for layout in ("contiguous", "nhwc", "transposed"):
            x = make(layout, SHAPES[name])
            t = tw.asarray(x)
            pa_arr = pa.FixedShapeTensorArray.from_numpy_ndarray(x)
            tw_arr = pa.array(tw.to_arrow(t))
            # correctness and zero-copy, checked once
            tw_back = tw.from_arrow(tw_arr)
            tw_ok = np.array_equal(np.asarray(tw_back), x)
            tw_zero_copy = tw_back.data_ptr == t.data_ptr
            try:
                pa_ok = np.array_equal(pa_arr.to_numpy_ndarray(), x)
            except Exception:  # noqa: BLE001 - a refusal is a wrong answer here
                pa_ok = False
            ops = {
                "export": (lambda: pa.array(tw.to_arrow(x)),
                           lambda: pa.FixedShapeTensorArray.from_numpy_ndarray(x)),
                "import": (lambda: tw.from_arrow(tw_arr), lambda: pa_arr.to_numpy_ndarray()),
                "import_np": (lambda: np.asarray(tw.from_arrow(tw_arr)), lambda: pa_arr.to_numpy_ndarray()),
                "round": (lambda: tw.from_arrow(pa.array(tw.to_arrow(x))),
                          lambda: pa.FixedShapeTensorArray.from_numpy_ndarray(x).to_numpy_ndarray()),
            }
            for op, (tw_fn, pa_fn) in ops.items():
                tw_best, pa_best = float("inf"), float("inf")
                for _ in range(rounds):  # interleave the two sides
                    tw_best = min(tw_best, best_of(tw_fn, 3))
                    pa_best = min(pa_best, best_of(pa_fn, 3))
                rows.append(dict(batch=name, layout=layout, op=op, tw_us=tw_best * 1e6, pa_us=pa_best * 1e6,
                                 ratio=pa_best / tw_best, tw_ok=tw_ok, tw_zero_copy=tw_zero_copy, pa_ok=pa_ok,
                                 mbytes=x.nbytes / 1e6))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    names = QUICK if args.quick else tuple(SHAPES)
    rows = run(names, 3 if args.quick else 7)
    print(f"# tensorwire {tw.__version__}, pyarrow {pa.__version__}, numpy {np.__version__}, "
          f"Python {platform.python_version()}, {platform.machine()}")
    print("| batch (float32) | layout | op | tensorwire µs | pyarrow µs | pyarrow / tensorwire | notes |")
    print("| --- | --- | --- | ---: | ---: | ---: | --- |")
    for r in rows:
        notes = []
        if not r["tw_ok"]:
            notes.append("tensorwire WRONG")
        if r["op"] != "export" and r["tw_zero_copy"]:
            notes.append("tw zero-copy")
        if not r["pa_ok"]:
            notes.append("pyarrow result wrong")
        print(f"| {r['batch']} ({r['mbytes']:.1f} MB) | {r['layout']} | {r['op']} | {r['tw_us']:.1f} | "
              f"{r['pa_us']:.1f} | {r['ratio']:.1f}x | {', '.join(notes)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
