"""The Transformer's layers — d2l §11.7.2–3 (and §11.5's attention with dropout), in JAX.

The sublayers every block of :mod:`jax_attention.models.transformer` is made of: multi-head attention
with dropout on its weights (:func:`attention`; the book's has no biases, optional ones as
PyTorch's layers have), the position-wise
feed-forward network (:func:`position_wise_ffn`), layer normalisation and the residual
connection (:func:`layer_norm`, :func:`add_norm`), and the token embedding with its positions.
They open :mod:`reference_numpy.transformer`, which holds the same functions with the same names
and einsum strings; :mod:`jax_attention.models.transformer` (which re-exports them) continues it with the
blocks, the encoder and the decoder, and :mod:`jax_attention.models.transformer_cache` decodes with a
key/value cache from the same pieces.

Shape letters: ``B`` batch, ``T`` query length, ``S`` key length, ``N`` heads, ``H = D / N``,
``N_kv`` key/value heads (grouped-query attention; ``N`` in the book), ``D`` model width, ``F``
the FFN's hidden width.

Each attention's parameters are those :func:`jax_attention.nn.multihead.multi_head_attention`
takes, read from their shapes, so the functions take no argument for them: ``W_q``, ``W_o``
``(D, D)`` and ``W_k``, ``W_v`` ``(D, D)`` in the book; optional biases ``b_q, b_k, b_v, b_o``
(PyTorch's ``nn.TransformerEncoderLayer`` has them); grouped-query attention (Ainslie et al. 2023;
``N_kv = 1``: multi-query attention, Shazeer 2019) with ``W_k (D, N_kv H)``, ``N_kv`` read from
``W_k``'s width (:func:`kv_heads`), query head ``n`` attending with key/value head
``n // (N / N_kv)``; and a value head size of its own, ``W_v (D, N_kv H_v)``, ``W_o (N H_v, D)``.

Checked once, then computed. The public functions (``__all__``) check the parameter dicts they
are given (a missing or unexpected key, or a shape that does not fit, raises ``ValueError``
naming it by its path) and their inputs, build the masks, and call the sublayers on checked
inputs — :func:`ffn`, :func:`normalise`, :func:`residual`, :func:`sublayer_attention` — which
check nothing again; :mod:`jax_attention.models.transformer` and
:mod:`jax_attention.models.transformer_cache` do the same one level up, so that a model's
parameters are checked once per call (:func:`check_model`, :func:`check_stack`,
:func:`check_block`), not at every level they pass through. The other helpers without an
underscore (:func:`dense`, :func:`check_width`, :func:`project_one`, :func:`project_out`,
:func:`kv_heads`, :func:`attend`, :func:`embed`, :func:`lengths_keep`, :func:`num_blocks`,
:func:`fold_rng`, :func:`steps_padded`, :func:`init_flat`, the parameter layout and the
``*_KEYS`` of the parameter dicts) are the building blocks the Transformer modules share.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from jax_attention._checks import (
    KeySet,
    check_attention_inputs,
    check_bool,
    check_dropout,
    check_num_heads,
    check_num_kv_heads,
    check_numbered,
    check_param_keys,
    check_param_shapes,
    check_size,
)
from jax_attention.nn.masking import attention_mask
from jax_attention.nn.multihead import (
    BIAS_KEYS,
    KERNEL_KEYS,
    assemble_heads,
    dense,
    from_heads,
    to_heads,
)
from jax_attention.nn.positional import positional_encoding
from jax_attention.nn.precision import compute_dtype
from jax_attention.params import flatten_params, unflatten_params
from jax_attention.models.seq2seq_module import ParamTree
from jax_attention.nn.scoring import dropout_attention
from jax_attention.nn.dropout import dropout as _dropout
from jax_attention.nn.dropout import fold

__all__ = ["MAX_POSITIONS", "LAYER_NORM_EPS", "param_shapes", "init_params", "position_wise_ffn",
           "layer_norm", "add_norm", "attention", "PositionWiseFFN", "AddNorm"]

#: The book's ``PositionalEncoding(max_len=1000)``: the rows of the position table.
MAX_POSITIONS = 1000
#: The ``eps`` added to the variance in :func:`layer_norm`: PyTorch's ``nn.LayerNorm`` default,
#: which the book's ``AddNorm`` uses.
LAYER_NORM_EPS = 1e-5

# The keys of the parameter dicts (the structure of jax_attention.models.transformer.param_shapes), for
# check_param_keys: a key maps to the keys of the dict under it. Same names in the NumPy file.
ATTENTION_KEYS = KeySet(KERNEL_KEYS, BIAS_KEYS)  # the book's bias=False: no biases
FFN_KEYS = ("W_1", "b_1", "W_2", "b_2")
NORM_KEYS = ("gamma", "beta")
ENCODER_BLOCK_KEYS = {"attention": ATTENTION_KEYS, "addnorm_1": NORM_KEYS, "ffn": FFN_KEYS,
                      "addnorm_2": NORM_KEYS}
DECODER_BLOCK_KEYS = {"self_attention": ATTENTION_KEYS, "addnorm_1": NORM_KEYS,
                      "cross_attention": ATTENTION_KEYS, "addnorm_2": NORM_KEYS, "ffn": FFN_KEYS,
                      "addnorm_3": NORM_KEYS}
ENCODER_KEYS = {"embedding": None, "blocks": None}
DECODER_KEYS = {"embedding": None, "blocks": None, "dense": ("W", "b")}
MODEL_KEYS = ("encoder", "decoder")


def fold_rng(dropout_rng, index: int):
    """The key of part ``index`` of a layer (:func:`jax_attention.nn.dropout.fold`), or ``None``
    without dropout."""
    return None if dropout_rng is None else fold(dropout_rng, index)


def check_width(name: str, X, D: int, what: str = "(B, T, D)"):
    """``X`` as an array of shape ``what`` (``"(..., D)"``: any rank ``>= 1``) whose last axis is
    the model width ``D``."""
    X = jnp.asarray(X)
    rank_ok = X.ndim >= 1 if what.startswith("(...") else X.ndim == what.count(",") + 1
    if not rank_ok or X.shape[-1] != D:
        raise ValueError(f"{name} must have shape {what} with D = {D} (the parameters' width), "
                         f"got {X.shape}")
    return X


def position_wise_ffn(params, X):
    """The position-wise feed-forward network — d2l §11.7.2: ``relu(X W_1 + b_1) W_2 + b_2``.

    Args:
      params: ``{"W_1": (D, F), "b_1": (F,), "W_2": (F, D), "b_2": (D,)}``, these keys exactly.
      X: ``(B, T, D)`` (any leading axes ``(..., D)``).

    Returns:
      ``(B, T, D)``.
    """
    check_param_keys("params", params, FFN_KEYS)
    D = check_ffn(params)
    return ffn(params, check_width("X", X, D, "(..., D)"))


def layer_norm(params, X, eps: float = LAYER_NORM_EPS):
    """Layer normalisation over the last axis (``nn.LayerNorm(D)``, biased variance, eps ``1e-5``).

    Args:
      params: ``{"gamma": (D,), "beta": (D,)}``, these keys exactly. X: ``(..., D)`` with
        ``D >= 1``.
    """
    check_param_keys("params", params, NORM_KEYS)
    return normalise(params, _checked_norm_input(params, X), eps)


def add_norm(params, X, Y, *, dropout: float = 0.0, dropout_rng=None):
    """Residual connection and layer normalisation — d2l §11.7.3: ``LayerNorm(dropout(Y) + X)``.

    Args:
      params: ``{"gamma", "beta"}``. X: the residual ``(B, T, D)``. Y: the sublayer's output,
        of ``X``'s shape.
      dropout, dropout_rng: the rate and a key (``None``: no dropout).
    """
    X, Y = jnp.asarray(X), jnp.asarray(Y)
    if X.shape != Y.shape:
        raise ValueError(f"X (the residual) and Y (the sublayer's output) must have the same "
                         f"shape, got X {X.shape} and Y {Y.shape}")
    check_param_keys("params", params, NORM_KEYS)
    X = _checked_norm_input(params, X)
    return residual(params, X, Y, check_dropout(dropout), dropout_rng)


def _checked_norm_input(params, X):
    """``X`` ``(..., D)`` checked against the norm's ``{"gamma", "beta"}`` of width ``D >= 1``."""
    D = check_norm(params)
    X = check_width("X", X, D, "(..., D)")
    if D == 0:
        # The mean and variance of no feature are 0 / 0.
        raise ValueError(f"X must have shape (..., D) with D >= 1, got {X.shape}")
    return X


