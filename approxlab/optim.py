r"""The optimiser of Skyformer's LRA code: AdamW, a linear warm-up and decay, value clipping at 1.

Skyformer (Chen et al., NeurIPS 2021) trains its LRA models with the LRA code of Nyströmformer:
``torch.optim.AdamW`` (betas 0.9, 0.999; eps ``1e-6``; weight decay 0), a one-cycle schedule
that rises linearly from ``lr / 25`` to ``lr`` over ``warmup`` steps and falls linearly to
``lr / (25 * 1e4)`` at ``total_steps`` (``torch.optim.lr_scheduler.OneCycleLR`` with
``anneal_strategy="linear"``; :func:`one_cycle`), every gradient entry clipped to ``[-1, 1]``
(``clip_grad_value_``), and dropout 0.1. :data:`SKYFORMER_LRA` holds the per-task values of
its ``config.py``; :func:`make_optimizer` builds the pair, :func:`optimizer_step` takes a step.

References
----------
Chen, Zeng, Ji, Yang. *Skyformer*. NeurIPS 2021, Section 5; the authors' LRA code
(pkuzengqi/Skyformer, ``code/config.py`` and ``code/main.py``).
"""

from __future__ import annotations

import functools

import torch

from ._validation import check_choice, check_int, check_positive_float

__all__ = ["SKYFORMER_LRA", "OPTIMIZERS", "make_optimizer", "one_cycle", "optimizer_step"]

SKYFORMER_LRA = {
    "listops": {"batch_size": 32, "lr": 1e-4, "warmup": 1000, "total_steps": 50000, "n": 2000},
    "pathfinder": {"batch_size": 128, "lr": 2e-4, "warmup": 312, "total_steps": 50000, "n": 1024},
    "text": {"batch_size": 32, "lr": 1e-4, "warmup": 80, "total_steps": 50000, "n": 4000},
    "retrieval": {"batch_size": 16, "lr": 2e-4, "warmup": 800, "total_steps": 50000, "n": 4000},
    "image": {"batch_size": 256, "lr": 1e-4, "warmup": 175, "total_steps": 50000, "n": 1024},
}
"""Per LRA task, the training settings of Skyformer's code (``config.py``): batch, peak learning
rate, warm-up steps, schedule length and padded length. Common to all: AdamW (eps 1e-6, no
weight decay), gradient values clipped at 1, dropout 0.1 (attention dropout 0.1 on softmax's
matrix), 2 layers, embedding 64, feed-forward 128, 2 heads."""

OPTIMIZERS = ("adam", "adamw")
"""``"adam"``: Adam at a constant rate (eps 1e-8); ``"adamw"``: the authors' AdamW + one-cycle."""


def make_optimizer(parameters, *, lr: float, optimizer: str = "adamw", warmup: int = 0,
                   total_steps: int | None = None):
    """``(optimizer, scheduler)``: Adam at a constant rate, or the authors' AdamW + one-cycle schedule.

    Parameters
    ----------
    parameters : iterable of torch.nn.Parameter
    lr : float
        Peak learning rate.
    optimizer : {"adam", "adamw"}
    warmup, total_steps : int
        ``"adamw"`` only: linear warm-up length and the schedule's length (``total_steps >
        warmup >= 1``); the rate starts at ``lr / 25``.

    Returns
    -------
    (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler or None)

    Examples
    --------
    >>> import torch
    >>> from approxlab.optim import make_optimizer
    >>> w = torch.nn.Parameter(torch.zeros(2))
    >>> opt, schedule = make_optimizer([w], lr=1e-3, warmup=10, total_steps=100)
    >>> type(opt).__name__, round(opt.param_groups[0]["lr"], 6)
    ('AdamW', 4e-05)
    """
    lr = check_positive_float(lr, "lr")
    check_choice(optimizer, "optimizer", OPTIMIZERS)
    parameters = list(parameters)
    if optimizer == "adam":
        return torch.optim.Adam(parameters, lr=lr), None
    warmup = check_int(warmup, "warmup", low=1)
    total_steps = check_int(total_steps, "total_steps", low=warmup + 1)
    opt = torch.optim.AdamW(parameters, lr=lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(one_cycle, warmup=warmup,
                                                                         total_steps=total_steps))


def one_cycle(step: int, *, warmup: int, total_steps: int) -> float:
    """The one-cycle factor of the rate after ``step`` steps: ``1/25 -> 1`` linearly over ``warmup``
    steps, then ``1 -> 1/(25 * 1e4)`` linearly at ``total_steps`` (``OneCycleLR``'s defaults,
    ``anneal_strategy="linear"``; written out so that short schedules are valid too).

    Examples
    --------
    >>> from approxlab.optim import one_cycle
    >>> one_cycle(0, warmup=10, total_steps=110), one_cycle(10, warmup=10, total_steps=110)
    (0.04, 1.0)
    """
    start, end = 1.0 / 25.0, 1.0 / 25.0 / 1e4
    if step < warmup:
        return start + (1.0 - start) * step / warmup
    return end + (1.0 - end) * max(0.0, 1.0 - (step - warmup) / (total_steps - warmup))


def optimizer_step(model, optimizer, scheduler=None, *, clip_value: float | None = None) -> None:
    """Clip every gradient entry to ``[-clip_value, clip_value]`` (if given), step, advance the schedule.

    Examples
    --------
    >>> import torch
    >>> from approxlab.optim import make_optimizer, optimizer_step
    >>> model = torch.nn.Linear(1, 1)
    >>> opt, _ = make_optimizer(model.parameters(), lr=0.1, optimizer="adam")
    >>> model(torch.ones(1, 1)).sum().mul(100).backward()
    >>> optimizer_step(model, opt, clip_value=1.0)
    >>> float(model.bias.grad.abs().max())
    1.0
    """
    if clip_value is not None:
        torch.nn.utils.clip_grad_value_(model.parameters(), clip_value=float(clip_value))
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
