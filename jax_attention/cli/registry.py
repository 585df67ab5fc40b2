"""The registry of ``jax-attention`` subcommands: :func:`register`, :func:`register_group`.

A command lives under a space-separated path (``"train bahdanau"``); the command families
(:mod:`jax_attention.cli.train`, ``plot``, ``translate``, ``conformance``, ``bench``) register
theirs when imported, and :func:`jax_attention.cli.build_parser` turns :data:`COMMANDS` into the
parser. This module imports nothing of the package, so that every family can import it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Configure", "Command", "COMMANDS", "register", "register_group", "children"]

#: The type of a command's ``configure``: called with the command's own subparser, it adds the
#: arguments and sets ``handler`` (``parser.set_defaults(handler=...)``); returns nothing.
Configure = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class Command:
    """A registered command: its help line, how to add its arguments (``None`` for a group such
    as ``train``, whose subcommands follow it) and its description."""

    help: str
    configure: Configure | None = None
    description: str | None = None


#: Path (``("train",)``, ``("train", "kernel-regression")``, ...) -> command, in registration
#: order, which is the order ``--help`` lists them in.
COMMANDS: dict[tuple[str, ...], Command] = {}


def register(path: str, *, help: str, description: str | None = None):
    """Decorator registering ``configure(parser)`` as the subcommand ``path`` (``"plot masks"``).

    ``configure`` adds the arguments and ``parser.set_defaults(handler=...)``. Every prefix of
    ``path`` must already be registered as a group (see :func:`register_group`).
    """
    words = tuple(path.split())
    if not words:
        raise ValueError(f"path must name a command, got {path!r}")
    if words[:-1] and words[:-1] not in COMMANDS:
        raise ValueError(f"register the group {' '.join(words[:-1])!r} before {path!r}")
    if words in COMMANDS:
        raise ValueError(f"the command {path!r} is already registered")

    def decorator(configure: Configure) -> Configure:
        COMMANDS[words] = Command(help=help, configure=configure, description=description)
        return configure

    return decorator


def register_group(path: str, *, help: str, description: str | None = None) -> None:
    """Register a command group (``"train"``, ``"plot"``): a word whose subcommands follow it."""
    words = tuple(path.split())
    if words in COMMANDS:
        raise ValueError(f"the command {path!r} is already registered")
    COMMANDS[words] = Command(help=help, description=description)


def children(prefix: tuple[str, ...]) -> list[tuple[tuple[str, ...], Command]]:
    """The commands directly under ``prefix`` (``()`` for the top level), in registration order."""
    return [(words, command) for words, command in COMMANDS.items()
            if len(words) == len(prefix) + 1 and words[:-1] == prefix]
