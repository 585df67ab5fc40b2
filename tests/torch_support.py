"""PyTorch for the cross-framework tests: optional locally, required in CI.

``torch = import_torch()`` at the top of a test module skips the module, with the reason, when
PyTorch is not installed (``pip install -e '.[torch]'`` installs it); with
``JAX_ATTENTION_REQUIRE_TORCH=1`` (set by ``.ci/run``) a missing PyTorch is an error instead, so
CI cannot pass by skipping these tests.
"""

from __future__ import annotations

import os

import pytest

REQUIRE_ENV = "JAX_ATTENTION_REQUIRE_TORCH"


def import_torch():
    try:
        import torch
    except ImportError as error:
        if os.environ.get(REQUIRE_ENV) == "1":
            raise RuntimeError(f"{REQUIRE_ENV}=1 but PyTorch cannot be imported: {error}") from error
        pytest.skip(f"PyTorch is not installed (pip install -e '.[torch]'): {error}",
                    allow_module_level=True)
    return torch
