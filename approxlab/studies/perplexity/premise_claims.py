r"""The premise's claims without confounds, declared before the data: unit, measure, depth, thresholds, reasons.

The committed design (:mod:`.claims`) ranked every cell (method x budget x window) together, on the error
measured on the patched run's own drifting inputs, with a verdict withheld below 90% measured coverage. These
claims replace its premise claims (p1, p1w, p1m, p1d, p2); (p3) and (p4) stay as they were.

* **Unit of rho** (:data:`UNIT`): ranks within each window, then the mean over windows (a stratified
  Spearman's :math:`\rho`, :class:`.strata.WithinWindows`); the cell-level and the window-mean :math:`\rho` are
  reported beside it for comparison.
* **Measure** (:data:`MEASURE`): the error on the **unpatched** model's inputs at each layer (clean) is the
  primary measure; the error on the patched run's inputs (drifting) a secondary one, judged and reported apart.
* **Depth** (:data:`DEPTHS`): one layer replaced at a time at each depth (clean by construction): :math:`\rho`
  per depth, and pooled over depths (stratified by depth and window).
* **Within a method** (:data:`WITHIN`): does the error say more than the budget? The paired difference
  :math:`\rho(\text{error}, \Delta) - \rho(1/d, \Delta)` over a method's budgets and the partial rank correlation
  of error and :math:`\Delta` given d, both within (method, window) strata; and at one fixed budget, the
  configurations of a method (``configs.csv``), where error and budget disagree.
* **Statistics** (:data:`STATISTICS`): intervals over methods and windows, both drawn (a crossed bootstrap,
  :mod:`.strata`), calibrated on the run's own units
  (:func:`approxlab.studies.reporting.calibrated.calibrate`); Holm within each claim family; near-clones merged
  (:data:`CLONES`); no measurable loss by :data:`NO_LOSS`, at the kernel floor and at :data:`PRACTICAL_FLOOR`.
* **The other side** (:data:`OUTPUT_AWARE_CLAIM`): if the output error predicts the loss, a policy that evicts by
  its estimated output error should lose less than the score-based policy it extends at the same budget
  (:data:`OUTPUT_AWARE`: CriticalKV over SnapKV's scores, CAOTE over TOVA's attention); the paired difference of
  their losses in the KV-cache setting, windows resampled, calibrated interval (:data:`OTHER_SIDE`).
"""

from __future__ import annotations

from ..declaration import Claim
from .cells import PATCHED
from .claims import MIN_BUDGETS, MIN_METHODS, MIN_WINDOWS

__all__ = ["UNIT", "MEASURE", "DEPTHS", "WITHIN", "STATISTICS", "CLONES", "CLONE_TOLERANCE", "NO_LOSS", "PRACTICAL_FLOOR",
           "MIN_CONFIGS", "INNER", "RHO", "DEPTH", "BUDGET", "MEASURES", "DIFFERENCE", "PAIRED", "PARTIAL", "CONFIGS", "DIFFERENCE_CLAIMS",
           "OUTPUT_AWARE", "OTHER_SIDE", "OUTPUT_AWARE_CLAIM", "PREMISE_CLAIMS", "PREMISE_DECLARED", "PRIMARY",
           "SECONDARY"]

UNIT = ("ranks within each window (a stratified Spearman rho: rho over the points, method x d, of one window, "
        "then the mean over windows): the windows differ in how much any approximation costs (the loss of one "
        "point varies by 0.006-0.17 nats from window to window in the committed run), and ranking cells of "
        "different windows together counts that spread as disagreement between error and loss, which the premise "
        "does not claim; the cell-level and the window-mean rho are reported beside it")
MEASURE = ("the relative spectral error on the unpatched model's inputs at each layer (clean: `clean_errors.csv` "
           "for the settings that replace several layers; the single-layer settings are clean by construction) "
           "is the primary measure: on the patched run's own inputs (drifting) a method that breaks early layers "
           "shows more downstream error and more loss for one cause; the drifting error is judged apart, as a "
           "secondary measure")
DEPTHS = ("each single-layer setting (`layer k` replaced) its own depth; pooled, the mean of rho over (depth, "
          "window) strata, methods and windows drawn as in every setting, at least 2 depths: where in a model "
          "the premise holds is what a practitioner choosing layers needs")
WITHIN = ("within (method, window) strata over the method's budgets: rho(error, Delta) - rho(1/d, Delta) "
          "(above 0: the error orders a method's budgets better than the budget does), and the partial rank "
          "correlation of error and Delta given d (ranks regressed on d's ranks within the stratum, residuals "
          "pooled; above 0: the error carries information on the loss beyond d). Both can fail for a measure that "
          "only tracks d, which the committed within-method rho could not")
