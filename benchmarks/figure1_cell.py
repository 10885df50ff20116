"""The Figure-1 cell at n = 4,096 against one 12-head float64 SDPA exact attention of its window, in one process.

The cell is the bench's (``approxlab bench --parts ratios``): ``figure1``'s compute on the initialized condition,
one window, d in {64, 256}, one seed, float64, every method of the default grid (or ``--methods``), with the
exact reference, the panel statistics and the window's rank of A. One thread. Before it is timed, one load of the
window's Q/K/V brings in the imports and fills the on-disk Q/K/V cache; the per-process caches are then emptied,
as the bench does. The baseline is :func:`approxlab.exact_attention` on the window's 12 heads in float64 (torch's
fused kernel, one ``(1, 12, n, 64)`` call), the median of 5 calls after a warm-up call; the cell runs once; both
by the bench's own timer (:func:`approxlab.studies.bench.timing.measure`). Times are wall and process CPU
seconds (the steadier reading on a shared machine), with the 1-minute load average when each ended. Printed as
markdown table rows, the label first: run the code before and after a change in turn (``PYTHONPATH`` naming each
checkout) to compare them in the same machine state.

It prints the table row, each method's own wall seconds, each error (``error_mean`` to 12 significant digits)
and the panel's statistical dimension and the window's rank of A, so that runs of two versions can be compared
number for number.

``--profile``: the cell runs under ``cProfile`` with the process CPU clock, and the CPU seconds of its parts are
printed (each method's function, with its own errors' spectral norms left out; the shared ranking of ``topk`` and
``topp``, which also forms the exact reference's output where the grid holds them; the exact reference's own fused
call, where it is made; the spectral norms; the panel's statistical dimension; the window's rank of A).

``--rss-interval``: how often the timer samples the process's resident memory (the bench's 0.002 s by default).
The sampler is a thread of the same process, so its CPU time counts in the cell's and the SDPA call's CPU
seconds (about 5 % of the wall time at 0.002 s on this machine); a long interval leaves it out.

``--panel-only``: instead of the cell, the process CPU seconds of the panel's statistical dimension alone (the
panel cell's :func:`~approxlab.studies.figure1.cells._statistical_dimensions` on the same window, its Q/K loaded
untimed) and the estimate, so that a change to it can be compared in runs far shorter than the cell's.

``--ranking-only``: instead of the cell, the process CPU seconds of the window's shared ranking with its exact
output alone (:func:`approxlab.methods.rank_keys` given ``v``, at the grid's d, on the window's float64 Q/K/V loaded
untimed, as the cell's reference forms it) and sums of its results (the output, each budget's values and indices),
so that a change to it can be compared number for number in runs far shorter than the cell's.

``--rank-routes``: instead of the cell, the process CPU seconds of the factorisations an exact rank of the window's
:math:`A` could rest on: the LU of :func:`approxlab.metrics.numerical_rank_lu` (torch, LAPACK getrf), QR with
column pivoting (SciPy, LAPACK geqp3) with the count of its :math:`|R_{ii}|` above the same threshold
:math:`\tau = n\,\epsilon\,\sigma_1`, and one float64 GEMM of :math:`A` with itself (the machine's rate), beside
the rank the cell reports.

Run: ``PYTHONPATH=. nice -n 10 python3 benchmarks/figure1_cell.py --label after`` from the repository root.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time

import torch

import approxlab
from approxlab.studies.driver import compute
from approxlab.studies.figure1.grid import window_ids
from approxlab.studies.inputs import wikitext
from approxlab.studies.bench.timing import measure
from approxlab.studies.registry import get

PARTS = {"the shared ranking (rank_keys; with the exact output where it forms it)": "rank_keys",
         "exact reference (exact_attention)": "exact_attention",
         "spectral norms of the errors": "spectral_norm", "panel: statistical dimension": "_statistical_dimensions",
         "window: rank of A": "numerical_rank_lu"}
"""The parts of the cell ``--profile`` reports besides the methods, by the function whose CPU time they are."""


def profile_lines(profiler: cProfile.Profile, methods: list[str], label: str) -> list[str]:
    """CPU seconds of each method's function and of :data:`PARTS`, from ``profiler``'s cumulative times."""
    from approxlab.methods import get as method

    stats = pstats.Stats(profiler).stats
    cumulative = {}
    for (filename, _, name), (_, _, _, seconds, _) in stats.items():
        if "approxlab" in filename:
            cumulative[(filename, name)] = cumulative.get((filename, name), 0.0) + seconds
    by_name = {}
    for (filename, name), seconds in cumulative.items():
        by_name[name] = by_name.get(name, 0.0) + seconds
    lines = [f"{label}, CPU seconds by part (cProfile): "]
    for name in methods:
        code = method(name).function.__code__
        lines.append(f"{name} {cumulative.get((code.co_filename, code.co_name), 0.0):.2f}")
    lines += [f"{part} {by_name.get(function, 0.0):.2f}" for part, function in PARTS.items()]
    return [lines[0] + ", ".join(lines[1:])]


def panel_only(grid: dict, label: str) -> None:
    """Print the CPU seconds and the estimate of the panel's statistical dimension alone (``--panel-only``)."""
    from approxlab.studies.figure1 import cells

    cell = cells.panel_cells(grid, {"data_dir": None, "cache_dir": None, "device": "cpu"})[0]
    ref = cells._reference(cell)  # the window's Q/K/V and exact output, untimed
    heads = [h for h in cell["stat_heads"] if h < ref["q"].shape[0]]
    start = time.process_time()
    dstats, lambdas, _ = cells._statistical_dimensions(cell, ref, heads)
    seconds = time.process_time() - start
    print(f"{label}, panel's statistical dimension alone: {seconds:.2f} CPU s, statistical_dimension_mean "
          f"{sum(dstats) / len(dstats):.12g} (lambda_mean {sum(lambdas) / len(lambdas):.12g}), "
          f"load (1 min) {os.getloadavg()[0]:.1f}")


