"""YOSO-m and YOSO-E (Zeng et al., 2021): hashing, Bernoulli sampling, hash-table accumulation."""

import math

import pytest
import torch
import torch.nn.functional as F

import approxlab
from approxlab import lsh
from approxlab.synthetic import synthetic_qkv
from _helpers import gen as _gen, logits_80_qkv as _large_logit_qkv




def _unit_pair(theta, p):
    x = torch.zeros(p, dtype=torch.float64)
    y = torch.zeros(p, dtype=torch.float64)
    x[0] = 1.0
    y[0], y[1] = math.cos(theta), math.sin(theta)
    return x.reshape(1, p), y.reshape(1, p)


# ---------------------------------------------------------------- collision probability


@pytest.mark.parametrize(
    "theta,tau",
    [(0.2, 1), (1.0, 1), (2.5, 1), (0.3, 3), (1.2, 3), (math.pi / 2, 3), (0.2, 8), (0.6, 8), (1.0, 8)],
)
def test_collision_probability_of_tau_hyperplanes_monte_carlo(theta, tau):
    r"""YOSO Section 3.1 / Charikar (2002): tau concatenated hyperplane hashes of two unit vectors at
    angle theta collide with probability (1 - theta/pi)^tau.

    Monte Carlo over m = 20000 independent hashes, 5 seeds; each check is a 4-standard-error
    test, false-alarm probability about 6e-5 per check (normal approximation, m P (1 - P) >= 30),
    about 3e-3 over the 45 checks of this parametrisation. Seeds are fixed, so the outcome is
    deterministic.
    """
    p, m = 6, 20_000
    x, y = _unit_pair(theta, p)
    expected = (1.0 - theta / math.pi) ** tau
    assert m * expected * (1 - expected) >= 30  # the normal approximation is adequate
    assert float(lsh.collision_probability(torch.tensor(math.cos(theta), dtype=torch.float64), tau)) == (
        pytest.approx(expected, rel=1e-12)
    )
    standard_error = math.sqrt(expected * (1 - expected) / m)
    for seed in range(5):
        planes = lsh.draw_hyperplanes((), m, tau, p, generator=_gen(seed))
        codes = lsh.hash_codes(torch.cat([x, y]), planes)  # (m, 2)
        frequency = float((codes[:, 0] == codes[:, 1]).double().mean())
        assert abs(frequency - expected) <= 4 * standard_error, (seed, frequency, expected)


def test_hash_codes_range_scale_invariance_and_zero_vector():
    """Codes lie in [0, 2^tau); positive rescaling does not change them; a zero row hashes to 0."""
    g = _gen(1)
    x = torch.randn(3, 10, 5, generator=g, dtype=torch.float64)
    planes = lsh.draw_hyperplanes((3,), 7, 4, 5, generator=g)
    codes = lsh.hash_codes(x, planes)
    assert codes.shape == (3, 7, 10) and codes.dtype == torch.int64
    assert int(codes.min()) >= 0 and int(codes.max()) < 2**4
    assert torch.equal(codes, lsh.hash_codes(3.7 * x, planes))
    assert torch.equal(codes, lsh.hash_codes(F.normalize(x, dim=-1), planes))
    assert int(lsh.hash_codes(torch.zeros(3, 2, 5, dtype=torch.float64), planes).abs().max()) == 0


def _float64_codes(x, planes):
    """Codes straight from the definition: float64 projections, bits packed with weights 2**t."""
    bits = torch.einsum("...np,...mtp->...mnt", x, planes) > 0
    return (bits.to(torch.int64) * 2 ** torch.arange(planes.shape[-2])).sum(-1)


def test_hash_codes_match_float64_projections():
    """Float64 codes come from float32 products with the doubtful signs redone in float64
    (``lsh._certified_signs``): on Gaussian inputs they equal the float64 definition exactly,
    over several chunks of hashes and broadcast batch shapes."""
    g = _gen(11)
    x = torch.randn(3, 700, 64, generator=g, dtype=torch.float64)
    planes = lsh.draw_hyperplanes((3,), 300, 8, 64, generator=g)
    assert torch.equal(lsh.hash_codes(x, planes), _float64_codes(x, planes))
    shared = lsh.draw_hyperplanes((), 40, 5, 64, generator=g)
    assert torch.equal(lsh.hash_codes(x, shared), _float64_codes(x, shared))


