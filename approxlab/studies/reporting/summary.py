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
"""

from __future__ import annotations

import pathlib

from ..._io import atomic_write_text, write_csv_atomic
from .saved import load

__all__ = ["write_report", "build_summary", "render"]


def render(title: str, lines, *, study: str | None = None) -> str:
    """``# title``, a blank line, the note that ``approxlab <study> --plot-only`` generated the file
    (when ``study`` is given), then ``lines``; the text ends with a newline."""
    head = [f"# {title}", ""]
    if study is not None:
        head += [f"Generated from the tables in this folder by `approxlab {study} --plot-only`; do not edit by hand.",
                 ""]
    return "\n".join([*head, *lines]) + "\n"


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
