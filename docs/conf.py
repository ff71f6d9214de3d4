"""Sphinx configuration of quanta's documentation site.

Build (strict: every warning, broken reference and docstring error fails)::

    pip install -e '.[docs]'
    sphinx-build -W --keep-going -n -b html docs docs/_build/html
"""

from __future__ import annotations

import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

import quanta  # noqa: E402  (after the path set-up, as Sphinx confs do)

project = "quanta"
author = "the quanta developers"
copyright = "2026, the quanta developers"  # noqa: A001  (Sphinx's own name)
release = quanta.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "quanta_api",
    "page_figures",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_ext", "_figures_src", "Thumbs.db", ".DS_Store"]
root_doc = "index"

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Docstrings: Google-style sections (Args / Returns / Raises), reST cross references.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # "Attributes:" as fields of the class, not second entries beside autodoc's members
autodoc_inherit_docstrings = False  # torch's own method docstrings (autograd.Function.forward...) are not ours
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
autodoc_class_signature = "mixed"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
python_use_unqualified_type_names = True

# Strict build: nitpicky references. Names outside quanta (torch, numpy, the standard library) have no
# inventory here (the site is built offline), so they are written as text; every quanta name must resolve.
nitpicky = True

html_theme = "furo"
html_title = f"quanta {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
