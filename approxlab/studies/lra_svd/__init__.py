r"""Skyformer Appendix B, Figure 4: singular values of a trained transformer's attention output.

Regenerates Figure 4 of Skyformer (Chen et al., NeurIPS 2021, Appendix B): "the singular value
distribution of attention output from the second layer of a trained vanilla transformer ...
averaged across one random batch from the test set in each LRA task", and the decay rate per
task that Appendix B reads as task difficulty ("the singular values in Document Retrieval and
Pathfinder tasks decay slower ... those two tasks are more difficult than Text Classification
and ListOps"). The companion study on BERT/MiniLM attention matrices of WikiText-2 is
:mod:`approxlab.studies.sv_decay`.

A CPU proxy (:data:`FULL_GRID`), declared with its gates before any run: Skyformer's models were
trained to LRA accuracy (up to 50k steps on a GPU); on a 2-core CPU the proxy uses shorter
sequences (ListOps padded to 256 tokens, :mod:`approxlab.tasks.listops`; Pathfinder on a 16 x 16
canvas, :mod:`approxlab.tasks.pathfinder`, with row + column position embeddings so the model
sees which pixels neighbour each other), easier instances (:data:`TASK_OPTIONS`: shallower ListOps
trees, Pathfinder dots in their own intensity), a fixed step budget with no early stop, and the
authors' optimiser (:mod:`approxlab.optim`). Per (task, seed) -- one runner cell each, ``--workers``
of them at once:

1. train the 2-layer softmax :class:`approxlab.training.TinyEncoder` of Skyformer Section 5
   (embedding 64, feed-forward 128, 2 heads, dropout 0.1) for the fixed budget
   (:func:`approxlab.training.train_classifier` with ``patience=None``, last weights kept);
2. measure the final validation accuracy on ``validation_size`` held-out examples against the
   task's gate (:data:`GATES`, fixed in code before the run);
3. on one test batch, take the second layer's attention output (heads concatenated, before
   the output projection; the real tokens' rows: an ``(n_i, 64)`` matrix per example), its
   singular values :math:`\sigma_j/\sigma_1` (float64), and the decay statistic fixed in
   advance (:data:`DECAY_INDICES`, :func:`decay_slope`: slope of :math:`\ln\sigma_i` over
   :math:`i = 2..64`), averaged over the batch.

Appendix B's reading, "Pathfinder decays slower than ListOps", is tested by :func:`~.report.ordering` on
the seeds that pass their gates (Welch t interval on the difference of the mean slopes), only
when at least :data:`MIN_SEEDS` seeds of each task pass; otherwise nothing is said about the
ordering.

The declaration :data:`STUDY`: the grid (:mod:`.grid`), one cell per (task, seed) that writes its rows
of all three tables (:mod:`.cells`), and the report (:mod:`.report`, with its checks against our own bug,
:mod:`.checks`). Tables:
``results.csv`` (per task and seed: steps, final validation accuracy and its size,
majority-class rate, gate, passed, test-batch accuracy, decay slope mean and std over the batch,
seconds), ``spectra.csv`` (per task, seed and index: mean, min and max over the batch of
:math:`\sigma_j/\sigma_1`), ``training.csv`` (per evaluation: step, training loss, validation
accuracy); ``lra_svd.png/.pdf`` and ``summary.md`` are drawn from them (``--plot-only`` redraws).

References
----------
Chen, Zeng, Ji, Yang. *Skyformer*. NeurIPS 2021. Section 5, Appendix B (Figure 4).

Tay et al. *Long Range Arena*. ICLR 2021.
"""

from __future__ import annotations

from ..declaration import Figure, Step, Study, Summary, Table
from .cells import attention_output_spectrum, compute_cell, decay_slope
from .grid import (DECAY_INDICES, FULL_GRID, GATES, KEY_COLUMNS, MEASURE_DTYPE, MIN_SEEDS, OPTIONS, QUICK_GRID,
                   RESULTS, SMALLEST_EFFECT, SPECTRA, TASK_OPTIONS, TRAINING, build_config, cells, configure)
from .report import SLOWER, TITLE, ordering, plot, resolution_floor, sections

__all__ = ["STUDY", "OPTIONS", "FULL_GRID", "QUICK_GRID", "TASK_OPTIONS", "GATES", "DECAY_INDICES", "MIN_SEEDS",
           "SMALLEST_EFFECT", "MEASURE_DTYPE", "SLOWER", "build_config", "configure", "attention_output_spectrum", "resolution_floor", "decay_slope",
           "compute_cell", "ordering", "plot"]

STUDY = Study(
    name="lra-svd",
    description="Singular values of a trained 2-layer model's attention output on generated LRA tasks (Skyformer "
                "Appendix B, Figure 4).",
    full=FULL_GRID, quick=QUICK_GRID, configure=configure, options=OPTIONS,
    steps=(Step((Table(RESULTS, KEY_COLUMNS, required=KEY_COLUMNS), Table(SPECTRA, KEY_COLUMNS),
                 Table(TRAINING, KEY_COLUMNS)), compute_cell, cells),),
    claims=(SLOWER,),
    figures=(Figure("lra_svd", plot),),
    summary=Summary(TITLE, (sections,), generated=False),
    devices=("cpu",), executors=("process", "local"),
    executor_note="lra-svd trains in local processes (use --workers N)",
    grows=("seeds",),
)
"""Skyformer Appendix B, Figure 4 (a CPU proxy), declared: ``approxlab lra-svd``."""
