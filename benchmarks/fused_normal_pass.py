"""One pass of the matrix-free spectral error: the library's orientation of its thin products against the former one.

    PYTHONPATH=$PWD python3 benchmarks/fused_normal_pass.py                 # n = 32,768, p = 32, b = 4, one thread
    PYTHONPATH=$PWD python3 benchmarks/fused_normal_pass.py --n 8192 --block 32

:func:`approxlab.linalg.fused_normal_pass` forms each row block ``S_I`` of the softmax matrix once and needs two thin
products with it, ``S_I x`` and ``S_I^T R_I``. It computes them as ``x^T S_I^T`` and ``R_I^T S_I`` (``x`` and the
accumulated ``Z^T`` kept as ``(b, n)``); ``former`` below is the same pass with the products as written, ``S_I x`` and
``S_I^T R_I`` (the library's code before this orientation). Timed in turn in one run (median of ``--repeats``) with
one forward of torch's fused ``scaled_dot_product_attention`` on the same head as 4-D ``(1, 1, n, p)`` tensors, the
ratio's yardstick; Nyströmformer (64 landmarks) is the approximation. Prints one line per path and the largest
relative difference of the two passes' ``M^T M x``; writes ``benchmarks/results/fused_normal_pass.md``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

import approxlab
from approxlab.linalg import fused_normal_pass
from approxlab.linalg.normal_lanczos import default_row_block
from approxlab.studies.bench.timing import measure_interleaved
from approxlab.synthetic import synthetic_qkv

OUT = Path(__file__).resolve().parent / "results" / "fused_normal_pass.md"


def former(q, k, approx_op, x):
    """The pass with its thin products as written (``S_I x``, ``S_I^T R_I``), float32 products, float64 sums."""
    n = q.shape[-2]
    rows = default_row_block(n)
    qs, kt, xc = q * q.shape[-1] ** -0.5, k.transpose(-1, -2), x.to(torch.float32)
    approx_x = approx_op.matmat(x.to(approx_op.dtype)).to(torch.float64)
    residual = torch.empty(n, x.shape[-1], dtype=torch.float64)
    accumulated = torch.zeros(n, x.shape[-1], dtype=torch.float64)
    for start in range(0, n, rows):
        block = torch.softmax(qs[start:start + rows] @ kt, dim=-1)
        r_block = approx_x[start:start + rows] - (block @ xc).to(torch.float64)
        residual[start:start + rows] = r_block
        accumulated += (block.transpose(-1, -2) @ r_block.to(torch.float32)).to(torch.float64)
    return approx_op.rmatmat(residual.to(approx_op.dtype)).to(torch.float64) - accumulated, residual


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=32768)
    parser.add_argument("--p", type=int, default=32)
    parser.add_argument("--block", type=int, default=4, help="vectors per pass (normal_block_lanczos's block)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    q, k, v = synthetic_qkv((), args.n, args.p, scale=1.0, generator=torch.Generator().manual_seed(0),
                            dtype=torch.float32)
    op = approxlab.approximate("nystromformer", q, k, v, num_features=64).operator()
    x = torch.randn(args.n, args.block, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q4, k4, v4 = (t[None, None] for t in (q, k, v))
    paths = {"fused_normal_pass": lambda: fused_normal_pass(q, k, op, x), "former": lambda: former(q, k, op, x),
             "torch-sdpa (4-D)": lambda: sdpa(q4, k4, v4)}
    timed = dict(zip(paths, measure_interleaved(list(paths.values()), repeats=args.repeats, warmup=1)))
    new, old = fused_normal_pass(q, k, op, x)[0], former(q, k, op, x)[0]
    difference = float((new - old).abs().max() / old.abs().max())
    base = timed["torch-sdpa (4-D)"].wall_s
    lines = [f"# One fused normal pass, n = {args.n}, p = {args.p}, b = {args.block}, {args.threads} thread(s)", "",
             f"`PYTHONPATH=$PWD python3 benchmarks/fused_normal_pass.py --n {args.n} --p {args.p} --block {args.block}"
             f" --threads {args.threads}`; median of {args.repeats} calls each, timed in turn; load average"
             f" {os.getloadavg()[0]:.2f} at the end.", "",
             "| path | wall s | x torch SDPA (4-D) |", "|---|---:|---:|"]
    for name, m in timed.items():
        lines.append(f"| {name} | {m.wall_s:.3f} | {m.wall_s / base:.1f} |")
    lines += ["", f"former / fused_normal_pass: {timed['former'].wall_s / timed['fused_normal_pass'].wall_s:.2f}x; "
                  f"largest difference of their M^T M x, relative to its largest entry: {difference:.1e}"]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
