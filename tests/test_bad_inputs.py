"""A table of bad inputs across the public API, and of degenerate inputs with a right answer.

Every bad input must raise ``TypeError``/``ValueError`` (or a domain error of
:mod:`approxlab.errors`, ``OverflowError``) whose message names the parameter, raised by a
``raise`` statement of approxlab itself -- never an error from inside torch (``_LinAlgError``,
``RuntimeError: expected scalar type``, ``NotImplementedError: ... for 'Half'``), never a NaN or
zero result. The degenerate inputs (pseudo-inverse of 0, huge entries, ...) must give the
right value, checked, not NaN.
"""

import linecache
import math
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch

import approxlab
from approxlab import linalg, metrics, operators, sketch, synthetic
from approxlab.errors import NotPSDError
from approxlab.leverage import approximate_ridge_leverage_scores, coherence, ridge_leverage_scores, statistical_dimension

PACKAGE = Path(approxlab.__file__).resolve().parent
CUDA = torch.cuda.is_available()
F64 = torch.float64


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


Q, K, V = synthetic.synthetic_qkv((2,), 6, 4, generator=_gen(0))  # float64 (2, 6, 4)
PSD = synthetic.psd_matrix(torch.tensor([3.0, 2.0, 1.0, 0.5], dtype=F64), generator=_gen(1))  # (4, 4)
MAT = torch.randn(5, 4, dtype=F64, generator=_gen(2))


def _with(x, index, value):
    y = x.clone()
    y[index] = value
    return y


def _approx(method="nystrom", q=Q, k=K, v=V, num_features=3, **kw):
    kw.setdefault("generator", _gen(3))
    return approxlab.approximate(method, q, k, v, num_features=num_features, **kw)


def _case(name, call, error, match, *marks):
    return pytest.param(call, error, match, id=name, marks=marks)


_cuda_only = pytest.mark.skipif(not CUDA, reason="needs a second device")

# -- exact_attention and attention_matrix ---------------------------------------------------

ATTENTION = [
    _case("exact-q-list", lambda: approxlab.exact_attention(Q.tolist(), K, V), TypeError, r"`q` must be a torch.Tensor; got list"),
    _case("exact-k-ndarray", lambda: approxlab.exact_attention(Q, K.numpy(), V), TypeError, r"`k` must be a torch.Tensor; got ndarray"),
    _case("exact-v-none", lambda: approxlab.exact_attention(Q, K, None), TypeError, r"`v` must be a torch.Tensor; got NoneType"),
    _case("exact-q-int64", lambda: approxlab.exact_attention(Q.long(), K, V), TypeError, r"`q` must have dtype float32 or float64; got torch.int64"),
    _case("exact-k-bool", lambda: approxlab.exact_attention(Q, K > 0, V), TypeError, r"`k` must have dtype float32 or float64; got torch.bool"),
    _case("exact-v-complex", lambda: approxlab.exact_attention(Q, K, V.to(torch.complex128)), TypeError, r"`v` must have dtype float32 or float64; got torch.complex128"),
    _case("exact-q-float16", lambda: approxlab.exact_attention(Q.half(), K.half(), V.half()), TypeError, r"`q` must have dtype float32 or float64; got torch.float16"),
    _case("exact-q-bfloat16", lambda: approxlab.exact_attention(Q.bfloat16(), K.bfloat16(), V.bfloat16()), TypeError, r"`q` must have dtype float32 or float64; got torch.bfloat16"),
    _case("exact-k-float16", lambda: approxlab.exact_attention(Q, K.half(), V), TypeError, r"`k` must have dtype float32 or float64; got torch.float16"),
    _case("exact-q-1d", lambda: approxlab.exact_attention(Q[0, 0], K, V), ValueError, r"`q` must have at least 2 dimensions \(\*batch, n, p\); got shape \(4,\)"),
    _case("exact-q-0d", lambda: approxlab.exact_attention(Q[0, 0, 0], K, V), ValueError, r"`q` must have at least 2 dimensions"),
    _case("exact-p-zero", lambda: approxlab.exact_attention(Q[..., :0], K[..., :0], V), ValueError, r"`q` must be non-empty \(every dimension >= 1\); got shape \(2, 6, 0\)"),
    _case("exact-zero-keys", lambda: approxlab.exact_attention(Q, K[:, :0], V[:, :0]), ValueError, r"`k` must be non-empty .*got shape \(2, 0, 4\)"),
    _case("exact-zero-queries", lambda: approxlab.exact_attention(Q[:, :0], K, V), ValueError, r"`q` must be non-empty .*got shape \(2, 0, 4\)"),
    _case("exact-pv-zero", lambda: approxlab.exact_attention(Q, K, V[..., :0]), ValueError, r"`v` must be non-empty .*got shape \(2, 6, 0\)"),
    _case("exact-empty-batch", lambda: approxlab.exact_attention(Q[:0], K[:0], V[:0]), ValueError, r"`q` must be non-empty .*got shape \(0, 6, 4\)"),
    _case("exact-q-nan", lambda: approxlab.exact_attention(_with(Q, (0, 1, 2), math.nan), K, V), ValueError, r"`q` must be finite; got 1 non-finite entries"),
    _case("exact-k-inf", lambda: approxlab.exact_attention(Q, _with(K, (1, 0, 0), math.inf), V), ValueError, r"`k` must be finite; got 1 non-finite"),
    _case("exact-v-neginf", lambda: approxlab.exact_attention(Q, K, _with(V, (0, 0, 0), -math.inf)), ValueError, r"`v` must be finite"),
    _case("exact-p-mismatch", lambda: approxlab.exact_attention(Q, K[..., :3], V), ValueError, r"`q` and `k` must share the feature dimension p; got q.shape=\(2, 6, 4\) and k.shape=\(2, 6, 3\)"),
    _case("exact-batch-mismatch", lambda: approxlab.exact_attention(Q, K.repeat(2, 1, 1), V), ValueError, r"`q` and `k` must share batch dimensions; got \(2,\) and \(4,\)"),
    _case("exact-ndim-mismatch", lambda: approxlab.exact_attention(Q, K[None], V[None]), ValueError, r"`q` and `k` must share batch dimensions; got \(2,\) and \(1, 2\)"),
    _case("exact-qk-dtype", lambda: approxlab.exact_attention(Q.float(), K, V), ValueError, r"`q` and `k` must share dtype and device; got torch.float32/cpu and torch.float64/cpu"),
    _case("exact-v-dtype", lambda: approxlab.exact_attention(Q, K, V.float()), ValueError, r"`q` and `v` must share dtype and device"),
    _case("exact-v-length", lambda: approxlab.exact_attention(Q, K, V[:, :5]), ValueError, r"`v` must have shape \(\*batch, n_k, p_v\) matching k.shape\[:-1\]=\(2, 6\); got v.shape=\(2, 5, 4\)"),
    _case("exact-v-batch", lambda: approxlab.exact_attention(Q, K, V[:1]), ValueError, r"`v` must have shape \(\*batch, n_k, p_v\)"),
    _case("exact-k-meta", lambda: approxlab.exact_attention(Q, K.to("meta"), V), ValueError, r"`k` must hold data \(a CPU or accelerator tensor\); got a tensor on the meta device"),
    _case("exact-q-sparse", lambda: approxlab.exact_attention(Q[0].to_sparse(), K[0], V[0]), TypeError, r"`q` must be a dense \(strided\) tensor; got layout torch.sparse_coo"),
    _case("exact-q-huge", lambda: approxlab.exact_attention(Q * 1e160, K, V), ValueError, r"`q` must have entries small enough that p \* max\|q\|\^2 <= finfo\(torch.float64\).max / 4"),
    _case("exact-k-huge-float32", lambda: approxlab.exact_attention(Q.float(), K.float() * 1e19, V.float()), ValueError, r"`k` must have entries small enough .*finfo\(torch.float32\)"),
    _case("exact-k-other-device", lambda: approxlab.exact_attention(Q, K.cuda(), V), ValueError, r"`q` and `k` must share dtype and device", _cuda_only),
    _case("matrix-kind-list", lambda: approxlab.attention_matrix(Q, K, ["softmax"]), ValueError, r"`kind` must be one of \['kernelized', 'scores', 'softmax'\]; got \['softmax'\]"),
    _case("matrix-kind-none", lambda: approxlab.attention_matrix(Q, K, None), ValueError, r"`kind` must be one of .*; got None"),
    _case("matrix-kind-case", lambda: approxlab.attention_matrix(Q, K, "Softmax"), ValueError, r"`kind` must be one of .*; got 'Softmax'"),
    _case("matrix-kind-dict", lambda: approxlab.attention_matrix(Q, K, {}), ValueError, r"`kind` must be one of .*; got \{\}"),
    _case("matrix-kind-int", lambda: approxlab.attention_matrix(Q, K, 0), ValueError, r"`kind` must be one of .*; got 0"),
    _case("matrix-p-zero", lambda: approxlab.attention_matrix(Q[..., :0], K[..., :0]), ValueError, r"`q` must be non-empty"),
    _case("matrix-zero-keys", lambda: approxlab.attention_matrix(Q, K[:, :0], "kernelized"), ValueError, r"`k` must be non-empty"),
    _case("matrix-float16", lambda: approxlab.attention_matrix(Q.half(), K.half(), "scores"), TypeError, r"`q` must have dtype float32 or float64; got torch.float16"),
    _case("matrix-k-nan", lambda: approxlab.attention_matrix(Q, _with(K, (0, 0, 0), math.nan)), ValueError, r"`k` must be finite"),
    _case("matrix-q-tuple", lambda: approxlab.attention_matrix(tuple(Q), K), TypeError, r"`q` must be a torch.Tensor; got tuple"),
    _case("matrix-k-complex", lambda: approxlab.attention_matrix(Q, K.to(torch.complex128)), TypeError, r"`k` must have dtype float32 or float64; got torch.complex128"),
    _case("matrix-scores-overflow", lambda: approxlab.attention_matrix(Q.float() * 30, K.float() * 30, "scores"), OverflowError, r"`attention_matrix\(kind='scores'\)` overflows torch.float32"),
]

