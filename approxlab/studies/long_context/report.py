"""The long-context study's report, from its saved tables only: derived tables, the figure and ``summary.md``."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..reporting.calibrated import calibration_lines, holm_lines, in_short_lines
from ..reporting.markdown import format_interval, markdown_table
from .cells import ADDED, RESULTS, SHARING, WHOLE
from .claims import CLAIMS, GATE, TEXTS, UNIT, WHOLE_CLAIMS, depth_table, gate_table, verdicts
from .grid import policy_defaults, run_policies, split_task
from .tables import method_table
from .whole import complete_sequences, whole_lines, whole_panels

__all__ = ["TITLE", "results_of", "gate", "gate_depths", "policies", "cost", "claim_verdicts", "plot", "sections"]

TITLE = "Long context: RULER-style retrieval on one shared exact prefill, every cache policy and compression ratio"


def results_of(saved) -> pd.DataFrame:
    """``results.csv.gz`` with the rows of the policies added to the run (``added.csv``, without its ``policy`` key)."""
    results = saved.table(RESULTS)
    added = saved.table(ADDED)
    if added.empty:
        return results
    return pd.concat([results, added.drop(columns="policy")], ignore_index=True)


def gate(saved) -> pd.DataFrame:
    """``gate.csv``: the exact model's accuracy per task and length with its Clopper-Pearson interval, and whether
    the sequences the run still lacks could change the gate (``settled``: the grid declares texts x depths)."""
    return gate_table(results_of(saved), declared=saved.config["texts"] * len(saved.config["depths"]))


def gate_depths(saved) -> pd.DataFrame:
    """``gate_depths.csv``: the exact model's accuracy per task, length and depth of the asked needle, with its
    Clopper-Pearson interval (:func:`.claims.depth_table`; described: the gate pools the depths)."""
    return depth_table(results_of(saved))


def policies(saved) -> pd.DataFrame:
    """``policies.csv``: per length, policy and ratio: the budget, sequences, accuracy, mean losses (answer
    log-prob, all-token and key-token Delta NLL), median clean- and patched-input error, median seconds, failures.
    ``num_features`` is the median budget b over the sequences (their contexts differ by the question's length)."""
    results = results_of(saved)
    return method_table(results[results["method"] != "unpatched"])


def cost(saved) -> pd.DataFrame:
    """``cost.csv``: per length, the median prefill seconds, the key tokens' truncated-context forward's (NaN in
    tables from before it was timed), the unpatched continuation's, one policy x ratio continuation's (its share of
    its batch), the whole sequence's, and the continuations per sequence."""
    results = results_of(saved)
    rows = []
    for length, group in results.groupby("length", sort=True):
        exact = group[group["method"] == "unpatched"]
        policy = group[group["method"] != "unpatched"]
        per_sequence = group.groupby(["task", "text", "depth"])
        keys = exact["key_token_seconds"] if "key_token_seconds" in exact else pd.Series(math.nan, index=exact.index)
        whole = per_sequence["seconds"].sum() + per_sequence["prefill_seconds"].sum()
        if "key_token_seconds" in group:
            whole = whole + per_sequence["key_token_seconds"].sum()
        rows.append({"length": int(length), "sequences": len(exact),
                     "prefill_s": float(exact["prefill_seconds"].median()),
                     "key_token_s": float(keys.median()),
                     "unpatched_continuation_s": float(exact["seconds"].median()),
                     "continuation_s": float(policy["seconds"].median()) if len(policy) else math.nan,
                     "continuations": int(len(policy) / max(1, len(exact))),
                     "sequence_s": float(whole.median())})
    return pd.DataFrame(rows)


def claim_verdicts(saved) -> pd.DataFrame:
    """``verdicts.csv``: the premise claims per setting and length (:func:`.claims.verdicts`), the whole-sequence
    setting on the sequences every method ran on (:func:`.whole.complete_sequences`)."""
    whole = saved.table(WHOLE)
    complete = None if whole is None or whole.empty else complete_sequences(whole, saved.config)
    return verdicts(results_of(saved), complete)


def _partial_style(method: str, curve: pd.DataFrame, sequences: int) -> dict:
    """The policy's line style; its label says on how many sequences it stands where that is fewer than the
    panel's (a policy added to a stopped run)."""
    from ...plotting import method_style

    style = method_style(method)
    held = int(curve["sequences"].min())
    return {**style, "label": f"{style['label']} ({held} seq.)"} if held < sequences else style


def plot(saved) -> list:
    """``long_context.png/.pdf``: per length, two rows. Top: the exact model's accuracy per task with its 95%
    interval against the gate, then each policy's accuracy over the compression ratios (the run's policies and
    those added to it, in balanced panels of at most 9). Bottom: each policy x ratio's median clean-input error
    against its mean answer log-prob loss, then each policy's mean log-prob loss over the ratios (a policy without
    rows at a length, in a stopped run, is left out there; one on fewer sequences than its panel's title counts
    says how many in its label). Then, where the
    whole-sequence setting ran, a row per length: its methods' accuracy, and their error against loss
    (:func:`.whole.whole_panels`)."""
    from ...plotting import figure, method_style, panel_groups, save_figure

    table, gated, depths = saved.product("policies.csv"), saved.product("gate.csv"), saved.product("gate_depths.csv")
    lengths = sorted(table["length"].unique()) if len(table) else sorted(gated["length"].unique())
    drawn = run_policies(saved.config)
    panels = max(1, math.ceil(len(drawn) / 9))  # at most 9 policies a panel, the panels balanced
    groups = panel_groups({"policies": drawn}, limit=max(1, math.ceil(len(drawn) / panels)))
    whole = sorted(saved.product("whole_methods.csv")["length"].unique())
    fig, axes = figure(2 * len(lengths) + len(whole), 1 + len(groups), panel_size=(3.4, 2.8))
    for index, length in enumerate(whole):
        row = axes[2 * len(lengths) + index]
        whole_panels(row[:2], saved, int(length))
        for ax in row[2:]:
            ax.axis("off")
    for index, length in enumerate(lengths):
        top, bottom = axes[2 * index], axes[2 * index + 1]
        _gate_panel(top[0], gated[gated["length"] == length].reset_index(drop=True),
                    depths[depths["length"] == length], length)
        at = table[table["length"] == length]
        sequences = int(gated.loc[gated["length"] == length, "sequences"].sum())
        for method in drawn:
            points = at[at["method"] == method]
            bottom[0].scatter(points["clean_spectral"], points["delta_logprob"], s=10,
                              **{k: v for k, v in method_style(method).items() if k in ("color", "marker", "label")})
        bottom[0].set_xscale("log")
        bottom[0].set_xlabel("clean-input spectral error (median)")
        bottom[0].set_ylabel("answer log-prob loss (nats, mean)")
        bottom[0].set_title(f"error against loss, {length} tokens", fontsize=8)
        for column, (title, chosen) in enumerate(groups.items(), start=1):
            for ax, value, label in ((top[column], "accuracy", "accuracy (exact match)"),
                                     (bottom[column], "delta_logprob", "answer log-prob loss (nats, mean)")):
                for method in chosen:  # not drawn: a policy without rows at this length yet (a stopped run) or
                    # without a row that did not fail
                    curve = at[(at["method"] == method) & (at["sequences"] > 0)].sort_values("compression_ratio")
                    if len(curve):
                        ax.plot(curve["compression_ratio"], curve[value], **_partial_style(method, curve, sequences))
                ax.set_xlabel("compression ratio (fraction of the context removed)")
                ax.set_ylabel(label)
                ax.set_title(f"{title}, {length} tokens, all tasks ({sequences} sequences)", fontsize=8)
            top[column].set_ylim(-0.05, 1.05)
            if top[column].get_legend_handles_labels()[0]:
                top[column].legend(fontsize=5, loc="upper right", ncol=2)
    return save_figure(fig, saved.out / "long_context")


_DEPTH_MARKERS = ("v", "s", "^", "D", "P", "X")
"""The markers of the depths of the asked needle in the gate panel, in the grid's order."""


def _gate_panel(ax, at: pd.DataFrame, depths: pd.DataFrame, length: int) -> None:
    """The exact model's accuracy per task with its Clopper-Pearson interval and the gate; to its right, in grey,
    its accuracy at each depth of the asked needle where the run has several (described, not gated)."""
    x = np.arange(len(at))
    levels = sorted(depths["depth"].unique()) if depths["depth"].nunique() > 1 else []  # one depth: the pooled
    shift = 0.12 * len(levels) / 2  # the task's points centred on its tick: pooled, then depth by depth
    ax.errorbar(x - shift, at["accuracy"], yerr=[at["accuracy"] - at["cp_low"], at["cp_high"] - at["accuracy"]],
                fmt="o", color="black", capsize=3, label="exact model, all depths, 95% CP")
    for index, depth in enumerate(levels):
        rows = depths[depths["depth"] == depth].set_index("task").reindex(at["task"])
        ax.errorbar(x - shift + 0.12 * (index + 1), rows["accuracy"], yerr=[rows["accuracy"] - rows["cp_low"],
                    rows["cp_high"] - rows["accuracy"]], fmt=_DEPTH_MARKERS[index % len(_DEPTH_MARKERS)],
                    color="grey", markersize=3, elinewidth=0.6, capsize=1.5, label=f"needle at depth {depth:g}")
    ax.set_xlim(-0.5, len(at) - 0.5)
    ax.axhline(GATE, color="grey", linestyle=":", linewidth=0.8, label=f"gate {GATE:.0%}")
    ax.set_xticks(x, [_gate_label(row) for _, row in at.iterrows()], fontsize=6)
    ax.set_ylim(-0.05, 1.42)  # the legend above 1, where no accuracy can be
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_title(f"exact model, {length} tokens", fontsize=8)
    ax.set_ylabel("accuracy (exact match)")
    ax.legend(fontsize=5, loc="upper center", ncol=2)


_SETTLED = {"fail": "fails", "pass": "passes"}
"""``gate.csv``'s ``settled`` in words (``"open"``: none)."""


def _gate_label(row) -> str:
    """A task's tick label; where the run holds part of its sequences, how many and whether the gate is settled."""
    label = str(row["task"]).replace("-", "\n")
    if row["sequences"] >= row["declared"]:
        return label
    settled = f", {_SETTLED[row['settled']]}" if row["settled"] in _SETTLED else ""
    return f"{label}\n{row['sequences']} of {row['declared']}{settled}"


def _in_short(saved, table, gated, spent) -> list[str]:
    words = {"holds": [], "fails": [], "open": []}
    for _, row in table[table["sequences"] == "gated"].iterrows():
        name = f"{row['claim']} at {row['length']} tokens ({format_interval(row['estimate'], row['ci_low'], row['ci_high'])}, " \
               f"{row['texts']} texts)"
        words["holds" if row["verdict"] == "holds" else "fails" if row["verdict"] == "fails" else "open"].append(
            name if row["verdict"] in ("holds", "fails") else f"{name}: {row['verdict']}")
    passed = gated[gated["passes"]]
    judged = table[(table["sequences"] == "gated") & table["verdict"].isin(["holds", "fails"])]
    if judged.empty:
        plain = (f"In plain words: whether the clean-input error predicts what a cache policy loses at long context "
                 f"cannot be told from this run: {len(passed)} of {len(gated)} task x length pairs pass the exact "
                 f"model's accuracy gate, and a claim needs the gated sequences of at least {CLAIMS[0].min_units} "
                 "texts with a ranking (the lines `every task's sequences` below describe the statistic without "
                 "the gate).")
    else:
        plain = "In plain words: " + "; ".join(f"at {r['length']} tokens, {r['text']}: {r['verdict']}"
                                               for _, r in judged.iterrows()) + "."
    point = []
    for _, row in table[(table["sequences"] == "gated") & ~table["verdict"].isin(["holds", "fails"])].iterrows():
        if np.isfinite(float(row.get("every_stratum", np.nan))):  # a point: nothing for the bootstrap to resample
            point.append(f"{row['claim']} at {row['length']} tokens: every one of its {row['strata']} strata gives "
                         f"exactly {float(row['every_stratum']):g}, so its texts resample to that value alone and "
                         "there is no interval to calibrate: the rule fixed before the data gives no verdict."
                         + (" Read plainly: the clean-input error orders each policy's budgets exactly as 1/b does; "
                            "it says nothing the budget does not." if row["claim"] == "budget"
                            and float(row["every_stratum"]) == 0 else ""))
    notes = [plain, *_coverage_notes(saved), *point, f"Gate: {len(passed)} of {len(gated)} task x length pairs pass (exact accuracy's 95% Clopper-Pearson "
             f"lower bound >= {GATE:.0%}): " + (", ".join(f"{t} at {n}" for t, n in passed[["task", "length"]]
                                                        .itertuples(index=False)) or "none") + "."]
    notes += _unsettled_notes(gated)
    notes += _worst_head_notes(table)
    for _, row in table[table["sequences"] == "all"].iterrows():
        notes.append(f"Every task's sequences, gate or not (described, not judged): {row['claim']} at "
                     f"{row['length']} tokens {format_interval(row['estimate'], row['ci_low'], row['ci_high'])} over "
                     f"{row['texts']} texts ({row['strata']} strata).")
    notes += [f"At {int(r['length'])} tokens: prefill {r['prefill_s']:.1f} s, a policy x ratio continuation "
              f"{r['continuation_s']:.2f} s, a whole sequence ({int(r['continuations'])} continuations) "
              f"{r['sequence_s']:.0f} s (medians over {int(r['sequences'])} sequences)." for _, r in spent.iterrows()]
    sharing = saved.table(SHARING)
    for length, group in ([] if sharing is None or sharing.empty else sharing.groupby("length")):
        by = group.set_index(group["shared"].astype(bool))["seconds_per_continuation"]
        if True in by and False in by:
            notes.append(f"Shared column sums at {int(length)} tokens: an H2O / observed-attention continuation "
                         f"{by[True]:.2f} s against {by[False]:.2f} s recomputing them.")
    return in_short_lines(words["holds"], words["fails"], words["open"], notes=notes)


def _unsettled_notes(gated: pd.DataFrame) -> list[str]:
    """Per task and length the run holds only part of: whether its missing sequences can still change the gate."""
    notes = []
    for _, row in gated[gated["sequences"] < gated["declared"]].iterrows():
        missing = int(row["declared"] - row["sequences"])
        settled = _SETTLED.get(row["settled"])
        outcome = (f"it {settled} whatever the {missing} missing ones give" if settled
                   else f"the {missing} missing ones can still change it")
        notes.append(f"Gate, {row['task']} at {row['length']} tokens: {row['correct']} right of the "
                     f"{row['sequences']} sequences so far; {outcome}.")
    return notes


def _coverage_notes(saved) -> list[str]:
    """Per length where the run is not yet complete: the sequences it holds of those declared, the texts that hold
    all of theirs, and the policies with rows on fewer of its sequences (an added policy's cells follow every
    sequence's), whose claims there rank the others."""
    config, results = saved.config, results_of(saved)
    per_text = len(config["ruler_tasks"]) * len(config["depths"])
    declared, notes = per_text * config["texts"], []
    for length in config["lengths"]:
        rows = results[results["length"] == length].drop_duplicates(["method", "task", "text", "depth"])
        exact = rows[rows["method"] == "unpatched"]
        counts = rows.groupby("method").size()  # sequences with a row of each method
        short = [f"{name} on {int(counts.get(name, 0))}" for name in run_policies(config)
                 if counts.get(name, 0) < len(exact)]
        if len(exact) < declared:
            whole = int((exact.groupby("text").size() == per_text).sum())
            notes.append(f"Not complete at {length} tokens: {len(exact)} of the {declared} declared sequences "
                         f"({whole} of {config['texts']} texts whole); the same command resumes the run.")
        if short:
            notes.append(f"Policies on fewer sequences at {length} tokens: {', '.join(short)} of the {len(exact)} "
                         "(added after those were computed), so the claims there rank the policies each sequence "
                         "has; the same command adds their cells.")
    return notes


def _worst_head_notes(table: pd.DataFrame) -> list[str]:
    """Whether a claim's verdict changes when the error is the worst head's (rows ``"gated, worst head"``, beside
    the declared median head's on the same sequences), in words; or that no sequence records it."""
    worst = table[table["sequences"] == "gated, worst head"]
    missing = [setting for setting in table["setting"].unique() if setting not in set(worst["setting"])]
    notes = [] if not missing else [
        f"The worst head's error (`clean_spectral_worst_head`) is recorded by no gated sequence of the "
        f"{' or '.join(missing)} setting in this run, so whether its verdicts change with it is not known here."]
    for _, row in worst.iterrows():
        before = row["median_head_verdict"]
        notes.append(f"Under the worst head's error (described; the {row['texts']} texts whose sequences record "
                     f"it): {row['setting']} {row['claim']} at {row['length']} tokens "
                     f"{format_interval(row['estimate'], row['ci_low'], row['ci_high'])}, {row['verdict']}; the "
                     f"median head on the same sequences {float(row['median_head_estimate']):.3f}, {before}"
                     + (" (the same verdict)." if row["verdict"] == before else
                        ": the verdict changes with the statistic."))
    return notes


def _sharing_lines(saved) -> list[str]:
    """What sharing the prefill's attention column sums saves (``sharing.csv``), measured by the run itself."""
    table = saved.table(SHARING)
    if table is None or table.empty:
        return ["The saving of the shared column sums was not measured in this run (no `sharing.csv`: the run has "
                "neither H2O nor observed attention, or predates the measurement)."]
    return ["H2O and observed attention score by the prefill's attention column sums; the run computes them once "
            "per layer for both policies and every ratio. Measured on the first text's single-needle sequence "
            "(depth 0.5) at each length, the same continuations with the sums shared and recomputed per policy and "
            "ratio (`max_abs_difference`: the largest difference of their scores and errors, 0 when equal bit for "
            "bit):", "", *markdown_table(table[["length", "policies", "shared", "continuations", "seconds",
                                                  "seconds_per_continuation", "max_abs_difference"]])]


def _added_lines(config: dict) -> list[str]:
    """The cost table's caveat where policies were added to the run (their cells each ran a prefill of their own)."""
    if not config.get("added_policies"):
        return []
    return [f"The policies added to the run ({', '.join(config['added_policies'])}) ran in cells of their own, one "
            "per sequence and policy, each with its own prefill; `continuations` and `sequence_s` count their "
            "continuations and not those prefills: what one shared prefill costs every policy.", ""]


def _texts(config: dict) -> str:
    """What the run's texts are (:data:`~.claims.TEXTS` of its tasks' haystacks, WikiText-2 first): WikiText-2
    windows, and draws where a task is on RULER's noise haystack; in a run of both, the window and the draw of one
    index are one text, one unit of the resampling."""
    found = {split_task(task)[1] for task in config["ruler_tasks"]}
    both = "; the WikiText-2 window and the noise draw of one index are one text" if len(found) > 1 else ""
    return "; ".join(text for name, text in TEXTS.items() if name in found) + both


def sections(saved) -> list[str]:
    """The summary: in short, the run, cost, the gate, the policies, the claims, what is left out."""
    config = saved.config
    table, gated, spent = saved.product("verdicts.csv"), saved.product("gate.csv"), saved.product("cost.csv")
    lines = _in_short(saved, table, gated, spent)
    names = run_policies(config)
    defaults = "; ".join(f"{name} {policy_defaults(name) or '(no options)'}" for name in names)
    lines += ["## The run", "", f"`{saved.command}`", "",
              f"Lengths {config['lengths']}; tasks {config['ruler_tasks']}; {config['texts']} distinct texts "
              f"({_texts(config)}) x depths "
              f"{config['depths']} per task and length; "
              f"compression ratios {config['ratios']} (b = max(1, int(n_c (1 - r))) context tokens per KV head, "
              f"recorded beside each ratio); {len(names)} cache policies with their defaults: "
              f"{defaults} (the RoPE inputs of the policies that read them are the model's, supplied by the engine). Key tokens (LongPPL, alpha = 2, beta = -2) read a truncated context of "
              f"{config['short_context']} tokens per length.", "",
              "## Cost", "", "One exact prefill per sequence, shared by every policy and ratio "
              "(`approxlab.patching.sweep_policies`); seconds are wall seconds of one worker.", "",
              *markdown_table(spent), "", *_added_lines(config), *_sharing_lines(saved), "",
              "## The gate", "", *markdown_table(gated), "",
              "The exact model by depth of the asked needle (the fraction of the haystack before it; described: the "
              "gate pools the depths):", "", *markdown_table(saved.product("gate_depths.csv")), "",
              "## Policies", "", "Mean over sequences of every task (gated or not); `delta_*` in nats against the "
              "exact model on the same sequence; errors: clean- and patched-input relative spectral error, mean over "
              "layers of the median over heads (median over sequences; `clean_worst_head`, where recorded: of the "
              "largest over heads).", "",
              *markdown_table(saved.product("policies.csv")), "",
              *whole_lines(saved),
              "## Claims", "", *[f"- **{c.id}**: {c.text} ({c.statistic}; {c.side} {c.threshold:g}; units: texts)."
                                 for c in (*CLAIMS, *WHOLE_CLAIMS)], "",
              UNIT.format(texts=_texts(config)), "",
              "Rows `gated`: the claims, on the sequences of the tasks that pass the gate at that length, with the "
              "calibrated interval. Rows `all`: the same statistic on every task's sequences, gate or not, with its "
              "declared 95% interval over texts: described, not judged. Rows `gated, worst head` (the gated "
              "sequences whose every row records it): the claims with the error of each layer's worst head, to show "
              "whether a verdict changes with the statistic; outside the Holm families.", "",
              *markdown_table(table[["setting", "length", "sequences", "claim", "texts", "strata", "tasks",
                                     "estimate", "ci_low", "ci_high", "verdict"]]), "",
              *calibration_lines(), "",
              *holm_lines(table[table["sequences"] == "gated"], ["setting", "length", "claim"],
                          family=["setting", "length"],
                          decided=("holds", "fails")),
              "## Left out", "",
              "RULER tasks not built: NIAH with UUID or word values, the essay haystack (no offline copy of "
              "Paul Graham's essays) and the haystack of needles, common/frequent words extraction (aggregation) and "
              "question answering "
              "(SQuAD/HotpotQA: no offline copy). The whole-sequence setting runs at the shortest length only, one "
              "ratio by default: each of its methods reruns the model over the whole sequence.", ""]
    return lines
