"""``jax-attention data``: make sure of the English–French data, as every command that reads it
does before any work, and print where it is.

It looks where those commands look (``--data PATH``, ``$JAX_ATTENTION_DATA``,
``../shared/data/fra-eng.zip`` beside the checkout, the user cache), downloads d2l's archive into the
user cache when the data is found nowhere (SHA-1 checked; ``--no-download`` or
``$JAX_ATTENTION_NO_DOWNLOAD`` forbids it) and prints the path found, alone on standard output:
``make docs`` runs it before the tutorials, which train on the data, and hands them the path
(``JAX_ATTENTION_DATA``). Data found nowhere, a failed download or a damaged file is exit status 2
and, on stderr, the line that the training commands give (how to supply the file; where data
found nowhere was looked for follows it).
"""

from __future__ import annotations

import argparse

from jax_attention.cli.arguments import add_data_argument, check_data_argument
from jax_attention.cli.registry import register

__all__ = ["run_data"]


@register("data",
          help="find (or download) the English–French data and print its path",
          description="Make sure of the English–French data (d2l's fra-eng.zip) as the commands "
                      "that train on it do before any work, and print its path: --data PATH, "
                      "$JAX_ATTENTION_DATA, ../shared/data/fra-eng.zip beside the checkout, the "
                      "user cache, else d2l's archive downloaded into the user cache and its "
                      "SHA-1 checked (unless --no-download). Found nowhere, a failed download or "
                      "a damaged file: exit status 2 and a line that says how to supply the "
                      "file. "
                      "`make docs` runs it before executing the tutorials.")
def _data(parser: argparse.ArgumentParser) -> None:
    add_data_argument(parser)
    parser.set_defaults(handler=run_data)


def run_data(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The ``data`` command: the path of the data (downloaded if need be) on stdout; exit status
    0, or 2 with the error on stderr (argparse's ``parser.error``) when there is none to be had."""
    from jax_attention.data.archive import read_text

    path = check_data_argument(args, parser)  # found, or downloaded: as every command that reads it
    try:
        read_text(path, num_pairs=1)  # opened as the commands will open it
    except (OSError, ValueError) as error:  # a damaged or truncated archive
        parser.error(str(error))
    print(path.resolve())
    return 0
