"""The peers of ``jax-attention bench attention`` (:mod:`jax_attention.bench.attention`): each
implementation built on a case's inputs in its native layout, ready to run, and the float64
references their errors are measured against. See that module's docstring for what each peer is.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = ["PEERS", "Peer", "window_band", "forward_backward", "window_note", "keep_mask",
           "build_peers", "numpy_peer", "float64_grads"]

#: The implementations :func:`bench_attention` can run, in the order they are reported (see the
#: module docstring for what each one is and its layout); the default ``peers`` and the choices of
#: ``jax-attention bench attention --peers``.
PEERS = ("ours", "ours_plain", "ours_efficient", "ours_efficient_dense", "jax.nn", "flax.nnx",
         "torch", "numpy")


def window_band(T: int, S: int, window: tuple[int, int]) -> np.ndarray:
    """The boolean ``(T, S)`` band of a window ``(left, right)``: True where query ``t`` may
    attend key ``s``, ``t - left <= s <= t + right`` (NumPy, for the peers that take a mask)."""
    left, right = window
    t = np.arange(T)[:, None]
    s = np.arange(S)[None, :]
    return (s >= t - left) & (s <= t + right)


def forward_backward(attend: Callable) -> Callable:
    """``(q, k, v, lens, cotangent) -> (dq, dk, dv)``: the gradients of ``sum(attend(q, k, v,
    lens) * cotangent)``, i.e. the forward pass and the vector-Jacobian product of a training
    step. Not jitted (the caller does)."""
    import jax
    import jax.numpy as jnp

    def loss(q, k, v, lens, cotangent):
        return jnp.sum(attend(q, k, v, lens) * cotangent)

    return jax.grad(loss, argnums=(0, 1, 2))


# --------------------------------------------------------------------------- peers


class Peer:
    """One implementation ready to run: ``forward()`` and ``forward_backward()`` run it on the
    prepared inputs and wait for the result; ``output(result)`` and ``grads(result)`` turn their
    results into float64 NumPy arrays in the ``(B, N, T, H)`` layout, for the errors."""

    def __init__(self, forward, forward_backward=None, *, output, grads=None, note=""):
        self.forward = forward
        self.forward_backward = forward_backward
        self.output = output
        self.grads = grads
        self.note = note


def to_float64(x) -> np.ndarray:
    # bfloat16 (ml_dtypes) converts through astype; jax arrays through np.asarray.
    return np.asarray(x).astype(np.float64)


def _jax_peer(attend, inputs, *, heads_last: bool, standard_promotion: bool, note: str) -> Peer:
    """A JAX implementation ``attend(q, k, v, padding) -> output`` on ``inputs`` of its layout."""
    import jax

    def traced(q, k, v, padding):
        if standard_promotion:
            # The built-ins mix dtypes internally (float32 logits); a process with strict
            # promotion (the test suite) would refuse that, which is no fault of theirs.
            with jax.numpy_dtype_promotion("standard"):
                return attend(q, k, v, padding)
        return attend(q, k, v, padding)

    forward = jax.jit(traced)
    grads = jax.jit(forward_backward(traced))
    q, k, v, padding, cotangent = inputs

    def to_bnth(x):
        x = to_float64(x)
        return x.transpose(0, 2, 1, 3) if heads_last else x

    return Peer(lambda: jax.block_until_ready(forward(q, k, v, padding)),
                 lambda: jax.block_until_ready(grads(q, k, v, padding, cotangent)),
                 output=to_bnth, grads=lambda gs: [to_bnth(g) for g in gs], note=note)


def window_note(window) -> str:
    """What a peer's note says of the ``window``: ``", local_window_size=(left, right)"``, or
    ``""`` without one."""
    return "" if window is None else f", local_window_size={window}"


def keep_mask(lens, T: int, S: int, window, structure=None) -> np.ndarray | None:
    """The boolean mask of a case, True = attend: the key padding ``(B, 1, 1, S)``, AND the
    window's band ``(1, 1, T, S)`` when there is one, AND a structured mask's ``keep``
    (:class:`Structure`) (``(B or 1, 1, T, S)``); ``None`` for none of them."""
    keep = None if lens is None else (np.arange(S)[None, :] < lens[:, None])[:, None, None, :]
    for part in (None if window is None else window_band(T, S, window)[None, None],
                 None if structure is None else structure.keep):
        if part is not None:
            keep = part if keep is None else keep & part
    return keep


def _our_peer(name: str, inputs, window, efficient_chunks: dict, structure=None) -> Peer:
    """One of our peers (``ours``, ``ours_plain``, ``ours_efficient``, ``ours_efficient_dense``)
    on heads-first ``inputs`` ``(q, k, v, lens, cotangent)``, ``(B, N, T, H)`` with ``lens (B,)``
    or ``None``, the ``window`` (``(left, right)`` or ``None``) and the ``structure`` (a mask
    function for the first three, a dense mask for the last)."""
    if name == "ours_efficient_dense":
        return _dense_peer(inputs, window, efficient_chunks, structure)
    note_window = window_note(window)
    extra = {} if structure is None else {"mask_mod": structure.mask_mod()}
    if structure is not None:
        note_window += f", mask_mod={extra['mask_mod'].name}"
    if name == "ours":
        from jax_attention.nn import scoring

        def attend(q, k, v, lens):
            return scoring.dot_product_attention(q, k, v, lens, local_window_size=window,
                                                 **extra)[0]

        note = ("jax_attention.nn.scoring.dot_product_attention (implementation=None: "
                f"{scoring.dot_product_implementation(inputs[0], inputs[1])} here), "
                "(B, N, T, H), valid_lens" + note_window)
    elif name == "ours_plain":
        from jax_attention.nn import scoring

        def attend(q, k, v, lens):
            return scoring.dot_product_attention(q, k, v, lens, local_window_size=window,
                                                 implementation="plain", **extra)[0]

        note = ("jax_attention.nn.scoring.dot_product_attention(implementation='plain'), "
                "(B, N, T, H), valid_lens" + note_window)
    else:
        from jax_attention.nn import efficient

        def attend(q, k, v, lens):
            return efficient.dot_product_attention(q, k, v, lens, local_window_size=window,
                                                   **efficient_chunks, **extra)

        note = ("jax_attention.nn.efficient.dot_product_attention, (B, N, T, H), valid_lens"
                + note_window
                + "".join(f", {key}={value}" for key, value in efficient_chunks.items()))
    return _jax_peer(attend, inputs, heads_last=False, standard_promotion=False, note=note)


def _dense_peer(inputs, window, efficient_chunks: dict, structure) -> Peer:
    """``ours_efficient_dense``: the chunked kernel with the case's whole mask as one dense
    boolean array (no lengths, window or mask function it could skip blocks by)."""
    import jax.numpy as jnp

    from jax_attention.nn import efficient

    q, k, v, lens, cotangent = inputs
    B, _, T, _ = q.shape
    keep = keep_mask(None if lens is None else np.asarray(lens), T, k.shape[2], window,
                      structure)
    dense = None if keep is None else jnp.asarray(keep)

    def attend(q, k, v, mask):
        return efficient.dot_product_attention(q, k, v, mask=mask, **efficient_chunks)

    shape = "None" if keep is None else "(" + ", ".join(
        letter if n > 1 else "1" for letter, n in zip("B1TS", keep.shape)) + ")"
    return _jax_peer(attend, (q, k, v, dense, cotangent), heads_last=False,
                     standard_promotion=False,
                     note=f"jax_attention.nn.efficient.dot_product_attention, (B, N, T, H), the "
                          f"whole mask as a dense boolean mask {shape}"
                          + "".join(f", {key}={value}" for key, value in efficient_chunks.items()))


def _builtin_jax_peer(name: str, btnh, jax_lens, key_mask, window, mask_shape: str,
                      structure=None) -> Peer:
    """``jax.nn`` or ``flax.nnx`` on ``btnh`` (q, k, v, cotangent in their ``(B, T, N, H)``):
    jax.nn with the valid lengths ``jax_lens`` and the ``window`` as its own arguments, Flax
    with the boolean ``key_mask`` (:func:`keep_mask`, the window's band included; its shape
    as ``mask_shape`` says it)."""
    import jax.numpy as jnp

    note_window = window_note(window)
    if name == "jax.nn":
        import jax

        dense = None if structure is None else jnp.asarray(structure.keep)
        return _jax_peer(
            lambda q, k, v, lens: jax.nn.dot_product_attention(
                q, k, v, mask=dense, key_value_seq_lengths=lens, local_window_size=window),
            (*btnh[:3], jax_lens, btnh[3]), heads_last=True, standard_promotion=True,
            note="jax.nn.dot_product_attention (implementation=None), (B, T, N, H), "
                 "key_value_seq_lengths" + note_window
                 + ("" if structure is None else ", mask (1, 1, T, S)"))
    from flax import nnx

    flax_mask = None if key_mask is None else jnp.asarray(key_mask)
    return _jax_peer(
        lambda q, k, v, mask: nnx.dot_product_attention(q, k, v, mask=mask),
        (*btnh[:3], flax_mask, btnh[3]), heads_last=True, standard_promotion=True,
        note=f"flax.nnx.dot_product_attention, (B, T, N, H), mask {mask_shape}"
             + ("" if window is None else " (padding AND the window's band)"))


def build_peers(names, arrays, lens, dtype_name, efficient_chunks, window=None, structure=None):
    """``{name: Peer or reason}`` for the requested peers on float32 NumPy ``arrays`` (q, k, v,
    cotangent in ``(B, N, T, H)``), ``lens`` (``(B,)`` int32 or ``None``), ``window``
    (``(left, right)`` or ``None``) and ``structure`` (:class:`Structure` or ``None``)."""
    import jax.numpy as jnp

    dtype = jnp.dtype(dtype_name)
    q, k, v, cotangent = arrays
    B, N, T, H = q.shape
    S = k.shape[2]
    peers: dict[str, Peer | str] = {}
    bnth = [jnp.asarray(a, dtype) for a in (q, k, v)]
    btnh = [jnp.asarray(np.ascontiguousarray(a.transpose(0, 2, 1, 3)), dtype) for a in arrays]
    ct_bnth = jnp.asarray(cotangent, dtype)
    jax_lens = None if lens is None else jnp.asarray(lens)
    # (B, 1, 1, S): True where the key is real, broadcast over heads and queries; with a window,
    # AND the (T, S) band: (B or 1, 1, T, S).
    key_mask = keep_mask(lens, T, S, window, structure)
    mask_shape = ("None" if key_mask is None else
                  "(B, 1, 1, S)" if window is None and structure is None
                  else f"({B if lens is not None else 1}, 1, T, S)")

    for name in names:
        if name.startswith("ours"):
            peers[name] = _our_peer(name, (*bnth, jax_lens, ct_bnth), window, efficient_chunks,
                                    structure)
        elif name in ("jax.nn", "flax.nnx"):
            peers[name] = _builtin_jax_peer(name, btnh, jax_lens, key_mask, window, mask_shape,
                                            structure)
        elif name == "torch":
            peers[name] = _torch_peer(q, k, v, cotangent, key_mask, dtype_name, mask_shape)
        elif name == "numpy":
            peers[name] = numpy_peer(q, k, v, lens, dtype, window, structure)
        else:
            raise ValueError(f"unknown peer {name!r}; expected one of {', '.join(PEERS)}")
    return peers


def _torch_peer(q, k, v, cotangent, key_mask, dtype_name, mask_shape="(B, 1, 1, S)") -> Peer | str:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as error:
        return f"PyTorch is not installed (pip install -e '.[torch]'): {error}"
    dtype = getattr(torch, dtype_name)
    leaves = [torch.from_numpy(a).to(dtype).requires_grad_(True) for a in (q, k, v)]
    ct = torch.from_numpy(cotangent).to(dtype)
    mask = None if key_mask is None else torch.from_numpy(np.ascontiguousarray(key_mask))

    def forward():
        with torch.inference_mode():
            return F.scaled_dot_product_attention(*leaves, attn_mask=mask)

    def forward_backward():
        output = F.scaled_dot_product_attention(*leaves, attn_mask=mask)
        return torch.autograd.grad(output, leaves, grad_outputs=ct)

    def to_numpy(x):
        return x.detach().to(torch.float64).numpy()

    return Peer(forward, forward_backward, output=to_numpy,
                 grads=lambda gs: [to_numpy(g) for g in gs],
                 note=f"torch.nn.functional.scaled_dot_product_attention, (B, N, T, H), "
                      f"attn_mask {mask_shape}, {torch.get_num_threads()} threads")


def numpy_peer(q, k, v, lens, dtype, window=None, structure=None) -> Peer:
    """The ``numpy`` peer: :func:`reference_numpy.scoring.dot_product_attention` in float64 on
    the inputs as the other peers see them (rounded to ``dtype``), forward only."""
    from reference_numpy import scoring as reference

    # The inputs as the other peers see them (rounded to bfloat16 when that is the dtype).
    q, k, v = (np.asarray(np.asarray(a).astype(dtype)).astype(np.float64) for a in (q, k, v))
    mask = None if structure is None else structure.keep
    return Peer(lambda: reference.dot_product_attention(q, k, v, lens, mask=mask,
                                                         local_window_size=window)[0], None,
                 output=lambda x: x,
                 note="reference_numpy.scoring.dot_product_attention in float64, forward only "
                      "(the forward reference itself)" + window_note(window)
                      + ("" if structure is None else ", mask (1, 1, T, S)"))


def float64_grads(q, k, v, cotangent, lens, window=None, structure=None):
    """Float64 gradients ``(dq, dk, dv)`` of ``sum(attention * cotangent)`` and what made them.

    PyTorch float64 autograd through the textbook formula (two matmuls and a masked softmax,
    no fused kernel; the mask is the padding AND the window's band), independent of every peer,
    a block of query rows at a time (each row's attention is its own; ``dk`` and ``dv`` add up
    over the blocks), so that no more than about 128 MiB of float64 scores are held at once;
    without PyTorch, our own function under JAX's 64-bit mode.
    """
    B, N, T, H = q.shape
    S = k.shape[2]
    keep = keep_mask(lens, T, S, window, structure)
    try:
        import torch
    except ImportError:
        import jax

        from jax_attention.nn import scoring

        mask = None if structure is None else structure.keep

        def attend(q, k, v, lens):
            return scoring.dot_product_attention(q, k, v, lens, mask=mask,
                                                 local_window_size=window)[0]

        with jax.enable_x64(True):
            grads = jax.jit(forward_backward(attend))(q, k, v, lens, cotangent)
            return [np.asarray(g, np.float64) for g in grads], "ours, float64 (jax x64)"
    leaves = [torch.from_numpy(a).requires_grad_(True) for a in (q, k, v)]
    keep_t = None if keep is None else torch.from_numpy(np.ascontiguousarray(keep))
    rows = max(1, (1 << 24) // (B * N * S))
    for first in range(0, T, rows):
        block = slice(first, min(first + rows, T))
        scores = leaves[0][:, :, block] @ leaves[1].transpose(-1, -2) / math.sqrt(H)
        if keep_t is not None:
            keep_block = keep_t if keep_t.shape[-2] == 1 else keep_t[:, :, block]
            scores = torch.where(keep_block, scores, torch.finfo(torch.float64).min)
        output = torch.softmax(scores, dim=-1) @ leaves[2]
        output.backward(torch.from_numpy(np.ascontiguousarray(cotangent[:, :, block])))
    return ([leaf.grad.numpy() for leaf in leaves],
            "torch float64 autograd of softmax(Q K^T / sqrt(H)) V" +
            ("" if window is None else ", masked by the window's band")
            + ("" if structure is None else ", masked by the case's mask"))


