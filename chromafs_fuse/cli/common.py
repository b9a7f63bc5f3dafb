"""Argument helpers shared by the command-line entry points: argparse flags built from the one
table of options (options.py).

What turns the flags into settings lives below the commands (`SessionConfig`, `MountConfig` and
`chroma_location` in config.py, `resolve_token` in token_source.py), and logging in logs.py: the
daemon and the mount server use them too."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any, cast

from chromafs_fuse.errors import UsageError
from chromafs_fuse.options import CHROMA_OPTIONS, SESSION_OPTIONS, Option

CliError = UsageError  # the name the commands have always used


class DeprecatedName(argparse.Action):
    """An option's old name: stores the value as the new name would, and says on stderr to use that."""

    def __init__(self, option_strings: Sequence[str], dest: str, new_name: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new_name = new_name

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option_string: Any = None
    ) -> None:
        print(f"{parser.prog}: {option_string} is deprecated, use {self.new_name}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _keywords(option: Option) -> dict[str, Any]:
    """add_argument's keywords for an option (its names aside)."""
    default = os.environ.get(option.env, option.default) if option.env else option.default
    keywords: dict[str, Any] = {"dest": option.dest, "help": argparse.SUPPRESS if option.hidden else option.help}
    if option.kind == "switch":
        return {**keywords, "action": "store_true"}
    if option.kind == "toggle":
        return {**keywords, "action": argparse.BooleanOptionalAction, "default": default}
    if option.kind == "append":
        # argparse copies it on append; an append option's default is a tuple of strings (options.py)
        return {**keywords, "action": "append", "default": list(cast("Iterable[str]", default or ()))}
    keywords.update(default=default, type=option.type, choices=option.choices, metavar=option.metavar)
    if option.required and not default:
        keywords["required"] = True
    return keywords


def add_options(parser: argparse.ArgumentParser, options: Iterable[Option]) -> None:
    """The options as argparse flags, in the table's order."""
    exclusive: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for option in options:
        keywords = _keywords(option)
        target: argparse._ActionsContainer = parser
        if option.exclusive:
            if option.exclusive not in exclusive:
                exclusive[option.exclusive] = parser.add_mutually_exclusive_group()
            target = exclusive[option.exclusive]
        target.add_argument(option.name, *option.aliases, **keywords)
        if option.deprecated:
            assert option.kind == "value", option  # an old name of a switch would need its own action
            keywords.update(help=argparse.SUPPRESS, default=argparse.SUPPRESS, new_name=option.name)
            keywords.pop("required", None)
            target.add_argument(*option.deprecated, action=DeprecatedName, **keywords)


def add_chroma_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, CHROMA_OPTIONS)


def add_session_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, SESSION_OPTIONS)
