"""Figures on the pages come from running the pages' own code, at every build.

Before Sphinx reads the sources, every page that shows ``_figures/<name>.png`` is run (see
:mod:`page_code`) in a scratch directory, and the figures it wrote are copied to ``docs/_figures/`` (not
in git). A page whose code does not write a figure it shows fails the build.
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile

import page_code
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util import logging

logger = logging.getLogger(__name__)


def _make_figures(app: Sphinx) -> None:
    src = pathlib.Path(app.srcdir)
    out = src / "_figures"
    out.mkdir(exist_ok=True)
    for page in page_code.pages(src):
        names = page_code.figures(page.read_text(encoding="utf-8"))
        if not names:
            continue
        logger.info(f"page_figures: running {page.relative_to(src)} for {', '.join(names)}")
        with tempfile.TemporaryDirectory() as tmp:
            page_code.run_page(page, pathlib.Path(tmp))
            for name in names:
                made = pathlib.Path(tmp) / name
                if not made.is_file():
                    raise ExtensionError(f"{page.relative_to(src)} shows _figures/{name} but its code did not "
                                         f"write {name}")
                shutil.copyfile(made, out / name)


def setup(app: Sphinx) -> dict:
    app.connect("builder-inited", _make_figures)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
