"""Published results read from the source papers, shipped as small tables.

:func:`skyformer_figure1` -- the curves of Skyformer's Figure 1 (Chen et al., NeurIPS 2021,
camera-ready PDF, page 8), digitised at all five d; ``README.md`` beside the table says how, and
how exact the readings are. The studies draw these curves beside their own.
"""

from __future__ import annotations

import functools
from importlib import resources

import pandas as pd

__all__ = ["skyformer_figure1", "SKYFORMER_FIGURE1_COLUMNS"]

SKYFORMER_FIGURE1_COLUMNS = ("condition", "n", "method", "num_features", "error", "reading_error", "marker")
"""Columns of :func:`skyformer_figure1`, in order."""

_SKYFORMER_FIGURE1 = "skyformer_figure1.csv"


@functools.lru_cache(maxsize=1)
def _read_skyformer_figure1() -> pd.DataFrame:
    with resources.files(__package__).joinpath(_SKYFORMER_FIGURE1).open("r", encoding="utf-8") as handle:
        table = pd.read_csv(handle)
    if tuple(table.columns) != SKYFORMER_FIGURE1_COLUMNS:
        raise ValueError(
            f"{_SKYFORMER_FIGURE1} must have columns {list(SKYFORMER_FIGURE1_COLUMNS)}; got {list(table.columns)}."
        )
    return table


def skyformer_figure1() -> pd.DataFrame:
    r"""Skyformer's Figure 1 as plotted in the paper: one row per panel, method and d.

    Returns
    -------
    pandas.DataFrame
        160 rows (conditions ``initialized``/``pretrained`` x n {512, 1024, 2048, 4096} x the four
        methods x d {16, 32, 64, 128, 256}), columns :data:`SKYFORMER_FIGURE1_COLUMNS`:

        * ``condition``, ``n``, ``num_features`` (the paper's d),
        * ``method`` -- approxlab's name of the paper's curve: ``skyformer-softmax`` (the paper's
          "Skyformer", Eq. (5) on the raw scores then row normalisation), ``nystromformer``,
          ``performer``, ``informer``,
        * ``error`` -- the plotted spectral-norm loss :math:`\|\tilde O - O\|_2` (the paper does not
          say which statistic over heads and windows its points are; its markers carry error bars),
        * ``reading_error`` -- bound on the digitisation error, in the same units,
        * ``marker`` -- ``visible``, ``partly hidden`` or ``hidden`` (under another method's
          marker: then ``reading_error`` spans the rows where a hidden marker fits).

        A fresh copy on every call.

    Notes
    -----
    Digitised from the figure's embedded raster (8428 x 4412 px) by template matching of the
    markers on each panel's grid-line calibration (``tools/digitise_skyformer_figure1.py`` in the repository);
    the readings agree with values read by eye at d = 16 and 256 to a median 0.3 % (largest 2.6 %,
    a marker hidden under two others, confirmed at 4.68 by extrapolating its line). See the
    ``README.md`` beside the table.

    References
    ----------
    Chen, Zeng, Ji, Yang. *Skyformer: Remodel Self-Attention with Gaussian Kernel and Nystrom
    Method*. NeurIPS 2021, Figure 1 (camera-ready, ``doc/Skyformer_camera_ready.pdf`` in
    pkuzengqi/Skyformer).
    """
    return _read_skyformer_figure1().copy()
