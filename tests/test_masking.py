"""Key-padding masks: masked keys get zero weight, and padding cannot leak into real tokens.

The invariance that the masks promise (:mod:`approxlab.methods._masking`): changing **only** the
padded rows' ``q``, ``k``, ``v`` leaves the real rows' outputs unchanged, for every method that
takes a ``key_mask``, with sequences of different real lengths in one batch, and the same through
:class:`approxlab.training.TinyEncoder` for every attention it trains.
"""

import inspect

import pytest
import torch

from approxlab import approximate, exact_attention, sketch
from approxlab.kernels import kernelized_matrix
from approxlab.methods import available, get
from approxlab.tasks import Batch
from approxlab.training import ATTENTIONS, TRAINING_OPTIONS, TinyEncoder
from _helpers import rope_stated

N, P = 6, 4
MASKED = [name for name in available() if "key_mask" in inspect.signature(get(name).function).parameters]
UNMASKED = [name for name in available() if name not in MASKED]


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
    real = mask.expand(2, 3, N)  # self-attention: padded queries' outputs are not specified
    torch.testing.assert_close(got[real], _on_kept_keys(reference, q, k, v, mask)[real], rtol=1e-6, atol=1e-8)


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


@pytest.mark.parametrize("name", UNMASKED)
def test_methods_without_mask_support_refuse_a_mask(name):
    q, k, v = _qkv()
    causal = {"causal": True} if get(name).causal == "only" else {}  # a causal-only method is asked causally
    with pytest.raises(ValueError, match=rf"`key_mask` is not supported by method '{name}'"):
        approximate(name, q, k, v, num_features=2, key_mask=_mask(), **causal)


# -- padding cannot leak ------------------------------------------------------------------

LENGTHS = (16, 11, 5, 3)  # one full sequence, two padded at the end, one with fewer tokens than landmarks


def _padded_batch(seed=0):
    """q, k, v ``(4, 2, 16, 4)`` float64 and a ``(4, 1, 16)`` mask of real lengths :data:`LENGTHS`;
    sequence 1's padding is scattered, not at the end."""
    n = LENGTHS[0]
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(4, 2, n, P, dtype=torch.float64, generator=g) for _ in range(3))
    mask = (torch.arange(n) < torch.tensor(LENGTHS)[:, None]).unsqueeze(1)
    mask[1, 0] = mask[1, 0, torch.randperm(n, generator=g)]
    return q, k, v, mask


def _repadded(x, mask, seed):
    """``x`` with every padded row replaced by a new draw of a larger scale."""
    padded = ~mask.expand(x.shape[:-1])
    other = x.clone()
    other[padded] = 3 * torch.randn(int(padded.sum()), x.shape[-1], dtype=x.dtype,
                                    generator=torch.Generator().manual_seed(seed))
    return other


_OPTIONS = {"skyformer": [{"core": "pinv"}, {"core": "schulz"}, {"sampling": "rpcholesky"}],
            "skyformer-softmax": [{"core": "pinv"}, {"core": "schulz"}, {"sampling": "rpcholesky"}],
            "hyperattention": [{"block_size": 4}, {"block_size": 4, "variant": "code"}, {"block_size": 3, "clip": None}],
            "kdeformer": [{}, {"sampling": "augmented", "order": "code"}],
            "nystromformer": [{}, {"pinv": "exact"}],
            "exact": [{}, {"causal": True}], "topk": [{}, {"causal": True}], "topp": [{}, {"causal": True}],
            "quest": [{"page_size": 3}, {"page_size": 3, "causal": True}],
            "h2o": [{"causal": True}, {"causal": True, "scores": "dense"}],
            "snapkv": [{"causal": True, "window": 2, "kernel_size": 3, "pooling": pooling} for pooling in ("max", "avg")]}
_CASES = [(name, {"causal": True, **rope_stated(name)} if get(name).causal_only else {}) if options is None
          else (name, options)
          for name in MASKED for options in _OPTIONS.get(name, [None])]


