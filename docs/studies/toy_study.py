"""A study in one file: how the error of landmark approximations falls with the number of landmarks.

The example of "Writing a study": import it with ``--plugin`` and it runs as ``approxlab landmarks``,
resumable, in-process or on Dask, with a table, a figure and a summary whose claim gets a verdict::

    PYTHONPATH=docs/studies approxlab landmarks --quick --plugin toy_study

Each cell draws synthetic Q/K/V of one length and seed, runs one method at every d of the grid and
returns rows for two tables: the error per d, and the size of the exact output it is measured against.
The claim -- the error at the largest d is at most half of that at the smallest -- is judged per method
from a bootstrap interval over the seeds.
"""

from __future__ import annotations

import argparse

import pandas as pd
import torch

import approxlab
from approxlab.metrics import spectral_norm
from approxlab.studies import Claim, Figure, Product, Step, Study, Summary, Table, cell_seed, register
from approxlab.studies.options import METHODS, N, NUM_FEATURES, SEEDS, grid
from approxlab.studies.reporting import claims, markdown_table
from approxlab.synthetic import synthetic_qkv

# ------------------------------------------------------------------------------ the grid

FULL_GRID = {"methods": ["nystromformer", "skyformer-softmax"], "n": [64, 128], "num_features": [4, 8, 16, 32],
             "seeds": 8}
QUICK_GRID = {**FULL_GRID, "n": [32], "num_features": [4, 16], "seeds": 3}


def configure(args) -> dict:
    """The config (hashed in config.json): the grid with the options given, checked as the CLI checks them."""
    chosen = grid(QUICK_GRID if args.quick else FULL_GRID, args, ("methods", "n", "num_features", "seeds"))
    return {"study": "landmarks", **chosen, "heads": 2, "head_dim": 8, "base_seed": 0}


def build_cells(config: dict, settings: dict) -> list[dict]:
    """One cell per (n, method, seed); it runs every d (its rows carry num_features). A seed draws the Q/K/V."""
    shared = {key: config[key] for key in ("num_features", "heads", "head_dim", "base_seed")}
    return [{"n": n, "method": method, "seed": seed, **shared}
            for n in config["n"] for method in config["methods"] for seed in range(config["seeds"])]


# ------------------------------------------------------------------------------ one cell


def compute(cell: dict) -> dict:
    """Rows of one cell for both tables; its randomness comes from the cell, never from run order."""
    generator = torch.Generator().manual_seed(cell_seed(cell["n"], cell["seed"], base_seed=cell["base_seed"]))
    q, k, v = synthetic_qkv((cell["heads"],), cell["n"], cell["head_dim"], generator=generator,
                            dtype=torch.float64)
    exact = approxlab.exact_attention(q, k, v)
    norm = spectral_norm(exact)
    errors = []
    for d in cell["num_features"]:
        draw = torch.Generator().manual_seed(cell_seed(cell["n"], cell["method"], cell["seed"], d))
        approx = approxlab.approximate(cell["method"], q, k, v, num_features=d, generator=draw)
        error = spectral_norm(approx.output - exact) / norm
        errors.append({"num_features": d, "error": float(error.median())})
    return {"errors.csv": errors, "outputs.csv": [{"output_norm": float(norm.mean())}]}


# ------------------------------------------------------------------------------ the claim and the report

FALLS = Claim("falls", "{method}'s error falls markedly as d grows", "median error ratio d_max/d_min",
              side="at most", threshold=0.5, unit="seed", aggregations=("median",))


def verdicts(saved) -> pd.DataFrame:
    """The claim per (n, method): a bootstrap interval over seeds of the ratio of median errors, and its verdict."""
    by_seed = dict(tuple(saved.table("errors.csv").groupby("seed")))
    d_lo, d_hi = min(saved.config["num_features"]), max(saved.config["num_features"])

    def ratios(seeds):  # a resample may hold a seed twice: its rows count twice
        median = pd.concat([by_seed[s] for s in seeds]).groupby(["n", "method", "num_features"])["error"].median()
        return {(n, m): median[(n, m, d_hi)] / median[(n, m, d_lo)] for n, m, _ in median.index}

    seeds = sorted(by_seed)
    intervals = claims.bootstrap(ratios, seeds, resamples=500, seed=0, level=0.95)
    return pd.DataFrame([{"n": n, "method": method, "ratio": i.estimate, "low": i.low, "high": i.high,
                          "verdict": claims.judge(FALLS, i.low, i.high, units=len(seeds))}
                         for (n, method), i in intervals.items()])


def draw(saved) -> list:
    """``landmarks.png/.pdf``: the median error against d, one line per method, one panel per n."""
    from approxlab.plotting import figure, method_style, save_figure

    errors = saved.table("errors.csv")
    ns = sorted(set(errors["n"]))
    fig, axes = figure(1, len(ns), panel_size=(3.0, 2.4))
    for ax, n in zip(axes[0], ns):
        for method, rows in errors[errors["n"] == n].groupby("method"):
            curve = rows.groupby("num_features")["error"].median()
            ax.plot(curve.index, curve.to_numpy(), **method_style(method))
        ax.set_xscale("log", base=2)
        ax.set(yscale="log", xlabel="d", ylabel="relative error", title=f"n = {n}")
        ax.legend(fontsize="small")
    return save_figure(fig, saved.out / "landmarks")


def summary(saved) -> list[str]:
    """The summary's sections: the claim with its verdicts, then the errors."""
    table = saved.product("verdicts.csv")
    errors = saved.table("errors.csv").groupby(["n", "method", "num_features"])["error"].median().reset_index()
    return ["## Claim", "",
            f"- {FALLS.text.format(method='each method')}: {FALLS.statistic}, holds {FALLS.side} "
            f"{FALLS.threshold:g}: {claims.tally(FALLS, table['verdict'])}.", "", *markdown_table(table),
            "", "## Median relative error", "", *markdown_table(errors)]


# ------------------------------------------------------------------------------ the declaration

STUDY = register(Study(
    name="landmarks",
    description="Relative error of landmark approximations against the number of landmarks (synthetic Q/K/V).",
    full=FULL_GRID, quick=QUICK_GRID, configure=configure,
    options=(METHODS, N, NUM_FEATURES, SEEDS.but(help="seeds per method")),
    steps=(Step(tables=(Table("errors.csv", ("n", "method", "seed")), Table("outputs.csv", ("n", "method", "seed"))),
                compute=compute, cells=build_cells),),
    claims=(FALLS,),
    products=(Product("verdicts.csv", verdicts),),
    figures=(Figure("landmarks", draw),),
    summary=Summary("Landmarks: error against d", (summary,)),
))


if __name__ == "__main__":  # the config of the quick grid, as the command line would build it
    print(configure(argparse.Namespace(quick=True, methods=None, n=None, num_features=None, seeds=None)))