# The sublayers on checked inputs: what the blocks, the encoder, the decoder and the cache call
# once their public entry has checked the parameters, the inputs and built the masks.


def ffn(params, X):
    """:func:`position_wise_ffn` of checked ``params`` and ``X``."""
    return dense(params, jax.nn.relu(dense(params, X, "W_1", "b_1")), "W_2", "b_2")


def normalise(params, X, eps: float = LAYER_NORM_EPS):
    """:func:`layer_norm` of checked ``params`` and ``X``; a half-precision ``X`` is normalised
    in float32 and the result rounded back (:mod:`jax_attention.nn.precision`)."""
    dtype = X.dtype
    X = X.astype(compute_dtype(dtype))
    mean = jnp.mean(X, axis=-1, keepdims=True)
    variance = jnp.mean(jnp.square(X - mean), axis=-1, keepdims=True)
    shape = (1,) * (X.ndim - 1) + (X.shape[-1],)
    gamma = jnp.asarray(params["gamma"]).astype(X.dtype).reshape(shape)
    beta = jnp.asarray(params["beta"]).astype(X.dtype).reshape(shape)
    return ((X - mean) / jnp.sqrt(variance + eps) * gamma + beta).astype(dtype)


def steps_padded(shape, num_steps: int | None, num_axes: int):
    """``shape`` with its last ``num_axes`` sequence axes (before the features' when
    ``num_axes = 1``: ``(..., T, D)``; the last two for weights ``(..., T, S)``) at
    ``num_steps``: the shape of the full-length batch a cut one draws its dropout masks from
    (:func:`jax_attention.nn.dropout.keep_mask`); ``None`` without ``num_steps``."""
    if num_steps is None:
        return None
    shape = tuple(shape)
    if num_axes == 1:
        return shape[:-2] + (num_steps, shape[-1])
    return shape[:-2] + (num_steps, num_steps)


