"""`tensorwire demo`: each hazard this library removes, shown on real libraries, as a table.

Every row is a real bug seen in the wild: a tensor crossing a boundary and arriving wrong. Each row performs the
crossing with tensorwire and checks the result against the source, element by element.
"""

from __future__ import annotations

import gc
import time

import numpy as np

import tensorwire as tw


def _row(rows, hazard, how, ok, detail=""):
    rows.append((hazard, how, "right" if ok else "WRONG", detail))


def _timeit(fn, repeat=3):
    best = float("inf")
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _stacked(rows, torch):
    # torch.stack result; the second plane starts half-way into the allocation. Shipping the allocation without
    # its offset and layout is how half of it arrived as zeros.
    a, b = torch.arange(12.0).reshape(3, 4), torch.arange(100.0, 112.0).reshape(3, 4)
    s = torch.stack([a, b])
    whole = tw.asarray(s)  # the allocation
    plane = whole[1]  # a view half-way into it
    back_torch, back_np = torch.from_dlpack(plane), np.from_dlpack(plane)
    ok = (
        plane.byte_offset == 12 * 4
        and plane.allocation == whole.allocation
        and plane.data_ptr == s[1].data_ptr()
        and torch.equal(back_torch, b)
        and np.array_equal(back_np, b.numpy())
    )
    _row(rows, "stacked tensor's 2nd plane via DLPack", "allocation + byte_offset + strides travel together", ok,
         f"byte_offset={plane.byte_offset}, values match, zero-copy={plane.data_ptr == s[1].data_ptr()}")


def _permuted(rows, torch):
    x = torch.arange(24.0).reshape(2, 3, 4).permute(2, 0, 1)
    t = tw.asarray(x)
    n = np.from_dlpack(t)
    ok = np.array_equal(n, x.numpy()) and t.strides == tuple(x.stride()) and n.ctypes.data == x.data_ptr()
    _row(rows, "permuted tensor torch -> numpy via DLPack", "strides in elements, no copy", ok,
         f"strides={t.strides}")


def _cuda_stream_none(rows):
    class CudaArray:  # what a GPU library hands over; never dereferenced here
        __cuda_array_interface__ = {
            "version": 3, "shape": (2, 3), "typestr": "<f4", "data": (0xDEAD0000, False),
            "strides": None, "stream": None,
        }

    try:
        t = tw.asarray(CudaArray(), device="cuda:0")
        ok = t.stream is None and str(t.device) == "cuda:0" and t.shape == (2, 3)
        detail = "stream None = no sync (legal in v3)"
    except Exception as e:  # the bug this row guards against
        ok, detail = False, f"{type(e).__name__}: {e}"
    _row(rows, '__cuda_array_interface__ with "stream": None', "None means no synchronisation", ok, detail)


def _strided_op(rows, torch):
    x = torch.arange(20.0).reshape(4, 5).t()[1:, ::2]  # what autograd hands a custom op
    t = tw.asarray(x)
    c = t.contiguous()
    ok = (not t.is_contiguous()) and c.is_contiguous() and np.array_equal(np.asarray(c), x.contiguous().numpy())
    _row(rows, "strided view into an op that assumes contiguous", "is_contiguous() + one contiguous() copy", ok,
         f"strides={t.strides} -> {c.strides}")


def _expanded(rows, torch):
    x = torch.arange(4.0).expand(1000, 4)  # stride 0
    t = tw.asarray(x)
    c = t.contiguous()
    ok = t.strides[0] == 0 and np.array_equal(np.asarray(c), x.contiguous().numpy())
    _row(rows, "expanded (stride-0) tensor made contiguous", "broadcast rows filled, not aliased", ok,
         f"strides={t.strides}")


def _adopt(rows, size):
    buf = np.ones(size, dtype=np.float32)
    t_copy, c = _timeit(lambda: np.array(buf, copy=True), repeat=2)
    del c
    gc.collect()
    t_tw, t = _timeit(lambda: tw.asarray(buf), repeat=3)
    ok = t.data_ptr == buf.ctypes.data and t.shape == (size,)
    _row(rows, f"wrapping a {size * 4 / 2**20:.0f} MiB buffer as a tensor", "zero-copy with lifetime tracked", ok,
         f"tw.asarray {t_tw * 1e6:.1f} us vs copying {t_copy * 1e3:.1f} ms")


def _metadata(rows):
    import pickle

    t = tw.asarray(np.zeros((4, 4), dtype=np.float32))
    t.metadata["format"] = "XYXY"
    t.metadata["canvas_size"] = (480, 640)
    views = [t[1:], t.T.contiguous(), tw.asarray(t, copy=True), pickle.loads(pickle.dumps(t, protocol=5))]
    ok = all(dict(v.metadata) == {"format": "XYXY", "canvas_size": (480, 640)} for v in views)
    _row(rows, "metadata through views, copies and pickling", "deep-copied with exact types", ok,
         "format='XYXY', canvas_size=(480, 640)")


def _negative(rows, torch):
    a = np.arange(10.0)[::-1]
    t = tw.asarray(a)
    try:
        back = torch.from_dlpack(t)
        ok = np.array_equal(back.numpy(), a)
        detail = "copied on export (PyTorch aborts on negative strides)"
    except Exception as e:
        ok, detail = False, f"{type(e).__name__}: {e}"
    _row(rows, "negative-stride view into PyTorch", "one copy instead of a crash", ok, detail)


def main(size: int = 100_000_000) -> int:
    rows: list[tuple[str, str, str, str]] = []
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        _stacked(rows, torch)
        _permuted(rows, torch)
    _cuda_stream_none(rows)
    if torch is not None:
        _strided_op(rows, torch)
        _expanded(rows, torch)
        _negative(rows, torch)
    _adopt(rows, size)
    _metadata(rows)
    try:
        from . import _demo_ipc  # the inter-process rows, when the IPC layer is built

        _demo_ipc.rows(rows, _row)
    except ImportError:
        pass
    headers = ("hazard", "what tensorwire does", "result", "detail")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "+".join("-" * (w + 2) for w in widths)
    print(f"tensorwire {tw.__version__} demo: each boundary crossing checked element by element\n")
    print(" | ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print(line)
    for r in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths)))
    wrong = sum(r[2] != "right" for r in rows)
    print(f"\n{len(rows) - wrong} of {len(rows)} came out right")
    return 1 if wrong else 0
