"""Nested parameter dicts and their flat ``"a/b/c"`` form (NumPy or JAX leaves alike).

Our models keep parameters as nested dicts (``{"encoder": {"gru": {"layer_0": {"W_x": ...}}}}``);
checkpoints, the conformance kit's ``.npz`` files and the PyTorch converters address each leaf by
its ``/``-joined path.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["flatten_params", "unflatten_params"]


def flatten_params(params: Mapping, prefix: str = "") -> dict:
    """``{"encoder": {"gru": {"layer_0": {"W_x": x}}}}`` -> ``{"encoder/gru/layer_0/W_x": x}``,
    in insertion order."""
    flat = {}
    for name, value in params.items():
        path = f"{prefix}{name}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, path + "/"))
        else:
            flat[path] = value
    return flat


def unflatten_params(flat: Mapping) -> dict:
    """The inverse of :func:`flatten_params`."""
    params: dict = {}
    for path, value in flat.items():
        node = params
        *parents, name = path.split("/")
        for parent in parents:
            node = node.setdefault(parent, {})
        node[name] = value
    return params
