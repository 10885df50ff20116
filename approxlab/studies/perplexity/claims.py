r"""The perplexity study's claims, declared before any run: what is measured, the threshold, why, and how.

Every claim is a :class:`~approxlab.studies.Claim` judged by :func:`approxlab.studies.reporting.claims.judge`
on a 95% percentile interval. The observations of a decoder claim are the cells (method x budget x window)
of one setting whose method has a **decoder-valid** causal form (its own, or a cache policy's: not
``mask-renormalise``, whose landmarks pool later tokens, :data:`DECODER_VALID`), that ran, that are not
**degenerate** (:data:`DEGENERATE`) and that are not the control. Their change in log-perplexity
:math:`\Delta` is tied at 0 inside the setting's **noise floor** (:data:`FLOOR`).

* **(p1) across methods** -- Spearman's :math:`\rho(\text{spectral error}, \Delta)` over the cells; the
  interval resamples methods and windows together (:func:`.resampling.two_level`): the claim is about
  approximations in general, and the methods are few.
* **(p1w) within a method** -- per method, :math:`\rho` over its budgets of the window means (its interval
  resamples windows: :data:`P1_METHOD`); pooled, the mean of the within-method :math:`\rho` (methods and
  windows resampled): does more error *of the same method* mean more loss, or is the across-method
  correlation only that some methods are worse than others?
* **(p1d) at a fixed budget** -- :math:`\rho` across methods of the window means at one budget.
* **(p2) which measure** -- each measure's :math:`\rho` minus the spectral :math:`\rho` on the same
  two-level resamples (:data:`MEASURES`: Frobenius, worst query, the attention mass the kept keys miss,
  the rows' total variation, and the budget itself); the measure is better when the whole interval is
  above 0. Leave-one-method-out prediction errors are reported beside (:mod:`.prediction`), not judged.
* **(p3) against a reference ranking** -- :math:`\rho` of a compared run's error and the methods' mean
  :math:`\Delta` at one budget (the reference has one value per method, so the comparison is on method
  means: a per-window comparison cannot reach 1 when windows disagree).
* **(p4) retrieval at long context** -- :math:`\rho(\text{spectral error}, \Delta_{\text{key}})` across
  methods, with :math:`\Delta_{\text{key}}` the pass key's negative log-probability with the method minus
  without (:mod:`.passkey`); given only when the exact model passes :data:`GATE`.

The thresholds and the reasons below were fixed before the first run of this design; :data:`DECLARED` holds
them as data (what each claim is over, its unit, its threshold) so the summary prints them as declared.
"""

from __future__ import annotations

from ..declaration import Claim

__all__ = ["RESAMPLING", "MIN_METHODS", "MIN_WINDOWS", "MIN_BUDGETS", "FLOOR", "DEGENERATE", "DECODER_VALID",
           "MEASURES", "MEASURE_TEXT", "GATE", "P1", "P1_WITHIN", "P1_METHOD", "P1_BUDGET", "P2", "P3", "P4",
           "CLAIMS", "DECLARED"]

RESAMPLING = {"resamples": 2000, "seed": 0, "level": 0.95}
"""Every interval: 2,000 resamples, seed 0, 95% percentile."""

MIN_METHODS = 5
"""No verdict on a claim across methods over fewer methods: with 4 the two-level interval of rho spans nearly
[-1, 1] whatever the data (a rank correlation of 4 points takes only 24 orders)."""

MIN_WINDOWS = 3
"""No verdict on a claim whose unit is the window over fewer windows."""

MIN_BUDGETS = 5
"""A within-method rho over fewer budgets is not computed: 5 points are the fewest whose rho can exceed 0.7
other than by being perfect (rho takes 1, 0.9, 0.8, ...)."""

FLOOR = ("the largest |Delta| of the exact control over the setting's windows plus twice its SD over windows: "
         "below it, the patch's own kernel (approxlab's float32 softmax against the model's SDPA) can account "
         "for the change; a cell inside it is tied at Delta = 0 in every rank statistic, and a point (method x d) "
         "whose window mean is inside it, or whose interval over windows holds 0, is counted as 'no measurable "
         "loss'")

DEGENERATE = ("a budget at least the tokens the method compresses (the KV cache: b >= n_c; a whole window: d >= "
              "n), or a point whose largest relative spectral error over the replaced layers' heads (its median "
              "over windows) is below 1e-6 (the method returned exact attention in every head): dropped from every "
              "claim and counted")

DECODER_VALID = ("a method's own causal form or a cache policy's; `mask-renormalise` (the Nystrom family: "
                 "landmarks pooled over every position, so a token's output depends on later tokens) is reported "
                 "in its own section and enters no decoder claim")

MEASURES = ("spectral", "frobenius", "worst_query", "missed_mass", "total_variation", "inverse_budget")
"""The predictors (p2) compares, each oriented so that larger means worse: the relative spectral, Frobenius and
worst-query errors (:func:`approxlab.patching.output_errors`), one minus the exact attention mass the kept keys
carry (methods whose matrix is sparse: kept = non-zero), the rows' total variation distance between exact and
approximate attention (methods with a matrix), and 1/d."""

