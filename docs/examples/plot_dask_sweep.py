"""
A sweep on Dask
===============

A grid of (method, num_features, seed) cells, each an independent task, computed by Dask and
gathered into a tidy table. The studies do the same on a local cluster with
``approxlab figure1 --workers 2`` or on a running scheduler with ``--scheduler tcp://HOST:PORT``
(:func:`approxlab.studies.run_cells`, resumable); here Dask's threaded scheduler keeps the
example in one process. Each cell takes its randomness from its own generator, so the table does
not depend on the order in which the cells run.
"""

import dask
import matplotlib.pyplot as plt
import pandas as pd
import torch

import approxlab
from approxlab.metrics import spectral_error
from approxlab.synthetic import synthetic_qkv

q, k, v = synthetic_qkv((4,), 512, 32, scale=1.0, generator=torch.Generator().manual_seed(0))
exact = approxlab.exact_attention(q, k, v)


def cell(method, d, seed):
    approx = approxlab.approximate(method, q, k, v, num_features=d,
                                   generator=torch.Generator().manual_seed(seed))
    error = spectral_error(approx.output, exact, relative=True)
    return [{"method": method, "num_features": d, "seed": seed, "batch": b, "error": float(e)}
            for b, e in enumerate(error)]


grid = [(m, d, s) for m in ("skyformer-softmax", "nystromformer", "performer", "linformer")
        for d in (16, 64, 256) for s in range(2)]
cells = dask.compute(*[dask.delayed(cell)(*c) for c in grid], scheduler="threads", num_workers=2)
table = pd.DataFrame([row for rows in cells for row in rows])
summary = table.groupby(["method", "num_features"]).error.median().unstack()
print(summary.round(3))

# %%
fig, ax = plt.subplots(figsize=(6.5, 3.5))
for method, row in summary.iterrows():
    ax.plot(row.index, row.values, marker="o", label=method)
ax.set(xscale="log", yscale="log", xlabel="num_features d", ylabel="median relative spectral error")
ax.set_xticks(summary.columns, [str(d) for d in summary.columns])
ax.minorticks_off()
ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1))
fig.tight_layout()
