"""The report step of every study: derived tables, figures and the markdown summary, from saved files only.

:func:`write_report` loads a run (:func:`~approxlab.studies.reporting.saved.load`), writes the
study's derived tables (:class:`~approxlab.studies.Product`), draws its figures
(:class:`~approxlab.studies.Figure`) and writes its summary (:func:`build_summary`: the title, the
note that the file is generated, then the study's sections in order). ``approxlab <study>
--plot-only`` is exactly this step.

Public API::

    write_report(study, out) -> list[pathlib.Path]
    build_summary(study, saved) -> str
    render(title, lines, *, study=None) -> str
    run_lines(saved) -> list of str  # "## Run": the command and each recorded compute run
    timing_lines(saved) -> list of str  # the same without its heading and command
"""

from __future__ import annotations

import datetime
import pathlib

from ..._io import atomic_write_text, write_csv_atomic
from .saved import load

__all__ = ["write_report", "build_summary", "render", "run_lines", "timing_lines"]


def render(title: str, lines, *, study: str | None = None) -> str:
    """``# title``, a blank line, the note that ``approxlab <study> --plot-only`` generated the file
    (when ``study`` is given), then ``lines``; the text ends with a newline."""
    head = [f"# {title}", ""]
    if study is not None:
        head += [f"Generated from the tables in this folder by `approxlab {study} --plot-only`; do not edit by hand.",
                 ""]
    return "\n".join([*head, *lines]) + "\n"


def _untimed_before(created, timing) -> str | None:
    """``created`` when it is earlier than the start of the first run in ``timing`` (by more than a minute)."""
    if not created or not timing:
        return None
    first = timing[0]
    try:
        made = datetime.datetime.fromisoformat(created)
        finished = datetime.datetime.strptime(first["finished"], "%Y-%m-%d %H:%M:%S %Z").replace(
            tzinfo=datetime.timezone.utc)
    except (KeyError, TypeError, ValueError):
        return None
    started = finished - datetime.timedelta(seconds=float(first["wall_seconds"]))
    return created if (started - made).total_seconds() > 60 else None


def run_lines(saved) -> list[str]:
    """A summary's ``## Run`` section: the command of the run and every compute run made into its folder.

    ``saved``: the run (:class:`~approxlab.studies.reporting.saved.Saved`); each compute run recorded in
    ``timing.json`` is one line with its command, wall time, workers and threads. When the folder was created
    before the first recorded run started (``config.json``'s ``created``), the runs before it are said to be
    untimed: their cells are in the tables, their times are not.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> saved = SimpleNamespace(command="approxlab sv-decay --windows 4", timing=[
    ...     {"command": "approxlab sv-decay --windows 4", "wall_seconds": 90.0, "workers": None, "threads": 1,
    ...      "finished": "2026-01-01 00:00:00 UTC"}])
    >>> run_lines(saved)[2]
    '- Command: `approxlab sv-decay --windows 4`'
    >>> run_lines(saved)[3]
    '- Compute run: `approxlab sv-decay --windows 4`: 90 s wall (1.5 min), workers 1, 1 thread(s) per process, finished 2026-01-01 00:00:00 UTC.'
    """
    return ["## Run", "", f"- Command: `{saved.command}`", *timing_lines(saved), ""]


def timing_lines(saved) -> list[str]:
    """The lines of :func:`run_lines` after its command: the untimed runs before the first recorded one, then each
    compute run of ``timing.json`` (or that none finished), for a summary that says its command elsewhere."""
    lines = []
    untimed = _untimed_before(getattr(saved, "record", {}).get("created"), saved.timing)
    if untimed:
        lines.append(f"- Folder created {untimed}, before the first compute run below started: the cells of the "
                     f"runs made before it are in the tables, their times are not recorded.")
    lines += [f"- Compute run: `{run['command']}`: {run['wall_seconds']:,.0f} s wall ({run['wall_seconds'] / 60:.1f} "
              f"min), workers {run.get('workers') or 1}, {run.get('threads')} thread(s) per process, finished "
              f"{run['finished']}." for run in saved.timing]
    if not saved.timing:
        lines.append("- **Not finished**: no finished compute run is recorded in `timing.json`.")
    return lines


def build_summary(study, saved) -> str:
    """The markdown of ``study.summary`` for ``saved``: the title, the generated-file note, the sections in order."""
    summary = study.summary
    lines = [line for section in summary.sections for line in section(saved)]
    return render(summary.title, lines, study=study.name if summary.generated else None)


def write_report(study, out) -> list[pathlib.Path]:
    """Write the derived tables, figures and summary of ``study`` in ``out`` from its saved files."""
    saved = load(study, out)
    written = [write_csv_atomic(saved.product(product.name), saved.out / product.name) for product in study.products]
    for figure in study.figures:
        written += list(figure.draw(saved))
    if study.summary is not None:
        written.append(atomic_write_text(saved.out / study.summary.file, build_summary(study, saved)))
    return written
