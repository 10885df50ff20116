r"""Singular-value decay of attention matrices and of their approximations.

Regenerates, on BERT Q/K/V of WikiText-2, the singular-value distribution of Skyformer
Appendix B (Figure 4: "the singular values decay fast and thus justify the low-rank
approximation") together with the spectrum comparison of the spectral-shifting paper
(Verma, Figure 2: the spectral-shifting approximation "has no long tail, so it is not a low
rank matrix"), and tests Skyformer's claim (Section 1, Section 4.1) that the un-normalised
scores have "extremely large condition numbers due to fast singular value decay" while the
Gaussian kernel's normalisation gives "a more reasonable condition number".

For each case (condition, layer, n) and each head of each window, the singular values
:math:`\sigma_i/\sigma_1` (all of them) of

* ``scores``: :math:`A = \exp(QK^\top/\sqrt p)`, formed as :math:`\exp(QK^\top/\sqrt p - \max)`
  (a positive rescaling: the ratios are unchanged, nothing overflows);
* ``softmax``: :math:`D^{-1}A`;
* ``kernelized``: :math:`C = \kappa(Q/p^{1/4}, K/p^{1/4})` (Skyformer Eq. (3));
* ``completion``: the eigenvalues of the PSD completion
  :math:`\bar C = \kappa([Q;K]/p^{1/4}, [Q;K]/p^{1/4})` (Skyformer Eq. (4), ``2n x 2n``);
* ``output``: :math:`D^{-1}AV` (``n x p_v``; what Skyformer's Figure 4 shows);
* the dense matrices of ``skyformer`` (approximates :math:`C`), ``nystromformer`` and
  ``spectral-shifting`` (approximate :math:`D^{-1}A`) at ``d = 64``,

all in float64. Per matrix the table also holds the numerical rank at ``1e-6``, the stable
rank, the effective rank, :math:`d_{stat}(\lambda)` at :math:`\lambda = \epsilon\sigma_1` for
:math:`\epsilon \in \{0.1, 0.01\}` (for :math:`\bar C` the statistical dimension of Skyformer
Theorem 2 with :math:`\lambda = \epsilon\|\bar C\|`), the 2-norm condition number (``inf``
where numerically singular: :math:`\sigma_{\min} \le \max(n,k)\,\varepsilon_{64}\,\sigma_1`,
never a rounding-noise number like 1e+81) and the decay rate (least-squares slope of
:math:`\ln\sigma_i` over the first 64 indices). All measures come from one SVD per matrix
(:func:`approxlab.metrics.spectrum_measures`, one SVD per matrix).

Q/K/V. ``n = 512``: ``mode="hidden"`` (the hidden state entering the layer, with BERT's position
embeddings). ``n = 2048``: ``mode="embedding"``: BERT's input embedding
:math:`\mathrm{LayerNorm}(E_{word} + E_{position} + E_{type})` projected by *that layer's*
:math:`W_Q, W_K, W_V` -- the setting of Skyformer's Figure 1, since hidden states do not exist
beyond 512 positions. Positions beyond the 512-row table follow ``--positions`` (default
``interpolate``: the table resampled linearly to n rows; ``copy``: Longformer's repetition;
``none``: no positions, the previous inputs -- see :func:`approxlab.data.qkv.position_embeddings`).
``--checkpoint`` picks the BERT-family model (:func:`approxlab.data.load_model`).

Noise floor. The spectra are computed in float64 by an SVD (eigendecomposition for
:math:`\bar C`), whose singular values carry an absolute error of about
:math:`\max(n,k)\,\varepsilon_{64}\,\sigma_1`. Ratios :math:`\sigma_i/\sigma_1` below the
panel's floor :math:`2n\,\varepsilon_{64}` (the largest matrix of the panel is the
:math:`2n\times 2n` completion) are rounding noise: the figure draws that floor and nothing
below it (:func:`noise_floor`). Layers first / middle / last are ``0``,
``L // 2`` and ``L - 1`` (initialized BERT: 0, 6, 11; pretrained MiniLM-L6: 0, 3, 5).

Three steps: :func:`build_config` (grid, hashed in config.json),
:func:`compute` (one runner cell per (condition, layer, n, window); tables ``results.csv``
with one row per head x matrix, and ``spectra.csv`` with, per cell x matrix x index, the
mean / min / max over heads of :math:`\log_{10}(\sigma_i/\sigma_1)`), and :func:`plot` +
:func:`write_summary`, which read only those files and write ``sv_decay.png/.pdf`` and
``summary.md``. Ratios below ``1e-20`` are stored as ``-20`` (numerically zero in float64).

``--quick``: n = 512, first layer only, 1 window, 2 heads; ``approxlab-results/sv-decay-quick/``
unless ``--out`` is given.

References
----------
Chen, Zeng, Ji, Yang. *Skyformer*. NeurIPS 2021. Section 1, Section 4.1 (Eqs. (3)-(4)),
Theorem 2, Appendix B (Figure 4).

Verma. *Beyond Nyströmformer -- Approximation of self-attention by Spectral Shifting*.
Section 6, Figure 2.

Roy and Vetterli (2007), effective rank; Golub and Van Loan, *Matrix Computations*, 5.4.1.
"""

