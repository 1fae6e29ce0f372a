"""A descriptive summary: a sentence written from a table's numbers that asserts nothing.

A notebook shows two kinds of statements. A :class:`gdnlab.findings.Finding` is a claim checked against a rule
(its function raises AssertionError when a rerun breaks it). A :class:`Summary` describes what was measured (how
many runs reached a ratio, where one backend wins) and cannot fail on a non-empty table, so it is labelled as such
wherever it is shown, and ``gdnlab reproduce`` does not count it among the findings.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Summary"]


@dataclass
class Summary:
    """What a table shows, said with its numbers; asserts nothing."""

    text: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def _repr_markdown_(self) -> str:
        return f"**Summary (descriptive, asserts nothing).** {self.text}"

    def __str__(self) -> str:
        return self.text