@pytest.mark.parametrize("tau", range(1, 11))
def test_hash_codes_pack_every_width_of_bits_as_the_definition(tau):
    """Codes are packed by shifted adds of the hyperplanes' rows of bits in uint8 up to 8 bits, in int32 above
    (``lsh._pack_bits``): both the definition's integers, float64 and float32 inputs."""
    g = _gen(30 + tau)
    x = torch.randn(2, 50, 16, generator=g, dtype=torch.float64)
    planes = lsh.draw_hyperplanes((2,), 9, tau, 16, generator=g)
    assert torch.equal(lsh.hash_codes(x, planes), _float64_codes(x, planes))
    assert torch.equal(lsh.hash_codes(x.float(), planes), _float64_codes(x.float(), planes.float()))


@pytest.mark.parametrize("scale", [1.0, 1e-300, 1e300])
def test_hash_codes_keep_float64_signs_below_float32_resolution(scale):
    """Projections of size 1e-9 (relative), far below float32's rounding of about 1e-6 but
    clear in float64, keep their float64 sign -- also for rows scaled to 1e-300 or 1e300, which
    float32 cannot hold. Each query lies within 1e-9 of the hyperplane of bit 0, on a random side."""
    g = _gen(12)
    p, n = 64, 400
    planes = lsh.draw_hyperplanes((), 50, 3, p, generator=g)
    w = planes[0, 0]
    base = torch.randn(n, p, generator=g, dtype=torch.float64)
    base = base - (base @ w)[:, None] * w / (w @ w)  # on the hyperplane of bit 0
    base = F.normalize(base, dim=-1)
    side = torch.randint(0, 2, (n,), generator=g).to(torch.float64) * 2 - 1
    x = (base + side[:, None] * 1e-9 * w / w.norm()) * scale
    codes = lsh.hash_codes(x, planes)
    assert torch.equal(codes[0] % 2, (side > 0).to(torch.int64))  # bit 0 of hash 0
    assert torch.equal(codes, _float64_codes(x / scale, planes))


# ---------------------------------------------------------------- hash-table accumulation


@pytest.mark.parametrize("tau", [3, 12])
def test_hash_table_output_equals_dense_collision_matrix_exactly(tau):
    """YOSO Section 3.2 (Figure 3): the bucket accumulation computes exactly B(Q, K) V.

    Integer-valued V and m = 16 hashes (a power of two) make every sum exact in float64, so the
    comparison is ``torch.equal``. tau = 12 (4096 buckets > n + n_k) exercises the compacted table.
    """
    g = _gen(2)
    q, k, _ = synthetic_qkv((2, 3), 16, 6, generator=g)
    k = k[..., :12, :]
    v = torch.randint(-5, 6, (2, 3, 12, 4), generator=g).double()
    y = torch.randint(-5, 6, (2, 3, 16, 3), generator=g).double()
    planes = lsh.draw_hyperplanes((2, 3), 16, tau, 6, generator=g)
    codes_q, codes_k = lsh.hash_codes(q, planes), lsh.hash_codes(k, planes)
    dense = lsh.collision_matrix(codes_q, codes_k)
    assert dense.shape == (2, 3, 16, 12)
    assert torch.equal(lsh.bucket_attention(codes_q, codes_k, v, tau=tau), dense @ v)
    operator = lsh.CollisionOperator(codes_q, codes_k, tau=tau, dtype=torch.float64)
    assert torch.equal(operator.to_dense(), dense)
    assert torch.equal(operator.rmatmat(y), dense.transpose(-1, -2) @ y)


