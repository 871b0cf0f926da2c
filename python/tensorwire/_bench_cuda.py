"""``tensorwire bench --device cuda``: tensorwire's CUDA paths against PyTorch's, measured in the same run.

Rows (issue 9's targets in brackets):
  contiguous   device ``contiguous()`` of transposed / sliced / expanded / NHWC layouts vs ``torch.Tensor.contiguous``
               [>= 1.0x torch; transposes >= 70% of device-to-device memcpy bandwidth at >= 64 MiB]
  pinned_h2d   a pageable host batch to the device through the pinned pool vs
               ``torch.Tensor.pin_memory().cuda(non_blocking=True)`` [>= 1.0x; the pool's steady state cheaper
               than torch's first call]
  import       ``tw.asarray`` of a CUDA torch tensor vs ``torch.from_dlpack``
  ipc          CUDA tensors to another process: tensorwire's publish/subscribe (loan, send of a PyTorch tensor,
               re-sent and fresh) vs ``torch.multiprocessing`` (re-sent and fresh), one-way latency and message rate,
               4 KiB to 256 MiB (``tensorwire._bench_cuda_ipc``) [issue 10: loan p50 within 2x across sizes; >= 10x
               lower p50 than torch.multiprocessing; a fresh foreign tensor >= 5x lower]
Times are medians of CUDA-event (device work) or wall-clock (host work) measurements after a warm-up, each over a
batch of calls (the device's time for one call is tens of microseconds at 64 MiB: one call between two events would
time Python and the launch as much as the kernel). The JSON (--out/--json) is rewritten after every section, and on
SIGTERM, so that a run cut short keeps what it measured; a row that fails is a row saying why.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time


def _median_ms(fn, torch, reps: int, device_timed: bool, batch: int = 1) -> float:
    """Median over `reps` samples of the time per call, each sample `batch` calls in a row."""
    for _ in range(max(3, batch)):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        if device_timed:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(batch):
                fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / batch)
        else:
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            torch.cuda.synchronize()
            out.append((time.perf_counter() - t0) * 1e3 / batch)
    return statistics.median(out)


def _save(path, doc) -> None:
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def _row(rows: list, name: str, fn) -> None:
    """Appends fn()'s row, or one saying why it failed (the other rows still run)."""
    try:
        r = fn()
    except Exception as e:  # noqa: BLE001 - reported as a row, never hidden
        r = {"row": name, "error": f"{type(e).__name__}: {e}"}
    rows.append(r)
    print(json.dumps(r), flush=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tensorwire bench --device cuda")
    p.add_argument("--out", "--json", dest="out", metavar="FILE", help="write the results as JSON here")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--mib", type=int, default=64, help="size of the large layouts, MiB")
    p.add_argument("--ipc-sizes", default=None, help="sizes of the ipc rows, e.g. 4K,1M,256M (default 4 KiB-256 MiB)")
    p.add_argument("--ipc-methods", default=None, help="methods of the ipc rows, comma-separated (default: all)")
    p.add_argument("--ipc-n", type=int, default=200, help="latency messages per size in the ipc rows")
    p.add_argument("--no-ipc", action="store_true", help="leave out the ipc rows (between processes)")
    args = p.parse_args(argv)
    from ._bench_ipc import check_writable, parse_sizes

    args.ipc_size_list = parse_sizes(p, args.ipc_sizes, "--ipc-sizes")  # (checked before anything is measured)
    check_writable(p, "--out", args.out)
    if args.ipc_methods and not args.no_ipc:  # (checked before anything is measured)
        from ._bench_cuda_ipc import METHODS

        unknown = sorted(set(args.ipc_methods.split(",")) - set(METHODS))
        if unknown:
            print(f"tensorwire bench --device cuda: unknown --ipc-methods {unknown}; choose from {METHODS}",
                  file=sys.stderr)
            return 2
    import tensorwire as tw

    if not tw.cuda.is_available():
        print(f"tensorwire bench --device cuda: no CUDA device ({tw.cuda.status()})", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("tensorwire bench --device cuda: PyTorch has no CUDA here", file=sys.stderr)
        return 2
    rows: list[dict] = []
    verdicts: list[dict] = []
    doc = {"device": torch.cuda.get_device_name(0), "status": tw.cuda.status(),
           "kernels_built": tw.cuda.kernels_built(),
           "rows": rows, "targets": verdicts, "complete": False}
    save = lambda: _save(args.out, doc)  # noqa: E731
    # `timeout` ends a step with SIGTERM: exit through the finally below, which saves what was measured.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        _measure(args, tw, torch, rows, verdicts, save)
        doc["complete"] = True
    finally:
        save()
    return 0


def _measure(args, tw, torch, rows, verdicts, save) -> None:
    reps = args.reps
    n = args.mib * (1 << 20) // 4  # float32 elements
    side = int(n ** 0.5)
    base = torch.randn(side, side, device="cuda")
    batch = 10  # calls per timed sample of device work
    memcpy = {}

    def d2d():
        copy_ms = _median_ms(lambda: base.clone(), torch, reps, True, batch)
        memcpy["GBps"] = 2 * base.numel() * 4 / copy_ms / 1e6  # read + write
        return {"row": "d2d_memcpy", "bytes": base.numel() * 4, "ms": copy_ms, "GBps": memcpy["GBps"]}

    _row(rows, "d2d_memcpy", d2d)
    nhwc = torch.randn(64, 3, 224, 224, device="cuda").permute(0, 2, 3, 1)
    layouts = {
        "transposed": base.t(),
        "sliced_every_other_column": base[:, ::2],
        "expanded_row": base[:1].expand(side, side),
        "nhwc": nhwc,
    }

    def contiguous(name, x):
        t = tw.asarray(x)
        # bit-exact, once
        if not torch.equal(torch.from_dlpack(t.contiguous()), x.contiguous()):
            raise AssertionError(f"{name}: tensorwire's contiguous() differs from torch's")
        tw_ms = _median_ms(lambda: t.contiguous(), torch, reps, True, batch)
        th_ms = _median_ms(lambda: x.contiguous(), torch, reps, True, batch)
        nbytes = x.numel() * x.element_size()
        # (bytes moved: what is written, and what is read: all of it, but an expanded row reads one row)
        read = nbytes if name != "expanded_row" else x.shape[1] * x.element_size()
        row = {"row": "contiguous", "layout": name, "bytes": nbytes, "tw_ms": tw_ms, "torch_ms": th_ms,
               "ratio_vs_torch": th_ms / tw_ms, "tw_GBps": (nbytes + read) / tw_ms / 1e6}
        if name == "transposed" and "GBps" in memcpy:
            row["fraction_of_memcpy"] = row["tw_GBps"] / memcpy["GBps"]
        return row

    for name, x in layouts.items():
        _row(rows, f"contiguous {name}", lambda name=name, x=x: contiguous(name, x))
    save()

    def pinned():
        batch_h = torch.randn(256, 3, 64, 64)  # a pageable host batch, 12 MiB
        h = tw.asarray(batch_h)
        tw_ms = _median_ms(lambda: h.to("cuda:0"), torch, reps, False)
        t0 = time.perf_counter()
        batch_h.pin_memory().cuda(non_blocking=True)
        torch.cuda.synchronize()
        torch_first = (time.perf_counter() - t0) * 1e3
        th_ms = _median_ms(lambda: batch_h.pin_memory().cuda(non_blocking=True), torch, reps, False)
        return {"row": "pinned_h2d", "bytes": batch_h.numel() * 4, "tw_ms": tw_ms, "torch_ms": th_ms,
                "torch_first_ms": torch_first, "ratio_vs_torch": th_ms / tw_ms}

    _row(rows, "pinned_h2d", pinned)

    def imports():
        x = torch.randn(1024, device="cuda")
        # (host work of a few microseconds: timed over 1000 calls, one synchronize at the end)
        tw_ms = _median_ms(lambda: tw.asarray(x), torch, reps, False, 1000)
        th_ms = _median_ms(lambda: torch.from_dlpack(x), torch, reps, False, 1000)
        return {"row": "import", "tw_ms": tw_ms, "torch_ms": th_ms, "ratio_vs_torch": th_ms / tw_ms}

    _row(rows, "import", imports)
    save()
    if not args.no_ipc:
        from . import _bench_cuda_ipc as ipc
        sizes = args.ipc_size_list
        methods = args.ipc_methods.split(",") if args.ipc_methods else None
        print("ipc: CUDA tensors to another process", flush=True)
        done = len(rows)

        def on_rows(ipc_rows):
            del rows[done:]
            rows.extend(ipc_rows)
            save()

        ipc_rows = ipc.run(sizes, methods, args.ipc_n, "cuda:0", log=lambda m: print(m, flush=True),
                           on_rows=on_rows)
        on_rows(ipc_rows)
        verdicts += ipc.judge(ipc_rows)
        for v in verdicts:
            where = f" at {v['bytes']} B" if "bytes" in v else ""
            print(f"  target {v['target']}{where}: {v['value']:.2f}  {'hit' if v['hit'] else 'MISSED'}")