MEASURE_TEXT = {"spectral": "relative spectral error", "frobenius": "relative Frobenius error",
                "worst_query": "worst query's relative error", "missed_mass": "exact attention mass missed",
                "total_variation": "rows' total variation", "inverse_budget": "1 / budget"}

GATE = 0.8
"""(p4) is judged only when the exact model retrieves the pass key in at least this share of the sequences:
below it the model cannot do the task, and a method cannot lose what the model never had."""

_NO_VERDICT = {"too few units": "no verdict (too few units)"}
_RANKS = {"reproduced": "ranks the losses", "not reproduced": "does not rank the losses", **_NO_VERDICT}

P1 = Claim("p1", "across methods, the relative spectral error ranks the losses ({where})",
           "Spearman rho(relative spectral error, Delta) over methods x d x windows", side="at least",
           threshold=0.7, unit="method", min_units=MIN_METHODS, quantity="spectral", labels=_RANKS)
P1_WITHIN = Claim("p1w", "within a method, more error over its budgets means more loss ({where})",
                  "mean over methods of the within-method Spearman rho over budgets", side="at least",
                  threshold=0.7, unit="method", min_units=MIN_METHODS, quantity="spectral", labels=_RANKS)
P1_METHOD = Claim("p1m", "within {method}, more error over its budgets means more loss ({where})",
                  "Spearman rho over budgets of the window means", side="at least", threshold=0.7,
                  min_units=MIN_WINDOWS, quantity="spectral", labels=_RANKS)
P1_BUDGET = Claim("p1d", "at d = {budget}, the relative spectral error ranks the methods' losses ({where})",
                  "Spearman rho across methods of the window means at one d", side="at least", threshold=0.7,
                  unit="method", min_units=MIN_METHODS, quantity="spectral", labels=_RANKS)
P2 = Claim("p2", "the {measure} ranks the losses better than the spectral error ({where})",
           "rho(measure, Delta) - rho(spectral, Delta), paired two-level resamples", side="above", threshold=0.0,
           strict=True, unit="method", min_units=MIN_METHODS,
           labels={"reproduced": "better than spectral", "not reproduced": "worse than spectral", **_NO_VERDICT})
P3 = Claim("p3", "a method's place in {reference}'s error ranking is its place in the loss ranking ({where})",
           "Spearman rho(reference's error, mean Delta) across the methods both measured, at one d",
           side="at least", threshold=0.8, unit="method", min_units=MIN_METHODS,
           labels={"reproduced": "same places", "not reproduced": "different places", **_NO_VERDICT})
P4 = Claim("p4", "at long context, the relative spectral error ranks the loss of the pass key ({where})",
           "Spearman rho(relative spectral error, Delta of the key's negative log-probability)", side="at least",
           threshold=0.7, unit="method", min_units=MIN_METHODS, quantity="spectral", labels=_RANKS)
CLAIMS = (P1, P1_WITHIN, P1_METHOD, P1_BUDGET, P2, P3, P4)

_RHO = ("rho = 0.7 is where the error's ranks account for about half the variance of the losses' ranks "
        "(rho^2 = 0.49): below it, something other than the error decides most of the order")
DECLARED = (
    {"claim": "p1", "over": "decoder-valid cells of a setting", "unit": "methods, then windows within",
     "threshold": "rho >= 0.7", "reason": _RHO},
    {"claim": "p1w", "over": f"methods with >= {MIN_BUDGETS} budgets", "unit": "methods, then windows within",
     "threshold": "mean rho >= 0.7", "reason": _RHO + "; the mean, so that each method counts once"},
    {"claim": "p1m", "over": "one method's budgets", "unit": "windows", "threshold": "rho >= 0.7", "reason": _RHO},
    {"claim": "p1d", "over": "methods at one d", "unit": "methods, then windows within", "threshold": "rho >= 0.7",
     "reason": _RHO + "; one d removes the budget's own ordering"},
    {"claim": "p2", "over": "decoder-valid cells where both measures are finite", "unit": "methods, then windows",
     "threshold": "difference > 0 (whole interval)",
     "reason": "which measure orders the losses better, not by how much: the paired difference on the same draws"},
    {"claim": "p3", "over": "methods both runs measured, at one d", "unit": "methods, then windows within",
     "threshold": "rho >= 0.8", "reason": "with m methods, rho >= 0.8 allows squared rank displacements summing to "
     "at most m(m^2 - 1)/30: for 6 methods up to three swaps of neighbours, not two methods trading places two "
     "apart"},
    {"claim": "p4", "over": "decoder-valid cells of the long-context settings", "unit": "methods, then sequences",
     "threshold": f"rho >= 0.7, only if the exact model retrieves >= {GATE:.0%} of the keys", "reason": _RHO},
)
"""The claims as declared: what each is over, its resampling unit, its threshold and the reason for it."""
