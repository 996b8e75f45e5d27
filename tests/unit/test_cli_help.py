"""``labctl ... --help`` reads cleanly: no sentence breaks in the middle of a line.

Every command and group of the real command tree (``typer.main.get_command(app)``) is rendered with
Typer's own help formatter (Rich) at 80 and 120 columns, and its text is read back the way a person
reads it: the description's paragraphs, and the help cells of the boxed panels with their borders
stripped. Rich fills each line as far as the width allows, so a continuation line whose first word
would have fitted on the line before can only come from a hard line break in the source text (a
docstring's), as can a lone short fragment in the middle of a paragraph.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import typer.main
import typer.rich_utils
from typer.core import TyperCommand, TyperGroup
from typer.testing import CliRunner

import labctl.helptext
from labctl.cli import app
from labctl.helptext import reflow

WIDTHS = (80, 120)
# typer's boxed panels: each row of a table cell is one line between these borders.
TOP, BOTTOM, SIDE = "╭", "╰", "│"
# Typer adds these as separate items after an option's help text; each starts its own line.
METADATA = ("[default:", "[env var:", "[required]")


def _command_paths(command: TyperCommand | TyperGroup, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    # typer 0.29 carries its own click (typer._click): its groups are not click.Group.
    yield path
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            assert isinstance(sub, TyperCommand | TyperGroup)
            yield from _command_paths(sub, (*path, name))


def _tree() -> TyperGroup:
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    return root


PATHS = list(_command_paths(_tree()))


def _render(path: tuple[str, ...], width: int, monkeypatch: pytest.MonkeyPatch, cli: typer.Typer = app) -> str:
    # Rich's console takes COLUMNS; typer's TERMINAL_WIDTH (read once at import) would win over it.
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", width)
    monkeypatch.setattr(typer.rich_utils, "FORCE_TERMINAL", False)  # plain text, no colour codes
    result = CliRunner().invoke(cli, [*path, "--help"], env={"COLUMNS": str(width), "TERMINAL_WIDTH": str(width)})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    widest = max(len(line) for line in lines)
    assert widest == width, f"the help was rendered {widest} columns wide, not {width}"
    return result.output


def _first_word(text: str) -> str:
    return text.split()[0]


def _check_paragraph(where: str, lines: list[str], room: int) -> list[str]:
    """Lines of one paragraph (their text only), each at most `room` columns: the bad breaks."""
    problems = []
    for number, (line, following) in enumerate(itertools.pairwise(lines), 1):
        assert len(line) <= room, f"{where}: {line!r} is wider than the {room} columns it may use"
        word = _first_word(following)
        fits = len(line) + 1 + len(word) <= room
        if fits:
            problems.append(f"{where}, line {number}: {line!r} is broken before {word!r}, which fits on it")
        if fits and len(line.split()) <= 2 and len(line) < room // 3:
            problems.append(f"{where}, line {number}: {line!r} is a lone fragment in the middle of a paragraph")
    return problems


def _description(lines: list[str], width: int, where: str) -> list[str]:
    """The text between the usage line and the first panel, paragraph by paragraph."""
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:"))
    end = next((i for i, line in enumerate(lines) if line.startswith(TOP)), len(lines))
    problems: list[str] = []
    paragraph: list[str] = []
    # Usage and description are padded by one column on each side.
    for line in [*lines[start + 2 : end], ""]:
        if line.strip():
            paragraph.append(line.rstrip())
        elif paragraph:
            problems += _check_paragraph(f"{where}: description", paragraph, width - 1)
            paragraph = []
    return problems


def _panels(lines: list[str], where: str) -> list[str]:
    """The help column of each boxed panel (Options, Arguments, Commands), one cell at a time."""
    problems: list[str] = []
    starts = [i for i, line in enumerate(lines) if line.startswith(TOP)]
    for start in starts:
        end = next(i for i in range(start, len(lines)) if lines[i].startswith(BOTTOM))
        title = lines[start].strip(TOP + "─╮ ")
        rows = [line[1:-1] for line in lines[start + 1 : end]]
        assert all(line.startswith(SIDE) and line.endswith(SIDE) for line in lines[start + 1 : end])
        # A continuation line is blank up to the help column, the table's last one; the first
        # columns (Options: the required mark, then the names 3 columns further) start the rows.
        starts_of_text = [len(row) - len(row.lstrip()) for row in rows]
        continuations = [x for x in starts_of_text if x > min(starts_of_text) + 3]
        if not continuations:
            continue  # every cell is one line: nothing can be broken
        column = max(continuations)
        assert all(row[column - 1] == " " for row in rows), f"{where}: no help column found in {title}"
        # The panel pads its content by one column on the right; the last table column has no pad.
        room = len(rows[0]) - 1 - column
        cell: list[str] = []
        for row, indent in zip([*rows, ""], [*starts_of_text, 0], strict=True):
            text = row[column:].rstrip()
            new_item = indent < column or text.startswith(METADATA) or not text
            if new_item and cell:
                problems += _check_paragraph(f"{where}: {title} panel, cell {cell[0][:30]!r}", cell, room)
                cell = []
            if text:
                cell.append(text)
    return problems


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(("labctl", *p)))
def test_help_has_no_hard_breaks(path: tuple[str, ...], width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = _render(path, width, monkeypatch).splitlines()
    where = f"labctl {' '.join(path)} --help at {width} columns".replace("  ", " ")
    problems = _description(lines, width, where) + _panels(lines, where)
    assert not problems, "\n".join(problems)


def test_the_check_finds_hard_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reading above catches a docstring's break in a description, a command list and a cell."""
    demo = typer.Typer()

    @demo.command()
    def first(
        level: int = typer.Option(0, show_default=False, help="How loud the first command is.\n\nMore words here."),
    ) -> None:
        """Do the first thing.

        A second paragraph, broken after
        this line by the source only."""

    @demo.command()
    def second() -> None:
        """The second command's one sentence is broken after
        this line by the source only."""

    listing = _render((), 80, monkeypatch, demo).splitlines()
    assert _panels(listing, "demo") == [
        (
            'demo: Commands panel, cell "The second command\'s one sente", line 1: "The second command\'s one sentence is '
            "broken after\" is broken before 'this', which fits on it"
        )
    ]
    page = _render(("first",), 80, monkeypatch, demo).splitlines()
    assert _description(page, 80, "demo") == [
        "demo: description, line 1: ' A second paragraph, broken after' is broken before 'this', which fits on it"
    ]
    assert _panels(page, "demo") == [
        (
            "demo: Options panel, cell 'How loud the first command is.', line 1: 'How loud the first command is.' is broken "
            "before 'More', which fits on it"
        )
    ]


