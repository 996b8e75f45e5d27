"""Progress reporting on stderr: rich bars on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from labctl.module_utils.progress import human_bytes

Advance = Callable[[int], None]


class Reporter(Protocol):
    def info(self, message: str) -> None: ...

    def warn(self, message: str) -> None: ...

    def task(
        self, description: str, total: int | None, unit: str = "bytes"
    ) -> AbstractContextManager[Advance]:
        """A step with a known (or unknown: None) total; yields ``advance(n)``."""
        ...


class PlainReporter:
    """One line per step on stderr: for logs and CI."""

    def __init__(self) -> None:
        self._console = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)

    def info(self, message: str) -> None:
        self._console.print(message)

    def warn(self, message: str) -> None:
        self._console.print(f"warning: {message}")

    @contextmanager
    def task(self, description: str, total: int | None, unit: str = "bytes") -> Iterator[Advance]:
        done = 0
        started = time.monotonic()

        def advance(amount: int) -> None:
            nonlocal done
            done += amount

        yield advance
        amount = human_bytes(done) if unit == "bytes" else f"{done} {unit}"
        self._console.print(f"{description}: {amount} in {time.monotonic() - started:.1f}s")


class RichReporter:
    """Progress bars for terminals."""

    def __init__(self) -> None:
        self._console = Console(stderr=True)

    def info(self, message: str) -> None:
        self._console.print(message, markup=False, highlight=False)

    def warn(self, message: str) -> None:
        self._console.print(f"[yellow]warning:[/yellow] {message}", highlight=False)

    @contextmanager
    def task(self, description: str, total: int | None, unit: str = "bytes") -> Iterator[Advance]:
        columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn()]
        if unit == "bytes":
            columns += [DownloadColumn(), TransferSpeedColumn()]
        else:
            columns += [MofNCompleteColumn(), TextColumn(unit)]
        columns.append(TimeElapsedColumn())
        if unit == "bytes" and total is not None:
            columns.append(TimeRemainingColumn())
        with Progress(*columns, console=self._console) as progress:
            task_id = progress.add_task(description, total=total)

            def advance(amount: int) -> None:
                progress.advance(task_id, amount)

            yield advance
            if total is None:
                progress.update(task_id, total=progress.tasks[0].completed)


def make_reporter(force_plain: bool = False) -> PlainReporter | RichReporter:
    if not force_plain and sys.stderr.isatty():
        return RichReporter()
    return PlainReporter()