# -- approximate: method, num_features, generator, options ------------------------------------

APPROXIMATE = [
    _case("approx-method-unknown", lambda: _approx("nystroem"), ValueError, r"`method` must be one of \['exact', .*\]; got 'nystroem'"),
    _case("approx-method-list", lambda: _approx(["nystrom"]), ValueError, r"`method` must be one of .*; got \['nystrom'\]"),
    _case("approx-method-none", lambda: _approx(None), ValueError, r"`method` must be one of .*; got None"),
    _case("approx-method-int", lambda: _approx(3), ValueError, r"`method` must be one of .*; got 3"),
    _case("approx-features-negative", lambda: _approx(num_features=-1), ValueError, r"`num_features` must be an integer with 1 <= num_features <= 6; got -1"),
    _case("approx-features-too-many", lambda: _approx(num_features=7), ValueError, r"`num_features` must be an integer with 1 <= num_features <= 6; got 7"),
    _case("approx-features-bool", lambda: _approx(num_features=True), TypeError, r"`num_features` must be an integer; got True \(bool\)"),
    _case("approx-features-str", lambda: _approx(num_features="3"), TypeError, r"`num_features` must be an integer; got '3' \(str\)"),
    _case("approx-features-none", lambda: _approx(num_features=None), TypeError, r"`num_features` must be an integer; got None"),
    _case("approx-features-tensor", lambda: _approx(num_features=torch.tensor(3)), TypeError, r"`num_features` must be an integer; got tensor\(3\) \(Tensor\)"),
    _case("approx-generator-int", lambda: _approx(generator=0), TypeError, r"`generator` must be a torch.Generator or None; got int"),
    _case("approx-generator-numpy", lambda: _approx(generator=np.random.default_rng(0)), TypeError, r"`generator` must be a torch.Generator or None; got Generator"),
    _case("approx-generator-str", lambda: _approx(generator="seed"), TypeError, r"`generator` must be a torch.Generator or None; got str"),
    _case("approx-generator-cuda", lambda: _approx(generator=torch.Generator(device="cuda")), ValueError, r"`generator` must be a CPU torch.Generator", _cuda_only),
    _case("approx-option-unknown", lambda: _approx(foo=1), TypeError, r"`foo` is not an option of method 'nystrom' .*; its options are \['columns', 'ridge_lambda', 'sampling'\]; got foo=1"),
    _case("approx-option-of-other-method", lambda: _approx("performer", tau=4), TypeError, r"`tau` is not an option of method 'performer'"),
    _case("approx-v-none", lambda: _approx(v=None), TypeError, r"`v` must be a torch.Tensor; got NoneType"),
    _case("approx-q-float16", lambda: _approx("skyformer", Q.half(), K.half(), V.half()), TypeError, r"`q` must have dtype float32 or float64; got torch.float16"),
    _case("approx-q-bfloat16", lambda: _approx("performer", Q.bfloat16(), K.bfloat16(), V.bfloat16()), TypeError, r"`q` must have dtype float32 or float64; got torch.bfloat16"),
    _case("approx-zero-keys", lambda: _approx("linformer", k=K[:, :0], v=V[:, :0]), ValueError, r"`k` must be non-empty"),
    _case("approx-v-nan", lambda: _approx("performer", v=_with(V, (0, 0, 0), math.nan)), ValueError, r"`v` must be finite"),
    _case("approx-v-int", lambda: _approx("yoso", v=V.int()), TypeError, r"`v` must have dtype float32 or float64; got torch.int32"),
    _case("approx-nystrom-lengths", lambda: _approx("nystrom", k=K[:, :5], v=V[:, :5]), ValueError, r"`q` and `k` must have the same length n"),
    _case("nystrom-sampling", lambda: _approx("nystrom", sampling="leverage"), ValueError, r"`sampling` must be one of .*; got 'leverage'"),
    _case("nystrom-ridge-lambda", lambda: _approx("nystrom", sampling="ridge-leverage", ridge_lambda=-1.0), ValueError, r"`ridge_lambda` must be a finite number > 0; got -1.0"),
    _case("nystrom-columns-float", lambda: _approx("nystrom", columns=torch.tensor([0.0, 1.0, 2.0])), TypeError, r"`columns` must have an integer dtype"),
    _case("nystrom-columns-range", lambda: _approx("nystrom", columns=torch.tensor([0, 1, 6])), ValueError, r"`columns` must hold indices in \[0, 6\); got values in \[0, 6\]"),
    _case("nystromformer-pinv", lambda: _approx("nystromformer", pinv="svd"), ValueError, r"`pinv` must be one of .*; got 'svd'"),
    _case("nystromformer-num-iter", lambda: _approx("nystromformer", num_iter=-1), ValueError, r"`num_iter` must be an integer with 0 <= num_iter <= inf; got -1"),
    _case("nystromformer-init", lambda: _approx("nystromformer", init="zeros"), ValueError, r"`init` must be one of .*; got 'zeros'"),
    _case("nystromformer-residual-norm", lambda: _approx("nystromformer", residual_norm="l1"), ValueError, r"`residual_norm` must be one of .*; got 'l1'"),
    _case("nystromformer-residual-history", lambda: _approx("nystromformer", residual_history="yes"), TypeError, r"`residual_history` must be a bool \(True or False\); got 'yes'"),
    _case("skyformer-core", lambda: _approx("skyformer", core="inverse"), ValueError, r"`core` must be one of \['pinv', 'schulz'\]; got 'inverse'"),
    _case("skyformer-gamma-zero", lambda: _approx("skyformer", core="schulz", gamma=0.0), ValueError, r"`gamma` must be a finite number > 0; got 0.0"),
    _case("skyformer-gamma-nan", lambda: _approx("skyformer", core="schulz", gamma=math.nan), ValueError, r"`gamma` must be a finite number > 0; got nan"),
    _case("skyformer-num-iter-float", lambda: _approx("skyformer", core="schulz", num_iter=1.5), TypeError, r"`num_iter` must be an integer; got 1.5"),
    _case("skyformer-softmax-init", lambda: _approx("skyformer-softmax", core="schulz", init="eye"), ValueError, r"`init` must be one of .*; got 'eye'"),
    _case("performer-orthogonal", lambda: _approx("performer", orthogonal=1), TypeError, r"`orthogonal` must be a bool \(True or False\); got 1"),
    _case("performer-lra-epsilon", lambda: _approx("performer-lra", epsilon=-1e-4), ValueError, r"`epsilon` must be a finite number >= 0; got -0.0001"),
    _case("performer-lra-shared-key-max", lambda: _approx("performer-lra", shared_key_max="yes"), TypeError, r"`shared_key_max` must be a bool \(True or False\); got 'yes'"),
    _case("yoso-tau-zero", lambda: _approx("yoso", tau=0), ValueError, r"`tau` must be an integer with 1 <= tau <= 30; got 0"),
    _case("yoso-normalize", lambda: _approx("yoso", normalize_output="yes"), TypeError, r"`normalize_output` must be a bool"),
    _case("yoso-e-tau-large", lambda: _approx("yoso-e", tau=1000), ValueError, r"`tau` must be an integer with 1 <= tau <= 30; got 1000"),
    _case("informer-measure-keys", lambda: _approx("informer", measure_keys="some"), ValueError, r"`measure_keys` must be one of .*; got 'some'"),
    _case("informer-sample-size", lambda: _approx("informer", sample_size=0), ValueError, r"`sample_size` must be an integer with 1 <= sample_size <= 6; got 0"),
    _case("linformer-share", lambda: _approx("linformer", share_projection=None), TypeError, r"`share_projection` must be a bool"),
    _case("spectral-shifting-form", lambda: _approx("spectral-shifting", form="eq9"), ValueError, r"`form` must be one of .*; got 'eq9'"),
    _case("spectral-shifting-rtol", lambda: _approx("spectral-shifting", rtol=-1e-3), ValueError, r"`rtol` must be a finite number > 0; got -0.001"),
    _case("spectral-shifting-identity-shift", lambda: _approx("spectral-shifting", identity_shift=1), TypeError, r"`identity_shift` must be a bool; got 1"),
]

