r"""The baseline of ``approxlab bench``: torch's ``scaled_dot_product_attention`` on its fused kernel.

Torch's SDPA picks its kernel from the inputs: its fused kernels (flash attention on CPU, flash,
memory-efficient or cuDNN attention on a GPU) take 4-D ``(batch, heads, n, p)`` inputs only, and any
other rank goes to the unfused math path, which forms the :math:`n\times n` logits. On this project's
CPU, 3 heads of :math:`n = 4{,}096`, :math:`p = 64`, one thread, ``is_causal=True``: 0.56 s as
``(3, n, 64)`` against 0.090 s as ``(1, 3, n, 64)``. Every SDPA the bench times as a baseline goes
through :func:`torch_sdpa`, which hands the kernel one 4-D call, so a ratio is against the kernel a
user runs. See :mod:`approxlab.studies.bench`, and ``tests/test_bench_baseline.py``, which runs each
part's baseline with torch's fused flash kernel as the only one allowed.
"""

from __future__ import annotations

import torch

__all__ = ["torch_sdpa"]


def torch_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False) -> torch.Tensor:
    r""":math:`\operatorname{softmax}(QK^\top/\sqrt p)\,V` by one call of torch's SDPA on the fused kernel's layout.

    ``q: (*batch, n, p)``, ``k: (*batch, m, p)``, ``v: (*batch, m, p_v)`` (equal batch shapes); returns
    ``(*batch, n, p_v)``. The batch is flattened to the heads of one ``(1, B, n, p)`` call (a view of
    contiguous inputs, no copy), the rank torch's fused kernels require; ``causal``: the kernel's
    ``is_causal`` (query :math:`i` attends keys :math:`j \le i`).
    """
    batch = q.shape[:-2]
    out = torch.nn.functional.scaled_dot_product_attention(
        *(x.reshape(1, -1, *x.shape[-2:]) for x in (q, k, v)), is_causal=causal)
    return out.reshape(*batch, *out.shape[-2:])
