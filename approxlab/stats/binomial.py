r"""The exact (Clopper-Pearson) confidence interval of a binomial proportion.

With :math:`x` successes in :math:`n` trials the two-sided level-:math:`\lambda` interval is
:math:`[B(\alpha/2;\, x,\, n - x + 1),\ B(1 - \alpha/2;\, x + 1,\, n - x)]`, :math:`\alpha = 1 - \lambda` and
:math:`B(q; a, b)` the :math:`q` quantile of the Beta(:math:`a, b`) distribution (the lower bound 0 at
:math:`x = 0`, the upper 1 at :math:`x = n`). It covers the true proportion with probability at least
:math:`\lambda` for every proportion (it inverts two one-sided binomial tests), so a gate on its lower bound
errs on the side of refusing.

References
----------
.. [1] C. J. Clopper and E. S. Pearson, "The use of confidence or fiducial limits illustrated in the case of the
   binomial", *Biometrika* 26 (1934), 404--413.
"""

from __future__ import annotations

from scipy import stats as _scipy_stats

from ._checks import integer, probability

__all__ = ["clopper_pearson"]


def clopper_pearson(successes: int, trials: int, *, level: float = 0.95) -> tuple[float, float]:
    r"""The exact two-sided confidence interval ``(low, high)`` of a proportion (the module docstring's formula).

    Parameters
    ----------
    successes : int
        :math:`x`, ``0 <= x <= trials``.
    trials : int
        :math:`n \ge 1`.
    level : float
        :math:`\lambda` in ``(0, 1)``.

    Raises
    ------
    ValueError
        ``trials`` not an integer >= 1, ``successes`` not an integer in ``[0, trials]``, ``level`` not in (0, 1).

    Examples
    --------
    6 of 6 bound the proportion below by :math:`0.025^{1/6}`; 28 of 30 reach a lower bound of 0.78:

    >>> from approxlab.stats.binomial import clopper_pearson
    >>> [round(b, 3) for b in clopper_pearson(6, 6)]
    [0.541, 1.0]
    >>> [round(b, 3) for b in clopper_pearson(28, 30)]
    [0.779, 0.992]
    """
    trials = integer(trials, "trials", low=1)
    successes = integer(successes, "successes", low=0)
    if successes > trials:
        raise ValueError(f"`successes` must be an integer in [0, trials] = [0, {trials}]; got {successes}.")
    level = probability(level, "level")
    alpha = 1 - level
    low = 0.0 if successes == 0 else float(_scipy_stats.beta.ppf(alpha / 2, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(_scipy_stats.beta.ppf(1 - alpha / 2, successes + 1,
                                                                        trials - successes))
    return low, high