# Every registered method inherits the shared checks of `approximate`.
for _name in approxlab.methods.available():
    APPROXIMATE += [
        _case(f"approx-{_name}-features-zero", lambda m=_name: _approx(m, num_features=0), ValueError, r"`num_features` must be an integer with 1 <= num_features <= \d+; got 0"),
        _case(f"approx-{_name}-features-float", lambda m=_name: _approx(m, num_features=2.0), TypeError, r"`num_features` must be an integer; got 2.0 \(float\)"),
        _case(f"approx-{_name}-k-inf", lambda m=_name: _approx(m, k=_with(K, (1, 2, 3), math.inf)), ValueError, r"`k` must be finite; got 1 non-finite"),
        _case(f"approx-{_name}-option-unknown", lambda m=_name: _approx(m, landmarks=2), TypeError, rf"`landmarks` is not an option of method '{_name}'"),
    ]

# -- linalg ---------------------------------------------------------------------------------

LINALG = [
    _case("pinv-list", lambda: linalg.iterative_pinv([[1.0]]), TypeError, r"`m` must be a torch.Tensor; got list"),
    _case("pinv-not-square", lambda: linalg.iterative_pinv(MAT), ValueError, r"`m` must be square \(\*batch, n, n\); got shape \(5, 4\)"),
    _case("pinv-int", lambda: linalg.iterative_pinv(torch.eye(3, dtype=torch.int64)), TypeError, r"`m` must have dtype float32 or float64; got torch.int64"),
    _case("pinv-float16", lambda: linalg.iterative_pinv(torch.eye(3).half()), TypeError, r"`m` must have dtype float32 or float64; got torch.float16"),
    _case("pinv-nan", lambda: linalg.iterative_pinv(_with(PSD, (0, 0), math.nan)), ValueError, r"`m` must be finite"),
    _case("pinv-empty", lambda: linalg.iterative_pinv(torch.zeros(0, 0, dtype=F64)), ValueError, r"`m` must be non-empty"),
    _case("pinv-num-iter-negative", lambda: linalg.iterative_pinv(PSD, num_iter=-1), ValueError, r"`num_iter` must be an integer with 0 <= num_iter <= inf; got -1"),
    _case("pinv-num-iter-float", lambda: linalg.iterative_pinv(PSD, num_iter=1.5), TypeError, r"`num_iter` must be an integer; got 1.5"),
    _case("pinv-num-iter-bool", lambda: linalg.iterative_pinv(PSD, num_iter=True), TypeError, r"`num_iter` must be an integer; got True"),
    _case("pinv-tol-zero", lambda: linalg.iterative_pinv(PSD, tol=0), ValueError, r"`tol` must be a finite number > 0; got 0.0"),
    _case("pinv-tol-nan", lambda: linalg.iterative_pinv(PSD, tol=math.nan), ValueError, r"`tol` must be a finite number > 0; got nan"),
    _case("pinv-tol-str", lambda: linalg.iterative_pinv(PSD, tol="1e-3"), TypeError, r"`tol` must be a real number; got '1e-3'"),
    _case("pinv-history", lambda: linalg.iterative_pinv(PSD, history="yes"), TypeError, r"`history` must be a bool"),
    _case("pinv-norm", lambda: linalg.iterative_pinv(PSD, norm="nuclear"), ValueError, r"`norm` must be one of \['frobenius', 'spectral'\]; got 'nuclear'"),
    _case("pinv-init-name", lambda: linalg.iterative_pinv(PSD, init="zeros"), ValueError, r"`init` must be one of .* or a tensor; got 'zeros'"),
    _case("pinv-init-list", lambda: linalg.iterative_pinv(PSD, init=["identity"]), ValueError, r"`init` must be one of .* or a tensor; got \['identity'\]"),
    _case("pinv-init-ndarray", lambda: linalg.iterative_pinv(PSD, init=np.eye(4)), ValueError, r"`init` must be one of .* or a tensor; got array"),
    _case("pinv-init-shape", lambda: linalg.iterative_pinv(PSD, init=torch.eye(3, dtype=F64)), ValueError, r"`init` as a tensor must have shape \(\*batch, 4, 4\)"),
    _case("pinv-init-batch", lambda: linalg.iterative_pinv(PSD.expand(2, 4, 4), init=torch.eye(4, dtype=F64).expand(3, 4, 4)), ValueError, r"`init` as a tensor must have shape .* broadcasting to m.shape=\(2, 4, 4\); got \(3, 4, 4\)"),
    _case("pinv-init-nan", lambda: linalg.iterative_pinv(PSD, init=_with(PSD, (1, 1), math.nan)), ValueError, r"`init` must be finite"),
    _case("pinv-init-int", lambda: linalg.iterative_pinv(PSD, init=torch.eye(4, dtype=torch.int64)), TypeError, r"`init` must have dtype float32 or float64"),
    _case("pinv-official-negative", lambda: linalg.iterative_pinv(-torch.eye(3, dtype=F64), init="official"), ValueError, r"`init`='official' divides M\^T by the largest column sum of `m` .*must be > 0 .*got -1.000e\+00"),
    _case("golub-kahan-list", lambda: linalg.golub_kahan([[1.0]]), TypeError, r"`op` must be a LinearOperator or torch.Tensor; got list"),
    _case("golub-kahan-tol", lambda: linalg.golub_kahan(MAT, tol=-1.0), ValueError, r"`tol` must be a finite number > 0; got -1.0"),
    _case("golub-kahan-max-iter", lambda: linalg.golub_kahan(MAT, max_iter=0), ValueError, r"`max_iter` must be an integer with 1 <= max_iter <= inf; got 0"),
    _case("golub-kahan-float16", lambda: linalg.golub_kahan(MAT.half()), TypeError, r"`op` must have dtype float32 or float64; got torch.float16"),
    _case("golub-kahan-generator", lambda: linalg.golub_kahan(MAT, generator=1), TypeError, r"`generator` must be a torch.Generator or None; got int"),
    _case("golub-kahan-empty", lambda: linalg.golub_kahan(MAT[:0]), ValueError, r"`op` must be non-empty"),
    _case("condition-number-int", lambda: linalg.condition_number(torch.eye(3, dtype=torch.int32)), TypeError, r"`M` must have dtype float32 or float64; got torch.int32"),
    _case("condition-number-rtol-one", lambda: linalg.condition_number(MAT, rtol=1.0), ValueError, r"`rtol` must satisfy 0 <= rtol < 1; got 1.0"),
    _case("condition-number-rtol-negative", lambda: linalg.condition_number(MAT, rtol=-0.1), ValueError, r"`rtol` must be a finite number >= 0; got -0.1"),
    _case("condition-number-float16", lambda: linalg.condition_number(MAT.half()), TypeError, r"`M` must have dtype float32 or float64; got torch.float16"),
    _case("singular-empty", lambda: linalg.is_numerically_singular(MAT[:, :0]), ValueError, r"`M` must be non-empty .*got shape \(5, 0\)"),
    _case("singular-values-bfloat16", lambda: linalg.singular_values(MAT.bfloat16()), TypeError, r"`M` must have dtype float32 or float64; got torch.bfloat16"),
]

