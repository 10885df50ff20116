"""Regenerate the singular-value decay study (Skyformer Appendix B / Figure 4; spectral shifting Figure 2).

Singular values sigma_i/sigma_1 of the attention scores A, softmax D^-1 A, kernelized C, the
completion C-bar, the output D^-1 A V and the Skyformer / Nystromformer / spectral-shifting
approximations (d = 64) on BERT Q/K/V of WikiText-2, with rank and condition-number tables.
Same as ``approxlab sv-decay [options]``; see :mod:`approxlab.studies.sv_decay`.

    python studies/sv_decay.py --quick          # -> approxlab-results/sv-decay-quick/
    python studies/sv_decay.py                  # full grid -> approxlab-results/sv-decay/ (resumable)
    python studies/sv_decay.py --out figures/sv_decay --plot-only   # redraw the committed run
"""

import sys

from approxlab.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["sv-decay", *sys.argv[1:]]))
