"""Sphinx configuration of the approxlab documentation.

Built offline, warnings as errors: ``python3 -m sphinx -W -b html docs docs/_build/html``.
No intersphinx, MathJax served from the build itself (``sphinx-mathjax-offline``), the
gallery (``docs/examples``) executed at build time by sphinx-gallery.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's approxlab, whichever is installed
os.environ.setdefault("OMP_NUM_THREADS", "1")

import approxlab  # noqa: E402

project = "approxlab"
author = "approxlab contributors"
copyright = "approxlab contributors; WikiText-2 text CC BY-SA 3.0"
release = version = approxlab.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # bundles MathJax 3 into _static/mathjax: no CDN
    "numpydoc",
    "sphinx_gallery.gen_gallery",
    "myst_parser",  # the studies' generated summary.md files are included as they are
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "examples/README.rst", "sg_execution_times.rst", "**/sg_execution_times.rst"]
templates_path = ["_templates"]

# autodoc / autosummary / numpydoc
autosummary_generate = True
autosummary_ignore_module_all = False  # a module's public names are its __all__
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_typehints = "none"  # the numpydoc Parameters sections carry the types
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_validation_checks = set()

# myst: the included summaries use tables and dollar-free Markdown
myst_enable_extensions = []
myst_heading_anchors = 0
suppress_warnings = ["myst.header"]

# sphinx-gallery: every example runs at build time
sphinx_gallery_conf = {
    "examples_dirs": "examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "abort_on_example_error": True,
    "show_signature": False,
}

html_theme = "pydata_sphinx_theme"
html_title = f"approxlab {release}"
html_static_path = []
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_show_sourcelink = False