# -- metrics and leverage -------------------------------------------------------------------

METRICS = [
    _case("spectral-norm-list", lambda: metrics.spectral_norm([[1.0]]), TypeError, r"`x` must be a torch.Tensor, a LinearOperator or an Approximation; got list"),
    _case("spectral-norm-int", lambda: metrics.spectral_norm(torch.eye(3, dtype=torch.int64)), TypeError, r"`x` must have dtype float32 or float64; got torch.int64"),
    _case("spectral-norm-complex", lambda: metrics.spectral_norm(MAT.to(torch.complex128)), TypeError, r"`x` must have dtype float32 or float64; got torch.complex128"),
    _case("spectral-norm-1d", lambda: metrics.spectral_norm(MAT[0]), ValueError, r"`x` must have at least 2 dimensions"),
    _case("spectral-norm-empty", lambda: metrics.spectral_norm(MAT[:0]), ValueError, r"`x` must be non-empty"),
    _case("spectral-norm-tol", lambda: metrics.spectral_norm(MAT, tol=0.0), ValueError, r"`tol` must be a finite number > 0; got 0.0"),
    _case("spectral-norm-max-iter", lambda: metrics.spectral_norm(MAT, max_iter=0), ValueError, r"`max_iter` must be an integer with 1 <= max_iter"),
    _case("spectral-norm-generator", lambda: metrics.spectral_norm(MAT, generator="g"), TypeError, r"`generator` must be a torch.Generator or None; got str"),
    _case("spectral-norm-return-info", lambda: metrics.spectral_norm(MAT, return_info=1), TypeError, r"`return_info` must be a bool; got 1"),
    _case("spectral-norm-operator-float16", lambda: metrics.spectral_norm(operators.DenseOperator(MAT.half())), TypeError, r"`matrix` must have dtype float32 or float64; got torch.float16"),
    _case("spectral-error-shapes", lambda: metrics.spectral_error(MAT, MAT.T), ValueError, r"`approx` and `exact` must have the same shape \(\*batch, n, m\) .*got \(5, 4\) and \(4, 5\)"),
    _case("spectral-error-relative", lambda: metrics.spectral_error(MAT, MAT, relative="yes"), TypeError, r"`relative` must be a bool; got 'yes'"),
    _case("spectral-error-zero-exact", lambda: metrics.spectral_error(MAT, torch.zeros_like(MAT), relative=True), ValueError, r"`exact` has spectral norm 0 in 1 batch element\(s\)"),
    _case("spectral-error-nan", lambda: metrics.spectral_error(MAT, _with(MAT, (0, 0), math.nan)), ValueError, r"`exact` must be finite"),
    _case("spectral-error-approx-none", lambda: metrics.spectral_error(None, MAT), TypeError, r"`approx` must be a torch.Tensor, a LinearOperator or an Approximation; got NoneType"),
    _case("spectral-error-devices", lambda: metrics.spectral_error(MAT.cuda(), MAT), ValueError, r"`approx` and `exact` must be on one device", _cuda_only),
    _case("stable-rank-zero", lambda: metrics.stable_rank(torch.zeros(3, 3, dtype=F64)), ValueError, r"`M` must be nonzero: the stable rank of a zero matrix is undefined"),
    _case("stable-rank-complex", lambda: metrics.stable_rank(MAT.to(torch.complex64)), TypeError, r"`M` must have dtype float32 or float64; got torch.complex64"),
    _case("effective-rank-zero", lambda: metrics.effective_rank(torch.zeros(2, 3, 3, dtype=F64)), ValueError, r"`M` must be nonzero: the effective rank .*got 2 zero matrices"),
    _case("numerical-rank-rtol", lambda: metrics.numerical_rank(MAT, rtol=1), ValueError, r"`rtol` must satisfy 0 <= rtol < 1; got 1.0"),
    _case("numerical-rank-rtol-str", lambda: metrics.numerical_rank(MAT, rtol="1e-6"), TypeError, r"`rtol` must be a real number; got '1e-6'"),
    _case("decay-rate-num", lambda: metrics.singular_value_decay_rate(MAT, num=1), ValueError, r"`num` must be an integer with 2 <= num <= inf; got 1"),
    _case("decay-rate-rank-one", lambda: metrics.singular_value_decay_rate(torch.ones(4, 4, dtype=F64)), ValueError, r"`M` must have at least 2 singular values above the numerical-zero level"),
    _case("loewner-not-square", lambda: metrics.loewner_min_eig(MAT, MAT), ValueError, r"`A` must be square"),
    _case("loewner-shapes", lambda: metrics.loewner_min_eig(PSD, torch.eye(3, dtype=F64)), ValueError, r"`A` and `B` must have the same shape"),
    _case("spectrum-measures-list", lambda: metrics.spectrum_measures([3.0, 1.0], (2, 2)), TypeError, r"`sigma` must be a torch.Tensor; got list"),
    _case("spectrum-measures-shape", lambda: metrics.spectrum_measures(torch.ones(1, 3, dtype=F64), (3,)), ValueError, r"`shape` must be a pair \(n, k\); got \(3,\)"),
    _case("spectrum-measures-shape-zero", lambda: metrics.spectrum_measures(torch.ones(1, 3, dtype=F64), (3, 0)), ValueError, r"`shape` must be an integer with 1 <= shape"),
    _case("spectrum-measures-rtol", lambda: metrics.spectrum_measures(torch.ones(1, 3, dtype=F64), (3, 3), rtol=2.0), ValueError, r"`rtol` must satisfy 0 <= rtol < 1; got 2.0"),
    _case("spectrum-measures-eps", lambda: metrics.spectrum_measures(torch.ones(1, 3, dtype=F64), (3, 3), eps=(0.1, 0.0)), ValueError, r"`eps` must be a finite number > 0; got 0.0"),
    _case("spectrum-measures-dtype", lambda: metrics.spectrum_measures(torch.ones(1, 3, dtype=F64), (3, 3), dtype=torch.float16), ValueError, r"`dtype` must be one of \[torch.float32, torch.float64\]; got torch.float16"),
    _case("spectrum-measures-zero", lambda: metrics.spectrum_measures(torch.zeros(1, 3, dtype=F64), (3, 3)), ValueError, r"`sigma` must belong to nonzero matrices"),
    _case("leverage-lam-zero", lambda: ridge_leverage_scores(PSD, 0.0), ValueError, r"`lam` must be a finite number > 0; got 0.0"),
    _case("leverage-lam-negative", lambda: ridge_leverage_scores(PSD, -1.0), ValueError, r"`lam` must be a finite number > 0; got -1.0"),
    _case("leverage-lam-nan", lambda: statistical_dimension(PSD, math.nan), ValueError, r"`lam` must be a finite number > 0; got nan"),
    _case("leverage-lam-inf", lambda: coherence(PSD, math.inf), ValueError, r"`lam` must be a finite number > 0; got inf"),
    _case("leverage-lam-str", lambda: ridge_leverage_scores(PSD, "1"), TypeError, r"`lam` must be a real number; got '1' \(str\)"),
    _case("leverage-lam-bool", lambda: ridge_leverage_scores(PSD, True), TypeError, r"`lam` must be a real number; got True \(bool\)"),
    _case("leverage-not-symmetric", lambda: ridge_leverage_scores(_with(PSD, (0, 1), 5.0), 0.1), NotPSDError, r"`K` must be symmetric positive semidefinite"),
    _case("leverage-not-psd", lambda: statistical_dimension(-PSD, 0.1), NotPSDError, r"`K` must be positive semidefinite: its smallest eigenvalue"),
    _case("leverage-tol-zero", lambda: coherence(PSD, 0.1, tol=0.0), ValueError, r"`tol` must be a finite number > 0; got 0.0"),
    _case("leverage-int", lambda: statistical_dimension(torch.eye(3, dtype=torch.int64), 0.1), TypeError, r"`K` must have dtype float32 or float64"),
    _case("leverage-not-square", lambda: coherence(MAT, 0.1), ValueError, r"`K` must be square"),
    _case("approx-leverage-diag-shape", lambda: approximate_ridge_leverage_scores(PSD[:, :2], PSD.diagonal()[:3], torch.tensor([0, 1]), 0.1), ValueError, r"`k_diag` must have shape \(\*batch, N\) = \(4,\)"),
    _case("approx-leverage-columns-float", lambda: approximate_ridge_leverage_scores(PSD[:, :2], PSD.diagonal(), torch.tensor([0.0, 1.0]), 0.1), TypeError, r"`columns` must have an integer dtype"),
    _case("approx-leverage-columns-range", lambda: approximate_ridge_leverage_scores(PSD[:, :2], PSD.diagonal(), torch.tensor([0, 4]), 0.1), ValueError, r"`columns` must hold indices in \[0, 4\)"),
    _case("approx-leverage-weights", lambda: approximate_ridge_leverage_scores(PSD[:, :2], PSD.diagonal(), torch.tensor([0, 1]), 0.1, weights=torch.tensor([1.0, -1.0], dtype=F64)), ValueError, r"`weights` must be > 0"),
    _case("approx-leverage-lam", lambda: approximate_ridge_leverage_scores(PSD[:, :2], PSD.diagonal(), torch.tensor([0, 1]), 0), ValueError, r"`lam` must be a finite number > 0; got 0.0"),
]

