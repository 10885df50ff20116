"""
Your own method against the built-ins
=====================================

A method is a function ``f(q, k, v, *, num_features, generator=None, **options)`` returning the
approximate output, or an :class:`~approxlab.methods.Approximation` that also carries its matrix
or operator. :func:`approxlab.methods.register` gives it a name; from then on
:func:`approxlab.approximate`, every study's ``--methods`` and every shared test take it like a
built-in, with the same checks of its inputs and of its result.

Here "top-k" keeps, for each query, the softmax over its ``num_features`` largest logits, and is
compared with three built-ins on the 12 heads of the pretrained MiniLM at layer 0, on a window of
Wikitext-2, by the relative spectral error of the attention output (:doc:`/error`).
"""

import matplotlib.pyplot as plt
import torch

import approxlab
import approxlab.data
from approxlab.methods import Approximation, register
from approxlab.metrics import spectral_error


@register("top-k", target="softmax", features="kept keys per query", randomized=False)
def top_k(q, k, v, *, num_features, generator=None):
    logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    kept = logits.topk(num_features, dim=-1)
    weights = torch.zeros_like(logits).scatter(-1, kept.indices, kept.values.softmax(-1))
    return Approximation("top-k", "softmax", weights @ v, matrix=weights)


data = approxlab.data.get_qkv("pretrained", 1024, window_ids=[0])  # (1, 12, 1024, 32)
q, k, v = (x[0].double() for x in (data.q, data.k, data.v))        # 12 heads, float64
exact = approxlab.exact_attention(q, k, v)

features = [16, 64, 256]
methods = ["top-k", "skyformer-softmax", "nystromformer", "performer"]
median = {}
for name in methods:
    median[name] = []
    for d in features:
        approx = approxlab.approximate(name, q, k, v, num_features=d,
                                       generator=torch.Generator().manual_seed(0))
        error = spectral_error(approx.output, exact, relative=True)  # one per head, float64
        median[name].append(float(error.quantile(0.5)))
    print(f"{name:18}", " ".join(f"{e:.3f}" for e in median[name]))

# %%
# The median over the 12 heads against the budget ``num_features``:

fig, ax = plt.subplots(figsize=(6.5, 3.5))
for name in methods:
    ax.plot(features, median[name], marker="o", label=name)
ax.set(xscale="log", yscale="log", xlabel="num_features d",
       ylabel="median relative spectral error")
ax.set_xticks(features, [str(d) for d in features])
ax.minorticks_off()
ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1))
fig.tight_layout()

# %%
# The registration lives in this process only; ``approxlab.methods.unregister("top-k")`` removes
# it. Saved as a module, the same code is loaded into every study (and every Dask worker) by
# ``approxlab figure1 --plugin my_attention --methods top-k,skyformer-softmax``.
approxlab.methods.unregister("top-k")
