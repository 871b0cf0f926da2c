"""Request/response latency between two processes, both blocked in recv: tensorwire vs multiprocessing.Queue.

A sends a request of SIZE bytes, B answers with 1 byte, A waits for the answer; every round trip is timed from
the first message on (the first few hundred used to take ~115 µs when both processes shared a core and the
subscriber's spin starved its peer). Placements: 'same-core' pins both processes to one CPU (the worst case for
spinning), 'split' pins them to two different CPUs, 'free' lets the scheduler choose. Also times the one-way send() call against Queue.put.

    PYTHONPATH=build/release/pkg .venv/bin/python bench/bench_reqresp.py [--rounds 2000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import uuid

import numpy as np

CTX = mp.get_context("spawn")
SIZES = [64, 4096, 65536, 1 << 20]


def _pin(placement, responder: bool = False) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if placement == "same-core":
        os.sched_setaffinity(0, {cpus[0]})
    elif placement == "split" and len(cpus) > 1:
        os.sched_setaffinity(0, {cpus[1] if responder else cpus[0]})


def _tw_responder(req: str, resp: str, ready, same_core) -> None:
    import tensorwire as tw

    _pin(same_core, True)
    with tw.Subscriber(req) as sub, tw.Publisher(resp) as pub:
        ready.set()
        one = np.zeros(1, np.uint8)
        for t in sub:
            pub.send(one)
            del t


def _mpq_responder(qreq, qresp, ready, same_core) -> None:
    _pin(same_core, True)
    ready.set()
    one = np.zeros(1, np.uint8)
    while True:
        m = qreq.get()
        if m is None:
            return
        qresp.put(one)


def tw_roundtrips(size: int, rounds: int, same_core) -> list[float]:
    import tensorwire as tw

    tag = uuid.uuid4().hex[:8]
    req, resp = f"bench/req/{tag}", f"bench/resp/{tag}"
    ready = CTX.Event()
    with tw.Subscriber(resp) as back:
        p = CTX.Process(target=_tw_responder, args=(req, resp, ready, same_core))
        p.start()
        ready.wait(30)
        _pin(same_core)
        pub = tw.Publisher(req)
        deadline = time.monotonic() + 30
        while (pub.subscribers < 1 or not back.connected) and time.monotonic() < deadline:
            time.sleep(0.001)
        payload = np.zeros(size, np.uint8)
        out = []
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            pub.send(payload)
            back.recv(timeout=10)
            out.append((time.perf_counter_ns() - t0) / 1000)
        pub.close()
        p.join(30)
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    return out


def mpq_roundtrips(size: int, rounds: int, same_core) -> list[float]:
    qreq, qresp, ready = CTX.Queue(), CTX.Queue(), CTX.Event()
    p = CTX.Process(target=_mpq_responder, args=(qreq, qresp, ready, same_core))
    p.start()
    ready.wait(30)
    _pin(same_core)
    payload = np.zeros(size, np.uint8)
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        qreq.put(payload)
        qresp.get(timeout=10)
        out.append((time.perf_counter_ns() - t0) / 1000)
    qreq.put(None)
    p.join(30)
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    return out


def _drain(q, n, done):
    for _ in range(n):
        q.get()
    done.set()


def _tw_drain(name, n, ready):
    import tensorwire as tw

    with tw.Subscriber(name) as sub:
        ready.set()
        for _ in range(n):
            sub.recv(timeout=30)


def send_cost(size: int, n: int) -> dict:
    """Mean µs per send() call (tensorwire, copying a NumPy array in) and per Queue.put (pickling it), with a
    consumer draining on the other side."""
    import tensorwire as tw

    payload = np.zeros(size, np.uint8)
    name = f"bench/send/{uuid.uuid4().hex[:8]}"
    ready = CTX.Event()
    p = CTX.Process(target=_tw_drain, args=(name, n, ready))
    p.start()
    ready.wait(30)
    with tw.Publisher(name, depth=64) as pub:
        while pub.subscribers < 1:
            time.sleep(0.001)
        t0 = time.perf_counter_ns()
        for _ in range(n):
            pub.send(payload)
        tw_us = (time.perf_counter_ns() - t0) / 1000 / n
    p.join(60)
    q, done = CTX.Queue(), CTX.Event()
    c = CTX.Process(target=_drain, args=(q, n, done))
    c.start()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        q.put(payload)
    mp_us = (time.perf_counter_ns() - t0) / 1000 / n  # put() returns before the feeder thread pickles: flush too
    done.wait(60)
    mp_total_us = (time.perf_counter_ns() - t0) / 1000 / n
    c.join(30)
    return {"size": size, "tw_send_us": tw_us, "mpq_put_us": mp_us, "mpq_put_and_deliver_us": mp_total_us}


def summarize(samples: list[float]) -> dict:
    first = samples[:200]
    return {
        "p50_first200_us": statistics.median(first),
        "p50_us": statistics.median(samples),
        "p99_us": float(np.percentile(samples, 99)),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--json")
    ap.add_argument("--placements", default="same-core,split,free")
    a = ap.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",")]
    rows = []
    for placement in a.placements.split(","):
        same = placement
        for method, fn in (("tensorwire", tw_roundtrips), ("mp.Queue", mpq_roundtrips)):
            s = summarize(fn(4096, a.rounds, same))
            rows.append({"placement": placement, "method": method, "size": 4096, **s})
            print(f"round trip 4 KiB  {placement:9s} {method:10s}  p50(first 200) {s['p50_first200_us']:8.1f} µs"
                  f"  p50 {s['p50_us']:8.1f} µs  p99 {s['p99_us']:8.1f} µs", flush=True)
    sends = []
    for size in sizes:
        n = 2000 if size <= 65536 else 300
        r = send_cost(size, n)
        sends.append(r)
        print(f"send {size:>8d} B   tensorwire {r['tw_send_us']:8.2f} µs   mp.Queue.put {r['mpq_put_us']:8.2f} µs"
              f" (put+deliver {r['mpq_put_and_deliver_us']:8.2f} µs)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"roundtrip": rows, "send": sends, "python": sys.version.split()[0]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
