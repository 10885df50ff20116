"""Shared test configuration: deterministic Hypothesis profile, small thread count."""

import os

import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "approxlab",
    derandomize=True,
    deadline=None,
    max_examples=int(os.environ.get("APPROXLAB_HYPOTHESIS_EXAMPLES", "25")),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("approxlab")
torch.set_num_threads(min(2, torch.get_num_threads()))
