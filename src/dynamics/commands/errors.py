"""The error every subcommand raises for bad input from the user.

It lives below both ``dynamics.cli`` (which catches it) and the command modules (which
raise it), so that no command imports the CLI that imports it.
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""
