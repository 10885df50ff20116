r"""The decoder study's summary, part two: HyperAttention against its assumptions, which assumptions hold (with
the study's criteria), the levels of the causal recursion, the quantities and the heads -- from the saved
tables only. ``sections`` assembles the whole summary."""

from __future__ import annotations

import pandas as pd

from ..reporting.changes import changes_lines
from ..reporting.claims import coverage_lines, label, tally
from ..reporting.calibrated import (calibration_lines, calibration_table, coverage_cell, holm_lines,
                                     in_short_lines)
from ..reporting.markdown import format_number as _fmt
from ..reporting.markdown import markdown_table as _markdown
from .cells import ASSUMPTIONS, KV_CACHE, PERFORMER, RESULTS
from .claims import CLAIMS, CORRELATION_CLAIMS, STRUCTURAL_NOTE
from .report import (deviation_lines, error_lines, interval_text, kv_lines, performer_lines, run_lines)
from .stats import BOOTSTRAP, head_statistics, quantity_intervals, require_rows

__all__ = ["hyperattention_lines", "verdict_lines", "level_lines", "quantity_lines", "head_lines", "sections"]

_SHORT = {"reproduced": "yes", "not reproduced": "no", "inconclusive": "?"}


def _interval_column(frame, estimate="estimate", low="ci_low", high="ci_high") -> list[str]:
    return [interval_text(e, lo, hi) for e, lo, hi in zip(frame[estimate], frame[low], frame[high])]


def hyperattention_lines(correlations, heads) -> list[str]:
    """``## HyperAttention against its assumptions``: the correlation claims, and per layer for description."""
    lines = ["", "## HyperAttention against its assumptions", ""]
    if correlations.empty:
        return lines + ["Not in this run (hyperattention is not among the methods)."]
    first = correlations.iloc[0]
    layers = len(str(first["layers"]).split())
    lines += ["Claim fixed in code before the run (`CORRELATION_CLAIMS` in approxlab/studies/decoder/claims.py): "
              "**does HyperAttention's error grow with alpha and kappa across the heads of a layer, as its theorem "
              f"says?** At n = {int(first['n'])} and m = {int(first['num_features'])} sampled columns, Spearman's rho "
              "between causal HyperAttention's relative error per head and (alpha) the largest alpha over every "
              "unmasked block of its causal recursion -- Algorithm 4 applies Theorem 1 to each block with the same m, "
              "so the guarantee for the whole matrix needs every block and the worst one binds -- or (kappa) the "
              "largest sortLSH kappa (the algorithm's own mask and block size) over the blocks that sample. The units "
              "vary at the level of the head within a layer and window: the ranks are taken within each layer x "
              "window and pooled over the clusters (a stratified rho), so that layers which differ in both error and "
              f"alpha do not make a correlation of their own. The observations are {int(first['heads_per_layer'])} "
              f"heads per layer x {layers} layers x {int(first['windows'])} windows; the "
              f"{BOOTSTRAP['resamples']}-resample percentile bootstrap draws windows (the independent unit) with all "
              "their heads, the interval calibrated on the run's own windows; the claim holds when the calibrated "
              "interval lies above 0 and fails when it lies below.", ""]
    for claim in CORRELATION_CLAIMS:
        rows = correlations[correlations["claim"] == claim.id]
        lines.append(f"- ({claim.id}) {claim.text}: " + ", ".join(f"{v}" for v in rows["verdict"]) + " (former, "
                     "the 90% coverage gate: " + ", ".join(map(str, rows["gated_verdict"])) + "; on the rho pooled over "
                     "layers: " + ", ".join(map(str, rows["former_verdict"])) + ").")
    shown = correlations.assign(rho=_interval_column(correlations),
                                pooled_rho=_interval_column(correlations, "pooled", "pooled_low", "pooled_high"))
    lines += ["", *_markdown(shown[["claim", "condition", "layers", "heads_per_layer", "windows", "rho", "verdict",
                                    "pooled_rho"]], default=str), "",
              "`rho`: within layer x window, pooled [calibrated 95% interval, windows resampled]; `pooled_rho`: the rho over "
              "every head of the run's layers at once, which is dominated by the contrast between the layers (each "
              "layer a cluster of heads with its own level of error and alpha): a description of how layers differ, "
              "not of the theorem's per-head relation; it was the former statistic.", ""]
    if int(correlations["windows"].min()) >= 1:
        lines += [*coverage_lines([{"claims": "rho (windows resampled; simulated for the median of the windows' "
                                              "values)", "claim": CORRELATION_CLAIMS[0],
                                    "units": int(correlations["windows"].min())}]), ""]
        lines += [*calibration_lines("correlation claims"), "",
                  *calibration_table(correlations, ["claim", "condition"], former="gated_verdict"), "",
                  *holm_lines(correlations, ["claim", "condition"], family="condition",
                              decided=_decided(CORRELATION_CLAIMS))]
    lines += changes_lines(correlations, ["claim", "condition"], former="gated_verdict", what="correlation claim",
                           rules=_GATE_RULE) + [""]
    per_layer = []
    for (condition, layer), frame in heads.groupby(["condition", "layer"], sort=True):
        row = {"condition": condition, "layer": layer, "heads": len(frame),
               "error": _fmt(float(frame["relative_error"].median()))}
        for quantity in ("alpha_worst", "kappa_worst"):
            used = frame.dropna(subset=[quantity])
            row[f"median {quantity}"] = _fmt(float(used[quantity].median())) if len(used) else "n/a"
            row[f"rho({quantity})"] = _fmt(float(used[quantity].corr(used["relative_error"], method="spearman"))) \
                if len(used) > 2 else "n/a"
        per_layer.append(row)
    return lines + ["Per layer (description, no verdict: 9 heads a window): medians and Spearman's rho over heads x "
                    "windows; every head in `hyperattention.csv`.", "", *_markdown(pd.DataFrame(per_layer))]


