r"""Figure 1 beside the paper's own: the digitised curves against this run's ``panel_stats.csv``.

The paper's points are :func:`approxlab.studies.paper.skyformer_figure1` (read from the
camera-ready PDF, with a reading error per point). A point of the paper is compared with the
same (condition, n, d) of this run for the method itself and for its variants
(:data:`PAPER_COUNTERPARTS`: ``performer-lra`` is Performer as the Skyformer authors' code feeds it,
compared with the paper's Performer curve).

Absolute levels are not comparable between the two settings (the paper's bert-base-cased against
this run's models; the summary names every deviation); the shapes are: the ratio of the error at
the largest d to the smallest (:func:`shape_comparison`) and the ordering of the methods at a
given d (:func:`orderings`).
"""

from __future__ import annotations

import pandas as pd

from .stats import PAPER_METHODS, THRESHOLDS

__all__ = ["PAPER_COUNTERPARTS", "COMPARISON_COLUMNS", "paper_curves", "paper_comparison", "shape_comparison",
           "orderings", "paper_claim_b"]

PAPER_COUNTERPARTS = {"performer-lra": "performer"}
"""Method of this run -> the paper's curve it is compared with, besides each paper method with itself."""

COMPARISON_COLUMNS = ["condition", "n", "method", "paper_method", "num_features", "paper", "paper_reading_error",
                      "ours_median", "ours_mean", "median_over_paper"]
"""Columns of ``paper_comparison.csv`` (ours: float64, over heads x windows x seeds)."""


def paper_curves() -> pd.DataFrame:
    """The paper's Figure 1 (:func:`approxlab.studies.paper.skyformer_figure1`)."""
    from ..paper import skyformer_figure1

    return skyformer_figure1()


def paper_comparison(panel: pd.DataFrame, paper: pd.DataFrame | None = None) -> pd.DataFrame:
    """``paper_comparison.csv``: the paper's point beside this run's median and mean, per method, panel and d.

    Parameters
    ----------
    panel : pandas.DataFrame
        :func:`~approxlab.studies.figure1.stats.panel_statistics` of the run (its float64 rows are used).
    paper : pandas.DataFrame, optional
        The paper's table (default :func:`paper_curves`).

    Returns
    -------
    pandas.DataFrame
        :data:`COMPARISON_COLUMNS`; one row per point that both have (every paper method and
        counterpart the run computed, at the run's conditions, n and d).
    """
    paper = paper_curves() if paper is None else paper
    ours = panel[panel["dtype"] == "float64"]
    pairs = [(m, m) for m in PAPER_METHODS] + list(PAPER_COUNTERPARTS.items())
    frames = []
    for method, paper_method in pairs:
        mine = ours[ours["method"] == method][["condition", "n", "num_features", "median", "mean"]]
        theirs = paper[paper["method"] == paper_method][["condition", "n", "num_features", "error", "reading_error"]]
        both = theirs.merge(mine, on=["condition", "n", "num_features"], how="inner")
        if len(both):
            frames.append(both.assign(method=method, paper_method=paper_method))
    if not frames:
        return pd.DataFrame(columns=COMPARISON_COLUMNS)
    table = pd.concat(frames, ignore_index=True).rename(columns={
        "error": "paper", "reading_error": "paper_reading_error", "median": "ours_median", "mean": "ours_mean"})
    table["median_over_paper"] = table["ours_median"] / table["paper"]
    return table[COMPARISON_COLUMNS].sort_values(["condition", "n", "method", "num_features"]).reset_index(drop=True)


def shape_comparison(comparison: pd.DataFrame) -> pd.DataFrame:
    """Per panel and method: the error ratio d_max/d_min of the paper, of our median and of our mean.

    Returns
    -------
    pandas.DataFrame
        ``condition, n, method, paper, ours_median, ours_mean`` (the ratios, at the smallest and
        largest d that both have).
    """
    rows = []
    for (condition, n, method), group in comparison.groupby(["condition", "n", "method"], sort=True):
        first, last = group.loc[group["num_features"].idxmin()], group.loc[group["num_features"].idxmax()]
        rows.append({"condition": condition, "n": n, "method": method,
                     **{c: last[c] / first[c] for c in ("paper", "ours_median", "ours_mean")}})
    return pd.DataFrame(rows, columns=["condition", "n", "method", "paper", "ours_median", "ours_mean"])


def _order(values: dict, errors: dict | None = None) -> str:
    """Methods from lowest to highest: ``a < b``, or ``a ≈ b`` when their difference is within the
    summed reading errors."""
    names = sorted(values, key=lambda m: (values[m], m))
    text = names[0]
    for before, name in zip(names, names[1:]):
        close = errors is not None and values[name] - values[before] <= errors[name] + errors[before]
        text += f" {'≈' if close else '<'} {name}"
    return text


def orderings(comparison: pd.DataFrame, num_features: int) -> pd.DataFrame:
    """The paper's four methods ordered by error at ``num_features``: the paper's (``≈`` within the
    reading error), our median's and our mean's, per panel."""
    at = comparison[(comparison["num_features"] == num_features) & (comparison["method"] == comparison["paper_method"])]
    rows = []
    for (condition, n), group in at.groupby(["condition", "n"], sort=True):
        group = group.set_index("method")
        rows.append({"condition": condition, "n": n,
                     "paper": _order(group["paper"].to_dict(), group["paper_reading_error"].to_dict()),
                     "ours_median": _order(group["ours_median"].to_dict()),
                     "ours_mean": _order(group["ours_mean"].to_dict())})
    return pd.DataFrame(rows, columns=["condition", "n", "paper", "ours_median", "ours_mean"])


def paper_claim_b(paper: pd.DataFrame | None = None) -> tuple[int, int]:
    """How many of the paper's own baseline curves pass claim (b)'s bar (ratio d_max/d_min at least
    ``THRESHOLDS["b"]``): ``(passing, total)``."""
    paper = paper_curves() if paper is None else paper
    baselines = paper[paper["method"].isin(PAPER_METHODS[1:])]
    passing = total = 0
    for _, group in baselines.groupby(["condition", "n", "method"]):
        ratio = group.loc[group["num_features"].idxmax(), "error"] / group.loc[group["num_features"].idxmin(), "error"]
        passing, total = passing + int(ratio >= THRESHOLDS["b"]), total + 1
    return passing, total
