"""The ``ratios`` part of ``approxlab bench``: the performance targets' ratios against SDPA.

``ExactAttentionOperator`` matmat and rmatmat against one SDPA forward (float32 and float64),
the matrix-free spectral error (block Lanczos through the SDPA operator) against one SDPA
forward of the same head, and the Figure-1 cell against one float64 SDPA exact attention of all its
heads at its n; :func:`ratio_lines` writes them with their :data:`TARGETS` (the Figure-1 cell's from
its method count, :func:`figure1_target`) into ``summary.md``. See
:mod:`approxlab.studies.bench`.
"""

from __future__ import annotations


import torch

from .baseline import torch_sdpa
from .parts import approximation, measured_row, timing_options
from .timing import measure, measure_interleaved
from ..engine.keys import cell_seed
from ...linalg.normal_lanczos import normal_block_lanczos

__all__ = ["RATIOS", "TARGETS", "CELL_PARTS", "FIGURE1_BASE_METHODS", "figure1_target", "ratio_rows", "ratio_lines"]


RATIOS = {"operator-products": "ratio_n", "spectral-error": "spectral_ratio_n", "figure1-cell": "figure1_ratio_n"}
"""The ratio cells of the ``ratios`` part and the config key of their n."""


def _sdpa_forward(q, k, v):
    """One head ``(1, n, p)`` through torch's SDPA on its fused kernel (:func:`~.baseline.torch_sdpa`)."""
    return torch_sdpa(q, k, v)


def _operator_ratio_rows(config, q, k, v, common, device):
    """ExactAttentionOperator matmat and rmatmat against one SDPA forward, float32 and float64.

    The three are timed in turn (:func:`measure_interleaved`). The adjoint's row
    log-sum-exps are computed once per operator (in the warm-up call) and cached, as in any
    sequence of products with one operator."""
    from ...operators import ExactAttentionOperator

    rows, timed = [], timing_options(config, device)
    for dtype in (torch.float32, torch.float64):
        q_, k_, v_ = (x.to(dtype) for x in (q, k, v))
        name = str(dtype).replace("torch.", "")
        op = ExactAttentionOperator(q_, k_)
        base, *products = measure_interleaved(
            [lambda: _sdpa_forward(q_, k_, v_), lambda: op.matmat(v_), lambda: op.rmatmat(v_)],  # noqa: B023
            repeats=timed["repeats"], warmup=timed["warmup"], device=device)
        rows.append(measured_row("torch-sdpa", base, compute_dtype=name, **common))
        for algorithm, m in zip(("operator-matmat", "operator-rmatmat"), products):
            rows.append(measured_row(algorithm, m, compute_dtype=name, ratio_vs_sdpa=m.wall_s / base.wall_s, **common))
    return rows


def _spectral_ratio_rows(config, q, k, v, n, common, device, seed):
    """Matrix-free ||S~ - S||_2 (block Lanczos through the SDPA operator) against one SDPA forward."""
    from ...operators import ExactAttentionOperator

    _, base = measure(_sdpa_forward, q, k, v, **timing_options(config, device))
    approx_op = approximation(config, config["error_method"], q, k, v, n).operator()
    result, m = measure(normal_block_lanczos, q, k, approx_op, block=int(q.shape[-1]), tol=config["tol"],
                        max_iter=config["max_iter"], generator=torch.Generator().manual_seed(seed),
                        exact_operator=ExactAttentionOperator(q, k), device=device)
    return [measured_row("torch-sdpa", base, compute_dtype=common["dtype"], **common),
            measured_row("spectral-error-sdpa-lanczos", m, compute_dtype=common["dtype"],
                         estimate=float(result.estimate.max()), distance_bound=float(result.distance_bound.max()),
                         passes=result.num_passes, ratio_vs_sdpa=m.wall_s / base.wall_s, **common)]


