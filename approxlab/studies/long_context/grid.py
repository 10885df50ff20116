"""The long-context study's grid, declared before any run: lengths, texts, depths, tasks, ratios and policies.

A cell is one sequence: a RULER-style task (:func:`approxlab.tasks.ruler.ruler_sequence`) at one length, built on
one WikiText-2 window (the text: windows of that length are disjoint, so texts are distinct) with its asked needle
at one depth. A task named ``TASK@noise`` (:data:`TASKS`) hides its needles in RULER's noise haystack instead, the
same filler in every sequence, where a "text" is one draw of the keys, values and other needles' depths
(:func:`split_task`). The cell runs one exact prefill and every policy at every compression ratio on it
(:func:`approxlab.patching.sweep_policies`).

Public API::

    FULL_GRID, QUICK_GRID, OPTIONS, KEY, SHORT_CONTEXT, cache_policies() -> list, policy_defaults(name) -> dict
    configure(args) -> dict, build_config(*, quick=False, **values) -> dict, cells(config, settings) -> list
    added_cells(config, settings) -> list                 # the policies added to a saved run, one cell each
    whole_cells(config, settings) -> list                 # the whole-sequence setting: sequence x method x ratio
    check(args, config), run_policies(config) -> list, run_info(args, config) -> dict
    TASKS, split_task(name) -> (task, haystack)            # "multi-key@noise" -> ("multi-key", "noise")
"""

from __future__ import annotations

import argparse
import inspect

from ...errors import UsageError
from ...tasks.ruler import RULER_TASKS
from .. import options as shared
from ..declaration import Option

__all__ = ["FULL_GRID", "QUICK_GRID", "OPTIONS", "KEY", "ADDED_KEY", "SHORT_CONTEXT", "cache_policies",
           "policy_defaults", "depth_list", "configure", "build_config", "cells", "added_cells", "whole_cells",
           "WHOLE_KEY", "check", "run_policies", "run_info", "TASKS", "split_task"]

KEY = ("task", "length", "text", "depth")
"""A cell: one sequence."""
ADDED_KEY = (*KEY, "policy")
"""A cell of a policy added to a saved run: one sequence and that policy (:func:`added_cells`)."""
WHOLE_KEY = (*KEY, "method", "compression_ratio")
"""A cell of the whole-sequence setting: one sequence, one method, one budget (:func:`whole_cells`)."""

SHORT_CONTEXT = {2048: 256, 4096: 512, 8192: 1024}
r"""LongPPL's truncated context :math:`s` per length, declared before the run: an eighth of the sequence, the ratio
of the paper's 4,096 of 32k tokens (other lengths: ``length // 8``). A continuation token is *key* when its NLL
with only the last :math:`s` context tokens exceeds that with the full context by more than 2 nats and its
log-probability with the full context exceeds -2 (the paper's :math:`\alpha = 2`, :math:`\beta = -2`)."""


def cache_policies() -> list[str]:
    """Every registered method with a compression step (a cache policy), in registry order."""
    from ...methods import available, get

    return [name for name in available() if get(name).compress is not None]


def policy_defaults(name: str) -> dict:
    """The keyword defaults of a policy's compression step (its sink count, window, recent share), as it runs
    in this study: ``{"sinks": 4}`` for ``streaming-llm``."""
    from ...methods import get

    spec = get(name)
    step = spec.score if spec.score is not None else spec.compress
    skip = {"q", "k", "v", "budget", "generator", "key_mask"}
    return {key: parameter.default for key, parameter in inspect.signature(step).parameters.items()
            if key not in skip and parameter.default is not inspect.Parameter.empty}


depth_list = shared.number_list("fractions of the haystack in [0, 1]", lambda value: 0 <= value <= 1)
"""``--depths``: comma-separated fractions of the haystack in ``[0, 1]`` (argparse ``type=``)."""


