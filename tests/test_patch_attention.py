"""approxlab.patch_attention: a transformers model with an approximation in chosen layers, then as before.

Tiny random models of every family approxlab reads are built once for the module (2 layers, width 32,
a 128-token vocabulary, no tokenizer). For each: exact attention in every layer reproduces the unpatched
output to 1e-5 relative (measured: about 1e-7), a method with few features in one layer changes it, and
after the block -- left normally, on an exception or on KeyboardInterrupt -- the output equals the
original bit for bit. The KV-cache setting is checked against a dense stand-in for
``approxlab.kv_cache_attention`` defined here (a recent-window cache of the budget's size).
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import (
    AutoModel,
    BertConfig,
    DistilBertConfig,
    Gemma3TextConfig,
    GPT2Config,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
    RobertaConfig,
)

import approxlab
from approxlab.data.capture import extract_qkv
from approxlab.data.models import LoadedModel
from approxlab.data.checkpoints import ARCHITECTURES
from approxlab.kernels import causal_mask
from approxlab.methods import Approximation, register, unregister
from approxlab.patching import patch as patch_module
from approxlab.patching import token_nll

VOCAB = 128
_COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
CONFIGS = {
    "bert": lambda: BertConfig(**_COMMON, max_position_embeddings=64),
    "roberta": lambda: RobertaConfig(**_COMMON, max_position_embeddings=66),
    "distilbert": lambda: DistilBertConfig(vocab_size=VOCAB, dim=32, hidden_dim=64, n_layers=2, n_heads=4,
                                           max_position_embeddings=64),
    "gpt2": lambda: GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0,
                               eos_token_id=0),
    "gpt2-layer-scaled": lambda: GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                            bos_token_id=0, eos_token_id=0, scale_attn_by_inverse_layer_idx=True),
    "llama": lambda: LlamaConfig(**_COMMON, num_key_value_heads=2, max_position_embeddings=128),
    "qwen2": lambda: Qwen2Config(**_COMMON, num_key_value_heads=2, max_position_embeddings=128),
    "qwen3": lambda: Qwen3Config(**_COMMON, num_key_value_heads=2, head_dim=16, max_position_embeddings=128),
    "gemma3": lambda: Gemma3TextConfig(**_COMMON, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=24,
                                       sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                                       max_position_embeddings=128),
}
FULL_LAYERS = {"gemma3": [1]}  # Gemma 3's layer 0 attends a sliding window
N = 40


def seeded(build):
    """``build()`` with the global CPU generator seeded 0, the caller's RNG state left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build()


@pytest.fixture(scope="module")
def models():
    return {name: seeded(lambda: AutoModel.from_config(config()).eval()) for name, config in CONFIGS.items()}


@pytest.fixture(scope="module")
def ids():
    return torch.randint(5, VOCAB, (2, N), generator=torch.Generator().manual_seed(0))


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def as_loaded(model) -> LoadedModel:
    """``model`` as approxlab's LoadedModel (what load_model returns), without its tokenizer."""
    config = model.config
    return LoadedModel(checkpoint="tiny", condition="initialized", model_type=config.model_type,
                       num_layers=config.num_hidden_layers, num_heads=config.num_attention_heads,
                       num_kv_heads=getattr(config, "num_key_value_heads", config.num_attention_heads),
                       head_dim=0, max_positions=config.max_position_embeddings, causal=config.model_type != "bert",
                       rotary=True, weights="random", model=model, architecture=ARCHITECTURES[config.model_type])