@pytest.mark.parametrize("name,options", _CASES, ids=[f"{n}-{o}" for n, o in _CASES])
def test_padding_cannot_leak_into_real_rows(name, options):
    """Changing only the padded rows' q, k, v leaves every real row's output unchanged (float64,
    1e-12), with real lengths 16, 11, 5 (scattered) and 3 (< the 4 landmarks) in one batch."""
    q, k, v, mask = _padded_batch()
    budget = 6 if name.startswith("skyformer") else 4

    def run(q, k, v):
        return approximate(name, q, k, v, num_features=budget, key_mask=mask,
                           generator=torch.Generator().manual_seed(1), **options).output

    before = run(q, k, v)
    after = run(*(_repadded(x, mask, seed) for seed, x in enumerate((q, k, v), start=10)))
    real = mask.expand(q.shape[:-1])
    assert bool(torch.isfinite(before).all())
    torch.testing.assert_close(after[real], before[real], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", list(ATTENTIONS))
def test_tiny_encoder_padding_cannot_leak_into_real_tokens(name):
    """Through the whole encoder: changing only the pad tokens leaves the real tokens'
    embeddings unchanged (float64, 1e-12), for sequences of different real lengths."""
    n = LENGTHS[0]
    g = torch.Generator().manual_seed(3)
    mask = torch.arange(n) < torch.tensor(LENGTHS)[:, None]
    ids = torch.randint(1, 20, (len(LENGTHS), n), generator=g).masked_fill(~mask, 0)
    other = ids.masked_fill(~mask, 21)
    model = TinyEncoder(vocab_size=22, n=n, attention=name, num_features=4, num_classes=2,
                        generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        before, after = model.embed(ids, mask=mask, seed=5), model.embed(other, mask=mask, seed=5)
    torch.testing.assert_close(after[mask], before[mask], rtol=0, atol=1e-12)
    assert not torch.allclose(after[~mask], before[~mask])  # the pad tokens did change


@pytest.mark.parametrize("name", ["nystromformer", "spectral-shifting"])
def test_segment_means_over_real_tokens_equal_the_unpadded_sequence(name):
    """With padding at the end, a sequence's real rows are what the method gives on the
    sequence with its padding removed (the landmarks are the same segment means)."""
    q, k, v, mask = _padded_batch()
    mask[1, 0] = torch.arange(16) < 11  # padding at the end for this test
    padded = approximate(name, q, k, v, num_features=4, key_mask=mask).output
    for s, length in enumerate(LENGTHS[:3]):  # the fourth has fewer real tokens than landmarks
        alone = approximate(name, *(x[s : s + 1, :, :length] for x in (q, k, v)), num_features=4)
        torch.testing.assert_close(padded[s : s + 1, :, :length], alone.output, rtol=0, atol=1e-12)


def test_segment_means_with_all_tokens_real_match_the_unmasked_rule():
    from approxlab.methods.nystromformer import segment_means

    x = torch.randn(3, 37, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 37, dtype=torch.bool)
    torch.testing.assert_close(segment_means(x, 5, mask), segment_means(x, 5), rtol=0, atol=1e-14)
    short = torch.arange(37) < 3  # L = 3 < m = 5: tokens 0, 0, 1, 1, 2 (rank floor(j L / m))
    torch.testing.assert_close(segment_means(x, 5, short), x[:, [0, 0, 1, 1, 2]], rtol=0, atol=0)


def test_uniform_real_columns_draw_only_real_rows():
    g = torch.Generator()
    mask = torch.ones(4, 20, dtype=torch.bool)
    g.manual_seed(0)
    plain = sketch.uniform_columns(20, 7, batch_shape=(4,), generator=g)
    g.manual_seed(0)
    assert torch.equal(sketch.uniform_real_columns(mask, 7, generator=g), plain)  # all real: the same draw
    mask[0, 5:] = False  # 5 real rows < 7 columns: each real row, then repeats
    mask[1, ::2] = False
    columns = sketch.uniform_real_columns(mask, 7, generator=g)
    assert bool(torch.gather(mask, -1, columns).all())
    assert sorted(set(columns[0].tolist())) == [0, 1, 2, 3, 4]
    assert len(set(columns[1].tolist())) == 7


def test_explicit_skyformer_columns_must_avoid_padding():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"`columns` \(or `draw\['columns'\]`\) must index real \(unmasked\) rows"):
        approximate("skyformer", q, k, v, num_features=2, columns=torch.tensor([0, 4]), key_mask=_mask())


@pytest.mark.parametrize("name", ["skyformer", "skyformer-softmax"])
def test_a_draw_made_with_the_mask_reproduces_the_masked_generator_run(name):
    from approxlab.methods import draw

    q, k, v, mask = _padded_batch()
    shared = draw(name, q, k, num_features=6, generator=torch.Generator().manual_seed(1), key_mask=mask)
    assert bool(torch.gather(_rows(mask, q.shape[:-2]), -1, shared["columns"]).all())
    by_draw = approximate(name, q, k, v, num_features=6, draw=shared, key_mask=mask).output
    by_generator = approximate(name, q, k, v, num_features=6, generator=torch.Generator().manual_seed(1),
                               key_mask=mask).output
    assert torch.equal(by_draw, by_generator)
    unmasked = draw(name, q, k, num_features=6, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"must index real \(unmasked\) rows"):
        approximate(name, q, k, v, num_features=6, draw=unmasked, key_mask=mask)


def _rows(mask, batch):
    """The rows of [Q; K] that may be landmarks in self-attention: real queries, then real keys."""
    return torch.cat([mask, mask], dim=-1).expand(*batch, 2 * mask.shape[-1])
