"""Incremental decoding of the Transformer with a fixed-size key/value cache — d2l §11.7.6.

At prediction time the decoder sees one token per step. Instead of recomputing the whole prefix,
each block keeps the keys and values of the steps decoded so far in a cache of ``max_len`` slots
(fixed shapes, written with ``lax.dynamic_update_slice``, so a decoding loop compiles once), and
the encoder outputs are projected for the encoder–decoder attention once, before step 0.
:func:`init_decoder_state` builds that state, :func:`decoder_step` runs one step; the logits equal
those of :func:`jax_attention.models.transformer.decoder` on the whole prefix (the tests check it).
:func:`jax_attention.models.transformer.greedy_decode` and :func:`~jax_attention.models.transformer.beam_decode`
run these steps under ``jit``; both functions are re-exported by :mod:`jax_attention.models.transformer`.

Shape letters: ``B`` batch, ``S`` source length, ``L`` blocks, ``N`` heads, ``H = D / N``,
``N_kv`` key/value heads (grouped-query attention: ``N_kv`` divides ``N``; the book's ``N_kv =
N``), ``D`` model width, ``V`` vocabulary, ``M`` the cache length (``max_len`` decoding steps).

The cache holds the key/value heads only: with grouped-query (``N_kv < N``) or multi-query
(``N_kv = 1``) attention it is ``N / N_kv`` times smaller, and each key/value head serves its
``N / N_kv`` query heads without being repeated (:func:`jax_attention.models.transformer_layers.attend`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jax_attention._checks import (
    check_lengths,
    check_positions,
    check_size,
    check_tokens,
    check_values_in,
    clip_values,
    is_integer_dtype,
)
from jax_attention.models.transformer_layers import (
    DECODER_BLOCK_KEYS,
    DECODER_KEYS,
    MAX_POSITIONS,
    attend,
    check_stack,
    check_width,
    dense,
    embed,
    ffn,
    kv_heads,
    lengths_keep,
    project_one,
    project_out,
    residual,
)

__all__ = ["init_decoder_state", "decoder_step"]


def cache_layout(params, num_heads: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((N_kv, H_v) of the self-attention, (N_kv, H_v) of the encoder–decoder attention)``,
    read from the first block of checked parameters (:func:`cache_heads` checks them)."""
    block = params["blocks"]["block_0"]
    layout = []
    for name in ("self_attention", "cross_attention"):
        shape = {key: jnp.shape(block[name][key])[-1] for key in ("W_q", "W_k", "W_v")}
        n_kv = shape["W_k"] * num_heads // shape["W_q"]
        layout.append((n_kv, shape["W_v"] // n_kv))
    return layout[0], layout[1]


def cache_heads(params, L: int, num_heads: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((N_kv, H_v) of the self-attention, (N_kv, H_v) of the encoder–decoder attention)`` of
    a decoder's ``params`` — the key/value heads
    (:func:`~jax_attention.models.transformer_layers.kv_heads`) and the size of a value head
    (``W_v``'s width over ``N_kv``: ``H`` in the book) — the same in each of its ``L`` blocks
    (``ValueError`` naming the first block that differs)."""
    heads = []
    for name in ("self_attention", "cross_attention"):
        found = []
        for i in range(L):
            attention = params["blocks"][f"block_{i}"][name]
            n = kv_heads(attention, num_heads, f"params['blocks']['block_{i}']['{name}']")
            found.append((n, jnp.shape(attention["W_v"])[-1] // n))
        for i, heads_i in enumerate(found):
            if heads_i != found[0]:
                raise ValueError(f"params['blocks']['block_{i}']['{name}'] has {heads_i[0]} "
                                 f"key/value heads with values of {heads_i[1]}, block_0 "
                                 f"{found[0][0]} with {found[0][1]}: the cache needs the same in "
                                 f"every block")
        heads.append(found[0])
    return heads[0], heads[1]


def init_decoder_state(params, enc_outputs, src_valid_len, *, num_heads: int, max_len: int):
    """The decoder's state before step 0: empty key/value caches of ``max_len`` steps.

    Every leaf has the batch as its leading axis (beam search repeats and reorders the state
    along axis 0):

    * ``position (B,) int32``: the step about to be decoded (its position in ``P`` and the cache
      slot it writes);
    * ``self_keys`` ``(B, L, N_kv, M, H)``, ``self_values`` ``(B, L, N_kv, M, H_v)``: the
      self-attention cache, zeros (``H_v = H`` in the book);
    * ``cross_keys`` ``(B, L, N_kv, S, H)``, ``cross_values`` ``(B, L, N_kv, S, H_v)``: the
      encoder outputs projected once by each block's ``W_k`` and ``W_v`` (and their biases);
    * ``src_valid_len (B,) int32``.

    Only the key/value heads are stored (``N_kv``, read from the parameters' ``W_k``): a cached
    position of the self-attention costs ``2 * L * N_kv * H * itemsize`` bytes per sequence
    (keys and values), against ``2 * L * N * H * itemsize`` without grouping — ``N / N_kv`` times
    less (the same per source position for the encoder–decoder cache). The book's model in
    float32 (``L = 2``, ``N = 4``, ``H = 8``): 512 bytes per position; ``N_kv = 2``: 256;
    ``N_kv = 1`` (multi-query): 128. ``jax-attention bench decode`` measures it on this state.

    Args:
      params: the decoder's dict (its keys, nested ones included, are checked: ``ValueError``
        naming a missing or unexpected one). enc_outputs: ``(B, S, D)``.
      src_valid_len: ``(B,)`` integers in ``[0, S]`` (checked when concrete; act as clipped when
        traced), or ``None`` for ``S``.
      num_heads: ``N``. max_len: ``M``, the number of steps the cache holds.
    """
    L, D = check_stack(params, DECODER_KEYS, DECODER_BLOCK_KEYS, num_heads)
    enc_outputs = check_width("enc_outputs", enc_outputs, D, "(B, S, D)")
    B, S, _ = enc_outputs.shape
    cache_heads(params, L, num_heads)
    if src_valid_len is None:
        src_valid_len = jnp.full((B,), S, jnp.int32)
    src_valid_len = check_lengths("src_valid_len", src_valid_len, B, S, "S")
    return initial_state(params, enc_outputs, src_valid_len, num_heads=num_heads,
                         max_len=check_size("max_len", max_len))


def initial_state(params, enc_outputs, src_valid_len, *, num_heads: int, max_len: int):
    """:func:`init_decoder_state` of checked parameters, ``enc_outputs`` and int32 lengths
    ``(B,)``: what the Transformer's decoding runs under ``jit`` once its entry has checked them."""
    B, S, D = enc_outputs.shape
    L, H = len(params["blocks"]), D // num_heads
    (self_heads, self_value_size), (cross_heads, _) = cache_layout(params, num_heads)

    def cross(name):
        return jnp.stack([project_one(params["blocks"][f"block_{i}"]["cross_attention"],
                                      enc_outputs, name, cross_heads) for i in range(L)], axis=1)

    zeros = jnp.zeros((B, L, self_heads, max_len, H), enc_outputs.dtype)
    values = jnp.zeros((B, L, self_heads, max_len, self_value_size), enc_outputs.dtype)
    return {"position": jnp.zeros((B,), jnp.int32), "self_keys": zeros, "self_values": values,
            "cross_keys": cross("W_k"), "cross_values": cross("W_v"),
            "src_valid_len": src_valid_len.astype(jnp.int32)}


_STATE_SHAPES = {"position": "(B,)", "self_keys": "(B, L, N_kv, M, H)",
                 "self_values": "(B, L, N_kv, M, H_v)", "cross_keys": "(B, L, N_kv, S, H)",
                 "cross_values": "(B, L, N_kv, S, H_v)", "src_valid_len": "(B,)"}


def _check_decoder_state(state, L: int, N: int, heads: tuple, H: int):
    """The state of :func:`init_decoder_state` for ``L`` blocks, ``N`` heads, ``heads = ((N_kv,
    H_v) of the self-, (N_kv, H_v) of the cross-attention)`` (:func:`cache_heads`) and keys of
    size ``H``; returns ``(B, M, S)``."""
    if not hasattr(state, "keys") or set(state) != set(_STATE_SHAPES):
        raise ValueError(f"state must be the dict of init_decoder_state with keys "
                         f"{sorted(_STATE_SHAPES)}, got "
                         f"{sorted(state) if hasattr(state, 'keys') else type(state).__name__}")
    shapes = {name: jnp.shape(value) for name, value in state.items()}
    B = shapes["position"][0] if len(shapes["position"]) == 1 else None
    self_shape = shapes["self_keys"]
    M = self_shape[3] if len(self_shape) == 5 else None
    cross_shape = shapes["cross_keys"]
    S = cross_shape[3] if len(cross_shape) == 5 else None
    (N_self, H_self), (N_cross, H_cross) = heads
    expected = {"position": (B,), "self_keys": (B, L, N_self, M, H),
                "self_values": (B, L, N_self, M, H_self), "cross_keys": (B, L, N_cross, S, H),
                "cross_values": (B, L, N_cross, S, H_cross), "src_valid_len": (B,)}
    for name, shape in expected.items():
        if None in shape or shapes[name] != shape:
            letters = _STATE_SHAPES[name]
            N_kv, H_v = heads[1] if name.startswith("cross") else heads[0]
            raise ValueError(
                f"state[{name!r}] must have shape {letters} with L = {L} blocks, N_kv = {N_kv} "
                f"key/value heads and H = {H} (N = {N} heads (num_heads), N_kv read from the "
                f"parameters' W_k, H_v = {H_v} from W_v), got {shapes[name]} "
                f"(state['position'] {shapes['position']}, state['self_keys'] {self_shape}, "
                f"state['cross_keys'] {cross_shape})")
    for name in ("position", "src_valid_len"):
        if not is_integer_dtype(jnp.result_type(state[name])):
            raise ValueError(f"state[{name!r}] must hold integers, got dtype "
                             f"{jnp.result_type(state[name])} with shape {shapes[name]}")
    return B, M, S


def _write_cache(cache, new, position):
    """``cache (B, N_kv, M, H)`` with ``new (B, N_kv, 1, H)`` written at each row's ``position``."""
    def write(c, n, p):
        return lax.dynamic_update_slice(c, n, (jnp.zeros((), jnp.int32), p,
                                               jnp.zeros((), jnp.int32)))
    return jax.vmap(write)(cache, new, position)


def decoder_step(params, state, tokens, *, num_heads: int, max_positions: int = MAX_POSITIONS):
    """One incremental decoder step with the key/value cache (no dropout: decoding only).

    The token of each row gets ``P[position]``; each block projects it once, writes its key and
    value into the cache at ``position`` (``lax.dynamic_update_slice``, fixed shapes) and
    attends cache slots ``<= position`` — the causal self-attention of the full forward pass, so
    that the logits equal those of :func:`decoder` on the whole prefix.

    Positions: the token of step ``t`` gets ``P[t]``. (The book's 0.17 ``predict_seq2seq`` feeds
    one token at a time through ``PositionalEncoding``, which adds ``P[0]`` to every new token —
    a known bug that we do not reproduce.)

    Values follow the package's rule (:mod:`jax_attention.nn.masking`): ``tokens`` outside
    ``[0, V)`` and positions outside ``[0, M)`` (a step past the cache) raise ``ValueError`` when
    concrete; traced ones are clipped — tokens to ``[0, V - 1]``, positions to ``[0, M - 1]``
    (a step past the cache overwrites its last slot instead of writing nowhere).

    Args:
      params: the decoder's dict (keys checked as in :func:`init_decoder_state`). state: see
        :func:`init_decoder_state`. tokens: ``(B,)`` ids.

    Returns:
      ``(logits (B, V), state, weights)`` with ``weights = {"decoder_self": (L, B, N, M),
      "encoder_decoder": (L, B, N, S)}`` of this step (slots past ``position`` have weight 0).
    """
    L, D = check_stack(params, DECODER_KEYS, DECODER_BLOCK_KEYS, num_heads)
    B, M, S = _check_decoder_state(state, L, num_heads, cache_heads(params, L, num_heads),
                                   D // num_heads)
    tokens = check_tokens("tokens", tokens, jnp.shape(params["embedding"])[0], ndim=1, batch=B)
    check_positions("state['self_keys'] (the key/value cache)", M, max_positions,
                     jnp.shape(state["self_keys"]))
    check_values_in("state['position']", state["position"], 0, M - 1,
                     f"[0, M) = [0, {M}) (the cache's steps)")
    return cached_step(params, state, tokens, num_heads=num_heads, max_positions=max_positions)


def cached_step(params, state, tokens, *, num_heads: int, max_positions: int = MAX_POSITIONS):
    """:func:`decoder_step` of checked parameters, state and tokens: what the Transformer's
    decoding loops run under ``jit`` once their entry has checked the model."""
    L, M = len(params["blocks"]), state["self_keys"].shape[3]
    (self_heads, _), _ = cache_layout(params, num_heads)
    position = clip_values(state["position"], 0, M - 1)
    dtype = state["self_keys"].dtype
    X = embed(params, tokens, position, max_positions, dtype)[:, None, :]  # (B, 1, D)
    self_keep = (jnp.arange(M, dtype=jnp.int32).reshape(1, M) <= position.reshape(-1, 1))
    self_keep = self_keep[:, None, None, :]  # (B, 1, 1, M)
    cross_keep = lengths_keep(state["src_valid_len"], state["cross_keys"].shape[3])
    self_keys, self_values = [], []
    self_weights, cross_weights = [], []
    for i in range(L):
        block = params["blocks"][f"block_{i}"]
        q = project_one(block["self_attention"], X, "W_q", num_heads)
        k = _write_cache(state["self_keys"][:, i], project_one(block["self_attention"], X, "W_k",
                                                                 self_heads), position)
        v = _write_cache(state["self_values"][:, i], project_one(block["self_attention"], X,
                                                                   "W_v", self_heads), position)
        self_keys.append(k)
        self_values.append(v)
        heads, w_self = attend(q, k, v, self_keep, 0.0, None)
        Y = residual(block["addnorm_1"], X, project_out(block["self_attention"], heads), 0.0, None)
        q = project_one(block["cross_attention"], Y, "W_q", num_heads)
        heads, w_cross = attend(q, state["cross_keys"][:, i], state["cross_values"][:, i],
                                 cross_keep, 0.0, None)
        Z = residual(block["addnorm_2"], Y, project_out(block["cross_attention"], heads), 0.0,
                     None)
        X = residual(block["addnorm_3"], Z, ffn(block["ffn"], Z), 0.0, None)
        self_weights.append(w_self[:, :, 0])
        cross_weights.append(w_cross[:, :, 0])
    logits = dense(params["dense"], X[:, 0], "W", "b")
    new_state = dict(state, position=position + 1, self_keys=jnp.stack(self_keys, axis=1),
                     self_values=jnp.stack(self_values, axis=1))
    return logits, new_state, {"decoder_self": jnp.stack(self_weights),
                               "encoder_decoder": jnp.stack(cross_weights)}
