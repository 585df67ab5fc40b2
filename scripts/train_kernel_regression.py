#!/usr/bin/env python
"""Nadaraya–Watson regression with a learnable kernel width (d2l §11.2.3).

Same as ``jax-attention train kernel-regression [OPTIONS]``; see ``--help``.
"""

import sys

from jax_attention.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", "kernel-regression", *sys.argv[1:]]))
