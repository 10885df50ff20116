"""One figure style for every approxlab study; plots read saved tables only.

Public API::

    METHOD_STYLES                      # name -> dict(color, marker, linestyle, label)
    method_style(name, *, secondary=False) -> dict   # kwargs for Axes.plot
    method_label(name) -> str          # legend name, with the target when it is not softmax attention
    method_family(name) -> str         # the group a method is drawn with (FAMILIES; FAMILY_FILES: file names)
    group_by_family(methods) -> dict   # family -> its methods, in FAMILIES order
    panel_groups(methods, *, limit=MAX_LINES) -> dict   # title -> at most `limit` methods, by family or given groups
    panel_lines(ax) -> list            # the labelled lines and markers of a panel (what its legend would hold)
    MAX_LINES, BUDGET_LABEL            # at most 10 lines to a panel; the x label of every budget axis
    DTYPE_LINESTYLES                   # {"float64": "-", "float32": ":"}
    method_curve(ax, curve, method, *, x="num_features", center="median", band=("q25", "q75"),
                 dtype_column="dtype", dtypes=("float64", "float32"), secondary=False)
    error_panel(ax, panel, methods, num_features, *, secondary=lambda method: False)   # curves against d, log axes
    share_ylimits(*axes_grids)         # the same y-limits per panel across figures
    tidy_log_axis(ax, *, decades=1.0)  # a log y axis of at least one decade, labelled at its decades only
    figure_legend(fig, axes, *, ncol=4)   # one legend below the panels, every method once
    style()                            # context manager: the house rc settings
    figure(nrows=1, ncols=1, *, panel_size=(3.2, 2.6), **kwargs) -> (Figure, axes)
    save_figure(fig, path_without_suffix, *, dpi=150, formats=("png", "pdf")) -> list[Path]

Every registered method name has a fixed colour and marker (so a method looks the
same in every figure); unknown names (registered or plugin methods) get a deterministic
fallback colour. The styles and the family tuples are data of their own
(:mod:`approxlab.method_styles`), re-exported here. The matplotlib backend is Agg (no display
needed); importing this module selects it unless a backend was already chosen explicitly by the caller.

A study draws its method curves (x = the budget ``d``, y = an error statistic with a band)
through :func:`method_curve` from a table of per-point statistics, one figure per group of
methods, and calls :func:`share_ylimits` so a companion figure can be read against the main one.
"""

from __future__ import annotations

import hashlib
import io
import pathlib

import matplotlib
import numpy as np

matplotlib.use("Agg", force=False)

import matplotlib.pyplot as plt  # noqa: E402

from ._io import atomic_write_bytes  # noqa: E402
from .method_styles import (ATTENTION_POLICIES, FALLBACK_COLORS, FALLBACK_MARKERS, FAMILIES,  # noqa: E402
                            FAMILY_FILES, GEOMETRY_POLICIES, METHOD_STYLES, SPARSE_PREFILL)

__all__ = ["METHOD_STYLES", "method_style", "method_label", "method_family", "group_by_family", "FAMILIES",
           "FAMILY_FILES", "MAX_LINES", "BUDGET_LABEL", "panel_groups", "panel_lines", "ATTENTION_POLICIES",
           "GEOMETRY_POLICIES", "SPARSE_PREFILL", "DTYPE_LINESTYLES", "method_curve", "error_panel", "share_ylimits",
           "tidy_log_axis", "figure_legend", "style", "figure", "save_figure", "RC_PARAMS"]
# METHOD_STYLES and the family tuples (ATTENTION_POLICIES, GEOMETRY_POLICIES, SPARSE_PREFILL, FAMILY_FILES,
# FAMILIES) are defined in approxlab.method_styles and re-exported here

RC_PARAMS = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "legend.fontsize": 7,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.4,
    "lines.markersize": 4,
    "savefig.bbox": "tight",
    "pdf.fonttype": 42,
}
"""matplotlib rc settings applied inside :func:`figure` and :func:`save_figure`."""