def hidden(model, ids, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, **kwargs).last_hidden_state


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("name", list(CONFIGS))
def test_exact_reproduces_the_model_and_the_model_is_restored(name, models, ids):
    """Done means: exact in every (full-attention) layer = unpatched to 1e-5; 2 features in one layer change
    it; after the block (normal exit, an exception, KeyboardInterrupt) the output is the original bit for bit."""
    model = models[name]
    implementation = model.config._attn_implementation
    before = hidden(model, ids)
    layers = FULL_LAYERS.get(name)
    with approxlab.patch_attention(model, "exact", layers=layers, num_features=1) as patch:
        exact = hidden(model, ids)
    assert relative(exact, before) <= 1e-5, relative(exact, before)
    assert len(patch.calls) == len(patch.layers) == (1 if layers else 2)
    with approxlab.patch_attention(model, "performer", layers=FULL_LAYERS.get(name, [0]), num_features=2,
                                   generator=gen()):
        changed = hidden(model, ids)
    assert relative(changed, before) > 1e-4  # measured: 2.6e-4 (RoBERTa) to 0.4 (Gemma 3)
    for interruption in (ValueError("the body failed"), KeyboardInterrupt()):
        with pytest.raises(type(interruption)):
            with approxlab.patch_attention(model, "performer", layers=FULL_LAYERS.get(name, [0]), num_features=2,
                                           generator=gen()):
                hidden(model, ids)
                raise interruption
        assert torch.equal(hidden(model, ids), before)
    assert model.config._attn_implementation == implementation and not patch_module._LAYERS


def test_a_task_model_and_a_loaded_model(models, ids):
    causal_lm = seeded(lambda: LlamaForCausalLM(CONFIGS["llama"]()).eval())
    with torch.no_grad():
        before = causal_lm(ids).logits
        with approxlab.patch_attention(causal_lm, "exact", num_features=1):
            exact = causal_lm(ids).logits
    assert relative(exact, before) <= 1e-5
    with approxlab.patch_attention(as_loaded(models["llama"]), "performer", layers=1, num_features=4,
                                   generator=gen()) as patch:
        hidden(models["llama"], ids)
    assert patch.layers == (1,) and len(patch.info[1]) == 1
    with pytest.raises(ValueError, match=r"layer 1's inputs were not recorded: pass record_inputs=True"):
        patch.errors()


