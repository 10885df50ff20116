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
}
"""CLI subcommand -> module implementing it (imported only when needed)."""

from .._io import project_root

__all__ = ["STUDIES"]


def default_output_dir(name: str):
    """``<project root>/figures/<name>``: where a study writes unless ``--out`` is given."""
    return project_root() / "figures" / name


__all__ += ["project_root", "default_output_dir"]