def method_style(name: str, *, secondary: bool = False) -> dict:
    """Keyword arguments for ``Axes.plot`` that draw method ``name`` in the house style.

    Parameters
    ----------
    name : str
        A registry name (:func:`approxlab.methods.available`); other names get a
        deterministic fallback style (derived from a hash of the name).
    secondary : bool
        Draw as a secondary curve: thinner, dashed, translucent, smaller markers.

    Returns
    -------
    dict
        ``color``, ``marker``, ``linestyle``, ``label``, ``linewidth``, ``markersize``,
        ``alpha``, ``zorder`` (and ``markerfacecolor`` for a method drawn with hollow markers).

    Examples
    --------
    >>> from approxlab.plotting import method_style
    >>> style = method_style("nystromformer")
    >>> style["color"], style["marker"], style["label"]
    ('#0072B2', 's', 'Nystromformer')
    >>> method_style("nystromformer", secondary=True)["linestyle"]
    '--'
    >>> method_style("my-method") == method_style("my-method")  # a fallback, the same in every figure
    True
    """
    if not isinstance(name, str):
        raise TypeError(f"`name` must be a method name (str); got {type(name).__name__}.")
    if name in METHOD_STYLES:
        style = dict(METHOD_STYLES[name])
    else:
        index = int(hashlib.sha256(name.encode()).hexdigest(), 16)
        style = {
            "color": FALLBACK_COLORS[index % len(FALLBACK_COLORS)],
            "marker": FALLBACK_MARKERS[index % len(FALLBACK_MARKERS)],
            "linestyle": "-",
            "label": name,
        }
    if secondary:
        style.update(linestyle="--", linewidth=0.9, markersize=3, alpha=0.75, zorder=2)
    else:
        style.update(linewidth=1.6, markersize=4.5, alpha=1.0, zorder=3)
    return style


def method_label(name: str) -> str:
    """The legend name of method ``name``: its house label, followed by its target when that is not
    softmax attention (``"YOSO (target: YOSO-E)"``), from the registry; a name that is not
    registered (a plugin not loaded) is shown as it is.

    Examples
    --------
    >>> from approxlab.plotting import method_label
    >>> method_label("performer")
    'Performer'
    >>> method_label("yoso")
    'YOSO (target: YOSO-E)'
    >>> method_label("my-method")
    'my-method'
    """
    from .methods import available, get
    from .methods._base import TARGET_NAMES

    label = method_style(name)["label"]
    if name in available() and get(name).target != "softmax":
        label += f" (target: {TARGET_NAMES[get(name).target]})"
    return label


def method_family(name: str) -> str:
    """The family method ``name`` is drawn with (one of :data:`FAMILIES`), from its registration: the cache
    policies (ranking by attention, :data:`ATTENTION_POLICIES`; by position or key geometry,
    :data:`GEOMETRY_POLICIES`; a user's), sparse selection, the Nystrom family (``causal="mask-renormalise"``: no
    decoder of its own) and the other causal forms (low-rank, kernel, sampling); ``"other"`` when not registered.

    Examples
    --------
    >>> from approxlab.plotting import method_family
    >>> method_family("h2o"), method_family("topk"), method_family("performer"), method_family("my-method")
    ('cache: attention scores', 'sparse selection', 'low-rank, kernel, sampling', 'other')
    """
    from .methods import available, get

    if name not in available():
        return "other"
    spec = get(name)
    if spec.causal == "only" and spec.score is None and name in SPARSE_PREFILL:
        return "sparse selection"
    if spec.causal == "only":
        return ("cache: attention scores" if name in ATTENTION_POLICIES
                else "cache: position, keys" if name in GEOMETRY_POLICIES else "cache: other policies")
    if spec.causal == "mask-renormalise":
        return "Nyström family (not decoder)"
    if spec.features.startswith(("kept keys", "the most keys", "token budget")):
        return "sparse selection"
    return "low-rank, kernel, sampling"


