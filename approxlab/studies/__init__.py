"""Studies: declared grids, a resumable runner, atomic I/O, one CLI.

Each study is a module exposing ``add_arguments(parser)`` and ``run(args) -> int``,
registered (lazily, by module path) in :data:`STUDIES`; ``approxlab <study>`` imports
only the module it runs, so a missing or broken study never breaks the others.

See :mod:`approxlab.studies.runner` (``run_cells``: resume, output-folder lock, progress),
:mod:`approxlab.studies._cli` (the options, one-line errors and pre-run checks every study
shares), :mod:`approxlab._io` (atomic writes, the lock) and :mod:`approxlab.plotting`
(figure style).
"""

STUDIES = {
    "figure1": "approxlab.studies.figure1",
    "sv-decay": "approxlab.studies.sv_decay",
    "instability": "approxlab.studies.instability",
    "bench": "approxlab.studies.bench",
    "lra-svd": "approxlab.studies.lra_svd",
    "decoder": "approxlab.studies.decoder",
}
"""CLI subcommand -> module implementing it (imported only when needed)."""

import pathlib

__all__ = ["STUDIES", "RESULTS_FOLDER", "default_output_dir"]

RESULTS_FOLDER = "approxlab-results"
"""The folder, in the current directory, that holds every study's default output folder."""


def default_output_dir(study: str, *, quick: bool = False) -> pathlib.Path:
    """Where ``approxlab <study>`` writes unless ``--out`` is given: ``approxlab-results/<study>``.

    The path is relative to the current directory, so a run never writes inside the installed
    package or the committed ``figures/`` of a source checkout (those are written only when named
    with ``--out``); ``quick`` (``--quick``) gives ``approxlab-results/<study>-quick``, so a smoke
    run never resumes into, or is refused by, the full run's folder.

    Parameters
    ----------
    study : str
        The study's command name, a key of :data:`STUDIES` (``"figure1"``, ``"sv-decay"``, ...).
    quick : bool
        The ``--quick`` grid.

    Returns
    -------
    pathlib.Path
        ``approxlab-results/<study>`` or ``approxlab-results/<study>-quick`` (relative).

    Examples
    --------
    >>> default_output_dir("figure1").as_posix()
    'approxlab-results/figure1'
    >>> default_output_dir("sv-decay", quick=True).as_posix()
    'approxlab-results/sv-decay-quick'
    """
    return pathlib.Path(RESULTS_FOLDER) / (f"{study}-quick" if quick else study)
