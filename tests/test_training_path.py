"""The training path: what TinyEncoder runs is the methods' own computation, batched, and it forms
no n x n array where the method does not need one.

Timings are the benchmark's job (``approxlab bench --parts training``); these tests check what
makes the speed possible: no ``(..., n, n)`` array in a whole training step of a linear method or
of the fused softmax/kernelized paths, recorded op by op with a dispatch mode.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from approxlab import approximate
from approxlab._validation import as_generator
from approxlab.studies.bench.training import padded_batch
from approxlab.training import ATTENTIONS, TRAINING_OPTIONS, TinyEncoder

QUADRATIC_BY_DEFINITION = ("yoso",)  # YOSO-E is the exact expectation: an n x n matrix


class _Shapes(TorchDispatchMode):
    """Records the shape of every tensor an op returns (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(x, torch.Tensor):
                self.shapes.append(tuple(x.shape))
        return out


def _step_shapes(attention, n):
    batch = padded_batch(n, 2, seed=0)
    model = TinyEncoder(vocab_size=32, n=n, attention=attention, num_features=8, num_classes=10,
                        generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    with _Shapes() as recorder:
        optimizer.zero_grad()
        model(batch, seed=0)[1].backward()
        optimizer.step()
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
    return recorder.shapes


@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_training_step_forms_no_n_by_n_array(attention):
    """n = 160 differs from every other size of the model (64, 128, 192, 8 landmarks), so an
    array with two axes of length n (or n + 1, the kernelized path's extra key) is an attention
    matrix. Linear methods and the fused softmax/kernelized paths form none, forward or backward;
    YOSO-E forms them by definition (which shows the recorder sees them)."""
    n = 160
    square = [s for s in _step_shapes(attention, n) if sum(d in (n, n + 1) for d in s) >= 2]
    if attention in QUADRATIC_BY_DEFINITION:
        assert square
    else:
        assert not square, square[:3]


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("attention", list(ATTENTIONS))
def test_encoder_layer_attention_is_the_front_door_computation(attention, masked):
    """A layer's attention (all heads and sequences in one call) equals approximate(...).output."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 2, 24, 8, dtype=torch.float64, generator=g) for _ in range(3))
    key_mask = (torch.arange(24) < torch.tensor([24, 17, 9])[:, None]).unsqueeze(1) if masked else None
    model = TinyEncoder(vocab_size=8, n=24, attention=attention, num_features=6, num_classes=2,
                        generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    got = model._attend(11, key_mask)(q, k, v)
    expected = approximate(ATTENTIONS[attention], q, k, v, num_features=6, generator=as_generator(seed=11),
                           key_mask=key_mask, **TRAINING_OPTIONS.get(attention, {})).output
    assert torch.equal(got, expected)


def test_fused_exact_and_kernelized_outputs_match_their_dense_matrices():
    """The fused-kernel outputs of ``exact`` and ``kernelized`` agree with ``matrix() @ v`` (float64),
    with and without a mask, and with values wider than the head size."""
    g = torch.Generator().manual_seed(2)
    q, k = (2 * torch.randn(2, 3, 40, 8, dtype=torch.float64, generator=g) for _ in range(2))
    mask = torch.rand(2, 1, 40, generator=g) > 0.4
    for p_v in (8, 13):
        v = torch.randn(2, 3, 40, p_v, dtype=torch.float64, generator=g)
        for method in ("exact", "kernelized"):
            for key_mask in (None, mask):
                result = approximate(method, q, k, v, num_features=1, key_mask=key_mask)
                torch.testing.assert_close(result.output, result.matrix() @ v, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("method,options,dropped", [
    ("skyformer", {"core": "schulz"}, {"core_condition_number", "core_rank"}),
    ("skyformer-softmax", {"core": "schulz"}, {"core_condition_number", "core_rank"}),
    ("skyformer", {"core": "pinv"}, set()),  # the pinv core's spectrum comes with it
    ("nystromformer", {}, {"core_condition_number"}),
])
def test_diagnostics_off_drops_only_costly_info(method, options, dropped):
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 32, 8, dtype=torch.float64, generator=g) for _ in range(3))

    def run(diagnostics):
        return approximate(method, q, k, v, num_features=6, generator=torch.Generator().manual_seed(0),
                           diagnostics=diagnostics, **options)

    full, lean = run(True), run(False)
    assert torch.equal(full.output, lean.output)
    assert set(full.info) - set(lean.info) == dropped
    with pytest.raises(TypeError, match="`diagnostics` must be a bool"):
        run(1)