def test_recorded_inputs_are_the_layers_qkv_and_errors_follow(models, ids):
    """The recorded q, k, v are extract_qkv's (RoPE, heads repeated, Gemma's scaling in q); exact has no
    error on them, two features have some, and every measure is in its place."""
    for name, layer in (("gemma3", 1), ("llama", 1), ("bert", 0)):
        model = models[name]
        with approxlab.patch_attention(model, "exact", layers=[layer], num_features=1, record_inputs=True) as patch:
            hidden(model, ids)
        call = patch.calls[0]
        for got, want in zip(call.inputs, extract_qkv(as_loaded(model), ids, layer=layer)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert call.rows == (0, N) and call.output.shape == (2, 4, N, call.inputs[2].shape[-1])
        assert max(row["spectral"] for row in patch.errors()) < 1e-5
    with approxlab.patch_attention(models["llama"], "performer", layers=[0, 1], num_features=2, generator=gen(),
                                   record_inputs=True) as patch:
        hidden(models["llama"], ids)
        hidden(models["llama"], ids)
    rows = patch.errors()
    assert len(rows) == 2 * 2 * 2 * 4 and {row["layer"] for row in rows} == {0, 1}
    assert {(c.layer, c.call) for c in patch.calls} == {(0, 0), (1, 0), (0, 1), (1, 1)}
    assert all(0 < row["spectral"] <= row["worst_query"] * math.sqrt(N) and row["frobenius"] > 0 for row in rows)
    assert sorted(patch.info) == [0, 1] and len(patch.info[0]) == 2


def test_each_layer_has_its_own_reproducible_stream(models, ids):
    model = models["llama"]

    def run(seed, layers):
        with approxlab.patch_attention(model, "performer", layers=layers, num_features=2, generator=gen(seed)) as p:
            return hidden(model, ids), p.seeds

    first, seeds = run(0, [0, 1])
    again, _ = run(0, [0, 1])
    other, _ = run(1, [0, 1])
    assert torch.equal(first, again) and not torch.allclose(first, other)
    _, alone = run(0, [1])
    assert alone[1] == seeds[1] and seeds[0] != seeds[1]  # layer 1's stream does not depend on layer 0's patch


@pytest.fixture
def registered():
    """A user's causal method (exact causal attention with the first key's weight doubled) and an encoder one."""

    @register("sink-doubled", target="softmax", features="ignored", randomized=False, causal=True)
    def sink_doubled(q, k, v, *, num_features, generator=None, causal=False):
        logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        logits[..., 0] += math.log(2.0)
        if causal:
            logits = logits.masked_fill(~causal_mask(q.shape[-2], device=q.device), -math.inf)
        weights = torch.softmax(logits, dim=-1)
        return Approximation("sink-doubled", "softmax", weights @ v, info={"sink_mass": weights[..., 0].mean()})

    @register("interrupting", target="softmax", features="ignored", randomized=False, causal=True)
    def interrupting(q, k, v, *, num_features, generator=None, causal=False):
        raise KeyboardInterrupt

    yield
    unregister("sink-doubled")
    unregister("interrupting")


def test_registered_methods_run_like_builtins(registered, models, ids):
    model = models["qwen3"]
    before = hidden(model, ids)
    with approxlab.patch_attention(model, "sink-doubled", layers=[1], num_features=1) as patch:
        changed = hidden(model, ids)
    assert relative(changed, before) > 1e-4 and patch.info[1][0]["sink_mass"].shape == ()
    with pytest.raises(KeyboardInterrupt):  # interrupted inside the forward pass, in the method
        with approxlab.patch_attention(model, "interrupting", layers=[0], num_features=1):
            hidden(model, ids)
    assert torch.equal(hidden(model, ids), before) and not patch_module._LAYERS


def test_padding_reaches_the_method_as_a_key_mask(models, ids):
    """An encoder's padding is the method's key_mask; a decoder's right padding needs none (real rows never
    see it); left padding in a decoder is refused."""
    right = torch.ones_like(ids)
    right[0, 30:] = 0
    for name in ("bert", "llama"):
        model = models[name]
        before = hidden(model, ids, attention_mask=right)
        with approxlab.patch_attention(model, "exact", num_features=1, record_inputs=True) as patch:
            exact = hidden(model, ids, attention_mask=right)
        assert relative(exact[0, :30], before[0, :30]) <= 1e-5 and relative(exact[1], before[1]) <= 1e-5
        key_mask = patch.calls[0].key_mask
        assert (key_mask is None) if name == "llama" else key_mask[:, 0].sum(-1).tolist() == [30, N]
    with pytest.raises(ValueError, match=r"`attention_mask` of a causal model must pad after the tokens"):
        with approxlab.patch_attention(models["llama"], "exact", num_features=1):
            hidden(models["llama"], ids, attention_mask=right.flip(-1))


def test_token_nll_is_the_models_cross_entropy_and_moves_under_a_patch(ids):
    model = seeded(lambda: LlamaForCausalLM(CONFIGS["llama"]()).eval())
    nll = token_nll(model, ids)
    with torch.no_grad():
        logits = model(ids).logits.double()
    want = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1),
                                             reduction="none").reshape(2, N - 1)
    assert nll.dtype == torch.float64 and nll.shape == (2, N - 1)
    torch.testing.assert_close(nll, want, rtol=1e-6, atol=1e-6)
    with approxlab.patch_attention(model, "exact", num_features=1):
        assert float((token_nll(model, ids) - nll).abs().max()) < 1e-5
    with approxlab.patch_attention(model, "performer", layers=[0], num_features=2, generator=gen()):
        assert abs(float(token_nll(model, ids).mean() - nll.mean())) > 1e-4
    with pytest.raises(ValueError, match=r"`model` must be a causal language model \(a decoder\); got a bert"):
        token_nll(seeded(lambda: AutoModel.from_config(CONFIGS["bert"]())), ids)
    with pytest.raises(ValueError, match=r"`model` must have an output head"):
        token_nll(seeded(lambda: AutoModel.from_config(CONFIGS["llama"]())), ids)
    with pytest.raises(ValueError, match=r"`input_ids` must have 2 <= n <= 128 tokens .*; got n = 1"):
        token_nll(model, ids[:, :1])


# -- the KV-cache setting: approxlab.kv_cache_attention in every patched layer --------------------------------


