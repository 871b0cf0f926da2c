"""The harness of `tensorwire bench --device cuda`'s "ipc" rows (tensorwire._bench_cuda_ipc), run with host tensors
so that it is proven on machines without a GPU: every method crosses to a spawned consumer, the rows carry what
the targets are judged on, the judge compares like with like, and a method that cannot run is a row saying why."""

import re

import pytest

pytest.importorskip("torch")

from tensorwire import _bench_cuda_ipc as ipc  # noqa: E402


def test_every_method_crosses_to_a_spawned_consumer_and_is_judged():
    rows = ipc.run([4096, 65536], ipc.METHODS, n_lat=12, device="cpu", log=lambda m: None)
    assert [r.get("error") for r in rows] == [None] * len(rows)
    assert {(r["method"], r["bytes"]) for r in rows} == {(m, s) for m in ipc.METHODS for s in (4096, 65536)}
    for r in rows:
        assert r["n"] == 12
        assert 0 < r["p50_us"] <= r["p99_us"] < 60e6
        assert r["msgs_per_s"] > 0
        assert r["GBps_equiv"] == pytest.approx(r["msgs_per_s"] * r["bytes"] / 1e9)
    verdicts = ipc.judge(rows)
    targets = {(v["target"], v.get("bytes")) for v in verdicts}
    assert ("tw-loan p50 within 2x across sizes", None) in targets
    for ours, theirs, f in (("tw-loan", "torch-resent", 10), ("tw-send-resent", "torch-resent", 10),
                            ("tw-send-fresh", "torch-fresh", 5)):
        for size in (4096, 65536):
            assert (f"{ours} p50 >= {f}x lower than {theirs}", size) in targets


def test_judge_compares_the_same_sizes_and_says_missed():
    rows = [{"method": "tw-loan", "bytes": 4096, "p50_us": 10.0}, {"method": "tw-loan", "bytes": 1 << 20, "p50_us": 30.0},
            {"method": "torch-resent", "bytes": 4096, "p50_us": 200.0},
            {"method": "torch-resent", "bytes": 1 << 20, "p50_us": 600.0},
            {"method": "tw-send-fresh", "bytes": 4096, "p50_us": 50.0},
            {"method": "torch-fresh", "bytes": 4096, "p50_us": 200.0}, {"method": "torch-fresh", "error": "x"}]
    v = {(x["target"], x.get("bytes")): x for x in ipc.judge(rows)}
    assert v[("tw-loan p50 within 2x across sizes", None)]["value"] == pytest.approx(3.0)
    assert not v[("tw-loan p50 within 2x across sizes", None)]["hit"]
    assert v[("tw-loan p50 >= 10x lower than torch-resent", 4096)]["hit"]  # 20x
    assert v[("tw-loan p50 >= 10x lower than torch-resent", 1 << 20)]["hit"]  # 20x
    assert not v[("tw-send-fresh p50 >= 5x lower than torch-fresh", 4096)]["hit"]  # 4x
    assert ("tw-send-resent p50 >= 10x lower than torch-resent", 4096) not in v  # nothing measured


def test_a_method_that_cannot_run_is_a_row_saying_why(monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the failure below would not happen")
    monkeypatch.setattr(ipc, "WAIT_S", 20.0)
    rows = ipc.run([4096], ["tw-loan"], n_lat=2, device="cuda:0", log=lambda m: None)
    assert len(rows) == 1 and rows[0]["method"] == "tw-loan"
    assert "error" in rows[0] and rows[0]["error"], rows
    # the reason the device is missing (torch's or tensorwire's words), not a failure of the harness itself
    assert re.search(r"NVIDIA driver|CUDA|cuda:0", rows[0]["error"]), rows[0]["error"]


def test_a_consumer_that_failed_or_died_is_reported_at_once_with_its_reason():
    import multiprocessing
    import time
    from types import SimpleNamespace

    here, there = multiprocessing.Pipe()
    alive = SimpleNamespace(exitcode=None)
    there.send(("error", "Traceback (most recent call last):\n  ...\nValueError: the consumer's own words\n"))
    with pytest.raises(RuntimeError, match="the consumer failed: ValueError: the consumer's own words"):
        ipc._wait(here, "acknowledgement", alive)
    there.send(b"k")
    assert ipc._wait(here, "acknowledgement", alive) == b"k"
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited with -9 before sending its result"):
        ipc._wait(here, "result", SimpleNamespace(exitcode=-9))
    assert time.monotonic() - t0 < 5, "a dead consumer must not cost WAIT_S"


def test_the_cuda_benchmark_is_reachable_as_scripts_test_gpu_calls_it(tmp_path):
    # scripts/test-gpu.sh looks for --device in `tensorwire bench --help`, then runs `bench --device cuda` with
    # --out or --json: both must reach tensorwire._bench_cuda (without a GPU it says why and exits 2).
    import subprocess
    import sys

    import tensorwire as tw

    help_text = subprocess.run([sys.executable, "-m", "tensorwire", "bench", "--help"], capture_output=True,
                               text=True, timeout=120, check=True).stdout
    assert "--device" in help_text and "--json" in help_text
    if tw.cuda.is_available():
        pytest.skip("this machine has CUDA: the benchmark would run")
    for flag in ("--out", "--json"):
        r = subprocess.run([sys.executable, "-m", "tensorwire", "bench", "--device", "cuda", flag,
                            str(tmp_path / "b.json")], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, (r.returncode, r.stderr)
        assert "no CUDA device" in r.stderr, r.stderr
