"""Charts (matplotlib PNG) and self-contained HTML pages for the analysis tools' reports.

A page is a list of blocks (headings, paragraphs, tables, images, links) written
as one HTML file whose images are embedded (``data:`` URIs), so it can be
mailed or archived alone. Charts need matplotlib (``pip install 'quanta[plot]'``);
without it :func:`pyplot` returns None, the chart functions return None and
pages hold their tables only (:func:`warn_no_matplotlib` says so once).

>>> import os, tempfile
>>> page = Page("Scores")
>>> page.table(["layer", "score"], [["conv1", 0.5], ["fc", 0.75]])
>>> with tempfile.TemporaryDirectory() as d:
...     page.write(os.path.join(d, "scores.html"))
...     "<td>conv1</td>" in open(os.path.join(d, "scores.html")).read()
True
"""

from __future__ import annotations

import base64
import html
import io
import math
import os
import warnings
from collections.abc import Sequence
from typing import Any

from quanta._files import write_bytes

__all__ = ["Page", "bar_chart", "histogram_chart", "line_chart", "pyplot", "range_chart", "save_png",
           "scatter_chart", "warn_no_matplotlib"]

_WARNED = False


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def warn_no_matplotlib(what: str) -> None:
    """One UserWarning per process: ``what`` is written without charts."""
    global _WARNED
    if not _WARNED:
        _WARNED = True
        warnings.warn(f"{what}: matplotlib is not installed, so the HTML pages hold tables but no charts "
                      "(pip install 'quanta[plot]')", UserWarning, stacklevel=3)


def _png(fig: Any, plt: Any, tight: bool = True) -> bytes:
    buf = io.BytesIO()
    if tight:  # fits long rotated labels; half the cost of a simple chart, so fixed margins where they suffice
        fig.tight_layout()
    else:
        fig.subplots_adjust(left=0.12, right=0.97, bottom=0.1, top=0.9)
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _finite(v: float, cap: float) -> float:
    if math.isnan(v):
        return 0.0
    return max(-cap, min(cap, v))


def _wide(n: int) -> float:
    return min(60.0, max(7.0, 0.3 * n + 2.0))


