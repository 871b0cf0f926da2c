"""Shared set-up for the tensorwire Python suite.

Hypothesis profiles (select with HYPOTHESIS_PROFILE):
  dev   (default) random seed, 100 examples per property
  ci    fixed seed (derandomize) and ~60 examples: reproducible, used by `make test`
  asan  fixed seed and ~15 examples: the sanitizer build is a slow Debug build
"""

from __future__ import annotations

import gc
import os

import pytest
from hypothesis import HealthCheck, settings

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile("dev", deadline=None, suppress_health_check=_SLOW_OK)
settings.register_profile(
    "ci", derandomize=True, max_examples=60, deadline=None, database=None, print_blob=True,
    suppress_health_check=_SLOW_OK,
)
settings.register_profile(
    "asan", derandomize=True, max_examples=15, deadline=None, database=None, print_blob=True,
    suppress_health_check=_SLOW_OK,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_report_header(config):
    import tensorwire as tw

    return [
        f"tensorwire {tw.__version__} from {os.path.dirname(tw.__file__)}; "
        f"hypothesis profile {getattr(settings, '_current_profile', '?')}; "
        f"under ASan: {os.environ.get('TW_UNDER_ASAN') == '1'}"
    ]


@pytest.fixture(scope="module")
def fast_gc():
    """Moves every object alive before the module's tests (PyTorch, JAX, NumPy...) out of the collector's sight,
    so the full collections that lifetime assertions need take microseconds instead of ~0.3 s each."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()
