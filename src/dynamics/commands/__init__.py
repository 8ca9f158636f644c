"""Subcommands of the ``dynamics`` CLI (see ``dynamics.cli.COMMANDS``)."""
