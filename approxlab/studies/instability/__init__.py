r"""Skyformer Table 3: instability scores of attention approximations during training.

Regenerates Table 3 of Skyformer (Chen et al., NeurIPS 2021, Appendix F). A 2-layer encoder
(:class:`approxlab.training.TinyEncoder`: embedding 64, feed-forward 128, 2 heads, dropout 0.1)
is trained for 20 steps with each attention in turn, with the optimiser of the authors' LRA code
(:mod:`approxlab.optim`: AdamW, the task's warm-up schedule, gradient values clipped at 1);
every model starts from the same weights (one draw from a seeded generator; attentions have no
parameters of their own) and sees the same batches. At step ``i`` the instability score is

.. math::

    \tau_i = \|f(x_i, W_i) - f(x_i, W_{i-1})\|_F^2 \,/\, \|W_i - W_{i-1}\|_F^2

with :math:`f` the embedding after the two layers (both passes of a step share their landmarks
and dropout masks); a table entry is the mean over the steps of :math:`\tau_i(\text{method}) /
\tau_i(\text{softmax})`, then over seeds the arithmetic mean (the paper's statistic) and the
geometric mean, each with a 95% Student-t interval (:func:`ratio_interval`), the power of the
seeds to tell the paper's value from 1 and the seeds 80% power needs on each scale
(:func:`power_analysis`; the geometric mean's on the log ratios), and the verdicts of the claims
engine: :data:`BELOW_ONE` ("below 1" / "above 1" only when the whole interval is on that side, "not
confirmed (underpowered)" when it contains 1 at a power below :data:`POWER_GOAL`, "inconclusive"
otherwise, "inconclusive (1 seed)" with one) and :data:`AT_PAPER` (the same interval against the
entry's own Table 3 value: below or above it -- the data reject it -- or holding it). An entry answers
Table 3's question (:func:`decision`) when the interval excludes 1 or the paper's value, or when it
does neither at 80% power. Below 1: the method moves its output less than softmax attention for the
same parameter change (Skyformer's "more stable").

The declaration :data:`STUDY`, behind ``approxlab instability``:

1. **grid** -- :func:`~.grid.configure` (saved and hashed in ``config.json``);
2. **cells** (:mod:`.cells`; resumable, optional Dask) -- first one cell per (task, n, seed)
   writing ``residual.csv``, the residual stream's RMS before the final LayerNorm for softmax and
   kernelized attention at the initial weights (forward passes only, about a second a cell: the
   mechanism of the spread, :mod:`.spread`, so a run stopped early still has it); then one cell
   per (task, n, seed, attention) writing the tidy table ``results.csv`` (one row per step);
3. **table** -- from the saved tables and ``config.json`` only: ``ratios.csv`` (one ratio per
   task x n x seed x attention, with the task's proxy), ``intervals.csv`` (means, 95% CIs, power,
   verdicts and decision per task x attention; :mod:`.stats`), ``table.md`` (laid out like Table
   3: rows = attentions, columns = Table 3's columns in its order; then the verdicts, the power
   analysis and decisions, the seeds and their budget (:mod:`.design`), where the spread comes from
   (:mod:`.spread`), the proxies and every setting kept or changed (:mod:`.settings`), and an
   entry-by-entry comparison with Table 3) and ``instability.png/.pdf`` (per-seed ratios;
   :mod:`.report`). ``--plot-only`` redraws them.

Grid (full run)
---------------
tasks: Table 3's five columns under LRA's names, in its order: ``text`` (proxy
``wikitext-articles``: which of 10 WikiText-2 articles a byte window comes from), ``listops``
(generated, LRA's generator, :mod:`approxlab.tasks.listops`), ``retrieval`` (proxy
``wikitext-same-article``: whether two byte windows come from one article, through LRA's two-tower
model), ``pathfinder`` (generated, :mod:`approxlab.tasks.pathfinder`, 16 x 16) and ``image`` (proxy
``sklearn-digits``: handwritten digits upsampled to 16 x 16 grey pixels); LRA's IMDb, AAN and
CIFAR-10 cannot be had offline (:mod:`approxlab.tasks` says what each proxy keeps and changes).
All at ``n = 256``, batch 8, at each LRA task's learning rate and warm-up (Skyformer's
``config.py``); attentions: Table 3's (softmax as reference, kernelized, skyformer with its Schulz
core, nystromformer; ``--attentions`` adds spectral-shifting and yoso); padding keys masked in every
attention; ``num_features = 128`` (Skyformer Section 5); 20 steps. Seeds per task
(:data:`PLANNED_SEEDS`, sized in :mod:`.design` before the run for 80% power at the paper's value
from a 10-seed pilot): a task entry may carry its own count (``--tasks text:256:8:258``), the others
take ``seeds`` (ListOps and Pathfinder share it). Run seed by seed (a run stopped early keeps whole
seeds, and the table counts the seeds it has); a saved run extends along ``seeds`` and ``tasks``,
computing only the new cells. LRA's ListOps pads to 2000 tokens, Text and Retrieval to 4000 and
Pathfinder-32 and Image have 1024, with batches up to 256 on a V100; on this 2-core CPU those shapes
leave no budget for seeds (``--tasks listops:2000:32`` restores LRA's ListOps shape at that cost).
``table.md`` names every setting as kept or changed.

``--quick``: ListOps at ``n = 64`` (batch 4), every attention, 2 seeds, 3 steps; written
to ``approxlab-results/instability-quick/`` unless ``--out`` is given.

Seeds. The batches of (task, n, seed) come from a generator seeded with
:func:`~approxlab.studies.engine.cell_seed` of (task, n, seed, "data"); the initial weights
from (task, n, seed, "init"); the random draws of randomized attentions from (task, n, seed,
"attention"), fixed per step so that both forward passes of a step see the same landmarks.

Table ``results.csv``: task, n, seed, attention, step, tau, output_change,
parameter_change, loss, seconds (wall time of the cell), warnings (count raised in the
cell), status ("ok", or the error that stopped training, e.g. a non-finite gradient; its
numeric columns are then empty and the table marks the entry "failed"). Table ``residual.csv``:
task, n, seed, rms_softmax, rms_kernelized, seconds.

References
----------
Chen, Zeng, Ji, Yang. *Skyformer: Remodel Self-Attention with Gaussian Kernel and Nystrom
Method*. NeurIPS 2021. Section 5 (model and training settings), Appendix F and Table 3.

Liu, Liu, Gao, Chen, Han. *Understanding the Difficulty of Training Transformers*. EMNLP 2020.
"""

