"""The ``forward`` part of ``approxlab bench``: forward time and memory of each approximation.

Each approximation (``approximate(...).output``) against exact attention through the fused
kernel (``exact-sdpa``: ``ExactAttentionOperator(q, k).matmat(v)``, the kernel of
``approxlab.exact_attention``), torch's own ``scaled_dot_product_attention`` on its fused kernel
(``torch-sdpa``, :func:`~.baseline.torch_sdpa`)
and the row-blocked reference (``exact-blocked``, up to ``dense_max_n``). The causal-only methods (the KV-cache
policies ``streaming-llm``, ``h2o``, ``snapkv``) are timed in their causal form (``causal`` 1 in their rows), against
torch's causal SDPA (``torch-sdpa-causal``, ``is_causal=True``); every other method in its bidirectional form.
See :mod:`approxlab.studies.bench`.
"""

from __future__ import annotations

import sys

from ..engine.failures import METHOD_ERRORS, method_status
from .baseline import torch_sdpa
from .parts import approximation, measured_row, timed_causal, timing_options
from .timing import measure
from ...linalg.normal_lanczos import default_row_block

__all__ = ["forward_rows"]


def forward_rows(config, method, q, k, v, n, common, device):
    from ...operators import ExactAttentionOperator

    rows = []
    timed = timing_options(config, device)
    if method == "exact":
        sdpa = ExactAttentionOperator(q, k, "softmax")  # approxlab.exact_attention's kernel
        out, m = measure(sdpa.matmat, v, **timed)
        rows.append(measured_row("exact-sdpa", m, compute_dtype=common["dtype"], **common))
        _, m = measure(torch_sdpa, q, k, v, **timed)
        rows.append(measured_row("torch-sdpa", m, compute_dtype=common["dtype"], **common))
        _, m = measure(torch_sdpa, q, k, v, causal=True, **timed)
        rows.append(measured_row("torch-sdpa-causal", m, compute_dtype=common["dtype"], causal=1.0, **common))
        if n <= config["dense_max_n"]:
            block = default_row_block(n)
            blocked = ExactAttentionOperator(q, k, "softmax", block_size=block, algorithm="blocked")
            reference, m = measure(blocked.matmat, v, **timed)
            rows.append(measured_row("exact-blocked", m, row_block=block, compute_dtype=common["dtype"],
                             max_abs_difference=float((reference - out).abs().max()), **common))
        return rows
    try:
        approx, m = measure(approximation, config, method, q, k, v, n, **timed)
    except METHOD_ERRORS as error:
        # Recorded, not hidden: the row says the method failed at this n and why (stderr).
        print(f"approxlab bench: {method} failed at n={n}: {method_status(method, error)}", file=sys.stderr)
        return [{"algorithm": "approximation-failed", "compute_dtype": common["dtype"], "failed": 1.0, **common}]
    rows.append(measured_row("approximation", m, compute_dtype=common["dtype"], causal=float(timed_causal(method)),
                             **common))
    return rows
