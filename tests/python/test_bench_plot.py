"""`tensorwire bench` output (issue 14): sizes in binary units, p50 and p99, and no bytes/s for methods that do not
move the payload (a loaned buffer is mapped, not copied), in the printed table, the Markdown, the JSON and the
plot; JSON written before rows said zero_copy still loads."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from tensorwire import _bench_ipc as bench

KiB, MiB = 1 << 10, 1 << 20
SIZES = [64, 4 * KiB, MiB, 256 * MiB]
LABELS = ["64 B", "4 KiB", "1 MiB", "256 MiB"]
REPO = pathlib.Path(__file__).resolve().parents[2]


def _rows():
    """Synthetic rows as an older version wrote them: every row with a throughput_GBps, none with zero_copy."""
    rows = []
    for i, m in enumerate(("tw-send", "tw-loan", "mp-queue", "iceoryx2")):
        for s in SIZES:
            msgs = 1000.0 * (i + 1)
            rows.append({"method": m, "bytes": s, "n": 20, "p50_us": 10.0 + i, "p99_us": 1000.0 * (i + 1),
                         "throughput_GBps": msgs * s / 1e9, "msgs_per_s": msgs})
    return rows


def _column(text, title, header):
    """The cells of one method's column in one of table()'s two tables."""
    lines = text.splitlines()
    start = lines.index(title)
    head = lines[start + 2].split("|")
    col = [h.strip() for h in head].index(header)
    body = []
    for line in lines[start + 4:]:
        if not line.strip():
            break
        body.append(line.split("|")[col].strip())
    return body


def test_size_labels_are_binary_units():
    assert [bench.fmt_size(s) for s in SIZES] == LABELS
    assert bench.fmt_size(256) == "256 B" and bench.fmt_size(1 << 30) == "1 GiB"
    assert bench.fmt_size(1536) == "1.5 KiB"  # not a whole multiple: still readable, never "1536 B" or "1.5e3"
    assert bench.parse_size("4K") == 4 * KiB and bench.parse_size("256M") == 256 * MiB


def test_zero_copy_is_decided_by_the_method_and_drops_bytes_per_second():
    for r in map(bench.normalized, _rows()):
        assert r["zero_copy"] == (r["method"] in ("tw-loan", "iceoryx2"))
        if r["zero_copy"]:
            assert "throughput_GBps" not in r and bench.fmt_throughput(r).endswith("msg/s")
        else:
            assert r["throughput_GBps"] == pytest.approx(r["msgs_per_s"] * r["bytes"] / 1e9)
            assert bench.fmt_throughput(r).endswith("B/s") and "msg" not in bench.fmt_throughput(r)
    assert bench.ZERO_COPY == {"tw-loan", "torch-resent", "iceoryx2"}
    # A row that says it was not copied is believed, whatever its method; one without msgs_per_s gets it derived.
    said = bench.normalized({"method": "tw-send", "bytes": 64, "p50_us": 1.0, "p99_us": 2.0, "zero_copy": True,
                             "throughput_GBps": 1.0, "msgs_per_s": 5.0})
    assert "throughput_GBps" not in said and bench.fmt_throughput(said) == "5.00 msg/s"
    old = bench.normalized({"method": "mp-queue", "bytes": 1000, "p50_us": 1.0, "p99_us": 2.0,
                            "throughput_GBps": 0.001})
    assert old["msgs_per_s"] == pytest.approx(1000.0) and bench.fmt_throughput(old) == "1.00 MB/s"


def test_units_are_readable():
    assert bench.fmt_unit(16.034, bench.TIME_UNITS) == "16.0 us"
    assert bench.fmt_unit(94152.0, bench.TIME_UNITS) == "94.2 ms"
    assert bench.fmt_unit(5389395.3, bench.TIME_UNITS) == "5.39 s"
    assert bench.fmt_unit(999.7, bench.TIME_UNITS) == "1.00 ms"  # rounded before the unit is chosen
    assert bench.fmt_unit(999_951.0, bench.TIME_UNITS) == "1.00 s"
    assert bench.fmt_unit(1000.0, bench.TIME_UNITS_MICRO, tick=True) == "1 ms"
    assert bench.fmt_unit(1.31e9, bench.BYTE_RATE_UNITS) == "1.31 GB/s"
    assert bench.fmt_unit(61840.1, bench.MSG_RATE_UNITS) == "61.8k msg/s"
    assert bench.fmt_unit(0.5, bench.MSG_RATE_UNITS) == "0.50 msg/s"


def test_table_has_sizes_p99_and_no_bytes_per_second_for_zero_copy():
    text = bench.table(_rows())
    assert "p50 / p99" in text and bench.ZERO_COPY_NOTE in text
    assert _column(text, bench.LATENCY_TITLE, "size") == LABELS
    # p99 is printed: the synthetic p99 of tw-send is 1000 us = 1.00 ms at every size.
    assert _column(text, bench.LATENCY_TITLE, "tw-send") == ["10.0 us / 1.00 ms"] * 4
    for m in ("tw-loan (zero-copy)", "iceoryx2 (zero-copy)"):
        cells = _column(text, bench.THROUGHPUT_TITLE, m)
        assert len(cells) == 4 and all(c.endswith("msg/s") for c in cells), cells
    for m in ("tw-send", "mp-queue"):
        cells = _column(text, bench.THROUGHPUT_TITLE, m)
        assert len(cells) == 4 and all(c.endswith("B/s") for c in cells), cells
    # tw-loan's old figure (2000 msg/s x 256 MiB = 537 GB/s) is nowhere.
    assert "537" not in text and "GB/s" not in "".join(_column(text, bench.THROUGHPUT_TITLE, "tw-loan (zero-copy)"))
    md = bench.markdown(_rows())
    assert "| 256 MiB |" in md and "p99" in md and "| tw-loan (zero-copy) |" in md and "2.00k msg/s" in md


def test_plot_labels_sizes_and_separates_zero_copy(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib")
    path = tmp_path / "bench.png"
    fig = bench.plot(_rows(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    fig.canvas.draw()
    lat, copied, rate = fig.axes
    for ax in (lat, copied, rate):
        assert [t.get_text() for t in ax.get_xticklabels()] == LABELS
        assert [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()] == []
    # Latency: per method a solid p50 and a dashed p99 of the same colour.
    solid = {ln.get_label(): ln for ln in lat.lines if ln.get_linestyle() == "-"}
    dashed = [ln for ln in lat.lines if ln.get_linestyle() == "--"]
    assert set(solid) == {"tw-send", "tw-loan (zero-copy)", "mp-queue", "iceoryx2 (zero-copy)"} and len(dashed) == 4
    assert {ln.get_color() for ln in dashed} == {ln.get_color() for ln in solid.values()}
    assert [list(ln.get_ydata()) for ln in dashed][0] == [1000.0] * 4  # tw-send's p99
    assert "p99" in lat.get_title() and any(t.get_text() == "10 µs" for t in lat.get_yticklabels())
    # Bytes per second only for the copying methods; messages per second, saying so, for the zero-copy ones.
    assert [ln.get_label() for ln in copied.lines] == ["tw-send", "mp-queue"]
    assert [ln.get_label() for ln in rate.lines] == ["tw-loan (zero-copy)", "iceoryx2 (zero-copy)"]
    assert "not moved" in rate.get_title()
    assert all(t.get_text().endswith("msg/s") for t in rate.get_yticklabels() if t.get_text())
    assert all(t.get_text().endswith("B/s") for t in copied.get_yticklabels() if t.get_text())
    assert list(copied.lines[0].get_ydata()) == pytest.approx([1000.0 * s for s in SIZES])  # tw-send, bytes/s


@pytest.mark.parametrize("name", ["ipc_results.json", "results/ipc_quick_before.json"])
def test_old_json_loads_and_plots(name, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib")
    src = REPO / "bench" / name
    out_json, out_png = tmp_path / "again.json", tmp_path / "again.png"
    assert bench.main(["--from-json", str(src), "--json", str(out_json), "--plot", str(out_png)]) == 0
    text = capsys.readouterr().out
    assert "p50 / p99" in text and "zero-copy" in text and "4 KiB" in text and out_png.stat().st_size > 0
    rows = json.loads(out_json.read_text())["rows"]
    for r in rows:
        assert r["zero_copy"] == (r["method"] in bench.ZERO_COPY)
        assert ("throughput_GBps" in r) != r["zero_copy"]


def test_bench_command_writes_zero_copy_rows(tmp_path):
    """Two fast methods, two sizes, the quick mode: a few seconds."""
    out_json = tmp_path / "b.json"
    cmd = [sys.executable, "-m", "tensorwire", "bench", "--sizes", "64,4K", "--methods", "tw-send,tw-loan",
           "--json", str(out_json)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "p50 / p99" in p.stdout and "msg/s" in p.stdout and "tw-loan (zero-copy)" in p.stdout
    rows = json.loads(out_json.read_text())["rows"]
    assert {(r["method"], r["bytes"]) for r in rows} == {(m, s) for m in ("tw-send", "tw-loan") for s in (64, 4096)}
    for r in rows:
        assert r["p99_us"] >= r["p50_us"] > 0 and r["msgs_per_s"] > 0
        if r["method"] == "tw-loan":
            assert r["zero_copy"] is True and "throughput_GBps" not in r
        else:
            assert r["zero_copy"] is False
            assert r["throughput_GBps"] == pytest.approx(r["msgs_per_s"] * r["bytes"] / 1e9)
    assert json.loads(out_json.read_text())["kind"] == "ipc"  # --from-json tells the modes' files apart by it


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tensorwire", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,says", [
    (["bench", "--sizes", "4Q"], "--sizes: '4Q' is not a size"),
    (["bench", "--sizes", "64K,"], "--sizes: '' is not a size"),
    (["bench", "--sizes", "nan"], "--sizes: 'nan' is not a size"),
    (["bench", "--net", "--sizes", "abc"], "--sizes: 'abc' is not a size"),
    (["bench", "--device", "cuda", "--ipc-sizes", "1X"], "--ipc-sizes: '1X' is not a size"),
    (["bench", "--json", "/nonexistent-dir/x.json"], "--json /nonexistent-dir/x.json: there is no directory"),
    (["bench", "--plot", "/nonexistent-dir/x.png"], "--plot /nonexistent-dir/x.png: there is no directory"),
    (["bench", "--from-json", "/nonexistent-file.json"], "--from-json /nonexistent-file.json: No such file"),
    (["bench", "--from-json", str(REPO / "README.md")], "not JSON"),
    (["bench", "--from-json", str(REPO / "bench" / "results" / "net.json")], "`tensorwire bench --net` result"),
    (["bench", "--net", "--from-json", str(REPO / "bench" / "ipc_results.json")], "`tensorwire bench` result"),
    (["bench", "--methods", "nope"], "unknown method 'nope'"),
    (["demo", "--size", "-5"], "argument --size: -5: must be at least 1"),
    (["demo", "--size", "x"], "argument --size: 'x' is not a whole number"),
])
def test_bad_command_line_arguments_are_usage_errors_before_anything_runs(args, says, tmp_path):
    # A traceback after a long measurement (an unwritable --json), or a bogus table from another mode's file, was
    # what a user got; now: exit status 2, one line naming the argument, nothing measured.
    p = _cli(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert says in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "quick mode" not in p.stdout and "p50" not in p.stdout, p.stdout