STATISTICS = ("percentile intervals of a crossed bootstrap (methods and windows both drawn with replacement: both "
              "are samples), calibrated on the run's own units (iterated bootstrap: verdicts from the calibrated "
              "interval; no verdict only where calibration fails); Holm within each claim family (a claim id and "
              "its measure), beside the unadjusted verdicts")
CLONE_TOLERANCE = 1e-5
"""Relative: two points whose NLL and spectral error agree to this on every window are one point (the same kept tokens
gathered in another order round differently: CriticalKV and SnapKV keep SnapKV's window alone at b <= 32)."""
CLONES = ("two points (method x d) of one setting whose change in log-perplexity and relative spectral error are "
          f"equal on every window (to a relative {CLONE_TOLERANCE:g}: one kept set gathered in another order rounds "
          "differently) are one point: the later method's (in name order) is dropped from every claim "
          "and named (in the committed run's tables: pyramidkv and snapkv = ada-snapkv at d = 16, 32 in every "
          "setting, and snapkv = ada-snapkv at d = 256 with whole windows; exactly equal only snapkv = ada-snapkv "
          "with whole windows and snapkv = pyramidkv in the KV cache, which the former exact rule merged)")
PRACTICAL_FLOOR = 0.01
"""Nats per token: a change below it is not a loss that matters (a perplexity 1% higher: exp(0.01) = 1.010),
declared before the data; counted beside the kernel floor of :data:`.claims.FLOOR`."""
NO_LOSS = ("a point (method x d) has no measurable loss when the mean of Delta over its windows is within the "
           "kernel floor, or its 95% interval over windows (`delta.csv`) holds 0; it has no loss that matters when "
           f"its whole 95% interval lies within +-{PRACTICAL_FLOOR} nats (a perplexity at most "
           f"{100 * (2.718281828 ** PRACTICAL_FLOOR - 1):.1f}% higher). No Delta is rounded or set to another's: "
           "each enters every rank as measured")
MIN_CONFIGS = 5
"""A method's configurations at one budget enter (pc) when it has at least this many (as :data:`.claims.MIN_BUDGETS`)."""
INNER = {"resamples": 200, "final": 2000, "seed": 0}
"""The crossed bootstrap: 2,000 resamples on the run itself (seed 0), 200 inside each calibration draw."""

_RANKS = {"reproduced": "ranks the losses", "not reproduced": "does not rank the losses",
          "too few units": "no verdict (too few units)"}
_BEYOND = {"reproduced": "says more than the budget", "not reproduced": "says less than the budget",
           "inconclusive": "not more than the budget (inconclusive)", "too few units": "no verdict (too few units)"}

RHO = Claim("p1", "across methods, the {measure} error ranks the losses within a window ({where})",
            "stratified Spearman rho(error, Delta): within each window over methods x d, mean over windows",
            side="at least", threshold=0.7, unit="method", min_units=MIN_METHODS, labels=_RANKS)
DEPTH = Claim("p1-depths", "across methods and depths, the clean error ranks the losses within a window",
              "stratified rho over (depth, window) strata", side="at least", threshold=0.7, unit="method",
              min_units=MIN_METHODS, labels=_RANKS)
BUDGET = Claim("p1d", "at d = {budget}, the {measure} error ranks the methods' losses within a window ({where})",
               "stratified rho across methods at one d", side="at least", threshold=0.7, unit="method",
               min_units=MIN_METHODS, labels=_RANKS)
MEASURES = ("frobenius", "worst_query", "missed_mass", "total_variation", "inverse_budget")
"""The measures (p2) sets against the spectral error, each on the same inputs (clean or drifting) as it."""
DIFFERENCE = Claim("p2", "the {measure} ranks the losses better than the spectral error ({where})",
                   "stratified rho(measure, Delta) - stratified rho(spectral, Delta), the same draws",
                   side="above", threshold=0.0, strict=True, unit="method", min_units=MIN_METHODS,
                   labels={"reproduced": "better than spectral", "not reproduced": "worse than spectral",
                           "too few units": "no verdict (too few units)"})
PAIRED = Claim("pw", "within a method, the {measure} error orders its budgets' losses better than 1/d ({where})",
               "mean over (method, window) of rho(error, Delta) - rho(1/d, Delta) over the method's budgets",
               side="above", threshold=0.0, strict=True, unit="method", min_units=MIN_METHODS, labels=_BEYOND)
PARTIAL = Claim("pp", "within a method, the {measure} error tells the loss beyond d ({where})",
                "pooled partial rank correlation of error and Delta given d, within (method, window)",
                side="above", threshold=0.0, strict=True, unit="method", min_units=MIN_METHODS, labels=_BEYOND)
CONFIGS = Claim("pc", "at one budget, the clean error ranks a method's configurations as their losses",
                "mean over (method, window) of rho(clean error, Delta) over the method's configurations",
                side="at least", threshold=0.7, unit="window", min_units=MIN_WINDOWS, labels=_RANKS)