def group_by_family(methods) -> dict:
    """Family -> the ``methods`` in it (in their order), for the families of :data:`FAMILIES` that hold one, in
    that order.

    Examples
    --------
    >>> from approxlab.plotting import group_by_family
    >>> groups = group_by_family(["performer", "h2o", "topk", "snapkv"])
    >>> groups["cache: attention scores"], list(groups)[1:]
    (['h2o', 'snapkv'], ['sparse selection', 'low-rank, kernel, sampling'])
    """
    found = [(m, method_family(m)) for m in methods]
    groups = {name: [m for m, family in found if family == name] for name in FAMILIES}
    return {name: chosen for name, chosen in groups.items() if chosen}


MAX_LINES = 10
"""The most method lines a panel holds: more are split over panels (:func:`panel_groups`)."""

BUDGET_LABEL = "budget d (num_features)"
"""The x label of every axis of the budget: the library's ``num_features``, written d in every figure (a cache
policy's context tokens kept per head, a sketch's features, landmarks or sampled keys)."""


def panel_groups(methods, *, limit: int = MAX_LINES) -> dict:
    """Panel title -> the ``methods`` drawn in it: one panel per family (:func:`group_by_family`), a family of more
    than ``limit`` methods split into parts of at most ``limit`` (``"sparse selection (1 of 2)"``).

    Parameters
    ----------
    methods : sequence of str, or dict
        The methods, grouped by family; or ``{title: methods}``, groups of the caller's own, split the same way.
    limit : int
        The most methods to a panel, ``>= 1`` (leave room for a control drawn in every panel).

    Examples
    --------
    >>> from approxlab.plotting import panel_groups
    >>> panel_groups(["h2o", "snapkv", "tova", "performer"], limit=2)
    {'cache: attention scores (1 of 2)': ['h2o', 'snapkv'], 'cache: attention scores (2 of 2)': ['tova'], \
'low-rank, kernel, sampling': ['performer']}
    >>> panel_groups({"forward": ["a", "b", "c"]}, limit=2)
    {'forward (1 of 2)': ['a', 'b'], 'forward (2 of 2)': ['c']}
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"`limit` must be an integer >= 1; got {limit!r}.")
    panels = {}
    for family, chosen in (methods if isinstance(methods, dict) else group_by_family(methods)).items():
        parts = [chosen[i:i + limit] for i in range(0, len(chosen), limit)]
        for index, part in enumerate(parts):
            panels[family if len(parts) == 1 else f"{family} ({index + 1} of {len(parts)})"] = part
    return panels


def panel_lines(ax) -> list:
    """The labelled artists of panel ``ax`` (lines and scatter points whose label does not start with ``_``):
    what a legend of the panel would hold, so that tests can count a panel's lines and their colours.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from approxlab import plotting
    >>> fig, axes = plotting.figure()
    >>> _ = axes[0, 0].plot([1, 2], [1, 2], **plotting.method_style("performer"))
    >>> _ = axes[0, 0].plot([1, 2], [2, 2], color="grey")   # no label: not counted
    >>> [line.get_label() for line in plotting.panel_lines(axes[0, 0])]
    ['Performer']
    >>> plt.close(fig)
    """
    return [artist for artist in [*ax.get_lines(), *ax.collections]
            if not str(artist.get_label()).startswith("_")]


DTYPE_LINESTYLES = {"float64": "-", "float32": ":"}
"""Line style of each precision in a method's curves (the first precision present gets the band)."""


