"""Regenerate Table 3 of Skyformer (Chen et al., NeurIPS 2021, Appendix F).

Ratios of the instability score tau_i = ||f(x_i, W_i) - f(x_i, W_(i-1))||^2 / ||W_i - W_(i-1)||^2
of each attention to that of softmax attention, over 20 Adam steps of a 2-layer encoder, on
generated ListOps and WikiText-2 masked LM. Same as ``approxlab instability [options]``; see
:mod:`approxlab.studies.instability` for the grid and the table.

    python studies/instability.py --quick          # -> approxlab-results/instability-quick/
    python studies/instability.py                  # full grid -> approxlab-results/instability/ (resumable)
    python studies/instability.py --out figures/instability --plot-only   # rewrite the committed table.md
"""

import sys

from approxlab.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["instability", *sys.argv[1:]]))
