r"""The decoder study's summary, part one: the run, the deviations from the papers, the errors, the KV-cache
setting and why Performer fails -- drawn from the saved tables only (``approxlab decoder --plot-only``).
The claims' sections are in :mod:`.discussion`."""

from __future__ import annotations

import math

import pandas as pd

from ..reporting.markdown import format_number as _fmt
from ..reporting.markdown import markdown_table as _markdown
from .stats import cost_exponents, error_intervals, head_errors, kv_errors

__all__ = ["TITLE", "interval_text", "run_lines", "deviation_lines", "error_lines", "kv_lines", "performer_lines"]

TITLE = "Decoder study: causal approximations and the theorems' assumptions on a real LLM"
_ASSUMPTION_CELL = ("condition", "n", "layer", "window")
_RESULT_CELL = ("condition", "n", "layer", "window", "method")


def interval_text(estimate, low, high) -> str:
    """``"0.5 [0.4, 0.6]"`` (three significant digits; ``n/a`` for a missing bound)."""
    return f"{_fmt(float(estimate))} [{_fmt(float(low))}, {_fmt(float(high))}]"


def _timing_text(runs, config) -> list[str]:
    lines = [f"- Command: `{config['_run'].get('command', 'approxlab decoder')}`"]
    for run in runs:
        lines.append(f"- Run: `{run['command']}`: {run['wall_seconds']:,.0f} s wall ({run['wall_seconds'] / 60:.1f} "
                     f"min), workers {run['workers']}, {run['threads']} thread(s) per process, finished "
                     f"{run['finished']}.")
    if not runs:
        lines.append("- **Not finished**: no finished run is recorded in `timing.json` (see the cell counts below).")
    return lines


def _completeness_text(config, results, assumptions, kv) -> list[str]:
    """How many of the grid's cells each table holds: a stopped run is said to be one."""
    grid = len(config["conditions"]) * len(config["layers"]) * config["windows"]
    found = {"assumptions.csv": (len(assumptions[list(_ASSUMPTION_CELL)].drop_duplicates()), grid * len(config["n"])),
             "results.csv": (len(results[list(_RESULT_CELL)].drop_duplicates()),
                             grid * len(config["n"]) * len(config["methods"])),
             "kv_cache.csv": (len(kv[["condition", "layer", "window", "method"]].drop_duplicates()) if len(kv) else 0,
                              grid * len(config["methods"]))}
    text = "; ".join(f"`{name}` {have} of {want}" for name, (have, want) in found.items())
    if all(have == want for have, want in found.values()):
        return [f"- Cells: every cell of the grid ({text})."]
    return [f"- **Partial run**: cells computed {text} (condition x [n x] layer x window [x method]); the same "
            "command resumes it, computing only the missing cells. The statistics below use the cells present."]


def run_lines(runs, config, results, assumptions, kv) -> list[str]:
    """``## Run``: the command and its time, the grid, the cells present, what was left out."""
    from ...plotting import FAMILY_FILES, group_by_family

    skipped = config.get("skipped", [])
    families = group_by_family(config["methods"])
    lines = ["## Run", "", *_timing_text(runs, config), *_completeness_text(config, results, assumptions, kv),
             f"- Grid: checkpoint `{config['checkpoint']}`; conditions {config['conditions']}; layers "
             f"{config['layers']}; n = {config['n']}; d = {config['num_features']}; {config['windows']} window(s) "
             f"(ids {sorted(set(assumptions['window']))}, drawn from the first {config['window_pool']} disjoint "
             f"windows of {max(config['n'])} tokens); {config['seeds']} seed(s) for randomized methods.",
             f"- KV-cache setting: the first {config['kv_context'] + config['kv_continuation']} tokens of each "
             f"window, a context of {config['kv_context']} and a continuation of {config['kv_continuation']}; "
             f"budgets {config['kv_budgets']}; K/V repeated to the query heads, so a policy keeps b tokens per query "
             "head (`grouping=\"query-head\"`, SnapKV's code; up to H/H_kv times b per KV head).",
             "- Methods: " + ", ".join(f"{m} ({'own causal form' if config['causal_forms'][m] is True else 'mask-renormalise'})"
                                       for m in config["methods"]) + ".",
             "- Left out (a value above a method's limit there): " + ("; ".join(skipped) if skipped else "nothing")
             + ".",
             "- Figures: " + ", ".join(f"`decoder-errors-{c}-<family>.png`" for c in config["conditions"])
             + " (one per family of methods: " + ", ".join(FAMILY_FILES[f] for f in families) + ")"
             + ", `decoder-kv-cache.png`, `decoder-assumptions.png`, `decoder-sampling.png`, "
             "`decoder-hyperattention.png`."]
    return lines


