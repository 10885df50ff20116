"""Shared test configuration: the deterministic Hypothesis profile (torch keeps its default threads)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "approxlab",
    derandomize=True,
    deadline=None,
    max_examples=int(os.environ.get("APPROXLAB_HYPOTHESIS_EXAMPLES", "25")),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("approxlab")
