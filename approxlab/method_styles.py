"""Which colour, marker and group each method is drawn with: data only, for :mod:`approxlab.plotting`.

Every registered method name has a fixed colour and marker in :data:`METHOD_STYLES` (so a method looks
the same in every figure); a name without one (a plugin's method) gets one of :data:`FALLBACK_COLORS`
and :data:`FALLBACK_MARKERS`, chosen by a hash of the name (:func:`approxlab.plotting.method_style`).
The family tuples name the built-in methods of each group that
:func:`approxlab.plotting.method_family` cannot tell from a method's registration alone.
Everything here is re-exported by :mod:`approxlab.plotting`; the module imports nothing.

Public API::

    METHOD_STYLES                      # name -> dict(color, marker, linestyle, label[, markerfacecolor])
    FALLBACK_COLORS, FALLBACK_MARKERS  # for names without a style of their own
    ATTENTION_POLICIES                 # cache policies that rank tokens by attention
    GEOMETRY_POLICIES                  # cache policies that rank tokens by position or by the keys' geometry
    SPARSE_PREFILL                     # the sparse-prefill patterns, drawn with the sparse selection
    FAMILY_FILES, FAMILIES             # the families in drawing order, each with its figure-file suffix
"""

from __future__ import annotations

__all__ = ["METHOD_STYLES", "FALLBACK_COLORS", "FALLBACK_MARKERS", "ATTENTION_POLICIES", "GEOMETRY_POLICIES",
           "SPARSE_PREFILL", "FAMILY_FILES", "FAMILIES"]

# Colours: the four methods of Skyformer Figure 1 get strong, distinct colours
# (Okabe-Ito palette); the extra methods get muted ones.
METHOD_STYLES = {
    "skyformer-softmax": {"color": "#D55E00", "marker": "o", "label": "Skyformer (Eq. 5 on A)"},
    "skyformer": {"color": "#E69F00", "marker": "o", "label": "Skyformer (kernelized)"},
    "nystromformer": {"color": "#0072B2", "marker": "s", "label": "Nystromformer"},
    "performer": {"color": "#009E73", "marker": "^", "label": "Performer"},
    "performer-lra": {"color": "#7FC9A9", "marker": "v", "label": "Performer (as fed by Skyformer's code)"},
    "informer": {"color": "#CC79A7", "marker": "D", "label": "Informer"},
    "yoso": {"color": "#56B4E9", "marker": "v", "label": "YOSO"},
    "yoso-e": {"color": "#8FCBEA", "marker": "<", "label": "YOSO-E"},
    "spectral-shifting": {"color": "#7F6A93", "marker": "P", "label": "Spectral shifting"},
    "nystrom": {"color": "#8C6D31", "marker": "X", "label": "Nystrom (uniform)"},
    "linformer": {"color": "#6B6B6B", "marker": "*", "label": "Linformer"},
    # today's methods (Paul Tol's muted palette): sortLSH and polynomial, the oracles and Quest, the KV-cache policies
    "hyperattention": {"color": "#882255", "marker": "h", "label": "HyperAttention"},
    "kdeformer": {"color": "#332288", "marker": "p", "label": "KDEformer"},
    "polynomial": {"color": "#999933", "marker": "d", "label": "Polynomial (Alman-Song)"},
    "topk": {"color": "#117733", "marker": ">", "label": "Top-k (oracle)"},
    # hollow: where the nucleus holds more than d keys top-p is top-k, and its circles ring top-k's triangles
    "topp": {"color": "#44AA99", "marker": "o", "markerfacecolor": "none", "label": "Top-p (oracle)"},
    "quest": {"color": "#CC6677", "marker": "H", "label": "Quest"},
    "vattention": {"color": "#5D3A9B", "marker": "8", "label": "vAttention"},
    "magicpig": {"color": "#A6761D", "marker": "x", "label": "MagicPIG"},
    # sparse prefill: causal patterns over the whole sequence (no cache scores)
    "minference": {"color": "#DDCC77", "marker": "s", "label": "MInference"},
    "xattention": {"color": "#88CCEE", "marker": "D", "label": "XAttention"},
    "flexprefill": {"color": "#661100", "marker": "v", "label": "FlexPrefill"},
    "duo-attention": {"color": "#AA3377", "marker": "^", "label": "DuoAttention"},
    # The cache policies, drawn in two groups (the perplexity study's panels): filled markers, and colours that
    # differ within each group. Those that rank tokens by attention (Paul Tol's vibrant palette):
    "h2o": {"color": "#CC3311", "marker": "o", "label": "H2O"},
    "observed-attention": {"color": "#EE7733", "marker": "s", "label": "Observed attention"},
    "tova": {"color": "#009988", "marker": "^", "label": "TOVA"},
    "snapkv": {"color": "#0077BB", "marker": "D", "label": "SnapKV"},
    # SnapKV's scores with adaptive budgets: SnapKV's blue family
    "ada-snapkv": {"color": "#33BBEE", "marker": "v", "linestyle": "--", "label": "Ada-SnapKV"},
    "pyramidkv": {"color": "#332288", "marker": "<", "linestyle": ":", "label": "PyramidKV"},
    "expected-attention": {"color": "#EE3377", "marker": "P", "label": "Expected attention"},
    # the output-aware ones: attention weighted by what evicting a value does to the output
    "criticalkv": {"color": "#882255", "marker": "p", "label": "CriticalKV"},
    "caote": {"color": "#DDAA33", "marker": "*", "label": "CAOTE"},
    # those that rank tokens by position or by the keys' geometry (Okabe-Ito's palette)
    "streaming-llm": {"color": "#E69F00", "marker": "h", "label": "StreamingLLM"},
    "random": {"color": "#999999", "marker": "X", "label": "Random (floor)"},
    "knorm": {"color": "#56B4E9", "marker": "s", "label": "Knorm"},
    "keydiff": {"color": "#009E73", "marker": "D", "label": "KeyDiff"},
    "leverage-score": {"color": "#D55E00", "marker": "^", "label": "Leverage scores (keys)"},
    "cur": {"color": "#CC79A7", "marker": "v", "label": "CUR"},
    "compactor": {"color": "#0072B2", "marker": "P", "label": "Compactor"},
    "cap": {"color": "#7F3C8D", "marker": "d", "label": "CAP"},  # not black: the control (exact) is drawn beside it
    "exact": {"color": "#000000", "marker": ".", "label": "Exact"},
    # computes Skyformer's Gaussian-kernel attention CV exactly: not softmax attention (its target is named beside)
    "kernelized": {"color": "#444444", "marker": "+", "label": "Gaussian kernel CV"},
}
for _style in METHOD_STYLES.values():
    _style.setdefault("linestyle", "-")

