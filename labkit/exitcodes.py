"""How `python -m labkit` ends: its exit statuses, and the exception a command raises to end with one.

A command returns an `ExitCode`, or raises: `cli.main` alone turns the kit's exceptions into a message
on stderr and a status (`cli._endings` says which exception gives which), so that no command prints
and returns an error of its own. `Stop` is for a command whose status for an error depends on what it
was doing (a merge that finds a shard missing failed; a submission that finds no Slurm was refused).
This module imports nothing of the kit.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # it ran, and something failed: a test, a shard, the reference, a build the kit makes
    REFUSED = 2  # an input was refused before anything ran: the message names it (file and line where any)
    NO_SANDBOX = 3  # no sandbox can be made here, and no weaker isolation was asked for by name
    INTERRUPTED = 130  # Ctrl-C: what was done is kept (the message says where)


class Stop(Exception):
    """End the command: `message` on stderr, then exit with `status`."""

    def __init__(self, status: ExitCode, message: str):
        super().__init__(message)
        self.status, self.message = status, message
