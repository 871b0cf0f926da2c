"""`tensorwire bench --net`'s pure parts: how it reads ucx_perftest, which latency the issue-12 target is judged on,
and which table each method's figures land in. (The measurement itself needs root and namespaces: it is run by
hand and recorded in bench/RESULTS.md.)"""

from __future__ import annotations

import pytest

from tensorwire import _bench_net as bn

KiB = 1024


def row(method, size, p50, gbps=1.0, **kw):
    r = {"method": method, "bytes": size, "p50_us": p50, "p99_us": 2 * p50}
    if gbps is not None:  # (tw-cpp-loan's rows have no throughput, as run_cpp_pingpong makes them)
        r.update(throughput_GBps=gbps, msgs_per_s=gbps * 1e9 / size)
    r.update(kw)
    return r


def test_parse_perftest_reads_the_final_line_and_its_percentile():
    text = """
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
Final:                 20000      5.693     6.390     6.390      611.27     611.27      156485      156485
"""
    d = bn.parse_perftest(text)
    assert d["lat_typical_us"] == pytest.approx(5.693)
    assert d["percentile"] == 50.0
    assert d["bytes_per_s"] == pytest.approx(611.27 * 1024 * 1024)
    with pytest.raises(ValueError, match="no result line"):
        bn.parse_perftest("ucx_perftest: connection refused")


def test_the_latency_target_is_judged_on_the_ping_pong_not_the_one_way_figure():
    rows = [row(bn.PERFTEST, 4 * KiB, 6.0),
            row("tw-loan", 4 * KiB, 30.0, pp_p50_us=8.0, pp_p99_us=20.0),    # one-way 5x, ping-pong 1.33x
            row("tw-send", 4 * KiB, 8.0, pp_p50_us=12.0, pp_p99_us=30.0),    # one-way 1.33x, ping-pong 2x
            row("tw-cpp-loan", 4 * KiB, 7.0, pp_p50_us=7.0, pp_p99_us=9.0),
            row("torch-gloo", 4 * KiB, 100.0)]                               # no ping-pong: not judged here
    lat = {t["method"]: t for t in bn.judge(rows) if t["target"].startswith("4 KiB latency")}
    assert set(lat) == {"tw-loan", "tw-send", "tw-cpp-loan"}
    assert lat["tw-loan"]["ratio"] == pytest.approx(8 / 6) and lat["tw-loan"]["hit"]
    assert lat["tw-send"]["ratio"] == pytest.approx(2.0) and not lat["tw-send"]["hit"]
    assert lat["tw-cpp-loan"]["hit"]


def test_a_row_measured_one_way_only_is_not_judged_on_latency():
    rows = [row(bn.PERFTEST, 4 * KiB, 6.0), row("tw-loan", 4 * KiB, 7.0)]  # (a run from before the ping-pong)
    assert not [t for t in bn.judge(rows) if t["target"].startswith("4 KiB latency")]


def test_the_cpp_ping_pong_appears_only_in_the_ping_pong_table():
    rows = [row(bn.PERFTEST, 4 * KiB, 6.0, gbps=0.5),
            row("tw-loan", 4 * KiB, 30.0, gbps=0.2, pp_p50_us=8.0, pp_p99_us=20.0),
            row("tw-cpp-loan", 4 * KiB, 7.25, gbps=None, pp_p50_us=7.25, pp_p99_us=9.0),
            row("mp-pickle", 4 * KiB, 90.0, gbps=0.1)]
    md = bn.markdown(rows)
    one_way, pingpong, throughput = _sections(md)
    assert "tw-cpp-loan" not in one_way and "tw-cpp-loan" not in throughput
    assert "tw-cpp-loan" in pingpong and "7.25 µs" in pingpong
    assert "mp-pickle" in one_way and "mp-pickle" not in pingpong  # pickle has no ping-pong
    assert "8.00 µs" in pingpong  # tw-loan's ping-pong figure, not its one-way one
    assert "tw-cpp-loan" in bn.table(rows)  # the plain-text form too (it never formats a missing throughput)


def _sections(md: str):
    titles = (bn.LATENCY_TITLE, bn.PINGPONG_TITLE, bn.THROUGHPUT_TITLE)
    starts = [md.index(t + ":") for t in titles]
    return [md[a:b] for a, b in zip(starts, starts[1:] + [len(md)])]