def test_compacted_table_agrees_with_direct_table():
    """Both bucket layouts of bucket_attention give the same sum (tau = 5 on n = 40 vs n = 8)."""
    g = _gen(3)
    q, k, v = synthetic_qkv((2,), 40, 5, generator=g)
    planes = lsh.draw_hyperplanes((2,), 9, 5, 5, generator=g)
    codes_q, codes_k = lsh.hash_codes(q, planes), lsh.hash_codes(k, planes)
    direct = lsh.bucket_attention(codes_q, codes_k, v, tau=5)  # 32 buckets <= 80: direct table
    small = lsh.bucket_attention(codes_q[..., :4], codes_k[..., :4], v[..., :4, :], tau=5)  # 32 > 8: compacted
    dense = lsh.collision_matrix(codes_q, codes_k)
    torch.testing.assert_close(direct, dense @ v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(small, dense[..., :4, :4] @ v[..., :4, :], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tau", [4, 11])
def test_tables_filled_per_hash_are_the_sparse_product_bit_for_bit(tau, monkeypatch):
    """From ``lsh.TABLE_LOOP_KEYS`` keys the hash tables are filled by one ``index_add_`` per batch element and hash:
    exactly B(Q, K) V on integer values (m = 16), and bit for bit the sparse product's sums on Gaussian values, in
    both bucket layouts (tau = 11: 2048 buckets > n + n_k, compacted), the adjoint's tables too."""
    g = _gen(6)
    n, n_k = 300, lsh.TABLE_LOOP_KEYS + 88
    q, k = torch.randn(2, 3, n, 6, generator=g, dtype=torch.float64), torch.randn(2, 3, n_k, 6, generator=g,
                                                                                 dtype=torch.float64)
    planes = lsh.draw_hyperplanes((2, 3), 16, tau, 6, generator=g)
    codes_q, codes_k = lsh.hash_codes(q, planes), lsh.hash_codes(k, planes)
    whole = torch.randint(-5, 6, (2, 3, n_k, 4), generator=g).double()
    assert torch.equal(lsh.bucket_attention(codes_q, codes_k, whole, tau=tau),
                       lsh.collision_matrix(codes_q, codes_k) @ whole)
    v, y = torch.randn(2, 3, n_k, 4, generator=g, dtype=torch.float64), torch.randn(2, 3, n, 4, generator=g,
                                                                                   dtype=torch.float64)
    looped = lsh.bucket_attention(codes_q, codes_k, v, tau=tau)
    swapped = lsh.bucket_attention(codes_k, codes_q, y, tau=tau)  # n = 300 keys: the sparse product
    monkeypatch.setattr(lsh, "TABLE_LOOP_KEYS", 1)
    assert torch.equal(lsh.bucket_attention(codes_k, codes_q, y, tau=tau), swapped)
    monkeypatch.setattr(lsh, "TABLE_LOOP_KEYS", 10**9)
    assert torch.equal(lsh.bucket_attention(codes_q, codes_k, v, tau=tau), looped)


def test_yoso_operator_is_the_hashes_collision_matrix():
    """approximate('yoso') output and operator equal (1/m) sum_h 1[f_h(q_i) = f_h(k_j)] of its own hashes."""
    q, k, v = synthetic_qkv((2, 3), 20, 8, generator=_gen(4))
    result = approxlab.approximate("yoso", q, k, v, num_features=24, generator=_gen(5), tau=4)
    dense = lsh.collision_matrix(result.info["codes_q"], result.info["codes_k"])
    torch.testing.assert_close(result.matrix(), dense, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(result.output, dense @ v, rtol=1e-12, atol=1e-12)
    assert result.info["hyperplanes"].shape == (2, 3, 24, 4, 8)
    assert result.method == "yoso" and result.target == "yoso"


# ---------------------------------------------------------------- YOSO-m -> YOSO-E


def test_yoso_m_converges_to_yoso_e_at_rate_m_to_the_minus_half():
    r"""YOSO Section 3.1: YOSO-m averages m i.i.d. hashes, so E||YOSO-m - YOSO-E||_F^2 = sigma^2/m.

    The root-mean-square error over 12 seeds at m = 4, 16, 64, 256 must have a log-log slope of
    -1/2 within 0.05, and error * sqrt(m) must stay within a factor 1.2 across m. Over independent
    seed sets the fitted slope varies by about 0.005 here, so the tolerance is ~10 standard
    deviations (failure probability negligible); seeds are fixed.
    """
    q, k, v = synthetic_qkv((4,), 32, 8, generator=_gen(6))
    target = approxlab.approximate("yoso-e", q, k, v, num_features=1, tau=4).output
    hashes = [4, 16, 64, 256]

    def yoso_m(**kwargs):
        return approxlab.approximate("yoso", q, k, v, tau=4, **kwargs)

    rms = []
    for m in hashes:
        errors = [
            (yoso_m(num_features=m, generator=_gen(100 * m + s)).output - target).square().sum()
            for s in range(12)
        ]
        rms.append(math.sqrt(float(torch.stack(errors).mean())))
    x = torch.log(torch.tensor(hashes, dtype=torch.float64))
    y = torch.log(torch.tensor(rms, dtype=torch.float64))
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    assert abs(slope + 0.5) <= 0.05, (slope, rms)
    scaled = [e * math.sqrt(m) for e, m in zip(rms, hashes)]
    assert max(scaled) / min(scaled) <= 1.2, scaled


def test_yoso_e_equals_collision_probability_formula():
    """YOSO-E's matrix is (1 - arccos(q^ . k^)/pi)^tau on l2-normalised rows (YOSO Section 3.1)."""
    q, k, v = synthetic_qkv((2,), 10, 5, generator=_gen(7))
    result = approxlab.approximate("yoso-e", q, k, v, num_features=3, tau=5)
    qn = q / q.norm(dim=-1, keepdim=True)
    kn = k / k.norm(dim=-1, keepdim=True)
    expected = (1 - torch.arccos((qn @ kn.transpose(-1, -2)).clamp(-1, 1)) / math.pi) ** 5
    torch.testing.assert_close(result.matrix(), expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(result.output, expected @ v)
    assert result.info == {"tau": 5, "normalize_output": False, "gradient": "true"}


def test_yoso_e_clamps_cosine_and_handles_zero_rows():
    """Identical rows (cosine rounding above 1) give weight 1, not NaN; a zero query gives 2^-tau."""
    x = torch.randn(1, 6, 7, generator=_gen(8), dtype=torch.float64) * 1e3
    result = approxlab.approximate("yoso-e", x, x, x, num_features=1, tau=3)
    diagonal = torch.diagonal(result.matrix(), dim1=-2, dim2=-1)
    torch.testing.assert_close(diagonal, torch.ones_like(diagonal))
    q = x.clone()
    q[0, 0] = 0.0
    row = approxlab.approximate("yoso-e", q, x, x, num_features=1, tau=3).matrix()[0, 0]
    torch.testing.assert_close(row, torch.full_like(row, 2.0**-3))


# ---------------------------------------------------------------- options, N-YOSO


@pytest.mark.parametrize("name", ["yoso", "yoso-e"])
def test_normalize_output_gives_l2_normalised_rows(name):
    """N-YOSO (YOSO Section 3.1): l2(B V), unit rows; same operator as the unnormalised call."""
    q, k, v = synthetic_qkv((2, 3), 16, 8, generator=_gen(9))
    plain = approxlab.approximate(name, q, k, v, num_features=32, generator=_gen(10))
    normed = approxlab.approximate(name, q, k, v, num_features=32, generator=_gen(10), normalize_output=True)
    torch.testing.assert_close(normed.output, F.normalize(plain.output, dim=-1))
    norms = normed.output.norm(dim=-1)
    nonzero = plain.output.norm(dim=-1) > 0
    torch.testing.assert_close(norms[nonzero], torch.ones_like(norms[nonzero]))
    torch.testing.assert_close(normed.matrix(), plain.matrix())


def test_validation_messages():
    q, k, v = synthetic_qkv((2,), 8, 4, generator=_gen(11))
    for name in ("yoso", "yoso-e"):
        with pytest.raises(ValueError, match=r"`tau` must be an integer with 1 <= tau <= 30; got 0"):
            approxlab.approximate(name, q, k, v, num_features=4, tau=0)
        with pytest.raises(ValueError, match=r"`tau` must be an integer with 1 <= tau <= 30; got 31"):
            approxlab.approximate(name, q, k, v, num_features=4, tau=31)
        with pytest.raises(TypeError, match=r"`tau` must be an integer; got 2.5"):
            approxlab.approximate(name, q, k, v, num_features=4, tau=2.5)
        with pytest.raises(TypeError, match=r"`normalize_output` must be a bool \(True or False\); got 'yes'"):
            approxlab.approximate(name, q, k, v, num_features=4, normalize_output="yes")
        with pytest.raises(ValueError, match=r"`num_features` must be .* 1 <= num_features <= 4096; got 4097"):
            approxlab.approximate(name, q, k, v, num_features=4097)
        with pytest.raises(TypeError, match=r"unexpected keyword argument 'hashes'"):
            approxlab.approximate(name, q, k, v, num_features=4, hashes=3)
    with pytest.raises(ValueError, match=r"`codes_q` and `codes_k` must come from the same m hashes"):
        lsh.collision_matrix(torch.zeros(2, 5, dtype=torch.int64), torch.zeros(3, 5, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"`codes_q` must be an int64 tensor"):
        lsh.bucket_attention(torch.zeros(2, 5), torch.zeros(2, 5, dtype=torch.int64), v[0], tau=2)
    with pytest.raises(ValueError, match=r"`hyperplanes` must have shape \(\*batch, m, tau, 4\)"):
        lsh.hash_codes(q, torch.zeros(2, 3, 5, dtype=torch.float64))


# ---------------------------------------------------------------- common method properties


@pytest.mark.parametrize("name", ["yoso", "yoso-e"])
def test_float32_large_logits_give_finite_output(name):
    """Logits +-80 in float32: weights stay in [0, 1], output and operator finite."""
    q, k, v = _large_logit_qkv()
    result = approxlab.approximate(name, q, k, v, num_features=16, generator=_gen(12))
    assert result.output.dtype == torch.float32
    assert bool(torch.isfinite(result.output).all())
    matrix = result.matrix()
    assert bool(torch.isfinite(matrix).all()) and float(matrix.min()) >= 0 and float(matrix.max()) <= 1


def test_yoso_same_seed_same_output_and_seeds_differ():
    q, k, v = synthetic_qkv((2, 3), 16, 8, generator=_gen(13))
    a = approxlab.approximate("yoso", q, k, v, num_features=8, generator=_gen(14))
    b = approxlab.approximate("yoso", q, k, v, num_features=8, generator=_gen(14))
    c = approxlab.approximate("yoso", q, k, v, num_features=8, generator=_gen(15))
    assert torch.equal(a.output, b.output)
    assert torch.equal(a.info["hyperplanes"], b.info["hyperplanes"])
    assert not torch.equal(a.output, c.output)


@pytest.mark.parametrize("name", ["yoso", "yoso-e"])
def test_batched_shapes_and_operator_consistency(name):
    """(2, 3, n, p) inputs with n != n_k; matmat / rmatmat agree with the dense matrix."""
    g = _gen(16)
    q = torch.randn(2, 3, 12, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, 10, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, 10, 5, generator=g, dtype=torch.float64)
    result = approxlab.approximate(name, q, k, v, num_features=16, generator=g)
    assert result.output.shape == (2, 3, 12, 5)
    operator = result.operator()
    assert tuple(operator.shape) == (2, 3, 12, 10)
    dense = operator.to_dense()
    x = torch.randn(2, 3, 10, 4, generator=g, dtype=torch.float64)
    y = torch.randn(2, 3, 12, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(operator.matmat(x), dense @ x)
    torch.testing.assert_close(operator.rmatmat(y), dense.transpose(-1, -2) @ y)
    torch.testing.assert_close(result.output, operator.matmat(v))