def test_every_command_is_rendered() -> None:
    """The walk reaches the sub-apps' commands, not only the top level."""
    names = {" ".join(p) for p in PATHS}
    assert {"", "bundle", "bundle resolve", "drift", "keys add", "runs show", "plan"} <= names


def _help_texts(command: TyperCommand | TyperGroup, path: str = "labctl") -> Iterator[tuple[str, str]]:
    yield path, command.help or ""
    for param in command.params:
        yield f"{path} {param.name}", getattr(param, "help", None) or ""
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            assert isinstance(sub, TyperCommand | TyperGroup)
            yield from _help_texts(sub, f"{path} {name}")


def test_reflow_keeps_the_words(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every help text shown has the source's words, in order, and no line break inside a paragraph."""
    shown = dict(_help_texts(_tree()))
    monkeypatch.setattr(labctl.helptext, "reflow_tree", lambda command: None)
    source = dict(_help_texts(_tree()))  # the same tree, built as Typer alone does
    assert shown.keys() == source.keys()
    assert any("\n" in text.replace("\n\n", "") for text in source.values())
    for where, text in shown.items():
        assert text.split() == source[where].split(), where
        assert "\n" not in text.replace("\n\n", ""), f"{where}: {text!r}"


def test_reflow_joins_paragraph_lines_and_keeps_lists() -> None:
    text = """First line of a sentence that goes
    on here.

    Second paragraph, also
    broken.

    - a list item
    - another item

    \b
    kept  as
    written"""
    assert reflow(text) == (
        "First line of a sentence that goes on here.\n\nSecond paragraph, also broken.\n\n"
        "- a list item\n- another item\n\n\b\nkept  as\nwritten"
    )
