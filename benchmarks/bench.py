"""Run the approxlab benchmark: matrix-free spectral errors vs dense and SciPy, and forward costs.

Same as ``approxlab bench [options]`` (see :mod:`approxlab.studies.bench` and ``benchmarks/README.md``)::

    python benchmarks/bench.py                 # full run -> figures/bench/ (resumable)
    python benchmarks/bench.py --quick         # seconds   -> figures/bench-quick/
    python benchmarks/bench.py --plot-only     # redraw figures/bench/bench.png and summary.md
"""

import sys

from approxlab.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", *sys.argv[1:]]))
