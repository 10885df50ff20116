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
# One intra-op thread: with two, a float64 identity check (Skyformer Lemma 1) intermittently
# disagreed at 3e-9 relative when run after other test files (2 of ~10 runs; 0 of 16 with one
# thread). Under investigation -- see the issue notes; one thread also keeps the suite's
# timing stable on a shared 2-core machine.
torch.set_num_threads(1)
