"""The kinds of verdict the perplexity study's "In short" words (:mod:`.premise_summary` writes it from the
verdicts alone by fixed rules, so that it says no more than they do).

A verdict is one of three kinds: the claim's own "reproduced" label (the premise holds there), its "not
reproduced" label (it fails there), or anything else (inconclusive, or no verdict: too few units, a calibration
that fails, or the exact model failing the retrieval gate), which is undecided and said so, never counted for or
against.
"""

from __future__ import annotations

__all__ = ["HOLDS", "FAILS", "UNDECIDED", "kind"]

HOLDS, FAILS, UNDECIDED = "holds", "fails", "undecided"


def kind(claim, verdict: str) -> str:
    """``"holds"``, ``"fails"`` or ``"undecided"``: the verdict in ``claim``'s labels.

    Examples
    --------
    >>> from approxlab.studies.perplexity.claims import P1
    >>> from approxlab.studies.perplexity.in_short import kind
    >>> kind(P1, "ranks the losses"), kind(P1, "does not rank the losses"), kind(P1, "no verdict: coverage 62.0% < 90%")
    ('holds', 'fails', 'undecided')
    """
    labels = claim.labels or {}
    if verdict == labels.get("reproduced"):
        return HOLDS
    if verdict == labels.get("not reproduced"):
        return FAILS
    return UNDECIDED
