"""The public method registry: register/unregister, result validation, plugins by module and by entry point."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

import approxlab
from approxlab.cli import main
from approxlab.errors import PluginWarning
from approxlab.methods import Approximation, available, get, load_plugin, plugin_modules, register, unregister
from approxlab.methods.registry import BUILTINS
from approxlab.synthetic import synthetic_qkv
from _helpers import gen, tiny_grouped_llama


def _qkv(n=24, m=None, batch=(2,)):
    q, k, v = synthetic_qkv(batch, n, 8, generator=gen(0))
    if m is not None:
        k, v = synthetic_qkv(batch, m, 8, generator=gen(1))[1:]
    return q, k, v


def _mean_of_values(q, k, v, *, num_features, generator=None):
    return v.mean(-2, keepdim=True).expand(*q.shape[:-1], v.shape[-1])


def test_register_decorator_runs_through_approximate_and_unregisters(fresh_registry):
    @register("mean-v", target="softmax", features="ignored", randomized=False)
    def mean_v(q, k, v, *, num_features, generator=None):
        return _mean_of_values(q, k, v, num_features=num_features)

    assert mean_v.__name__ == "mean_v"  # the decorator returns the function itself
    assert available()[: len(BUILTINS)] == list(BUILTINS) and available()[-1] == "mean-v"
    q, k, v = _qkv()
    result = approxlab.approximate("mean-v", q, k, v, num_features=3)
    assert (result.method, result.target) == ("mean-v", "softmax")
    torch.testing.assert_close(result.output, v.mean(-2, keepdim=True).expand_as(result.output))
    with pytest.raises(NotImplementedError, match="method 'mean-v' gave only its output: it has no operator"):
        result.operator()
    with pytest.raises(NotImplementedError, match="no operator and no matrix"):
        result.matrix()
    assert get("mean-v").max_features(24) == 24  # default: the number of keys
    spec = unregister("mean-v")
    assert spec.name == "mean-v" and "mean-v" not in available()
    with pytest.raises(ValueError, match=r"`method` must be one of \[.*\]; got 'mean-v'"):
        approxlab.approximate("mean-v", q, k, v, num_features=3)


def test_duplicates_overwrite_and_builtins(fresh_registry):
    register("twice", _mean_of_values, target="softmax", features="ignored", randomized=False)
    with pytest.raises(ValueError, match=r"`name` 'twice' is already registered \(by .*_mean_of_values\); pass "
                                         "overwrite=True"):
        register("twice", _mean_of_values, target="softmax", features="ignored")
    register("twice", _mean_of_values, target="kernelized", features="ignored", randomized=False, overwrite=True)
    assert get("twice").target == "kernelized" and available().count("twice") == 1
    # A registration can shadow a built-in; unregistering it brings the built-in back.
    builtin = get("performer")
    register("performer", _mean_of_values, target="softmax", features="ignored", overwrite=True)
    assert get("performer").function is _mean_of_values and available().count("performer") == 1
    unregister("performer")
    assert get("performer") is builtin
    with pytest.raises(ValueError, match="'performer' is a built-in method: it can be shadowed"):
        unregister("performer")
    with pytest.raises(ValueError, match=r"must be a registered \(not built-in\) method, one of \['twice'\]; got 'nope'"):
        unregister("nope")


@pytest.mark.parametrize("arguments, error, match", [
    (dict(name="has space"), ValueError, "`name` must be a non-empty word"),
    (dict(name="a,b"), ValueError, "no spaces or commas"),
    (dict(function=3), TypeError, "`function` must be callable; got int"),
    (dict(function=lambda q, k: q), TypeError, r"must accept function\(q, k, v, \*, num_features, generator=None"),
    (dict(target="causal"), ValueError, r"`target` must be one of \['softmax', 'kernelized', 'yoso'\]; got 'causal'"),
    (dict(features=""), ValueError, "`features` must say what num_features counts"),
    (dict(max_features=0), ValueError, "`max_features` must be an integer with 1 <= max_features"),
    (dict(max_features="n"), TypeError, "`max_features` must be None, an integer >= 1, or a function"),
    (dict(max_features=lambda a, b, c: 1), TypeError, "got a function of 3 required arguments"),
    (dict(randomized=1), TypeError, "`randomized` must be a bool"),
    (dict(draw=lambda q, k, **o: {}, randomized=False), ValueError, "`draw` is only for randomized methods"),
    (dict(draw=lambda q, k, **o: {}, randomized=True), TypeError, r"must accept function\(q, k, v, \*, num_features, generator=None, "
                                                  r"draw=None"),
    (dict(overwrite="yes"), TypeError, "`overwrite` must be a bool"),
])
def test_register_validates_its_arguments(fresh_registry, arguments, error, match):
    call = dict(name="bad", function=_mean_of_values, target="softmax", features="ignored", randomized=False)
    call.update(arguments)
    name, function = call.pop("name"), call.pop("function")
    with pytest.raises(error, match=match):
        register(name, function, **call)
    assert "bad" not in available()


def test_max_features_of_queries_and_keys(fresh_registry):
    register("capped", _mean_of_values, target="softmax", features="ignored", randomized=False, max_features=5)
    register("queries", _mean_of_values, target="softmax", features="ignored", randomized=False,
             max_features=lambda n, m: n)
    q, k, v = _qkv(n=12, m=4)
    assert get("capped").max_features(12, 4) == 5 and get("queries").max_features(12, 4) == 12
    approxlab.approximate("queries", q, k, v, num_features=10)
    with pytest.raises(ValueError, match="1 <= num_features <= 5; got 6"):
        approxlab.approximate("capped", q, k, v, num_features=6)


@pytest.mark.parametrize("returned, error, match", [
    (lambda q, v: v, ValueError, r"method 'user' must return an output of shape \(\*batch, n, p_v\) = "
                                 r"\(2, 12, 8\); got \(2, 4, 8\)"),
    (lambda q, v: q[..., :1], ValueError, r"= \(2, 12, 8\); got \(2, 12, 1\)"),
    (lambda q, v: q.float(), ValueError, r"in the dtype and on the device of q \(torch.float64, cpu\); got "
                                         r"torch.float32, cpu"),
    (lambda q, v: q * float("nan"), FloatingPointError, "method 'user' produced 192 non-finite output entries"),
    (lambda q, v: [q], TypeError, "must return an approxlab.methods.Approximation or its output tensor .*; got list"),
    (lambda q, v: Approximation("other", "softmax", q), ValueError,
     "must return an Approximation of method 'user' with target 'softmax' .*got method 'other'"),
])
def test_the_result_of_a_user_method_is_validated(fresh_registry, returned, error, match):
    @register("user", target="softmax", features="ignored", randomized=False)
    def user(q, k, v, *, num_features, generator=None):
        return returned(q, v)

    q, k, v = _qkv(n=12, m=4)
    with pytest.raises(error, match=match):
        approxlab.approximate("user", q, k, v, num_features=2)


def test_approximation_constructor():
    output, matrix = torch.ones(1, 3, 2, dtype=torch.float64), torch.full((1, 3, 4), 0.25, dtype=torch.float64)
    result = Approximation("m", "softmax", output, matrix=matrix, info={"x": 1})
    torch.testing.assert_close(result.matrix(), matrix)
    assert result.operator().shape == (1, 3, 4) and "info=['x']" in repr(result)
    lazy = Approximation("m", "softmax", output, lambda: result.operator())
    assert lazy.operator() is result.operator()
    with pytest.raises(ValueError, match="pass at most one of `operator` and `matrix`"):
        Approximation("m", "softmax", output, result.operator(), matrix=matrix)
    with pytest.raises(ValueError, match="`target` must be one of"):
        Approximation("m", "exact", output)
    with pytest.raises(TypeError, match="`output` must be a torch.Tensor"):
        Approximation("m", "softmax", [1.0])
    with pytest.raises(TypeError, match="the operator function of method 'm' must return a LinearOperator"):
        Approximation("m", "softmax", output, lambda: matrix).operator()


def test_top_k_written_outside_the_package_runs_as_a_plugin(top_k_plugin):
    """Issue 'Done means': a method in a module outside the package registers through
    ``approxlab.methods.register`` and runs through ``approximate``, with its matrix."""
    assert "top-k" not in available() and top_k_plugin not in sys.modules
    load_plugin(top_k_plugin)
    assert "top-k" in available() and plugin_modules() == (top_k_plugin,)
    q, k, v = synthetic_qkv((2, 3), 40, 8, scale=1.5, generator=gen(2))
    result = approxlab.approximate("top-k", q, k, v, num_features=40)  # every key kept: exact attention
    torch.testing.assert_close(result.output, approxlab.exact_attention(q, k, v))
    few = approxlab.approximate("top-k", q, k, v, num_features=4)
    assert int((few.matrix() > 0).sum(-1).max()) == 4
    torch.testing.assert_close(few.operator().matmat(v), few.output)


def test_cli_plugin_errors_are_one_line(tmp_path, monkeypatch, fresh_registry, capsys):
    assert main(["figure1", "--plot-only", "--out", str(tmp_path), "--plugin", "no_such_module_xyz"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "approxlab figure1: error: --plugin: a module importable from Python's path" in err
    assert "'no_such_module_xyz'" in err
    (tmp_path / "broken_plugin_xyz.py").write_text("import approxlab\nraise RuntimeError('oops')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["figure1", "--plot-only", "--out", str(tmp_path), "--plugin", "broken_plugin_xyz"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RuntimeError: oops at " in err and "broken_plugin_xyz.py:2" in err
    sys.modules.pop("broken_plugin_xyz", None)
    with pytest.raises(SystemExit) as exit_info:  # argparse's one-line error of the --methods option
        main(["figure1", "--methods", "no-such-method", "--out", str(tmp_path / "x")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--methods: registered method names among [" in err and "no-such-method" in err


def _install_distribution(site, name: str, entry_points: str, modules: dict) -> None:
    """A minimal installed distribution in ``site`` (a folder on sys.path): its modules and a
    ``<name>-0.1.dist-info`` with METADATA and entry_points.txt, as pip would leave them."""
    info = site / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    for module, source in modules.items():
        (site / f"{module}.py").write_text(source)


def test_installed_entry_points_appear_without_an_import(tmp_path, monkeypatch, fresh_registry):
    """Issue 'Done means': an installed distribution declaring an ``approxlab.methods`` entry point
    appears in ``available()`` without any import by the user; a broken one warns, naming itself."""
    from conftest import TOP_K_SOURCE

    site = tmp_path / "site-packages"
    mean_source = textwrap.dedent("""\
        from approxlab.methods import register

        @register("mean-v", target="softmax", features="ignored", randomized=False)
        def mean_v(q, k, v, *, num_features, generator=None):
            return v.mean(-2, keepdim=True).expand(*q.shape[:-1], v.shape[-1])
        """)
    _install_distribution(site, "approxlab-topk-plugin", """\
        [approxlab.methods]
        top-k = approxlab_topk_ep
        mean-v = approxlab_meanv_ep:mean_v
        broken = approxlab_missing_ep_module
        """, {"approxlab_topk_ep": TOP_K_SOURCE, "approxlab_meanv_ep": mean_source})
    monkeypatch.syspath_prepend(str(site))
    try:
        assert "approxlab_topk_ep" not in sys.modules
        with pytest.warns(PluginWarning, match=r"the entry point 'broken' = 'approxlab_missing_ep_module' of "
                                               r"distribution 'approxlab-topk-plugin' in group 'approxlab.methods' "
                                               r"failed to load \(ModuleNotFoundError"):
            names = available()
        assert {"top-k", "mean-v"} <= set(names) and "broken" not in names
        q, k, v = _qkv()
        assert approxlab.approximate("top-k", q, k, v, num_features=5).output.shape == (2, 24, 8)
        assert approxlab.approximate("mean-v", q, k, v, num_features=5).output.shape == (2, 24, 8)
        approxlab.approximate("performer", q, k, v, num_features=5, generator=gen(0))  # unrelated use unaffected
        available()  # loaded once: no second warning (warnings are errors here)
    finally:
        for module in ("approxlab_topk_ep", "approxlab_meanv_ep"):
            sys.modules.pop(module, None)


def _small_keys(q, k, v, *, generator=None, key_mask=None):
    """Knorm's score, written as a user would: the keys of smallest norm kept."""
    scores = -k.norm(dim=-1)
    return scores if key_mask is None else scores.masked_fill(~key_mask, float("-inf"))