def verdict_lines(table: pd.DataFrame) -> list[str]:
    """``## Which assumptions hold``: the criteria, as the study's operationalisation, and the verdicts."""
    lines = ["", "## Which assumptions hold", "",
             "The theorems assume n^o(1) and o(sqrt(log n)), which no finite set of lengths can test. Each criterion "
             "below is this study's operationalisation, fixed in code before the run (`CLAIMS` in "
             "approxlab/studies/decoder/claims.py): what the theorem's cost needs at the measured lengths. Growth "
             "exponents are fitted per window over the run's lengths (at least 4) and summarised by a Student-t "
             "interval over windows; with fewer than 2 windows or 4 lengths there is no verdict. The median head of "
             "each layer is judged.", "",
             f"- Not judged: {STRUCTURAL_NOTE}."]
    for claim in CLAIMS:
        rows = table[table["claim"] == claim.id]
        outcomes = ("reproduced", "not reproduced", "inconclusive")
        words = sorted(set(rows["verdict"])) if claim.id == "bounded_entries" else None
        gated = int(rows["verdict"].astype(str).str.startswith("no verdict").sum())
        counts = (", ".join(f"{(rows['verdict'] == w).sum()} {w}" for w in words) if words is not None
                  else tally(claim, rows["verdict"], outcomes) + f", {gated} no verdict (calibration fails)")
        lines.append(f"- ({claim.id}) {claim.text}. Statistic: {claim.statistic}; holds {claim.side} "
                     f"{claim.threshold:g}: {counts} (of {len(rows)}).")
    if table.empty:
        return lines + ["", "(no verdicts)"]
    if int(table["windows"].min()) >= 1:
        lines += ["", "The intervals below are 95% Student-t intervals over windows calibrated on the run's own "
                  "windows; the coverage of the declared ones is stated under a model and, beside each verdict, on "
                  "the run's own windows.", "",
                  *coverage_lines([{"claims": "every criterion (Student t over windows)", "claim": CLAIMS[0],
                                    "units": int(table["windows"].min())}]), "", *calibration_lines("criteria"), "",
                  *calibration_table(table, ["claim", "condition", "layer", "depth"]), "",
                  *holm_lines(table, ["claim", "condition", "layer", "depth"], family="claim", decided=_decided(CLAIMS))]
    shown = table.assign(interval=_interval_column(table), depth=table["depth"].map(
        lambda d: "" if pd.isna(d) else str(int(d))))
    shown["holds?"] = shown["verdict"].map(lambda v: _SHORT.get(v, v))
    shown["coverage"] = [coverage_cell(r) for _, r in table.iterrows()]
    lines += ["", *_markdown(shown[["claim", "condition", "layer", "depth", "interval", "windows", "coverage",
                                    "holds?", "note"]], default=str)]
    return lines + changes_lines(table, ["claim", "condition", "layer", "depth"], what="criterion", rules=_GATE_RULE)


def _decided(declared) -> tuple:
    """The verdict words that decide a claim of ``declared`` (reproduced, not reproduced, in each claim's words)."""
    return tuple({label(c, o) for c in declared for o in ("reproduced", "not reproduced")})


_GATE_RULE = ("the declared 95% interval judged, and no verdict where its coverage on the run's own windows, estimated "
              "from the first 400 draws, was below 90%")


def level_lines(levels: pd.DataFrame, config) -> list[str]:
    """``## The levels of HyperAttention's causal recursion`` at the largest n."""
    lines = ["", "## The levels of HyperAttention's causal recursion", ""]
    if levels.empty:
        return lines + ["No unmasked block at these lengths (n at most the block size: computed exactly)."]
    n = int(levels["n"].max())
    shown = levels[levels["n"] == n]
    lines += [f"At n = {n}: per depth, the blocks (rows x columns) and, for each head's worst block, the median over "
              "heads x windows of alpha, of kappa with the three masks, of the uniform samples needed at eps = "
              f"{config['epsilon']:g} over the block's columns (at or above 1: sampling saves nothing), of the "
              "break-even eps sqrt(alpha / rows) (the smallest relative error uniform sampling can promise with "
              "fewer samples than columns), and the share of heads x windows with a block where sampling saves "
              "nothing. Every n in `level_stats.csv` and `decoder-sampling.png`.", ""]
    table = shown.assign(block=[f"{int(r)} x {int(c)}" for r, c in zip(shown["rows"], shown["columns"])])
    return lines + _markdown(table[["condition", "layer", "depth", "blocks", "block", "alpha", "kappa_sortlsh",
                                    "kappa_oracle", "kappa_all_entries", "sampling_ratio", "break_even_epsilon",
                                    "saves_nothing_share"]])