OUTPUT_AWARE = {"criticalkv": "snapkv", "caote": "tova"}
"""Each output-aware policy and the score-based policy it extends, at their defaults: CriticalKV's first stage and
its weights are SnapKV's scores (its ``base``); CAOTE's attention :math:`\alpha` with ``window=1`` is the last
query's, TOVA's score."""
OTHER_SIDE = ("the premise from the other side: if the output error predicts "
              "the loss, the policy that keeps the tokens whose eviction moves the output least should lose least "
              "at a fixed budget. Statistic, at each budget d of the KV-cache setting: the mean over the pairs of "
              "OUTPUT_AWARE and over windows of Delta(base policy) - Delta(output-aware policy), nats per token "
              "(above 0: the output-aware policy loses less), on the windows where every pair ran; each pair alone "
              "beside it. A pair whose two policies lose the same in every window at a budget (within 1e-4 nats, "
              "the rounding of one kept set gathered in another order) keeps the same tokens there (CriticalKV's first stage holds SnapKV's 32-token window, so at b <= 32 both keep "
              "the window alone): it is named and left out of that budget's pool. Unit: the windows, resampled "
              "(the pairs are fixed, not a sample of policies); interval: "
              "the percentile interval of that bootstrap, calibrated on the run's windows (as pc). Verdict: the whole "
              "calibrated interval above 0, the output-aware policies lose less; wholly below 0, they lose more; "
              "else it cannot be told. Holm within the claim's instances (budgets and pairs). Not run while "
              f"{PATCHED} lacks the KV-cache rows of a policy of a pair")
OUTPUT_AWARE_CLAIM = Claim(
    "po", "at a fixed budget in the KV cache, the output-aware policies lose less than those they extend ({where})",
    "mean over pairs and windows of Delta(base) - Delta(output-aware), nats per token", side="above", threshold=0.0,
    strict=True, unit="window", min_units=MIN_WINDOWS,
    labels={"reproduced": "the output-aware policies lose less", "not reproduced": "the output-aware policies lose "
            "more", "too few units": "no verdict (too few units)"})
DIFFERENCE_CLAIMS = (DIFFERENCE, PAIRED, PARTIAL)
PREMISE_CLAIMS = (RHO, DEPTH, BUDGET, DIFFERENCE, PAIRED, PARTIAL, CONFIGS, OUTPUT_AWARE_CLAIM)
PRIMARY, SECONDARY = "clean", "drifting"

_RHO = ("rho = 0.7: the error's ranks account for about half the variance of the losses' ranks (rho^2 = 0.49)")
_ZERO = "above 0 with the whole interval: the error adds to what the budget says, whatever the amount"
PREMISE_DECLARED = (
    {"claim": "p1", "over": "decoder-valid points of a setting, ranked within windows", "unit": "methods x windows",
     "threshold": "stratified rho >= 0.7", "reason": _RHO},
    {"claim": "p1-depths", "over": "the single-layer settings (>= 2 depths)", "unit": "methods x windows",
     "threshold": "stratified rho >= 0.7", "reason": _RHO + "; " + DEPTHS},
    {"claim": "p1d", "over": "methods at one d, within windows", "unit": "methods x windows",
     "threshold": "stratified rho >= 0.7", "reason": _RHO + "; one d removes the budget's own ordering"},
    {"claim": "p2", "over": "points where both measures are finite", "unit": "methods x windows",
     "threshold": "difference > 0 (whole interval)", "reason": "which measure orders the losses better: paired draws"},
    {"claim": "pw", "over": f"methods with >= {MIN_BUDGETS} budgets", "unit": "methods x windows",
     "threshold": "difference > 0 (whole interval)", "reason": _ZERO},
    {"claim": "pp", "over": f"methods with >= {MIN_BUDGETS} budgets", "unit": "methods x windows",
     "threshold": "partial rho > 0 (whole interval)", "reason": _ZERO},
    {"claim": "pc", "over": f"methods with >= {MIN_CONFIGS} configurations at their fixed budget (`configs.csv`)",
     "unit": "windows (methods are strata)", "threshold": "mean rho >= 0.7", "reason": _RHO + "; the budget is "
     "fixed, so only the error can order the configurations"},
    {"claim": "po", "over": "the KV-cache setting at each budget d: " + ", ".join(
        f"{aware} against {base}" for aware, base in OUTPUT_AWARE.items()), "unit": "windows (the pairs are fixed)",
     "threshold": "Delta(base) - Delta(output-aware) > 0 (whole interval)", "reason": "the premise from the other "
     "side: a policy that minimises its estimated output error should lose least at a fixed budget if that error "
     "predicts the loss; any amount counts"},
)
"""The premise's claims as declared: what each is over, its units, its threshold and the reason."""