def ranking_only(grid: dict, label: str) -> None:
    """Print the CPU seconds and sums of the results of the window's shared ranking alone (``--ranking-only``)."""
    from approxlab.methods import rank_keys
    from approxlab.studies.figure1 import cells

    cell = cells.window_cells(grid, {"data_dir": None, "cache_dir": None, "device": "cpu"})[0]
    record = wikitext.qkv(cells._window(cell))
    q, k, v = (x[0, :, :cell["n"]].to(torch.float64).contiguous() for x in (record.q, record.k, record.v))
    start = time.process_time()
    ranking = rank_keys(q, k, grid["num_features"], v=v)
    seconds = time.process_time() - start
    sums = ", ".join(f"d = {b}: values {float(values.sum()):.15g}, indices {int(indices.sum())}"
                     for b, (values, indices) in sorted(ranking.ranked.items()))
    print(f"{label}, the shared ranking with the exact output alone: {seconds:.2f} CPU s, output sum "
          f"{float(ranking.output.sum()):.15g}, {sums}, load (1 min) {os.getloadavg()[0]:.1f}")


def rank_routes(grid: dict, label: str) -> None:
    """Print the CPU seconds of the factorisations an exact rank of the window's A could rest on (``--rank-routes``)."""
    import math

    import scipy.linalg
    from threadpoolctl import threadpool_limits

    from approxlab.kernels import scaled_logits
    from approxlab.metrics import numerical_rank_lu, spectral_norm
    from approxlab.operators import aslinearoperator
    from approxlab.studies.figure1 import cells

    cell = cells.window_cells(grid, {"data_dir": None, "cache_dir": None, "device": "cpu"})[0]
    record = wikitext.qkv(cells._window(cell))
    logits = scaled_logits(record.q[0][0].to(torch.float64), record.k[0][0].to(torch.float64))
    a = torch.exp(logits - logits.max())  # as compute_window forms it
    n = a.shape[-1]
    tau = n * torch.finfo(torch.float64).eps * float(spectral_norm(aslinearoperator(a), tol=1e-12))
    times = {}
    with threadpool_limits(1):  # SciPy's own BLAS on one thread, as torch's
        start = time.process_time()
        result = scipy.linalg.qr(a.numpy(), pivoting=True, mode="r", overwrite_a=False)
        times["QR with column pivoting (geqp3)"] = time.process_time() - start
    for name, run in (("LU (getrf)", lambda: torch.linalg.lu_factor_ex(a)), ("GEMM A A", lambda: a @ a)):
        start = time.process_time()
        run()
        times[name] = time.process_time() - start
    count = int((torch.from_numpy(abs(result[0].diagonal())) > tau).sum())
    rank = numerical_rank_lu(a, n * torch.finfo(torch.float64).eps, generator=cells._generator(cell, "rank-of-a", 0, 0))
    rates = f"{2 * n**3 / 1e9 / times['GEMM A A']:.0f} GFLOPS; the LU's {2 / 3 * n**3 / 1e9 / times['LU (getrf)']:.0f}"
    listed = ", ".join(f"{name} {seconds:.2f} CPU s" for name, seconds in times.items())
    print(f"{label}, rank of A (n = {n}): {listed}"
          + f" ({rates});"
          f" numerical_rank_lu {rank}, QR's |R_ii| > tau {count} (tau = {tau:.3e}, log2 {math.log2(tau):.1f}),"
          f" load (1 min) {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="this code")
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--methods", nargs="+", default=None, help="default: the figure1 default grid")
    parser.add_argument("--profile", action="store_true", help="CPU seconds of the cell's parts (cProfile)")
    parser.add_argument("--profile-out", default=None, help="with --profile: also save the cProfile stats here")
    parser.add_argument("--rss-interval", type=float, default=0.002,
                        help="seconds between the timer's memory samples (default: the bench's 0.002)")
    parser.add_argument("--panel-only", action="store_true", help="time the panel's statistical dimension alone")
    parser.add_argument("--rank-routes", action="store_true", help="time the factorisations of the rank of A")
    parser.add_argument("--ranking-only", action="store_true", help="time the shared ranking (rank_keys) alone")
    args = parser.parse_args()
    torch.set_num_threads(1)
    study = get("figure1")
    options = {"conditions": ["initialized"], "n": [args.n], "num_features": [64, 256], "windows": 1, "seeds": 1,
               "dtypes": ["float64"], **({"methods": args.methods} if args.methods else {})}
    grid = study.configure(study.arguments(**options))
    if args.panel_only:
        panel_only(grid, args.label)
        return
    if args.rank_routes:
        rank_routes(grid, args.label)
        return
    if args.ranking_only:
        ranking_only(grid, args.label)
        return
    window = wikitext.Window("initialized", args.n, window_ids(grid, args.n)[0], mode=grid["mode"],
                             layer=grid["layer"], model_seed=grid["model_seed"])
    record = wikitext.qkv(window)  # the imports and the on-disk Q/K/V cache, untimed
    q, k, v = (x[0].to(torch.float64) for x in (record.q, record.k, record.v))
    _, base = measure(approxlab.exact_attention, q, k, v, repeats=5, warmup=1, device="cpu",
                      interval=args.rss_interval)
    wikitext.clear_caches()
    profiler = cProfile.Profile(time.process_time) if args.profile else None
    with tempfile.TemporaryDirectory() as out:
        if profiler is not None:
            profiler.enable()
        tables, cell = measure(compute, study, grid, out, progress=False, device="cpu", interval=args.rss_interval)
        if profiler is not None:
            profiler.disable()
            if args.profile_out:
                profiler.dump_stats(args.profile_out)
    results = tables["results.csv"]
    methods = results.groupby("method", sort=False)["seconds"].sum()
    print("| code | methods | heads | SDPA wall s | SDPA CPU s | cell wall s | cell CPU s | wall / SDPA | CPU / SDPA "
          "| methods' own wall s | load (1 min) after SDPA, after the cell |")
    print(f"| {args.label} | {len(grid['methods'])} | {q.shape[0]} | {base.wall_s:.3f} | {base.cpu_s:.3f} | "
          f"{cell.wall_s:.1f} | {cell.cpu_s:.1f} | {cell.wall_s / base.wall_s:.1f} | {cell.cpu_s / base.cpu_s:.1f} | "
          f"{results['seconds'].sum():.1f} | {base.load_average:.1f}, {cell.load_average:.1f} |")
    print(f"{args.label}, each method's own wall seconds (d = 64 and 256 together): "
          + ", ".join(f"{name} {seconds:.2f}" for name, seconds in methods.items()))
    print(f"{args.label}, error_mean per (method, d): "
          + ", ".join(f"{r.method} {r.num_features} {r.error_mean:.12g}" for r in results.itertuples()))
    panel, window_row = tables["conditioning.csv"], tables["windows.csv"]
    print(f"{args.label}, panel: statistical_dimension_mean {panel['statistical_dimension_mean'].iloc[0]:.12g} "
          f"(lambda_mean {panel['lambda_mean'].iloc[0]:.12g}), window: rank_a {window_row['rank_a'].iloc[0]}")
    if profiler is not None:
        print(*profile_lines(profiler, grid["methods"], args.label), sep="\n")


if __name__ == "__main__":
    main()