def quantity_lines(assumptions) -> list[str]:
    """``## The quantities at the shortest and longest n``, with intervals over windows."""
    ns = sorted(set(assumptions["n"]))
    lines = ["", "## The quantities at the shortest and longest n", "",
             "Median over heads x windows [95% bootstrap interval over windows]; every head in `assumptions.csv`, "
             "every quantile in `assumption_stats.csv`. alpha (of the causal P) is structural (>= n).", ""]
    rows = []
    for quantity in ("alpha", "alpha_block", "kappa_sortlsh", "kappa_oracle", "kappa_all_entries", "entry_ratio",
                     "sink_mass", "stable_rank", "performer_xy_norm"):
        if quantity not in assumptions:
            continue
        found = quantity_intervals(assumptions, quantity)
        for (condition, layer), group in found.groupby(["condition", "layer"], sort=False):
            cells = []
            for n in (ns[0], ns[-1]):
                row = group[group["n"] == n]
                cells.append("n/a" if row.empty else interval_text(row["median"].iloc[0], row["ci_low"].iloc[0],
                                                                   row["ci_high"].iloc[0]))
            rows.append([condition, layer, quantity, *cells])
    return lines + _markdown(pd.DataFrame(rows, columns=["condition", "layer", "quantity", f"n = {ns[0]}",
                                                          f"n = {ns[-1]}"]))


def head_lines(assumptions) -> list[str]:
    """``## Per layer and head`` of one condition at the largest n."""
    heads = head_statistics(assumptions)
    n, conditions = int(heads["n"].max()), set(heads["condition"])
    condition = "pretrained" if "pretrained" in conditions else sorted(conditions)[0]
    shown = heads[(heads["n"] == n) & (heads["condition"] == condition)]
    return ["", f"## Per layer and head ({condition}, n = {n})", "",
            "Median over windows; every condition and n in `head_stats.csv`, every window in `assumptions.csv`.", "",
            *_markdown(shown.drop(columns=["condition", "n"]))]


def _in_short(correlations: pd.DataFrame, table: pd.DataFrame) -> list[str]:
    """The "In short" section: HyperAttention's theorem (its error grows with alpha and kappa across heads) per
    condition, and each assumption criterion counted over its layers, each judged by its calibrated interval."""
    found = {"reproduced": [], "not reproduced": [], None: []}
    for claim in CORRELATION_CLAIMS:
        for row in correlations[correlations["claim"] == claim.id].itertuples(index=False):
            outcome = next((o for o in ("reproduced", "not reproduced") if row.verdict == label(claim, o)), None)
            found[outcome].append(f"({claim.id}) {claim.text}, {row.condition}: {row.verdict}")
    for claim in CLAIMS:
        rows = table[table["claim"] == claim.id]
        for outcome in ("reproduced", "not reproduced", None):
            words = [label(claim, o) for o in ("reproduced", "not reproduced")]
            chosen = rows[rows["verdict"] == label(claim, outcome)] if outcome else rows[~rows["verdict"].isin(words)]
            if len(chosen):
                found[outcome].append(f"({claim.id}) {claim.text}: {len(chosen)} of {len(rows)} layers")
    return in_short_lines(found["reproduced"], found["not reproduced"], found[None])


def sections(saved) -> list[str]:
    """The summary's lines from a saved run (the report step's :class:`~approxlab.studies.Summary`)."""
    config = {**saved.config, "_run": saved.run}
    results = require_rows(saved.table(RESULTS), RESULTS, saved.out)
    assumptions = require_rows(saved.table(ASSUMPTIONS), ASSUMPTIONS, saved.out)
    kv = saved.table(KV_CACHE)
    return [*_in_short(saved.product("correlations.csv"), saved.product("verdicts.csv")),
            *run_lines(saved.timing, config, results, assumptions, kv),
            *deviation_lines(config, saved.table("windows.csv"), results),
            *hyperattention_lines(saved.product("correlations.csv"), saved.product("hyperattention.csv")),
            *verdict_lines(saved.product("verdicts.csv")),
            *performer_lines(saved.table(PERFORMER), assumptions, saved.product("performer_stats.csv"), config),
            *error_lines(results, config), *kv_lines(kv, config),
            *level_lines(saved.product("level_stats.csv"), config), *quantity_lines(assumptions),
            *head_lines(assumptions)]
