r"""WikiText-2 (raw, test split): find it, verify it, split it into its articles.

The Skyformer spectral-norm study (Skyformer Section 5 / Figure 1) embeds WikiText-2 into
BERT's query/key/value space. This module supplies the text; :mod:`approxlab.data.tokens` turns it
into token ids and windows, and :mod:`approxlab.data.qkv` windows into Q/K/V.

The corpus ships with approxlab: ``approxlab/data/wikitext-2-raw/wiki.test.raw.xz`` (xz,
368 KB; 1,290,547 bytes once decompressed), with its attribution and licence (CC BY-SA 3.0,
like the Wikipedia text it comes from) beside it in ``LICENSE.txt``
(:func:`wikitext_attribution`). :func:`find_wikitext` takes ``data_dir``, then
``$APPROXLAB_DATA``, then this packaged copy; a ``data_dir`` or ``$APPROXLAB_DATA`` that is
given but holds no corpus is an error, never skipped. The Hugging Face ``datasets`` download
happens only when asked for with ``data_dir=WIKITEXT_DOWNLOAD`` (``"hf:wikitext"``).
:func:`load_wikitext` checks the sha256 of the text after decompression.

A ``datasets`` download is copied into the cache directory (``$APPROXLAB_CACHE`` or
``~/.cache/approxlab``); a directory where that copy must go is a :class:`CachePathError`. Writes
are atomic (temporary file + ``os.replace``). :func:`wikitext_articles` splits the text into its 60
Wikipedia articles (the Text and Retrieval proxies of :mod:`approxlab.tasks`).

References
----------
.. [1] S. Merity, C. Xiong, J. Bradbury, R. Socher, "Pointer Sentinel Mixture Models",
   ICLR 2017 (WikiText-2).
.. [2] Y. Chen, Q. Zeng, H. Ji, Y. Yang, "Skyformer: Remodel Self-Attention with Gaussian
   Kernel and Nyström Method", NeurIPS 2021, Section 5.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import re
from importlib import resources
from pathlib import Path

from .._io import atomic_write_bytes
from ..errors import CachePathError, CacheWarning, CorpusChecksumError, CorpusNotFoundError
from .cache_files import _cache_target, default_cache_dir

__all__ = [
    "WIKITEXT_SHA256",
    "WIKITEXT_LF_SHA256",
    "WIKITEXT_RELPATH",
    "WIKITEXT_DOWNLOAD",
    "CachePathError",
    "CacheWarning",
    "CorpusChecksumError",
    "CorpusNotFoundError",
    "default_cache_dir",
    "packaged_wikitext",
    "wikitext_attribution",
    "find_wikitext",
    "load_wikitext",
    "corpus_sha256",
    "wikitext_articles",
]

#: sha256 of ``wiki.test.raw`` as distributed (CRLF line ends, blank lines removed); the packaged
#: copy decompresses to exactly these bytes.
WIKITEXT_SHA256 = "4f3e427e4aff23acff917a8a51aeae21bf12832256e26914c8fc250dcef4103c"
#: sha256 of the same bytes with CRLF normalised to LF (what a Hugging Face ``datasets`` download writes).
WIKITEXT_LF_SHA256 = "bbf94c53a05abe9ee670d3b6343608095822c85e26de37c70b24fc571964574a"
#: Location of the corpus below a data directory.
WIKITEXT_RELPATH = Path("wikitext-2-raw") / "wiki.test.raw"
#: The ``data_dir`` (``--data-dir``, ``$APPROXLAB_DATA``) value that asks for a download with
#: Hugging Face ``datasets`` instead of a local file.
WIKITEXT_DOWNLOAD = "hf:wikitext"

_PACKAGED_FOLDER = "wikitext-2-raw"
_PACKAGED_NAME = "wiki.test.raw.xz"
_ATTRIBUTION_NAME = "LICENSE.txt"
_ENV_DATA = "APPROXLAB_DATA"
_ALLOWED_LOCATIONS = (
    f"a folder containing {WIKITEXT_RELPATH.as_posix()}, the wikitext-2-raw folder, the corpus file "
    f"itself (.raw, or .xz-compressed), or {WIKITEXT_DOWNLOAD!r} for a Hugging Face `datasets` download"
)


# --------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------


def packaged_wikitext():
    """The xz-compressed corpus shipped inside approxlab (``approxlab/data/wikitext-2-raw/``).

    Returns
    -------
    importlib.resources.abc.Traversable
        A :class:`pathlib.Path` for an ordinary (wheel or editable) install.

    Examples
    --------
    >>> from approxlab.data import packaged_wikitext
    >>> corpus = packaged_wikitext()
    >>> corpus.name, corpus.is_file()
    ('wiki.test.raw.xz', True)
    """
    return resources.files(__package__).joinpath(_PACKAGED_FOLDER, _PACKAGED_NAME)


def wikitext_attribution() -> str:
    """Attribution and licence (CC BY-SA 3.0) of the packaged corpus, as shipped beside it.

    Examples
    --------
    >>> from approxlab.data import wikitext_attribution
    >>> "CC BY-SA 3.0" in wikitext_attribution()
    True
    """
    return resources.files(__package__).joinpath(_PACKAGED_FOLDER, _ATTRIBUTION_NAME).read_text("utf-8")


def _corpus_candidates(location: Path) -> list[Path]:
    """Where the corpus may lie below ``location`` (a data dir, the corpus folder, or the file)."""
    if location.is_file():
        return [location]
    return [location / WIKITEXT_RELPATH, location / WIKITEXT_RELPATH.name]


def _given_location(location, label: str, cache_dir) -> Path:
    """The corpus at a location the user gave, or :class:`CorpusNotFoundError` naming ``label``."""
    given = os.fspath(location)
    if given == WIKITEXT_DOWNLOAD:
        return _datasets_copy(label, cache_dir)
    path = Path(given).expanduser()
    for candidate in _corpus_candidates(path):
        if candidate.is_file():
            return candidate
    if not given:
        found = "an empty path"
    elif not path.exists():
        found = f"{given!r}, which does not exist"
    elif path.is_dir():
        found = f"{given!r}, a folder with neither {WIKITEXT_RELPATH.as_posix()} nor {WIKITEXT_RELPATH.name}"
    else:
        found = f"{given!r}, which is not a regular file"
    raise CorpusNotFoundError(f"{label} must be {_ALLOWED_LOCATIONS}; got {found}.")


def _import_datasets():
    """Return the ``datasets`` module, or None when it is not importable."""
    try:
        import datasets  # noqa: PLC0415 (optional dependency)
    except ImportError:
        return None
    return datasets


def _datasets_copy(label: str, cache_dir) -> Path:
    """The split from Hugging Face ``datasets``, downloaded once into ``<cache_dir>/wikitext``.

    Rows are joined with newlines (LF) and blank rows dropped, which gives the text of
    :data:`WIKITEXT_LF_SHA256`.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = _cache_target(root / "wikitext" / WIKITEXT_RELPATH)
    if target.is_file():
        return target
    asked = f"{label}={WIKITEXT_DOWNLOAD!r} asks for a download with Hugging Face `datasets`"
    datasets_module = _import_datasets()
    if datasets_module is None:
        raise CorpusNotFoundError(
            f"{asked}, which is not importable: `pip install datasets`, or leave {label} unset to "
            "use the copy shipped with approxlab."
        )
    try:
        split = datasets_module.load_dataset("wikitext", "wikitext-2-raw-v1", split="test")
    except Exception as exc:  # network and hub errors come in many types; re-raised, not swallowed
        raise CorpusNotFoundError(
            f"{asked}; the download failed ({type(exc).__name__}: {exc}). Leave {label} unset to use "
            "the copy shipped with approxlab."
        ) from exc
    rows = [str(row).rstrip("\r\n") for row in split["text"]]
    text = "\n".join(row for row in rows if row.strip()) + "\n"
    atomic_write_bytes(target, text.encode("utf-8"))
    return target


