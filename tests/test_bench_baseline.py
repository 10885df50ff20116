"""Every SDPA that ``approxlab bench`` times as a baseline runs on torch's fused kernel.

Each part's baseline call runs inside ``torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)``, the
only fused kernel of torch on CPU: a call the kernel cannot take (3-D inputs, which torch sends to its
unfused math path) raises ``RuntimeError: No available kernel`` there instead of running 6x slower. A
structural check, not a timing: it passes or fails alike on a loaded machine.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from approxlab.studies.bench.baseline import torch_sdpa


def fused_only():
    """Torch's SDPA with its fused CPU kernel as the only one allowed."""
    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


def _qkv(*shape, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=generator, dtype=dtype) for _ in range(3))


def test_plain_three_dimensional_sdpa_is_refused_by_the_fused_kernel():
    """The check can fail: torch's SDPA on ``(heads, n, p)`` is not a fused call."""
    q, k, v = _qkv(3, 32, 16)
    with fused_only(), pytest.warns(UserWarning), pytest.raises(RuntimeError, match="No available kernel"):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("shape", [(3, 40, 16), (2, 3, 40, 16), (1, 40, 16)])
@pytest.mark.parametrize("causal", [False, True])
def test_torch_sdpa_is_one_fused_call_equal_to_softmax_attention(shape, causal):
    q, k, v = _qkv(*shape, dtype=torch.float64)
    with fused_only():
        out = torch_sdpa(q, k, v, causal=causal)
    logits = q @ k.transpose(-1, -2) / shape[-1] ** 0.5
    if causal:
        logits = logits.masked_fill(torch.ones(shape[-2], shape[-2], dtype=torch.bool).triu(1), float("-inf"))
    assert out.shape == shape
    torch.testing.assert_close(out, torch.softmax(logits, dim=-1) @ v, rtol=1e-12, atol=1e-12)


def test_the_causal_part_times_causal_sdpa_on_the_fused_kernel(monkeypatch):
    """The causal part built Q, K, V as ``(3, n, 64)`` and handed them to SDPA as they were: torch's unfused
    math path, 6.2x the fused kernel at n = 4,096 on one thread."""
    from approxlab.studies.bench import causal

    monkeypatch.setattr(causal, "policies", lambda methods=None: [])  # the baseline and the math path alone
    assert causal.cell_methods() == [causal.MATH_PATH]
    with fused_only():
        rows = causal.causal_rows({"config": {"causal_budget": 8, "seed": 0, "repeats": 1}, "n": 64,
                                   "method": causal.MATH_PATH, "device": "cpu"})
    assert [row["algorithm"] for row in rows] == [causal.SDPA, causal.MATH_PATH] and rows[0]["wall_s"] > 0


def test_the_forward_and_ratios_parts_time_sdpa_on_the_fused_kernel():
    from approxlab.studies.bench import forward, ratios

    q, k, v = _qkv(1, 64, 32)
    config = {"repeats": 1, "dense_max_n": 64}
    common = {"p": 32, "num_features": 8, "dtype": "float32"}
    with fused_only():
        rows = forward.forward_rows(config, "exact", q, k, v, 64, common, "cpu")
        rows += ratios._operator_ratio_rows(config, q, k, v, common, "cpu")
    assert {"torch-sdpa", "torch-sdpa-causal", "exact-sdpa", "operator-matmat"} <= {row["algorithm"] for row in rows}


def test_the_training_part_baseline_steps_on_the_fused_kernel():
    """Forward and backward of the pure-SDPA encoder, ``(batch, heads, n, p)`` with its key-padding mask."""
    from approxlab.studies.bench.training import training_rows

    config = {"training_n": 16, "training_features": 4, "training_batch": 2, "training_attentions": [],
              "training_threads": 1, "repeats": 1, "seed": 0}
    with fused_only():
        (row,) = training_rows({"config": config, "device": "cpu"})
    assert row["algorithm"] == "torch-sdpa" and row["finite_gradients"] == 1.0


def test_exact_attention_the_figure1_and_patch_baseline_runs_fused():
    """The Figure-1 cell's baseline (float64, 12 heads) and the patch part's layer attention (causal) are
    :func:`approxlab.exact_attention`: torch's CPU flash op, or its public SDPA on 4-D inputs."""
    from approxlab import exact_attention

    q, k, v = _qkv(12, 48, 16, dtype=torch.float64)
    with fused_only():
        out = exact_attention(q, k, v)
        causal_out = exact_attention(q[:3].float(), k[:3].float(), v[:3].float(), causal=True)
    torch.testing.assert_close(out, torch_sdpa(q, k, v))
    torch.testing.assert_close(causal_out, torch_sdpa(q[:3].float(), k[:3].float(), v[:3].float(), causal=True))


