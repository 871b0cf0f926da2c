"""tensorwire.torch benchmarks (issue 11), peers measured in the same run:

1. twt.DataLoader vs torch.utils.data.DataLoader, num_workers=2, on a dataset of dicts holding a 3x224x224 uint8
   image (tv_tensors.Image), a tv_tensors.BoundingBoxes of 1-50 boxes and an int label: batches per second at batch
   sizes 8 and 64. Every batch of twt's loader is checked (types, attributes, values); torch's loader is given the
   collate it needs for boxes of different lengths (a per-sample list), as a user would have to.
2. contiguous_inputs overhead on already-contiguous inputs (ns per tensor argument), and the cost of the copy on
   transposed inputs against torch's .contiguous().

    PYTHONPATH=build/release/pkg .venv/bin/python bench/bench_torch_adapter.py --json bench/results/torch_adapter.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.utils.data import default_collate
from torchvision import tv_tensors

import tensorwire.torch as twt

N_IMAGES = 16  # distinct images the dataset cycles through (generating pixels is not what is measured)


class Detection(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.n = n
        self.images = [torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8, generator=g) for _ in range(N_IMAGES)]
        self.boxes = [torch.rand(1 + (i * 7) % 50, 4, generator=g) * 224 for i in range(N_IMAGES)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        k = i % N_IMAGES
        return {
            "image": tv_tensors.Image(self.images[k]),
            "boxes": tv_tensors.BoundingBoxes(self.boxes[k], format="XYXY", canvas_size=(224, 224)),
            "label": i,
        }


def torch_collate(samples: list) -> dict:
    return {
        "image": default_collate([s["image"] for s in samples]),
        "boxes": [s["boxes"] for s in samples],
        "label": default_collate([s["label"] for s in samples]),
    }


def check(batch: dict, ds: Detection) -> None:
    img, boxes, labels = batch["image"], batch["boxes"], batch["label"]
    assert type(img) is tv_tensors.Image, type(img)
    assert isinstance(boxes, list) and all(type(b) is tv_tensors.BoundingBoxes for b in boxes)
    for j, i in enumerate(labels.tolist()):
        k = i % N_IMAGES
        assert torch.equal(img[j].as_subclass(torch.Tensor), ds.images[k])
        assert torch.equal(boxes[j].as_subclass(torch.Tensor), ds.boxes[k])
        assert boxes[j].canvas_size == (224, 224) and boxes[j].format.name == "XYXY"


def run_loader(make, batches: int, ds: Detection, verify: bool) -> float:
    loader = make()
    it = iter(loader)
    for _ in range(4):  # warm-up: workers started, pools and caches filled
        next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        b = next(it)
        if verify:
            check(b, ds)
    dt = time.perf_counter() - t0
    del it
    return batches / dt


def bench_loaders(rounds: int) -> list[dict]:
    out = []
    for bs, batches in ((8, 300), (64, 60)):
        ds = Detection(bs * (batches + 8) * 2)
        peers = {
            "torch": lambda: torch.utils.data.DataLoader(
                ds, batch_size=bs, num_workers=2, collate_fn=torch_collate, persistent_workers=False
            ),
            "tensorwire": lambda: twt.DataLoader(ds, batch_size=bs, num_workers=2),
        }
        rates: dict[str, list[float]] = {k: [] for k in peers}
        for r in range(rounds):
            for name, make in peers.items():
                rates[name].append(run_loader(make, batches, ds, verify=(name == "tensorwire" and r == 0)))
        # checking values costs time: the verified round is round 0, the figure is the median of the rest
        med = {k: statistics.median(v[1:] if len(v) > 1 else v) for k, v in rates.items()}
        row = {
            "batch_size": bs,
            "torch_batches_per_s": med["torch"],
            "tensorwire_batches_per_s": med["tensorwire"],
            "ratio": med["tensorwire"] / med["torch"],
            "rounds": rates,
        }
        print(
            f"DataLoader bs={bs:3d}: torch {med['torch']:8.1f} batches/s, tensorwire {med['tensorwire']:8.1f} "
            f"batches/s, ratio {row['ratio']:.2f}x"
        )
        out.append(row)
    return out


def per_call_ns(f, args, n: int = 200_000) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            f(*args)
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def bench_contiguous_inputs() -> dict:
    def op(x, w, b):
        return x

    dec = twt.contiguous_inputs(op)
    args = (torch.randn(64, 64), torch.randn(64), torch.randn(64))
    raw = per_call_ns(op, args)
    wrapped = per_call_ns(dec, args)
    overhead = (wrapped - raw) / len(args)
    print(f"contiguous_inputs on contiguous inputs: {overhead:.0f} ns per tensor argument (3 arguments)")
    res = {"overhead_ns_per_tensor_arg": overhead}
    for shape in ((1024, 1024), (4096, 4096)):
        x = torch.randn(*shape).T
        tw_ns = per_call_ns(lambda: twt.contiguous(x), (), n=20 if shape[0] > 1024 else 200)
        th_ns = per_call_ns(lambda: x.contiguous(), (), n=20 if shape[0] > 1024 else 200)
        print(
            f"transposed float32 {shape}: tensorwire {tw_ns / 1e3:.0f} us, torch {th_ns / 1e3:.0f} us "
            f"({th_ns / tw_ns:.2f}x)"
        )
        res[f"transpose_{shape[0]}x{shape[1]}"] = {"tensorwire_ns": tw_ns, "torch_ns": th_ns, "speedup": th_ns / tw_ns}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = {
        "torch": torch.__version__,
        "dataloader": bench_loaders(a.rounds),
        "contiguous_inputs": bench_contiguous_inputs(),
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
