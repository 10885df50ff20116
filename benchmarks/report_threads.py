"""numpy's BLAS threads on a study report's small products: the default count against one thread.

A study's report resamples its claims thousands of times; the perplexity study's stratified rho, for one, ranks a
window's points under each draw's method multiplicities by one product of a ``(resamples, points)`` matrix with a
``(points, points)`` one (200 x 165 by 165 x 165 at the declared grid). This script times 240 such products (one
calibration draw of one statistic at 12 windows, twice) with numpy's BLAS at its default thread count and at one
thread (:func:`threadpoolctl.threadpool_limits`, as :func:`approxlab.studies.engine.environment.study_threads`
now sets it), in turn, and prints wall and CPU seconds with the 1-minute load average as a JSON line.

Run from the repository root::

    python3 benchmarks/report_threads.py
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits


def _products(c: np.ndarray, comparisons: np.ndarray, repeats: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(repeats):
        c @ comparisons.T
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    rng = np.random.default_rng(0)
    c = rng.integers(0, 3, (200, 165)).astype(float)
    comparisons = rng.random((165, 165))
    default = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    for label in ("default", "one thread", "default", "one thread"):
        if label == "default":
            wall, cpu = _products(c, comparisons, 240)
        else:
            with threadpool_limits(limits=1, user_api="blas"):
                wall, cpu = _products(c, comparisons, 240)
        print(json.dumps({"blas_threads": default if label == "default" else [1], "wall_s": round(wall, 3),
                          "cpu_s": round(cpu, 3), "load_1min": round(os.getloadavg()[0], 2)}), flush=True)


if __name__ == "__main__":
    main()