def find_wikitext(data_dir=None, *, cache_dir=None):
    """Locate the WikiText-2 raw test split (``wikitext-2-raw/wiki.test.raw``).

    Parameters
    ----------
    data_dir : str or os.PathLike, optional
        A folder containing ``wikitext-2-raw/wiki.test.raw``, the ``wikitext-2-raw`` folder,
        the file itself (``.xz``-compressed is fine), or :data:`WIKITEXT_DOWNLOAD`
        (``"hf:wikitext"``) to download the split with Hugging Face ``datasets``.
    cache_dir : str or os.PathLike, optional
        Cache root where a ``datasets`` download is kept (default :func:`default_cache_dir`).

    Returns
    -------
    pathlib.Path or importlib.resources.abc.Traversable
        The corpus file: the one found at ``data_dir`` or ``$APPROXLAB_DATA``, or the packaged
        copy (:func:`packaged_wikitext`). The content is not verified here; see :func:`load_wikitext`.

    Raises
    ------
    CorpusNotFoundError
        If ``data_dir`` is given, or ``$APPROXLAB_DATA`` is set, and holds no corpus; or a
        requested ``datasets`` download is impossible. The message names the parameter, the
        forms allowed and the value given. A location that is given is never skipped.
    TypeError
        If ``data_dir`` is neither None, a str nor an ``os.PathLike``.

    Notes
    -----
    Lookup order, first match wins:

    1. ``data_dir`` (the CLI's ``--data-dir``);
    2. ``$APPROXLAB_DATA`` (same forms as ``data_dir``; unset or empty means not given);
    3. the copy shipped inside approxlab (``approxlab/data/wikitext-2-raw/wiki.test.raw.xz``).

    With :data:`WIKITEXT_DOWNLOAD` in step 1 or 2: a previous download under
    ``<cache_dir>/wikitext/wikitext-2-raw/wiki.test.raw``, else
    ``load_dataset("wikitext", "wikitext-2-raw-v1", split="test")`` (``pip install datasets``
    and network access needed), rows joined with newlines and blank rows dropped, saved there.

    References
    ----------
    .. [1] Merity et al., "Pointer Sentinel Mixture Models", ICLR 2017.

    Examples
    --------
    >>> import os
    >>> from unittest import mock
    >>> from approxlab.data import find_wikitext, packaged_wikitext
    >>> with mock.patch.dict(os.environ):
    ...     _ = os.environ.pop("APPROXLAB_DATA", None)
    ...     found = find_wikitext()  # neither data_dir nor $APPROXLAB_DATA: the packaged copy
    >>> found == packaged_wikitext()
    True
    """
    if data_dir is not None:
        if not isinstance(data_dir, (str, os.PathLike)):
            raise TypeError(
                f"`data_dir` must be None, a str or an os.PathLike; got {type(data_dir).__name__}."
            )
        return _given_location(data_dir, "`data_dir` (CLI: --data-dir)", cache_dir)
    env = os.environ.get(_ENV_DATA)
    if env:
        return _given_location(env, f"${_ENV_DATA}", cache_dir)
    return packaged_wikitext()


