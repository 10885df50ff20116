"""What ``table.md`` says of the run's settings: the tasks (and the proxies standing in for LRA's data)
and every setting of Skyformer's Table 3 run, kept or changed."""

from __future__ import annotations

import functools

import pandas as pd
import torch

from ..reporting.markdown import markdown_table
from .stats import PAPER_COLUMN, proxy

__all__ = ["PROXY_NOTES", "task_label", "proxy_lines", "settings_lines"]

PROXY_NOTES = {
    "text": {
        "lra": "IMDb reviews, positive or negative, from their UTF-8 bytes (LRA: 1,000-4,000 bytes; Skyformer's "
               "code: 4,000)",
        "labels": "which of the {classes} longest WikiText-2 articles the window comes from ({classes} balanced "
                  "classes, chance {chance}); the article's title is left out of its bytes",
        "why": "a document-level label read from raw bytes, with the evidence (topic words and names there, "
               "sentiment words in IMDb) spread over the whole window and no single position deciding",
    },
    "retrieval": {
        "lra": "ACL Anthology Network citation links: does one paper cite the other, from both papers' bytes "
               "(4,000 each), each encoded on its own (two towers)",
        "labels": "1 when both windows come from one article, 0 when from two ({classes} balanced classes, chance "
                  "{chance}); training pairs from 48 articles, none of the 12 held out",
        "why": "the relatedness of two byte documents judged through one pooled vector per document, with LRA's "
               "two-tower model (the same encoder on each window, the head on [u, v, u * v, u - v])",
    },
    "image": {
        "lra": "CIFAR-10 photographs in 8-bit grey, 32 x 32 = 1,024 pixel tokens, 10 classes",
        "labels": "the digit ({classes} classes, chance {chance}), from scikit-learn's 1,797 handwritten digits "
                  "(8 x 8, 17 grey levels) upsampled bilinearly to {side} x {side}, grey levels mapped to 0-255",
        "why": "real images seen only as a flat, row-major sequence of 8-bit grey pixels, 10-way, so the 2-D "
               "structure has to be found through attention",
    },
}
"""Per proxy task: LRA's task it stands in for, its labels and why it stands in (the task modules of
:mod:`approxlab.tasks` say more); ``{classes}``, ``{chance}``, ``{side}`` are read from a built task."""


def task_label(task: str, n: int) -> str:
    """A column's name: Table 3's (``"Text (n=256)"``), or the task's own where Table 3 has none."""
    return {**PAPER_COLUMN, "wikitext-mlm": "WikiText-2 MLM"}.get(task, task) + f" (n={n})"


@functools.lru_cache(maxsize=8)
def _facts(task: str, n: int) -> dict:
    """What a built batch of ``task`` at ``n`` says of itself: its shape, classes and proxy."""
    from ...tasks import make_task

    built = make_task(task, n=n, batch_size=2, num_batches=1, generator=torch.Generator().manual_seed(0))
    return {"shape": tuple(built.batches[0].input_ids.shape[1:]), "classes": built.num_classes,
            "kind": built.kind, "proxy": built.proxy, "side": built.info.get("side")}


def proxy_lines(config: dict) -> list[str]:
    """The section of ``table.md`` naming every proxy: LRA's task, the data set standing in, sequence length,
    labels and why it stands in."""
    entries = [t for t in config["tasks"] if t["task"] in PROXY_NOTES]
    if not entries:
        return []
    rows = []
    for entry in entries:
        facts, notes = _facts(entry["task"], entry["n"]), PROXY_NOTES[entry["task"]]
        shape = " x ".join(map(str, facts["shape"]))
        length = f"{entry['n']} tokens" + (f" per document, two documents ({shape})" if len(facts["shape"]) > 1 else "")
        words = {"classes": facts["classes"], "chance": f"{1 / facts['classes']:.2g}", "side": facts["side"]}
        rows.append([PAPER_COLUMN[entry["task"]], f"`{entry['task']}`", f"`{facts['proxy']}`", notes["lra"], length,
                     notes["labels"].format(**words), notes["why"]])
    columns = ["Table 3 column", "task", "proxy", "LRA's task", "sequence length here", "labels", "why it stands in"]
    return ["## The proxies: Table 3's columns whose data cannot be had offline", "",
            "LRA's IMDb, AAN and CIFAR-10 are not shipped with any installed package and cannot be downloaded here, so "
            "each column runs on a declared proxy built from data that ship with approxlab or scikit-learn "
            "(`approxlab.tasks`). The `task` column of every table keeps LRA's name; the `proxy` column of "
            "`ratios.csv` and `intervals.csv` names the data set. Vocabulary 256 (bytes, or 8-bit grey levels), no "
            "padding, training split only.", "",
            *markdown_table(pd.DataFrame(rows, columns=columns), default=str, empty=None), ""]


