r"""Token positions for Q/K/V extraction: learned tables beyond their length, rotary contexts.

Two kinds of position information reach attention in the supported models
(:data:`approxlab.data.models.ARCHITECTURES`):

learned absolute tables (BERT, RoBERTa, DistilBERT, GPT-2)
    A table of ``P`` rows (BERT: 512; RoBERTa's starts after ``pad_token_id + 1`` reserved rows)
    added to the token embeddings. Skyformer §4.5 embeds up to n = 4096 tokens with BERT and
    does not say how it positions them. Beyond the table, ``positions`` chooses:
    ``"interpolate"`` (default) resamples the table linearly to n rows (:func:`position_embeddings`),
    so every position is distinct -- how ViT is fine-tuned at a higher resolution (Dosovitskiy et
    al. 2021, §3.2) and how Position Interpolation extends a context (Chen et al. 2023);
    ``"copy"`` repeats the table every ``P`` rows, Longformer's initialisation (Beltagy et al.
    2020, §5); ``"none"`` leaves positions out (the rows of Q are then fixed by token identity, so
    a window with m distinct tokens gives an attention matrix of rank at most m, in embedding
    mode). For ``n <= P`` ``"interpolate"`` and ``"copy"`` are the model's own table.
    :func:`positions_for` puts the chosen rows in place of the table for one forward pass, so
    the model's own code embeds the tokens -- at any n, in both extraction modes.
rotary embeddings (Llama/SmolLM2, Qwen2, Qwen3, Gemma 3)
    RoPE rotates queries and keys inside attention; approxlab reads Q and K after it. There is
    no table to resample: ``n`` must lie within the model's context (``max_position_embeddings``)
    and ``positions`` must stay ``"interpolate"`` (meaning: the model's own positions).

References
----------
.. [1] S. Chen, S. Wong, L. Chen, Y. Tian, "Extending Context Window of Large Language Models
   via Positional Interpolation", arXiv:2306.15595, 2023.
.. [2] I. Beltagy, M. E. Peters, A. Cohan, "Longformer: The Long-Document Transformer",
   arXiv:2004.05150, 2020, Section 5.
.. [3] A. Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021, Section 3.2.
.. [4] J. Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding",
   Neurocomputing 2024 (arXiv:2104.09864).
"""

from __future__ import annotations

import contextlib

import torch

from .._validation import check_choice, check_int

__all__ = ["POSITIONS", "position_embeddings", "position_offset", "max_positions", "position_ids",
           "positions_for", "check_positions"]

POSITIONS = ("interpolate", "copy", "none")
"""How tokens are positioned beyond a learned table (see the module docstring)."""


def position_embeddings(table: torch.Tensor, n: int, positions: str = "interpolate"):
    r"""The position rows added to a window of ``n`` tokens, or None for ``positions="none"``.

    Parameters
    ----------
    table : torch.Tensor
        ``(P, h)`` learned absolute position embeddings (BERT: P = 512).
    n : int
        Window length.
    positions : {"interpolate", "copy", "none"}
        For ``n <= P`` both ``"interpolate"`` and ``"copy"`` give ``table[:n]`` (BERT's own
        embedding). For ``n > P``: ``"interpolate"`` resamples the table linearly,
        :math:`E'_i = (1-f_i)E_{\lfloor t_i\rfloor} + f_i E_{\lfloor t_i\rfloor+1}` with
        :math:`t_i = i (P-1)/(n-1)`, :math:`f_i = t_i - \lfloor t_i\rfloor` (first and last rows
        kept; every position distinct when the table's rows are -- as ViT resamples its table
        and Position Interpolation rescales positions, Chen et al. 2023); ``"copy"`` gives
        :math:`E'_i = E_{i \bmod P}` (Longformer, Beltagy et al. 2020, §5).

    Returns
    -------
    torch.Tensor or None
        ``(n, h)`` in ``table``'s dtype and device.

    Examples
    --------
    >>> import torch
    >>> from approxlab.data.positions import position_embeddings
    >>> table = torch.arange(4, dtype=torch.float64).unsqueeze(-1)  # P = 4 rows of width 1
    >>> position_embeddings(table, 7).squeeze(-1)  # resampled linearly: first and last rows kept
    tensor([0.0000, 0.5000, 1.0000, 1.5000, 2.0000, 2.5000, 3.0000], dtype=torch.float64)
    >>> position_embeddings(table, 7, "copy").squeeze(-1)
    tensor([0., 1., 2., 3., 0., 1., 2.], dtype=torch.float64)
    >>> position_embeddings(table, 7, "none") is None
    True
    """
    check_choice(positions, "positions", POSITIONS)
    n = check_int(n, "n", low=1)
    if positions == "none":
        return None
    size = table.shape[0]
    if n <= size:
        return table[:n]
    if positions == "copy":
        return table[torch.arange(n, device=table.device) % size]
    t = torch.arange(n, dtype=torch.float64, device=table.device) * ((size - 1) / (n - 1))
    low = t.floor().long().clamp_max(size - 2)
    frac = (t - low).unsqueeze(-1)
    wide = table.to(torch.float64)
    return ((1 - frac) * wide[low] + frac * wide[low + 1]).to(table.dtype)