# -- sketch, operators, synthetic -----------------------------------------------------------

OTHERS = [
    _case("uniform-columns-none", lambda: sketch.uniform_columns(0, 1), ValueError, r"`num_columns` must be an integer with 1 <= num_columns <= inf; got 0"),
    _case("uniform-columns-too-many", lambda: sketch.uniform_columns(5, 6), ValueError, r"`d` must be an integer with 1 <= d <= 5; got 6"),
    _case("uniform-columns-generator", lambda: sketch.uniform_columns(5, 2, generator=3), TypeError, r"`generator` must be a torch.Generator or None; got int"),
    _case("leverage-columns-negative", lambda: sketch.ridge_leverage_columns(torch.tensor([0.5, -0.1], dtype=F64), 1), ValueError, r"`scores` must be >= 0"),
    _case("leverage-columns-zero", lambda: sketch.ridge_leverage_columns(torch.zeros(3, dtype=F64), 1), ValueError, r"`scores` must have at least 1 positive entries per batch element"),
    _case("leverage-columns-d", lambda: sketch.ridge_leverage_columns(torch.ones(3, dtype=F64), 0), ValueError, r"`d` must be an integer with 1 <= d"),
    _case("leverage-columns-nan", lambda: sketch.ridge_leverage_columns(torch.tensor([1.0, math.nan], dtype=F64), 1), ValueError, r"`scores` must be finite"),
    _case("stable-pinv-not-square", lambda: linalg.stable_pinv(MAT), ValueError, r"`m` must be square"),
    _case("stable-pinv-rcond", lambda: linalg.stable_pinv(PSD, rcond=-1.0), ValueError, r"`rcond` must be a finite number > 0; got -1.0"),
    _case("stable-pinv-float16", lambda: linalg.stable_pinv(PSD.half()), TypeError, r"`m` must have dtype float32 or float64; got torch.float16"),
    _case("sketch-nystrom-columns-range", lambda: sketch.nystrom(PSD, torch.tensor([0, 9])), ValueError, r"`columns` must hold indices in \[0, 4\); got values in \[0, 9\]"),
    _case("sketch-nystrom-columns-float", lambda: sketch.nystrom(PSD, torch.tensor([0.0, 1.0])), TypeError, r"`columns` must have an integer dtype"),
    _case("sketch-nystrom-columns-empty", lambda: sketch.nystrom(PSD, torch.tensor([], dtype=torch.long)), ValueError, r"`columns` must have shape \(d,\) or \(\*batch, d\) with d >= 1"),
    _case("sketch-nystrom-columns-list", lambda: sketch.nystrom(PSD, [0, 1]), TypeError, r"`columns` must be an integer torch.Tensor; got list"),
    _case("sketch-nystrom-not-symmetric", lambda: sketch.nystrom(_with(PSD, (0, 1), 5.0), torch.tensor([0, 1])), NotPSDError, r"`K` must be symmetric positive semidefinite"),
    _case("scaled-core-negative", lambda: linalg.scaled_core(-PSD.abs(), 0.1), ValueError, r"`m` must have non-negative entries"),
    _case("scaled-core-gamma", lambda: linalg.scaled_core(PSD.abs(), 0.0), ValueError, r"`gamma` must be a finite number > 0; got 0.0"),
    _case("nystrom-core-name", lambda: linalg.nystrom_core(PSD, core="qr"), ValueError, r"`core` must be one of \['pinv', 'schulz'\]; got 'qr'"),
    _case("nystrom-core-schulz-general", lambda: linalg.nystrom_core(PSD.abs(), core="schulz", hermitian=False), ValueError, r"`core` must be 'pinv' for a non-symmetric core block"),
    _case("exact-operator-kind", lambda: operators.ExactAttentionOperator(Q, K, kind="relu"), ValueError, r"`kind` must be one of \['kernelized', 'scores', 'softmax'\]; got 'relu'"),
    _case("exact-operator-kind-list", lambda: operators.ExactAttentionOperator(Q, K, kind=["softmax"]), ValueError, r"`kind` must be one of .*; got \['softmax'\]"),
    _case("exact-operator-block", lambda: operators.ExactAttentionOperator(Q, K, block_size=0), ValueError, r"`block_size` must be an integer with 1 <= block_size <= inf; got 0"),
    _case("exact-operator-block-bool", lambda: operators.ExactAttentionOperator(Q, K, block_size=True), TypeError, r"`block_size` must be an integer; got True"),
    _case("exact-operator-p-zero", lambda: operators.ExactAttentionOperator(Q[..., :0], K[..., :0]), ValueError, r"`q` must be non-empty"),
    _case("exact-operator-float16", lambda: operators.ExactAttentionOperator(Q.half(), K.half()), TypeError, r"`q` must have dtype float32 or float64; got torch.float16"),
    _case("operator-matmat-shape", lambda: operators.DenseOperator(MAT).matmat(torch.ones(5, 1, dtype=F64)), ValueError, r"`x` must have shape \(\*batch, 4, k\)"),
    _case("operator-matmat-dtype", lambda: operators.DenseOperator(MAT).matmat(torch.ones(4, 1)), ValueError, r"`x` must have the operator's dtype and device \(torch.float64/cpu\); got torch.float32/cpu"),
    _case("operator-rmatmat-list", lambda: operators.DenseOperator(MAT).rmatmat([[1.0]] * 5), TypeError, r"`y` must be a torch.Tensor; got list"),
    _case("operator-dense-list", lambda: operators.DenseOperator([[1.0]]), TypeError, r"`matrix` must be a torch.Tensor; got list"),
    _case("operator-product-empty", lambda: operators.ProductOperator(), ValueError, r"`factors` must contain at least one operator or tensor; got none"),
    _case("operator-product-shapes", lambda: operators.ProductOperator(MAT, MAT), ValueError, r"`factors` have incompatible shapes \(5, 4\) and \(5, 4\)"),
    _case("operator-sum-shapes", lambda: operators.DenseOperator(MAT) - operators.DenseOperator(MAT.T), ValueError, r"`operators` must share their matrix shape"),
    _case("uniform-columns-replace", lambda: sketch.uniform_columns(5, 2, replace=1), TypeError, r"`replace` must be a bool \(True or False\); got 1"),
    _case("uniform-columns-batch-int", lambda: sketch.uniform_columns(5, 2, batch_shape=3), TypeError, r"`batch_shape` must be a tuple of integers; got 3 \(int\)"),
    _case("uniform-columns-batch-negative", lambda: sketch.uniform_columns(5, 2, batch_shape=(2, -1)), ValueError, r"`batch_shape` must be a tuple of integers >= 1; got \(2, -1\)"),
    _case("leverage-columns-replace", lambda: sketch.ridge_leverage_columns(torch.ones(3, dtype=F64), 1, replace=None), TypeError, r"`replace` must be a bool"),
    _case("check-columns-num", lambda: sketch.check_columns(torch.tensor([0, 1]), "4"), TypeError, r"`num_columns` must be an integer; got '4'"),
    _case("check-columns-batch", lambda: sketch.check_columns(torch.tensor([0, 1]), 4, batch_shape=None), TypeError, r"`batch_shape` must be a tuple of integers; got None"),
    _case("stable-pinv-rcond-one", lambda: linalg.stable_pinv(PSD, rcond=1.0), ValueError, r"`rcond` must satisfy 0 < rcond < 1; got 1.0"),
    _case("stable-pinv-hermitian", lambda: linalg.stable_pinv(PSD, hermitian="yes"), TypeError, r"`hermitian` must be a bool"),
    _case("nystrom-rcond-large", lambda: sketch.nystrom(PSD, torch.tensor([0, 1]), rcond=2.0), ValueError, r"`rcond` must satisfy 0 < rcond < 1; got 2.0"),
    _case("nystrom-core-hermitian", lambda: linalg.nystrom_core(PSD, hermitian=0), TypeError, r"`hermitian` must be a bool"),
    _case("spectral-shifting-rtol-one", lambda: _approx("spectral-shifting", rtol=1.5), ValueError, r"`rtol` must satisfy 0 < rtol < 1; got 1.5"),
    _case("default-rtol-list", lambda: linalg.default_rtol([[1.0]]), TypeError, r"`M` must be a torch.Tensor; got list"),
    _case("default-rtol-int", lambda: linalg.default_rtol(torch.eye(2, dtype=torch.int64)), TypeError, r"`M` must have dtype float32 or float64"),
    _case("golub-kahan-nan-operator", lambda: linalg.golub_kahan(operators.DenseOperator(torch.full((3, 3), math.nan, dtype=F64)), generator=_gen()), FloatingPointError, r"`op` produced non-finite values \(NaN or inf\) in its products at step 1"),
    _case("spectral-norm-overflowing-operator", lambda: metrics.spectral_norm(operators.DenseOperator(torch.full((3, 3), 1e300, dtype=F64)) * 1e10), FloatingPointError, r"`op` produced non-finite values"),
    _case("operator-matvec-list", lambda: operators.DenseOperator(MAT).matvec([1.0] * 4), TypeError, r"`x` must be a torch.Tensor; got list"),
    _case("operator-rmatvec-float16", lambda: operators.DenseOperator(MAT).rmatvec(torch.ones(5).half()), TypeError, r"`y` must have dtype float32 or float64; got torch.float16"),
    _case("operator-matmat-nan", lambda: operators.DenseOperator(MAT).matmat(torch.full((4, 1), math.nan, dtype=F64)), ValueError, r"`x` must be finite"),
    _case("operator-times-str", lambda: operators.DenseOperator(MAT) * "2", TypeError, r"`c` must be a real number; got '2'"),
    _case("operator-times-nan", lambda: 2 * operators.DenseOperator(MAT) * math.nan, ValueError, r"`c` must be a finite number; got nan"),
    _case("operator-diagonal-int", lambda: operators.DiagonalOperator(torch.ones(3, dtype=torch.int64)), TypeError, r"`diag` must have dtype float32 or float64"),
    _case("synthetic-qkv-n", lambda: synthetic.synthetic_qkv((2,), 0, 4), ValueError, r"`n` must be an integer with 1 <= n <= inf; got 0"),
    _case("synthetic-qkv-p", lambda: synthetic.synthetic_qkv((2,), 4, 2.0), TypeError, r"`p` must be an integer; got 2.0"),
    _case("synthetic-qkv-scale", lambda: synthetic.synthetic_qkv((2,), 4, 2, scale=math.inf), ValueError, r"`scale` must be a finite number >= 0; got inf"),
    _case("synthetic-qkv-dtype", lambda: synthetic.synthetic_qkv((2,), 4, 2, dtype=torch.float16), ValueError, r"`dtype` must be one of \[torch.float32, torch.float64\]; got torch.float16"),
    _case("synthetic-qkv-batch", lambda: synthetic.synthetic_qkv(2, 4, 2), TypeError, r"`batch_shape` must be a tuple of integers; got 2"),
    _case("large-logit-max", lambda: synthetic.large_logit_qkv(max_logit=math.nan), ValueError, r"`max_logit` must be a finite number > 0; got nan"),
    _case("psd-matrix-list", lambda: synthetic.psd_matrix([1.0, 2.0]), TypeError, r"`eigenvalues` must be a torch.Tensor; got list"),
    _case("psd-matrix-nan", lambda: synthetic.psd_matrix(torch.tensor([1.0, math.nan], dtype=F64)), ValueError, r"`eigenvalues` must be finite"),
    _case("singular-values-complex", lambda: synthetic.matrix_with_singular_values(torch.ones(3, dtype=torch.complex64)), TypeError, r"`singular_values` must have dtype float32 or float64"),
    _case("random-orthogonal-dtype", lambda: synthetic.random_orthogonal(3, dtype="float64"), ValueError, r"`dtype` must be one of .*; got 'float64'"),
    _case("random-orthogonal-n", lambda: synthetic.random_orthogonal(0), ValueError, r"`n` must be an integer with 1 <= n <= inf; got 0"),
    _case("psd-matrix-negative", lambda: synthetic.psd_matrix(torch.tensor([1.0, -1.0], dtype=F64)), ValueError, r"`eigenvalues` must be >= 0 for a PSD matrix"),
    _case("synthetic-qkv-generator", lambda: synthetic.synthetic_qkv(generator=1), TypeError, r"`generator` must be a torch.Generator or None; got int"),
    _case("singular-values-m", lambda: synthetic.matrix_with_singular_values(torch.ones(4, dtype=F64), 3), ValueError, r"`m` must be an integer with 4 <= m <= inf; got 3"),
]

