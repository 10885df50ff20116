"""The perplexity study's answer in plain words: the first section of its ``summary.md``, at each level the claims
ask about (across methods, within a method, at a fixed budget, which measure, at long context), written from the
verdicts alone by fixed rules, so that it says no more than they do.

A verdict is one of three kinds: the claim's own "reproduced" label (the premise holds there), its "not
reproduced" label (it fails there), or anything else (inconclusive, or no verdict: too few units, an interval
covering under 90% of the run's own units, or the exact model failing the retrieval gate), which is undecided and
said so, never counted for or against.
"""

from __future__ import annotations

import pandas as pd

from ..reporting.markdown import format_number as fmt
from .claims import MEASURE_TEXT, P1, P1_BUDGET, P1_METHOD, P1_WITHIN, P2, P4
from .claims_summary import setting_text

__all__ = ["in_short_lines", "kind"]

HOLDS, FAILS, UNDECIDED = "holds", "fails", "undecided"


def kind(claim, verdict: str) -> str:
    """``"holds"``, ``"fails"`` or ``"undecided"``: the verdict in ``claim``'s labels.

    Examples
    --------
    >>> from approxlab.studies.perplexity.claims import P1
    >>> from approxlab.studies.perplexity.in_short import kind
    >>> kind(P1, "ranks the losses"), kind(P1, "does not rank the losses"), kind(P1, "no verdict: coverage 62.0% < 90%")
    ('holds', 'fails', 'undecided')
    """
    labels = claim.labels or {}
    if verdict == labels.get("reproduced"):
        return HOLDS
    if verdict == labels.get("not reproduced"):
        return FAILS
    return UNDECIDED


def _estimate(row) -> str:
    low, high = float(row["ci_low"]), float(row["ci_high"])
    interval = f" [{fmt(low)}, {fmt(high)}]" if pd.notna(low) and pd.notna(high) else ""
    return f"{fmt(float(row['estimate']))}{interval}"


def _where(row) -> str:
    return setting_text(row["setting"], row["layers"])


def _by_kind(claim, rows: pd.DataFrame, name) -> dict:
    """``{kind: [text of each row]}`` for the rows of one claim; ``name(row)`` words a row."""
    found = {HOLDS: [], FAILS: [], UNDECIDED: []}
    for _, row in rows.iterrows():
        found[kind(claim, str(row["verdict"]))].append(name(row))
    return found


def _sentence(found: dict, holds: str, fails: str, undecided: str = "undecided") -> str:
    parts = [f"{holds} {'; '.join(found[HOLDS])}" if found[HOLDS] else "",
             f"{fails} {'; '.join(found[FAILS])}" if found[FAILS] else "",
             f"{undecided} {'; '.join(found[UNDECIDED])}" if found[UNDECIDED] else ""]
    return ". ".join(p[0].upper() + p[1:] for p in parts if p) + "." if any(parts) else "no verdicts."


def _level(verdicts, claim) -> pd.DataFrame:
    return verdicts[verdicts["claim"] == claim.id]


def _per_method(verdicts) -> list[str]:
    rows = _level(verdicts, P1_METHOD)
    lines = []
    for (setting, layers), group in rows.groupby(["setting", "layers"], sort=False):
        found = _by_kind(P1_METHOD, group, lambda row: f"{row['method']} {_estimate(row)}")
        counts = ", ".join(f"{len(found[k])} {k}" for k in (HOLDS, FAILS, UNDECIDED))
        lines.append(f"  - {setting_text(setting, layers)} ({counts} of {len(group)} methods with five budgets): "
                     + _sentence(found, "it ranks a method's own budgets for", "it does not for", "undecided for"))
    return lines


def _verdict(row) -> str:
    return f"{_where(row)}: rho {_estimate(row)}, {row['verdict']}"


def in_short_lines(verdicts: pd.DataFrame, observed: pd.DataFrame) -> list[str]:
    """The ``## In short`` section: at each level, where the premise holds, where it fails and where the run cannot
    tell, with the estimates and intervals of the verdicts below it."""
    lines = ["## In short", "",
             "Where the relative spectral error of the attention output orders what the model loses (the change in "
             "log-perplexity), at each level asked, from the verdicts below (\"holds\": the whole 95% interval is at "
             "or above the claim's threshold; \"fails\": the whole interval is below it; \"undecided\": the "
             "interval straddles it, or no verdict was given). rho is Spearman's, with its interval.", ""]
    across = _by_kind(P1, _level(verdicts, P1), _verdict)
    lines.append("- **Across methods** (does a method with more error lose more than another?): "
                 + _sentence(across, "holds in", "fails in", "undecided in"))
    within = _by_kind(P1_WITHIN, _level(verdicts, P1_WITHIN), _verdict)
    lines.append("- **Within a method** (does a larger budget of the same method, with less error, lose less?), "
                 "pooled over methods: " + _sentence(within, "holds in", "fails in", "undecided in"))
    lines += _per_method(verdicts)
    budget = _by_kind(P1_BUDGET, _level(verdicts, P1_BUDGET),
                      lambda row: f"{_where(row)} at d = {int(row['num_features'])}: rho {_estimate(row)}, "
                                  f"{row['verdict']}")
    lines.append("- **At a fixed budget** (do methods at the same d lose in the order of their errors?): "
                 + _sentence(budget, "holds in", "fails in", "undecided in"))
    measures = _by_kind(P2, _level(verdicts, P2),
                        lambda row: f"the {MEASURE_TEXT.get(row['measure'], row['measure'])} in {_where(row)} "
                                    f"({_estimate(row)})")
    lines.append("- **Which measure** (rho of another measure minus the spectral error's): better than the spectral "
                 "error: " + (", ".join(measures[HOLDS]) or "none") + "; worse: " + (", ".join(measures[FAILS]) or
                 "none") + f"; undecided: {len(measures[UNDECIDED])} comparisons.")
    long = _by_kind(P4, _level(verdicts, P4), _verdict)
    if any(long.values()):
        lines.append("- **At long context** (does more error lose more of a pass key the exact model retrieves?): "
                     + _sentence(long, "holds in", "fails in", "undecided in"))
    lines.append("- **In one line**: " + "; ".join(
        f"{name}, the premise holds in {len(found[HOLDS])} of {sum(map(len, found.values()))} {unit}, fails in "
        f"{len(found[FAILS])}" for name, found, unit in (("across methods", across, "settings"),
                                                       ("within a method (pooled)", within, "settings"),
                                                       ("at a fixed budget", budget, "settings x d"),
                                                       ("at long context", long, "settings"))
        if any(found.values())) + ", and the rest is undecided.")
    if len(observed):
        no_loss, points = int(observed["no_loss"].sum()), int(observed["points"].sum())
        lines.append(f"- **No measurable loss**: {no_loss} of {points} points (method x d, over every setting) "
                     "change the log-perplexity by no more than the noise floor, or by an amount whose interval over "
                     "windows holds 0; there no measure can rank, and their cells are tied at 0.")
    return [*lines, ""]