def _figure1_ratio_rows(cell, n, common):
    """The Figure-1 cell (initialized, one window, d in {64, 256}, one seed, all methods, float64,
    the cell whose cost is targeted): its compute as ``approxlab figure1`` runs it (window diagnostics,
    exact references, every method of the study's default grid, panel statistics; the study looked up by
    name in the registry), against one float64 SDPA exact attention of all the same window's heads at n
    (:func:`approxlab.exact_attention`: one 4-D call of torch's fused kernel, ``(1, heads, n, p)``). The
    rows carry ``heads`` and ``methods`` (the methods the cell ran), which the summary's line and the
    target (:func:`figure1_target`) read. Three more rows split it:
    ``figure1-cell-methods``, the methods' own ``seconds`` in ``results.csv`` (approximation and its
    error); ``figure1-cell-window-rank``, the window diagnostics' ``seconds`` in ``windows.csv`` (the
    rank of A, an LU factorisation, added to the cell after its target was set); and
    ``figure1-cell-without-window-rank``, the compute less that, i.e. the cell the target was set for."""
    import tempfile

    from ...attention import exact_attention
    from ..driver import compute
    from ..inputs import wikitext
    from ..registry import get

    config, device = cell["config"], cell["device"]
    study = get("figure1")
    grid = study.configure(study.arguments(conditions=["initialized"], n=[n], num_features=[64, 256], windows=1,
                                           seeds=1, dtypes=["float64"]))
    wikitext.clear_caches()
    with tempfile.TemporaryDirectory() as out:
        tables, m = measure(compute, study, grid, out, data_dir=cell["data_dir"], cache_dir=cell["cache_dir"],
                            device=device, progress=False)
        methods_s = float(tables["results.csv"]["seconds"].sum())
        rank_s = float(tables["windows.csv"]["seconds"].sum())
        window = int(tables["windows.csv"]["window"].iloc[0])
    source = wikitext.Window("initialized", n, window, mode=grid["mode"], layer=grid["layer"],
                             model_seed=grid["model_seed"], data_dir=cell["data_dir"], cache_dir=cell["cache_dir"],
                             device=device)
    q, k, v = (x[0].to(torch.float64) for x in (lambda r: (r.q, r.k, r.v))(wikitext.qkv(source)))
    _, base = measure(exact_attention, q, k, v, **timing_options(config, device))
    heads = {**common, "p": int(q.shape[-1]), "heads": int(q.shape[0]), "methods": len(grid["methods"]),
             "dtype": "float64"}
    parts = {"figure1-cell-methods": methods_s, "figure1-cell-window-rank": rank_s,
             "figure1-cell-without-window-rank": m.wall_s - rank_s}
    return [measured_row("exact-attention-sdpa-all-heads", base, compute_dtype="float64", **heads),
            measured_row("figure1-cell-compute", m, compute_dtype="float64", ratio_vs_sdpa=m.wall_s / base.wall_s,
                         **heads),
            *({"algorithm": name, "compute_dtype": "float64", "wall_s": seconds,
               "ratio_vs_sdpa": seconds / base.wall_s, **heads} for name, seconds in parts.items())]


def ratio_rows(cell: dict, q, k, v, common: dict) -> list[dict]:
    """Rows of one ``ratios`` cell (see :data:`RATIOS`); each carries ``ratio_vs_sdpa``."""
    config, n, device = cell["config"], cell["n"], cell["device"]
    if cell["method"] == "operator-products":
        return _operator_ratio_rows(config, q, k, v, common, device)
    if cell["method"] == "spectral-error":
        return _spectral_ratio_rows(config, q, k, v, n, common, device, cell_seed("ratios", n, base_seed=config["seed"]))
    return _figure1_ratio_rows(cell, n, common)


TARGETS = {"operator-matmat": 1.3, "operator-rmatmat": 1.3, "spectral-error-sdpa-lanczos": 12.0,
           "figure1-cell-compute": 10.0}
