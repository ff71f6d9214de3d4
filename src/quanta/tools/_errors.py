"""The one-line cause the tools quote when they turn an exception into an input error."""

from __future__ import annotations

__all__ = ["first_line"]


def first_line(e: BaseException) -> str:
    """The first non-blank line of ``e``'s message, else its type's name.

    >>> first_line(ValueError("\\n  bad shape\\nmore detail")), first_line(KeyError())
    ('bad shape', 'KeyError')
    """
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
