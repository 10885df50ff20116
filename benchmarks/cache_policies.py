"""The cache policies that read the prompt's attention (Compactor, H2O, observed attention) against torch's fused SDPA.

Two checks, in one process on one thread, each policy timed in turn with its baseline
(:func:`approxlab.studies.bench.timing.measure_interleaved`: one warm-up call each, then the median of
``--repeats`` rounds, in wall and in process CPU seconds, the steadier reading on a shared machine):

* **causal forms**: Q/K/V of 3 heads of width 64 in float32 (standard normal, seeded), a budget of 128 keys, at
  n = 2048, 4096, 8192 (``--n``), each policy in its causal form and through ``kv_cache_attention`` (the calls of
  ``approxlab bench --parts causal``) against causal SDPA as one 4-D call
  (:func:`approxlab.studies.bench.baseline.torch_sdpa`); target at the largest n: the bench's scorer target;
* **in the model** (``--model``): SmolLM2-135M on the first 2,048 WikiText-2 test tokens, every layer patched by
  the policy (``patch_attention``, budget 128) against the unpatched forward; target: the bench's every-layer
  target.

Each line prints the ratios, the target, "met"/"not met" (by the median wall time and by the median CPU time) and
the 1-minute load average when the line's calls ended.

Run: ``nice -n 5 python3 benchmarks/cache_policies.py --model`` from the repository root (``PYTHONPATH=.``).
"""

from __future__ import annotations

import argparse

import torch

from approxlab.studies.bench.baseline import torch_sdpa
from approxlab.studies.bench.causal import HEAD_DIM, HEADS, SCORER_TARGET, _call
from approxlab.studies.bench.patched import ALL_LAYERS_N, ALL_LAYERS_TARGET, load_decoder
from approxlab.studies.bench.timing import measure_interleaved

METHODS = ("compactor", "h2o", "observed-attention")
FORMS = ("causal", "kv-cache")


def verdict(ratio: float, target: float) -> str:
    return "met" if ratio <= target else "not met"


def line(n, name, m, base, target, largest) -> str:
    wall, cpu = m.wall_s / base.wall_s, m.cpu_s / base.cpu_s
    judged = (f"{verdict(wall, target)} | {verdict(cpu, target)}" if largest else "— | —")
    return (f"{n} | {name} | {m.wall_s:.4f} | {m.cpu_s:.4f} | {wall:.2f} | {cpu:.2f} | <= {target:g}x | {judged} | "
            f"{m.load_average:.1f}")


def causal_forms(sizes, methods, budget, repeats) -> None:
    print("n | policy | wall s | CPU s | wall / SDPA | CPU / SDPA | target | met (wall) | met (CPU) | load (1 min)")
    print("---|---|---|---|---|---|---|---|---|---")
    for n in sizes:
        generator = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(HEADS, n, HEAD_DIM, generator=generator) for _ in range(3))
        names = [f"{form}/{method}" for method in methods for form in FORMS]
        calls = [_call(form, method, q, k, v, budget) for method in methods for form in FORMS]
        base, *measured = measure_interleaved([lambda: torch_sdpa(q, k, v, causal=True), *calls], repeats=repeats)
        print(f"{n} | fused causal SDPA (4-D) | {base.wall_s:.4f} | {base.cpu_s:.4f} | 1 | 1 | — | — | — | "
              f"{base.load_average:.1f}")
        for name, m in zip(names, measured):
            print(line(n, name, m, base, SCORER_TARGET, n == max(sizes)))


def in_the_model(methods, budget, repeats) -> None:
    from approxlab.patching import patch_attention

    model, ids = load_decoder("bert")
    input_ids = ids[:ALL_LAYERS_N].reshape(1, ALL_LAYERS_N)

    def patched(method):
        def forward():
            with patch_attention(model, method, num_features=budget, generator=torch.Generator().manual_seed(0)):
                model(input_ids)
        return forward

    print("n | every layer patched by | wall s | CPU s | wall / unpatched | CPU / unpatched | target | met (wall) | "
          "met (CPU) | load (1 min)")
    print("---|---|---|---|---|---|---|---|---|---")
    with torch.no_grad():
        base, *measured = measure_interleaved([lambda: model(input_ids), *(patched(m) for m in methods)],
                                              repeats=repeats)
    print(f"{ALL_LAYERS_N} | (unpatched) | {base.wall_s:.4f} | {base.cpu_s:.4f} | 1 | 1 | — | — | — | "
          f"{base.load_average:.1f}")
    for method, m in zip(methods, measured):
        print(line(ALL_LAYERS_N, method, m, base, ALL_LAYERS_TARGET, True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", action="store_true", help="also every layer of SmolLM2 patched")
    parser.add_argument("--no-causal", action="store_true", help="only the model")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not args.no_causal:
        causal_forms(args.n, args.methods, args.budget, args.repeats)
    if args.model:
        print()
        in_the_model(args.methods, args.budget, args.repeats)


if __name__ == "__main__":
    main()
