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
  (:data:`ATTENTIONS`, padding keys masked), with a mean-pooling classifier or a masked-LM
  head, and access to each layer's attention output (Skyformer Appendix B);
* :func:`train_classifier` and :func:`accuracy` -- Adam to a validation-accuracy plateau or a
  step budget (the trained models of Skyformer's Figure 4).

Model protocol for :func:`instability_trace`: ``model(batch, *, seed) -> (embedding, loss)``
where ``embedding`` is :math:`f(x, W)` and ``seed`` fixes every random draw of the
forward pass, and ``model.embedding_parameters()`` lists the parameters :math:`W` that
:math:`f` depends on.

References
----------
Chen, Y., Zeng, Q., Ji, H. and Yang, Y. (2021). Skyformer: Remodel self-attention with
Gaussian kernel and Nyström method. NeurIPS. Section 5 (model), Appendix F and Table 3.

Liu, L., Liu, X., Gao, J., Chen, W. and Han, J. (2020). Understanding the difficulty of
training transformers. EMNLP. Figure 4 (output change for a parameter change).

Xiong, Y. et al. (2021). Nyströmformer. AAAI. (The PyTorch LRA code Skyformer trains with:
pre-LayerNorm blocks, learned position embeddings, final LayerNorm, mean pooling.)
"""

from __future__ import annotations

import inspect
import math
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ._validation import as_generator, check_choice, check_int, check_positive_float
from .methods import registry
from .tasks import IGNORE_INDEX

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

ATTENTIONS = {
    "softmax": "exact",
    "kernelized": "kernelized",
    "skyformer": "skyformer",
    "nystromformer": "nystromformer",
    "spectral-shifting": "spectral-shifting",
    "yoso": "yoso-e",
}
"""Attention name in the instability table -> approxlab method that computes it.

``"softmax"`` is exact self-attention (the reference of Table 3); ``"kernelized"`` is exact
kernelized attention :math:`CV` (Skyformer Eq. (3)); ``"yoso"`` is YOSO-E, the expectation of
YOSO's Bernoulli sampling (YOSO-m's hashing has no gradient), trained with the gradient YOSO
trains with: the lower bound of its Eq. (4) (:data:`TRAINING_OPTIONS`)."""

TRAINING_OPTIONS = {"skyformer": {"core": "schulz"}, "yoso": {"gradient": "lower-bound"}}
"""Default method options in training, as in the papers: Skyformer trains with its practical
core, the Schulz iteration on the scaled, regularised core (Skyformer Section 4.4, Lemma 3);
YOSO backpropagates the lower bound of YOSO Eq. (4), not the true derivative of Eq. (3), which
is unbounded as the cosine of query and key tends to 1 (:func:`approxlab.methods.yoso_e.collision_probability`)."""


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors])


def instability_score(output_after, output_before, parameters_after, parameters_before) -> float:
    r"""One instability score :math:`\tau_i` (Skyformer Appendix F).

    Parameters
    ----------
    output_after, output_before : torch.Tensor
        :math:`f(x_i, W_i)` and :math:`f(x_i, W_{i-1})`, same shape (any).
    parameters_after, parameters_before : sequence of torch.Tensor
        :math:`W_i` and :math:`W_{i-1}`, matching lists of tensors.

    Returns
    -------
    float
        :math:`\|f(x_i,W_i)-f(x_i,W_{i-1})\|_F^2 / \|W_i-W_{i-1}\|_F^2`, computed in float64.

    Raises
    ------
    ValueError
        If shapes do not match, or the parameters did not change (the score is 0/0).

    Notes
    -----
    The norm of the parameter change is the Frobenius norm of all listed tensors together
    (the Euclidean norm of the flattened parameter vector).

    References
    ----------
    Skyformer Appendix F (the definition) and Table 3.

    Examples
    --------
    >>> import torch
    >>> from approxlab.training import instability_score
    >>> before, after = torch.zeros(2, 3), torch.ones(2, 3)  # ||f(x, W_i) - f(x, W_{i-1})||_F^2 = 6
    >>> w_before, w_after = [torch.zeros(2)], [torch.tensor([1.0, 1.0])]  # ||W_i - W_{i-1}||_F^2 = 2
    >>> instability_score(after, before, w_after, w_before)
    3.0
    """
    if not isinstance(output_after, torch.Tensor) or not isinstance(output_before, torch.Tensor):
        raise TypeError(
            "`output_after` and `output_before` must be torch.Tensors; got "
            f"{type(output_after).__name__} and {type(output_before).__name__}."
        )
    if output_after.shape != output_before.shape:
        raise ValueError(
            f"`output_after` and `output_before` must have the same shape; got "
            f"{tuple(output_after.shape)} and {tuple(output_before.shape)}."
        )
    parameters_after, parameters_before = list(parameters_after), list(parameters_before)
    if len(parameters_after) != len(parameters_before) or any(
        a.shape != b.shape for a, b in zip(parameters_after, parameters_before)
    ):
        raise ValueError(
            "`parameters_after` and `parameters_before` must be matching lists of tensors; got "
            f"{[tuple(a.shape) for a in parameters_after]} and {[tuple(b.shape) for b in parameters_before]}."
        )
    delta_w = float((_flat(parameters_after) - _flat(parameters_before)).square().sum())
    if delta_w == 0.0:
        raise ValueError("`parameters_after` equals `parameters_before`: the instability score is 0/0.")
    delta_f = float((output_after.detach().to(torch.float64) - output_before.detach().to(torch.float64)).square().sum())
    return delta_f / delta_w


def instability_trace(model, batches: Sequence, *, lr: float = 1e-4, seed: int = 0, optimizer: str = "adam",
                      warmup: int = 0, total_steps: int | None = None, clip_value: float | None = None) -> dict:
    r"""Train ``model`` one step per batch and record :math:`\tau_i` at every step.

    Parameters
    ----------
    model : torch.nn.Module
        Follows the protocol in the module docstring: ``model(batch, *, seed) ->
        (embedding, loss)`` and ``model.embedding_parameters()``. Trained in place.
    batches : sequence
        ``x_1, ..., x_T``, passed to ``model`` as is (Skyformer: 20 steps).
    lr : float
        Adam learning rate (Skyformer Section 5: ``1e-4`` for ListOps and Text).
    seed : int
        Seeds the per-step random draws of randomized attentions. Step ``i`` uses the
        same seed for :math:`f(x_i, W_{i-1})` (the training forward) and
        :math:`f(x_i, W_i)` (after the update), so :math:`\tau_i` measures the parameter
        change only, not a change of landmarks, hashes or dropout masks.
    optimizer, warmup, total_steps : see :func:`approxlab.optim.make_optimizer`
        ``"adam"`` (constant rate) or ``"adamw"`` (Skyformer's code: AdamW with a one-cycle
        schedule of ``total_steps``, default ``len(batches)``, of which ``warmup`` rise).
    clip_value : float, optional
        Clip every gradient entry to ``[-clip_value, clip_value]`` before the step (Skyformer's
        code: 1).

    Returns
    -------
    dict
        ``"tau"``: ``(T,)`` float64 instability scores; ``"loss"``: ``(T,)`` training losses;
        ``"output_change"`` and ``"parameter_change"``: ``(T,)`` the squared norms
        :math:`\|\Delta f\|_F^2` and :math:`\|\Delta W\|_F^2`.

    Raises
    ------
    FloatingPointError
        If a loss or a gradient is not finite (the step and the first offending parameter
        are named); nothing is recorded for such a step.

    Notes
    -----
    At step ``i``: forward on :math:`x_i` at :math:`W_{i-1}` (keeping :math:`f(x_i, W_{i-1})`
    and the loss), backward, one Adam step to :math:`W_i`, then a gradient-free forward on
    :math:`x_i` at :math:`W_i`; :math:`\tau_i` is :func:`instability_score` of the two.
    Only :math:`W` (``embedding_parameters``) enters the denominator: a task head that
    :math:`f` does not use is trained but not counted.

    References
    ----------
    Skyformer Appendix F; Liu et al. (2020), Figure 4.

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks import make_task
    >>> from approxlab.training import TinyEncoder, instability_trace
    >>> task = make_task("listops", n=32, batch_size=4, num_batches=3, generator=torch.Generator().manual_seed(0))
    >>> model = TinyEncoder(vocab_size=task.vocab_size, n=task.n, num_classes=task.num_classes, attention="skyformer",
    ...                     num_features=8, embedding_dim=16, hidden_dim=32, generator=torch.Generator().manual_seed(0))
    >>> trace = instability_trace(model, task.batches, lr=1e-3, seed=0)
    >>> sorted(trace), trace["tau"].shape
    (['loss', 'output_change', 'parameter_change', 'tau'], torch.Size([3]))
    >>> torch.allclose(trace["tau"], trace["output_change"] / trace["parameter_change"])
    True
    """
    lr = check_positive_float(lr, "lr")
    seed = check_int(seed, "seed", low=0)
    if len(batches) < 1:
        raise ValueError(f"`batches` must hold at least one batch; got {len(batches)}.")
    from .optim import make_optimizer, optimizer_step

    g = as_generator(seed=seed)
    step_seeds = torch.randint(0, 2**62, (len(batches),), generator=g).tolist()
    opt, schedule = make_optimizer(model.parameters(), lr=lr, optimizer=optimizer, warmup=warmup,
                                   total_steps=len(batches) if total_steps is None else total_steps)
    params = list(model.embedding_parameters())
    out = {key: torch.zeros(len(batches), dtype=torch.float64) for key in ("tau", "loss", "output_change", "parameter_change")}
    model.train()
    for i, (batch, step_seed) in enumerate(zip(batches, step_seeds)):
        opt.zero_grad(set_to_none=True)
        before, loss = model(batch, seed=step_seed)
        if not bool(torch.isfinite(loss)):
            raise FloatingPointError(f"the training loss is not finite at step {i + 1}: {float(loss.detach())}.")
        before = before.detach()
        loss.backward()
        bad = [name for name, p in model.named_parameters() if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
        if bad:
            raise FloatingPointError(
                f"non-finite gradient at step {i + 1} in {len(bad)} parameter(s) (first: {bad[0]}) "
                "with a finite loss."
            )
        params_before = [p.detach().clone() for p in params]
        optimizer_step(model, opt, schedule, clip_value=clip_value)
        with torch.no_grad():
            after, _ = model(batch, seed=step_seed)
        delta_f = float((after.to(torch.float64) - before.to(torch.float64)).square().sum())
        delta_w = float((_flat(params) - _flat(params_before)).square().sum())
        out["tau"][i] = instability_score(after, before, params, params_before)
        out["loss"][i] = float(loss.detach())
        out["output_change"][i] = delta_f
        out["parameter_change"][i] = delta_w
    return out


def instability_ratio(tau: torch.Tensor, tau_reference: torch.Tensor) -> float:
    r"""Mean over steps of :math:`\tau_i / \tau_i^{\text{ref}}` (one entry of Skyformer Table 3).

    Parameters
    ----------
    tau, tau_reference : torch.Tensor
        ``(T,)`` scores of a method and of softmax attention on the same batches.

    Raises
    ------
    ValueError
        If the shapes differ or a reference score is not positive and finite.

    Examples
    --------
    >>> import torch
    >>> from approxlab.training import instability_ratio
    >>> tau = torch.tensor([2.0, 6.0], dtype=torch.float64)
    >>> tau_softmax = torch.tensor([1.0, 2.0], dtype=torch.float64)
    >>> instability_ratio(tau, tau_softmax)  # the mean of 2/1 and 6/2
    2.5
    """
    tau = torch.as_tensor(tau, dtype=torch.float64)
    tau_reference = torch.as_tensor(tau_reference, dtype=torch.float64)
    if tau.shape != tau_reference.shape or tau.ndim != 1 or tau.numel() == 0:
        raise ValueError(
            f"`tau` and `tau_reference` must be non-empty 1-d tensors of the same length; got "
            f"{tuple(tau.shape)} and {tuple(tau_reference.shape)}."
        )
    if not bool((tau_reference > 0).all() and torch.isfinite(tau_reference).all()):
        raise ValueError(f"`tau_reference` must be positive and finite; got {tau_reference.tolist()}.")
    return float((tau / tau_reference).mean())


@torch.no_grad()
def accuracy(model, batches, *, seed: int = 0) -> float:
    """Fraction of correctly classified examples of ``batches`` (``model.predict``, eval mode).

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks import make_task
    >>> from approxlab.training import TinyEncoder, accuracy
    >>> task = make_task("listops", n=32, batch_size=4, num_batches=2, generator=torch.Generator().manual_seed(0))
    >>> model = TinyEncoder(vocab_size=task.vocab_size, n=task.n, num_classes=task.num_classes, embedding_dim=16,
    ...                     hidden_dim=32, generator=torch.Generator().manual_seed(0))
    >>> score = accuracy(model, task.batches)  # the fraction of the 8 examples classified right
    >>> 0.0 <= score <= 1.0, (8 * score).is_integer()
    (True, True)
    """
    was_training = model.training
    model.eval()
    correct = total = 0
    for batch in batches:
        correct += int((model.predict(batch, seed=seed).argmax(-1) == batch.labels).sum())
        total += int(batch.labels.numel())
    model.train(was_training)
    return correct / max(total, 1)


def train_classifier(model, train_batches, validation_batches, *, lr: float = 1e-3, eval_every: int = 25,
                     patience: int | None = 3, seed: int = 0, optimizer: str = "adam", warmup: int = 0,
                     clip_value: float | None = None, keep: str = "best") -> dict:
    r"""Train ``model`` on ``train_batches`` (one step each), evaluating every ``eval_every`` steps.

    Every ``eval_every`` steps the accuracy on ``validation_batches`` is measured; with a
    ``patience``, training stops after ``patience`` evaluations in a row without a new best;
    otherwise it runs until the batches run out (the step budget).

    Parameters
    ----------
    model : TinyEncoder
        A classification model; trained in place.
    train_batches, validation_batches : sequence of approxlab.tasks.Batch
    lr : float
        (Peak) learning rate.
    eval_every : int
        Evaluation period (steps).
    patience : int or None
        Early-stopping patience (evaluations); None: no early stop (a fixed step budget).
    seed : int
        Seeds the per-step draws (dropout masks, randomized attentions); evaluation uses ``seed``.
    optimizer, warmup : see :func:`approxlab.optim.make_optimizer`
        ``"adamw"``: the schedule spans ``len(train_batches)`` steps.
    clip_value : float, optional
        Clip every gradient entry to ``[-clip_value, clip_value]`` (Skyformer's code: 1).
    keep : {"best", "last"}
        Restore the weights of the best evaluation, or keep the last ones.

    Returns
    -------
    dict
        ``"history"``: list of ``{"step", "train_loss", "validation_accuracy"}`` (one per
        evaluation; ``train_loss`` the mean over the steps since the last one);
        ``"best_step"``, ``"best_accuracy"``, ``"steps"`` (taken), ``"stopped"``
        (``"plateau"`` or ``"budget"``).

    Raises
    ------
    FloatingPointError
        If a training loss is not finite.

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks import make_task
    >>> from approxlab.training import TinyEncoder, train_classifier
    >>> g = torch.Generator().manual_seed(0)
    >>> train = make_task("listops", n=32, batch_size=4, num_batches=4, generator=g)
    >>> validation = make_task("listops", n=32, batch_size=4, num_batches=1, generator=g)
    >>> model = TinyEncoder(vocab_size=train.vocab_size, n=train.n, num_classes=train.num_classes, embedding_dim=16,
    ...                     hidden_dim=32, generator=torch.Generator().manual_seed(0))
    >>> result = train_classifier(model, train.batches, validation.batches, eval_every=2, patience=3)
    >>> result["steps"], result["stopped"], [entry["step"] for entry in result["history"]]
    (4, 'budget', [0, 2, 4])
    """
    from .optim import make_optimizer, optimizer_step

    eval_every = check_int(eval_every, "eval_every", low=1)
    patience = None if patience is None else check_int(patience, "patience", low=1)
    check_choice(keep, "keep", ("best", "last"))
    opt, schedule = make_optimizer(model.parameters(), lr=lr, optimizer=optimizer, warmup=warmup,
                                   total_steps=max(len(train_batches), warmup + 1))
    step_seeds = torch.randint(0, 2**62, (len(train_batches),), generator=as_generator(seed=seed)).tolist()
    best = {"accuracy": accuracy(model, validation_batches, seed=seed), "step": 0,
            "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    history = [{"step": 0, "train_loss": float("nan"), "validation_accuracy": best["accuracy"]}]
    losses, stale, stopped, step = [], 0, "budget", 0
    model.train()
    for step, (batch, step_seed) in enumerate(zip(train_batches, step_seeds), start=1):
        opt.zero_grad(set_to_none=True)
        loss = model(batch, seed=step_seed)[1]
        if not bool(torch.isfinite(loss)):
            raise FloatingPointError(f"the training loss is not finite at step {step}: {float(loss.detach())}.")
        loss.backward()
        optimizer_step(model, opt, schedule, clip_value=clip_value)
        losses.append(float(loss.detach()))
        if step % eval_every and step != len(train_batches):
            continue
        score = accuracy(model, validation_batches, seed=seed)
        history.append({"step": step, "train_loss": float(np.mean(losses)), "validation_accuracy": score})
        losses = []
        stale = 0 if score > best["accuracy"] else stale + 1
        if score > best["accuracy"]:
            best = {"accuracy": score, "step": step,
                    "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
        if patience is not None and stale >= patience:
            stopped = "plateau"
            break
    if keep == "best":
        model.load_state_dict(best["state"])
    return {"history": history, "best_step": best["step"], "best_accuracy": best["accuracy"], "steps": step,
            "stopped": stopped, "final_accuracy": history[-1]["validation_accuracy"]}


def _linear_init(weight, bias, generator):
    """PyTorch's default ``nn.Linear`` init, drawn from ``generator``."""
    torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)
    bound = 1.0 / math.sqrt(weight.shape[1])
    torch.nn.init.uniform_(bias, -bound, bound, generator=generator)


