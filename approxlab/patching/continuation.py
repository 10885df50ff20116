r"""What one continuation on an exact prefill gives back (:meth:`~approxlab.patching.ExactPrefill.continue_with`):
its token losses and hits, the greedy answer, each replaced layer's errors and its time, as one record.

For a continuation :math:`c_0, \dots, c_{t-1}` after a context :math:`x_{<n_c}`, the record holds
:math:`-\log p(c_j \mid x_{<n_c}, c_{<j})` per token (teacher-forced), whether :math:`c_j` was the most likely next
token, the last ``answer_length`` tokens generated greedily on the compressed cache, and the errors of each replaced
layer's output against exact attention on the inputs of :data:`ERROR_INPUTS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["Continuation", "ERROR_INPUTS"]

ERROR_INPUTS = ("clean", "patched")
r"""The inputs a layer's error is measured on: ``"clean"``, the unpatched model's (context and continuation run
exactly, the policy applied to their q, k, v); ``"patched"``, the patched run's own, which drift from the
unpatched ones after the first compressed layer."""


@dataclass
class Continuation:
    r"""One policy and budget on a shared prefill (:meth:`ExactPrefill.continue_with`), or the unpatched model.

    Attributes
    ----------
    method : str
        The policy (``"unpatched"`` for :meth:`ExactPrefill.unpatched`).
    num_features : int or None
        The budget :math:`b` (``None`` unpatched).
    budgets : dict of int to int
        The budget of each replaced layer (``num_features``, or its PyramidKV share).
    nll : torch.Tensor
        ``(S, t)`` float64: entry :math:`j` is :math:`-\log p(c_j \mid x_{<n_c},\, c_{<j})`, the continuation's
        token :math:`j` predicted from everything before it; entry 0 is predicted from the context alone (the
        exact prefill's, the same for every policy).
    hits : torch.Tensor
        ``(S, t)`` bool: :math:`c_j` is the most likely next token there (teacher-forced).
    generated : torch.Tensor
        ``(S, k)`` long: the greedy answer, ``k = answer_length`` tokens generated one by one after the question
        ``c_{<t-k}`` on the compressed cache.
    answer : torch.Tensor
        ``(S, k)`` long: the answer's tokens, the last ``k`` of the continuation.
    errors : dict
        ``{inputs: {measure: float64 (L', S, H)}}`` for ``inputs`` in :data:`ERROR_INPUTS` and ``measure`` in
        :data:`~approxlab.patching.ERROR_MEASURES`, over the continuation's :math:`t` rows of each replaced layer
        (in :attr:`layers` order); empty for the unpatched model.
    layers : tuple of int
    seconds : float
        Wall seconds of the continuation: compression, teacher-forced pass, generation and both errors.
    status : str
        ``"ok"``, or the method's failure on one line (``on_failure="record"``), then ``nll`` is :math:`+\infty`.

    Examples
    --------
    Built by hand (:meth:`ExactPrefill.continue_with` builds it from a model): a continuation of 4 tokens whose
    last 2 are the answer, one replaced layer of 2 heads.

    >>> import torch
    >>> from approxlab.patching import Continuation
    >>> nll = torch.tensor([[2.0, 1.0, 0.5, 0.25]], dtype=torch.float64)
    >>> answer = torch.tensor([[7, 9]])
    >>> errors = {"clean": {name: torch.full((1, 1, 2), 0.1, dtype=torch.float64)
    ...                     for name in ("spectral", "frobenius", "worst_query")}}
    >>> found = Continuation("snapkv", 16, nll, nll < 1.0, torch.tensor([[7, 8]]), answer, layers=(1,),
    ...                      budgets={1: 16}, errors=errors)
    >>> found.correct, found.answer_logprob()                    # 8 is not 9; -(0.5 + 0.25)
    (tensor([False]), tensor([-0.7500], dtype=torch.float64))
    >>> [(row["inputs"], row["layer"], row["head"]) for row in found.error_rows()]
    [('clean', 1, 0), ('clean', 1, 1)]
    """

    method: str
    num_features: int | None
    nll: torch.Tensor
    hits: torch.Tensor
    generated: torch.Tensor
    answer: torch.Tensor
    layers: tuple = ()
    budgets: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict, repr=False)
    seconds: float = 0.0
    status: str = "ok"

    @property
    def correct(self) -> torch.Tensor:
        """``(S,)`` bool: the greedy answer equals the answer (exact match); all True without an answer."""
        return (self.generated == self.answer).all(dim=-1)

    def answer_logprob(self) -> torch.Tensor:
        """``(S,)`` float64: the answer tokens' summed log-probability, teacher-forced."""
        k = self.answer.shape[-1]
        return -self.nll[:, self.nll.shape[-1] - k:].sum(dim=-1)

    def error_rows(self) -> list[dict]:
        """One row per inputs, replaced layer, sequence and head: ``inputs``, ``layer``, ``sequence``, ``head`` and
        the measures of :data:`~approxlab.patching.ERROR_MEASURES`."""
        rows = []
        for inputs, measures in self.errors.items():
            layers, sequences, heads = measures["spectral"].shape
            for index in range(layers):
                for s in range(sequences):
                    rows.extend({"inputs": inputs, "layer": self.layers[index], "sequence": s, "head": h,
                                 **{name: float(value[index, s, h]) for name, value in measures.items()}}
                                for h in range(heads))
        return rows
