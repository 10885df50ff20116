"""Key-padding masks: every attention the instability study trains gives masked keys zero weight."""

import pytest
import torch

from approxlab import approximate, exact_attention
from approxlab.kernels import kernelized_matrix
from approxlab.training import ATTENTIONS, TRAINING_OPTIONS

N, P = 6, 4


def _qkv(seed=0, batch=(2, 3)):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*batch, N, P, dtype=torch.float64, generator=g) for _ in range(3))


def _mask():
    """(2, 1, N): sequence 0 keeps 4 keys (padding at the end), sequence 1 keeps 2 scattered."""
    mask = torch.ones(2, 1, N, dtype=torch.bool)
    mask[0, 0, 4:] = False
    mask[1, 0, [0, 2, 3, 5]] = False
    return mask


def _on_kept_keys(function, q, k, v, mask):
    """Reference: the exact attention computed on the kept keys only, sequence by sequence."""
    out = torch.empty_like(q)
    for s in range(q.shape[0]):
        kept = mask[s, 0]
        out[s] = function(q[s], k[s][..., kept, :], v[s][..., kept, :])
    return out


# Full budgets make each approximation exact (Nyströmformer Lemma 2; spectral shifting with
# c = n and delta = 0; Skyformer with every column of the completion), so with a mask they
# must equal the exact masked attention of their target.
_FULL = {
    "exact": ({}, lambda q, k, v: exact_attention(q, k, v)),
    "nystromformer": ({"pinv": "exact"}, lambda q, k, v: exact_attention(q, k, v)),
    "spectral-shifting": ({}, lambda q, k, v: exact_attention(q, k, v)),
    "kernelized": ({}, lambda q, k, v: kernelized_matrix(q, k) @ v),
    "skyformer": ({"core": "pinv"}, lambda q, k, v: kernelized_matrix(q, k) @ v),
}


@pytest.mark.parametrize("method", sorted(_FULL))
def test_full_budget_with_mask_equals_exact_masked_attention(method):
    options, reference = _FULL[method]
    q, k, v = _qkv()
    mask = _mask()
    budget = 2 * N if method == "skyformer" else N
    got = approximate(method, q, k, v, num_features=budget, key_mask=mask,
                      generator=torch.Generator().manual_seed(0), **options).output
    torch.testing.assert_close(got, _on_kept_keys(reference, q, k, v, mask), rtol=1e-6, atol=1e-8)


def test_yoso_e_with_mask_equals_yoso_e_on_kept_keys():
    q, k, v = _qkv(1)
    mask = _mask()
    got = approximate("yoso-e", q, k, v, num_features=1, key_mask=mask).output

    def on_kept(q, k, v):
        return approximate("yoso-e", q, k, v, num_features=1).output

    torch.testing.assert_close(got, _on_kept_keys(on_kept, q, k, v, mask), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", list(ATTENTIONS))
def test_trained_attentions_give_masked_values_zero_weight(name):
    """At the training budget (fewer landmarks than keys), changing the values of masked keys
    changes nothing, and masked keys' gradients w.r.t. v are exactly zero."""
    n = 12
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 2, n, P, dtype=torch.float64, generator=g) for _ in range(3))
    mask = torch.ones(2, 1, n, dtype=torch.bool)
    mask[0, 0, 9:] = False
    mask[1, 0, 5:] = False
    options = TRAINING_OPTIONS.get(name, {})

    def run(values):
        return approximate(ATTENTIONS[name], q, k, values, num_features=3, key_mask=mask,
                           generator=torch.Generator().manual_seed(1), **options).output

    changed = v.clone()
    changed[~mask.expand(2, 2, n)] = 1e3
    torch.testing.assert_close(run(v), run(changed), rtol=0, atol=1e-9)
    values = v.clone().requires_grad_()
    (grad,) = torch.autograd.grad(run(values).square().sum(), values)
    assert bool((grad[~mask.expand(2, 2, n)] == 0).all())
    assert bool((grad[mask.expand(2, 2, n)] != 0).any())


def test_masked_training_step_uses_the_mask():
    """TinyEncoder passes the batch's padding mask into attention: padding tokens' content
    cannot change the real tokens' embeddings."""
    from approxlab.tasks import Batch
    from approxlab.training import TinyEncoder

    ids = torch.tensor([[3, 4, 5, 6, 0, 0], [7, 8, 9, 0, 0, 0]])
    mask = ids != 0
    model = TinyEncoder(vocab_size=12, n=6, attention="softmax", num_classes=2,
                        generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    other = ids.masked_fill(~mask, 11)
    a = model.embed(ids, mask=mask)
    b = model.embed(other, mask=mask)
    torch.testing.assert_close(a[mask], b[mask])
    c = model.embed(other)
    assert not torch.allclose(a[mask], c[mask])
    assert model(Batch(ids, mask, torch.tensor([0, 1])))[1].isfinite()


def test_key_mask_validation():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"`key_mask` must be a bool torch.Tensor"):
        approximate("exact", q, k, v, num_features=1, key_mask=torch.ones(2, 1, N))
    with pytest.raises(ValueError, match=r"`key_mask` must have shape \(\*batch, n_k\) with n_k=6; got \(2, 1, 5\)"):
        approximate("exact", q, k, v, num_features=1, key_mask=torch.ones(2, 1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"does not broadcast"):
        approximate("exact", q, k, v, num_features=1, key_mask=torch.ones(3, 1, N, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"at least one key in every sequence"):
        approximate("exact", q, k, v, num_features=1, key_mask=torch.zeros(2, 1, N, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"`key_mask` is not supported by method 'performer'"):
        approximate("performer", q, k, v, num_features=2, key_mask=_mask())