class _Block(torch.nn.Module):
    """Pre-LayerNorm transformer block: ``x + Attn(LN(x))``, then ``x + FF(LN(x))``."""

    def __init__(self, embedding_dim, hidden_dim, num_heads, dtype):
        super().__init__()
        kw = {"dtype": dtype}
        self.num_heads = num_heads
        self.norm1 = torch.nn.LayerNorm(embedding_dim, **kw)
        self.qkv = torch.nn.Linear(embedding_dim, 3 * embedding_dim, **kw)
        self.out = torch.nn.Linear(embedding_dim, embedding_dim, **kw)
        self.norm2 = torch.nn.LayerNorm(embedding_dim, **kw)
        self.ff1 = torch.nn.Linear(embedding_dim, hidden_dim, **kw)
        self.ff2 = torch.nn.Linear(hidden_dim, embedding_dim, **kw)

    def reset_parameters(self, generator):
        for linear in (self.qkv, self.out, self.ff1, self.ff2):
            _linear_init(linear.weight, linear.bias, generator)
        for norm in (self.norm1, self.norm2):
            torch.nn.init.ones_(norm.weight)
            torch.nn.init.zeros_(norm.bias)

    def forward(self, x, attend, capture=None, drop=None):
        """``x: (b, n, e)``; ``attend(q, k, v)`` on ``(b, heads, n, e // heads)``; ``capture``: a
        list that receives the attention output ``(b, n, e)`` (heads concatenated, detached);
        ``drop``: dropout (a function of a tensor) after the attention's output projection, after
        the GELU and after the feed-forward, as the LRA code places it."""
        b, n, e = x.shape
        h = self.num_heads
        drop = drop if drop is not None else (lambda t: t)
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, h, e // h).permute(2, 0, 3, 1, 4)
        a = attend(q, k, v).transpose(1, 2).reshape(b, n, e)  # heads concatenated
        if capture is not None:
            capture.append(a.detach())
        x = x + drop(self.out(a))
        return x + drop(self.ff2(drop(F.gelu(self.ff1(self.norm2(x))))))


