r"""The tiny encoder of Skyformer Section 5 and the attentions it trains with.

:class:`TinyEncoder` is the 2-layer encoder (embedding 64, feed-forward 128, 2 heads) whose
attention is any approxlab method named in :data:`ATTENTIONS`, trained with the method options
of :data:`TRAINING_OPTIONS`. The instability score and the training loops that use it live in
:mod:`approxlab.training.loops`; the references are those of :mod:`approxlab.training`.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F

from .._validation import as_generator, check_choice, check_int
from ..methods import registry
from ..tasks import IGNORE_INDEX

__all__ = ["ATTENTIONS", "TRAINING_OPTIONS", "TinyEncoder"]

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
    tokens + a 2-layer classifier (``kind="classification"``); two towers for pairs
    (``kind="pair-classification"``, LRA's Retrieval: each sequence of a ``(batch, 2, n)`` pair
    encoded by the same encoder and mean-pooled to ``u`` and ``v``, then the 2-layer classifier
    on ``[u, v, u * v, u - v]``); or a masked-LM decoder tied to the token embeddings
    (``kind="mlm"``). Dropout (``dropout``, default 0) where the LRA
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
    kind : {"classification", "pair-classification", "mlm"}
    num_classes : int, optional
        Required for the two classification kinds.
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
    layers as returned by the encoder of the LRA code Skyformer trains with; for a pair task,
    both towers' embeddings, ``(batch, 2, n, embedding_dim)``. Padding tokens
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
        check_choice(kind, "kind", ("classification", "pair-classification", "mlm"))
        if kind != "mlm":
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
            if kind != "mlm":
                pooled = 4 if kind == "pair-classification" else 1  # pairs: [u, v, u * v, u - v]
                self.head = torch.nn.Sequential(
                    torch.nn.Linear(pooled * embedding_dim, hidden_dim, **kw),
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
        if self.kind != "mlm":
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
        """:math:`f(x, W)`: ``input_ids (*batch, n) -> (*batch, n, embedding_dim)``.

        Every sequence is encoded on its own (a pair ``(batch, 2, n)`` is ``2 batch`` sequences,
        one attention call per layer for all of them). ``seed`` fixes the random draws of
        randomized attentions (layer ``l`` uses ``seed + l``); ``mask``, shaped like
        ``input_ids``, bool, True on real tokens, masks padding keys in every attention (``None``
        or all True: no mask). ``attention_outputs``: a list that receives each layer's attention
        output ``(sequences, n, embedding_dim)`` (the heads concatenated, before the output
        projection; detached), first layer first.
        """
        shape, n = input_ids.shape, input_ids.shape[-1]
        if input_ids.ndim != 2:
            input_ids = input_ids.reshape(-1, n)
            mask = None if mask is None else mask.reshape(-1, n)
        key_mask = None if mask is None or bool(mask.all()) else mask.unsqueeze(-2)  # (batch, 1, n): all heads
        drop = self._dropout(seed)
        x = drop(self.token_embedding(input_ids) + self._position_vectors(n, input_ids.device))
        for layer, block in enumerate(self.blocks):
            x = block(x, self._attend(seed + layer, key_mask), attention_outputs, drop)
        return self.norm(x).reshape(*shape, x.shape[-1])

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
        """Mean pooling over real tokens, then the classifier: ``(batch, num_classes)``; for pairs,
        the pooled towers ``u, v`` enter as ``[u, v, u * v, u - v]`` (LRA's two-tower retrieval)."""
        weights = mask.to(embedding.dtype).unsqueeze(-1)
        pooled = (embedding * weights).sum(-2) / weights.sum(-2).clamp_min(1.0)
        if self.kind == "pair-classification":
            if embedding.ndim != 4 or embedding.shape[1] != 2:
                raise ValueError("a pair-classification model needs `input_ids` of shape (batch, 2, n); got "
                                 f"{tuple(embedding.shape[:-1])}.")
            u, v = pooled.unbind(-2)
            pooled = torch.cat([u, v, u * v, u - v], dim=-1)
        return self.head(pooled)

    def predict(self, batch, *, seed: int = 0, attention_outputs=None) -> torch.Tensor:
        """Class logits ``(batch, num_classes)`` of a classification model (see :meth:`embed`
        for ``attention_outputs``)."""
        if self.kind == "mlm":
            raise ValueError(f"`predict` needs a classification model; this one has kind={self.kind!r}.")
        embedding = self.embed(batch.input_ids, seed=seed, mask=batch.mask, attention_outputs=attention_outputs)
        return self._class_logits(embedding, batch.mask)

    def forward(self, batch, *, seed: int = 0):
        """``(f(x, W), loss)`` for an :class:`approxlab.tasks.Batch` (cross-entropy loss)."""
        embedding = self.embed(batch.input_ids, seed=seed, mask=batch.mask)
        if self.kind != "mlm":
            loss = F.cross_entropy(self._class_logits(embedding, batch.mask), batch.labels)
        else:
            selected = batch.labels != IGNORE_INDEX
            hidden = embedding[selected]  # only masked positions reach the vocabulary
            logits = hidden @ self.token_embedding.weight.T + self.head["bias"]
            loss = F.cross_entropy(logits, batch.labels[selected])
        return embedding, loss
