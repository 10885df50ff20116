r"""Skyformer's instability score and the loops that train a model (Appendix F, Table 3).

:func:`instability_score` is one :math:`\tau_i`, :func:`instability_trace` trains a model for a few
steps and records every :math:`\tau_i`, :func:`instability_ratio` is one entry of Table 3;
:func:`train_classifier` and :func:`accuracy` train a classifier to a validation plateau or a step
budget. The definitions, the model protocol and the references are those of :mod:`approxlab.training`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .._validation import as_generator, check_choice, check_int, check_positive_float

__all__ = ["instability_score", "instability_trace", "instability_ratio", "accuracy", "train_classifier"]


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
        Follows the protocol of :mod:`approxlab.training`: ``model(batch, *, seed) ->
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
    from ..optim import make_optimizer, optimizer_step

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
    from ..optim import make_optimizer, optimizer_step

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

