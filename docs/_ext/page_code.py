"""The code of a documentation page, run as a reader would paste it.

A page's ```` ```python ```` blocks run in order in one namespace (each page on its own, so every page
starts from its imports). A block followed directly by a ```` ```text ```` block printed that text: the
run checks it, so the page shows what the code prints. ```` ```console ```` blocks hold ``$ quanta ...``
command lines, run in the same order and directory (through :func:`quanta.cli.main`, in process); the lines
after a command up to the next ``$`` are what it prints, checked the same way (none: not checked). Figures a page shows (``_figures/<name>.png``) are
files its code writes into the working directory, under the same name.

Used by the docs build (``page_figures``: the figures come from this run) and by ``tests/docs``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import pathlib
import re
import shlex

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,})(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                    re.MULTILINE | re.DOTALL)
FIGURE = re.compile(r"_figures/(?P<name>[\w.-]+\.png)")


@dataclasses.dataclass(frozen=True)
class Block:
    """One ```` ```python ```` block (or one ``$ quanta`` command) of a page and the output the page shows
    for it (None: not shown)."""

    line: int
    code: str
    expected: str | None
    command: bool = False


def code_blocks(text: str) -> list[Block]:
    """The page's Python blocks, each with the ```` ```text ```` block that follows it directly, if any."""
    fences = list(_FENCE.finditer(text))
    blocks = []
    for i, m in enumerate(fences):
        if m.group("info").strip() == "console":
            blocks += _commands(m.group("body"), text.count("\n", 0, m.start()) + 2)
            continue
        if m.group("info").strip() != "python":
            continue
        expected = None
        if i + 1 < len(fences):
            nxt = fences[i + 1]
            if nxt.group("info").strip() == "text" and not text[m.end():nxt.start()].strip():
                expected = nxt.group("body")
        blocks.append(Block(text.count("\n", 0, m.start()) + 2, m.group("body"), expected))
    return blocks


def _commands(body: str, first_line: int) -> list[Block]:
    blocks: list[Block] = []
    for offset, line in enumerate(body.splitlines()):
        if line.startswith("$ "):
            command = line[2:].strip()
            if not command.startswith("quanta "):
                raise ValueError(f"line {first_line + offset}: a console block runs only `quanta` commands, "
                                 f"got {command!r}")
            blocks.append(Block(first_line + offset, command, None, command=True))
        elif blocks:
            last = blocks[-1]
            blocks[-1] = dataclasses.replace(last, expected=(last.expected or "") + line + "\n")
    return blocks


def _run_command(command: str) -> None:
    from quanta.cli import main

    status = main(shlex.split(command)[1:])
    if status:
        raise RuntimeError(f"`{command}` exited with status {status}")


def pages(root: pathlib.Path) -> list[pathlib.Path]:
    """The site's Markdown pages under ``root`` (the docs directory), build output left out."""
    return sorted(p for p in root.rglob("*.md") if "_build" not in p.relative_to(root).parts)


def figures(text: str) -> list[str]:
    """The file names of the figures a page shows."""
    return sorted({m.group("name") for m in FIGURE.finditer(text)})


class OutputMismatch(AssertionError):
    """A block printed something other than what its page shows."""


def _normalise(out: str) -> str:
    return "\n".join(line.rstrip() for line in out.strip("\n").splitlines())


def run_page(page: pathlib.Path, workdir: pathlib.Path, *, check: bool = True) -> list[tuple[Block, str]]:
    """Run every Python block of ``page`` in ``workdir``; (block, what it printed) in order.

    ``check=False`` runs without comparing outputs (to write a page's output blocks).

    Raises:
        OutputMismatch: a block printed something other than the ```` ```text ```` block after it.
        Exception: whatever a block raised, with the page and line added to the message.
    """
    page = pathlib.Path(page).resolve()
    namespace: dict = {"__name__": f"docs.{page.stem}"}
    results = []
    previous = pathlib.Path.cwd()
    os.chdir(workdir)
    try:
        for block in code_blocks(page.read_text(encoding="utf-8")):
            buf = io.StringIO()
            where = f"{page.name}:{block.line}"
            with contextlib.redirect_stdout(buf):
                try:
                    if block.command:
                        _run_command(block.code)
                    else:
                        exec(compile(block.code, where, "exec"), namespace)  # noqa: S102  (our own pages)
                except Exception as e:
                    e.add_note(f"in the Python block at {where}")
                    raise
            out = buf.getvalue()
            if check and block.expected is not None and _normalise(out) != _normalise(block.expected):
                raise OutputMismatch(f"{where} printed\n{out}\nbut the page shows\n{block.expected}")
            results.append((block, out))
    finally:
        os.chdir(previous)
    return results
