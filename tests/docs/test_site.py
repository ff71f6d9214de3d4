"""The documentation site: strict build, no dead internal link, every public name in the API reference,
and every page's code runs and prints what the page shows."""

from __future__ import annotations

import html.parser
import importlib
import pathlib
import subprocess
import sys
import urllib.parse

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import page_code  # noqa: E402  (docs/_ext, put on the path above)
import quanta_api  # noqa: E402

PAGES = page_code.pages(DOCS)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    """The site, built as CI builds it: fresh, warnings are errors, references checked."""
    out = tmp_path_factory.mktemp("site")
    run = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-E", "-q", "-b", "html",
                          str(DOCS), str(out)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, f"strict docs build failed:\n{run.stderr[-6000:]}"
    return out


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for key in ("href", "src"):
            if a.get(key) and not (tag == "link" and a.get("rel") in ("canonical",)):
                self.links.append(a[key])


def _parse(path: pathlib.Path) -> _Links:
    p = _Links()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def test_every_internal_link_of_the_site_resolves(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 40
    parsed = {p: _parse(p) for p in pages}
    dead = []
    for page, links in parsed.items():
        for link in links.links:
            url = urllib.parse.urlparse(link)
            if url.scheme or link.startswith(("//", "mailto:")):
                continue
            target = (page.parent / urllib.parse.unquote(url.path)).resolve() if url.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                dead.append(f"{page.relative_to(site)} -> {link}")
            elif url.fragment and target.suffix == ".html":
                ids = parsed[target].ids if target in parsed else _parse(target).ids
                if url.fragment not in ids:
                    dead.append(f"{page.relative_to(site)} -> {link} (no such anchor)")
    assert not dead, "dead links:\n" + "\n".join(dead[:50])


def test_every_public_name_is_in_the_api_reference_with_a_summary(site):
    from sphinx.util.inventory import InventoryFile

    with open(site / "objects.inv", "rb") as f:
        inventory = InventoryFile.load(f, "", posixpath_join)
    entries_by_kind = getattr(inventory, "data", inventory)  # a dict in Sphinx 9, an _Inventory before
    documented = {name for kind, entries in entries_by_kind.items() if kind.startswith("py:") for name in entries}
    missing = []
    for modname in quanta_api.MODULES:
        assert modname in documented, modname
        mod = importlib.import_module(modname)
        for name in quanta_api.public_names(modname):
            obj = getattr(mod, name)
            home = obj.__name__ if hasattr(obj, "__path__") else quanta_api.home_of(modname, name)
            if home not in documented or not quanta_api.summary_line(modname, name):
                missing.append(f"{modname}.{name} (home {home})")
        page = (site / "api" / f"{modname}.html").read_text(encoding="utf-8")
        for name in quanta_api.public_names(modname):
            assert f">{name}<" in page, f"{name} not in the table of {modname}"
    assert not missing, missing


def posixpath_join(a: str, b: str) -> str:
    return f"{a}/{b}" if a else b


def test_the_site_has_the_pages_the_issue_names(site):
    for page in ("index", "getting-started", "numerics", "reliability", "migration/aimet", "migration/torchao",
                 "migration/pytorch-quantization", "guides/simulate", "guides/calibrate", "guides/qat",
                 "guides/export", "guides/quantize", "guides/llm-cpu", "guides/techniques", "guides/cli",
                 "api/index"):
        assert (site / f"{page}.html").is_file(), page


@pytest.mark.parametrize("page", [p for p in PAGES if page_code.code_blocks(p.read_text(encoding="utf-8"))],
                         ids=lambda p: str(p.relative_to(DOCS)))
def test_page_code_runs_and_prints_what_the_page_shows(page, tmp_path):
    text = page.read_text(encoding="utf-8")
    page_code.run_page(page, tmp_path)  # raises on an error or on output other than the page's
    for name in page_code.figures(text):
        assert (tmp_path / name).is_file(), f"{page.name} shows {name} but its code did not write it"


def test_page_code_fails_a_block_whose_output_differs_from_the_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 1 + 1\nprint(x)\n```\n\n```text\n3\n```\n", encoding="utf-8")
    with pytest.raises(page_code.OutputMismatch, match="page.md:2 printed"):
        page_code.run_page(page, tmp_path)
    page.write_text("```python\nx = 1 + 1\nprint(x)\n```\n\n```text\n2\n```\n", encoding="utf-8")
    ((block, out),) = page_code.run_page(page, tmp_path)
    assert out == "2\n" and block.expected == "2\n"
