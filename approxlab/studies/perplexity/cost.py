r"""What a patched forward pass costs, against its parts: :func:`patched_forward_cost`.

A forward pass with one layer patched should cost what the unpatched pass costs, less that layer's own
attention, plus the method's approximation -- and never more than the unpatched pass plus the method. The
function times the four on the same window, interleaved (the order rotates from one repeat to the next,
so a machine that slows down or speeds up during the measurement touches each alike), and reports medians.
The bench can call it for any model and method; the perplexity study reports it per method.
"""

from __future__ import annotations

import statistics

import torch

from ..engine.clock import Stopwatch

__all__ = ["COST_PARTS", "patched_forward_cost"]

COST_PARTS = ("unpatched", "patched", "method", "layer_attention")
"""The timed parts, in seconds: the unpatched forward pass, the patched one, the method on the layer's inputs
alone, and exact attention (PyTorch's SDPA) on those inputs -- what the patch takes out of the unpatched pass."""


def patched_forward_cost(model, method: str, input_ids: torch.Tensor, *, layer: int, num_features: int,
                         repeats: int = 3, seed: int = 0, **options) -> dict:
    r"""Time a forward pass with ``method`` in ``layer`` against the unpatched pass and the method alone.

    Parameters
    ----------
    model : transformers.PreTrainedModel or approxlab.data.LoadedModel
        What :func:`approxlab.patch_attention` takes.
    method : str
        A registered method (with a causal form for a decoder).
    input_ids : torch.Tensor
        ``(S, n)`` token ids: the window timed.
    layer : int
        The layer patched.
    num_features : int
        The method's budget.
    repeats : int, default 3
        Timings of each part (the median is reported), ``>= 1``.
    seed : int, default 0
        Seed of the patch's generator (the same draws in every repeat), ``>= 0``.
    **options
        The method's own options.

    Returns
    -------
    dict
        The median seconds of each of :data:`COST_PARTS`; ``overhead`` = patched - (unpatched -
        layer_attention + method), what the patch adds beyond swapping the layer's attention for the method;
        ``ratio`` = patched / (unpatched + method), at most 1 when a patched pass costs no more than the
        unpatched pass plus the method; ``clock`` (which clock: the thread's CPU time with one torch thread,
        else wall time) and ``repeats``.

    Raises
    ------
    TypeError, ValueError
        ``input_ids`` not a 2-d integer tensor; ``repeats`` not an integer >= 1; ``seed`` not an integer >= 0;
        and whatever :func:`approxlab.patch_attention` refuses (``model``, ``method``, ``layer``, ...).

    Notes
    -----
    The method is timed on the very ``(S, H, n, p)`` query, key and value the patched layer received (recorded
    once, before the timings), with the causal form the patch used; the layer's exact attention is
    ``torch.nn.functional.scaled_dot_product_attention`` on them (causal in a decoder). Timings of one
    forward pass on a shared machine vary by tens of percent: compare ``ratio`` with 1 loosely.

    Examples
    --------
    >>> import torch
    >>> from transformers import LlamaConfig
    >>> from approxlab.data import load_model
    >>> from approxlab.studies.perplexity.cost import patched_forward_cost
    >>> config = LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                      num_attention_heads=4, num_key_value_heads=2)
    >>> model = load_model("initialized", config=config, seed=0).model
    >>> ids = torch.randint(30522, (1, 64), generator=torch.Generator().manual_seed(0))
    >>> found = patched_forward_cost(model, "performer", ids, layer=1, num_features=8, repeats=1)
    >>> sorted(found) == sorted(["unpatched", "patched", "method", "layer_attention", "overhead", "ratio", "clock",
    ...                          "repeats"])
    True
    """
    from ..._validation import check_int
    from ...attention import approximate
    from ...patching import patch_attention

    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.is_floating_point():
        raise TypeError(f"`input_ids` must be a 2-d integer torch.Tensor (S, n); got "
                        f"{type(input_ids).__name__ if not isinstance(input_ids, torch.Tensor) else input_ids.dtype}"
                        f"{'' if not isinstance(input_ids, torch.Tensor) else tuple(input_ids.shape)}.")
    repeats = check_int(repeats, "repeats", low=1)
    seed = check_int(seed, "seed", low=0)
    network = getattr(model, "model", model)  # a LoadedModel holds the transformers model

    def patch(record=False):
        return patch_attention(model, method, layers=[layer], num_features=num_features, record_inputs=record,
                               generator=torch.Generator().manual_seed(seed), **options)

    def forward():
        with torch.no_grad():
            network(input_ids=input_ids.to(network.device))

    with patch(record=True) as recorded:
        forward()
    q, k, v = recorded.calls[0].inputs
    causal = recorded.causal

    def method_alone():
        approximate(method, q, k, v, num_features=num_features, causal=causal,
                    generator=torch.Generator().manual_seed(seed), **recorded.options)  # the model's RoPE too

    def layer_attention():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))

    unit = Stopwatch.steady_clock()

    def timed(part):
        if part == "patched":
            with patch():
                watch = Stopwatch()
                forward()
                return watch.seconds(unit)
        watch = Stopwatch()
        {"unpatched": forward, "method": method_alone, "layer_attention": layer_attention}[part]()
        return watch.seconds(unit)

    seconds = {part: [] for part in COST_PARTS}
    for repeat in range(repeats):
        order = COST_PARTS[repeat % len(COST_PARTS):] + COST_PARTS[:repeat % len(COST_PARTS)]
        for part in order:
            seconds[part].append(timed(part))
    found = {part: statistics.median(values) for part, values in seconds.items()}
    found["overhead"] = found["patched"] - (found["unpatched"] - found["layer_attention"] + found["method"])
    found["ratio"] = found["patched"] / (found["unpatched"] + found["method"])
    return {**found, "clock": unit, "repeats": repeats}
