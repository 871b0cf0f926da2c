#!/usr/bin/env python3
"""Checks the benchmark targets of issue 2 against saved results and prints them as Markdown.

    python bench/targets.py contiguous.json roundtrip.json   # the targets, judged
    python bench/targets.py --table contiguous.json [THREADS]  # the condensed results table

contiguous.json comes from `bench_contiguous.py --json`, roundtrip.json from `bench_roundtrip.py --json`.
Each target is judged on every measurement it covers; the table lists the worst and the best case so a target that
holds only at some sizes says where it does not.
"""

from __future__ import annotations

import json
import sys

KiB, MiB = 1 << 10, 1 << 20


def size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"


def where(r) -> str:
    return f"{r['case']} {r['dtype']} {size(r['bytes'])} {r['op']} {r['threads']} thr"


def spread(recs, ratio, threshold, label):
    """One row: how many cases meet `ratio(r) >= threshold`, and the worst and best case."""
    vals = sorted(((ratio(r), r) for r in recs), key=lambda x: x[0])
    hit = sum(1 for v, _ in vals if v >= threshold)
    worst, best = vals[0], vals[-1]
    misses = [f"{where(r)} ({v:.2f}x)" for v, r in vals if v < threshold]
    verdict = "hit" if hit == len(vals) else ("missed" if hit == 0 else "partly")
    print(f"| {label} | {verdict}: {hit}/{len(vals)} cases >= {threshold}x | worst {worst[0]:.2f}x ({where(worst[1])}); "
          f"best {best[0]:.2f}x ({where(best[1])}) |")
    if misses and len(misses) <= 12:
        print(f"|  | misses: {'; '.join(misses)} | |")
    elif misses:
        print(f"|  | misses: {len(misses)} cases, e.g. {'; '.join(misses[:6])} ... | |")