def _cost_text(results) -> str:
    costs = cost_exponents(results)
    measured = "; ".join(f"{row.method} {_fmt(row.seconds_at_n_max)} s, exponent {_fmt(row.exponent)}"
                         for row in costs.itertuples(index=False))
    return (f"- Cost (median seconds per approximation of all heads of a window at n = {int(results['n'].max())}, "
            "and the growth exponent of those seconds in n, on a shared machine): " + measured + ". "
            "mask-renormalise forms the method's bidirectional approximation, then masks it: by prefix sums, "
            "O(n d p_v), for the Nystrom family's factored matrices (its landmarks pooled over every position, future "
            "tokens included: an evaluation variant, not a decoder layer).")


def _cache_policies(config) -> list[str]:
    """The run's methods that exist only causally (the cache policies), from the registry."""
    from ...methods import available, get

    return [m for m in config["methods"] if m in available() and get(m).causal == "only"] or ["no cache policy"]


def deviation_lines(config, windows, results) -> list[str]:
    """``## Deviations from the papers' settings``."""
    weights = "; ".join(sorted(set(windows["weights"]))) if len(windows) and "weights" in windows else "n/a"
    return [
        "", "## Deviations from the papers' settings", "",
        f"- Weights: {weights} (initialized: the same config as the pretrained model).",
        "- Data: WikiText-2 test windows tokenised by the decoder's own tokenizer (HyperAttention measured "
        "LongBench on ChatGLM2; Alman and Song's results are worst-case theory). Windows: "
        + config["windows_are"] + "; the lengths of one window are nested prefixes, and windows are the "
        "resampling unit.",
        "- Causal forms: performer (prefix-sum FAVOR+), informer (causal ProbSparse), hyperattention (Algorithm 4's "
        "recursion, paper variant, block size 256), topk/topp (oracles over the causal row), quest (per-query "
        "pages), vattention and magicpig (sampling over the causal row) are the methods' own; "
        + ", ".join(_cache_policies(config)) + " exist only causally (row i sees what the policy "
        "keeps when i is the current decode step; their published defaults); the Nystrom family runs as "
        "`causal=\"mask-renormalise\"`.",
        _cost_text(results),
        f"- kappa: three heavy-entry masks on the unmasked blocks of the causal recursion: sortLSH's own at the "
        f"algorithm's block size {config['block_size']} (median of {config['hashes']} hashes; the mask HyperAttention "
        f"uses), each row's {config['heavy']} largest entries (an oracle: it removes the sink from every row, "
        "sortLSH only from the rows that share its block) and none.",
        "- B: the split-invariant lower bound sqrt(max|q_i.k_j|/sqrt p) on Alman and Song's entry bound, with ln n; "
        "the model's own split and the balanced split are in `assumptions.csv`.",
        f"- Numerical rank (a dense SVD per head) only for n <= {config['rank_max_n']}; above, ||P||_2 for the "
        "stable rank comes from Golub-Kahan bidiagonalisation (tolerance 1e-8, certified).",
    ]


def _pivot(found, columns, order, index=("condition", "layer"), rows=None) -> list[str]:
    """A markdown table of ``found``'s intervals: one row per ``index``, one column per value of ``columns`` in
    ``order``; ``rows``: the order of a single ``index`` (default: sorted)."""
    found = found.assign(shown=[interval_text(m, lo, hi) for m, lo, hi in
                                zip(found["median"], found["ci_low"], found["ci_high"])])
    table = found.pivot_table(index=list(index), columns=columns, values="shown", aggfunc="first")
    if rows is not None:
        table = table.loc[[r for r in rows if r in table.index]]
    return _markdown(table[[c for c in order if c in table]].reset_index().rename(columns=str))


def error_lines(results, config) -> list[str]:
    """``## Errors``: the median relative error at the largest n and d per condition x layer x method."""
    n, d = max(config["n"]), max(config["num_features"])
    long = head_errors(results)
    found = error_intervals(long[(long["n"] == n) & (long["num_features"] == d)], ("condition", "layer", "method"))
    failed = results[results["status"] != "ok"]
    lines = ["", "## Errors", "",
             f"Median relative error ||O~ - O||_2 / ||O||_2 over heads x windows x seeds at n = {n}, d = {d} [95% "
             f"bootstrap interval over windows]; every point in `error_stats.csv`. Failed approximations: "
             f"{len(failed)} of {len(results)} rows; rows with a masked row sum <= 0 (mask-renormalise divides by "
             f"it): {int((results['nonpositive_rows'] > 0).sum())}.", ""]
    if found.empty:
        return lines + ["(none)"]
    found = found.sort_values(["condition", "layer"])
    found = found.assign(column=[f"{c}, layer {layer}" for c, layer in zip(found["condition"], found["layer"])])
    return lines + _pivot(found, "column", list(dict.fromkeys(found["column"])), index=("method",),
                          rows=config["methods"])  # one row per method, in the run's order


