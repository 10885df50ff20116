"""
Ridge leverage scores and the statistical dimension
===================================================

Skyformer's Theorem 2 bounds the error of Nyström on the PSD completion
:math:`\\bar C = \\kappa([Q;K]/p^{1/4})` (Eq. (4)) by the number of sampled columns relative to the
statistical dimension :math:`d_{stat}(\\lambda) = \\operatorname{tr}\\bar C(\\bar C+\\lambda I)^{-1}`,
which is the sum of the ridge leverage scores
:math:`\\ell_i(\\lambda) = [\\bar C(\\bar C+\\lambda I)^{-1}]_{ii}`. This example computes both
for one head of real Q/K, exactly and matrix-free, and compares column sampling by uniform
and by ridge-leverage scores.
"""

import matplotlib.pyplot as plt
import torch

import approxlab
import approxlab.data
from approxlab import leverage, metrics

data = approxlab.data.get_qkv("pretrained", 512, window_ids=[0])
q, k, v = (x[0, 0].double() for x in (data.q, data.k, data.v))   # head 0: (512, 32)
x = torch.cat([q, k])                                            # the 2n rows of the completion
completion = approxlab.attention_matrix(x, x, "kernelized")      # (1024, 1024), PSD
lam = 0.1 * metrics.spectral_norm(completion)

scores = metrics.ridge_leverage_scores(completion, lam)
d_stat = metrics.statistical_dimension(completion, lam)
print(f"d_stat = {d_stat:.1f}; leverage scores sum to {float(scores.sum()):.1f}, "
      f"largest {float(scores.max()):.3f}; coherence {metrics.coherence(completion, lam):.3f}")

# %%
# The same quantity without forming the matrix (a block Krylov space for the top eigenvalues,
# the rest of the trace taken exactly, and a small Hutchinson correction with its standard error):

estimate = leverage.estimate_ridge_quantities(
    leverage.completion_operator(q, k), diagonal=1.0, lam=lam, generator=torch.Generator().manual_seed(0))
print(f"matrix-free d_stat = {float(estimate.statistical_dimension):.1f} "
      f"(standard error {float(estimate.standard_error):.2g})")

# %%
# Uniform against ridge-leverage column sampling in ``nystrom`` (the same budget, 2 seeds):

exact = approxlab.exact_attention(q, k, v)
for sampling in ("uniform", "ridge-leverage"):
    errors = []
    for seed in range(2):
        approx = approxlab.approximate("nystrom", q, k, v, num_features=64, sampling=sampling,
                                       generator=torch.Generator().manual_seed(seed))
        errors.append(metrics.spectral_error(approx.output, exact, relative=True))
    print(f"nystrom, {sampling:14}: relative errors " + ", ".join(f"{e:.3f}" for e in errors))

fig, ax = plt.subplots(figsize=(5, 3.5))
ax.plot(scores.sort(descending=True).values)
ax.set(yscale="log", xlabel="rank of the row", ylabel="ridge leverage score",
       title=f"completion of head 0, d_stat = {d_stat:.0f}")
fig.tight_layout()
