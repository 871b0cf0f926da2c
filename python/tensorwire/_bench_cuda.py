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
Times are medians of CUDA-event (device work) or wall-clock (host work) measurements after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def _median_ms(fn, torch, reps: int, device_timed: bool) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        if device_timed:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tensorwire bench --device cuda")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--mib", type=int, default=64, help="size of the large layouts, MiB")
    p.add_argument("--ipc-sizes", default=None, help="sizes of the ipc rows, e.g. 4K,1M,256M (default 4 KiB-256 MiB)")
    p.add_argument("--ipc-methods", default=None, help="methods of the ipc rows, comma-separated (default: all)")
    p.add_argument("--ipc-n", type=int, default=200, help="latency messages per size in the ipc rows")
    p.add_argument("--no-ipc", action="store_true", help="leave out the ipc rows (between processes)")
    args = p.parse_args(argv)
    import tensorwire as tw

    if not tw.cuda.is_available():
        print(f"tensorwire bench --device cuda: no CUDA device ({tw.cuda.status()})", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("tensorwire bench --device cuda: PyTorch has no CUDA here", file=sys.stderr)
        return 2
    rows: list[dict] = []
    reps = args.reps
    n = args.mib * (1 << 20) // 4  # float32 elements
    side = int(n ** 0.5)
    base = torch.randn(side, side, device="cuda")
    copy_ms = _median_ms(lambda: base.clone(), torch, reps, True)
    memcpy_gbs = 2 * base.numel() * 4 / copy_ms / 1e6  # read + write
    rows.append({"row": "d2d_memcpy", "bytes": base.numel() * 4, "ms": copy_ms, "GBps": memcpy_gbs})
    nhwc = torch.randn(64, 3, 224, 224, device="cuda").permute(0, 2, 3, 1)
    layouts = {
        "transposed": base.t(),
        "sliced_every_other_column": base[:, ::2],
        "expanded_row": base[:1].expand(side, side),
        "nhwc": nhwc,
    }
    for name, x in layouts.items():
        t = tw.asarray(x)
        tw_ms = _median_ms(lambda: t.contiguous(), torch, reps, True)
        th_ms = _median_ms(lambda: x.contiguous(), torch, reps, True)
        nbytes = x.numel() * x.element_size()
        row = {"row": "contiguous", "layout": name, "bytes": nbytes, "tw_ms": tw_ms, "torch_ms": th_ms,
               "ratio_vs_torch": th_ms / tw_ms, "tw_GBps": 2 * nbytes / tw_ms / 1e6}
        if name == "transposed":
            row["fraction_of_memcpy"] = row["tw_GBps"] / memcpy_gbs
        rows.append(row)
        # bit-exact, once
        assert torch.equal(torch.from_dlpack(t.contiguous()), x.contiguous()), name
    batch = torch.randn(256, 3, 64, 64)  # a pageable host batch, 12 MiB
    h = tw.asarray(batch)
    tw_ms = _median_ms(lambda: h.to("cuda:0"), torch, reps, False)
    t0 = time.perf_counter()
    batch.pin_memory().cuda(non_blocking=True)
    torch.cuda.synchronize()
    torch_first = (time.perf_counter() - t0) * 1e3
    th_ms = _median_ms(lambda: batch.pin_memory().cuda(non_blocking=True), torch, reps, False)
    rows.append({"row": "pinned_h2d", "bytes": batch.numel() * 4, "tw_ms": tw_ms, "torch_ms": th_ms,
                 "torch_first_ms": torch_first, "ratio_vs_torch": th_ms / tw_ms})
    x = torch.randn(1024, device="cuda")
    tw_ms = _median_ms(lambda: tw.asarray(x), torch, reps * 10, False)
    th_ms = _median_ms(lambda: torch.from_dlpack(x), torch, reps * 10, False)
    rows.append({"row": "import", "tw_ms": tw_ms, "torch_ms": th_ms, "ratio_vs_torch": th_ms / tw_ms})
    for r in rows:
        print(json.dumps(r))
    verdicts = []
    if not args.no_ipc:
        from . import _bench_cuda_ipc as ipc
        from ._bench_ipc import parse_size

        sizes = [parse_size(s) for s in args.ipc_sizes.split(",")] if args.ipc_sizes else None
        methods = args.ipc_methods.split(",") if args.ipc_methods else None
        unknown = sorted(set(methods or ()) - set(ipc.METHODS))
        if unknown:
            print(f"tensorwire bench --device cuda: unknown --ipc-methods {unknown}; choose from {ipc.METHODS}",
                  file=sys.stderr)
            return 2
        print("ipc: CUDA tensors to another process", flush=True)
        ipc_rows = ipc.run(sizes, methods, args.ipc_n, "cuda:0", log=lambda m: print(m, flush=True))
        rows += ipc_rows
        verdicts = ipc.judge(ipc_rows)
        for v in verdicts:
            where = f" at {v['bytes']} B" if "bytes" in v else ""
            print(f"  target {v['target']}{where}: {v['value']:.2f}  {'hit' if v['hit'] else 'MISSED'}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "status": tw.cuda.status(), "rows": rows,
                       "targets": verdicts}, f, indent=1)
    return 0