def position_offset(architecture, config) -> int:
    """Index of the first position row: ``pad_token_id + 1`` for RoBERTa, else 0.

    Examples
    --------
    >>> from transformers import BertConfig, RobertaConfig
    >>> from approxlab.data.checkpoints import ARCHITECTURES
    >>> from approxlab.data.positions import position_offset
    >>> position_offset(ARCHITECTURES["bert"], BertConfig()), position_offset(ARCHITECTURES["roberta"], RobertaConfig())
    (0, 2)
    """
    return int(config.pad_token_id) + 1 if architecture.padding_offset else 0


def max_positions(architecture, config) -> int:
    """Rows of the learned table past the reserved ones, or the context of a rotary model.

    Examples
    --------
    >>> from transformers import BertConfig, RobertaConfig
    >>> from approxlab.data.checkpoints import ARCHITECTURES
    >>> from approxlab.data.positions import max_positions
    >>> max_positions(ARCHITECTURES["bert"], BertConfig())
    512
    >>> max_positions(ARCHITECTURES["roberta"], RobertaConfig(max_position_embeddings=514))
    512
    """
    return int(config.max_position_embeddings) - position_offset(architecture, config)


def position_ids(architecture, config, num_sequences: int, n: int, device) -> torch.Tensor:
    """``(num_sequences, n)`` position ids ``offset, ..., offset + n - 1`` passed to the model.

    Examples
    --------
    >>> from transformers import RobertaConfig
    >>> from approxlab.data.checkpoints import ARCHITECTURES
    >>> from approxlab.data.positions import position_ids
    >>> position_ids(ARCHITECTURES["roberta"], RobertaConfig(), 2, 4, "cpu")
    tensor([[2, 3, 4, 5],
            [2, 3, 4, 5]])
    """
    ids = torch.arange(n, device=device) + position_offset(architecture, config)
    return ids.expand(num_sequences, n)


def _submodule(root, dotted: str):
    """``(parent, attribute name)`` of the module at ``dotted`` below ``root``."""
    *parents, name = dotted.split(".")
    for part in parents:
        root = getattr(root, part)
    return root, name


@contextlib.contextmanager
def positions_for(model, architecture, config, n: int, positions: str):
    """Within the block, ``model``'s learned position table holds the rows for ``n`` tokens.

    The table's own rows when they suffice (``n <= P``, ``positions != "none"``: nothing is
    replaced); else a table of ``offset + n`` rows -- the reserved rows, then
    :func:`position_embeddings` of the rest (zeros for ``"none"``). Restored on exit. Rotary
    models have no table: nothing happens.

    Examples
    --------
    >>> import torch
    >>> from transformers import BertConfig, BertModel
    >>> from approxlab.data.checkpoints import ARCHITECTURES
    >>> from approxlab.data.positions import positions_for
    >>> config = BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
    ...                     max_position_embeddings=16)
    >>> model = BertModel(config)
    >>> with positions_for(model, ARCHITECTURES["bert"], config, 40, "interpolate"):
    ...     print(model.embeddings.position_embeddings.num_embeddings)  # 40 rows for a 40-token window
    40
    >>> model.embeddings.position_embeddings.num_embeddings  # restored
    16
    """
    if architecture.position_table is None:
        yield
        return
    parent, name = _submodule(model, architecture.position_table)
    table = getattr(parent, name)
    offset = position_offset(architecture, config)
    usable = table.num_embeddings - offset
    if positions != "none" and n <= usable:
        yield
        return
    weight = table.weight.detach()
    rows = position_embeddings(weight[offset:], n, positions)
    if rows is None:
        rows = weight.new_zeros(n, weight.shape[1])
    resized = torch.nn.Embedding.from_pretrained(torch.cat([weight[:offset], rows]), freeze=True)
    setattr(parent, name, resized)
    try:
        yield
    finally:
        setattr(parent, name, table)


def check_positions(positions, config, architecture, n: int, max_positions: int) -> str:
    """``positions`` for a model and window length; rotary models need ``n <= max_positions``.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> from transformers import BertConfig
    >>> from approxlab.data.checkpoints import ARCHITECTURES
    >>> from approxlab.data.positions import check_positions
    >>> check_positions("copy", BertConfig(), ARCHITECTURES["bert"], n=4096, max_positions=512)
    'copy'
    >>> try:
    ...     llama = SimpleNamespace(model_type="llama")  # of a rotary model's config, only model_type is read
    ...     check_positions("copy", llama, ARCHITECTURES["llama"], n=64, max_positions=2048)
    ... except ValueError as error:
    ...     print(error)
    `positions` must be 'interpolate' (the model's own positions) for 'llama', whose rotary position embeddings have no table to resample or drop; got 'copy'.
    """
    check_choice(positions, "positions", POSITIONS)
    if architecture.position_table is None:
        if positions != "interpolate":
            raise ValueError(
                f"`positions` must be 'interpolate' (the model's own positions) for {config.model_type!r}, "
                f"whose rotary position embeddings have no table to resample or drop; got {positions!r}."
            )
        if n > max_positions:
            raise ValueError(
                f"`n` must be <= {max_positions} (the context of this {config.model_type!r} model, whose "
                f"rotary positions are not extended beyond it); got n={n}."
            )
        return positions
    kind = getattr(config, "position_embedding_type", "absolute")
    if positions != "none" and kind not in (None, "absolute"):
        raise ValueError(
            f"`positions`={positions!r} needs absolute position embeddings; this model has "
            f"position_embedding_type={kind!r}. Use positions='none'."
        )
    return positions
