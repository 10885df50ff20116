"""The perplexity study's ``summary.md``, from its saved tables only: the run, its deviations, the claims under the
statistics used, the changes in log-perplexity, the encoder, the cost, and the comparison with the papers."""

from __future__ import annotations

import math

import numpy as np

from ..reporting.markdown import format_interval, markdown_table
from ..reporting.markdown import format_number as fmt
from .cells import PATCHED
from .grid import KV_CACHE, WHOLE
from .claims_summary import claim_sections, delta_cells
from .premise_summary import in_short_lines, premise_sections
from .long_report import long_lines
from .stats import settings_of

__all__ = ["TITLE", "HYPERATTENTION_PERPLEXITY", "sections"]

TITLE = "Perplexity study: does the spectral error of attention predict what a language model loses?"

_OUTCOMES = ("reproduced", "not reproduced", "inconclusive", "too few units")

HYPERATTENTION_PERPLEXITY = (5.6, 6.3)
"""Perplexity of ChatGLM2-6B-32k before and after HyperAttention replaced the attention of its final layers, at a
32k context (Han et al., ICLR 2024, abstract)."""


def _grid_lines(saved) -> list[str]:
    """Each computed table's cells against the declared grid's (``config.json``); a stopped run is said to be one,
    with the command that continues it (only the missing cells run)."""
    settings = {"data_dir": None, "cache_dir": None, "device": "cpu"}  # a cell list depends on the grid only
    short = []
    for step in saved.study.steps:
        table = step.tables[0]
        total = len(step.cells(saved.config, settings))
        frame = saved.table(table.name) if (saved.out / table.name).is_file() else None
        done = 0 if frame is None or not len(frame) else len(frame.drop_duplicates(list(table.key)))
        if done < total:
            short.append(f"`{table.name}` {done:,} of {total:,}")
    if not short:
        return []
    return [f"- **Not finished**: cells computed of the declared grid: {'; '.join(short)}. The claims use the cells "
            f"present and say \"not run\" where a table holds none; `{saved.command}` continues the run (only the "
            f"missing cells run)."]


def _ratios(config) -> str:
    """How the budgets were given, where as compression ratios (``--ratios``); "" for counts."""
    ratios = config.get("ratios")
    if not ratios:
        return ""
    pairs = ", ".join(f"r = {r:g}: b = {b}" for b, r in ratios.items())
    return (f", given as kvpress's compression ratios ({pairs}; b = max(1, int(n_c (1 - r))) of the n_c = "
            f"{config['context']} context tokens, kvpress's rounding; the tables carry both, `compression_ratio` "
            "beside `num_features`)")


def _run(saved, delta, baseline) -> list[str]:
    config = saved.config
    lines = ["## Run", "", f"- Command: `{saved.command}`"]
    lines += [f"- Compute run that finished: `{run['command']}`: {run['wall_seconds']:,.0f} s wall "
              f"({run['wall_seconds'] / 60:.1f} min), workers {run['workers']}, {run['threads']} thread(s) per process, "
              f"finished {run['finished']} (a run resumed after an interruption times here only its last stretch)."
              for run in saved.timing] or ["- **Not finished**: no finished run is recorded in `timing.json`."]
    lines += _cell_compute(saved) + _grid_lines(saved)
    perplexity = saved.table(PATCHED)
    failed = int((perplexity["status"] != "ok").sum())
    lines.append(f"- Cells: `{PATCHED}` {len(perplexity)} patched runs ({failed} failed), `baseline.csv` "
                 f"{len(baseline)}, `encoder.csv` {len(saved.table('encoder.csv'))}, `cost.csv` "
                 f"{len(saved.table('cost.csv'))}.")
    windows = sorted(set(baseline["window"]))
    lines += [
        f"- Decoder: `{config['checkpoint']}` ({config['num_layers']} layers); encoder: "
        f"`{config['encoder_checkpoint']}`.",
        f"- Windows: {len(windows)} WikiText-2 test windows (ids {windows} of the first {config['window_pool']} "
        f"disjoint windows of {config['window_tokens']} tokens); the whole-window setting reads their first "
        f"n = {config['n']} tokens and scores its {config['n'] - 1} predictions; the KV-cache setting compresses a "
        f"context of n_c = {config['context']} tokens in every layer and scores the {config['continuation'] - 1} "
        f"predictions made in the {config['continuation']}-token continuation; its kept sets: "
        f"`grouping=\"{config.get('kv_grouping', 'query-head')}\"` (kv-head: d tokens per KV head; query-head: d per "
        "query head, up to H/H_kv times d per KV head).",
        f"- Replaced: {', '.join(config['layers'])} (whole window); every layer (KV cache). The budget d "
        f"(`num_features`: the context tokens a cache policy keeps per head, the features of every other method): "
        f"{config['num_features']}{_ratios(config)}; a method that ignores d runs once.",
        "- Methods (decoder): " + ", ".join(config["methods"]) + f"; control: `{config['control']}` through the patch "
        "(its change in log-perplexity is the floor of the measurement).",
        "- Methods (encoder): " + ", ".join(config["encoder_methods"]) + ".",
        "- Figures: `perplexity-error.png` (against the relative spectral error, one panel per family, d as marker "
        "size, the noise floor shaded, points of exact attention left out), `perplexity-within.png` (each method over "
        "its budgets, one panel per family), `perplexity-d.png` "
        "(against the budget d, one panel per family), `perplexity-kv.png` (KV cache, against the budget d, one "
        "panel per family)"
        + (", `perplexity-long.png` (pass-key retrieval per method, budget d and depth of the key)."
           if config.get("long_n") else "."),
    ]
    return lines


