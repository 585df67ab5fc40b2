"""``python -m jax_attention``: the ``jax-attention`` command."""

import sys

from jax_attention.cli import main

if __name__ == "__main__":
    sys.exit(main())
