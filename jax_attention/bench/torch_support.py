"""The PyTorch peer of the benchmarks: the mirror of one of our models, and PyTorch's threads.

Shared by ``bench train`` (:mod:`jax_attention.bench.train`) and ``bench decode``
(:mod:`jax_attention.bench.decode`); PyTorch is imported only when these are called.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["torch_model", "torch_num_threads"]


def torch_model(kind: str, config, params):
    """The PyTorch mirror of registered model ``kind`` (:attr:`~jax_attention.models.ModelSpec.
    torch_mirror`) built from its ``config``, with our weights ``params``, in training mode."""
    from jax_attention.interop import to_torch
    from jax_attention.models import get_model

    model = get_model(kind).torch_mirror(config)
    model.load_state_dict(to_torch(params, kind))
    model.train()
    return model


@contextlib.contextmanager
def torch_num_threads(threads: int) -> Iterator[None]:
    """PyTorch's intra-op thread count set to ``threads`` inside, restored on the way out."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