from __future__ import annotations

description = 'Singular-value decay of BERT attention matrices on Wikitext-2 (companion to Skyformer Appendix B).'  # transitional

import functools
import math
import pathlib
import time
import warnings

import numpy as np
import pandas as pd
import torch

from ._compat_io import atomic_write_text, read_results
from ..metrics import spectrum_measures
from . import _cli
from .runner import StudyError, cell_seed, run_cells, saved_config

__all__ = [
    "FULL_GRID",
    "QUICK_GRID",
    "MATRICES",
    "spectrum_measures",
    "layer_index",
    "noise_floor",
    "attention_spectra",
    "build_config",
    "make_cells",
    "compute_cell",
    "compute",
    "plot",
    "summarize",
    "write_summary",
    "add_arguments",
    "run",
]

EXACT_MATRICES = ("scores", "softmax", "kernelized", "completion", "output")
APPROXIMATIONS = ("skyformer", "nystromformer", "spectral-shifting")
MATRICES = EXACT_MATRICES + APPROXIMATIONS
"""Matrix names of the table, in plotting order."""

FULL_GRID = {
    "conditions": ["initialized", "pretrained"],
    "layers": ["first", "middle", "last"],
    "n": [512, 2048],
    "windows": 2,
    "heads": {"512": 12, "2048": 3},
    "approximations": list(APPROXIMATIONS),
    "num_features": 64,
}
"""The full grid. ``heads``: the first that many heads per n (all 12 at 512; 3 at 2048,
where one head costs seven 2048 x 2048 SVDs and a 4096 x 4096 eigendecomposition)."""

QUICK_GRID = {**FULL_GRID, "layers": ["first"], "n": [512], "windows": 1, "heads": {"512": 2}}
"""``--quick``: a smoke run (about a minute on 2 CPU cores)."""

RESULTS = "results.csv"
SPECTRA = "spectra.csv"
KEY_COLUMNS = ("condition", "layer", "n", "window")
LOG10_FLOOR = -20.0
SPECTRUM_DECIMALS = 6
"""log10 values in ``spectra.csv`` are rounded to this many decimals (1e-6 in log10 is a relative
change of 2e-6 in sigma, far below what the figure resolves; it keeps the table under 4 MB)."""
DENSE_PREFIX = 64
"""Spectra keep every index below this, then about :data:`SPECTRUM_POINTS` evenly spaced ones."""
SPECTRUM_POINTS = 192


# ------------------------------------------------------------------------ measures


def noise_floor(n: int, dtype=torch.float64) -> float:
    r"""Smallest trustworthy :math:`\sigma_i/\sigma_1` in a panel of length ``n``: ``2 n eps``.

    An SVD of a ``k x k`` matrix returns singular values with absolute errors of about
    ``k * eps * sigma_1`` (Golub and Van Loan, 8.6); the largest matrix of a panel is the
    ``2n x 2n`` completion.
    """
    return 2 * int(n) * float(torch.finfo(dtype).eps)


