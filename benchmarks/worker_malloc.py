"""The thread CPU seconds of perplexity clean-input cells in a local Dask worker, with and without Dask's
``MALLOC_TRIM_THRESHOLD_``.

Dask's nanny starts a worker with ``MALLOC_TRIM_THRESHOLD_=65536`` unless told otherwise; a study's local cluster
now starts its workers without it (:data:`approxlab.studies.engine.environment.WORKER_UNSET`). This script runs the
same cells -- the declared perplexity grid's first window, whole-window setting: the control, then ``--method`` at
every budget -- in a one-worker local cluster started each way, one after the other, and prints each cell's
``cpu_seconds`` (the thread's CPU time, as ``clean_errors.csv`` records it) as JSON lines. The first cell of a
worker captures the window and computes the layers' references, which its later cells share.

Run from the repository root::

    python3 benchmarks/worker_malloc.py --method snapkv
"""

from __future__ import annotations

import argparse
import json


def _cells(method: str) -> list[dict]:
    from approxlab.studies.perplexity.clean import clean_cells
    from approxlab.studies.perplexity.grid import build_config

    config = build_config(num_layers=30)
    cells = [cell for cell in clean_cells(config, {}) if cell["setting"] == "whole"]
    window = cells[0]["window"]
    return [cell for cell in cells if cell["window"] == window and cell["method"] in (config["control"], method)]


def _run(cells: list[dict], trim: bool) -> list[float]:
    """The cells in one local worker started as a study starts it (:func:`~approxlab.studies.engine.environment.
    study_threads`, :class:`~approxlab.studies.engine.executors.Executor`), with Dask's default variable put back
    where ``trim``."""
    import dask

    from approxlab.studies.engine.environment import study_threads
    from approxlab.studies.engine.executors import Executor
    from approxlab.studies.perplexity.clean import compute_clean

    found = {}
    with study_threads(1, local_workers=True), \
            dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": 65536 if trim else None}):
        with Executor(workers=1) as executor:
            executor.run(list(enumerate(cells)), compute_clean,
                         lambda key, cell, rows: found.setdefault(key, rows[0]["cpu_seconds"]))
    return [found[key] for key in range(len(cells))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="snapkv")
    args = parser.parse_args()
    cells = _cells(args.method)
    for trim in (False, True):
        for cell, seconds in zip(cells, _run(cells, trim)):
            print(json.dumps({"MALLOC_TRIM_THRESHOLD_": 65536 if trim else None, "method": cell["method"],
                              "num_features": cell["num_features"], "cpu_seconds": round(seconds, 3)}), flush=True)


if __name__ == "__main__":
    main()
