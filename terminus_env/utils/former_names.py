"""Options renamed in the command line: the former name is accepted for one release, sets the same value, and says
the new name on stderr, so scripts keep working while their authors learn the new word."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


class _FormerName(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, new_name: str, **kwargs: Any) -> None:
        self.new_name = new_name
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog}: {option_string} is now {self.new_name}; the former name is accepted until the next "
              "release", file=sys.stderr)  # fmt: skip
        setattr(namespace, self.dest, values)


def add_former_name(parser: argparse.ArgumentParser, *former: str, new_name: str, dest: str, **kwargs: Any) -> None:
    """Accept ``former`` (hidden from ``--help``) as the option ``new_name``, whose value lives in ``dest``;
    ``kwargs`` as for the new option (``type``, ``nargs``)."""
    parser.add_argument(*former, dest=dest, action=_FormerName, new_name=new_name, help=argparse.SUPPRESS,
                        default=argparse.SUPPRESS, **kwargs)  # fmt: skip