def table(contig, sizes=(4 * KiB, 1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB), threads=1):
    """The condensed results table: every case and dtype at a few sizes, one thread, both operations."""
    print("| case | dtype | size | tw contiguous() GB/s | NumPy | PyTorch | alloc+memcpy | tw/NumPy | tw/PyTorch | "
          "tw into buffer GB/s | np.copyto | memcpy | into tw/memcpy |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    by = {(r["case"], r["dtype"], r["bytes"], r["op"], r["threads"]): r for r in contig}
    cases = list(dict.fromkeys(r["case"] for r in contig))
    dtypes = list(dict.fromkeys(r["dtype"] for r in contig))
    for case in cases:
        for dt in dtypes:
            for n in sizes:
                c, i = by.get((case, dt, n, "contiguous", threads)), by.get((case, dt, n, "into", threads))
                if not c or not i:
                    continue
                g, h = c["gbps"], i["gbps"]
                print(f"| {case} | {dt} | {size(n)} | {g['tw']:.2f} | {g['numpy']:.2f} | {g['torch']:.2f} | "
                      f"{g['alloc+memcpy']:.2f} | {c['ratio']['vs_numpy']:.2f}x | {c['ratio']['vs_torch']:.2f}x | "
                      f"{h['tw']:.2f} | {h['numpy']:.2f} | {h['memcpy']:.2f} | {i['ratio']['vs_memcpy']:.2f}x |")


def records(path: str) -> list:
    try:
        with open(path) as f:
            return json.load(f)["records"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"bench/targets.py: {path}: not a results file of bench_contiguous.py / bench_roundtrip.py --json "
                 f"({type(e).__name__}: {e})")


def main(argv):
    args = argv[1:]
    if not args or args[0] in ("-h", "--help") or (args[0] == "--table" and not 2 <= len(args) <= 3) or \
            (args[0] != "--table" and len(args) > 2):
        print(__doc__.strip(), file=sys.stdout if args[:1] in (["-h"], ["--help"]) else sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    if args[0] == "--table":
        if len(args) == 3 and not args[2].isdigit():
            sys.exit(f"bench/targets.py --table: THREADS must be a number, not {args[2]!r}")
        table(records(args[1]), threads=int(args[2]) if len(args) == 3 else 1)
        return 0
    contig = records(args[0])
    rt = records(args[1]) if len(args) > 1 else []
    sel = lambda **kw: [r for r in contig if all(r[k] == v for k, v in kw.items())]  # noqa: E731

    print("| target | result | measured |")
    print("|---|---|---|")
    # 1. 2-D transpose, float32, 64 MiB, one thread.
    for op in ("contiguous", "into"):
        for r in sel(case="transpose", dtype="float32", bytes=64 * MiB, threads=1, op=op):
            g = r["gbps"]
            ref = "memcpy (warm buffers)"
            line = (f"tw {g['tw']:.2f} GB/s = {g['tw'] / g['memcpy']:.0%} of memcpy {g['memcpy']:.2f} GB/s ({ref})")
            if "alloc+memcpy" in g:
                line += f", {g['tw'] / g['alloc+memcpy']:.0%} of alloc+memcpy {g['alloc+memcpy']:.2f} GB/s"
            line += f"; NumPy {g['numpy']:.2f} GB/s, PyTorch {g['torch']:.2f} GB/s"
            ok_mem = g["tw"] >= 0.5 * g["memcpy"]
            ok_alloc = "alloc+memcpy" in g and g["tw"] >= 0.5 * g["alloc+memcpy"]
            ok_peers = g["tw"] > g["numpy"] and g["tw"] > g["torch"]
            verdict = "hit" if ok_mem and ok_peers else ("hit vs alloc+memcpy only" if ok_alloc and ok_peers else "missed")
            print(f"| transpose f32 64 MiB, 1 thread, {op}: >= 50% of memcpy and ahead of NumPy and PyTorch | "
                  f"{verdict} | {line} |")
    # 2. NCHW -> NHWC float32 >= 1.0x PyTorch.
    recs = sel(case="nchw_nhwc", dtype="float32", op="contiguous")
    if recs:
        spread(recs, lambda r: r["ratio"]["vs_torch"], 1.0, "NCHW->NHWC f32 contiguous() >= 1.0x PyTorch")
    # 3. Every-other-column slice and stride-0 expand >= 1.2x NumPy.
    for case in ("slice2", "expand_row", "expand_col"):
        recs = sel(case=case, op="contiguous")
        if recs:
            spread(recs, lambda r: r["ratio"]["vs_numpy"], 1.2, f"{case} contiguous() >= 1.2x NumPy")
        recs = sel(case=case, op="into")
        if recs:
            spread(recs, lambda r: r["ratio"]["vs_numpy"], 1.2, f"{case} into a buffer >= 1.2x np.copyto")
    # 4. Dense-but-offset copies >= 0.9x memcpy.
    recs = sel(case="dense_offset", op="into")
    if recs:
        spread(recs, lambda r: r["ratio"]["vs_memcpy"], 0.9, "dense_offset into a buffer >= 0.9x memcpy")
    recs = sel(case="dense_offset", op="contiguous")
    if recs:
        spread(recs, lambda r: r["ratio"]["vs_alloc_memcpy"], 0.9,
               "dense_offset t.copy() >= 0.9x alloc+memcpy (NumPy copy of a contiguous array)")
        spread(recs, lambda r: r["ratio"]["vs_memcpy"], 0.9, "dense_offset t.copy() >= 0.9x memcpy (warm buffers)")
    # 5. Round trip.
    for r in rt:
        if r.get("path") == "numpy -> numpy":
            verdict = "hit" if r["ratio"] <= 2.0 else "missed"
            print(f"| tw.asarray(a) + np.from_dlpack within 2x of np.from_dlpack(a) ({r['layout']}) | {verdict} | "
                  f"{r['via_tw_ns']:.0f} ns vs {r['direct_ns']:.0f} ns = {r['ratio']:.2f}x |")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