def kv_lines(kv, config) -> list[str]:
    """``## The KV-cache setting``: the continuation's median relative error per method and budget."""
    lines = ["", "## The KV-cache setting", ""]
    if kv.empty:
        return lines + ["Not in this run (`kv_cache.csv` holds no rows)."]
    found = error_intervals(kv_errors(kv), ("condition", "layer", "method", "budget"))
    lines += [f"Each window's first {config['kv_context'] + config['kv_continuation']} tokens: a context of "
              f"{config['kv_context']} tokens, compressed by the cache policies ("
              "`approxlab.kv_cache_attention`, using only what they could see when compressing), then "
              f"{config['kv_continuation']} continuation tokens whose rows are compared with exact causal attention "
              "(relative spectral error of the (continuation, p_v) output, per head). A method without a compression "
              "step runs its causal form on the whole window, its budget being its own num_features. Median over "
              "heads x windows x seeds [95% bootstrap interval over windows]; `kv_stats.csv` has the quartiles.", ""]
    for condition in [c for c in config["conditions"] if c in set(found["condition"])]:
        shown = found[found["condition"] == condition]
        lines += [f"**{condition}**", "", *_pivot(shown, "budget", config["kv_budgets"], index=("layer", "method")), ""]
    return lines


def _range(values) -> str:
    values = pd.Series(values).dropna()
    return "n/a" if values.empty else f"{_fmt(float(values.min()))}-{_fmt(float(values.max()))}"


def performer_lines(performer, assumptions, table, config) -> list[str]:
    """``## Why Performer fails on these layers``: the attention-weighted ||x+y||^2, Lemma 2 and the control."""
    lines = ["", "## Why Performer fails on these layers", ""]
    if table.empty:
        return lines + ["Not in this run (performer is not among the methods)."]
    n = int(table["n"].max())
    at_n = table[table["n"] == n]
    shown = at_n[["condition", "layer", "num_features", "xy_norm", "lemma2_std", "relative_error", "xy_norm_scaled",
                  "lemma2_std_scaled", "relative_error_scaled"]].rename(columns={
                      "num_features": "r", "xy_norm": "||x+y||^2", "lemma2_std": "Lemma 2 rel. std",
                      "relative_error": "error", "xy_norm_scaled": "||x+y||^2 (Q, K / 4)",
                      "lemma2_std_scaled": "Lemma 2 rel. std (Q, K / 4)", "relative_error_scaled": "error (Q, K / 4)"})
    scale = float(at_n["scale"].iloc[0])
    lines += [f"Performer's Lemma 2 puts the relative variance of one entry exp(x_i.y_j), estimated by r positive "
              "random features, at (exp(||x+y||^2) - 1)/r with x = q/p^(1/4), y = k/p^(1/4). Per head: the "
              "attention-weighted median of ||x_i + y_j||^2 (each entry weighted by its exact causal probability, "
              "`performer_xy_norm` in `assumptions.csv`), the relative standard deviation Lemma 2 then gives one "
              "entry, and causal Performer's relative error; then the control, the same heads with Q and K "
              f"multiplied by {scale:g} (||x+y||^2 times {scale**2:g}) and the same random projection. Medians over "
              f"heads x windows at n = {n}; every n in `performer_stats.csv`, every head in `performer.csv`.", "",
              *_markdown(shown), ""]
    heads = assumptions[assumptions["n"] == n].groupby(["condition", "layer", "head"])["performer_xy_norm"].median()
    for condition in [c for c in config["conditions"] if c in set(at_n["condition"])]:
        rows = at_n[at_n["condition"] == condition]
        xy = heads.loc[condition] if condition in heads.index.get_level_values(0) else pd.Series(dtype=float)
        r = int(rows["num_features"].iloc[0])
        std = math.sqrt(math.expm1(min(float(xy.median()), 700.0)) / r) if len(xy) else math.nan
        verdict = ("larger than the weight itself: each attention weight is estimated as noise" if std > 1
                   else "below 1: the weights are estimated to within their own size")
        lines.append(
            f"- **{condition}**: the attention-weighted median ||x+y||^2 is {_range(xy)} across heads (median "
            f"{_fmt(float(xy.median()) if len(xy) else math.nan)}), so with r = {r} features Lemma 2 puts one entry's "
            f"relative standard deviation at about {_fmt(std)} for the median head, {verdict}; causal Performer's "
            f"relative error is {_range(rows['relative_error'])} by layer (median heads). With Q and K multiplied by "
            f"{scale:g}, ||x+y||^2 falls to {_range(rows['xy_norm_scaled'])} and the error to "
            f"{_range(rows['relative_error_scaled'])} on the same projection.")
    return lines