BAD_INPUTS = ATTENTION + APPROXIMATE + LINALG + METRICS + OTHERS


def _raise_site(error: BaseException):
    """The (file, source line) of the innermost Python frame of ``error``'s traceback."""
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return Path(frame.filename).resolve(), linecache.getline(frame.filename, frame.lineno).strip()


@pytest.mark.parametrize("call, error, match", BAD_INPUTS)
def test_bad_input_is_refused_by_approxlab(call, error, match):
    with pytest.raises(error, match=match) as info:
        call()
    raised = info.value
    assert not type(raised).__module__.startswith("torch"), f"a torch error: {type(raised)!r}"
    path, line = _raise_site(raised)
    # The innermost frame is approxlab's own `raise`, not a torch call whose C++ code raised.
    assert path.is_relative_to(PACKAGE), f"raised outside approxlab, in {path}"
    assert line.startswith("raise"), f"raised by `{line}` in {path.name}, not by a raise statement"
    assert "`" in str(raised), "the message must name the parameter in backquotes"


def test_the_raise_site_check_catches_errors_from_inside_torch():
    """The check above is able to fail: torch's own errors come from a C++ call, whose
    innermost Python frame is the calling line, not a ``raise``."""
    with pytest.raises(RuntimeError) as info:
        torch.ones(2, 3) @ torch.ones(2, 3)
    path, line = _raise_site(info.value)
    assert not line.startswith("raise")
    with pytest.raises(ValueError) as info:
        linalg.iterative_pinv(torch.eye(2, dtype=F64), init=object())  # approxlab's own, for contrast
    path, line = _raise_site(info.value)
    assert path.is_relative_to(PACKAGE) and line.startswith("raise")


