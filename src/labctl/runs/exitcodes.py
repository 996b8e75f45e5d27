"""Exit codes of the labctl commands that run playbooks (documented in docs/runbooks/unattended.md)."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0  # the run finished; nothing failed (drift: and nothing would change)
    FAILED = 1  # a task failed on at least one host
    USAGE = 2  # bad command line or input (Typer's own code for usage errors)
    UNREACHABLE = 3  # at least one host could not be reached (and none failed)
    REFUSED = 4  # not started or stopped before any change: the lock is held, or preflight refused
    DRIFT = 5  # labctl drift: at least one task would change a host
    INTERRUPTED = 130  # SIGINT or SIGTERM: the run was stopped, the lock released


OUTCOME_EXIT = {
    "ok": Exit.OK,
    "failed": Exit.FAILED,
    "unreachable": Exit.UNREACHABLE,
    "refused": Exit.REFUSED,
    "drift": Exit.DRIFT,
    "interrupted": Exit.INTERRUPTED,
}