def test_a_score_alone_registers_a_whole_cache_policy(fresh_registry):
    """register(name, score=f) without a function: the causal form, the KV-cache setting and a patched model run
    it, with the built-in knorm's results (the same score)."""
    returned = register("small-keys", score=_small_keys, target="softmax", features="kept context tokens",
                        randomized=False)
    assert "small-keys" in available() and get("small-keys").causal == "only" and returned is get("small-keys").function
    q, k, v = synthetic_qkv((2,), 48, 8, generator=gen(3))
    ours = approxlab.approximate("small-keys", q, k, v, num_features=6, causal=True)
    knorm = approxlab.approximate("knorm", q, k, v, num_features=6, causal=True)
    assert torch.equal(ours.output, knorm.output) and torch.equal(ours.info["kept"], knorm.info["kept"])
    g = torch.Generator().manual_seed(4)
    q4 = torch.randn(1, 4, 48, 8, generator=g, dtype=torch.float64)
    k2, v2 = (torch.randn(1, 2, 48, 8, generator=g, dtype=torch.float64) for _ in range(2))
    cached = approxlab.kv_cache_attention("small-keys", q4, k2, v2, context_length=32, num_features=5)
    expected = approxlab.kv_cache_attention("knorm", q4, k2, v2, context_length=32, num_features=5)
    assert cached.info["kept"].shape == (1, 2, 5) and torch.equal(cached.output, expected.output)
    model, ids = tiny_grouped_llama()
    outputs = {}
    for name in ("small-keys", "knorm"):
        for setting in ({"context_length": 24}, {}):  # the KV-cache setting, then the causal form in every layer
            with torch.no_grad(), approxlab.patch_attention(model, name, num_features=6, **setting) as patch:
                outputs[name, bool(setting)] = model(input_ids=ids).last_hidden_state
            assert len(patch.calls) == 2  # both layers ran the policy
    for setting in (True, False):
        assert torch.equal(outputs["small-keys", setting], outputs["knorm", setting])


@pytest.mark.parametrize("extra, match", [({"causal": True}, r"allowed `causal` are False or 'only'; got causal=True"),
                                          ({"draw": lambda *a, **o: {}}, r"pass `function` as well to give `draw`"),
                                          ({"max_features": 4}, r"to give `max_features`; got max_features")])
def test_a_score_alone_refuses_what_it_cannot_have(fresh_registry, extra, match):
    with pytest.raises(ValueError, match=match):
        register("small-keys", score=_small_keys, target="softmax", features="x", randomized=False, **extra)
    assert "small-keys" not in available()