@pytest.fixture
def kv_cache(monkeypatch):
    """A spy on the patched layers' calls of :func:`approxlab.kv_cache_attention` (it records each window)."""
    from approxlab.patching import _layer

    def spy(*args, **kwargs):
        spy.windows.append(args[1].shape[-2])
        return approxlab.kv_cache_attention(*args, **kwargs)

    spy.windows = []
    monkeypatch.setattr(_layer, "kv_cache_attention", spy)
    return spy


def test_kv_cache_setting_one_pass_prefill_and_token_by_token_agree(kv_cache, models, ids):
    model, context = models["llama"], 24
    before = hidden(model, ids)
    with approxlab.patch_attention(model, "streaming-llm", num_features=context, context_length=context):
        full_budget = hidden(model, ids)
    assert relative(full_budget, before) <= 1e-5  # the whole context kept: exact attention
    with torch.no_grad(), approxlab.patch_attention(model, "streaming-llm", layers=[1], num_features=6,
                                                    context_length=context) as patch:
        one_pass = hidden(model, ids)
        prefill = model(input_ids=ids[:, :context], use_cache=True)
        continuation = model(input_ids=ids[:, context:], cache=prefill.cache, use_cache=True).last_hidden_state
        cache = model(input_ids=ids[:, :context], use_cache=True).cache
        steps = [model(input_ids=ids[:, i:i + 1], cache=cache, use_cache=True).last_hidden_state
                 for i in range(context, N)]
    assert relative(one_pass[:, :context], before[:, :context]) <= 1e-5  # the context is processed exactly
    assert relative(one_pass[:, context:], before[:, context:]) > 1e-3  # a 6-token cache changes the rest
    assert relative(continuation, one_pass[:, context:]) <= 1e-5
    assert relative(torch.cat(steps, dim=1), one_pass[:, context:]) <= 1e-5
    # 2 layers at full budget, then layer 1: one pass, the continuation, each step: always the whole window
    assert kv_cache.windows == [N] * 4 + list(range(context + 1, N + 1))
    assert [call.rows for call in patch.calls][:2] == [(context, N), (context, N)]
    assert patch.info[1][0]["kept"].shape[-1] == 6