def method_curve(ax, curve, method: str, *, x: str = "num_features", center: str = "median",
                 band=("q25", "q75"), dtype_column: str = "dtype", dtypes=("float64", "float32"),
                 secondary: bool = False) -> None:
    """Draw one method's error curves on ``ax`` from a table of per-point statistics.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    curve : pandas.DataFrame
        One row per (precision, x) of ``method``: columns ``x``, ``center``, ``band`` and
        ``dtype_column`` (absent: one precision).
    method : str
        The method: its colour and marker (:func:`method_style`) and legend label
        (:func:`method_label`).
    x, center : str
        The columns of the x and y values.
    band : (str, str) or None
        The columns of the band's lower and upper edges (e.g. the quartiles), or None.
    dtypes : sequence of str
        Precisions in drawing order; the first present in ``curve`` is the main line (solid, with
        the band and the label); the others are thin lines in :data:`DTYPE_LINESTYLES` with hollow
        markers.
    secondary : bool
        Smaller markers and a thinner line (:func:`method_style`), for methods added beside a
        paper's.

    Notes
    -----
    Points whose ``center`` is not finite (a failed approximation counts as ``inf``) are left out
    of the line and marked by a triangle at the top edge of the panel (hollow for the other
    precisions), so a failure is never hidden off-scale.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> import pandas as pd
    >>> from approxlab import plotting
    >>> curve = pd.DataFrame({"num_features": [16, 32, 16, 32], "median": [0.5, 0.3, 0.6, float("inf")],
    ...                       "q25": [0.4, 0.25, 0.5, 0.5], "q75": [0.6, 0.35, 0.7, 0.7],
    ...                       "dtype": ["float64", "float64", "float32", "float32"]})
    >>> fig, axes = plotting.figure()
    >>> plotting.method_curve(axes[0, 0], curve, "nystromformer")
    >>> float64, float32, failed = axes[0, 0].get_lines()  # float32 failed at d = 32: marked at the top
    >>> float64.get_label(), float32.get_linestyle(), failed.get_marker(), failed.get_xdata().tolist()
    ('Nystromformer', ':', '^', [32])
    >>> plt.close(fig)
    """
    kwargs = method_style(method, secondary=secondary)
    kwargs.update(linestyle="-", alpha=1.0, label=method_label(method))
    present = [d for d in dtypes if d in set(curve[dtype_column])] if dtype_column in curve else list(dtypes[:1])
    for index, dtype in enumerate(present):
        rows = curve if dtype_column not in curve else curve[curve[dtype_column] == dtype]
        finite = rows[np.isfinite(rows[center])]
        if index == 0:
            ax.plot(finite[x], finite[center], **{**kwargs, "linestyle": DTYPE_LINESTYLES.get(dtype, "-")})
            if band is not None:
                edges = finite[np.isfinite(finite[band[1]])]
                ax.fill_between(edges[x], edges[band[0]], edges[band[1]], color=kwargs["color"], alpha=0.15,
                                linewidth=0)
        else:
            ax.plot(finite[x], finite[center], color=kwargs["color"], linestyle=DTYPE_LINESTYLES.get(dtype, "--"),
                    linewidth=1.0, marker=kwargs["marker"], markersize=2.5, markerfacecolor="none")
        failed = rows[~np.isfinite(rows[center])]
        if len(failed):  # off the range: marked at the top edge (hollow for the other precisions)
            ax.plot(failed[x], [1.0] * len(failed), transform=ax.get_xaxis_transform(), clip_on=False,
                    marker="^", linestyle="none", color=kwargs["color"], markersize=6,
                    markerfacecolor=kwargs["color"] if index == 0 else "none")