def residual(params, X, Y, dropout: float, dropout_rng, num_steps: int | None = None):
    """:func:`add_norm` of checked ``params``, ``X`` and ``Y`` and a checked rate; the dropout
    mask of ``Y`` ``(B, T, D)`` is drawn within ``(B, num_steps, D)`` (:func:`steps_padded`)."""
    padded = steps_padded(jnp.shape(Y), num_steps, 1)
    return normalise(params, _dropout(Y, dropout, dropout_rng, padded) + X)


def sublayer_attention(params, queries, keys_values, keep, *, num_heads: int, dropout: float,
                       dropout_rng, num_steps: int | None = None):
    """:func:`attention` of checked ``params`` and inputs, under the mask ``keep`` broadcastable
    to ``(B, N, T, S)`` (built once for all the blocks that share it) or ``None``; the weights'
    dropout mask drawn within ``(B, N, num_steps, num_steps)`` (:func:`steps_padded`)."""
    num_kv_heads = jnp.shape(params["W_k"])[-1] * num_heads // jnp.shape(params["W_q"])[-1]

    def with_dropout(heads_q, heads_k, heads_v, keep, bias):  # the Transformer takes no bias
        return attend(heads_q, heads_k, heads_v, keep, dropout, dropout_rng, num_steps)

    return assemble_heads(params, queries, keys_values, keys_values, keep, with_dropout,
                          num_heads=num_heads, num_kv_heads=num_kv_heads)


# The checks of the parameter dicts, shapes against the model width D: the public functions run
# them once, at their entry, for every block they are given.


def check_ffn(params, name: str = "params", D=None) -> int:
    """The FFN's ``{"W_1": (D, F), "b_1": (F,), "W_2": (F, D), "b_2": (D,)}`` shapes (``D`` read
    from ``W_1`` unless given); returns ``D``."""
    check_param_shapes(name, params, {"W_1": ("D" if D is None else D, "F")})
    D, F = jnp.shape(params["W_1"])
    check_param_shapes(name, params, {"b_1": (F,), "W_2": (F, D), "b_2": (D,)})
    return D


def check_norm(params, name: str = "params", D=None) -> int:
    """The norm's ``{"gamma": (D,), "beta": (D,)}`` shapes (``D`` read from ``gamma`` unless
    given); returns ``D``."""
    check_param_shapes(name, params, {"gamma": ("D" if D is None else D,)})
    D = jnp.shape(params["gamma"])[0]
    check_param_shapes(name, params, {"beta": (D,)})
    return D


