"""``jax_attention.interop`` without PyTorch: it imports, and a conversion that needs PyTorch says
how to install it. (No ``import_torch`` here: this must run, and pass, where PyTorch is absent.)"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

import jax_attention.interop as interop


def _interop_without_torch(monkeypatch):
    """A fresh copy of jax_attention.interop, imported while ``import torch`` fails."""
    for name in [name for name in sys.modules if name == "torch" or name.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)  # None in sys.modules: the import fails
    spec = importlib.util.spec_from_file_location("_interop_without_torch", interop.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_importable_and_clear_error_without_torch(monkeypatch):
    module = _interop_without_torch(monkeypatch)
    assert module.COMPONENTS == interop.COMPONENTS
    params = {"gamma": np.ones(3), "beta": np.zeros(3)}
    with pytest.raises(ImportError, match=r"needs PyTorch.*pip install 'jax-attention\[torch\]'"):
        module.to_torch(params, "layer_norm")
    # NumPy arrays under PyTorch's names need no PyTorch to be read.
    converted = module.from_torch({"weight": np.ones(3), "bias": np.zeros(3)}, "layer_norm")
    np.testing.assert_array_equal(converted["gamma"], params["gamma"])
    # Bad dicts are still explained before PyTorch is needed.
    with pytest.raises(ValueError, match=r"missing beta \(D,\)"):
        module.to_torch({"gamma": np.ones(3)}, "layer_norm")
