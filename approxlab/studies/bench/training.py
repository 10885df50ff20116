r"""The ``training`` part of ``approxlab bench``: a training step of each attention against SDPA.

One training step -- forward, backward and one Adam step (lr ``1e-4``) -- of
:class:`approxlab.training.TinyEncoder` (Skyformer Section 5: 2 layers, embedding 64, feed-forward
128, 2 heads, ``num_features`` landmarks) with each attention of
:data:`approxlab.training.ATTENTIONS` (the options of
:data:`~approxlab.training.TRAINING_OPTIONS`), against the same model whose attention is
:func:`torch.nn.functional.scaled_dot_product_attention` itself with a boolean key-padding mask
(``torch-sdpa``: the pure-SDPA model of the same shape). Every model starts from the same weights
and steps on the same padded batch: random token ids, real lengths drawn uniformly between
``n/2`` and ``n`` (padded as ListOps and Pathfinder batches are), so every attention runs its
masked path. The steps run on ``training_threads`` torch threads: ``--training-threads``, else the
common ``--threads`` of ``approxlab bench`` when it is given, else 1 whatever ``$OMP_NUM_THREADS``
says (one, as the studies train: one thread per worker process; with more threads than idle
cores, OpenMP's barriers make the many mid-sized kernels of the landmark methods wait on
descheduled threads, which says more about the machine's load than about the method). The models are timed in turn (:func:`~approxlab.studies.bench.timing.measure_interleaved`:
one warm-up step each, then ``repeats`` rounds of one step per model), so the ratio of medians
``ratio_vs_sdpa`` compares like with like; ``softmax`` (approxlab's exact attention, also through
the fused kernel) measured beside ``torch-sdpa`` shows the spread of such a ratio. After the
timed steps every parameter and gradient of every model is checked finite
(``finite_gradients``). Target: every ratio within 3 on CPU.
"""

from __future__ import annotations

import math

import torch

from ...tasks import Batch
from ...training import ATTENTIONS, TinyEncoder
from .timing import measure_interleaved

__all__ = ["TARGET", "TorchSdpaEncoder", "padded_batch", "training_rows", "training_lines"]

TARGET = 3.0
"""The bound on a training step's ``ratio_vs_sdpa``."""

VOCAB_SIZE = 32
NUM_CLASSES = 10


class TorchSdpaEncoder(TinyEncoder):
    """:class:`~approxlab.training.TinyEncoder` whose attention is torch's
    ``scaled_dot_product_attention`` called directly, with the boolean key-padding mask (the
    baseline of the training part)."""

    def _attend(self, seed, key_mask):
        attn_mask = None if key_mask is None else key_mask.unsqueeze(-2)  # (batch, 1, 1, n)
        return lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


def padded_batch(n: int, batch_size: int, *, seed: int, device="cpu"):
    """A classification :class:`approxlab.tasks.Batch` of ``batch_size`` sequences of ``n`` tokens,
    real lengths uniform in ``[ceil(n/2), n]`` (at least one sequence unpadded), token 0 on padding."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(math.ceil(n / 2), n + 1, (batch_size,), generator=g)
    lengths[0] = n
    mask = torch.arange(n) < lengths[:, None]
    ids = torch.randint(1, VOCAB_SIZE, (batch_size, n), generator=g).masked_fill(~mask, 0)
    labels = torch.randint(0, NUM_CLASSES, (batch_size,), generator=g)
    return Batch(ids.to(device), mask.to(device), labels.to(device))


def _step(model, batch):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(batch, seed=0)[1].backward()
        optimizer.step()

    return step


def _finite(model) -> bool:
    return all(bool(torch.isfinite(p).all()) and (p.grad is None or bool(torch.isfinite(p.grad).all()))
               for p in model.parameters())


def training_rows(cell: dict) -> list[dict]:
    """Rows of the ``training`` cell: the baseline ``torch-sdpa`` and one row per attention, each
    with ``ratio_vs_sdpa`` (wide rows, before the bench's ``_tidy``)."""
    config, device = cell["config"], cell["device"]
    n, features = int(config["training_n"]), int(config["training_features"])
    batch = padded_batch(n, int(config["training_batch"]), seed=config["seed"], device=device)
    shape = {"vocab_size": VOCAB_SIZE, "n": n, "num_features": features, "num_classes": NUM_CLASSES}
    models = {"torch-sdpa": TorchSdpaEncoder(**shape, generator=torch.Generator().manual_seed(config["seed"]))}
    for attention in config["training_attentions"]:
        models[attention] = TinyEncoder(**shape, attention=attention,
                                        generator=torch.Generator().manual_seed(config["seed"]))
    steps = [_step(model.to(device), batch) for model in models.values()]
    threads = torch.get_num_threads()
    torch.set_num_threads(int(config["training_threads"]))
    try:
        measurements = measure_interleaved(steps, repeats=max(5, int(config["repeats"])), warmup=1, device=device)
    finally:
        torch.set_num_threads(threads)
    base = models["torch-sdpa"]
    common = {"p": base.token_embedding.embedding_dim // base.blocks[0].num_heads, "num_features": features,
              "batch": int(config["training_batch"]), "real_tokens": int(batch.mask.sum()),
              "threads": int(config["training_threads"]), "compute_dtype": "float32"}
    return [{"algorithm": name, **common, **m.as_row(), "ratio_vs_sdpa": m.wall_s / measurements[0].wall_s,
             "finite_gradients": float(_finite(model))}
            for (name, model), m in zip(models.items(), measurements)]


def training_lines(wide) -> list[str]:
    """The summary's "Training step" section, from the saved table (empty without the part)."""
    rows = wide[wide["part"] == "training"]
    if rows.empty:
        return []
    base = rows[rows["algorithm"] == "torch-sdpa"].iloc[0]
    first = rows.iloc[0]
    lines = ["## Training step against a pure-SDPA model", "",
             f"One step (forward, backward, Adam) of the 2-layer TinyEncoder (embedding 64, 2 heads of p = 32), "
             f"batch {int(first['batch'])} x n = {int(first['n'])} ({int(first['real_tokens'])} real tokens, "
             f"the rest padding), num_features = {int(first['num_features'])}, float32, {int(first['threads'])} "
             f"torch thread(s), against the same model with torch's `scaled_dot_product_attention` "
             f"({base['wall_s']:.3f} s per step); the models timed in turn, median of the rounds.", "",
             "| attention | approxlab method | seconds | SDPA model seconds | ratio | target | met | finite gradients |",
             "|---|---|---|---|---|---|---|---|"]
    order = {name: i for i, name in enumerate(ATTENTIONS)}
    attentions = rows[rows["algorithm"] != "torch-sdpa"]
    for _, row in attentions.sort_values("algorithm", key=lambda names: names.map(order)).iterrows():
        ratio = float(row["ratio_vs_sdpa"])
        lines.append(f"| {row['algorithm']} | `{ATTENTIONS.get(row['algorithm'], '?')}` | {row['wall_s']:.3f} | "
                     f"{base['wall_s']:.3f} | {ratio:.2f} | <= {TARGET:g} | {'yes' if ratio <= TARGET else 'no'} | "
                     f"{'yes' if row['finite_gradients'] == 1.0 else 'no'} |")
    load = rows["load_average"].agg(["min", "max"])
    return lines + ["", f"1-minute load average during these steps: {load['min']:.1f} to {load['max']:.1f}.", ""]