def check_attention(params, D: int, num_heads: int, name: str = "params") -> int:
    """An attention's parameters for the model width ``D``: ``W_q (D, N H)``, ``W_k (D, N_kv H)``
    (:func:`kv_heads`), ``W_v (D, N_kv H_v)``, ``W_o (N H_v, D)`` (back to ``D``, for the
    residual) and the biases of those widths; returns ``N_kv``."""
    N_kv = kv_heads(params, num_heads, name)
    inner, width_v = jnp.shape(params["W_q"])[-1], jnp.shape(params["W_v"])[-1]
    H, H_v = inner // num_heads, width_v // N_kv
    check_param_shapes(name, params, {
        "W_q": (D, inner), "W_k": (D, N_kv * H), "W_v": (D, width_v), "W_o": (num_heads * H_v, D),
        "b_q": (inner,), "b_k": (N_kv * H,), "b_v": (width_v,), "b_o": (D,)},
        f" (D = {D}, N = {num_heads} heads of H = {H}, N_kv = {N_kv} key/value heads, "
        f"H_v = {H_v})")
    return N_kv


def check_block(params, keys: dict, num_heads: int, name: str = "params", D=None) -> int:
    """An encoder's or decoder's block (``keys``: :data:`ENCODER_BLOCK_KEYS` or
    :data:`DECODER_BLOCK_KEYS`): its keys and every sublayer's shapes for the model width ``D``
    (``None``: its first attention's ``W_q`` rows); returns ``D``."""
    check_param_keys(name, params, keys)
    if D is None:
        D = jnp.shape(params[next(iter(keys))]["W_q"])[0]
    for key, sublayer in keys.items():
        path = f"{name}[{key!r}]"
        if sublayer is ATTENTION_KEYS:
            check_attention(params[key], D, num_heads, path)
        elif sublayer is FFN_KEYS:
            check_ffn(params[key], path, D)
        else:
            check_norm(params[key], path, D)
    return D


def project_one(params, X, name: str, num_heads: int):
    """``X W_name + b_name`` (no bias when ``params`` has none) split into heads:
    ``(B, T, D) -> (B, N, T, H)`` (``num_heads`` = ``N_kv`` for ``W_k`` and ``W_v``:
    ``(B, N_kv, T, H)``, ``H_v`` for ``W_v``)."""
    return to_heads(dense(params, X, name, "b" + name[1:]), num_heads)


def project_out(params, heads):
    """The heads ``(B, N, T, H_v)`` merged and projected by ``W_o`` (and ``b_o`` when
    ``params`` has it): ``(B, T, D)``, the counterpart of :func:`project_one`."""
    return dense(params, from_heads(heads), "W_o", "b_o")


