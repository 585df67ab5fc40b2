"""The targets ``--against`` can name; :func:`make_target` builds one.

``numpy`` (the reference recomputed), ``jax`` (our functional core and ``jax.nn``), ``flax``
(Flax built-ins and our NNX modules), ``torch`` (PyTorch built-ins and the PyTorch mirror of the
book's code in :mod:`jax_attention.interop`), or a user module (a dotted module name or a ``.py``
path) that defines ``IMPLEMENTATIONS``.
"""

from __future__ import annotations

from jax_attention.conformance.target import Target

__all__ = ["BUILTIN_TARGETS", "make_target"]

#: The targets ``--against`` names by a word (anything else is a user module or ``.py`` file):
#: the NumPy reference recomputed, JAX (our core and ``jax.nn``), Flax, PyTorch.
BUILTIN_TARGETS = ("numpy", "jax", "flax", "torch")


def make_target(against: str, *, dtype: str, platform: str | None, precision: str) -> Target:
    """The :class:`~jax_attention.conformance.target.Target` that ``against`` names.

    Raises:
      RuntimeError: the framework or JAX platform is not available.
      ValueError: a user module that cannot be imported or defines no ``IMPLEMENTATIONS``.
    """
    if platform is not None and against in ("numpy", "torch"):
        raise ValueError(f"--platform chooses the JAX device of the jax, flax and user targets; "
                         f"{against} runs on the host CPU")
    if against == "numpy":
        from jax_attention.conformance.targets.numpy_target import make_numpy_target

        return make_numpy_target(dtype)
    if against == "jax":
        from jax_attention.conformance.targets.jax_target import make_jax_target

        return make_jax_target(dtype, platform, precision)
    if against == "flax":
        from jax_attention.conformance.targets.flax_target import make_flax_target

        return make_flax_target(dtype, platform, precision)
    if against == "torch":
        from jax_attention.conformance.targets.torch_target import make_torch_target

        return make_torch_target(dtype)
    from jax_attention.conformance.targets.user_target import make_user_target

    return make_user_target(against, dtype, platform, precision)