def error_panel(ax, panel, methods, num_features, *, secondary=lambda method: False) -> None:
    """One panel of error curves against ``d``: each of ``methods`` by :func:`method_curve` from the rows of
    ``panel`` (a ``method`` column, the statistics of :func:`method_curve`), log-log axes, ``d`` ticks at
    ``num_features``; ``secondary(method)`` thins a method's line. A panel with nothing finite and positive
    (a partial or failed run) gets y-limits 1e-3..1, so its log axis can still be drawn.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> import pandas as pd
    >>> from approxlab import plotting
    >>> rows = pd.DataFrame({"method": "skyformer", "num_features": [16, 64], "median": [1.0, 0.5],
    ...                      "q25": [0.9, 0.4], "q75": [1.1, 0.6]})
    >>> fig, axes = plotting.figure()
    >>> plotting.error_panel(axes[0, 0], rows, ["skyformer"], [16, 64])
    >>> axes[0, 0].get_xscale(), axes[0, 0].get_yscale()
    ('log', 'log')
    >>> plt.close(fig)
    """
    from matplotlib.ticker import NullLocator

    for method in methods:
        method_curve(ax, panel[panel["method"] == method], method, secondary=secondary(method))
    ax.set_xscale("log", base=2)
    drawn = panel["median"][panel["method"].isin(methods)]  # the curves of this panel, not the others'
    if not (np.isfinite(drawn) & (drawn > 0)).any():
        ax.set_ylim(1e-3, 1.0)
    ax.set_yscale("log")
    ax.set_xticks(num_features, [str(d) for d in num_features])
    ax.xaxis.set_minor_locator(NullLocator())


def share_ylimits(*axes_grids) -> None:
    """Give the panels at the same position of every grid the same y-limits: the union of their own.

    Parameters
    ----------
    *axes_grids : arrays of Axes
        Grids of the same shape (e.g. the ``axes`` of a main figure and of its companion), drawn
        already (their autoscaled limits cover their data).

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from approxlab import plotting
    >>> fig1, axes1 = plotting.figure()
    >>> fig2, axes2 = plotting.figure()
    >>> _ = axes1[0, 0].set_ylim(0.0, 1.0)
    >>> _ = axes2[0, 0].set_ylim(0.5, 2.0)
    >>> plotting.share_ylimits(axes1, axes2)
    >>> [float(limit) for limit in axes1[0, 0].get_ylim() + axes2[0, 0].get_ylim()]
    [0.0, 2.0, 0.0, 2.0]
    >>> plt.close(fig1), plt.close(fig2)
    (None, None)
    """
    grids = [np.asarray(grid, dtype=object) for grid in axes_grids]
    if not grids:
        return
    shape = grids[0].shape
    if any(grid.shape != shape for grid in grids):
        raise ValueError(f"`axes_grids` must have one shape; got {[grid.shape for grid in grids]}.")
    for index in np.ndindex(shape):
        limits = [grid[index].get_ylim() for grid in grids]
        low, high = min(lim[0] for lim in limits), max(lim[1] for lim in limits)
        for grid in grids:
            grid[index].set_ylim(low, high)


def tidy_log_axis(ax, *, decades: float = 1.0) -> None:
    """Widen the log y axis of ``ax`` about its geometric centre to span at least ``decades`` decades, and label
    its major ticks only: a panel whose curves span less than a decade otherwise gets a label at every minor tick
    (``2x10^0, 3x10^0, ...``) crowding its axis. A linear axis is left as it is.

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from approxlab import plotting
    >>> fig, axes = plotting.figure()
    >>> axes[0, 0].set_yscale("log")
    >>> _ = axes[0, 0].set_ylim(2.0, 5.0)
    >>> plotting.tidy_log_axis(axes[0, 0])
    >>> low, high = axes[0, 0].get_ylim()
    >>> round(float(high / low), 6)
    10.0
    >>> plt.close(fig)
    """
    from matplotlib.ticker import NullFormatter

    if ax.get_yscale() != "log":
        return
    low, high = ax.get_ylim()
    span = np.log10(high / low) if low > 0 and high > 0 else np.inf
    if span < decades:
        centre, half = (np.log10(low) + np.log10(high)) / 2, decades / 2
        ax.set_ylim(float(10 ** (centre - half)), float(10 ** (centre + half)))
    ax.yaxis.set_minor_formatter(NullFormatter())


def figure_legend(fig, axes, *, ncol: int = 4):
    """One legend below the panels with every labelled line of ``axes`` once (first label wins).

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from approxlab import plotting
    >>> fig, axes = plotting.figure(1, 2)
    >>> for ax in axes[0]:
    ...     _ = ax.plot([1, 2], [1, 2], **plotting.method_style("performer"))
    >>> legend = plotting.figure_legend(fig, axes)
    >>> [text.get_text() for text in legend.get_texts()]  # once, though drawn in both panels
    ['Performer']
    >>> plt.close(fig)
    """
    handles = {}
    for ax in np.asarray(axes, dtype=object).ravel():
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    return fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                      ncol=max(1, min(len(handles), ncol)), frameon=False)


