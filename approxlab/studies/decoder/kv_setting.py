"""The decoder study's KV-cache setting in its grid: its declared values, options, defaults at other lengths and key.

Each window's first ``kv_context + kv_continuation`` tokens: a method compresses the context's keys and values to
a budget (``num_features``: the context tokens a cache policy keeps, a per-query method's own budget), and the
error is measured on the continuation's rows. :mod:`.grid` puts :data:`KV_FULL` and :data:`KV_QUICK` in the
study's full and ``--quick`` grids and re-exports every name here.

Public API::

    KV_FULL, KV_QUICK, KV_KEY
    KV_OPTIONS                       # --kv-context, --kv-continuation, --kv-budgets
    KV_RATIOS                        # --kv-ratios: the budgets as kvpress's compression ratios
    kv_defaults(base, n, *, context=None, continuation=None, budgets=None) -> dict
    ratio_budgets(ratios, context) -> dict[int, float]
"""

from __future__ import annotations

from .. import checks
from .. import options as shared
from ..declaration import Option
from ..option_types import ratio_list

__all__ = ["KV_FULL", "KV_QUICK", "KV_KEY", "KV_OPTIONS", "KV_RATIOS", "kv_defaults", "ratio_budgets", "ratio_list"]

KV_FULL = {"kv_context": 1536, "kv_continuation": 512, "kv_budgets": [16, 64, 256, 1024]}
"""The setting in the full grid: a context of 1536 tokens and a continuation of 512 (the first 2048 tokens of each
window), at budgets 16 to 1024."""

KV_QUICK = {"kv_context": 192, "kv_continuation": 64, "kv_budgets": [16, 64]}
"""The setting in the ``--quick`` grid."""

KV_KEY = ("condition", "layer", "window", "method")

KV_OPTIONS = (
    Option(("--kv-context",), "kv_context", "KV-cache setting: context tokens n_c that a method compresses "
           "(when the default context plus continuation exceed max(n): 3/4 of the smallest n)", type=shared.positive_int, metavar="TOKENS"),
    Option(("--kv-continuation",), "kv_continuation", "KV-cache setting: continuation tokens after the context, "
           "the rows whose error is measured (with a context of 3/4 of the smallest n: the rest of it); n_c plus "
           "this is at most max(n)", type=shared.positive_int, metavar="TOKENS"),
    Option(("--kv-budgets",), "kv_budgets", "KV-cache setting: budgets (num_features: context tokens kept by a "
           "cache policy, a per-query method's own budget), comma-separated (with a scaled context: those below "
           "the default, else 1/4 and 1/2 of it)",
           type=shared.int_list, nargs="+", action=shared.Flatten, metavar="B"),
)
"""The options of the KV-cache setting."""


def kv_defaults(base: dict, n, *, context=None, continuation=None, budgets=None) -> dict:
    """The KV-cache setting's context, continuation and budgets for the lengths ``n``: those given, and for the
    others ``base``'s when its window (context + continuation) fits in ``max(n)``, else values that follow the
    smallest length n_min: the context 3/4 of n_min, the continuation the rest, and the budgets of ``base`` below
    the context (else a quarter and a half of it).

    Examples
    --------
    >>> kv_defaults(KV_FULL, [768, 4096])
    {'kv_context': 1536, 'kv_continuation': 512, 'kv_budgets': [16, 64, 256, 1024]}
    >>> kv_defaults(KV_FULL, [16])
    {'kv_context': 12, 'kv_continuation': 4, 'kv_budgets': [3, 6]}
    >>> kv_defaults(KV_FULL, [128, 512])
    {'kv_context': 96, 'kv_continuation': 32, 'kv_budgets': [16, 64]}
    """
    fits = base["kv_context"] + base["kv_continuation"] <= max(n)
    window = min(n)
    if context is None:
        context = base["kv_context"] if fits else 3 * window // 4
    if continuation is None:
        continuation = base["kv_continuation"] if fits else max(1, window - context)
    if budgets is None:
        budgets = list(base["kv_budgets"]) if fits else ([b for b in base["kv_budgets"] if b < context]
                                                         or sorted({max(1, context // 4), max(1, context // 2)}))
    return {"kv_context": context, "kv_continuation": continuation, "kv_budgets": budgets}


KV_RATIOS = Option(("--kv-ratios",), "kv_ratios", "KV-cache setting: the budgets as compression ratios, kvpress's "
                   "way (the fraction of the context removed, in [0, 1)), instead of --kv-budgets: each ratio r keeps "
                   "max(1, int(n_c * (1 - r))) context tokens, as kvpress rounds it, and kv_cache.csv carries both "
                   "(default: none, the budgets of --kv-budgets)", type=ratio_list, nargs="+", action=shared.Flatten,
                   metavar="R")
"""The KV-cache setting's budgets stated as compression ratios (:func:`ratio_budgets`)."""


def ratio_budgets(ratios, context: int) -> dict[int, float]:
    """``{budget: ratio}``: each compression ratio's kept count of a context of ``context`` tokens
    (:func:`approxlab.cache.kept_count`, kvpress's rounding), in increasing budget.

    Raises
    ------
    UsageError
        Two ratios that keep the same count of this context.

    Examples
    --------
    >>> ratio_budgets([0.875, 0.5, 0.75], 1536)
    {192: 0.875, 384: 0.75, 768: 0.5}
    """
    return checks.ratio_budgets(ratios, context, "--kv-ratios")
