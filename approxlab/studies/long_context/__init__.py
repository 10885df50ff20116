r"""The long-context study: does a KV-cache policy's attention error predict what it loses at 2k-8k tokens?

Cache policies are judged at long context (kvpress's RULER at 4k, sparse-attention-hub's 4k-32k). This study runs
SmolLM2-135M on RULER-style sequences built offline (:mod:`approxlab.tasks.ruler`: single needle, multi-key,
multi-value, multi-query, variable tracking, in WikiText-2 haystacks or, as ``TASK@noise``, in RULER's noise
haystack) and, for each sequence, **one exact prefill** of its context shared by every cache policy and compression
ratio (:func:`approxlab.patching.sweep_policies` over :func:`approxlab.patching.exact_prefill`): each policy
compresses the prefill's cache per KV head and only the question and answer run on it. A cell is one sequence; it
records the exact model's row and one per policy and ratio: exact match of the greedy answer, the answer's
log-probability, the change in NLL on all continuation tokens and on LongPPL's key tokens, each layer's relative
spectral error on clean and on patched inputs, seconds.

The declaration :data:`STUDY`, behind ``approxlab long-context``:

1. **grid** (:mod:`.grid`) -- lengths 2,048 / 4,096 / 8,192, 30 distinct texts x 3 depths per task and length,
   compression ratios 0.5-0.95, every cache policy of the registry;
2. **cells** (:mod:`.cells`; resumable: a killed run loses no finished sequence) -- ``results.csv.gz`` (stored one
   file per length, ``results.length=2048.csv.gz``, ...: each stays under what a repository takes) and
   ``layers.csv``; then a policy added to a saved run (CriticalKV and CAOTE after the committed run began) in cells
   of its own, ``added.csv`` and ``added_layers.csv``, read with ``results.csv.gz`` by the report (the cache policies'
   setting is complete before the next begins); then the whole-sequence setting (the methods that are not cache
   policies, every layer replaced over the whole sequence, at the shortest length) in ``whole.csv`` and
   ``whole_layers.csv``;
3. **report** (:mod:`.report`, :mod:`.claims`) -- the gate (the exact model's accuracy with its Clopper-Pearson
   bound), the premise claims fixed in code (stratified rank correlations across policies, the paired difference
   against the budget within a policy, calibrated intervals over texts, Holm), ``long_context.png`` and
   ``summary.md``.
"""

from __future__ import annotations

from ..declaration import Figure, Product, Step, Study, Summary, Table
from .cells import (ADDED, ADDED_LAYERS, LAYERS, RESULTS, SHARING, WHOLE, WHOLE_LAYERS, compute_added,
                    compute_sequence, compute_sharing, compute_whole, sharing_cells)
from .claims import CLAIMS
from .grid import (ADDED_KEY, FULL_GRID, KEY, OPTIONS, QUICK_GRID, WHOLE_KEY, added_cells, build_config, cell_cost,
                   cells, check, configure, run_info, whole_cells)
from .report import TITLE, claim_verdicts, cost, gate, gate_depths, plot, policies, sections
from .whole import whole_methods

__all__ = ["STUDY", "OPTIONS", "FULL_GRID", "QUICK_GRID", "CLAIMS", "build_config", "configure"]

STUDY = Study(
    name="long-context",
    description="RULER-style retrieval at 2k-8k tokens on one shared exact prefill: every cache policy and "
                "compression ratio, the accuracy gate and the premise.",
    full=FULL_GRID, quick=QUICK_GRID, configure=configure, options=OPTIONS, check=check, run_info=run_info,
    steps=(Step((Table(SHARING, ("length",), optional=True),), compute_sharing, sharing_cells),
           Step((Table(RESULTS, KEY, required=(*KEY, "method", "correct", "status"), split="length"),
                 Table(LAYERS, KEY, optional=True)),
                compute_sequence, cells, cost=cell_cost),
           Step((Table(ADDED, ADDED_KEY, optional=True), Table(ADDED_LAYERS, ADDED_KEY, optional=True)),
                compute_added, added_cells, group=KEY, cost=cell_cost),
           Step((Table(WHOLE, WHOLE_KEY, optional=True), Table(WHOLE_LAYERS, WHOLE_KEY, optional=True)),
                compute_whole, whole_cells, group=KEY, cost=cell_cost)),
    claims=CLAIMS,
    products=(Product("gate.csv", gate), Product("gate_depths.csv", gate_depths), Product("policies.csv", policies),
              Product("cost.csv", cost),
              Product("whole_methods.csv", whole_methods),
              Product("verdicts.csv", claim_verdicts)),
    figures=(Figure("long_context", plot),),
    summary=Summary(TITLE, (sections,)),
    grows=("lengths", "short_context", "texts", "ruler_tasks", "added_policies", "whole_methods", "whole_ratios",
           "whole_texts"),
)
"""The long-context study, declared: ``approxlab long-context``."""