def _corpus_bytes(path) -> bytes:
    """The bytes of the corpus file ``path``, decompressed when its name ends in ``.xz``."""
    raw = path.read_bytes()
    if not path.name.endswith(".xz"):
        return raw
    try:
        return lzma.decompress(raw, format=lzma.FORMAT_XZ)
    except (lzma.LZMAError, EOFError) as exc:
        raise CorpusChecksumError(
            f"{path} is not a valid xz file ({exc}): the compressed corpus is corrupt or truncated."
            f"{_repair_hint(path)}"
        ) from exc


def _repair_hint(path) -> str:
    if path == packaged_wikitext():
        return " It is the copy shipped with approxlab: reinstall approxlab."
    return (
        " It is another version of the corpus or is corrupt: replace it, or pass verify=False to "
        "use it anyway (results are then not comparable)."
    )


def load_wikitext(data_dir=None, *, verify=True, cache_dir=None) -> str:
    """Read the WikiText-2 raw test split as text, after verifying its sha256.

    Parameters
    ----------
    data_dir : str or os.PathLike, optional
        Where the corpus is; see :func:`find_wikitext` (default: ``$APPROXLAB_DATA``, else the
        copy shipped with approxlab).
    verify : bool, default True
        Check the sha256 of the (decompressed) bytes against :data:`WIKITEXT_SHA256` (bytes as
        distributed, and as packaged) or :data:`WIKITEXT_LF_SHA256` (the same with LF line
        ends). ``False`` skips the check (results are then not comparable with the reference
        numbers).
    cache_dir : str or os.PathLike, optional
        Cache root, used only by the ``datasets`` download.

    Returns
    -------
    str
        The corpus with line ends normalised to ``"\\n"``: 2,891 non-blank lines.

    Raises
    ------
    CorpusChecksumError
        If ``verify`` and the sha256 matches neither reference, or a ``.xz`` file is corrupt.
    CorpusNotFoundError
        See :func:`find_wikitext`.

    References
    ----------
    .. [1] Merity et al., "Pointer Sentinel Mixture Models", ICLR 2017.

    Examples
    --------
    >>> from approxlab.data import load_wikitext, packaged_wikitext
    >>> text = load_wikitext(packaged_wikitext())  # verified against WIKITEXT_SHA256
    >>> sum(1 for line in text.split(chr(10)) if line.strip())  # non-blank lines
    2891
    >>> text.split(chr(10))[0].strip()  # the first article's title
    '= Robert Boulter ='
    """
    if not isinstance(verify, bool):
        raise TypeError(f"`verify` must be a bool; got {verify!r} ({type(verify).__name__}).")
    path = find_wikitext(data_dir, cache_dir=cache_dir)
    raw = _corpus_bytes(path)
    normalised = raw.replace(b"\r\n", b"\n")
    if verify:
        digest = hashlib.sha256(raw).hexdigest()
        if digest != WIKITEXT_SHA256 and hashlib.sha256(normalised).hexdigest() != WIKITEXT_LF_SHA256:
            raise CorpusChecksumError(
                f"{path} is not the expected WikiText-2 raw test split: its sha256 is {digest}, "
                f"expected {WIKITEXT_SHA256} (or {WIKITEXT_LF_SHA256} with LF line ends)."
                f"{_repair_hint(path)}"
            )
    return normalised.decode("utf-8")


