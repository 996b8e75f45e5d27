"""Errors of the bundle builder."""

from __future__ import annotations


class BuildError(Exception):
    """A build failure; the message is one line naming the profile field or file."""