_TIMED_TABLES = ("baseline.csv", PATCHED, "encoder.csv", "long.csv")
"""The tables whose rows carry their cell's own timing (``seconds``, and ``cpu_seconds`` but in the baseline)."""


def _cell_compute(saved) -> list[str]:
    """The run's compute summed over its cells: every stretch of a resumed run, where ``timing.json`` lists only
    the compute runs that finished."""
    wall = cpu = 0.0
    cells = 0
    for name in _TIMED_TABLES:
        table = saved.table(name)
        if table.empty or "seconds" not in table:
            continue
        finite = table[np.isfinite(table["seconds"])]
        cells, wall = cells + len(finite), wall + float(finite["seconds"].sum())
        cpu += float(finite["cpu_seconds"].sum()) if "cpu_seconds" in finite else 0.0
    if not cells:
        return []
    return [f"- Compute in the cells: {wall / 3600:,.1f} worker-hours wall, {cpu / 3600:,.1f} thread CPU-hours over "
            f"{cells:,} cells ({', '.join(f'`{name}`' for name in _TIMED_TABLES)}: the sums of their `seconds` and "
            "`cpu_seconds`; the baseline's cells record wall seconds only), every stretch of the run included; the cost "
            "cells' timed repeats are not counted."]


def _deviations(saved, baseline) -> list[str]:
    weights = saved.run.get("weights", {})
    decoder = weights.get("decoder", "as recorded in config.json")
    return ["", "## Deviations", "",
            f"- Weights of the decoder: {decoder}; of the encoder: {weights.get('encoder', 'as recorded')}. The models "
            "and every method run in float32 (the models' dtype); the errors are measured in float64.",
            f"- Data: WikiText-2 **test** windows tokenised by each model's own tokenizer (the unpatched mean NLL over "
            f"the windows is {fmt(float(baseline.loc[baseline['setting'] == WHOLE, 'nll'].mean()))} nats per token in "
            "the whole-window setting), not the papers' corpora (HyperAttention: LongBench at 32k tokens; "
            "StreamingLLM: PG19).",
            f"- Lengths: n = {saved.config['n']} tokens per window; continuation {saved.config['continuation']} "
            f"tokens after a context of {saved.config['context']}; far shorter than the papers' contexts.",
            "- Causal forms: each method runs its own, or its cache policy (causal only); the Nystrom family runs as "
            "`mask-renormalise`, whose landmarks pool every position: a token's output then depends on later "
            "tokens, so its perplexity is not that of a decoder layer (reported apart, in no decoder claim).",
            "- Errors with every layer replaced are measured on the patched run's own inputs, which drift from "
            "the unpatched model's (the drifting error, a secondary measure), and, where `clean_errors.csv` holds "
            "them, on the unpatched model's inputs at each layer (the clean error, the premise's primary measure; "
            "without it the claims on the clean error of those settings are not run); with one layer replaced, the "
            "layer's inputs are the unpatched model's.",
            "- Encoder windows: n word pieces of all-MiniLM-L6-v2's tokenizer, without [CLS]/[SEP] (its sentence "
            "embedding is the mean over tokens of the last hidden state; the cosine is unchanged by its final "
            "normalisation)."]


def _delta_tables(delta, config) -> list[str]:
    lines = ["", "## Change in log-perplexity", "",
             "Mean over the windows whose run succeeded [95% bootstrap interval over those windows], nats per token; "
             "(k of n failed): runs that failed, left out of the mean; `n/a`: not computable (no run succeeded, or "
             "one window left: no interval); every point and its errors in `delta.csv`, every run in "
             f"`{PATCHED}`, every layer in `layer_errors.csv`.", ""]
    shown = delta.assign(cell=delta_cells(delta))
    for setting, layers in settings_of(shown):
        rows = shown[(shown["setting"] == setting) & (shown["layers"] == layers)]
        title = "KV cache (budget d), every layer" if setting == KV_CACHE else f"{layers} replaced"
        table = rows.pivot_table(index="method", columns="num_features", values="cell", aggfunc="first",
                                 fill_value="")
        order = [m for m in [config["control"], *config["methods"]] if m in table.index]
        table = table.loc[order].reset_index()
        table.columns = ["method", *[f"d = {d}" for d in table.columns[1:]]]
        lines += [f"### {title}", "", *markdown_table(table), ""]
    return lines


