"""The long-context study: a run end to end on a tiny decoder, the shared column sums equal the unshared path, the
accuracy gate's arithmetic and the stratified statistics of the premise claims.

``approxlab long-context --quick`` on the packaged SmolLM2 is measured by hand (its time is in the summary of the
committed run); here a tiny random Llama with the BERT tokenizer runs 256-token sequences.
"""

from __future__ import annotations

import argparse
import math

import pandas as pd
import pytest
import torch
from _helpers import register_broken_policy, tiny_llama
from test_models_qkv import save_tiny_checkpoint

from approxlab.cli import main
from approxlab.errors import UsageError
from approxlab.cache import _column_sums
from approxlab.patching import sweep_policies
from approxlab.stats.binomial import clopper_pearson
from approxlab.studies import engine
from approxlab.studies.long_context import claims

GRID = ["--lengths", "256", "--texts", "2", "--ruler-tasks", "single-needle,multi-key", "--depths", "0.5",
        "--ratios", "0.5,0.95", "--policies", "streaming-llm,snapkv,h2o", "--whole-methods", "topk,quest,performer",
        "--whole-texts", "1", "--no-progress"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_tiny_checkpoint("llama", tmp_path_factory.mktemp("tiny-llama") / "llama", tie_word_embeddings=True,
                                max_position_embeddings=512)


@pytest.fixture(scope="module")
def run(llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("long-context-run")
    cache = tmp_path_factory.mktemp("long-context-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(claims, "RESAMPLES", 100)
        assert main(["long-context", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(out),
                     *GRID]) == 0
    return out, cache


def test_a_run_writes_one_row_per_policy_and_ratio_and_its_report(run, llama, monkeypatch):
    out, cache = run
    results = engine.read_results(out / "results.csv.gz")
    assert len(results) == 2 * 2 * (1 + 3 * 2)  # texts x tasks x (unpatched + policies x ratios)
    assert set(results["status"]) == {"ok"}
    exact = results[results["method"] == "unpatched"]
    assert exact["prefill_seconds"].gt(0).all() and exact["num_features"].isna().all()
    policy = results[results["method"] != "unpatched"]
    kept = (policy["context_length"] * (1 - policy["compression_ratio"])).astype(int).clip(lower=1)
    assert (policy["num_features"] == kept).all()  # kvpress's rounding, the absolute b beside the ratio
    assert policy["clean_spectral_mean"].gt(0).all() and policy["patched_spectral_mean"].gt(0).all()
    for inputs in ("clean", "patched"):  # each layer's largest error over heads is at least its median
        assert policy[f"{inputs}_spectral_worst_head"].ge(policy[f"{inputs}_spectral_mean"]).all()
    assert "clean_worst_head" in pd.read_csv(out / "policies.csv")
    layers = engine.read_results(out / "layers.csv")
    assert len(layers) == len(policy) * 2  # the tiny model's 2 layers
    sharing = engine.read_results(out / "sharing.csv")  # the run measures what sharing the column sums saves
    assert sorted(sharing["shared"]) == [False, True] and (sharing["max_abs_difference"] == 0).all()
    whole = engine.read_results(out / "whole.csv")  # the whole-sequence setting: 1 text x 2 tasks x 3 methods
    assert len(whole) == 2 * 3 and set(whole["status"]) == {"ok"} and set(whole["text"]) == {0}
    assert (whole["num_features"] == (whole["context_length"] * (1 - 0.875)).astype(int)).all()
    assert whole.merge(exact, on=["task", "text", "depth"])["context_length_x"].eq(
        whole.merge(exact, on=["task", "text", "depth"])["context_length_y"]).all()  # the same sequences
    assert len(engine.read_results(out / "whole_layers.csv")) == len(whole) * 2
    table = pd.read_csv(out / "whole_methods.csv")
    assert sorted(table["method"]) == ["performer", "quest", "topk"] and (table["sequences"] == 2).all()
    assert table["clean_worst_head"].ge(table["clean_spectral"]).all()
    for name in ("gate.csv", "gate_depths.csv", "policies.csv", "cost.csv", "verdicts.csv", "whole_methods.csv", "long_context.png",
                 "summary.md"):
        assert (out / name).is_file(), name
    summary = (out / "summary.md").read_text()
    assert summary.index("## In short") < summary.index("## The run") < summary.index("## Cost")
    assert summary.index("## Whole sequence") < summary.index("## Claims")
    verdicts = pd.read_csv(out / "verdicts.csv")
    assert set(verdicts["setting"]) == {"kv-cache", "whole-sequence"}
    gated = verdicts["sequences"] == "gated"  # 2 texts, and no task passes the gate of a random model
    assert set(verdicts.loc[gated, "verdict"]) == {"too few texts"}
    assert set(verdicts.loc[~gated, "verdict"]) == {"described, not judged"}
    # resume computes nothing; --plot-only redraws from the tables alone
    monkeypatch.setattr(engine.runner, "run_steps", _refuse)
    assert main(["long-context", "--out", str(out), "--plot-only", "--no-progress"]) == 0


def test_a_saved_run_extends_into_added_policies_in_cells_of_their_own(run, llama, tmp_path, capsys, monkeypatch):
    """Policies added to a saved run (``--policies`` holding the saved ones and more) run in cells of their own, one
    per sequence and policy (the saved cells stay whole and are not recomputed), a sequence's added policies on one
    prefill, their rows those of each policy added alone; the config records the extension; the report reads them
    with the rest (its tables, the summary's policies and their defaults, the figure's curves); dropping a saved
    policy is still a different configuration."""
    import shutil

    import approxlab.patching.sweep
    import approxlab.plotting

    saved, cache = run
    out, alone = tmp_path / "extended", tmp_path / "one-at-a-time"
    shutil.copytree(saved, out)
    shutil.copytree(saved, alone)
    parts = engine.part_paths(out / "results.csv.gz")  # one file per length
    before = [part.read_bytes() for part in parts]
    assert [part.name for part in parts] == ["results.length=256.csv.gz"]
    grid = _with_policies("streaming-llm,snapkv,h2o,criticalkv,caote")
    prefills = []
    prefill = approxlab.patching.sweep.exact_prefill
    monkeypatch.setattr(approxlab.patching.sweep, "exact_prefill",
                        lambda *a, **k: prefills.append(1) or prefill(*a, **k))
    capsys.readouterr()
    assert main(["long-context", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(out), *grid]) == 0
    assert "extending the saved run (added_policies: none -> ['criticalkv', 'caote'])" in capsys.readouterr().err
    assert len(prefills) == 2 * 2  # one per sequence (texts x tasks), not per sequence and policy
    assert [part.read_bytes() for part in engine.part_paths(out / "results.csv.gz")] == before
    added = engine.read_results(out / "added.csv")
    assert len(added) == 2 * 2 * 2 * 2 and set(added["method"]) == {"criticalkv", "caote"}  # texts x tasks x 2 x 2
    assert (added["method"] == added["policy"]).all() and set(added["status"]) == {"ok"}
    for policies in ("streaming-llm,snapkv,h2o,criticalkv", "streaming-llm,snapkv,h2o,criticalkv,caote"):
        assert main(["long-context", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(alone),
                     *_with_policies(policies)]) == 0
    one_by_one = engine.read_results(alone / "added.csv")
    assert len(prefills) == 2 * 2 * 3  # each policy added alone: a prefill per sequence and policy
    scores = ["correct", "answer_logprob", "delta_all", "delta_key", "clean_spectral_mean", "patched_spectral_mean"]
    pd.testing.assert_frame_equal(added[scores], one_by_one[scores], check_exact=True)  # the same, bit for bit
    record = engine.read_json(out / "config.json")
    assert record["config"]["policies"] == ["streaming-llm", "snapkv", "h2o"]
    assert record["extensions"][-1]["added"] == {"added_policies": ["criticalkv", "caote"]}
    assert {"criticalkv", "caote"} <= set(pd.read_csv(out / "policies.csv")["method"])
    summary = (out / "summary.md").read_text()
    assert "5 cache policies with their defaults" in summary and "criticalkv {" in summary and "caote {" in summary
    figures = []
    monkeypatch.setattr(approxlab.plotting, "save_figure", lambda fig, path: figures.append(fig) or [])
    assert main(["long-context", "--out", str(out), "--plot-only", "--no-progress"]) == 0
    labels = {text.get_text() for ax in figures[0].axes if ax.get_legend() for text in ax.get_legend().get_texts()}
    assert {"CriticalKV", "CAOTE", "StreamingLLM"} <= labels
    dropped = _with_policies("streaming-llm,snapkv,criticalkv")
    assert main(["long-context", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(out),
                 *dropped]) != 0
    assert "different configuration" in capsys.readouterr().err


def test_a_task_at_noise_hides_its_needles_in_rulers_repeated_line(run, llama, tmp_path):
    """``TASK@noise``: its sequences' filler is RULER's noise line repeated (its texts differ only in their draws),
    beside the same task in WikiText-2 in one run; a run of noise tasks alone may ask for more texts than the corpus
    has windows; the summary says what a text is."""
    import importlib

    from approxlab.studies import long_context
    from approxlab.tasks.ruler import NOISE

    long_cells, long_grid = (importlib.import_module(f"approxlab.studies.long_context.{name}") for name in
                             ("cells", "grid"))
    assert long_grid.split_task("multi-key@noise") == ("multi-key", "noise")
    assert long_grid.split_task("multi-key") == ("multi-key", "wikitext")
    _, cache = run
    out = tmp_path / "noise"
    grid = ["--lengths", "256", "--texts", "2", "--ruler-tasks", "single-needle,single-needle@noise", "--depths",
            "0.5", "--ratios", "0.5", "--policies", "streaming-llm", "--whole-texts", "0", "--no-progress"]
    assert main(["long-context", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(out), *grid]) == 0
    config = engine.read_json(out / "config.json")["config"]
    settings = {"cache_dir": str(cache), "data_dir": None, "device": "cpu"}
    found = {(cell["task"], cell["text"]): long_cells.sequence(cell)
             for cell in long_grid.cells({**config, "checkpoint": str(llama)}, settings)}
    tokenizer = long_cells._model(str(llama), str(cache), "cpu").tokenizer
    contexts = {key: tokenizer.decode(one.ids[0, :one.question_start]) for key, one in found.items()}
    for text in (0, 1):  # BERT's tokenizer lower-cases
        assert contexts[("single-needle@noise", text)].count("the grass is green.") > 3
        assert "grass is green" not in contexts[("single-needle", text)]
    assert found[("single-needle@noise", 0)].answer != found[("single-needle@noise", 1)].answer  # two draws
    assert NOISE.startswith("The grass is green.")
    results = engine.read_results(out / "results.csv.gz")
    assert set(results["task"]) == {"single-needle", "single-needle@noise"} and set(results["status"]) == {"ok"}
    assert set(pd.read_csv(out / "gate.csv")["task"]) == {"single-needle", "single-needle@noise"}
    summary = (out / "summary.md").read_text()
    assert "2 distinct texts (disjoint WikiText-2 windows of each length; for a task@noise, one draw" in summary
    assert "Units: texts (disjoint WikiText-2 windows of each length; for a task@noise, one draw" in summary
    assert summary.count("the WikiText-2 window and the noise draw of one index are one text") == 2  # one unit
    many = long_context.build_config(lengths=[256], texts=10_000, ruler_tasks=["multi-key@noise"],
                                     checkpoint=str(llama))
    long_grid.check(argparse.Namespace(cache_dir=str(cache), data_dir=None), many)  # no corpus windows needed
    with pytest.raises(UsageError, match="--texts"):
        long_grid.check(argparse.Namespace(cache_dir=str(cache), data_dir=None),
                        {**many, "ruler_tasks": ["multi-key", "multi-key@noise"]})


def test_a_failing_added_policy_gets_its_failed_rows_and_no_layer_rows(run, llama, tmp_path, capsys, fresh_registry):
    """A policy added to a saved run that raises gets its failed rows (its status, infinite losses) and no per-layer
    rows (it reached no layer); the run goes on and says so in one line."""
    import shutil

    register_broken_policy()
    saved, cache = run
    out = tmp_path / "extended"
    shutil.copytree(saved, out)
    code = main(["long-context", "--checkpoint", str(llama), "--cache-dir", str(cache), "--out", str(out),
                 *_with_policies("streaming-llm,snapkv,h2o,broken-policy")])
    added = engine.read_results(out / "added.csv")
    assert set(added["status"]) == {"FloatingPointError: no scores today"} and len(added) == 2 * 2 * 2
    assert (added["answer_logprob"] == -math.inf).all()
    assert engine.read_results(out / "added_layers.csv").empty
    assert code == 0 and "method 'broken-policy' failed in 8 of its 8 rows of added.csv" in capsys.readouterr().err


def _with_policies(policies: str) -> list:
    grid = list(GRID)
    grid[grid.index("--policies") + 1] = policies
    return grid


def test_the_committed_run_resumes_with_criticalkv_and_caote_added():
    """``figures/long_context`` (15 policies, then CriticalKV and CAOTE added after they were registered, then the
    whole-sequence setting, then the pass key in noise) resumed with its own command: the default policies hold
    both, the config keeps the saved ones and the added ones, and the declared whole-sequence grid; nothing grows (a
    fresh run holds every policy in its own cells)."""
    import json
    import pathlib

    from approxlab.studies import long_context
    from approxlab.studies.engine.record import extension

    folder = pathlib.Path(__file__).resolve().parents[1] / "figures" / "long_context"
    saved = json.loads((folder / "config.json").read_text())["config"]
    tasks = ["single-needle", "multi-key", "single-needle@noise"]  # the documented command's
    config = long_context.build_config(lengths=[2048, 4096, 8192], ruler_tasks=tasks, out=str(folder))
    assert config["policies"] == saved["policies"] and config["added_policies"] == ["criticalkv", "caote"]
    assert saved["added_policies"] == ["criticalkv", "caote"] and len(saved["policies"]) == 15
    assert saved["whole_methods"] == config["whole_methods"] and saved["whole_texts"] == list(range(10))
    assert not extension(saved, config, long_context.STUDY.grows)  # the same configuration: it resumes
    shorter = {**saved, "lengths": [2048, 4096],
               "short_context": {n: saved["short_context"][n] for n in ("2048", "4096")}}
    # the run as it was before 8,192 tokens: extended by the longer length and its truncated context
    assert extension(shorter, config, long_context.STUDY.grows) == ["lengths", "short_context"]
    two_tasks = {**saved, "ruler_tasks": ["single-needle", "multi-key"]}  # before the pass key in noise
    assert extension(two_tasks, config, long_context.STUDY.grows) == ["ruler_tasks"]
    fresh = long_context.build_config(lengths=[2048], ruler_tasks=["single-needle", "multi-key"])
    assert {"criticalkv", "caote"} <= set(fresh["policies"]) and "added_policies" not in fresh


def _refuse(*args, **kwargs):
    raise AssertionError("computation started")


def test_shared_column_sums_equal_the_unshared_path_and_are_computed_once_per_layer(monkeypatch):
    model = tiny_llama(128, 3)
    ids = torch.randint(5, 128, (1, 60), generator=torch.Generator().manual_seed(0))
    computed = []
    original = _column_sums._causal_column_sums

    def counted(*args, **kwargs):
        computed.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(_column_sums, "_causal_column_sums", counted)
    found = {}
    for share in (True, False):
        computed.clear()
        found[share] = sweep_policies(model, ids[:, :48], ids[:, 48:], methods=["h2o", "observed-attention"],
                                      ratios=[0.5, 0.75, 0.9], answer_length=3, short_context=8, share=share)
        found[share] = (found[share], len(computed))
    (shared, once), (unshared, each) = found[True], found[False]
    assert once == 3 and each == 3 * 2 * 3  # per layer, against per layer x policy x ratio
    for a, b in zip(shared[0], unshared[0]):
        assert {k: v for k, v in a.items() if "seconds" not in k} == {k: v for k, v in b.items()
                                                                      if "seconds" not in k}
    assert shared[1] == unshared[1]


def test_the_batched_continuations_equal_the_per_policy_path():
    """``batch=True`` (the policies of a ratio in one batched continuation) against one continuation per policy
    and ratio: every row and layer row the same (float64 tiny Llama: to the last bit here; to rounding in general),
    policies with per-layer budgets, AdaKV's masks, a random draw and a method without a compression step among
    them."""
    model = tiny_llama(128, 3)
    ids = torch.randint(5, 128, (1, 60), generator=torch.Generator().manual_seed(0))
    methods = ["streaming-llm", "h2o", "snapkv", "random", "ada-snapkv", "pyramidkv", "knorm"]
    found = {batch: sweep_policies(model, ids[:, :48], ids[:, 48:], methods=methods, ratios=[0.5, 0.9],
                                   answer_length=3, short_context=8, batch=batch, options={"snapkv": {"window": 4}})
             for batch in (True, False)}
    (rows, layers), (alone, alone_layers) = found[True], found[False]
    assert len(rows) == 1 + len(methods) * 2 and {row["status"] for row in rows} == {"ok"}
    for a, b in zip(rows, alone):
        assert a.keys() == b.keys()
        for key in a:
            if "seconds" not in key and not (isinstance(a[key], float) and math.isnan(a[key])):
                assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-12), (a["method"], key)
    assert len(layers) == len(alone_layers) and all(a == pytest.approx(b) for a, b in zip(layers, alone_layers))
    assert rows[0]["key_token_seconds"] > 0


def test_a_failing_policy_in_a_batch_is_recorded_alone(fresh_registry):
    register_broken_policy()
    model = tiny_llama(128, 2)
    ids = torch.randint(5, 128, (1, 60), generator=torch.Generator().manual_seed(0))
    rows, _ = sweep_policies(model, ids[:, :48], ids[:, 48:], methods=["h2o", "broken-policy", "knorm"],
                             ratios=[0.5], answer_length=3)
    alone, _ = sweep_policies(model, ids[:, :48], ids[:, 48:], methods=["h2o", "knorm"], ratios=[0.5],
                              answer_length=3, batch=False)
    assert [row["status"] for row in rows] == ["ok", "ok", "FloatingPointError: no scores today", "ok"]
    assert rows[1]["answer_logprob"] == alone[1]["answer_logprob"] and rows[3]["delta_all"] == alone[2]["delta_all"]


def _results(correct_by_task: dict) -> pd.DataFrame:
    rows = []
    for task, (correct, count) in correct_by_task.items():
        rows += [{"task": task, "length": 2048, "text": i // 3, "depth": (i % 3) / 2, "method": "unpatched",
                  "correct": i < correct, "status": "ok"} for i in range(count)]
    return pd.DataFrame(rows)


def test_the_gate_needs_a_clopper_pearson_lower_bound_of_80_percent():
    assert clopper_pearson(6, 6)[0] == pytest.approx(0.025 ** (1 / 6))
    assert clopper_pearson(0, 5) == (0.0, pytest.approx(1 - 0.025 ** (1 / 5)))
    table = claims.gate_table(_results({"single-needle": (80, 90), "multi-key": (79, 90)})).set_index("task")
    assert table.loc["single-needle", "passes"] and not table.loc["multi-key", "passes"]
    assert table.loc["single-needle", "cp_low"] == pytest.approx(clopper_pearson(80, 90)[0])
    assert table.loc["multi-key", "texts"] == 30
    with pytest.raises(ValueError, match="`successes` must be an integer in"):
        clopper_pearson(4, 3)


def test_the_gate_is_settled_only_where_the_missing_sequences_cannot_change_it():
    # 90 declared: 80 right pass. 11 wrong settle a failure, 10 wrong do not; 80 right settle a pass.
    partial = _results({"single-needle": (1, 12), "multi-key": (2, 12), "multi-value": (80, 85)})
    partial.loc[(partial["task"] == "multi-key") & (partial["text"] == 0), "correct"] = True  # 3 right, 9 wrong
    table = claims.gate_table(partial, declared=90).set_index("task")
    assert table["declared"].tolist() == [90, 90, 90]
    assert table.loc["single-needle", "settled"] == "fail" and not table.loc["single-needle", "passes"]
    assert table.loc["multi-key", "settled"] == "open"
    assert table.loc["multi-value", "settled"] == "pass"
    whole = claims.gate_table(_results({"single-needle": (80, 90), "multi-key": (79, 90)}), declared=90)
    assert whole.set_index("task")["settled"].to_dict() == {"single-needle": "pass", "multi-key": "fail"}
    assert claims.gate_table(partial)["settled"].tolist() == ["fail", "fail", "pass"]  # declared: what is there


def test_the_exact_models_accuracy_by_depth_pools_to_the_gates():
    """``gate_depths.csv`` (described beside the gate): each depth's count and interval, summing to the gate's."""
    import pathlib

    folder = pathlib.Path(__file__).resolve().parents[1] / "figures" / "long_context-gate-8192"
    results = engine.read_results(folder / "results.csv.gz")
    depths, gate = claims.depth_table(results), claims.gate_table(results)
    pooled = depths.groupby(["task", "length"], sort=False)[["sequences", "correct"]].sum().reset_index()
    pd.testing.assert_frame_equal(pooled, gate[["task", "length", "sequences", "correct"]], check_dtype=False)
    needle = depths[depths["task"] == "single-needle"].set_index("depth")
    assert needle["correct"].to_dict() == {0.1: 0, 0.5: 8, 0.9: 30} and (needle["sequences"] == 30).all()
    assert needle.loc[0.5, "cp_low"] == pytest.approx(clopper_pearson(8, 30)[0])


def _policy_rows(error_of, loss_of) -> pd.DataFrame:
    """A premise frame: 6 texts, 3 ratios, 4 policies; error and loss from the policy index and budget."""
    rows = []
    for text in range(6):
        for b in (8, 16, 32):
            for index, method in enumerate("abcd"):
                rows.append({"text": text, "sequence": f"t/{text}@0.5", "method": method, "num_features": b,
                             "compression_ratio": 1 - b / 64, "clean_spectral_mean": error_of(index, b, text),
                             "delta_logprob": loss_of(index, b, text), "accuracy_loss": 0.0,
                             "delta_key": loss_of(index, b, text)})
    return pd.DataFrame(rows)


def test_the_stratified_rho_ranks_within_each_sequence_and_ratio():
    # the text shifts every loss (its difficulty): pooled ranks would mix texts, stratified ranks do not
    frame = _policy_rows(lambda i, b, t: i / b, lambda i, b, t: 10.0 * t + i)
    sums = claims.stratum_sums(frame, "logprob")
    assert all(count == 3 for _, count in sums.values())  # one stratum per ratio
    assert sum(s for s, _ in sums.values()) / sum(c for _, c in sums.values()) == pytest.approx(1.0)
    assert claims.stratum_sums(frame, "acc") == {}  # a loss the same for every policy ranks nothing
    # within a policy: an error that only tracks 1/b ranks the budgets no better than the budget itself
    within = claims.stratum_sums(_policy_rows(lambda i, b, t: (i + 1) / b, lambda i, b, t: 1 / b + i), "budget")
    assert sum(s for s, _ in within.values()) == 0.0
    assert not math.isnan(sum(c for _, c in within.values()))


def _gated_rows(worst_head=None) -> pd.DataFrame:
    """Two tasks x 6 texts x 3 depths; 4 policies at 3 budgets whose error (``(index + 1) / b``) ranks the log-prob
    loss but in ``text`` of each text's 9 strata (c and d swapped); the exact model misses multi-key's text 0 at
    depth 0.1. ``worst_head(index, b, text)``: the rows' ``clean_spectral_worst_head``."""
    rows = []
    for task, wrong in (("single-needle", None), ("multi-key", 0)):
        for text in range(6):
            for d, depth in enumerate((0.1, 0.5, 0.9)):
                rows.append({"task": task, "length": 2048, "text": text, "depth": depth, "method": "unpatched",
                             "correct": not (text == wrong and depth == 0.1), "status": "ok"})
                for e, b in enumerate((8, 16, 32)):
                    for index, method in enumerate("abcd"):
                        loss = index if not (3 * d + e < text and index >= 2) else 5 - index  # swap c and d
                        rows.append({"task": task, "length": 2048, "text": text, "depth": depth, "method": method,
                                     "num_features": b, "compression_ratio": 1 - b / 64, "correct": False,
                                     "status": "ok", "clean_spectral_mean": (index + 1) / b,
                                     "delta_logprob": loss + 10.0 * text, "delta_key": math.nan,
                                     **({} if worst_head is None else
                                        {"clean_spectral_worst_head": worst_head(index, b, text)})})
    return pd.DataFrame(rows)


def test_a_gated_task_whose_error_ranks_the_losses_gets_a_verdict_and_a_failed_task_stays_out():
    """18 of 18 exact answers pass the gate (lower bound 0.815), 17 of 18 do not (0.727); across 4 policies the
    error ranks the log-prob loss but in ``text`` of each text's 9 strata (c and d swapped, rho 0.8): the claim
    holds, on the calibrated interval."""
    table = claims.verdicts(_gated_rows()).set_index(["sequences", "claim"])
    assert table.loc[("gated", "logprob"), "tasks"] == "single-needle"  # multi-key fails the gate: left out
    assert table.loc[("gated", "logprob"), "texts"] == 6 and table.loc[("gated", "logprob"), "strata"] == 6 * 3 * 3
    assert table.loc[("gated", "logprob"), "estimate"] == pytest.approx(1 - 0.2 * 15 / 54)
    assert table.loc[("gated", "logprob"), "verdict"] == "holds"
    assert table.loc[("gated", "key"), "verdict"] == "too few texts"  # no key tokens: no stratum
    assert table.loc[("all", "logprob"), "tasks"] == "multi-key,single-needle"
    assert table.loc[("all", "logprob"), "verdict"] == "described, not judged"


def test_the_worst_heads_error_is_judged_beside_the_median_heads_on_the_same_sequences():
    """Policy a is exact in most heads (its median head's error the smallest) but its worst head is the worst of
    all: under the worst head the claim fails where the declared median head holds, and the summary says the
    verdict changes with the statistic. A sequence that does not record the worst head is left out whole; rows
    without it give no worst-head rows."""
    from approxlab.studies.long_context.report import _worst_head_notes

    assert set(claims.verdicts(_gated_rows())["sequences"]) == {"gated", "all"}
    frame = _gated_rows(lambda index, b, text: 10.0 - index)  # reverses the median head's ranking
    frame.loc[(frame["text"] == 5) & (frame["depth"] == 0.9) & (frame["method"] == "b"),
              "clean_spectral_worst_head"] = math.nan  # computed before the worst head was recorded
    table = claims.verdicts(frame).set_index(["sequences", "claim"])
    assert table.loc[("gated", "logprob"), "verdict"] == "holds"
    worst = table.loc[("gated, worst head", "logprob")]
    assert worst["strata"] == 6 * 3 * 3 - 3 and worst["estimate"] == pytest.approx(-1 + 0.2 * 15 / 51)
    assert worst["verdict"] == "fails" and worst["median_head_verdict"] == "holds"
    assert worst["median_head_estimate"] == pytest.approx(1 - 0.2 * 15 / 51)  # the same 51 strata
    every = claims.verdicts(_gated_rows(lambda index, b, text: 10.0 - index)).set_index(["sequences", "claim"])
    both = every.loc[("gated, worst head", "logprob")], every.loc[("gated", "logprob")]
    assert both[0]["strata"] == both[1]["strata"] == 6 * 3 * 3  # every sequence records it: the declared row's own
    assert (both[0]["median_head_estimate"], both[0]["median_head_verdict"]) == (both[1]["estimate"], "holds")
    notes = " ".join(_worst_head_notes(table.reset_index()))
    assert "kv-cache logprob at 2048 tokens" in notes and "the verdict changes with the statistic" in notes
    assert "recorded by no gated sequence" in _worst_head_notes(claims.verdicts(_gated_rows()))[0]


def test_the_whole_sequence_table_reads_only_the_sequences_every_method_ran_on():
    """A stopped run's last sequence holds some methods only: it is left out of ``whole_methods.csv`` and of the
    claims, so that every method is read on the same sequences."""
    from approxlab.studies.long_context.whole import complete_sequences

    rows = [{"task": "single-needle", "length": 2048, "text": text, "depth": 0.5, "method": method,
             "compression_ratio": 0.875} for text, methods in ((0, ("topk", "quest")), (1, ("topk",)))
            for method in methods]
    kept = complete_sequences(pd.DataFrame(rows), {"whole_methods": ["topk", "quest"], "whole_ratios": [0.875]})
    assert sorted(kept["text"]) == [0, 0] and sorted(kept["method"]) == ["quest", "topk"]


def test_the_summary_says_where_a_length_is_not_complete_and_which_policies_it_lacks():
    """A run stopped in its second length: the summary says how many of the declared sequences that length holds,
    how many texts whole, and which policies (an added one, whose cells come last) have rows on fewer of them; a
    complete length gets no line."""
    import types

    from approxlab.studies.long_context.report import _coverage_notes

    def rows(length, texts, methods):
        return pd.DataFrame([{"length": length, "task": "single-needle", "text": text, "depth": depth,
                              "method": method, "policy": method}
                             for text in range(texts) for depth in (0.1, 0.9)
                             for method in methods for _ in ((0,) if method == "unpatched" else (0.5, 0.9))])

    config = {"lengths": [256, 512], "ruler_tasks": ["single-needle"], "depths": [0.1, 0.9], "texts": 3,
              "ratios": [0.5, 0.9], "policies": ["h2o", "snapkv"], "added_policies": ["caote"]}
    results = pd.concat([rows(256, 3, ["unpatched", "h2o", "snapkv"]), rows(512, 2, ["unpatched", "h2o", "snapkv"])])
    tables = {"results.csv.gz": results.drop(columns="policy"), "added.csv": rows(256, 3, ["caote"])}
    saved = types.SimpleNamespace(config=config, table=tables.get)
    assert _coverage_notes(saved) == [
        "Not complete at 512 tokens: 4 of the 6 declared sequences (2 of 3 texts whole); the same command resumes the "
        "run.",
        "Policies on fewer sequences at 512 tokens: caote on 0 of the 4 (added after those were computed), so the "
        "claims there rank the policies each sequence has; the same command adds their cells."]
    tables["results.csv.gz"] = results[results["length"] == 256].drop(columns="policy")
    config["lengths"] = [256]
    assert _coverage_notes(saved) == []


def test_a_policy_on_fewer_sequences_than_its_panel_says_so_in_its_label():
    """A policy added to a stopped run stands on fewer sequences than the panel's title counts; its label says how
    many, and a policy on all of them keeps its plain label."""
    from approxlab.plotting import method_style
    from approxlab.studies.long_context.report import _partial_style

    curve = pd.DataFrame({"compression_ratio": [0.5, 0.75], "sequences": [121, 121]})
    assert _partial_style("criticalkv", curve, 180)["label"] == f"{method_style('criticalkv')['label']} (121 seq.)"
    assert _partial_style("criticalkv", curve, 121) == method_style("criticalkv")