def corpus_sha256(text: str) -> str:
    """sha256 of the corpus text (UTF-8), the corpus part of cache keys.

    Examples
    --------
    >>> from approxlab.data import corpus_sha256
    >>> corpus_sha256("")
    'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855'
    """
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------
# Articles
# --------------------------------------------------------------------------------------

_TITLE = re.compile(r" = ([^=].*) = ")
_MIN_ARTICLE_BYTES = 2000


def wikitext_articles(data_dir=None, *, verify=True, cache_dir=None) -> list[tuple[str, str]]:
    """The corpus as its Wikipedia articles: ``(title, body)`` pairs in corpus order.

    Parameters
    ----------
    data_dir, verify, cache_dir
        As for :func:`load_wikitext` (default: the copy shipped with approxlab, verified).

    Returns
    -------
    list of (str, str)
        ``title`` without its ``" = ... = "`` markup; ``body`` the article's lines after its title
        line, joined by ``"\\n"`` (section headings such as ``" = = Career = = "`` kept). The
        packaged corpus has 60 articles of 2,340 to 74,817 UTF-8 bytes.

    Notes
    -----
    A line ``" = Title = "`` (one ``=`` on each side) starts an article. Two formula lines of the
    article "Constant k filter" have that form too (``" = 1 rad / s and a nominal impedance k = "``);
    a heading whose body would have fewer than 2,000 UTF-8 bytes (the shortest real article has
    2,340) is therefore taken as a line of the article before it.

    Examples
    --------
    >>> from approxlab.data.wikitext import wikitext_articles
    >>> articles = wikitext_articles()
    >>> len(articles), articles[0][0], articles[-1][0]
    (60, 'Robert Boulter', 'The Hustler ( film )')
    >>> articles[0][1].split(chr(10))[0][:36]  # the lead, not the title line
    ' Robert Boulter is an English film ,'
    """
    lines = load_wikitext(data_dir, verify=verify, cache_dir=cache_dir).split("\n")
    starts = [i for i, line in enumerate(lines) if _TITLE.fullmatch(line)] + [len(lines)]
    articles: list[list] = []
    for start, end in zip(starts[:-1], starts[1:]):
        body = lines[start + 1 : end]
        if articles and len("\n".join(body).encode("utf-8")) < _MIN_ARTICLE_BYTES:
            articles[-1][1].extend(lines[start:end])
        else:
            articles.append([_TITLE.fullmatch(lines[start]).group(1), body])
    return [(title, "\n".join(body)) for title, body in articles]