def _encoder(saved) -> list[str]:
    table = saved.product("encoder_stats.csv")
    table = table.assign(**{"1 - cos [95% CI]": [
        format_interval(e, lo, hi, failed=f, units=w) for e, lo, hi, f, w in
        table[["cosine_distance", "cosine_distance_low", "cosine_distance_high", "failures", "windows"]]
        .itertuples(index=False)]})
    return ["", "## The encoder: all-MiniLM-L6-v2's sentence embedding", "",
            "Every layer replaced; one minus the cosine similarity of the mean-pooled embedding to the exact model's "
            "(median over the windows whose run succeeded [95% bootstrap interval over them], the failed runs "
            "beside) and the relative spectral error (median over layers, heads and windows).", "",
            *markdown_table(table[["method", "num_features", "1 - cos [95% CI]", "spectral_median"]])]


def _cost(saved) -> list[str]:
    cost = saved.table("cost.csv")
    if cost.empty:
        return []
    columns = ["unpatched_seconds", "patched_seconds", "method_seconds", "layer_attention_seconds",
               "overhead_seconds", "ratio"]
    shown = cost[["method", "num_features", *columns]].rename(columns=lambda c: c.replace("_seconds", ""))
    return ["", "## Cost of a patched forward pass", "",
            f"One layer (index {int(cost['layer'].iloc[0])}) patched, {int(cost['tokens'].iloc[0])} tokens; median "
            f"{cost['clock'].iloc[0]} of {int(cost['repeats'].iloc[0])} interleaved repeats "
            "(`approxlab.studies.perplexity.cost.patched_forward_cost`): the unpatched pass, the patched pass, the "
            "method alone on the layer's inputs and exact SDPA attention on them; overhead = patched - (unpatched - "
            "layer attention + method); ratio = patched / (unpatched + method), at most 1 when a patched pass costs "
            f"no more than the unpatched pass plus the method: {int((cost['ratio'] <= 1).sum())} of {len(cost)} "
            "methods.", "", *markdown_table(shown)]


def _papers(delta, config) -> list[str]:
    before, after = HYPERATTENTION_PERPLEXITY
    reported = math.log(after / before)
    hyper = delta[(delta["method"] == "hyperattention") & (delta["layers"] == "all")]
    ours = "; ".join(f"{'KV cache' if setting == KV_CACHE else 'whole windows'}, d = {d}: {cell}"
                     for setting, d, cell in zip(hyper["setting"], hyper["num_features"], delta_cells(hyper))
                     ) or "not run"
    streaming = delta[(delta["method"] == "streaming-llm") & (delta["setting"] == KV_CACHE)]
    kept = "; ".join(f"d = {d}: {cell}" for d, cell in zip(streaming["num_features"], delta_cells(streaming)))
    return ["", "## Against the papers", "",
            f"- HyperAttention (Han et al., ICLR 2024) reports ChatGLM2-6B-32k's perplexity rising from {before} to "
            f"{after} with its final layers replaced at a 32k context: a change in log-perplexity of "
            f"{fmt(reported)} nats per token. Here, every layer replaced (windows of {config['n']} tokens; "
            f"the KV cache: a context of {config['context']}): {ours}.",
            "- StreamingLLM (Xiao et al., ICLR 2024) reports that the first four tokens (attention sinks) kept beside "
            "a window of recent tokens keep a language model's perplexity close to that of recomputing a sliding "
            "window, where the window alone fails; here, the continuation's change in log-perplexity against the "
            f"full cache, with sinks and recent tokens in every layer's cache: {kept or 'not run'}.",
            "- No paper of the methods measured the spectral error of the attention output inside the model it "
            "scores; the claims above are this study's own."]


def sections(saved) -> list[str]:
    """The summary's lines under its title (numbers from the saved tables only)."""
    baseline, delta = saved.table("baseline.csv"), saved.product("delta.csv")
    return [*in_short_lines(saved.product("premise.csv"), saved.product("premise_loss.csv")),
            *_run(saved, delta, baseline), *_deviations(saved, baseline), *premise_sections(saved),
            *claim_sections(saved), *long_lines(saved, saved.product("verdicts.csv")),
            *_delta_tables(delta, saved.config), *_encoder(saved),
            *_cost(saved), *_papers(delta, saved.config)]