def settings_lines(config: dict) -> list[str]:
    """Every setting of Skyformer's Table 3 run, kept or changed here."""
    from ...optim import SKYFORMER_LRA

    tasks = {t["task"]: t for t in config["tasks"]}
    settings = []

    def row(name, paper, here):
        settings.append([name, paper, here, "kept" if str(paper) == str(here) else "changed"])

    for task, label in PAPER_COLUMN.items():
        paper, ours = SKYFORMER_LRA[task], tasks.get(task)
        if ours is None:
            row(f"{label} task", "in Table 3", "not run")
            continue
        data = "generated as LRA generates it" if proxy(task) == "none" else f"proxy `{proxy(task)}`"
        row(f"{label} data", "LRA's", data)
        row(f"{label} sequence length", paper["n"], ours["n"])
        row(f"{label} batch", paper["batch_size"], ours["batch_size"])
        row(f"{label} peak learning rate", f"{paper['lr']:g}", f"{ours['lr']:g}")
        row(f"{label} warm-up / schedule length", f"{paper['warmup']} / {paper['total_steps']}",
            f"{ours['warmup']} / {ours['total_steps']}")
    row("optimiser", "adamw", config.get("optimizer", "adam"))
    row("gradient value clipping", "1", "none" if config.get("clip_value") is None else f"{config['clip_value']:g}")
    row("dropout", "0.1", f"{config.get('dropout', 0.0):g}")
    row("attention dropout (on softmax's matrix)", "0.1", "0 (no attention here forms the n x n matrix to drop)")
    row("steps scored", 20, config["steps"])
    row("num_features (landmarks, features)", 128, config["num_features"])
    row("precision", "mixed (fp16 autocast, GPU)", config["dtype"])
    table = pd.DataFrame(settings, columns=["setting", "paper (Skyformer's LRA code)", "here", ""])
    lines = ["## Settings: the paper's, kept or changed", "", *markdown_table(table, default=str, empty=None)]
    lines += ["", "- Pathfinder images come from our own generator (`approxlab.tasks.pathfinder`: 3 dashed paths, "
              "no anti-aliasing), not LRA's Pathfinder-32 files; ListOps from LRA's generator rules "
              "(`approxlab.tasks.listops`).",
              "- Text, Retrieval and Image run on the proxies above, with the model, optimiser, steps and "
              "num_features of ListOps and Pathfinder and their own LRA task's learning rate and warm-up "
              "(Skyformer's `config.py`); "
              "Retrieval keeps LRA's two-tower model (`TinyEncoder(kind=\"pair-classification\")`), whose f is "
              "the embedding of both documents.",
              "- WikiText-2 masked LM is not a Table 3 task; it is available with `--tasks wikitext-mlm:512:2` and "
              "not in the default grid.",
              "- Sequence lengths and batches are cut so that the CPU budget buys seeds (see the power analysis); "
              f"an approximation with {config['num_features']} landmarks is closer to exact at the shorter lengths "
              "than at LRA's.",
              "- With the paper's schedule the scored steps lie at the start of the warm-up (the rate rises "
              "from lr/25), as in a Table 3 run at the start of training.", ""]
    return lines
