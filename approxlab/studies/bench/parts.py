"""What every measured cell of ``approxlab bench`` shares: its head, its approximation, its rows.

:func:`load_head` loads the one head a cell measures, :func:`approximation` builds a cell's
approximation with its own seed (in the form :func:`timed_causal` says), :func:`measured_row` turns a :class:`~approxlab.studies.bench.timing.Measurement`
into a wide row, and :func:`timing_options` holds the settings of every forward-type timing. See
:mod:`approxlab.studies.bench`.
"""

from __future__ import annotations

import torch

from ..engine.keys import cell_seed
from ..inputs import wikitext

__all__ = ["load_head", "approximation", "timed_causal", "measured_row", "timing_options"]


def load_head(config: dict, n: int, *, data_dir=None, cache_dir=None, device="cpu"):
    """``q, k, v: (1, n, p)``: one head of one contiguous window of ``n`` tokens.

    ``source="bert"``: the shared :func:`approxlab.studies.inputs.wikitext.qkv` (``config["condition"]``, ``"embedding"``
    mode, so any ``n`` works: the corpus's first ``n`` tokens for window 0); head
    ``config["head"]``. ``source="synthetic"``: :func:`approxlab.synthetic.synthetic_qkv` with
    ``p = 32`` and unit-scale entries (tests).
    """
    if config["source"] == "synthetic":
        from ...synthetic import synthetic_qkv

        generator = torch.Generator().manual_seed(cell_seed("qkv", n, base_seed=config["seed"]))
        q, k, v = synthetic_qkv((1,), n, 32, generator=generator, dtype=torch.float32)
        return q.to(device), k.to(device), v.to(device)
    window = wikitext.Window(config["condition"], n, config["window"], mode=config["mode"], layer=config["layer"],
                             model_seed=config["model_seed"], data_dir=data_dir, cache_dir=cache_dir, device=device)
    qkv = wikitext.qkv(window)
    head = config["head"]
    return tuple(x[0, head : head + 1].contiguous() for x in (qkv.q, qkv.k, qkv.v))


def timed_causal(method) -> bool:
    """Whether the benchmark times ``method`` in its causal form: the causal-only ones (the KV-cache policies
    ``streaming-llm``, ``h2o``, ``snapkv``), which have no other; every other method bidirectional."""
    from ...methods import get

    return get(method).causal == "only"


def approximation(config, method, q, k, v, n):
    """``approximate(method, q, k, v)`` with the cell's ``num_features`` and generator, causal where
    :func:`timed_causal` says."""
    from ...attention import approximate
    from ...methods import get
    from ...cache._scores import model_inputs

    generator = torch.Generator().manual_seed(cell_seed(method, n, base_seed=config["seed"]))
    return approximate(method, q, k, v, num_features=min(config["num_features"], n), generator=generator,
                       causal=timed_causal(method), **model_inputs(get(method), {}))  # BERT's Q/K/V: no RoPE


def measured_row(algorithm, measurement, **values) -> dict:
    return {"algorithm": algorithm, **values, **measurement.as_row()}


def timing_options(config, device):
    """Keyword arguments of :func:`measure` for a forward-type timing: warm-up, then the median."""
    return {"repeats": int(config["repeats"]), "warmup": 1, "device": device}