def _distinct_kept_per_kv_head(patch, kv_heads):
    """Per layer, the most distinct context tokens any KV head's cache holds (query heads pooled by KV head)."""
    counts = {}
    for call in patch.calls:
        kept = call.info["kept"]  # (S, H_kv, b) or (S, H, b)
        per_kv_head = kept.unflatten(-2, (kv_heads, kept.shape[-2] // kv_heads)).flatten(-2)
        counts[call.layer] = max(counts.get(call.layer, 0), max(len(set(row)) for row in
                                                               per_kv_head.flatten(0, -2).tolist()))
    return counts


def test_kv_cache_setting_on_grouped_heads_keeps_the_budget_per_kv_head(models, ids):
    model, context, budget = models["llama"], 24, 6  # 4 query heads on 2 KV heads
    with torch.no_grad(), approxlab.patch_attention(model, "h2o", num_features=budget, context_length=context) as patch:
        hidden(model, ids)
    assert patch.grouping == "kv-head" and patch.info[0][0]["kept"].shape == (2, 2, budget)
    assert _distinct_kept_per_kv_head(patch, 2) == {0: budget, 1: budget}
    with torch.no_grad(), approxlab.patch_attention(model, "h2o", num_features=budget, context_length=context,
                                                    grouping="query-head") as per_query_head:
        hidden(model, ids)
    assert per_query_head.info[0][0]["kept"].shape == (2, 4, budget)  # a set per query head
    with pytest.raises(ValueError, match=r"`grouping` chooses the kept sets of the KV-cache setting: pass it with "
                                         r"context_length; got grouping='kv-head' without a context_length"):
        approxlab.patch_attention(model, "h2o", num_features=budget, grouping="kv-head")
    with pytest.raises(ValueError, match=r"`grouping` must be one of \['kv-head', 'query-head'\]"):
        approxlab.patch_attention(model, "h2o", num_features=budget, context_length=context, grouping="kv")


def test_errors_before_anything_runs(models, registered):
    llama, gemma = models["llama"], models["gemma3"]
    unknown = seeded(lambda: AutoModel.from_config(MistralConfig(**_COMMON, num_key_value_heads=2)))
    cases = [
        (dict(model="llama"), TypeError, r"`model` must be a transformers model of a supported family .*; got str"),
        (dict(model=torch.nn.Linear(2, 2)), ValueError, r"`model` must be a transformers model .*; got a Linear\."),
        (dict(model=unknown), ValueError, r"`model` must be .*'gemma3_text'.*; got a MistralModel \(model_type "
                                          r"'mistral'\)"),
        (dict(model=gemma), ValueError, r"`layers` must name layers without a sliding window.* the layers \[1\] "
                                        r"attend every key; layers \[0\] attend only the last 16 keys; got "
                                        r"layers=None"),
        (dict(layers=[0, 2]), ValueError, r"`layers` must be .*0 <= layer <= 1 \(this model has 2 layers\); got "
                                          r"\[0, 2\], with 2 out of range"),
        (dict(layers=[-1]), ValueError, r"with -1 out of range"),
        (dict(layers=[1, 1]), ValueError, r"got \[1, 1\], with layer 1 more than once"),
        (dict(layers=[]), ValueError, r"`layers` must be .*; got an empty list"),
        (dict(layers="0"), TypeError, r"`layers` must be None \(every layer\), a layer index .*; got '0' \(str\)"),
        (dict(layers=[0.5]), TypeError, r"got \[0.5\], with 0.5 \(float\)"),
        (dict(layers=True), TypeError, r"`layers` must be .*; got True \(bool\)"),
        (dict(num_features=0), ValueError, r"`num_features` must be an integer with 1 <= num_features <= inf; "
                                           r"got 0"),
        (dict(num_features=2.5), TypeError, r"`num_features` must be an integer; got 2.5"),
        (dict(method="no-such-method"), ValueError, r"`method` must be one of \[.*'performer'.*\]; got "
                                                    r"'no-such-method'"),
        (dict(method="skyformer"), ValueError, r"`method` must have a causal form to patch a causal model "
                                               r"\(llama\): one of \[.*'performer'.*\] .*; got 'skyformer'"),
        (dict(model=models["bert"], method="h2o"), ValueError, r"`method` 'h2o' is causal only .* cannot patch the "
                                                               r"bidirectional attention of this bert model"),
        (dict(key_mask=None), TypeError, r"`key_mask` cannot be passed to patch_attention"),
        (dict(method="performer", kernel="relu"), TypeError, r"`kernel` is not an option of method 'performer'"),
        (dict(context_length=0), ValueError, r"`context_length` must be an integer with 1 <= context_length"),
        (dict(model=models["bert"], context_length=8), ValueError, r"`context_length` \(the KV-cache setting\) "
                                                                   r"needs a causal model; got a bert model"),
        (dict(generator=0), TypeError, r"`generator` must be a torch.Generator or None; got int"),
        (dict(record_inputs=1), TypeError, r"`record_inputs` must be a bool"),
    ]
    implementation = llama.config._attn_implementation
    for overrides, error, match in cases:
        arguments = {"model": llama, "method": "exact", "num_features": 1, **overrides}
        with pytest.raises(error, match=match):
            approxlab.patch_attention(arguments.pop("model"), arguments.pop("method"), **arguments)
    assert llama.config._attn_implementation == implementation and not patch_module._LAYERS


def test_errors_while_running_leave_the_model_as_it_was(models, ids):
    llama, gpt2 = models["llama"], models["gpt2"]
    before = hidden(llama, ids)
    with approxlab.patch_attention(llama, "performer", num_features=4, generator=gen()) as patch:
        with pytest.raises(RuntimeError, match=r"`model` is already patched by another patch_attention block"):
            with approxlab.patch_attention(llama, "exact", layers=[0], num_features=1):
                pass
        with approxlab.patch_attention(models["qwen2"], "exact", num_features=1):  # another model: allowed
            hidden(models["qwen2"], ids)
        cache = llama(input_ids=ids[:, :8], use_cache=True).cache
        with pytest.raises(RuntimeError, match=r"layer 0 received 1 queries and 9 keys .*context_length"):
            llama(input_ids=ids[:, 8:9], cache=cache, use_cache=True)
    with pytest.raises(RuntimeError, match=r"an AttentionPatch is entered once"):
        with patch:
            pass
    with pytest.raises(ValueError, match=r"`num_features` must be an integer with 1 <= num_features <= 10; got 64"):
        with approxlab.patch_attention(llama, "nystromformer", num_features=64):
            hidden(llama, ids[:, :10])
    gpt2.train()
    try:
        with pytest.raises(RuntimeError, match=r"layer 0 asked for attention dropout 0.1.*model.eval\(\)"):
            with approxlab.patch_attention(gpt2, "exact", num_features=1):
                gpt2(input_ids=ids)
    finally:
        gpt2.eval()
    assert torch.equal(hidden(llama, ids), before) and not patch_module._LAYERS


def test_half_precision_models_compute_in_float32(ids):
    model = seeded(lambda: AutoModel.from_config(CONFIGS["llama"]()).to(torch.bfloat16).eval())
    before = hidden(model, ids)
    with approxlab.patch_attention(model, "exact", num_features=1) as patch:
        exact = hidden(model, ids)
    assert patch.compute_dtype == torch.float32 and exact.dtype == torch.bfloat16
    assert relative(exact, before) <= 2e-2


@pytest.mark.parametrize("positional", [False, True], ids=["keyword", "positional"])
def test_padding_for_a_method_without_a_key_mask_is_refused_before_any_layer_runs(positional, models, ids):
    """A padded BERT batch with nystrom was refused inside the first patched layer, about a `key_mask` the user
    never passed: the forward pass is refused before any layer runs, saying the padding becomes a key mask and
    which methods take one; a method that takes one runs, and after the block the model runs unpatched."""
    model = models["bert"]
    mask = torch.ones_like(ids)
    mask[1, N // 2:] = 0
    before = hidden(model, ids, attention_mask=mask)
    with pytest.raises(ValueError, match=r"^`attention_mask` pads 1 of the 2 sequences of this forward pass: patched "
                                         r"attention passes an encoder's padding to the method as `key_mask`, and "
                                         r"method 'nystrom' takes none; patch with one that does \(exact, .*"
                                         r"nystromformer, .*\) or run sequences of one length without padding\.$"):
        with approxlab.patch_attention(model, "nystrom", num_features=4, generator=gen(), record_inputs=True) as patch:
            with torch.no_grad():
                model(ids, mask) if positional else model(input_ids=ids, attention_mask=mask)
    assert patch.calls == []  # no layer ran
    with approxlab.patch_attention(model, "nystrom", num_features=4, generator=gen()):
        hidden(model, ids)  # no padding: nothing to refuse
    with approxlab.patch_attention(model, "nystromformer", num_features=4, generator=gen()) as patch:
        hidden(model, ids, attention_mask=mask)
    assert len(patch.calls) == 2
    assert torch.equal(hidden(model, ids, attention_mask=mask), before) and not model._forward_pre_hooks


def test_the_global_attention_registration_is_undone_on_exit(models, ids):
    """patch_attention's function stayed registered in transformers' AttentionInterface after every block: it is
    removed when the last active block is left, normally or on an exception, and kept while another is active."""
    from transformers import AttentionInterface, AttentionMaskInterface

    def registered():
        return [patch_module.IMPLEMENTATION in interface._global_mapping
                for interface in (AttentionInterface, AttentionMaskInterface)]

    assert registered() == [False, False]
    with approxlab.patch_attention(models["bert"], "exact", num_features=1):
        assert registered() == [True, True]
        with approxlab.patch_attention(models["llama"], "exact", num_features=1):
            hidden(models["llama"], ids)
        assert registered() == [True, True]  # the bert block is still active
        hidden(models["bert"], ids)
    assert registered() == [False, False]
    with pytest.raises(KeyError, match="inside the block"):
        with approxlab.patch_attention(models["bert"], "exact", num_features=1):
            raise KeyError("inside the block")
    assert registered() == [False, False]
    with approxlab.patch_attention(models["bert"], "exact", num_features=1):  # registered again when needed
        assert relative(hidden(models["bert"], ids), hidden(models["bert"], ids)) == 0


# -- what the model supplies: the RoPE of a RoPE-aware cache policy ------------------------------------------------


def test_rope_aware_policies_get_the_models_rotary_frequencies(models, ids):
    from approxlab.cache._scores import pool_group, top_budget
    from approxlab.methods.expected_attention import expected_attention_scores

    model, context, budget = models["llama"], 24, 6  # 4 query heads on 2 KV heads
    inv_freq = model.rotary_emb.inv_freq
    with torch.no_grad(), approxlab.patch_attention(model, "expected-attention", layers=[1], num_features=budget,
                                                    context_length=context, record_inputs=True) as patch:
        hidden(model, ids)
    assert patch.supplied == ("rope_frequencies",) and torch.equal(patch.options["rope_frequencies"], inv_freq)
    (call,) = patch.calls
    q, k, v = (x[..., :context, :] for x in call.inputs)  # the KV heads repeated to the 4 query heads

    by_hand = expected_attention_scores(q, k, v, budget=budget, rope_frequencies=inv_freq)
    assert torch.equal(call.info["kept"].sort(-1).values, top_budget(pool_group(by_hand, 2), budget).sort(-1).values)
    unrotated = expected_attention_scores(q, k, v, budget=budget)
    assert not torch.allclose(by_hand, unrotated)  # the frequencies change the scores
    with approxlab.patch_attention(model, "expected-attention", num_features=budget, context_length=context,
                                   rope_base=10.0) as own:
        pass
    assert own.supplied == () and "rope_frequencies" not in own.options  # the caller's input is kept
    with torch.no_grad(), approxlab.patch_attention(models["gpt2"], "cap", num_features=budget,
                                                    context_length=context) as no_rope:
        hidden(models["gpt2"], ids)  # no RopeWarning (warnings fail the tests): the model states it has no RoPE
    assert no_rope.supplied == ("rope_frequencies",) and no_rope.options["rope_frequencies"] is None  # GPT-2
    with approxlab.patch_attention(model, "h2o", num_features=budget, context_length=context) as other:
        pass
    assert other.supplied == ()


def test_a_policy_input_the_model_cannot_supply_is_refused(models):
    def needs_pre_rope_keys(q, k, v, *, keys_pre_rope=None, generator=None, key_mask=None):
        return keys_pre_rope.norm(dim=-1)

    def causal_form(q, k, v, *, num_features, generator=None, causal=True, keys_pre_rope=None):
        raise AssertionError("never run")

    register("needs-pre-rope-keys", causal_form, target="softmax", features="kept context tokens", randomized=False,
             causal="only", score=needs_pre_rope_keys, inputs=("keys_pre_rope",))
    model = models["llama"]
    implementation = model.config._attn_implementation
    try:
        with pytest.raises(ValueError, match=r"^method 'needs-pre-rope-keys' needs `keys_pre_rope`, which the model "
                                             r"\(a rotary embedding\) cannot supply: .* got no keys_pre_rope\.$"):
            approxlab.patch_attention(model, "needs-pre-rope-keys", num_features=4, context_length=24)
    finally:
        unregister("needs-pre-rope-keys")
    assert model.config._attn_implementation == implementation and not patch_module._LAYERS


# -- a kvpress user's path: a causal LM with generate(), the continuation scored alone ----------------------------


def _tiny_llama_config():
    return LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                       max_position_embeddings=128)


def test_load_model_with_lm_head_generates_inside_a_kv_cache_patch():
    """``load_model(..., lm_head=True)`` is the causal LM around the bare model the default still gives (the same
    weights for a seed): ``generate()`` runs inside ``patch_attention``, which supplies the RoPE (no warning)."""
    from approxlab.data import load_model

    decoder = load_model("initialized", config=_tiny_llama_config(), seed=0, lm_head=True)
    bare = load_model("initialized", config=_tiny_llama_config(), seed=0)
    assert type(decoder.model).__name__ == "LlamaForCausalLM" and type(bare.model).__name__ == "LlamaModel"
    assert decoder.attention(1).num_kv_heads == 2  # the layout is read through the bare model
    ids = torch.randint(30522, (2, 24), generator=torch.Generator().manual_seed(0))
    assert torch.equal(token_nll(decoder, ids), token_nll(bare, ids))
    with approxlab.patch_attention(decoder, "expected-attention", num_features=4, context_length=16) as patch:
        generated = decoder.model.generate(ids[:, :20], max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert generated.shape == (2, 24) and torch.equal(generated[:, :20], ids[:, :20])
    assert patch.supplied == ("rope_frequencies",) and len(patch.calls) > 0
    with pytest.raises(ValueError, match=r"^`lm_head` True gives a causal language model, which needs a causal decoder "
                                         r".*; got lm_head=True for a bert model, which attends in both directions\.$"):
        load_model("initialized", config=BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                    intermediate_size=64), lm_head=True)
    with pytest.raises(TypeError, match=r"^`lm_head` must be a bool \(True or False\); got 1 \(int\)\.$"):
        load_model("initialized", config=_tiny_llama_config(), lm_head=1)


def test_token_nll_from_start_scores_the_continuation_alone():
    """``token_nll(..., start=n_c)`` is ``token_nll(...)[:, n_c:]``: the predictions made at the continuation's
    positions, the head applied to those only."""
    from approxlab.data import load_model

    loaded = load_model("initialized", config=_tiny_llama_config(), seed=1)
    ids = torch.randint(30522, (2, 24), generator=torch.Generator().manual_seed(2))
    whole, hits = token_nll(loaded, ids, hits=True)
    continuation, continuation_hits = token_nll(loaded, ids, hits=True, start=16)
    assert continuation.shape == continuation_hits.shape == (2, 7)
    torch.testing.assert_close(continuation, whole[:, 16:], rtol=0, atol=1e-4)  # float32 logits, another product
    assert torch.equal(token_nll(loaded, ids, start=0), whole)
    for start, error, match in [(23, ValueError, r"^`start` must be an integer with 0 <= start <= 22; got 23\.$"),
                                (-1, ValueError, r"^`start` must be an integer with 0 <= start <= 22; got -1\.$"),
                                (1.5, TypeError, r"^`start` must be an integer; got 1\.5 \(float\)\.$")]:
        with pytest.raises(error, match=match):
            token_nll(loaded, ids, start=start)


def test_a_compression_ratio_is_kvpress_count_in_every_layer(models, ids):
    model, context = models["llama"], 24
    with torch.no_grad(), approxlab.patch_attention(model, "knorm", compression_ratio=0.75,
                                                    context_length=context) as by_ratio:
        ratio_output = hidden(model, ids)
    with torch.no_grad(), approxlab.patch_attention(model, "knorm", num_features=6, context_length=context) as by_count:
        count_output = hidden(model, ids)
    assert (by_ratio.num_features, by_ratio.compression_ratio, by_count.compression_ratio) == (6, 0.75, None)
    assert torch.equal(ratio_output, count_output) and by_ratio.info[0][0]["kept"].shape[-1] == 6
    with pytest.raises(ValueError, match=r"`compression_ratio` is a fraction of the context, the KV-cache setting's: "
                                         r"pass it with context_length; got compression_ratio=0.5 without"):
        approxlab.patch_attention(model, "knorm", compression_ratio=0.5)
    with pytest.raises(ValueError, match=r"method 'performer' has none"):
        approxlab.patch_attention(model, "performer", compression_ratio=0.5, context_length=context)
    with pytest.raises(ValueError, match=r"exactly one of `num_features` .* got both"):
        approxlab.patch_attention(model, "knorm", num_features=4, compression_ratio=0.5, context_length=context)
    with pytest.raises(ValueError, match=r"exactly one of `num_features` .* got neither"):
        approxlab.patch_attention(model, "knorm", context_length=context)
