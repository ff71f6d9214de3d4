"""Small text helpers for messages."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["shortlist"]


def shortlist(names: Sequence[str], limit: int = 8) -> str:
    """``names`` joined by commas, cut after ``limit`` with the total count; ``"none"`` when empty.

    >>> shortlist(["a", "b"]), shortlist([]), shortlist([str(i) for i in range(5)], limit=3)
    ('a, b', 'none', '0, 1, 2, ... (5 in all)')
    """
    if len(names) <= limit:
        return ", ".join(names) if names else "none"
    return ", ".join(names[:limit]) + f", ... ({len(names)} in all)"
