r"""Skyformer's instability score and the tiny encoder it is measured on (Appendix F, Table 3).

Skyformer argues that kernelized attention (and Skyformer, its Nyström approximation)
trains more stably than softmax attention, because a parameter change moves the output
less. Appendix F makes this a number, the *instability score* of training step ``i``,

.. math::

    \tau_i = \frac{\|f(x_i, W_i) - f(x_i, W_{i-1})\|_F^2}{\|W_i - W_{i-1}\|_F^2},
    \qquad i = 1, \dots, 20,

where :math:`f` gives the embedding after the two encoder layers, :math:`x_i` is the
``i``-th batch, :math:`W_0` the initial and :math:`W_i` the parameters after step ``i``.
Table 3 reports, per task, the mean over the 20 steps of
:math:`\tau_i(\text{method}) / \tau_i(\text{self-attention})`; a ratio below 1 means
the method is more stable than softmax attention.

This module provides

* :func:`instability_score` -- one :math:`\tau_i` from outputs and parameters;
* :func:`instability_trace` -- train a model for a few Adam steps and record every
  :math:`\tau_i` (any model following the small protocol below);
* :func:`instability_ratio` -- the mean over steps of :math:`\tau_i / \tau_i^{\text{ref}}`;
* :class:`TinyEncoder` -- the 2-layer encoder of Skyformer Section 5 (embedding 64,
  feed-forward 128, 2 heads) whose attention is any approxlab method
  (:data:`ATTENTIONS`, padding keys masked), with a mean-pooling classifier, two towers for
  pairs (LRA's Retrieval) or a masked-LM head, and access to each layer's attention output
  (Skyformer Appendix B);
* :func:`train_classifier` and :func:`accuracy` -- Adam to a validation-accuracy plateau or a
  step budget (the trained models of Skyformer's Figure 4).

Model protocol for :func:`instability_trace`: ``model(batch, *, seed) -> (embedding, loss)``
where ``embedding`` is :math:`f(x, W)` and ``seed`` fixes every random draw of the
forward pass, and ``model.embedding_parameters()`` lists the parameters :math:`W` that
:math:`f` depends on.

The model (:class:`TinyEncoder`, :data:`ATTENTIONS`, :data:`TRAINING_OPTIONS`) lives in
:mod:`approxlab.training.model`, the scores and the training loops in
:mod:`approxlab.training.loops`.

References
----------
Chen, Y., Zeng, Q., Ji, H. and Yang, Y. (2021). Skyformer: Remodel self-attention with
Gaussian kernel and Nyström method. NeurIPS. Section 5 (model), Appendix F and Table 3.

Liu, L., Liu, X., Gao, J., Chen, W. and Han, J. (2020). Understanding the difficulty of
training transformers. EMNLP. Figure 4 (output change for a parameter change).

Xiong, Y. et al. (2021). Nyströmformer. AAAI. (The PyTorch LRA code Skyformer trains with:
pre-LayerNorm blocks, learned position embeddings, final LayerNorm, mean pooling.)
"""

from .loops import accuracy, instability_ratio, instability_score, instability_trace, train_classifier
from .model import ATTENTIONS, TRAINING_OPTIONS, TinyEncoder

__all__ = [
    "ATTENTIONS",
    "TRAINING_OPTIONS",
    "instability_score",
    "instability_trace",
    "instability_ratio",
    "accuracy",
    "train_classifier",
    "TinyEncoder",
]
