"""Bounded soak and fault runs of the shared-memory transport (tests/soak/ipc_soak.py; `make soak` runs long ones):
fan-out to 4 subscriber processes with sequence numbers and checksums, and SIGKILL of either side at seeded random
points with fds, mappings and /dev/shm entries counted before and after each round."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "soak"))
import ipc_soak  # noqa: E402

UNDER_ASAN = os.environ.get("TW_UNDER_ASAN") == "1"


def test_fanout_to_four_subscribers_loses_duplicates_reorders_and_corrupts_nothing():
    ipc_soak.fanout(subscribers=4, messages=600 if UNDER_ASAN else 5000, seed=1)


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_of_either_side_never_hangs_corrupts_or_leaks(seed):
    ipc_soak.kill(rounds=4 if UNDER_ASAN else 12, seed=seed)
