"""The lab's one command-line style (every `python -m steps.<...>` parser): `--help` shows each
option's default. A leaf module: steps.core (the job's command line, steps/core/cli.py) and
steps.tracking (`python -m steps.tracking.lab`) both build their parsers from it."""

from __future__ import annotations

import argparse


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` shows each option's default ("(default: 60)"), except where there is none (None, "")."""

    def _get_help_string(self, action):
        return action.help if action.default in (None, "") else super()._get_help_string(action)


def parser(prog: str, description: str | None = None) -> argparse.ArgumentParser:
    """The lab's command lines: one parser style, whose `--help` shows the defaults."""
    return argparse.ArgumentParser(prog=prog, description=description, formatter_class=DefaultsFormatter)