TASKS = (*RULER_TASKS, *(f"{task}@noise" for task in RULER_TASKS))
"""The study's tasks: each RULER-style task of :data:`~approxlab.tasks.ruler.RULER_TASKS` in WikiText-2 (its plain
name), or in RULER's noise haystack (``TASK@noise``: :func:`~approxlab.tasks.ruler.noise_haystack`, the haystack of
RULER's own pass-key and variable-tracking tasks)."""


def split_task(name: str) -> tuple[str, str]:
    """``(task, haystack)`` of a study task: ``"multi-key@noise"`` -> ``("multi-key", "noise")``, ``"multi-key"`` ->
    ``("multi-key", "wikitext")`` (:data:`~approxlab.tasks.ruler.HAYSTACKS`)."""
    task, _, haystack = name.partition("@")
    return task, haystack or "wikitext"


FULL_GRID = {"lengths": [2048, 4096, 8192], "texts": 30,
             "ruler_tasks": [task for task in RULER_TASKS if task != "single-needle-uuid"],
             "depths": [0.1, 0.5, 0.9], "ratios": [0.5, 0.75, 0.875, 0.95], "policies": None, "whole_methods": None,
             "whole_ratios": [0.875], "whole_texts": 10}
"""The declared grid: 3 lengths, the 5 tasks of the design (RULER's single needle, multi-key, multi-value,
multi-query and variable tracking, in WikiText-2; not the UUID needle), 30 distinct texts x 3 depths per task and
length, 4 compression ratios (0.95 keeps 5% of the context), every cache policy of the registry (``None``:
:func:`cache_policies` when the run is configured). The whole-sequence setting, at the shortest length only (a
method there runs the model over the whole sequence, 12 forward passes per sequence where every policy shares
one): its first 10 texts, every decoder-valid method that is not a cache policy (``None``:
:func:`~approxlab.studies.inputs.long_methods.long_methods` but the simulations), at ratio 0.875 (the budget d of
the 1/8 of the context a policy keeps there)."""

QUICK_GRID = {"lengths": [512], "ruler_tasks": ["single-needle", "multi-key"], "texts": 2, "depths": [0.5],
              "ratios": [0.5, 0.95], "policies": ["streaming-llm", "snapkv", "h2o"], "whole_methods": ["topk", "quest"],
              "whole_ratios": [0.875], "whole_texts": 1}
"""``--quick``: 512 tokens, 2 tasks x 2 texts x 1 depth, 2 ratios, 3 policies; top-k and Quest over the whole
sequence on the first text (a smoke run of every code path)."""

OPTIONS = (
    Option(("--lengths",), "lengths", "sequence lengths in tokens, comma-separated", type=shared.int_list, nargs="+",
           action=shared.Flatten, metavar="N"),
    Option(("--ruler-tasks",), "ruler_tasks", f"RULER-style tasks, comma-separated, among {', '.join(RULER_TASKS)} "
           "(in WikiText-2), each also as TASK@noise (in RULER's noise haystack)",
           type=shared.names_among(TASKS, "tasks"), nargs="+", action=shared.Flatten, metavar="TASKS"),
    Option(("--texts",), "texts", "distinct WikiText-2 windows (texts) per task and length (for a task on the noise "
           "haystack, draws of its keys and values)", type=shared.positive_int, metavar="COUNT"),
    Option(("--depths",), "depths", "depths of the asked needle, fractions of the haystack in [0, 1], "
           "comma-separated", type=depth_list, nargs="+", action=shared.Flatten, metavar="D"),
    Option(("--ratios",), "ratios", "compression ratios (kvpress's: the fraction of the context removed, in [0, 1)), "
           "comma-separated; each keeps max(1, int(n_c (1 - r))) context tokens", type=shared.ratio_list, nargs="+",
           action=shared.Flatten, metavar="R"),
    shared.METHODS.but(flags=("--policies",), dest="policies", help="cache policies, comma-separated (default: every "
                       "registered method with a compression step)"),
    shared.METHODS.but(flags=("--whole-methods",), dest="whole_methods", help="methods of the whole-sequence "
                       "setting, comma-separated: decoder-valid methods without a compression step (default: all of "
                       "them but the simulations magicpig, vattention)"),
    Option(("--whole-ratios",), "whole_ratios", "compression ratios of the whole-sequence setting, comma-separated "
           "(its budget d: the context tokens a policy keeps at that ratio)", type=shared.ratio_list, nargs="+",
           action=shared.Flatten, metavar="R"),
    Option(("--whole-texts",), "whole_texts", "texts of the whole-sequence setting (the first COUNT, at the "
           "shortest length; 0: none)", type=shared.nonnegative_int, metavar="COUNT"),
    shared.CHECKPOINT.but(help="the model: a Hub id (with network), a local folder or a .gguf file, with its "
                          "tokenizer (default: the packaged SmolLM2-135M-Instruct)"),
)
"""The options of ``approxlab long-context`` besides the common ones."""