def test_the_table_covers_at_least_120_bad_inputs():
    runnable = [case for case in BAD_INPUTS if not any(mark.name == "skipif" for mark in case.marks)]
    assert len(runnable) >= 120, len(runnable)
    assert len({case.id for case in BAD_INPUTS}) == len(BAD_INPUTS), "duplicate case ids"


# -- degenerate inputs with a right answer: never NaN, never a silent wrong zero ------------


@pytest.mark.parametrize("init", ["nystromformer", "official", "identity", "tensor"])
def test_pinv_of_zero_is_zero(init):
    """:math:`0^+ = 0`: ``inverse`` 0, ``residuals`` :math:`\\|I - 0\\| = 1`, Penrose residuals 0."""
    m = torch.zeros(2, 3, 3, dtype=F64)
    z0 = torch.eye(3, dtype=F64) if init == "tensor" else init
    result = linalg.iterative_pinv(m, num_iter=4, init=z0)
    assert torch.equal(result.inverse, torch.zeros_like(m))
    assert torch.equal(result.residuals, torch.ones(5, 2, dtype=F64))
    assert torch.equal(result.penrose_residuals, torch.zeros(5, 2, dtype=F64))
    assert torch.equal(result.inverse_residuals, torch.zeros(5, 2, dtype=F64))


