"""Regenerate Figure 1 of Skyformer (Chen et al., NeurIPS 2021, Section 4.5).

Spectral-norm error of approximate attention outputs on Q/K/V from initialized and
pretrained BERT-style models on Wikitext-2. Same as ``approxlab figure1 [options]``;
see :mod:`approxlab.studies.figure1` for the grid, the tables and the plot.

    python studies/figure1.py --quick          # -> approxlab-results/figure1-quick/
    python studies/figure1.py                  # full grid -> approxlab-results/figure1/ (resumable)
    python studies/figure1.py --out figures/figure1 --plot-only   # redraw the committed run
    python studies/figure1.py --positions none --out figures/figure1-no-positions   # previous inputs
    python studies/figure1.py --checkpoint bert-base-cased   # the paper's model (needs the Hub once)
"""

import sys

from approxlab.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["figure1", *sys.argv[1:]]))