def kv_heads(params, num_heads: int, name: str = "params") -> int:
    """``N_kv``, the key/value heads of an attention's ``params``: ``W_k``'s width over
    ``H = D / N`` (``D`` = ``W_q``'s width), a divisor of ``num_heads``; ``W_v`` must hold
    ``N_kv`` value heads (of ``H`` in the book, or a size ``H_v`` of their own).
    ``ValueError`` naming ``name`` and the shapes otherwise."""
    D = jnp.shape(params["W_q"])[-1]
    check_num_heads(D, num_heads, f"D from {name}['W_q'] of shape {jnp.shape(params['W_q'])}")
    H, width = D // num_heads, jnp.shape(params["W_k"])[-1]
    if width % H or not width or jnp.shape(params["W_v"])[-1] % (width // H):
        raise ValueError(f"{name}['W_k'] and {name}['W_v'] must be (D, N_kv * H) and "
                         f"(D, N_kv * H_v) with H = D / N = {H} (N = {num_heads} heads), got "
                         f"{jnp.shape(params['W_k'])} and {jnp.shape(params['W_v'])}")
    try:
        return check_num_kv_heads(num_heads, width // H)
    except ValueError as error:
        raise ValueError(f"{name}['W_k'] of shape {jnp.shape(params['W_k'])} holds "
                         f"{width // H} key/value heads of H = {H}: {error}") from None


def attend(heads_q, heads_k, heads_v, keep, dropout: float, dropout_rng,
           num_steps: int | None = None):
    """Scaled dot-product attention of projected heads; dropout acts on the weights only.

    ``heads_q (B, N, T, H)``; ``heads_k``, ``heads_v`` ``(B, N_kv, S, H)`` with ``N_kv``
    dividing ``N`` (grouped-query attention: each key/value head serves ``N / N_kv`` query heads,
    never repeated in memory). Returns ``(output (B, N, T, H), weights (B, N, T, S))``.

    :func:`jax_attention.nn.scoring.dropout_attention`, the attention core with the dropout mask
    (none in evaluation), forward and reverse mode. ``num_steps``: the dropout mask is drawn
    within ``(B, N, num_steps, num_steps)``."""
    padded = steps_padded(heads_q.shape[:-1] + heads_k.shape[-2:-1], num_steps, 2)
    return dropout_attention(heads_q, heads_k, heads_v, keep, dropout, dropout_rng, padded)


def attention(params, queries, keys_values, valid_lens=None, *, num_heads: int,
              is_causal: bool = False, dropout: float = 0.0, dropout_rng=None):
    """Multi-head attention of the Transformer with dropout on its weights — d2l §11.5.

    :func:`jax_attention.nn.multihead.multi_head_attention` on ``(queries, keys_values,
    keys_values)`` — the same assembly (:func:`~jax_attention.nn.multihead.assemble_heads`) and
    parameters — plus the book's dropout on the attention weights (:func:`attend`).

    Args:
      params: ``{"W_q", "W_k", "W_v", "W_o"}`` and optionally ``{"b_q", "b_k", "b_v", "b_o"}``:
        ``W_q (D, D)``, ``W_k (D, N_kv H)``, ``W_v (D, N_kv H_v)``, ``W_o (N H_v, D)``, biases of
        those widths (the book: all ``(D, D)``, no biases).
      queries: ``(B, T, D)``. keys_values: ``(B, S, D)``.
      valid_lens: ``None``, ``(B,)`` or ``(B, T)``.
      num_heads: ``N``. is_causal: add the causal mask (a Python bool).
      dropout, dropout_rng: on the weights (``None``: no dropout).

    Returns:
      ``(output (B, T, D), weights (B, N, T, S))``; the weights are those before dropout.
    """
    check_param_keys("params", params, ATTENTION_KEYS)
    D = jnp.shape(params["W_q"])[0]
    check_attention(params, D, num_heads)
    queries = check_width("queries", queries, D)
    keys_values = check_width("keys_values", keys_values, D, "(B, S, D)")
    queries, keys_values = check_attention_inputs(queries, keys_values, same_depth=False)
    keep = attention_mask((queries.shape[0], num_heads, queries.shape[1], keys_values.shape[1]),
                          valid_lens, is_causal=is_causal)
    return sublayer_attention(params, queries, keys_values, keep, num_heads=num_heads,
                              dropout=check_dropout(dropout), dropout_rng=dropout_rng)


def num_blocks(blocks) -> int:
    """The number of blocks of ``{"block_0": ..., "block_{L-1}": ...}``, checked."""
    return check_numbered("blocks", blocks, "block")


def lengths_keep(lengths, S: int):
    """The padding mask ``(B, 1, 1, S)`` of checked int32 lengths ``(B,)``: key ``s < lengths[b]``
    (traced lengths outside ``[0, S]`` act as clipped), for every head and query."""
    return (jnp.arange(S, dtype=jnp.int32).reshape(1, S) < lengths.reshape(-1, 1))[:, None, None, :]


def check_stack(params, keys: dict, block_keys: dict, num_heads: int,
                name: str = "params") -> tuple[int, int]:
    """An encoder's or decoder's dict, once for all its blocks: its keys (``keys``), the embedding
    ``(V, D)``, then each block's keys and shapes (:func:`check_block`; a decoder's output dense
    ``W (D, V_out)``, ``b (V_out,)`` too), named by their path from ``name``. Returns
    ``(L, D)``, the number of blocks and the model width. Shapes only: no array is read."""
    check_param_keys(name, params, keys)
    check_param_shapes(name, params, {"embedding": ("V", "D")})
    D = jnp.shape(params["embedding"])[1]
    L = num_blocks(params["blocks"])
    for i in range(L):
        check_block(params["blocks"][f"block_{i}"], block_keys, num_heads,
                    f"{name}['blocks']['block_{i}']", D)
    if "dense" in keys:
        check_param_shapes(f"{name}['dense']", params["dense"], {"W": (D, "V")})
        check_param_shapes(f"{name}['dense']", params["dense"],
                           {"b": (jnp.shape(params["dense"]["W"])[1],)})
    return L, D


def check_model(params, num_heads: int) -> None:
    """The whole model's dict ``{"encoder", "decoder"}``: every nested key and every shape
    (:func:`check_stack`), named by its path; both stacks of one width ``D``."""
    check_param_keys("params", params, MODEL_KEYS)
    _, D = check_stack(params["encoder"], ENCODER_KEYS, ENCODER_BLOCK_KEYS, num_heads,
                       "params['encoder']")
    _, D_dec = check_stack(params["decoder"], DECODER_KEYS, DECODER_BLOCK_KEYS, num_heads,
                           "params['decoder']")
    if D_dec != D:
        raise ValueError(f"params['decoder'] has the width D = {D_dec} and params['encoder'] "
                         f"D = {D}: the decoder attends the encoder's outputs")


def embed(params, tokens, offset_positions, max_positions: int, dtype):
    """``embedding[tokens] * sqrt(D) + P[positions]`` (d2l: the embedding scaled before adding P),
    in ``dtype``: the rows are looked up in the table's dtype, then cast."""
    embedding = jnp.asarray(params["embedding"])
    D = embedding.shape[1]
    P = positional_encoding(max_positions, D, dtype=dtype)
    positional = P[offset_positions]
    positional = positional.reshape((1,) * (tokens.ndim + 1 - positional.ndim) + positional.shape)
    return embedding[tokens].astype(dtype) * math.sqrt(D) + positional


# --------------------------------------------------------------------------- parameters


def attention_shapes(D: int, num_heads=None, num_kv_heads=None, value_head_size=None,
                     bias: bool = False) -> dict:
    """One attention's parameter shapes, checked: ``W_q (D, D)``, ``W_k (D, N_kv H)``,
    ``W_v (D, N_kv H_v)``, ``W_o (N H_v, D)`` and, with ``bias``, ``b_q (D,)``, ``b_k (N_kv H,)``,
    ``b_v (N_kv H_v,)``, ``b_o (D,)``. Without ``num_heads`` the shapes cannot depend on the
    heads: the book's four ``(D, D)`` kernels (grouping or a value head size need it)."""
    if num_heads is None:
        if num_kv_heads is not None or value_head_size is not None:
            raise ValueError("num_heads must be given with num_kv_heads or value_head_size (the "
                             "widths of W_k, W_v and W_o are counted in heads)")
        num_heads = 1
    else:
        check_num_heads(D, num_heads)
    N_kv = check_num_kv_heads(num_heads, num_kv_heads)
    H = D // num_heads
    H_v = H if value_head_size is None else check_size("value_head_size", value_head_size)
    shapes = {"W_q": (D, D), "W_k": (D, N_kv * H), "W_v": (D, N_kv * H_v),
              "W_o": (num_heads * H_v, D)}
    if check_bool("bias", bias):
        shapes.update({"b_q": (D,), "b_k": (N_kv * H,), "b_v": (N_kv * H_v,), "b_o": (D,)})
    return shapes


def ffn_shapes(D: int, F: int) -> dict:
    return {"W_1": (D, F), "b_1": (F,), "W_2": (F, D), "b_2": (D,)}


def norm_shapes(D: int) -> dict:
    return {"gamma": (D,), "beta": (D,)}


def encoder_block_shapes(D: int, F: int, attention: dict) -> dict:
    return {"attention": attention, "addnorm_1": norm_shapes(D), "ffn": ffn_shapes(D, F),
            "addnorm_2": norm_shapes(D)}


def decoder_block_shapes(D: int, F: int, attention: dict) -> dict:
    return {"self_attention": attention, "addnorm_1": norm_shapes(D),
            "cross_attention": attention, "addnorm_2": norm_shapes(D), "ffn": ffn_shapes(D, F),
            "addnorm_3": norm_shapes(D)}


def param_shapes(src_vocab_size: int, tgt_vocab_size: int, num_hiddens: int,
                 ffn_num_hiddens: int, num_layers: int, *, num_heads: int | None = None,
                 num_kv_heads: int | None = None, value_head_size: int | None = None,
                 bias: bool = False) -> dict:
    """The nested dict of parameter shapes (the structure every params dict must have).

    Args:
      src_vocab_size, tgt_vocab_size, num_hiddens, ffn_num_hiddens, num_layers: the sizes.
      num_heads, num_kv_heads: ``N`` and ``N_kv`` (dividing ``N``): grouped-query attention
        gives every attention ``W_k``, ``W_v`` of shape ``(D, N_kv H)``, ``H = D / N``. Both
        ``None`` (or ``N_kv = N``): the book's ``(D, D)``.
      value_head_size: ``H_v``, each head's value size (needs ``num_heads``): ``W_v`` becomes
        ``(D, N_kv H_v)`` and ``W_o`` ``(N H_v, D)``; ``None``: ``H``.
      bias: every attention also has ``b_q (D,)``, ``b_k (N_kv H,)``, ``b_v (N_kv H_v,)`` and
        ``b_o (D,)``, as PyTorch's ``nn.TransformerEncoderLayer``; the book's has none.

    Returns:
      ``{"encoder": {"embedding": (V_src, D), "blocks": {"block_l": {"attention": {W_q, W_k,
      W_v, W_o}, "addnorm_1": {gamma, beta}, "ffn": {W_1, b_1, W_2, b_2}, "addnorm_2"}}},
      "decoder": {"embedding": (V_tgt, D), "blocks": {"block_l": {"self_attention",
      "addnorm_1", "cross_attention", "addnorm_2", "ffn", "addnorm_3"}}, "dense": {"W": (D, V),
      "b": (V,)}}}`` with shape tuples as leaves.
    """
    V_src, V_tgt, D, F, L = (check_size(name, value) for name, value in (
        ("src_vocab_size", src_vocab_size), ("tgt_vocab_size", tgt_vocab_size),
        ("num_hiddens", num_hiddens), ("ffn_num_hiddens", ffn_num_hiddens),
        ("num_layers", num_layers)))
    # The shapes depend on the heads only with grouping or a value head size; num_heads alone is
    # checked all the same.
    attention = attention_shapes(D, num_heads, num_kv_heads, value_head_size, bias)
    return {
        "encoder": {"embedding": (V_src, D),
                    "blocks": {f"block_{i}": encoder_block_shapes(D, F, attention)
                               for i in range(L)}},
        "decoder": {"embedding": (V_tgt, D),
                    "blocks": {f"block_{i}": decoder_block_shapes(D, F, attention)
                               for i in range(L)},
                    "dense": {"W": (D, V_tgt), "b": (V_tgt,)}},
    }


def init_params(rng, src_vocab_size: int, tgt_vocab_size: int, num_hiddens: int = 32,
                ffn_num_hiddens: int = 64, num_heads: int = 4, num_layers: int = 2, *,
                num_kv_heads: int | None = None, value_head_size: int | None = None,
                bias: bool = False, param_dtype=jnp.float32) -> dict:
    """Fresh parameters, initialised as the book's model (see the module docstring).

    Args:
      rng: a ``jax.random`` key.
      src_vocab_size, tgt_vocab_size, num_hiddens, ffn_num_hiddens, num_layers: the sizes
        (the book: D = 32, F = 64, L = 2).
      num_heads: ``N``; checked to divide ``num_hiddens``.
      num_kv_heads: ``N_kv``, dividing ``N`` (grouped-query attention, ``W_k``, ``W_v`` of
        shape ``(D, N_kv D / N)``); ``None``: ``N``, the book's parameters.
      value_head_size, bias: see :func:`param_shapes` (attention biases start at zero, as in
        PyTorch's ``nn.MultiheadAttention``).
      param_dtype: the parameters' dtype.

    Returns:
      The nested dict of :func:`param_shapes`, with arrays as leaves.
    """
    shapes = param_shapes(src_vocab_size, tgt_vocab_size, num_hiddens, ffn_num_hiddens,
                          num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
                          value_head_size=value_head_size, bias=bias)
    return unflatten_params(init_flat(rng, flatten_params(shapes), param_dtype))


# --------------------------------------------------------------------------- initialisation

# Leaves that start at zero: LayerNorm's beta and the attention biases (nn.MultiheadAttention's).
_ZERO_LEAVES = ("beta", "b_q", "b_k", "b_v", "b_o")
# A bias's fan-in is its kernel's input size: b_1 <- W_1, b_2 <- W_2, b <- W.
_BIAS_KERNEL = {"b_1": "W_1", "b_2": "W_2", "b": "W"}


@functools.partial(jax.jit, static_argnames=("spec", "dtype"))
def _init_leaves(rng, spec: tuple, dtype) -> tuple:
    """Initial values of the leaves ``spec = ((name, shape, fan_in), ...)``, chosen by name.

    One uniform draw on ``(-1, 1)`` serves every random leaf, each taking its own slice (one
    compilation of the generator instead of one per leaf):

    * ``embedding``: ``N(0, 1)`` (``nn.Embedding``), as ``sqrt(2) erfinv(u)``;
    * ``gamma``: ones, ``beta``: zeros (``nn.LayerNorm``); attention biases ``b_q, b_k, b_v,
      b_o``: zeros (``nn.MultiheadAttention``);
    * biases ``b_1``, ``b_2``, ``b``: ``U(-1/sqrt(in), 1/sqrt(in))`` (``nn.Linear``'s default);
    * kernels ``(in, out)``: Xavier-uniform ``U(-a, a)``, ``a = sqrt(6 / (in + out))``.
    """
    sizes = [math.prod(shape) for _, shape, _ in spec]
    uniform = jax.random.uniform(rng, (sum(sizes),), dtype, jnp.nextafter(
        jnp.asarray(-1.0, dtype), jnp.asarray(1.0, dtype)), 1.0)
    values, start = [], 0
    for (name, shape, fan_in), size in zip(spec, sizes):
        u = uniform[start:start + size].reshape(shape)
        start += size
        if name == "embedding":
            values.append(jnp.sqrt(jnp.asarray(2.0, dtype)) * lax.erf_inv(u))
        elif name == "gamma":
            values.append(jnp.ones(shape, dtype))
        elif name in _ZERO_LEAVES:
            values.append(jnp.zeros(shape, dtype))
        elif name in _BIAS_KERNEL:
            values.append(u * (1.0 / math.sqrt(fan_in)))
        else:
            values.append(u * math.sqrt(6.0 / (shape[0] + shape[1])))
    return tuple(values)


def init_flat(rng, shapes: dict, dtype) -> dict:
    """``{"a/b/W_1": shape, ...}`` -> ``{"a/b/W_1": initial value, ...}``: the book's
    initialisation (:func:`_init_leaves`), chosen by each leaf's name, one compiled draw."""
    spec = []
    for path, shape in shapes.items():
        prefix, _, name = path.rpartition("/")
        fan_in = 0
        if name in _BIAS_KERNEL:
            kernel = f"{prefix}/{_BIAS_KERNEL[name]}" if prefix else _BIAS_KERNEL[name]
            fan_in = shapes[kernel][0]
        spec.append((name, tuple(shape), fan_in))
    values = _init_leaves(rng, tuple(spec), jnp.dtype(dtype))
    return dict(zip(shapes, values))


# --------------------------------------------------------------------------- NNX modules


def initial_flat(values, shapes: dict, param_dtype, rngs: nnx.Rngs) -> dict:
    """``values`` (a nested dict of a module's structure) flattened and checked, or fresh ones
    (one draw from ``rngs.params()``), keyed by ``/``-joined paths: the NNX modules' initial
    parameters. Not in ``__all__``."""
    if values is None:
        return init_flat(rngs.params(), flatten_params(shapes), param_dtype)
    flat = {path: jnp.asarray(value, param_dtype) for path, value in flatten_params(values).items()}
    expected = {path: tuple(shape) for path, shape in flatten_params(shapes).items()}
    got = {path: value.shape for path, value in flat.items()}
    if got != expected:
        raise ValueError(f"params must have the shapes {expected}, got {got}")
    return flat


class PositionWiseFFN(ParamTree):
    """``relu(X W_1 + b_1) W_2 + b_2`` — d2l §11.7.2; calls :func:`position_wise_ffn` (re-exported by
    :mod:`jax_attention.models.transformer`)."""

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int, *, param_dtype=jnp.float32,
                 rngs: nnx.Rngs):
        self.hold(initial_flat(None, ffn_shapes(check_size("num_hiddens", num_hiddens),
                                             check_size("ffn_num_hiddens", ffn_num_hiddens)),
                           param_dtype, rngs))

    def __call__(self, X):
        return position_wise_ffn(self.params_dict(), X)


class AddNorm(ParamTree):
    """``LayerNorm(dropout(Y) + X)`` — d2l §11.7.3; calls :func:`add_norm`."""

    def __init__(self, num_hiddens: int, *, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.hold(initial_flat(None, norm_shapes(check_size("num_hiddens", num_hiddens)),
                           param_dtype, rngs))

    def __call__(self, X, Y, *, dropout: float = 0.0, dropout_rng=None):
        return add_norm(self.params_dict(), X, Y, dropout=dropout, dropout_rng=dropout_rng)