def style():
    """Context manager applying :data:`RC_PARAMS`; draw a whole figure inside it::

        with plotting.style():
            fig, axes = plotting.figure(1, 2)
            ...
            plotting.save_figure(fig, out / "name")

    (Text sizes are fixed when an artist is created, so titles and labels must be made
    inside the context.) Global matplotlib settings are left untouched.

    Examples
    --------
    >>> import matplotlib
    >>> from approxlab import plotting
    >>> with plotting.style():
    ...     print(matplotlib.rcParams["font.size"])
    8.0
    """
    return plt.rc_context(RC_PARAMS)


def figure(nrows: int = 1, ncols: int = 1, *, panel_size=(3.2, 2.6), **kwargs):
    """A new figure in the house style: ``(fig, axes)`` as from ``plt.subplots(squeeze=False)``.

    Parameters
    ----------
    nrows, ncols : int
        Panel grid.
    panel_size : (float, float)
        Width and height of one panel, inches.
    **kwargs
        Passed to :func:`matplotlib.pyplot.subplots` (e.g. ``sharex``).

    Examples
    --------
    >>> import matplotlib.pyplot as plt
    >>> from approxlab import plotting
    >>> fig, axes = plotting.figure(2, 3)
    >>> axes.shape, fig.get_size_inches().round(1).tolist()
    ((2, 3), [9.6, 5.2])
    >>> plt.close(fig)
    """
    with plt.rc_context(RC_PARAMS):
        kwargs.setdefault("figsize", (panel_size[0] * ncols, panel_size[1] * nrows))
        kwargs.setdefault("squeeze", False)
        kwargs.setdefault("layout", "constrained")
        fig, axes = plt.subplots(nrows, ncols, **kwargs)
    return fig, axes


def save_figure(fig, path_without_suffix, *, dpi: int = 150, formats=("png", "pdf"), close: bool = True):
    """Save ``fig`` as ``<path>.png`` and ``<path>.pdf``, each written atomically.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    path_without_suffix : str or os.PathLike
        E.g. ``figures/figure1/figure1``; a suffix among ``formats`` is stripped.
    dpi : int
        Resolution of raster formats.
    formats : sequence of str
        File formats (matplotlib names).
    close : bool
        Close the figure afterwards (frees memory in long sweeps).

    Returns
    -------
    list of pathlib.Path
        The written files.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from approxlab import plotting
    >>> fig, axes = plotting.figure()
    >>> _ = axes[0, 0].plot([1, 2, 3], [3, 1, 2])
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     written = plotting.save_figure(fig, pathlib.Path(folder) / "curve", formats=("png",))
    ...     print([path.name for path in written])  # and the figure is closed
    ['curve.png']
    """
    base = pathlib.Path(path_without_suffix)
    if base.suffix.lstrip(".") in formats:
        base = base.with_suffix("")
    written = []
    freeze = close and fig.get_layout_engine() is not None
    with plt.rc_context(RC_PARAMS):
        for fmt in formats:
            buffer = io.BytesIO()
            # Fixed metadata so re-rendering identical data gives identical PDFs.
            metadata = {"CreationDate": None} if fmt == "pdf" else ({"Software": None} if fmt == "png" else None)
            fig.savefig(buffer, format=fmt, dpi=dpi, metadata=metadata)
            written.append(atomic_write_bytes(base.with_name(f"{base.name}.{fmt}"), buffer.getvalue()))
            if freeze:  # the first format's layout serves the others (the figure is closed after): laid out once
                fig.set_layout_engine("none")
                freeze = False
    if close:
        plt.close(fig)
    return written
