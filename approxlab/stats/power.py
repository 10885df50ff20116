"""The power of a t-test with n units, and the units a given power needs."""

from __future__ import annotations

import math

from scipy import stats as _scipy_stats

from ._checks import ALTERNATIVES, check_effect, integer, probability

__all__ = ['ALTERNATIVES', 't_test_power', 't_test_sample_size']

def t_test_power(n: int, *, difference: float, sd: float, alpha: float = 0.05,
                 alternative: str = "two-sided") -> float:
    r"""Power of a one-sample (or paired) t-test with ``n`` units to detect a mean ``difference``.

    Parameters
    ----------
    n : int
        Number of independent units (``>= 2``): e.g. training seeds, each giving one ratio.
    difference : float
        The true mean minus the tested value: for "the mean ratio
        :math:`\tau/\tau_{softmax}` exceeds ``r0``", ``difference = mean ratio - r0``; for a paired
        comparison, the mean of the per-unit differences.
    sd : float
        Standard deviation of one unit's value (of the ratios, or of the paired differences).
    alpha : float
        Significance level.
    alternative : {"two-sided", "greater", "less"}
        ``"greater"``: the claim is mean > value.

    Returns
    -------
    float
        :math:`P(\text{reject})` under the noncentral :math:`t_{n-1}(\delta\sqrt n)` law of the
        statistic, :math:`\delta = \text{difference}/\text{sd}` (Cohen 1988, Ch. 2).

    Examples
    --------
    >>> from approxlab.stats import t_test_power
    >>> round(t_test_power(20, difference=0.5, sd=1.0), 3)
    0.565
    >>> round(t_test_power(20, difference=0.5, sd=1.0, alternative="greater"), 3)
    0.695
    """
    n = integer(n, "n", low=2, why=" (a t-test needs a variance)")
    check_effect(difference, sd, alpha, alternative)
    df, noncentrality = n - 1, difference / sd * math.sqrt(n)
    law = _scipy_stats.nct(df, noncentrality)
    if alternative == "two-sided":
        critical = _scipy_stats.t.ppf(1 - alpha / 2, df)
        return float(law.sf(critical) + law.cdf(-critical))
    critical = _scipy_stats.t.ppf(1 - alpha, df)
    return float(law.sf(critical) if alternative == "greater" else law.cdf(-critical))


def t_test_sample_size(*, difference: float, sd: float, power: float = 0.8, alpha: float = 0.05,
                       alternative: str = "two-sided", max_n: int = 1_000_000) -> int:
    """The smallest ``n >= 2`` whose :func:`t_test_power` reaches ``power``, searched up to ``max_n``.

    ``difference``, ``sd``, ``alpha`` and ``alternative`` as in :func:`t_test_power`; ``power`` in
    (0, 1); ``max_n`` an integer ``>= 2`` (the smallest t-test).

    Raises
    ------
    TypeError, ValueError
        Bad arguments (``max_n='100'`` and ``max_n=1`` included), or ``power`` not reached by
        ``max_n`` units (e.g. a difference of 0, or of the wrong sign for a one-sided alternative).

    Examples
    --------
    >>> from approxlab.stats import t_test_sample_size, t_test_power
    >>> n = t_test_sample_size(difference=0.5, sd=1.0, power=0.8)
    >>> n
    34
    >>> t_test_power(n - 1, difference=0.5, sd=1.0) < 0.8 <= t_test_power(n, difference=0.5, sd=1.0)
    True
    """
    check_effect(difference, sd, alpha, alternative)
    power = probability(power, "power")
    max_n = integer(max_n, "max_n", low=2, why=" (the smallest t-test has 2 units)")
    low, high = 2, 2
    while t_test_power(high, difference=difference, sd=sd, alpha=alpha, alternative=alternative) < power:
        if high >= max_n:
            raise ValueError(f"`power` {power} is not reached with up to max_n={max_n} units for difference="
                             f"{difference}, sd={sd}, alternative={alternative!r}.")
        low, high = high, min(2 * high, max_n)
    while low < high:  # power grows with n where it is reachable: bisect in (low, high]
        middle = (low + high) // 2
        reached = t_test_power(middle, difference=difference, sd=sd, alpha=alpha, alternative=alternative) >= power
        low, high = (low, middle) if reached else (middle + 1, high)
    return high