def layer_index(layer: str, num_layers: int) -> int:
    """``"first" -> 0``, ``"middle" -> num_layers // 2``, ``"last" -> num_layers - 1``."""
    positions = {"first": 0, "middle": num_layers // 2, "last": num_layers - 1}
    if layer not in positions:
        raise ValueError(f"`layer` must be one of {sorted(positions)}; got {layer!r}.")
    return positions[layer]


def attention_spectra(q, k, v, *, approximations=APPROXIMATIONS, num_features=64, generator=None) -> dict:
    r"""Singular values of the exact attention matrices and of the approximations.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(*batch, n, p)``, ``(*batch, n, p)``, ``(*batch, n, p_v)``; cast to float64.
    approximations : sequence of str
        Registered method names whose ``.matrix()`` is analysed.
    num_features : int
        Their ``d``.
    generator : torch.Generator, optional
        For randomized methods.

    Returns
    -------
    dict of str -> (sigma ``(*batch, r)``, shape ``(n, k)``)
        Keys from :data:`MATRICES` (those computed). ``completion`` holds the eigenvalues
        of :math:`\bar C` (clamped at 0), descending.
    """
    from ..attention import approximate
    from ..kernels import kernelized_matrix, scaled_logits, softmax_matrix

    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    n = q.shape[-2]
    logits = scaled_logits(q, k)
    scores = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
    softmax = softmax_matrix(q, k)
    z = torch.cat([q, k], dim=-2)
    out = {
        "scores": (torch.linalg.svdvals(scores), (n, n)),
        "softmax": (torch.linalg.svdvals(softmax), (n, n)),
        "kernelized": (torch.linalg.svdvals(kernelized_matrix(q, k)), (n, n)),
        "completion": (torch.linalg.eigvalsh(kernelized_matrix(z, z)).flip(-1).clamp_min(0.0), (2 * n, 2 * n)),
        "output": (torch.linalg.svdvals(softmax @ v), tuple(v.shape[-2:])),
    }
    for name in approximations:
        matrix = approximate(name, q, k, v, num_features=num_features, generator=generator).matrix()
        out[name] = (torch.linalg.svdvals(matrix), (n, n))
    return out


# ------------------------------------------------------------------------------ grid


def build_config(*, quick: bool = False, conditions=None, layers=None, n=None, windows=None, heads=None,
                 approximations=None, num_features=None, window_seed: int = 0, model_seed: int = 0,
                 base_seed: int = 0, positions: str = "interpolate", checkpoint=None) -> dict:
    """The grid-defining configuration (saved and hashed in ``config.json``).

    ``heads`` (int) overrides the number of heads for every n; ``positions`` applies to the
    embedding-mode cells (n > 512; hidden cells always carry BERT's positions); ``checkpoint``
    is the BERT-family model (None: the offline defaults).
    """
    from ..methods import available

    grid = {key: (dict(value) if isinstance(value, dict) else value)
            for key, value in (QUICK_GRID if quick else FULL_GRID).items()}
    for name, value in (("conditions", conditions), ("layers", layers), ("n", n),
                        ("approximations", approximations)):
        if value is not None:
            grid[name] = list(value)
    for name, value in (("windows", windows), ("num_features", num_features)):
        if value is not None:
            grid[name] = int(value)
    for c in grid["conditions"]:
        if c not in ("initialized", "pretrained"):
            raise StudyError(f"--conditions must be among ['initialized', 'pretrained']; got {c!r}.")
    for layer in grid["layers"]:
        if layer not in ("first", "middle", "last"):
            raise StudyError(f"--layers must be among ['first', 'middle', 'last']; got {layer!r}.")
    for method in grid["approximations"]:
        if method not in available():
            raise StudyError(f"--approximations: {method!r} is not registered; choose from {available()}.")
    grid["n"] = sorted({int(x) for x in grid["n"]})
    if any(x < 2 for x in grid["n"]) or grid["windows"] < 1 or grid["num_features"] < 1:
        raise StudyError(f"--n (>= 2), --windows (>= 1) and --num-features (>= 1) must be positive; got "
                         f"{grid['n']}, {grid['windows']}, {grid['num_features']}.")
    if positions not in ("interpolate", "copy", "none"):
        raise StudyError(f"--positions must be one of ['interpolate', 'copy', 'none']; got {positions!r}.")
    default_heads = min(grid["heads"].values()) if grid["heads"] else 12
    grid["heads"] = {str(x): int(heads) if heads is not None else int(grid["heads"].get(str(x), default_heads))
                     for x in grid["n"]}
    return {
        "study": "sv-decay",
        "paper": "Skyformer Appendix B (Figure 4) and Sections 1/4.1; spectral shifting (Verma) Figure 2",
        **grid,
        "modes": {str(x): ("hidden" if x <= 512 else "embedding") for x in grid["n"]},
        "positions": positions,
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "noise_floor": "2 n eps64 (sigma_i / sigma_1 below it is not drawn)",
        "dtype": "float64",
        "rtol_numerical_rank": 1e-6,
        "statistical_dimension_eps": [0.1, 0.01],
        "decay_fit_indices": 64,
        "window_pool": 64,
        "window_seed": int(window_seed),
        "model_seed": int(model_seed),
        "base_seed": int(base_seed),
    }


def _window_ids(config) -> list[int]:
    generator = torch.Generator().manual_seed(config["window_seed"])
    return sorted(int(i) for i in torch.randperm(config["window_pool"], generator=generator)[: config["windows"]])


def make_cells(config: dict, *, data_dir=None, cache_dir=None, device: str = "cpu") -> list[dict]:
    """One cell per (condition, layer, n, window)."""
    cells = []
    for condition in config["conditions"]:
        for layer in config["layers"]:
            for n in config["n"]:
                for window in _window_ids(config):
                    cells.append({
                        "condition": condition, "layer": layer, "n": n, "window": window,
                        "mode": config["modes"][str(n)], "heads": config["heads"][str(n)],
                        "approximations": list(config["approximations"]), "num_features": config["num_features"],
                        "model_seed": config["model_seed"], "base_seed": config["base_seed"],
                        "positions": config.get("positions", "none"), "checkpoint": config.get("checkpoint"),
                        "data_dir": None if data_dir is None else str(data_dir),
                        "cache_dir": None if cache_dir is None else str(cache_dir), "device": device,
                    })
    return cells


def load_qkv(condition, n, window, *, layer, mode, model_seed, data_dir, cache_dir, device,
             positions="interpolate", checkpoint=None):
    """Q, K, V ``(heads, n, head_dim)`` in float64, the layer index and checkpoint.

    Thin wrapper of :func:`approxlab.data.get_qkv` (tests replace it with synthetic data);
    hidden-mode cells always carry BERT's own positions.
    """
    from ..data import get_qkv

    index = layer_index(layer, _num_layers(condition, checkpoint))
    qkv = get_qkv(condition, n, [window], mode=mode, layer=index, seed=model_seed, data_dir=data_dir,
                  cache_dir=cache_dir, device=device, dtype=torch.float64, checkpoint=checkpoint,
                  positions=positions if mode == "embedding" else "interpolate")
    return qkv.q[0], qkv.k[0], qkv.v[0], index, str(qkv.checkpoint)


@functools.lru_cache(maxsize=4)
def _num_layers(condition: str, checkpoint=None) -> int:
    """Layers of the condition's model, read from its config (no weights are built)."""
    from transformers import AutoConfig, BertConfig

    if condition == "initialized" and checkpoint is None:
        return int(BertConfig().num_hidden_layers)
    from ..data import minilm_path

    return int(AutoConfig.from_pretrained(str(checkpoint or minilm_path())).num_hidden_layers)


def _spectrum_indices(r: int) -> np.ndarray:
    dense = np.arange(min(r, DENSE_PREFIX))
    if r <= DENSE_PREFIX:
        return dense
    tail = np.unique(np.linspace(DENSE_PREFIX, r - 1, SPECTRUM_POINTS).round().astype(int))
    return np.concatenate([dense, tail])


def compute_cell(cell: dict) -> dict:
    """Spectra of one window: ``{"results": rows (head x matrix), "spectra": rows}``."""
    start = time.perf_counter()
    q, k, v, index, checkpoint = load_qkv(cell["condition"], cell["n"], cell["window"], layer=cell["layer"],
                                          mode=cell["mode"], model_seed=cell["model_seed"],
                                          data_dir=cell["data_dir"], cache_dir=cell["cache_dir"],
                                          device=cell["device"], positions=cell.get("positions", "none"),
                                          checkpoint=cell.get("checkpoint"))
    heads = min(int(cell["heads"]), q.shape[0])
    q, k, v = q[:heads], k[:heads], v[:heads]
    seed = cell_seed(cell["condition"], cell["layer"], cell["n"], cell["window"], base_seed=cell["base_seed"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spectra = attention_spectra(q, k, v, approximations=cell["approximations"],
                                    num_features=min(cell["num_features"], cell["n"]),
                                    generator=torch.Generator().manual_seed(seed))
    rows, curves = [], []
    common = {"layer_index": index, "checkpoint": checkpoint, "mode": cell["mode"], "warnings": len(caught)}
    for name, (sigma, shape) in spectra.items():
        sigma = sigma.cpu()
        measures = spectrum_measures(sigma, shape)
        for h in range(heads):
            rows.append({"head": h, "matrix": name, **{key: float(val[h]) for key, val in measures.items()},
                         "sigma_1": float(sigma[h, 0]), **common})
        ratio = (sigma / sigma[:, :1]).clamp_min(10.0**LOG10_FLOOR)
        logs = torch.log10(ratio).numpy()
        for i in _spectrum_indices(sigma.shape[-1]):
            column = logs[:, i]
            curves.append({"matrix": name, "index": int(i),
                           **{f"log10_{stat}": round(float(getattr(column, stat)()), SPECTRUM_DECIMALS)
                              for stat in ("mean", "min", "max")}, "heads": heads})
    seconds = time.perf_counter() - start
    for row in rows:
        row["seconds"] = seconds
    return {"results": rows, "spectra": curves}


_CELL_CACHE: dict = {}


def _cell_tables(cell) -> dict:
    """``compute_cell`` once per cell and process: both passes of :func:`compute` read it.

    Every cell's (small) tables stay in memory until :func:`compute` returns, so an
    in-process run decomposes each matrix once, not once per table.
    """
    key = tuple(cell[c] for c in KEY_COLUMNS)
    if key not in _CELL_CACHE:
        _CELL_CACHE[key] = compute_cell(cell)
    return _CELL_CACHE[key]


def _results_rows(cell):
    return _cell_tables(cell)["results"]


def _spectra_rows(cell):
    return _cell_tables(cell)["spectra"]


def compute(config: dict, out, *, data_dir=None, cache_dir=None, device="cpu", scheduler=None, workers=None,
            progress=True, restart=False, run_info=None):
    """Run (or resume) the grid; write ``results.csv``, ``spectra.csv`` and ``config.json``.

    The two tables are filled by two passes over the same cells; a cell's computation is
    kept in memory between them (in-process runs compute each cell once).
    """
    out = pathlib.Path(out)
    cells = make_cells(config, data_dir=data_dir, cache_dir=cache_dir, device=device)
    common = dict(key_columns=KEY_COLUMNS, config=config, run_info=run_info, scheduler=scheduler,
                  workers=workers, progress=progress, restart=restart)
    # spectra first: a resumed run that has all spectra still fills missing result rows.
    spectra = run_cells(cells, _spectra_rows, results_path=out / SPECTRA, **common)
    results = run_cells(cells, _results_rows, results_path=out / RESULTS, **common)
    _CELL_CACHE.clear()
    return results, spectra


# ------------------------------------------------------------------------------- plot


def _load(out):
    out = pathlib.Path(out)
    for name in (RESULTS, SPECTRA):
        if not (out / name).is_file():
            raise StudyError(f"no {name} in {str(out)!r}: run the compute step first (without --plot-only).")
    return (saved_config(out / "config.json", RESULTS), read_results(out / RESULTS, required=KEY_COLUMNS),
            read_results(out / SPECTRA))


def plot(out) -> list[pathlib.Path]:
    """Draw ``sv_decay.png/.pdf`` from the saved tables; see :func:`approxlab.studies.sv_decay_figure.plot`."""
    from .sv_decay_figure import plot as draw

    return draw(out)


def _fmt_kappa(values: pd.Series) -> str:
    values = values.astype(float)
    singular = int(np.isinf(values).sum())
    finite = values[np.isfinite(values)]
    if singular == len(values):
        return f"singular ({singular}/{len(values)})"
    text = f"{np.median(finite):.2e}"
    return text + (f", singular {singular}/{len(values)}" if singular else "")


def conditioning_by_length(results: pd.DataFrame) -> pd.DataFrame:
    """Per n x matrix (scores, softmax, kernelized): the share of heads numerically singular, the
    median finite condition number and the mean numerical rank (1e-6) -- the rank/conditioning
    findings, split by n so that the inputs of each length (hidden vs embedding) stay apart."""
    kept = results[results["matrix"].isin(["scores", "softmax", "kernelized"])].copy()
    kept["kappa"] = kept["condition_number"].astype(float)
    rows = []
    for (n, mode, matrix), group in kept.groupby(["n", "mode", "matrix"], sort=True):
        finite = group["kappa"][np.isfinite(group["kappa"])]
        rows.append({"n": n, "mode": mode, "matrix": matrix, "heads": len(group),
                     "singular_share": float(np.isinf(group["kappa"]).mean()),
                     "median_finite_kappa": float(finite.median()) if len(finite) else math.inf,
                     "numerical_rank": float(group["numerical_rank"].mean())})
    return pd.DataFrame(rows)


def _survival_text(config: dict, table: pd.DataFrame) -> list[str]:
    positions = config.get("positions", "none")
    lines = ["## Which rank/conditioning findings survive the inputs", "",
             f"Inputs: n <= 512 hidden states with BERT's positions; n > 512 the input embedding with positions "
             f"`{positions}` (with `--positions none` a window's rows of Q would be fixed by its distinct "
             "tokens and A rank-deficient by construction).", "",
             "| n | mode | matrix | heads | numerically singular | median finite kappa_2 | numerical rank |",
             "|---|---|---|---|---|---|---|"]
    for row in table.itertuples(index=False):
        lines.append(f"| {row.n} | {row.mode} | {row.matrix} | {row.heads} | {100 * row.singular_share:.0f}% | "
                     f"{row.median_finite_kappa:.3e} | {row.numerical_rank:.1f} |")
    lines.append("")
    for n, group in table.groupby("n"):
        by = group.set_index("matrix")
        if {"softmax", "kernelized"} <= set(by.index):
            better = (by.loc["kernelized", "singular_share"], by.loc["kernelized", "median_finite_kappa"]) < (
                by.loc["softmax", "singular_share"], by.loc["softmax", "median_finite_kappa"])
            singular = ", ".join(f"{m} {100 * by.loc[m, 'singular_share']:.0f}%" for m in by.index)
            lines.append(f"- n = {n}: numerically singular heads: {singular}; kernelized C "
                         f"{'is' if better else 'is not'} better conditioned than D^-1 A.")
    return lines + [""]


def summarize(config: dict, results: pd.DataFrame) -> str:
    """The markdown of ``summary.md``: per-case tables and the two claims, with numbers."""
    lines = ["# Singular-value decay of attention matrices (Skyformer Appendix B; spectral shifting Fig. 2)", "",
             "Mean over heads and windows (condition number: median of the finite ones, and how many are "
             "numerically singular, i.e. sigma_min <= max(n,k) * eps64 * sigma_1). d_stat(eps) = "
             "sum_i s_i/(s_i + eps*s_1); decay = least-squares slope of ln sigma_i over the first 64 indices, "
             "leaving out those at or below max(n,k) * eps64 * sigma_1 (for a rank-d approximation the fit "
             "includes the drop after its last nonzero sigma).", ""]
    cases = results.groupby(["condition", "n", "layer"], sort=False)
    for (condition, n, layer), group in cases:
        lines += [f"## {condition}, {layer} layer (index {int(group['layer_index'].iloc[0])}), n={n}, "
                  f"mode={group['mode'].iloc[0]}, {group['head'].nunique()} heads x "
                  f"{group['window'].nunique()} windows", "",
                  "| matrix | num. rank (1e-6) | stable rank | eff. rank | d_stat(0.1) | d_stat(0.01) | "
                  "kappa_2 | decay rate |", "|---|---|---|---|---|---|---|---|"]
        for name in MATRICES:
            m = group[group["matrix"] == name]
            if not len(m):
                continue
            lines.append(
                f"| {name} | {m['numerical_rank'].mean():.1f} | {m['stable_rank'].mean():.2f} | "
                f"{m['effective_rank'].mean():.1f} | {m['statistical_dimension_0.1'].mean():.1f} | "
                f"{m['statistical_dimension_0.01'].mean():.1f} | {_fmt_kappa(m['condition_number'])} | "
                f"{m['decay_rate'].mean():.3f} |")
        lines.append("")
    lines += ["## Claims", ""]
    kappa = results[results["matrix"].isin(["scores", "softmax", "kernelized"])]
    by = kappa.groupby("matrix")["condition_number"]
    singular = by.apply(lambda s: float(np.isinf(s.astype(float)).mean()))
    median = by.apply(lambda s: float(np.median(s[np.isfinite(s.astype(float))])) if np.isfinite(s.astype(float)).any()
                      else math.inf)
    lines.append("Skyformer: the Gaussian kernel's normalisation gives \"a more reasonable condition number\" "
                 "than the softmax structure. Over all cases:")
    lines.append("")
    for name in ("scores", "softmax", "kernelized"):
        if name in singular.index:
            lines.append(f"- {name}: numerically singular in {100 * singular[name]:.0f}% of heads; median finite "
                         f"kappa_2 = {median[name]:.3e}")
    if {"softmax", "kernelized"} <= set(singular.index):
        better = (singular["kernelized"] < singular["softmax"]) or (
            singular["kernelized"] == singular["softmax"] and median["kernelized"] < median["softmax"])
        lines += ["", f"Verdict: kernelized C is {'better' if better else 'not better'} conditioned than "
                      f"D^-1 A here."]
    lines += ["", "Spectral-shifting paper (Fig. 2): its approximation \"has no long tail, so it is not a low rank "
                  "matrix\". Numerical rank (1e-6) of the approximations at d = "
                  f"{config['num_features']} vs the exact softmax matrix, mean over all cases:", ""]
    ranks = results.groupby("matrix")["numerical_rank"].mean()
    for name in ("softmax", "kernelized", *config["approximations"]):
        if name in ranks.index:
            lines.append(f"- {name}: {ranks[name]:.1f}")
    approx_low = [a for a in config["approximations"] if a in ranks.index and ranks[a] <= config["num_features"] + 1]
    lines += ["", f"Approximations of rank <= d + 1 (low rank): {approx_low or 'none'}.", ""]
    lines += _survival_text(config, conditioning_by_length(results))
    return "\n".join(lines) + "\n"


def write_summary(out) -> pathlib.Path:
    """Write ``summary.md`` from the saved tables."""
    config, results, _ = _load(out)
    return atomic_write_text(pathlib.Path(out) / "summary.md", summarize(config, results))


# ------------------------------------------------------------------------------- CLI


def add_arguments(parser) -> None:
    """Options of ``approxlab sv-decay`` (besides the common ones)."""
    group = parser.add_argument_group("sv-decay grid (defaults: the full grid, or the --quick one)")
    group.add_argument("--conditions", type=_cli.str_list, default=None, help="initialized,pretrained")
    group.add_argument("--layers", type=_cli.str_list, default=None, help="first,middle,last")
    group.add_argument("--n", type=_cli.int_list, default=None, help="comma-separated sequence lengths")
    group.add_argument("--windows", type=_cli.positive_int, default=None, help="number of WikiText-2 windows")
    group.add_argument("--heads", type=_cli.positive_int, default=None, help="first H heads (default: 12 at 512, 3 at 2048)")
    group.add_argument("--approximations", type=_cli.str_list, default=None, help="method names")
    group.add_argument("--num-features", type=_cli.positive_int, default=None, help="d of the approximations (default 64)")
    group.add_argument("--positions", choices=("interpolate", "copy", "none"), default="interpolate",
                       help="positions beyond BERT's 512-row table in the embedding-mode cells (n > 512): "
                            "interpolate (default), copy (Longformer), none")
    group.add_argument("--checkpoint", default=None, metavar="NAME_OR_DIR",
                       help="BERT-family checkpoint (Hub id with network, local folder always); the initialized "
                            "condition takes its config and tokenizer (default: the offline defaults)")


def run(args) -> int:
    """``approxlab sv-decay``: compute (resumable) unless ``--plot-only``, then plot and summarise."""
    out = args.out
    if not args.plot_only:
        config = build_config(quick=args.quick, conditions=args.conditions, layers=args.layers, n=args.n,
                              windows=args.windows, heads=args.heads, approximations=args.approximations,
                              num_features=args.num_features, positions=args.positions,
                              checkpoint=args.checkpoint)
        _cli.check_model(args, config["conditions"], encoder_only=True)
        _cli.check_windows(args, {n: _window_ids(config) for n in config["n"]}, windows=config["windows"])
        _cli.check_heads("--heads", max(config["heads"].values()), config["conditions"], checkpoint=args.checkpoint)
        run_info = {"command": getattr(args, "command", "approxlab sv-decay"), "device": args.device,
                    "torch": torch.__version__, "threads": torch.get_num_threads()}
        start = time.perf_counter()
        compute(config, out, data_dir=args.data_dir, cache_dir=args.cache_dir, device=args.device,
                scheduler=args.scheduler, workers=args.workers, progress=args.progress, restart=args.restart,
                run_info=run_info)
        print(f"sv-decay: computed in {time.perf_counter() - start:.1f} s -> {out}")
    for path in [*plot(out), write_summary(out)]:
        print(f"sv-decay: wrote {path}")
    return 0