@pytest.mark.parametrize("norm", ["spectral", "frobenius"])
def test_pinv_of_a_batch_with_one_zero_matrix(norm):
    """The zero element gets 0; the others are unaffected (per-matrix initial scaling)."""
    m = torch.stack([torch.zeros(4, 4, dtype=F64), PSD])
    result = linalg.iterative_pinv(m, num_iter=20, norm=norm)
    assert torch.equal(result.inverse[0], torch.zeros(4, 4, dtype=F64))
    torch.testing.assert_close(result.inverse[1], torch.linalg.inv(PSD), rtol=1e-10, atol=1e-10)
    assert float(result.penrose_residuals[-1].max()) < 1e-12


def test_pinv_of_a_tiny_matrix_is_not_lost_to_underflow():
    """||M||_1 ||M||_inf underflows to 0 for entries 1e-170; each norm alone does not."""
    m = PSD * 1e-170
    result = linalg.iterative_pinv(m, num_iter=20)
    torch.testing.assert_close(result.inverse * 1e-170, torch.linalg.inv(PSD), rtol=1e-10, atol=0)


def test_pinv_divergence_is_reported_not_a_linalg_error():
    """``init='identity'`` with ||I - M|| = 9 overflows: inf residuals and a ConvergenceWarning,
    not ``torch._C._LinAlgError`` from an SVD of NaN."""
    with pytest.warns(approxlab.errors.ConvergenceWarning, match=r"did not converge in num_iter=30 .*= inf"):
        result = linalg.iterative_pinv(10 * torch.eye(3, dtype=F64), num_iter=30, init="identity")
    assert math.isinf(float(result.penrose_residuals[-1]))
    assert math.isinf(float(result.inverse_residuals[-1]))  # inf/inf reported as inf, not NaN


def test_nystromformer_on_constant_attention_is_exact_without_a_false_warning():
    """Zero q, k: every softmax block is uniform (rank 1); the residual stays at rounding level
    (5e-16 > 0 used to be called divergence under warnings-as-errors)."""
    zero = torch.zeros_like(Q)
    result = approxlab.approximate("nystromformer", zero, zero, V, num_features=3)
    torch.testing.assert_close(result.output, V.mean(-2, keepdim=True).expand_as(V), rtol=1e-12, atol=1e-12)


def test_stable_and_effective_rank_of_huge_matrices():
    """sigma**2 overflows for sigma ~ 1e200 (stable rank was inf/inf = NaN); both ranks are
    scale-invariant."""
    for scale in (1e200, 1e-200):
        assert metrics.stable_rank(MAT * scale) == pytest.approx(metrics.stable_rank(MAT), rel=1e-12)
        assert metrics.effective_rank(MAT * scale) == pytest.approx(metrics.effective_rank(MAT), rel=1e-12)


def test_large_but_representable_logits_stay_finite():
    """The overflow guard of check_qkv is not stricter than it must be: logits of 1e300 in
    float64 give a finite (one-hot) softmax."""
    q = torch.tensor([[1e150, 0.0], [0.0, 1e150]], dtype=F64)
    out = approxlab.exact_attention(q, q, torch.eye(2, dtype=F64))
    torch.testing.assert_close(out, torch.eye(2, dtype=F64))


def test_zero_matrix_answers():
    """0 is a valid matrix: condition number inf, numerical rank 0, coherence 1 (documented),
    Nyström approximation and stable pseudo-inverse exactly 0."""
    zero = torch.zeros(4, 4, dtype=F64)
    assert linalg.condition_number(zero) == math.inf
    assert metrics.numerical_rank(zero) == 0
    assert float(coherence(zero, 0.1)) == 1.0
    assert float(statistical_dimension(zero, 0.1)) == 0.0
    assert torch.equal(sketch.nystrom(zero, torch.tensor([0, 2])), zero)
    assert torch.equal(linalg.stable_pinv(zero), zero)
    assert torch.equal(linalg.stable_pinv(zero, hermitian=False), zero)
    assert metrics.spectral_norm(operators.DenseOperator(zero), generator=_gen(0)) == 0.0
