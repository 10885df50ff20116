"""Causal attention through the methods: every causal form against the masked dense definition.

The definition is computed here in float64 from the pattern :math:`L_{ij} = 1[j \\le i]`: a method's own
causal form (``causal=True``) must equal its dense matrix masked by ``L`` -- renormalised over
``j <= i`` where the method's rows are normalised (softmax, FAVOR+, ProbSparse) -- with the same
random draw; the evaluation variant ``causal="mask-renormalise"`` must equal the method's own
bidirectional matrix masked and renormalised; every other method refuses ``causal`` with a message
naming the methods that support each form.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import approxlab
from _helpers import gen, opposed_logits_80_qkv
from approxlab.methods import available, causal_support, get, register
from approxlab.methods.performer import CAUSAL_CHUNK, positive_random_features
from approxlab.methods.yoso_e import collision_probability

SCORERS = ["knorm", "random", "observed-attention", "tova", "keydiff", "expected-attention", "leverage-score", "cur",
           "compactor", "cap", "criticalkv", "caote", "ada-snapkv", "pyramidkv"]  # kvpress's presses: a prompt compressed once by their scores
PREFILL = ["minference", "xattention", "flexprefill", "duo-attention"]  # sparse-prefill patterns over the whole sequence
OWN = ["exact", "kernelized", "yoso-e", "performer", "informer", "topk", "topp", "vattention", "magicpig",
       "streaming-llm", "h2o", "snapkv", "quest", "hyperattention", *SCORERS, *PREFILL]
ONLY = ["streaming-llm", "h2o", "snapkv", *SCORERS, *PREFILL]
VARIANT = ["skyformer-softmax", "nystrom", "nystromformer", "spectral-shifting"]


def _qkv(n=70, p=8, p_v=5, batch=(2, 3), seed=0, scale=1.0):
    g = gen(seed)
    q, k = (scale * torch.randn(*batch, n, p, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, torch.randn(*batch, n, p_v, generator=g, dtype=torch.float64)


def _tril(n):
    return torch.ones(n, n, dtype=torch.bool).tril()


def _renormalised(matrix):
    masked = matrix * _tril(matrix.shape[-1])
    return masked / masked.sum(-1, keepdim=True)


def test_the_declared_forms():
    assert causal_support(True) == OWN
    assert causal_support("only") == ONLY
    assert causal_support("mask-renormalise") == VARIANT
    assert causal_support(False) == [m for m in available() if m not in OWN + VARIANT]


def test_exact_kernelized_yoso_e_are_their_masked_dense_matrices():
    q, k, v = _qkv(seed=1)
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    keep = _tril(q.shape[-2])
    softmax = _renormalised(torch.exp(logits - logits.amax(-1, keepdim=True)))
    kernel = torch.exp(-(q.unsqueeze(-2) - k.unsqueeze(-3)).pow(2).sum(-1) / (2 * math.sqrt(q.shape[-1]))) * keep
    cosine = torch.nn.functional.normalize(q, dim=-1) @ torch.nn.functional.normalize(k, dim=-1).transpose(-1, -2)
    expected = {"exact": softmax, "kernelized": kernel, "yoso-e": collision_probability(cosine, 8) * keep}
    for name, matrix in expected.items():
        result = approxlab.approximate(name, q, k, v, num_features=4, causal=True)
        torch.testing.assert_close(result.output, matrix @ v, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(result.matrix(), matrix, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(approxlab.approximate("exact", q, k, v, num_features=1, causal=True).output,
                               approxlab.exact_attention(q, k, v, causal=True), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("n", [1, CAUSAL_CHUNK - 1, CAUSAL_CHUNK, 2 * CAUSAL_CHUNK + 5])
@pytest.mark.parametrize("orthogonal", [True, False])
def test_causal_performer_is_masked_dense_favor_with_the_same_features(n, orthogonal):
    """Unidirectional FAVOR+ (Performer Sec. 2.6) equals D~^-1 (L . phi(Q) phi(K)^T) V of the same draw."""
    q, k, v = _qkv(n=n, seed=n)
    shared = approxlab.methods.draw("performer", q, k, num_features=24, generator=gen(1), orthogonal=orthogonal)
    result = approxlab.approximate("performer", q, k, v, num_features=24, draw=shared, causal=True,
                                   orthogonal=orthogonal)
    scale = q.shape[-1] ** -0.25
    features = [positive_random_features(x * scale, shared["projection"]) for x in (q, k)]
    dense = _renormalised(features[0] @ features[1].transpose(-1, -2))
    torch.testing.assert_close(result.output, dense @ v, rtol=1e-12, atol=1e-13)
    op = result.operator()
    torch.testing.assert_close(op.to_dense(), dense, rtol=1e-12, atol=1e-13)
    y = torch.randn(2, 3, n, 4, generator=gen(2), dtype=torch.float64)
    torch.testing.assert_close(op.rmatmat(y), dense.transpose(-1, -2) @ y, rtol=1e-11, atol=1e-12)
    # The bidirectional matrix of the same draw, masked and renormalised, is the same thing.
    bidirectional = approxlab.approximate("performer", q, k, v, num_features=24, draw=shared, orthogonal=orthogonal)
    torch.testing.assert_close(_renormalised(bidirectional.matrix()), dense, rtol=1e-12, atol=1e-13)


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operation returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


def test_causal_performer_never_forms_n_by_n_or_n_by_r_by_pv():
    q, k, v = _qkv(n=1024, p=8, p_v=8, batch=(1,), seed=3)
    with _LargestTensor() as mode:
        approxlab.approximate("performer", q, k, v, num_features=32, generator=gen(4), causal=True)
    assert mode.largest <= 1024 * 32 < 1024 * 1024 // 16, mode.largest  # n x r at most: no n x n, no n x r x p_v


@pytest.mark.parametrize("name", ["performer", "informer"])
def test_causal_gradients_are_finite_at_float32_logits_80(name):
    q, k, v = (x.clone().requires_grad_(True) for x in opposed_logits_80_qkv(96, seed=7))
    result = approxlab.approximate(name, q, k, v, num_features=16, generator=gen(8), causal=True)
    assert bool(torch.isfinite(result.output).all())
    result.output.square().sum().backward()
    for x in (q, k, v):
        assert x.grad is not None and bool(torch.isfinite(x.grad).all())


@pytest.mark.parametrize("measure_keys", ["sampled", "all"])
def test_causal_informer_selected_rows_are_causal_softmax_and_lazy_rows_the_cumulative_mean(measure_keys):
    """Informer's masked ProbSparse: the selected queries get masked softmax rows (ProbMask), the lazy ones
    the cumulative mean of V; the queries are those the bidirectional method selects with the same draw."""
    q, k, v = _qkv(n=60, seed=4)
    n = q.shape[-2]
    shared = approxlab.methods.draw("informer", q, k, num_features=9, generator=gen(5), measure_keys=measure_keys)
    result = approxlab.approximate("informer", q, k, v, num_features=9, draw=shared, causal=True,
                                   measure_keys=measure_keys)
    bidirectional = approxlab.approximate("informer", q, k, v, num_features=9, draw=shared, measure_keys=measure_keys)
    selected = result.info["selected"]
    assert torch.equal(selected, bidirectional.info["selected"])
    exact = approxlab.attention_matrix(q, k, causal=True)
    lazy = torch.ones(2, 3, n, dtype=torch.bool).scatter(-1, selected, False)
    cumulative_mean = v.cumsum(-2) / torch.arange(1, n + 1, dtype=torch.float64).unsqueeze(-1)
    expected = torch.where(lazy.unsqueeze(-1), cumulative_mean, exact @ v)
    torch.testing.assert_close(result.output, expected, rtol=1e-12, atol=1e-13)
    dense = result.matrix()
    rows = selected.unsqueeze(-1).expand(-1, -1, -1, n)
    torch.testing.assert_close(dense.gather(-2, rows), exact.gather(-2, rows), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(dense, _renormalised(bidirectional.matrix()), rtol=1e-12, atol=1e-14)
    y = torch.randn(2, 3, n, 2, generator=gen(6), dtype=torch.float64)
    torch.testing.assert_close(result.operator().rmatmat(y), dense.transpose(-1, -2) @ y, rtol=1e-12, atol=1e-12)


def test_causal_informer_sum_is_the_official_codes_cumsum():
    """``causal_lazy="sum"``: the lazy rows are ``V.cumsum(dim=-2)``, as Informer2020's _get_initial_context."""
    q, k, v = _qkv(n=40, seed=5)
    result = approxlab.approximate("informer", q, k, v, num_features=5, generator=gen(7), causal=True,
                                   causal_lazy="sum")
    lazy = torch.ones(2, 3, 40, dtype=torch.bool).scatter(-1, result.info["selected"], False)
    torch.testing.assert_close(result.output[lazy], v.cumsum(-2)[lazy], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(result.matrix() @ v, result.output, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"`causal_lazy` must be 'mean' without causal=True.*got 'sum'"):
        approxlab.approximate("informer", q, k, v, num_features=5, generator=gen(7), causal_lazy="sum")


@pytest.mark.parametrize("name", VARIANT)
def test_mask_renormalise_is_the_bidirectional_matrix_masked_and_renormalised(name):
    q, k, v = _qkv(n=48, seed=8)
    d = 12
    bidirectional = approxlab.approximate(name, q, k, v, num_features=d, generator=gen(9))
    result = approxlab.approximate(name, q, k, v, num_features=d, generator=gen(9), causal="mask-renormalise")
    masked = bidirectional.matrix() * _tril(48)
    torch.testing.assert_close(result.info["row_sums"], masked.sum(-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(result.output, (masked @ v) / masked.sum(-1, keepdim=True), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(result.matrix(), masked / masked.sum(-1, keepdim=True), rtol=1e-10, atol=1e-10)
    assert result.info["causal"] == "mask-renormalise" and result.method == name


def test_mask_renormalise_with_all_landmarks_of_nystromformer_is_exact_causal_attention():
    """Lemma 2 of the Nystromformer supplement (all landmarks: exact) carries over to the variant."""
    q, k, v = _qkv(n=10, seed=10)
    result = approxlab.approximate("nystromformer", q, k, v, num_features=10, causal="mask-renormalise",
                                   pinv="exact")
    torch.testing.assert_close(result.output, approxlab.exact_attention(q, k, v, causal=True), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", [m for m in available() if m not in OWN])
def test_methods_without_a_causal_form_refuse_causal_naming_those_that_have_one(name):
    q, k, v = _qkv(n=16, seed=11)
    with pytest.raises(ValueError) as caught:
        approxlab.approximate(name, q, k, v, num_features=4, generator=gen(1), causal=True)
    message = str(caught.value)
    assert f"method {name!r}" in message and "got causal=True" in message
    assert str(OWN) in message and str(VARIANT) in message
    if name not in VARIANT:
        with pytest.raises(ValueError, match="does not support causal attention"):
            approxlab.approximate(name, q, k, v, num_features=4, generator=gen(1), causal="mask-renormalise")


def test_causal_argument_errors():
    q, k, v = _qkv(n=16, seed=12)
    with pytest.raises(ValueError, match=r"`causal` must be one of \[False, True, 'mask-renormalise'\]; got 1"):
        approxlab.approximate("exact", q, k, v, num_features=1, causal=1)
    with pytest.raises(ValueError, match="got 16 queries and 9 keys"):
        approxlab.approximate("performer", q, k[..., :9, :], v[..., :9, :], num_features=4, causal=True)
    with pytest.raises(ValueError, match="pass `key_mask` or causal='mask-renormalise', not both"):
        approxlab.approximate("nystromformer", q, k, v, num_features=4, causal="mask-renormalise",
                              key_mask=torch.ones(2, 3, 16, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"`key_mask` is not supported by method 'performer'"):
        approxlab.approximate("performer", q, k, v, num_features=4, causal=True,
                              key_mask=torch.ones(2, 3, 16, dtype=torch.bool))
    for name in ONLY:
        with pytest.raises(ValueError, match=rf"method '{name}' is causal-only: pass causal=True\. causal-only "
                                             rf"methods .*\['streaming-llm', 'h2o', 'snapkv', 'knorm', .*'cap', 'criticalkv', 'caote', "
                                             rf"'ada-snapkv', 'pyramidkv', .*\]; got causal=False"):
            approxlab.approximate(name, q, k, v, num_features=4)
        with pytest.raises(ValueError, match="has a causal form of its own: pass causal=True"):
            approxlab.approximate(name, q, k, v, num_features=4, causal="mask-renormalise")
    with pytest.raises(ValueError, match="has a causal form of its own: pass causal=True"):
        approxlab.approximate("performer", q, k, v, num_features=4, causal="mask-renormalise")


def test_a_registered_method_declares_its_causal_support(fresh_registry):
    q, k, v = _qkv(n=16, seed=13)

    @register("masked-mean", target="softmax", features="ignored", randomized=False, causal=True)
    def masked_mean(q, k, v, *, num_features, generator=None, causal=False):
        weights = torch.ones(*q.shape[:-1], k.shape[-2], dtype=q.dtype)
        weights = weights.tril() if causal else weights
        return weights / weights.sum(-1, keepdim=True) @ v

    @register("uniform", target="softmax", features="ignored", randomized=False)
    def uniform(q, k, v, *, num_features, generator=None):
        return v.mean(-2, keepdim=True).expand(*q.shape[:-1], v.shape[-1])

    assert get("masked-mean").causal is True and get("uniform").causal is False
    out = approxlab.approximate("masked-mean", q, k, v, num_features=1, causal=True).output
    torch.testing.assert_close(out, v.cumsum(-2) / torch.arange(1, 17, dtype=torch.float64).unsqueeze(-1))
    with pytest.raises(ValueError, match=r"'masked-mean'\]"):
        approxlab.approximate("uniform", q, k, v, num_features=1, causal=True)
    with pytest.raises(TypeError, match="must accept.*causal=False"):
        register("no-keyword", uniform, target="softmax", features="ignored", randomized=False, causal=True)
    with pytest.raises(ValueError, match="needs target='softmax'"):
        register("kernel-variant", uniform, target="kernelized", features="ignored", randomized=False,
                 causal="mask-renormalise")
    with pytest.raises(ValueError, match=r"`causal` must be one of \[False, True, 'mask-renormalise', 'only'\]; "
                                         r"got 'yes'"):
        register("bad", uniform, target="softmax", features="ignored", randomized=False, causal="yes")


@pytest.mark.parametrize("form", ["matrix", "operator"])
def test_mask_renormalise_of_a_registered_dense_or_generic_operator(fresh_registry, form, monkeypatch):
    """The variant's two other paths: a dense matrix (its lower triangle) and an operator of unknown
    structure (its rows formed in blocks of 7 here, O(n^2)), against the masked dense definition."""
    from approxlab.methods import Approximation, causal
    from approxlab.operators import AdjointOperator, DenseOperator

    monkeypatch.setattr(causal, "_BLOCK_ELEMENTS", 150 * 6 * 7)
    @register("random-rows", target="softmax", features="ignored", causal="mask-renormalise")
    def random_rows(q, k, v, *, num_features, generator=None):
        weights = torch.rand(*q.shape[:-1], k.shape[-2], generator=generator, dtype=q.dtype)
        weights = weights / weights.sum(-1, keepdim=True)
        if form == "matrix":
            return Approximation("random-rows", "softmax", weights @ v, matrix=weights)
        operator = AdjointOperator(DenseOperator(weights.transpose(-1, -2).contiguous()))
        return Approximation("random-rows", "softmax", weights @ v, operator)

    q, k, v = _qkv(n=150, seed=14)
    weights = torch.rand(2, 3, 150, 150, generator=gen(3), dtype=torch.float64)
    weights = weights / weights.sum(-1, keepdim=True)
    result = approxlab.approximate("random-rows", q, k, v, num_features=1, generator=gen(3), causal="mask-renormalise")
    torch.testing.assert_close(result.output, _renormalised(weights) @ v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(result.matrix(), _renormalised(weights), rtol=1e-12, atol=1e-14)


def test_causal_with_a_key_mask_is_the_softmax_over_kept_keys_up_to_i():
    """causal=True with key_mask: row i is the softmax over kept keys j <= i; a padded row with no such key
    (left padding) has output 0, never NaN."""
    q, k, v = _qkv(n=12, seed=14)
    mask = torch.ones(2, 1, 12, dtype=torch.bool)
    mask[0, 0, :3] = False
    mask[1, 0, 5:8] = False
    keep = _tril(12) & mask.unsqueeze(-2)
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    expected = torch.softmax(logits.masked_fill(~keep, -math.inf), -1).nan_to_num(0.0)
    result = approxlab.approximate("exact", q, k, v, num_features=1, causal=True, key_mask=mask)
    torch.testing.assert_close(result.output, expected @ v, rtol=1e-12, atol=1e-13)
    assert float(result.output[0, :, :3].abs().max()) == 0.0