def bar_chart(names: Sequence[str], series: dict[str, Sequence[float]], *, ylabel: str, title: str,
              baselines: dict[str, float] | None = None, zoom: bool = False) -> bytes | None:
    """Grouped bars, one group per name and one bar per series; ``baselines`` are horizontal dashed lines
    (e.g. the float model's score); ``zoom`` fits the y axis to the values instead of starting at zero.
    Infinite values are drawn at ±1e6 (SQNR of exact layers)."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(_wide(len(names)), 4.5))
    k = max(1, len(series))
    width = 0.8 / k
    for i, (label, values) in enumerate(series.items()):
        xs = [x + (i - (k - 1) / 2) * width for x in range(len(names))]
        ax.bar(xs, [_finite(float(v), 1e6) for v in values], width=width, label=label)
    for j, (label, value) in enumerate((baselines or {}).items()):
        ax.axhline(value, linestyle="--", color=f"C{k + j}", label=label)
    if zoom:  # scores close to each other: show the differences, not the distance from zero
        values = [_finite(float(v), 1e6) for vs in series.values() for v in vs] + list((baselines or {}).values())
        values = [v for v in values if math.isfinite(v)]
        if values:
            lo, hi = min(values), max(values)
            pad = 0.1 * (hi - lo) or 0.01 * (abs(hi) or 1.0)
            ax.set_ylim(lo - pad, hi + pad)
    ax.set_xticks(list(range(len(names))))
    ax.set_xticklabels(names, rotation=70, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if len(series) > 1 or baselines:
        ax.legend(fontsize=8)
    return _png(fig, plt)


def range_chart(names: Sequence[str] | None, mins: Sequence[float], maxs: Sequence[float], *, title: str,
                xlabel: str = "") -> bytes | None:
    """One vertical bar per entry from its min to its max (encoding ranges), labelled by ``names``, or by
    index when ``names`` is None (the channels of one weight)."""
    plt = pyplot()
    if plt is None:
        return None
    n = len(mins)
    fig, ax = plt.subplots(figsize=(_wide(n) if names is not None else 9.0, 4.5))
    xs = list(range(n))
    ax.bar(xs, [hi - lo for lo, hi in zip(mins, maxs)], bottom=list(mins), width=0.6)
    ax.axhline(0.0, color="black", linewidth=0.6)
    if names is not None:
        ax.set_xticks(xs)
        ax.set_xticklabels(names, rotation=70, ha="right", fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("encoding range")
    ax.set_title(title, fontsize=10)
    return _png(fig, plt, tight=names is not None)


def line_chart(names: Sequence[str], values: Sequence[float], *, ylabel: str, title: str,
               log: bool = False) -> bytes | None:
    """Markers joined by a line, one point per name; ``log`` uses a logarithmic y axis."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(_wide(len(names)), 4.5))
    xs = list(range(len(names)))
    ax.plot(xs, list(values), marker="o")
    if log and all(v > 0 for v in values):
        ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels(names, rotation=70, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    return _png(fig, plt)


def histogram_chart(edges: Sequence[float], counts: Sequence[float], *, title: str,
                    lines: dict[str, float] | None = None) -> bytes | None:
    """The fraction of values per bin (``counts`` normalised; log scale) over bins ``edges`` (one more than
    counts), with dashed vertical ``lines`` (e.g. the encoding's min and max)."""
    plt = pyplot()
    if plt is None:
        return None
    total = float(sum(counts)) or 1.0
    fig, ax = plt.subplots(figsize=(7.0, 3.8))
    density = [c / total for c in counts]
    floor = min((d for d in density if d > 0), default=1.0) / 2
    # log scale: a spike (the zeros after a ReLU) would flatten everything else on a linear one
    ax.stairs([max(d, floor) for d in density], list(edges), fill=True, color="C0", alpha=0.8, baseline=floor)
    ax.set_yscale("log")
    for i, (label, x) in enumerate((lines or {}).items()):
        ax.axvline(x, linestyle="--", color=f"C{i + 2}", label=label)
    if lines:
        ax.legend(fontsize=8)
    ax.set_ylabel("fraction of values")
    ax.set_title(title, fontsize=10)
    return _png(fig, plt, tight=False)


def scatter_chart(points: dict[str, tuple[Sequence[float], Sequence[float]]], *, xlabel: str, ylabel: str,
                  title: str, front: tuple[Sequence[float], Sequence[float]] | None = None,
                  hline: tuple[str, float] | None = None) -> bytes | None:
    """Scatter series ``{label: (xs, ys)}``, an optional line through ``front`` (a Pareto front, drawn as
    steps) and an optional labelled horizontal line (an accuracy budget)."""
    plt = pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for label, (xs, ys) in points.items():
        ax.scatter(list(xs), list(ys), label=label, s=22)
    if front is not None and len(front[0]):
        ax.step(list(front[0]), list(front[1]), where="post", color="black", linewidth=1.2, label="Pareto front")
    if hline is not None:
        ax.axhline(hline[1], linestyle="--", color="red", label=hline[0])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig, plt)


def save_png(png: bytes | None, path: str | os.PathLike) -> None:
    """Write a chart to ``path`` (atomically); nothing when ``png`` is None (no matplotlib)."""
    if png is not None:
        write_bytes(path, png)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return html.escape(f"{v:.6g}")
    return html.escape(str(v))


class Page:
    """A self-contained HTML page built block by block, then written with :meth:`write`."""

    def __init__(self, title: str) -> None:
        self.title = title
        self._blocks: list[str] = []

    def heading(self, text: str) -> None:
        self._blocks.append(f"<h2>{html.escape(text)}</h2>")

    def paragraph(self, text: str) -> None:
        self._blocks.append(f"<p>{html.escape(text)}</p>")

    def image(self, png: bytes | None, alt: str = "") -> None:
        """An embedded PNG (nothing when ``png`` is None: no matplotlib)."""
        if png is not None:
            data = base64.b64encode(png).decode("ascii")
            self._blocks.append(f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">')

    def table(self, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
        self._blocks.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def links(self, items: Sequence[tuple[str, str]]) -> None:
        """A list of links ``(text, relative path)``."""
        lis = "".join(f'<li><a href="{html.escape(href)}">{html.escape(text)}</a></li>' for text, href in items)
        self._blocks.append(f"<ul>{lis}</ul>")

    def html(self) -> str:
        style = ("body{font-family:sans-serif;margin:2em;max-width:1400px}img{max-width:100%}"
                 "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 8px;"
                 "text-align:right}td:first-child,th:first-child{text-align:left}")
        return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(self.title)}</title>"
                f"<style>{style}</style></head><body><h1>{html.escape(self.title)}</h1>\n"
                + "\n".join(self._blocks) + "\n</body></html>\n")

    def write(self, path: str | os.PathLike) -> None:
        """Write the page to ``path`` atomically (its directory is created)."""
        write_bytes(path, self.html())
