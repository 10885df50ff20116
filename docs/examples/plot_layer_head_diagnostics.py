"""
One layer's and one head's diagnostics
======================================

Q/K/V of one layer of a model, as its own attention receives them
(:func:`approxlab.data.get_qkv`), then the spectral quantities the studies tabulate for one head:
the singular values of the score, softmax and kernelized matrices, their numerical, stable and
effective ranks, their condition numbers, and the statistical dimension of Skyformer's completion.
"""

import matplotlib.pyplot as plt
import torch

import approxlab
import approxlab.data
from approxlab import metrics

layer, head, n = 2, 3, 512
data = approxlab.data.get_qkv("pretrained", n, window_ids=[0], layer=layer)  # hidden states entering layer 2
q, k = (x[0, head].double() for x in (data.q, data.k))                        # (512, 32)
print(f"MiniLM layer {layer}, head {head}: q {tuple(q.shape)}, causal={data.causal}")

matrices = {kind: approxlab.attention_matrix(q, k, kind) for kind in ("scores", "softmax", "kernelized")}
for kind, m in matrices.items():
    print(f"{kind:11} numerical rank {metrics.numerical_rank(m):4d}  "
          f"stable rank {metrics.stable_rank(m):6.2f}  effective rank {metrics.effective_rank(m):6.1f}  "
          f"condition number {metrics.condition_number(m):.3g}")

completion = approxlab.attention_matrix(torch.cat([q, k]), torch.cat([q, k]), "kernelized")  # Skyformer Eq. (4)
lam = 0.1 * metrics.spectral_norm(completion)
print(f"d_stat of the 2n x 2n completion at lambda = 0.1 ||C||_2: {metrics.statistical_dimension(completion, lam):.1f}")

# %%
# Normalised singular values, down to the float64 noise floor ``n * eps``:

fig, ax = plt.subplots(figsize=(5, 3.5))
for kind, m in matrices.items():
    sigma = torch.linalg.svdvals(m)
    ax.plot(torch.arange(1, n + 1), sigma / sigma[0], label=kind)
ax.axhline(n * torch.finfo(torch.float64).eps, color="gray", linestyle="--", label="n eps")
ax.set(xscale="log", yscale="log", xlabel="index i", ylabel="sigma_i / sigma_1",
       title=f"layer {layer}, head {head}, n = {n}")
ax.legend()
fig.tight_layout()