from __future__ import annotations

from ..declaration import Figure, Product, Step, Study, Summary, Table
from .cells import compute_cell, compute_residual_cell
from .design import PILOT, PLANNED_SEEDS, SECONDS_PER_SEED, plan, seeds_needed, task_seeds
from .grid import FULL_GRID, OPTIONS, QUICK_GRID, build_config, check, configure, make_cells, make_residual_cells
from .figures import plot
from .report import (ATTENTION_ORDER, INTERVALS, KEY_COLUMNS, RATIOS, RESIDUAL, RESULTS, TITLE, paper_comparison,
                     ratio_table, sections, summarize, verdict_table)
from .spread import mechanism, pairing, split_halves
from .stats import (AT_PAPER, BELOW_ONE, PAPER_COLUMN, PAPER_TABLE3, POWER_GOAL, PROXIES, decision, intervals,
                    power_analysis, ratio_interval, ratios, verdict)

__all__ = ["STUDY", "OPTIONS", "FULL_GRID", "QUICK_GRID", "PAPER_TABLE3", "PAPER_COLUMN", "PROXIES", "POWER_GOAL",
           "BELOW_ONE", "AT_PAPER", "PILOT", "PLANNED_SEEDS", "SECONDS_PER_SEED", "build_config", "configure",
           "make_cells", "make_residual_cells", "task_seeds", "compute_cell", "compute_residual_cell", "ratios",
           "ratio_interval", "verdict", "power_analysis", "decision", "intervals", "seeds_needed", "plan",
           "split_halves", "pairing", "mechanism", "ratio_table", "verdict_table", "paper_comparison", "summarize",
           "plot"]

def _ratios(saved):
    return ratios(saved.table(RESULTS))


def _intervals(saved):
    return intervals(saved.product(RATIOS))


STUDY = Study(
    name="instability",
    description="Instability score of the approximations (Skyformer Appendix F / Table 3).",
    full=FULL_GRID, quick=QUICK_GRID, configure=configure, options=OPTIONS, check=check,
    steps=(Step((Table(RESIDUAL, KEY_COLUMNS[:3], optional=True),), compute_residual_cell, make_residual_cells),
           Step((Table(RESULTS, KEY_COLUMNS, required=KEY_COLUMNS),), compute_cell, make_cells)),
    claims=(BELOW_ONE, AT_PAPER),
    products=(Product(RATIOS, _ratios), Product(INTERVALS, _intervals)),
    figures=(Figure("instability", plot),),
    summary=Summary(TITLE, (sections,), file="table.md", generated=False),
    grows=("seeds", "tasks", "attentions", "attention_options"),
)
"""Skyformer Table 3, declared: ``approxlab instability``."""