def configure(args) -> dict:
    """The grid (saved and hashed in ``config.json``) of the parsed options."""
    grid = shared.grid(QUICK_GRID if getattr(args, "quick", False) else FULL_GRID, args, OPTIONS)
    grid["lengths"] = sorted(int(n) for n in grid["lengths"])
    if grid["policies"] is None:
        grid["policies"] = cache_policies()
    from ...data import SMOLLM2_CHECKPOINT
    from ...methods import get

    for name in grid["policies"]:
        if get(name).compress is None:
            raise UsageError("--policies", f"cache policies (methods with a compression step: "
                                           f"{', '.join(cache_policies())})", repr(name))
    if min(grid["lengths"]) < 256:
        raise UsageError("--lengths", "lengths of at least 256 tokens (the needles, question and a haystack)",
                         min(grid["lengths"]))
    if grid["whole_methods"] is None:
        grid["whole_methods"] = _whole_methods()
    for name in grid["whole_methods"]:
        if name not in _whole_methods(list(grid["whole_methods"])):
            allowed = f"decoder-valid methods without a compression step ({', '.join(_whole_methods())}, ...)"
            raise UsageError("--whole-methods", allowed, repr(name))
    if getattr(args, "whole_texts", None) is None:  # the declared count, within the run's texts
        grid["whole_texts"] = min(grid["whole_texts"], grid["texts"])
    elif grid["whole_texts"] > grid["texts"]:
        raise UsageError("--whole-texts", f"at most --texts ({grid['texts']})", grid["whole_texts"])
    grid["whole_texts"] = list(range(grid["whole_texts"]))  # a list, so that a saved run grows by more texts
    grid.update(_split_policies(grid["policies"], args))
    return {"study": "long-context", **grid, "short_context": {str(n): SHORT_CONTEXT.get(n, n // 8)
                                                               for n in grid["lengths"]},
            "checkpoint": getattr(args, "checkpoint", None) or SMOLLM2_CHECKPOINT, "base_seed": int(getattr(args, "base_seed", 0) or 0)}


def _whole_methods(methods=None) -> list:
    """The whole-sequence methods among ``methods`` (default: the registry's, simulations left out)."""
    from ...methods import get
    from ..inputs.long_methods import long_methods

    if methods is not None:
        return [m for m in methods if get(m).causal in (True, "only") and get(m).compress is None]
    return long_methods(policies=False)


def _split_policies(policies: list, args) -> dict:
    """``{"policies": ...}``, or where ``--out`` holds a saved run whose policies the requested ones only add to,
    ``{"policies": its policies, "added_policies": the ones added since, in order}``: a cell computes every policy of
    ``policies`` on one shared prefill, so a saved run's cells stay whole and each added policy gets cells of its own
    (:func:`added_cells`); the config then only grows (``added_policies``), and the saved run resumes. A requested
    list that drops a saved policy is left as asked (a different configuration: refused, or ``--restart``)."""
    import pathlib

    from ..engine.store import read_json

    out = getattr(args, "out", None)
    if out is None or getattr(args, "restart", False):
        return {"policies": policies}
    try:
        saved = read_json(pathlib.Path(out) / "config.json").get("config", {})
    except (OSError, ValueError):
        return {"policies": policies}
    first, added = list(saved.get("policies") or []), list(saved.get("added_policies") or [])
    if not first or not set(first + added) <= set(policies):
        return {"policies": policies}
    added += [name for name in policies if name not in first and name not in added]
    return {"policies": first, **({"added_policies": added} if added else {})}


def build_config(*, quick: bool = False, **values) -> dict:
    """:func:`configure` from keyword values (``build_config(lengths=[1024], texts=3)``), for code and tests."""
    return configure(argparse.Namespace(quick=quick, **values))


def cells(config: dict, settings: dict) -> list[dict]:
    """One cell per (length, text, task, depth), text by text: a run stopped early holds whole texts of every
    task and depth at the shorter lengths."""
    common = {"ratios": tuple(config["ratios"]), "policies": tuple(config["policies"]),
              "checkpoint": config["checkpoint"], "base_seed": config["base_seed"], **settings}
    return [{"task": task, "length": length, "text": text, "depth": depth,
             "short_context": config["short_context"][str(length)], **common}
            for length in config["lengths"] for text in range(config["texts"]) for task in config["ruler_tasks"]
            for depth in config["depths"]]


def cell_cost(cell: dict) -> float:
    """A cell's expected time relative to its step's others, for the progress log: its sequence's tokens (measured
    on 2 workers, a sequence with every policy took 112, 222 and 416 s at 2,048, 4,096 and 8,192 tokens: nearly
    proportional)."""
    return float(cell["length"])


def added_cells(config: dict, settings: dict) -> list[dict]:
    """One cell per sequence of :func:`cells` and policy of ``added_policies`` (the policies added to a saved run):
    that policy at every ratio, the same seeds as in a run that held it from the start (a sequence's added policies
    share one exact prefill recomputed for them, :func:`.cells.compute_added`)."""
    return [{**cell, "policy": name, "policies": (name,)} for cell in cells(config, settings)
            for name in config.get("added_policies", [])]


def whole_cells(config: dict, settings: dict) -> list[dict]:
    """The whole-sequence setting: per sequence of :func:`cells` at the shortest length whose text is among
    ``whole_texts``, one cell per method of ``whole_methods`` and ratio of ``whole_ratios`` (sequence by
    sequence: the cells of one sequence share its reference, :func:`.cells.compute_whole`)."""
    texts, shortest = set(config.get("whole_texts", ())), min(config["lengths"])
    return [{**cell, "method": method, "compression_ratio": float(ratio)}
            for cell in cells(config, settings) if cell["length"] == shortest and cell["text"] in texts
            for method in config.get("whole_methods", ()) for ratio in config.get("whole_ratios", ())]


def check(args, config: dict) -> None:
    """Against the model and the corpus: every length within the model's positions, and ``--texts`` windows of the
    longest length in WikiText-2 (where a task's haystack is WikiText-2)."""
    from ...data import CheckpointError, corpus_window_count, describe_model

    checkpoint = config["checkpoint"]
    try:
        info = describe_model("pretrained", checkpoint=checkpoint, cache_dir=args.cache_dir)
    except CheckpointError as error:
        raise UsageError("--checkpoint", error.allowed, error.got) from None
    longest = max(config["lengths"])
    if longest > info.max_positions:
        raise UsageError("--lengths", f"at most the model's context, {info.max_positions} tokens", longest)
    if all(split_task(task)[1] != "wikitext" for task in config["ruler_tasks"]):
        return
    count = corpus_window_count("pretrained", longest, checkpoint=checkpoint, data_dir=args.data_dir,
                                cache_dir=args.cache_dir)
    if count < config["texts"]:
        raise UsageError("--texts", f"at most the corpus's {count} windows of {longest} tokens", config["texts"])


def run_policies(config: dict) -> list[str]:
    """Every cache policy of a run: those its cells hold, then those added to it (``added_policies``)."""
    return [*config["policies"], *config.get("added_policies", [])]


def run_info(args, config: dict) -> dict:
    """What ``config.json`` records beside the command: each policy's defaults (sinks, window, recent share)."""
    return {"policy_defaults": {name: {k: repr(v) for k, v in policy_defaults(name).items()}
                                for name in run_policies(config)}}