"""The performance targets: upper bounds on ``ratio_vs_sdpa`` (the Figure-1 cell's: at most
:data:`FIGURE1_BASE_METHODS` methods; :func:`figure1_target` for more)."""

FIGURE1_BASE_METHODS = 9
"""The Figure-1 cell's method count its base target (``TARGETS["figure1-cell-compute"]``) was set for."""


def figure1_target(methods: int | None) -> float:
    """The Figure-1 cell's target for a cell of ``methods`` methods: the base target (10 forwards) for up to
    :data:`FIGURE1_BASE_METHODS`, plus one forward per further method (16 for the default grid's 15); the
    base target when the count was not recorded (``None``, a run before it was).

    Examples
    --------
    >>> from approxlab.studies.bench.ratios import figure1_target
    >>> figure1_target(15), figure1_target(9), figure1_target(None)
    (16.0, 10.0, 10.0)
    """
    base = TARGETS["figure1-cell-compute"]
    return base if methods is None else base + max(0, int(methods) - FIGURE1_BASE_METHODS)


def _figure1_cell_what(row) -> str:
    """The summary's description of the Figure-1 cell row: its method count and its baseline, as measured."""
    methods = _recorded(row.get("methods"))
    count = "methods not recorded" if methods is None else f"{methods} methods"
    return (f"Figure-1 cell compute (initialized, float64, d in {{64, 256}}, 1 window, 1 seed, {count}, d_stat, "
            f"rank of A) / one {int(row['heads'])}-head float64 SDPA exact attention at n")


CELL_PARTS = {
    "figure1-cell-methods": "its methods' own seconds (approximations and their errors, as results.csv reports "
                            "them) / the same",
    "figure1-cell-window-rank": "its window diagnostics (the rank of A, an LU factorisation; windows.csv "
                                "seconds) / the same",
    "figure1-cell-without-window-rank": "its compute less the window diagnostics (the cell the target was set for) "
                                        "/ the same",
}
"""Rows that split the Figure-1 cell's compute (no target of their own)."""


def _recorded(value):
    """``value`` as an int, or None where the table has no such column or a NaN."""
    return None if value is None or value != value else int(value)


def ratio_lines(wide) -> list[str]:
    """The "Target ratios" section: each measured ratio, its target and whether it is met."""
    rows = wide[(wide["part"] == "ratios") & wide["algorithm"].isin([*TARGETS, *CELL_PARTS])]
    if rows.empty:
        return []
    what = {"operator-matmat": "ExactAttentionOperator.matmat / SDPA forward (one head)",
            "operator-rmatmat": "ExactAttentionOperator.rmatmat / SDPA forward (one head)",
            "spectral-error-sdpa-lanczos": "matrix-free spectral error / one SDPA forward (same head)",
            **CELL_PARTS}
    lines = ["## Target ratios", "", "| ratio | n | dtype | seconds | baseline seconds | ratio | target | met |",
             "|---|---|---|---|---|---|---|---|"]
    base = wide[wide["part"] == "ratios"]
    for _, row in rows.sort_values(["algorithm", "compute_dtype"]).iterrows():
        ratio, target = float(row["ratio_vs_sdpa"]), TARGETS.get(row["algorithm"])
        described = what.get(row["algorithm"])
        if row["algorithm"] == "figure1-cell-compute":
            described, target = _figure1_cell_what(row), figure1_target(_recorded(row.get("methods")))
        verdict = ("—", "—") if target is None else (f"<= {target:g}", "yes" if ratio <= target else "no")
        lines.append(f"| {described} | {int(row['n'])} | {row['compute_dtype']} | {row['wall_s']:.3f} | "
                     f"{row['wall_s'] / ratio:.3f} | {ratio:.2f} | {verdict[0]} | {verdict[1]} |")
    load = base["load_average"].agg(["min", "max"])
    return lines + ["", f"1-minute load average during these measurements: {load['min']:.1f} to {load['max']:.1f}.", ""]
