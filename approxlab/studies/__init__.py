"""Studies: each a declaration over one shared engine, run as ``approxlab <study>``.

A study is one :class:`Study` object: its name and one-line description, its grid (full and
``--quick``), its options (most from the shared set of :mod:`approxlab.studies.options`), its steps
(:class:`Step`: how the config becomes cells, what one cell computes, the :class:`Table` s its rows
go to), its claims (:class:`Claim`), its derived tables, figures and summary. Everything else is
shared, once:

* :mod:`approxlab.studies.engine` -- the runner (resume, journal, lock, progress, in-process or
  Dask), the table store and the run record;
* :mod:`approxlab.studies.options` and :mod:`approxlab.studies.checks` -- the options and the
  checks every run passes;
* :mod:`approxlab.studies.inputs` -- the shared inputs (WikiText-2 windows, Q/K/V and exact
  references, the generated LRA tasks);
* :mod:`approxlab.studies.reporting` -- the loader of saved tables, one markdown renderer, one
  claims engine, the summary builder;
* :mod:`approxlab.studies.driver` and :mod:`approxlab.studies.registry` -- the one run path, and
  the names of the studies (built-in, registered from a ``--plugin`` module, installed as entry points).

The built-in studies are packages beside these: :mod:`~approxlab.studies.figure1`,
:mod:`~approxlab.studies.sv_decay`, :mod:`~approxlab.studies.instability`,
:mod:`~approxlab.studies.lra_svd`, :mod:`~approxlab.studies.decoder` and :mod:`~approxlab.studies.bench`.
"Writing a study" in the documentation declares a whole one in about 150 lines.
"""

from ..errors import StudyError, UsageError
from .declaration import Claim, Figure, Option, Product, Step, Study, Summary, Table
from .driver import compute, report
from .engine import cell_seed, config_hash, run_cells, run_steps
from .options import RESULTS_FOLDER, default_output_dir
from .registry import STUDIES, available, get, register, unregister

__all__ = ["Study", "Step", "Table", "Option", "Claim", "Product", "Figure", "Summary", "register", "unregister",
           "get", "available", "STUDIES", "compute", "report", "run_steps", "run_cells", "cell_seed",
           "config_hash", "default_output_dir", "RESULTS_FOLDER", "StudyError", "UsageError"]
