"""Third-party progress bars off while a study runs, so that approxlab's own bar is the only one.

Loading a model draws bars of other libraries on stderr, between the lines of approxlab's
progress: transformers ("Loading weights", "Converting and de-quantizing GGUF tensors"),
huggingface_hub (downloads), datasets and any tqdm bar of a library inside a Dask worker.
:func:`third_party_bars_off` turns them off for a block and restores every setting after it:

* in this process, through the libraries' own switches (``huggingface_hub.utils``'s
  ``disable_progress_bars``, which transformers imported later in the block also starts from,
  and ``transformers.utils.logging``'s ``disable_progress_bar``); transformers' GGUF conversion,
  whose bar has no switch, is silenced where approxlab calls it (:mod:`approxlab.data.gguf`);
* in the processes started in the block (the workers of ``--workers``), through the variables
  those libraries read when they start: ``HF_HUB_DISABLE_PROGRESS_BARS``,
  ``HF_DATASETS_DISABLE_PROGRESS_BARS`` and ``TQDM_DISABLE`` (tqdm's default for ``disable``).

approxlab's own bar (:func:`approxlab.studies.runner.run_cells`) passes ``disable`` explicitly and
is not affected; ``--no-progress`` turns it off too. Used as a library, approxlab changes none of
these settings except around its own model loading (:func:`approxlab.data.load_model`).
"""

from __future__ import annotations

import contextlib
import os
import sys

from ._cli import restored_environ

__all__ = ["WORKER_VARIABLES", "third_party_bars_off"]

WORKER_VARIABLES = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",
}
"""The environment of a process started while the bars are off (read by each library at import)."""


@contextlib.contextmanager
def third_party_bars_off():
    """Bars of transformers, huggingface_hub, datasets and worker-side tqdm off for the block.

    Examples
    --------
    >>> from huggingface_hub.utils import are_progress_bars_disabled
    >>> with third_party_bars_off():
    ...     are_progress_bars_disabled()
    True
    """
    # Imported before the variables are set, which they read once: this process keeps its settings.
    import huggingface_hub.constants  # noqa: F401
    import tqdm  # noqa: F401

    with _hub_and_transformers_off(), _environment(WORKER_VARIABLES):
        yield


@contextlib.contextmanager
def _environment(values: dict):
    with restored_environ(values):
        os.environ.update(values)
        yield


def _transformers_logging():
    """transformers' logging module if transformers is imported (importing it costs seconds), else None."""
    return sys.modules.get("transformers.utils.logging")


@contextlib.contextmanager
def _hub_and_transformers_off():
    from huggingface_hub import utils as hub

    hub_was_on = not hub.are_progress_bars_disabled()
    before = _transformers_logging()
    transformers_was_on = hub_was_on if before is None else before.is_progress_bar_enabled()
    hub.disable_progress_bars()  # transformers imported in the block starts with its bars off too
    if before is not None:
        before.disable_progress_bar()
    try:
        yield
    finally:
        after = _transformers_logging()
        if after is not None and transformers_was_on:
            after.enable_progress_bar()  # turns huggingface_hub's bars on as well
        if hub_was_on:
            hub.enable_progress_bars()
        else:
            hub.disable_progress_bars()