class TinyEncoder(torch.nn.Module):
    r"""The 2-layer encoder of Skyformer Section 5 with a pluggable attention.

    Token + learned position embeddings (``N(0, 0.02^2)``), ``num_layers`` pre-LayerNorm
    blocks (attention with ``num_heads`` heads, GELU feed-forward ``embedding_dim ->
    hidden_dim -> embedding_dim``), a final LayerNorm, and a head: mean pooling over real
    tokens + a 2-layer classifier (``kind="classification"``), or a masked-LM decoder tied
    to the token embeddings (``kind="mlm"``). Dropout (``dropout``, default 0) where the LRA
    code puts it: on the embeddings, after each attention's output projection, after the GELU
    and after the feed-forward; its masks are drawn from a generator seeded by the forward's
    ``seed`` (so two forward passes with one seed drop the same entries) and only in training
    mode.

    Parameters
    ----------
    vocab_size : int
    n : int
        Maximum sequence length (size of the position table).
    attention : str
        A key of :data:`ATTENTIONS`.
    num_features : int
        The approximation's budget (landmarks / features; Skyformer Section 5 uses 128);
        capped at the sequence length. Ignored by exact attentions.
    kind : {"classification", "mlm"}
    num_classes : int, optional
        Required for ``kind="classification"``.
    embedding_dim, hidden_dim, num_heads, num_layers : int
        Skyformer: 64, 128, 2, 2.
    positions : {"learned", "2d"}
        ``"learned"``: one learned embedding per position (the LRA code); ``"2d"``: a learned
        row embedding plus a learned column embedding of a ``side x side`` grid, ``n = side**2``
        (an image flattened row-major, e.g. Pathfinder), so neighbouring pixels of one column
        share a column vector.
    dropout : float
        Dropout probability, ``0 <= dropout < 1`` (Skyformer's LRA code: 0.1).
    attention_options : dict, optional
        Method options (those :func:`approxlab.approximate` accepts for the method, checked
        here); default :data:`TRAINING_OPTIONS` for the attention (Skyformer: ``core="schulz"``).
    generator : torch.Generator, optional
        Initial weights are drawn from it (CPU); two encoders built from the same
        generator state have the same weights, whatever their attention.
    dtype : torch.dtype
        Parameter dtype (float32 default).

    Notes
    -----
    :math:`f(x, W)` of Skyformer Appendix F is :meth:`embed`: the ``(batch, n,
    embedding_dim)`` output of the final LayerNorm, i.e. the token embeddings after the two
    layers as returned by the encoder of the LRA code Skyformer trains with. Padding tokens
    are masked inside attention (``key_mask``: they get zero weight as keys, and landmarks are
    taken over real tokens only, so the real tokens' embeddings do not depend on the padding;
    every method in :data:`ATTENTIONS` honours it) and left out of the mean pooling.

    **Speed.** Each layer calls the method's own function once on ``(batch, heads, n, p)`` (all
    heads and sequences at once; the same computation as :func:`approxlab.approximate`, without
    its checks of inputs and output, and without the diagnostics some methods compute for
    ``info``: ``diagnostics=False``). Softmax and kernelized attention run through torch's fused
    ``scaled_dot_product_attention`` (no ``n x n`` matrix, forward or backward); Skyformer,
    Nyströmformer and spectral shifting form nothing larger than ``n x num_features``; YOSO-E,
    an exact expectation, is ``n x n`` by definition. ``approxlab bench --parts training``
    measures a training step of each against a pure-SDPA model.

    References
    ----------
    Skyformer Section 5 ("Implementation Details") and Appendix F.

    Examples
    --------
    >>> import torch
    >>> from approxlab.tasks import make_task
    >>> from approxlab.training import TinyEncoder
    >>> task = make_task("listops", n=32, batch_size=4, num_batches=1, generator=torch.Generator().manual_seed(0))
    >>> model = TinyEncoder(vocab_size=task.vocab_size, n=task.n, num_classes=task.num_classes, attention="nystromformer",
    ...                     num_features=8, embedding_dim=16, hidden_dim=32, generator=torch.Generator().manual_seed(0))
    >>> embedding, loss = model(task.batches[0], seed=0)  # f(x, W) of Skyformer Appendix F, and the loss
    >>> embedding.shape, loss.shape
    (torch.Size([4, 32, 16]), torch.Size([]))
    >>> model.predict(task.batches[0]).shape  # class logits
    torch.Size([4, 10])
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        n: int,
        attention: str = "softmax",
        num_features: int = 128,
        kind: str = "classification",
        num_classes: int | None = None,
        embedding_dim: int = 64,
        hidden_dim: int = 128,
        num_heads: int = 2,
        num_layers: int = 2,
        positions: str = "learned",
        dropout: float = 0.0,
        attention_options: dict | None = None,
        generator: torch.Generator | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        vocab_size = check_int(vocab_size, "vocab_size", low=2)
        n = check_int(n, "n", low=1)
        check_choice(attention, "attention", ATTENTIONS)
        num_features = check_int(num_features, "num_features", low=1)
        check_choice(kind, "kind", ("classification", "mlm"))
        if kind == "classification":
            num_classes = check_int(num_classes, "num_classes", low=2)
        embedding_dim = check_int(embedding_dim, "embedding_dim", low=1)
        hidden_dim = check_int(hidden_dim, "hidden_dim", low=1)
        num_heads = check_int(num_heads, "num_heads", low=1)
        num_layers = check_int(num_layers, "num_layers", low=1)
        if embedding_dim % num_heads:
            raise ValueError(
                f"`embedding_dim` must be divisible by `num_heads`; got {embedding_dim} and {num_heads}."
            )
        check_choice(dtype, "dtype", (torch.float32, torch.float64))
        check_choice(positions, "positions", ("learned", "2d"))
        side = math.isqrt(n)
        if positions == "2d" and side * side != n:
            raise ValueError(f"`positions='2d'` needs a square `n` (side**2); got n={n}.")
        if not (isinstance(dropout, (int, float)) and 0.0 <= float(dropout) < 1.0):
            raise ValueError(f"`dropout` must be a number in [0, 1); got {dropout!r}.")
        self.positions, self.dropout = positions, float(dropout)
        self.attention = attention
        self.method = ATTENTIONS[attention]
        self.num_features = num_features
        self.kind = kind
        if attention_options is None:
            attention_options = TRAINING_OPTIONS.get(attention, {})
        spec = registry.get(self.method)
        spec.check_options(attention_options)  # the check approximate() makes
        self.attention_options = dict(attention_options)
        if "diagnostics" in inspect.signature(spec.function).parameters:
            self._call_options = {"diagnostics": False, **self.attention_options}  # info training never reads
        else:
            self._call_options = self.attention_options
        kw = {"dtype": dtype}
        # torch's modules initialise themselves from the global generator on construction;
        # fork_rng restores its state, and reset_parameters then redraws every weight from
        # `generator`.
        with torch.random.fork_rng(devices=[]):
            self.token_embedding = torch.nn.Embedding(vocab_size, embedding_dim, **kw)
            self.position_embedding = torch.nn.Embedding(n if positions == "learned" else 2 * side, embedding_dim, **kw)
            self.blocks = torch.nn.ModuleList(
                _Block(embedding_dim, hidden_dim, num_heads, dtype) for _ in range(num_layers)
            )
            self.norm = torch.nn.LayerNorm(embedding_dim, **kw)
            if kind == "classification":
                self.head = torch.nn.Sequential(
                    torch.nn.Linear(embedding_dim, hidden_dim, **kw),
                    torch.nn.ReLU(),
                    torch.nn.Linear(hidden_dim, num_classes, **kw),
                )
            else:
                self.head = torch.nn.ParameterDict({"bias": torch.nn.Parameter(torch.zeros(vocab_size, **kw))})
        self.reset_parameters(as_generator(generator))

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator) -> None:
        """Draw every initial weight from ``generator`` (never from global RNG)."""
        torch.nn.init.normal_(self.token_embedding.weight, std=0.02, generator=generator)
        torch.nn.init.normal_(self.position_embedding.weight, std=0.02, generator=generator)
        for block in self.blocks:
            block.reset_parameters(generator)
        torch.nn.init.ones_(self.norm.weight)
        torch.nn.init.zeros_(self.norm.bias)
        if self.kind == "classification":
            _linear_init(self.head[0].weight, self.head[0].bias, generator)
            _linear_init(self.head[2].weight, self.head[2].bias, generator)
        else:
            torch.nn.init.zeros_(self.head["bias"])

    def embedding_parameters(self) -> list:
        """The parameters :math:`W` that :math:`f` (:meth:`embed`) depends on (not the head)."""
        return [p for name, p in self.named_parameters() if not name.startswith("head.")]

    def _attend(self, seed, key_mask):
        """The attention of one layer: the method's own function on ``(batch, heads, n, p)``, all
        heads and sequences in one call, without :func:`approxlab.approximate`'s checks of its
        inputs and output (the model makes them; the training loop checks the loss and gradients)
        and with ``diagnostics=False`` where the method computes diagnostics it does not need."""
        function = registry.get(self.method).function

        def attend(q, k, v):
            n = k.shape[-2]
            g = as_generator(seed=seed)
            result = function(q, k, v, num_features=min(self.num_features, n), generator=g, key_mask=key_mask,
                              **self._call_options)
            return result if isinstance(result, torch.Tensor) else result.output

        return attend

    def embed(
        self, input_ids: torch.Tensor, *, seed: int = 0, mask: torch.Tensor | None = None, attention_outputs=None
    ) -> torch.Tensor:
        """:math:`f(x, W)`: ``input_ids (batch, n) -> (batch, n, embedding_dim)``.

        ``seed`` fixes the random draws of randomized attentions (layer ``l`` uses
        ``seed + l``); ``mask`` ``(batch, n)`` bool, True on real tokens, masks padding keys
        in every attention (``None`` or all True: no mask). ``attention_outputs``: a list that
        receives each layer's attention output ``(batch, n, embedding_dim)`` (the heads
        concatenated, before the output projection; detached), first layer first.
        """
        n = input_ids.shape[-1]
        key_mask = None if mask is None or bool(mask.all()) else mask.unsqueeze(-2)  # (batch, 1, n): all heads
        drop = self._dropout(seed)
        x = drop(self.token_embedding(input_ids) + self._position_vectors(n, input_ids.device))
        for layer, block in enumerate(self.blocks):
            x = block(x, self._attend(seed + layer, key_mask), attention_outputs, drop)
        return self.norm(x)

    def _position_vectors(self, n, device):
        """``(n, embedding_dim)``: learned per position, or row + column vectors (``"2d"``)."""
        positions = torch.arange(n, device=device)
        if self.positions == "learned":
            return self.position_embedding(positions)
        side = self.position_embedding.num_embeddings // 2
        return self.position_embedding(positions // side) + self.position_embedding(side + positions % side)

    def _dropout(self, seed):
        """Inverted dropout with masks from a generator seeded by ``seed`` (identity in eval mode)."""
        if not self.training or self.dropout == 0.0:
            return lambda t: t
        g = as_generator(seed=(int(seed) * 2654435761 + 97) % 2**63)
        keep = 1.0 - self.dropout

        def drop(t):
            draw = torch.rand(t.shape, generator=g, dtype=t.dtype).to(t.device)
            return t * (draw < keep).to(t.dtype) / keep

        return drop

    def _class_logits(self, embedding, mask):
        """Mean pooling over real tokens, then the classifier: ``(batch, num_classes)``."""
        weights = mask.to(embedding.dtype).unsqueeze(-1)
        pooled = (embedding * weights).sum(-2) / weights.sum(-2).clamp_min(1.0)
        return self.head(pooled)

    def predict(self, batch, *, seed: int = 0, attention_outputs=None) -> torch.Tensor:
        """Class logits ``(batch, num_classes)`` of a classification model (see :meth:`embed`
        for ``attention_outputs``)."""
        if self.kind != "classification":
            raise ValueError(f"`predict` needs a classification model; this one has kind={self.kind!r}.")
        embedding = self.embed(batch.input_ids, seed=seed, mask=batch.mask, attention_outputs=attention_outputs)
        return self._class_logits(embedding, batch.mask)

    def forward(self, batch, *, seed: int = 0):
        """``(f(x, W), loss)`` for an :class:`approxlab.tasks.Batch` (cross-entropy loss)."""
        embedding = self.embed(batch.input_ids, seed=seed, mask=batch.mask)
        if self.kind == "classification":
            loss = F.cross_entropy(self._class_logits(embedding, batch.mask), batch.labels)
        else:
            selected = batch.labels != IGNORE_INDEX
            hidden = embedding[selected]  # only masked positions reach the vocabulary
            logits = hidden @ self.token_embedding.weight.T + self.head["bias"]
            loss = F.cross_entropy(logits, batch.labels[selected])
        return embedding, loss
