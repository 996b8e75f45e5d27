"""Help texts of the command line, reflowed: docstrings break lines for the source, not the screen.

Typer's Rich help keeps a help text's single line breaks in the command lists of a group and in
every paragraph of a description after the first, so a sentence written over two source lines
breaks in the middle of a screen line. ``HelpGroup``, the root group's class, reflows each
command's and group's help once, when Typer builds the command tree: the lines of a paragraph
(paragraphs are separated by a blank line) are joined with one space and the terminal wraps them.
A paragraph meant to keep its lines (one that starts with ``\\b``, click's mark for that, or with
indented or "- " list lines) is left as it is.
"""

from __future__ import annotations

import inspect
from typing import Any

from typer.core import TyperGroup


def reflow(text: str) -> str:
    """`text` with each paragraph's lines joined, the words themselves unchanged."""
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if _keeps_lines(p) else " ".join(p.split()) for p in paragraphs)


def _keeps_lines(paragraph: str) -> bool:
    if paragraph.startswith("\b"):
        return True
    lines = paragraph.splitlines()
    return len(lines) > 1 and any(line.startswith((" ", "\t", "- ", "* ")) for line in lines)


def reflow_tree(command: Any) -> None:
    """Reflow the help of `command`, its parameters and, for a group, every command under it."""
    for attribute in ("help", "short_help", "epilog"):
        value = getattr(command, attribute, None)
        if isinstance(value, str):
            setattr(command, attribute, reflow(value))
    for param in getattr(command, "params", []):
        if isinstance(getattr(param, "help", None), str):
            param.help = reflow(param.help)
    for sub in (getattr(command, "commands", None) or {}).values():
        reflow_tree(sub)


class HelpGroup(TyperGroup):
    """The root group: Typer builds the sub-groups and commands first, so all of them are here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        reflow_tree(self)