FALLBACK_COLORS = ["#AA4499", "#BBCC33", "#EE8866", "#77AADD", "#994455", "#004488"]
"""Colours of a name without a style of its own (a plugin's method), picked by a hash of the name; none a built-in's."""
FALLBACK_MARKERS = ["h", "p", "d", "1", "2", "3"]
"""Markers of a name without a style of its own, picked by the same hash."""


ATTENTION_POLICIES = ("h2o", "observed-attention", "tova", "snapkv", "ada-snapkv", "pyramidkv", "expected-attention",
                      "criticalkv", "caote")
"""The built-in cache policies that rank tokens by attention (observed, of a window of queries, or expected; CriticalKV
and CAOTE weight it by what evicting the value does to the output)."""

SPARSE_PREFILL = ("minference", "xattention", "flexprefill", "duo-attention")
"""The built-in sparse-prefill patterns: causal over the whole sequence, drawn with the sparse selection."""

GEOMETRY_POLICIES = ("streaming-llm", "random", "knorm", "keydiff", "leverage-score", "cur", "compactor", "cap")
"""The built-in cache policies that rank tokens by position or by the geometry of the keys (and values)."""

FAMILY_FILES = {"cache: attention scores": "cache-attention", "cache: position, keys": "cache-geometry",
                "cache: other policies": "cache-other", "sparse selection": "sparse",
                "low-rank, kernel, sampling": "low-rank", "Nyström family (not decoder)": "nystrom", "other": "other"}
"""The families of :func:`~approxlab.plotting.method_family` in drawing order, each with the suffix of a figure
file drawn per family."""

FAMILIES = tuple(FAMILY_FILES)
"""The families of :func:`~approxlab.plotting.method_family`, in drawing order."""
