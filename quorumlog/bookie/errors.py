"""Errors of the storage side that are not wire statuses."""

from __future__ import annotations


class BookieStartError(Exception):
    """The bookie refuses to start (cookie mismatch, damaged journal, ...); the message says why."""
