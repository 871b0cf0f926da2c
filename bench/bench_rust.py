#!/usr/bin/env python3
"""Issue 13's two benchmarks: the Rust crate's zero-copy adoption, and Rust -> Python publish/subscribe latency.

1. `Tensor::from_vec` of 1e4..1e8 f64 against a copying construction (rust/examples/bench.rs; target: constant
   time, >= 1000x faster at 1e8).
2. One-way latency of a small message (a loaned float32 tensor plus a timestamp in its metadata, CLOCK_MONOTONIC
   on both sides) into a Python subscriber, from a Rust publisher (rust/examples/pubsub.rs) and from a Python
   publisher doing the same, rounds alternating; target: Rust -> Python within 1.2x of Python -> Python.

    make bench-rust                                     # builds the examples, runs this, writes the JSON
    python bench/bench_rust.py --json bench/results/rust.json
This is a measurement, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import tensorwire as tw

ROOT = Path(__file__).resolve().parent.parent

PY_PUBLISHER = r"""
import sys, time, numpy as np, tensorwire as tw
topic, count, interval_us, elements = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
pub = tw.Publisher(topic)
deadline = time.monotonic() + 20
while pub.subscribers < 1:
    assert time.monotonic() < deadline
    time.sleep(0.001)
interval = interval_us * 1000
for i in range(count):
    nxt = time.monotonic_ns() + interval
    buf = pub.loan((elements,), "float32")
    np.asarray(buf)[:] = i
    pub.send(buf, metadata={"t": time.monotonic_ns()})
    while time.monotonic_ns() < nxt:
        pass
pub.close()
"""


def latency_run(examples: Path, kind: str, count: int, interval_us: int, elements: int, seq: int) -> list[float]:
    topic = f"bench_rust_{kind}_{os.getpid()}_{seq}"
    sub = tw.Subscriber(topic)
    args = [str(count), str(interval_us), str(elements)]
    if kind == "rust":
        cmd = [str(examples / "pubsub"), topic, *args]
    else:
        cmd = [sys.executable, "-c", PY_PUBLISHER, topic, *args]
    proc = subprocess.Popen(cmd, env={**os.environ})
    lat = []
    try:
        for _ in range(count):
            t = sub.recv(timeout=30)
            now = time.monotonic_ns()
            lat.append((now - t.metadata["t"]) / 1000.0)
            del t
    finally:
        proc.wait(timeout=60)
        sub.close()
    if proc.returncode != 0:
        raise SystemExit(f"{kind} publisher failed with {proc.returncode}")
    return lat[count // 10 :]  # the first tenth warms caches and the pool up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--examples", type=Path, default=ROOT / "build" / "rust" / "release" / "examples",
                    help="where `cargo build --release --examples` put the Rust examples")
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--interval-us", type=int, default=200)
    ap.add_argument("--elements", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max", type=int, default=100_000_000)
    a = ap.parse_args()

    for exe in ("bench", "pubsub"):
        if not (a.examples / exe).exists():
            raise SystemExit(f"{a.examples / exe} is missing: run `make bench-rust` (it builds the Rust examples)")

    adopt = json.loads(subprocess.check_output([str(a.examples / "bench"), "--max", str(a.max), "--repeat", "9"]))
    print("Tensor::from_vec vs copying construction (median of 9)")
    for r in adopt["rows"]:
        print(f"  n={r['n']:>11,}  from_vec {r['from_vec_s'] * 1e6:8.3f} us   copying {r['copying_s'] * 1e3:10.3f} ms"
              f"   {r['speedup']:>12,.0f}x")

    samples: dict[str, list[float]] = {"rust": [], "python": []}
    for r in range(a.rounds):
        for kind in ("rust", "python") if r % 2 == 0 else ("python", "rust"):
            samples[kind] += latency_run(a.examples, kind, a.count, a.interval_us, a.elements, r)
    summary = {}
    for kind, lat in samples.items():
        lat.sort()
        summary[kind] = {
            "median_us": statistics.median(lat),
            "p90_us": lat[int(len(lat) * 0.9)],
            "p99_us": lat[int(len(lat) * 0.99)],
            "n": len(lat),
        }
    ratio = summary["rust"]["median_us"] / summary["python"]["median_us"]
    print(f"one-way latency into a Python subscriber ({a.elements} float32 loans, one every {a.interval_us} us, "
          f"{a.rounds} alternating rounds of {a.count})")
    for kind, s in summary.items():
        print(f"  {kind:>6} publisher: median {s['median_us']:7.2f} us   p90 {s['p90_us']:7.2f}   p99 {s['p99_us']:7.2f}")
    print(f"  rust/python median ratio: {ratio:.2f} (target <= 1.2)")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({
            "machine": platform.platform(), "cpus": os.cpu_count(), "from_vec": adopt, "latency": summary,
            "latency_ratio_rust_over_python": ratio,
            "settings": {"count": a.count, "interval_us": a.interval_us, "elements": a.elements, "rounds": a.rounds},
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