def test_the_unpatched_decoder_of_the_patch_part_runs_fused():
    """The patch part's baseline: the decoder as it is, every layer through its SDPA (the synthetic decoder)."""
    pytest.importorskip("transformers")
    from approxlab.studies.bench.patched import load_decoder

    model, ids = load_decoder("synthetic")
    with fused_only(), torch.no_grad():
        hidden = model(ids[:32].reshape(1, 32)).last_hidden_state
    assert hidden.shape[:2] == (1, 32)


def test_the_causal_summary_names_its_baseline_targets_and_the_former_baseline():
    """Each ratio is against fused causal SDPA (4-D), printed with its target and met or not; the math path timed
    beside it says by how much the former (3-D) baseline overstated."""
    import pandas as pd

    from approxlab.studies.bench.causal import BASELINE, MATH_PATH, SDPA, causal_lines

    rows = []
    for n, scale in ((2048, 1.0), (4096, 4.0), (8192, 16.0)):
        common = {"part": "causal", "n": n, "num_features": 128}
        rows += [{**common, "algorithm": SDPA, "wall_s": 0.01 * scale},
                 {**common, "algorithm": MATH_PATH, "wall_s": 0.06 * scale, "ratio_vs_sdpa": 6.0},
                 {**common, "algorithm": "causal/topk", "wall_s": 0.04 * scale, "ratio_vs_sdpa": 4.0},
                 {**common, "algorithm": "causal/snapkv", "wall_s": 0.01 * scale, "ratio_vs_sdpa": 1.0},
                 {**common, "algorithm": "causal/streaming-llm", "wall_s": 0.002 * scale, "ratio_vs_sdpa": 0.2}]
    text = "\n".join(causal_lines(pd.DataFrame(rows)))
    assert f"## Causal forms against {BASELINE}" in text and BASELINE == "fused causal SDPA (4-D)"
    assert "| `causal/topk` | 4.00, 4.00, 4.00 | 4.00 (<= 3x) | — | 2.00 [2.00, 2.00] | not met: 4.00x at n = 8192" in text
    assert "| `causal/snapkv` | 1.00, 1.00, 1.00 | 1.00 (<= 1.5x) | — | 2.00 [2.00, 2.00] | met |" in text
    assert "| `causal/streaming-llm` | 0.20, 0.20, 0.20 | 0.20 (<= 0.5x) |" in text  # exponent 2 > 1.1: not met
    assert "Met: 1 of 3 policies; not met: `causal/streaming-llm`, `causal/topk`." in text
    assert "### Changes: the former baseline" in text and "0.9600 s (6.00x) at n = 8192" in text
    assert MATH_PATH not in text.split("### Changes")[0]  # the former baseline is no policy of the table
    partial = "\n".join(causal_lines(pd.DataFrame([row for row in rows if row["n"] < 8192]), planned=[2048, 4096, 8192]))
    assert "**A partial run**: n = 8192 of its grid not measured yet" in partial and "Met:" not in partial
    assert "| `causal/topk` | 4.00, 4.00 | 4.00 (<= 3x) | — | 2.00 | not judged (partial run) |" in partial

def test_a_missed_growth_exponent_says_its_cpu_time_exponent_and_quests_reason():
    """The exponent target is judged on the wall times; a miss says the exponent of the CPU times beside it (load
    inflates wall time only) and, for Quest, why its published algorithm is not linear in n."""
    import pandas as pd

    from approxlab.studies.bench.causal import EXPONENT_REASONS, SDPA, _verdict, causal_lines
    from approxlab.studies.bench.growth import Growth

    wall, cpu = Growth(1.84, 1.12, 2.57, 5, 2048, 8192), Growth(1.39, 1.09, 1.69, 5, 2048, 8192)
    assert _verdict("causal", "quest", {8192: 1.3}, wall, cpu) == (
        "not met: growth exponent 1.84 (target <= 1.1; 1.39 [1.09, 1.69] in CPU time): page scoring O(n^2 p / page) "
        "by design")
    assert EXPONENT_REASONS == {"quest": "page scoring O(n^2 p / page) by design"}
    assert _verdict("causal", "h2o", {8192: 0.7}, wall) == "not met: growth exponent 1.84 (target <= 1.1)"
    assert _verdict("causal", "h2o", {8192: 0.7}, Growth(1.05, 0.9, 1.2, 5, 2048, 8192), cpu) == "met"
    rows = []
    for n, wall_s, cpu_s in ((2048, 0.01, 0.01), (4096, 0.04, 0.02), (8192, 0.16, 0.04)):
        common = {"part": "causal", "n": n, "num_features": 128}
        rows += [{**common, "algorithm": SDPA, "wall_s": 1.0, "cpu_s": 1.0},
                 {**common, "algorithm": "causal/h2o", "wall_s": wall_s, "cpu_s": cpu_s, "ratio_vs_sdpa": 0.5}]
    text = "\n".join(causal_lines(pd.DataFrame(rows)))
    assert "| not met: growth exponent 2.00 (target <= 1.1; 1.00 [1.00, 1.00] in CPU time) |" in text
