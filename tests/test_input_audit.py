"""Input audit (issue 8, reliability): every public function and module of both packages, one
test per rule.

Rules (the keys of :data:`RULES`), and what the library does:

* ``rank``, ``batch``, ``length``, ``depth``, ``dtype``, ``heads``, ``positions``, ``sizes``:
  static — decided from shapes, dtypes and Python arguments, so the same ``ValueError`` or
  ``TypeError`` is raised eagerly, under ``jax.jit`` and under ``jax.vmap``; the NumPy function of
  the same name raises the same type naming the same argument.
* ``lens`` (valid lengths) and ``ids`` (token ids, table indices, decoding positions): values.
  NumPy always raises ``ValueError``. JAX raises the same error whenever the values are concrete
  (eager calls); traced values (under ``jit``/``vmap``) are clipped into their range — lengths to
  ``[0, S]``, ids to ``[0, V - 1]`` — with a finite result, never the NaN of an out-of-bounds
  ``jnp.take`` nor the wrap-around of a negative index (:mod:`jax_attention.nn.masking` documents the
  rule; :data:`TRACED` tests it). A non-integer dtype is always an error.
* ``empty``: ``B``, ``T`` or ``S`` of size 0 give empty results of the right shape, and ``S = 0``
  the zero output of a fully masked row, the same in both packages (:data:`EMPTY`); where an
  empty input has no meaning (a table of no position, leave-one-out of one point, beam search
  over no example) it is a clear error.

The inventory, :data:`INVENTORY`, lists every public name (``__all__``) of the audited modules
of both packages with the rules that apply to it; :func:`test_inventory_is_complete` fails when a
public name is added without being audited, and :func:`test_every_rule_of_the_inventory_is_tested`
when a listed rule has no case. Every error case asserts the exception type, that the message
names the argument and that it contains the shapes involved.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_attention.nn import attention_pooling as j_pool
from jax_attention.models import bahdanau as j_bahdanau
from jax_attention.models import decoding as j_decoding
from jax_attention.nn import efficient as j_efficient
from jax_attention.nn import masking as j_masking
from jax_attention.models import metrics as j_metrics
from jax_attention.nn import multihead as j_multihead
from jax_attention.nn import positional as j_positional
from jax_attention.nn import scoring as j_scoring
from jax_attention.models import transformer as j_transformer
from reference_numpy import attention_pooling as n_pool
from reference_numpy import bahdanau as n_bahdanau
from reference_numpy import masking as n_masking
from reference_numpy import multihead as n_multihead
from reference_numpy import positional as n_positional
from reference_numpy import scoring as n_scoring
from reference_numpy import transformer as n_transformer

JAX_MODULES = {"masking": j_masking, "scoring": j_scoring, "attention_pooling": j_pool,
               "multihead": j_multihead, "positional": j_positional, "transformer": j_transformer,
               "bahdanau": j_bahdanau, "efficient": j_efficient, "decoding": j_decoding,
               "metrics": j_metrics}
NUMPY_MODULES = {"masking": n_masking, "scoring": n_scoring, "attention_pooling": n_pool,
                 "multihead": n_multihead, "positional": n_positional,
                 "transformer": n_transformer, "bahdanau": n_bahdanau}

RULES = {
    "rank": "an array argument of the wrong rank",
    "batch": "mismatched batch B between arguments",
    "length": "mismatched length (T, S, K) between arguments",
    "depth": "mismatched width: query/key size, model width D against the parameters",
    "dtype": "wrong dtype: non-integer lengths or ids, non-boolean masks, non-numeric arrays",
    "lens": "valid lengths out of range",
    "ids": "token ids, table indices or decoding positions out of range",
    "empty": "empty sequences: B, T or S of size 0",
    "heads": "widths not divisible by heads; odd widths where pairs are rotated",
    "positions": "sequences longer than positional tables",
    "sizes": "static sizes and rates out of range (widths, vocabularies, max_len, dropout)",
}
STATIC_RULES = {"rank", "batch", "length", "depth", "dtype", "heads", "positions"}

# Shape letters of the tiny inputs below.
B, T, S, Q, K, V, D, N, F, H_GRU, E, L_GRU = 2, 3, 5, 4, 4, 6, 8, 2, 12, 6, 4, 2
VOCAB = 7

# --------------------------------------------------------------------------- the inventory

# Every public name of the audited modules, with the rules that apply (a string says why none).
INVENTORY = {
    "masking.sequence_mask": ("rank", "batch", "dtype", "lens", "empty"),
    "masking.valid_lens_mask": ("rank", "length", "dtype", "lens", "sizes", "empty"),
    "masking.causal_mask": ("dtype", "sizes", "empty"),
    "masking.local_window_mask": ("dtype", "sizes", "empty"),
    "masking.combine_masks": ("length", "dtype", "empty"),
    "masking.attention_mask": ("rank", "batch", "dtype", "lens", "empty"),
    "masking.masked_softmax": ("rank", "batch", "length", "dtype", "lens", "empty"),
    "masking.masked_fill_value": ("dtype",),
    "scoring.dot_product_attention_weights": ("rank", "batch", "depth", "lens", "empty"),
    "scoring.dot_product_attention": ("rank", "batch", "length", "depth", "dtype", "lens",
                                      "empty"),
    "scoring.additive_attention_weights": ("rank", "depth", "lens", "empty"),
    "scoring.additive_attention": ("rank", "batch", "length", "depth", "lens", "empty"),
    "scoring.DotProductAttention": ("rank", "sizes", "empty"),
    "scoring.AdditiveAttention": ("depth", "sizes", "empty"),
    "attention_pooling.leave_one_out": ("rank", "empty"),
    "attention_pooling.average_pooling": ("rank", "batch", "length", "dtype", "empty"),
    "attention_pooling.nadaraya_watson_weights": ("rank", "batch", "dtype", "empty"),
    "attention_pooling.nadaraya_watson": ("batch", "length", "dtype", "empty"),
    "attention_pooling.kernel_regression_data": ("sizes",),
    "attention_pooling.NWKernelRegression": ("batch",),
    "multihead.split_heads": ("rank", "heads", "empty"),
    "multihead.merge_heads": ("rank", "empty"),
    "multihead.transpose_qkv": ("rank", "heads"),
    "multihead.transpose_output": ("rank", "heads"),
    "multihead.project_heads": ("rank", "batch", "length", "depth", "heads"),
    "multihead.combine_heads": ("rank", "depth"),
    "multihead.multi_head_attention": ("rank", "batch", "length", "depth", "heads", "lens",
                                       "empty"),
    "multihead.MultiHeadAttention": ("depth", "heads", "sizes", "empty"),
    "positional.positional_encoding": ("dtype", "sizes"),
    "positional.add_positional_encoding": ("rank", "depth", "dtype", "positions", "empty"),
    "positional.learned_positional_encoding": ("rank", "depth", "positions", "empty"),
    "positional.rotary_angles": ("dtype", "heads"),
    "positional.rotary_embedding": ("rank", "length", "dtype", "heads", "empty"),
    "positional.relative_positions": ("dtype", "sizes", "empty"),
    "positional.relative_position_buckets": ("dtype", "sizes", "empty"),
    "positional.clipped_relative_positions": ("dtype", "sizes"),
    "positional.relative_position_bias": ("rank", "dtype", "ids", "empty"),
    "positional.Constant": "a plain nnx.Variable holder: it takes no input",
    "positional.PositionalEncoding": ("depth", "positions", "sizes", "empty"),
    "positional.LearnedPositionalEmbedding": ("positions", "sizes"),
    "positional.RelativePositionBias": ("sizes", "empty"),
    "bahdanau.param_shapes": ("sizes",),
    "bahdanau.init_params": ("sizes",),
    "bahdanau.gru_cell": ("rank", "batch", "depth", "empty"),
    "bahdanau.gru": ("rank", "batch", "depth", "empty"),
    "bahdanau.encoder": ("rank", "dtype", "ids", "empty"),
    "bahdanau.decoder_step": ("rank", "batch", "depth", "lens", "ids"),
    "bahdanau.decoder": ("rank", "batch", "ids", "empty"),
    "bahdanau.seq2seq": ("batch", "lens", "ids", "empty"),
    "bahdanau.teacher_forcing_inputs": ("rank", "dtype", "ids", "empty"),
    "bahdanau.masked_cross_entropy": ("rank", "batch", "length", "dtype", "lens", "ids", "empty"),
    "bahdanau.teacher_forcing_loss": ("lens", "ids"),
    "bahdanau.greedy_decode": ("lens", "ids", "sizes", "empty"),
    "bahdanau.Translation": "a frozen dataclass of results; it is built, not called",
    "bahdanau.translate": ("dtype", "sizes"),
    "bahdanau.GRULayer": ("sizes", "batch"),
    "bahdanau.GRU": ("sizes",),
    "bahdanau.Seq2SeqEncoder": ("ids", "sizes"),
    "bahdanau.Seq2SeqAttentionDecoder": ("sizes",),
    "bahdanau.BahdanauSeq2Seq": ("sizes",),
    "transformer.MAX_POSITIONS": "a constant",
    "transformer.param_shapes": ("sizes",),
    "transformer.init_params": ("heads", "sizes"),
    "transformer.flatten_params": "re-exported from jax_attention.params (checkpoint layout)",
    "transformer.unflatten_params": "re-exported from jax_attention.params (checkpoint layout)",
    "transformer.position_wise_ffn": ("depth", "empty"),
    "transformer.layer_norm": ("depth", "empty"),
    "transformer.add_norm": ("length", "empty"),
    "transformer.attention": ("batch", "depth", "heads", "lens", "empty"),
    "transformer.encoder_block": ("rank", "heads", "lens", "empty"),
    "transformer.encoder": ("rank", "heads", "lens", "ids", "positions", "sizes", "empty"),
    "transformer.decoder_block": ("batch", "depth", "heads", "empty"),
    "transformer.decoder": ("batch", "depth", "ids", "positions", "empty"),
    "transformer.transformer": ("batch", "ids", "positions", "empty"),
    "transformer.teacher_forcing_loss": ("lens", "ids", "empty"),
    "transformer.init_decoder_state": ("rank", "heads", "lens", "sizes", "empty"),
    "transformer.decoder_step": ("batch", "heads", "ids", "positions"),
    "transformer.greedy_decode": ("heads", "lens", "ids", "positions", "empty"),
    "transformer.beam_decode": ("ids", "positions", "sizes"),
    "transformer.TransformerTranslation": "a frozen dataclass of results; it is built, not called",
    "transformer.translate": ("dtype", "sizes"),
    "transformer.PositionWiseFFN": ("depth", "sizes"),
    "transformer.AddNorm": ("depth", "sizes"),
    "transformer.TransformerEncoderBlock": ("depth", "heads"),
    "transformer.TransformerEncoder": ("positions", "sizes"),
    "transformer.TransformerDecoderBlock": ("heads",),
    "transformer.TransformerDecoder": ("positions",),
    "transformer.TransformerSeq2Seq": ("heads", "positions", "sizes"),
    "efficient.dot_product_attention": ("rank", "batch", "length", "depth", "lens", "sizes",
                                        "empty"),
    "decoding.greedy_search": ("depth", "ids", "sizes", "empty"),
    "decoding.beam_search": ("batch", "ids", "sizes", "empty"),
    "metrics.bleu": ("dtype", "sizes", "empty"),
    "metrics.corpus_bleu": ("length", "dtype", "sizes", "empty"),
}


# --------------------------------------------------------------------------- inputs


def f32(*shape):
    return np.zeros(shape, np.float32)


def rand(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def i32(values):
    return np.asarray(values, np.int32)


def shape(*dims):
    """How a shape appears in the messages: ``str`` of the tuple."""
    return str(tuple(dims))


def _numpy_tree(tree):
    return jax.tree.map(np.asarray, tree)


@functools.cache
def bahdanau_params():
    return _numpy_tree(j_bahdanau.init_params(jax.random.key(0), VOCAB, VOCAB, E, H_GRU, L_GRU))


@functools.cache
def transformer_params():
    return _numpy_tree(j_transformer.init_params(jax.random.key(0), VOCAB, VOCAB, D, F, N, 1))


def mha_params(q=Q, k=K, v=V, width=D):
    return {"W_q": rand(q, width, seed=1), "W_k": rand(k, width, seed=2),
            "W_v": rand(v, width, seed=3), "W_o": rand(width, width, seed=4)}


def additive_params(q=Q, k=K, hidden=7):
    return {"W_q": rand(q, hidden, seed=1), "W_k": rand(k, hidden, seed=2),
            "w_v": rand(hidden, 1, seed=3)}


def qkv(q_shape=(B, T, Q), k_shape=(B, S, K), v_shape=(B, S, V)):
    return rand(*q_shape, seed=5), rand(*k_shape, seed=6), rand(*v_shape, seed=7)


def gru_state(batch=B):
    return rand(L_GRU, batch, H_GRU, seed=8)


def enc_outputs_gru(batch=B, length=S):
    return rand(batch, length, H_GRU, seed=9)


def transformer_state(max_len=4):
    params = transformer_params()["decoder"]
    return j_transformer.init_decoder_state(params, rand(B, S, D, seed=10), i32([S, 2]),
                                            num_heads=N, max_len=max_len)


def greedy_step(vocab=5, rows=None):
    def step(state, tokens):
        n = tokens.shape[0] if rows is None else rows
        return jnp.zeros((n, vocab)), state, jnp.zeros((n, 3))
    return step


# --------------------------------------------------------------------------- error cases


@dataclass(frozen=True)
class Case:
    """One bad input: the function (an :data:`INVENTORY` key), the rule, the expected exception,
    the argument the message must name and the shapes it must contain; the calls that must raise
    it — the JAX function eagerly, the NumPy function, and the JAX function under ``jax.jit``."""

    func: str
    rule: str
    detail: str
    error: type
    arg: str
    shapes: tuple
    jax: Callable | None
    numpy: Callable | None
    jit: Callable | None

    @property
    def id(self):
        return f"{self.func}-{self.rule}-{self.detail}"


CASES: list[Case] = []


def case(func, rule, detail, error, arg, shapes, args=lambda: (), kwargs=None, *, jax_only=False,
         jit=None):
    """A case for ``func`` called as ``func(*args(), **kwargs)`` in both packages (static ints go in
    ``kwargs``: under ``jit`` every positional argument is traced)."""
    stem, name = func.split(".")
    kwargs = kwargs or {}
    jax_fn = getattr(JAX_MODULES[stem], name)
    np_module = None if jax_only else NUMPY_MODULES.get(stem)
    np_fn = getattr(np_module, name, None) if np_module is not None else None
    if jit is None:
        jit = rule in STATIC_RULES
    CASES.append(Case(
        func, rule, detail, error, arg, tuple(shapes),
        jax=lambda: jax_fn(*args(), **kwargs),
        numpy=None if np_fn is None else (lambda: np_fn(*args(), **kwargs)),
        jit=(lambda: jax.jit(lambda *a: jax_fn(*a, **kwargs))(*args())) if jit else None))


def custom(func, rule, detail, error, arg, shapes, jax_call, numpy_call=None, jit_call=None):
    """A case with hand-written calls (modules, callbacks, static arguments)."""
    CASES.append(Case(func, rule, detail, error, arg, tuple(shapes), jax_call, numpy_call,
                      jit_call))


# masking ----------------------------------------------------------------------------------

case("masking.sequence_mask", "rank", "scalar X", ValueError, "X", [shape()],
     lambda: (np.float32(1.0), i32(1)))
case("masking.sequence_mask", "batch", "lens (3,) for X (2, 3)", ValueError, "valid_len",
     [shape(3), shape(2)], lambda: (f32(2, 3), i32([1, 2, 3])))
case("masking.sequence_mask", "dtype", "float lens", ValueError, "valid_len", [shape(2)],
     lambda: (f32(2, 3), np.asarray([1.0, 2.0], np.float32)))
case("masking.sequence_mask", "lens", "above S", ValueError, "valid_len", [shape(2), "[0, 3]"],
     lambda: (f32(2, 3), i32([1, 4])))
case("masking.sequence_mask", "lens", "negative", ValueError, "valid_len", [shape(2)],
     lambda: (f32(2, 3), i32([-1, 2])))
case("masking.valid_lens_mask", "rank", "3-D lens", ValueError, "valid_lens", [shape(2, 3, 4)],
     lambda: (np.ones((2, 3, 4), np.int32),), {"num_queries": T, "num_keys": S})
case("masking.valid_lens_mask", "length", "(B, T') lens", ValueError, "valid_lens",
     [shape(2, 4), "(B, 3)"], lambda: (np.ones((2, 4), np.int32),),
     {"num_queries": T, "num_keys": S})
case("masking.valid_lens_mask", "dtype", "bool lens", ValueError, "valid_lens", [shape(2)],
     lambda: (np.asarray([True, False]),), {"num_queries": T, "num_keys": S})
case("masking.valid_lens_mask", "lens", "above S", ValueError, "valid_lens", [shape(2), "[0, 5]"],
     lambda: (i32([1, 6]),), {"num_queries": T, "num_keys": S})
case("masking.valid_lens_mask", "sizes", "negative T", ValueError, "num_queries", [],
     lambda: (i32([1, 1]),), {"num_queries": -1, "num_keys": S}, jit=False)
case("masking.causal_mask", "sizes", "float T", ValueError, "num_queries", [],
     kwargs={"num_queries": 2.5, "num_keys": 3}, jit=False)
case("masking.causal_mask", "sizes", "negative S", ValueError, "num_keys", [],
     kwargs={"num_queries": 2, "num_keys": -3}, jit=False)
case("masking.causal_mask", "dtype", "float offset", TypeError, "offset", [shape()],
     kwargs={"num_queries": 2, "num_keys": 3, "offset": 0.5}, jit=False)
case("masking.local_window_mask", "sizes", "negative left", ValueError, "local_window_size", [],
     kwargs={"num_queries": 2, "num_keys": 3, "local_window_size": (-1, 2)}, jit=False)
case("masking.local_window_mask", "sizes", "float window", TypeError, "local_window_size", [],
     kwargs={"num_queries": 2, "num_keys": 3, "local_window_size": 1.5}, jit=False)
case("masking.local_window_mask", "sizes", "negative S", ValueError, "num_keys", [],
     kwargs={"num_queries": 2, "num_keys": -3, "local_window_size": 1}, jit=False)
case("masking.local_window_mask", "dtype", "float offset", TypeError, "offset", [shape()],
     kwargs={"num_queries": 2, "num_keys": 3, "local_window_size": 1, "offset": 0.5}, jit=False)
case("masking.combine_masks", "dtype", "int mask", TypeError, "masks[0]", [shape(2, 3)],
     lambda: (np.ones((2, 3), np.int32), np.ones((2, 3), bool)))
case("masking.combine_masks", "length", "(2, 3) and (4, 3)", ValueError, "masks[1]",
     [shape(2, 3), shape(4, 3)], lambda: (np.ones((2, 3), bool), np.ones((4, 3), bool)))
custom("masking.attention_mask", "rank", "1-D shape", ValueError, "shape", [shape(3)],
       lambda: j_masking.attention_mask((3,)), lambda: n_masking.attention_mask((3,)))
custom("masking.attention_mask", "batch", "lens (3,) for B = 2", ValueError, "valid_lens",
       [shape(3), "(2,)"], lambda: j_masking.attention_mask((B, T, S), i32([1, 2, 3])),
       lambda: n_masking.attention_mask((B, T, S), i32([1, 2, 3])),
       lambda: jax.jit(lambda lens: j_masking.attention_mask((B, T, S), lens))(i32([1, 2, 3])))
custom("masking.attention_mask", "dtype", "int mask", TypeError, "mask", [shape(T, S)],
       lambda: j_masking.attention_mask((B, T, S), mask=np.ones((T, S), np.int32)),
       lambda: n_masking.attention_mask((B, T, S), mask=np.ones((T, S), np.int32)))
custom("masking.attention_mask", "lens", "negative", ValueError, "valid_lens", [shape(2)],
       lambda: j_masking.attention_mask((B, T, S), i32([-1, 2])),
       lambda: n_masking.attention_mask((B, T, S), i32([-1, 2])))
case("masking.masked_softmax", "rank", "1-D X", ValueError, "X", [shape(S)], lambda: (f32(S),))
case("masking.masked_softmax", "batch", "lens (3,) for B = 2", ValueError, "valid_lens",
     [shape(3), "(2,)"], lambda: (f32(B, T, S), i32([1, 2, 3])))
case("masking.masked_softmax", "length", "lens (B, T + 1)", ValueError, "valid_lens",
     [shape(B, T + 1), shape(B, T)], lambda: (f32(B, T, S), np.ones((B, T + 1), np.int32)))
case("masking.masked_softmax", "length", "mask (4, S)", ValueError, "mask",
     [shape(4, S), shape(B, T, S)], lambda: (f32(B, T, S), None), {"mask": np.ones((4, S), bool)},
     jit=False)
case("masking.masked_softmax", "dtype", "bool X", TypeError, "X", [shape(B, T, S)],
     lambda: (np.ones((B, T, S), bool),))
case("masking.masked_softmax", "dtype", "float lens", ValueError, "valid_lens", [shape(B)],
     lambda: (f32(B, T, S), np.ones((B,), np.float32)))
case("masking.masked_softmax", "lens", "above S", ValueError, "valid_lens", [shape(B), "[0, 5]"],
     lambda: (f32(B, T, S), i32([1, S + 1])))
custom("masking.masked_fill_value", "dtype", "int32", TypeError, "dtype", [],
       lambda: j_masking.masked_fill_value(jnp.int32))

# scoring ----------------------------------------------------------------------------------

for func in ("scoring.dot_product_attention", "scoring.dot_product_attention_weights"):
    takes_values = func.endswith("attention")
    n_args = 3 if takes_values else 2
    case(func, "rank", "2-D queries", ValueError, "queries", [shape(T, Q)],
         lambda n=n_args: (f32(T, Q), *qkv()[1:n]))
    case(func, "batch", "queries B = 3", ValueError, "queries", [shape(3, T, Q), shape(B, S, K)],
         lambda n=n_args: (f32(3, T, Q), *qkv()[1:n]))
    case(func, "depth", "keys of size 3", ValueError, "keys", [shape(B, T, Q), shape(B, S, 3)],
         lambda n=n_args: (f32(B, T, Q), f32(B, S, 3), *qkv()[2:n]))
    case(func, "lens", "above S", ValueError, "valid_lens", [shape(B), "[0, 5]"],
         lambda n=n_args: (*qkv()[:n], i32([1, S + 1])))
case("scoring.dot_product_attention", "length", "values of S - 1", ValueError, "values",
     [shape(B, S, K), shape(B, S - 1, V)], lambda: (*qkv()[:2], f32(B, S - 1, V)))
case("scoring.dot_product_attention", "depth", "size 0", ValueError, "queries",
     [shape(B, T, 0), shape(B, S, 0)], lambda: (f32(B, T, 0), f32(B, S, 0), f32(B, S, V)))
case("scoring.dot_product_attention", "dtype", "float16 values", TypeError, "values",
     ["float16"], lambda: (*qkv()[:2], np.zeros((B, S, V), np.float16)))
case("scoring.dot_product_attention", "dtype", "boolean bias", TypeError, "bias", [shape(T, S)],
     lambda: qkv(), {"bias": np.ones((T, S), bool)}, jit=False)
case("scoring.dot_product_attention", "length", "bias (T, S + 1)", ValueError, "bias",
     [shape(T, S + 1), shape(B, T, S)], lambda: qkv(), {"bias": f32(T, S + 1)}, jit=False)
for func in ("scoring.additive_attention", "scoring.additive_attention_weights"):
    n_args = 3 if func.endswith("attention") else 2
    case(func, "rank", "2-D keys", ValueError, "keys", [shape(S, K)],
         lambda n=n_args: (additive_params(), f32(B, T, Q), f32(S, K), *qkv()[2:n]))
    case(func, "depth", "W_q for q = 5", ValueError, "params['W_q']",
         [shape(Q, 7), shape(5, 7), shape(B, T, Q)],
         lambda n=n_args: (additive_params(q=5), *qkv()[:n]))
    case(func, "lens", "negative", ValueError, "valid_lens", [shape(B)],
         lambda n=n_args: (additive_params(), *qkv()[:n], i32([-1, 2])))
case("scoring.additive_attention", "batch", "keys B = 3", ValueError, "keys",
     [shape(B, T, Q), shape(3, S, K)], lambda: (additive_params(), f32(B, T, Q), f32(3, S, K),
                                                f32(B, S, V)))
case("scoring.additive_attention", "length", "values of S + 1", ValueError, "values",
     [shape(B, S, K), shape(B, S + 1, V)], lambda: (additive_params(), *qkv()[:2],
                                                    f32(B, S + 1, V)))
custom("scoring.DotProductAttention", "rank", "2-D queries", ValueError, "queries", [shape(T, Q)],
       lambda: j_scoring.DotProductAttention()(f32(T, Q), *qkv()[1:]))
custom("scoring.DotProductAttention", "sizes", "dropout 1.5", ValueError, "dropout", [],
       lambda: j_scoring.DotProductAttention(1.5))
custom("scoring.AdditiveAttention", "depth", "queries of size 3", ValueError, "queries",
       [shape(B, T, 3)], lambda: j_scoring.AdditiveAttention(Q, K, 7, rngs=nnx.Rngs(0))(
           f32(B, T, 3), *qkv()[1:]))
custom("scoring.AdditiveAttention", "sizes", "query_size 0", ValueError, "query_size", [],
       lambda: j_scoring.AdditiveAttention(0, K, 7, rngs=nnx.Rngs(0)))

# efficient --------------------------------------------------------------------------------

case("efficient.dot_product_attention", "rank", "2-D keys", ValueError, "keys", [shape(S, K)],
     lambda: (f32(B, T, Q), f32(S, K), f32(B, S, V)))
case("efficient.dot_product_attention", "batch", "values B = 3", ValueError, "values",
     [shape(B, S, K), shape(3, S, V)], lambda: (*qkv()[:2], f32(3, S, V)))
case("efficient.dot_product_attention", "length", "values of S + 1", ValueError, "values",
     [shape(B, S + 1, V)], lambda: (*qkv()[:2], f32(B, S + 1, V)))
case("efficient.dot_product_attention", "depth", "keys of size 3", ValueError, "keys",
     [shape(B, S, 3)], lambda: (f32(B, T, Q), f32(B, S, 3), f32(B, S, V)))
case("efficient.dot_product_attention", "lens", "above S", ValueError, "valid_lens",
     [shape(B), "[0, 5]"], lambda: (*qkv(), i32([S + 1, 1])))
case("efficient.dot_product_attention", "sizes", "boolean chunk", TypeError, "query_chunk_size",
     [], lambda: qkv(), {"query_chunk_size": True}, jit=False)

# attention pooling ------------------------------------------------------------------------

case("attention_pooling.leave_one_out", "rank", "scalar", ValueError, "x", [shape()],
     lambda: (np.float32(1.0),))
case("attention_pooling.leave_one_out", "empty", "one point", ValueError, "x", [shape(1)],
     lambda: (f32(1),))
for func in ("attention_pooling.average_pooling", "attention_pooling.nadaraya_watson_weights",
             "attention_pooling.nadaraya_watson"):
    third = () if func.endswith("weights") else (f32(4),)
    if func != "attention_pooling.nadaraya_watson":
        case(func, "rank", "scalar queries", ValueError, "queries", [shape()],
             lambda third=third: (np.float32(1.0), f32(4), *third))
    case(func, "batch", "keys (2, 4) for queries (3,)", ValueError, "keys",
         [shape(3), shape(2, 4)], lambda third=third: (f32(3), f32(2, 4), *third))
    case(func, "dtype", "bool queries", TypeError, "queries", [shape(3)],
         lambda third=third: (np.ones(3, bool), f32(4), *third))
for func in ("attention_pooling.average_pooling", "attention_pooling.nadaraya_watson"):
    case(func, "length", "values of K + 1", ValueError, "values", [shape(4), shape(5)],
         lambda: (f32(3), f32(4), f32(5)))
case("attention_pooling.nadaraya_watson_weights", "batch", "w (2,)", ValueError, "w",
     [shape(2), shape(3, 4)], lambda: (f32(3), f32(4), np.ones(2, np.float32)))
custom("attention_pooling.kernel_regression_data", "sizes", "n_train 1", ValueError, "n_train", [],
       lambda: j_pool.kernel_regression_data(jax.random.key(0), 1))
custom("attention_pooling.kernel_regression_data", "sizes", "n_train 2.5", ValueError, "n_train",
       [], lambda: j_pool.kernel_regression_data(jax.random.key(0), 2.5))
custom("attention_pooling.NWKernelRegression", "batch", "keys (2, 4) for queries (3,)",
       ValueError, "keys", [shape(3), shape(2, 4)],
       lambda: j_pool.NWKernelRegression(rngs=nnx.Rngs(0))(f32(3), f32(2, 4), f32(2, 4)))

# multi-head attention ---------------------------------------------------------------------

case("multihead.split_heads", "rank", "2-D X", ValueError, "X", [shape(T, D)], lambda: (f32(T, D),),
     {"num_heads": N})
case("multihead.split_heads", "heads", "8 by 3", ValueError, "num_heads", [shape(B, T, D)],
     lambda: (f32(B, T, D),), {"num_heads": 3})
case("multihead.merge_heads", "rank", "3-D X", ValueError, "X", [shape(B, T, D)],
     lambda: (f32(B, T, D),))
case("multihead.transpose_qkv", "rank", "2-D X", ValueError, "X", [shape(T, D)],
     lambda: (f32(T, D),), {"num_heads": N})
case("multihead.transpose_qkv", "heads", "8 by 3", ValueError, "num_heads", [shape(B, T, D)],
     lambda: (f32(B, T, D),), {"num_heads": 3})
case("multihead.transpose_output", "rank", "2-D X", ValueError, "X", [shape(T, D)],
     lambda: (f32(T, D),), {"num_heads": N})
case("multihead.transpose_output", "heads", "3 rows for 2 heads", ValueError, "X",
     [shape(3, T, 4)], lambda: (f32(3, T, 4),), {"num_heads": N})
case("multihead.project_heads", "rank", "2-D values", ValueError, "values", [shape(S, V)],
     lambda: (mha_params(), *qkv()[:2], f32(S, V)), {"num_heads": N})
case("multihead.project_heads", "batch", "keys B = 3", ValueError, "keys",
     [shape(B, T, Q), shape(3, S, K)], lambda: (mha_params(), f32(B, T, Q), f32(3, S, K),
                                                f32(B, S, V)), {"num_heads": N})
case("multihead.project_heads", "length", "values of S + 1", ValueError, "values",
     [shape(B, S, K), shape(B, S + 1, V)],
     lambda: (mha_params(), *qkv()[:2], f32(B, S + 1, V)), {"num_heads": N})
case("multihead.project_heads", "depth", "W_q for q = 5", ValueError, "params['W_q']",
     [shape(Q, D), shape(5, D), shape(B, T, Q)], lambda: (mha_params(q=5), *qkv()),
     {"num_heads": N})
case("multihead.project_heads", "heads", "8 by 3", ValueError, "num_heads", [shape(Q, D)],
     lambda: (mha_params(), *qkv()), {"num_heads": 3})
case("multihead.combine_heads", "rank", "3-D heads", ValueError, "heads", [shape(B, T, D)],
     lambda: (mha_params(), f32(B, T, D)))
case("multihead.combine_heads", "depth", "heads of width 6", ValueError, "params['W_o']",
     [shape(6, D), shape(D, D)], lambda: (mha_params(), f32(B, 2, T, 3)))
case("multihead.multi_head_attention", "rank", "2-D queries", ValueError, "queries",
     [shape(T, Q)], lambda: (mha_params(), f32(T, Q), *qkv()[1:]), {"num_heads": N})
case("multihead.multi_head_attention", "batch", "queries B = 3", ValueError, "queries",
     [shape(3, T, Q), shape(B, S, K)], lambda: (mha_params(), f32(3, T, Q), *qkv()[1:]),
     {"num_heads": N})
case("multihead.multi_head_attention", "length", "values of S - 1", ValueError, "values",
     [shape(B, S - 1, V)], lambda: (mha_params(), *qkv()[:2], f32(B, S - 1, V)),
     {"num_heads": N})
case("multihead.multi_head_attention", "depth", "W_k for k = 3", ValueError, "params['W_k']",
     [shape(K, D), shape(3, D), shape(B, S, K)], lambda: (mha_params(k=3), *qkv()),
     {"num_heads": N})
case("multihead.multi_head_attention", "heads", "8 by 3", ValueError, "num_heads", [shape(Q, D)],
     lambda: (mha_params(), *qkv()), {"num_heads": 3})
case("multihead.multi_head_attention", "lens", "above S", ValueError, "valid_lens",
     [shape(B), "[0, 5]"], lambda: (mha_params(), *qkv(), i32([2, S + 1])), {"num_heads": N})
custom("multihead.MultiHeadAttention", "heads", "10 by 4", ValueError, "num_heads", [],
       lambda: j_multihead.MultiHeadAttention(10, 4, rngs=nnx.Rngs(0)))
custom("multihead.MultiHeadAttention", "sizes", "num_hiddens 0", ValueError, "num_hiddens", [],
       lambda: j_multihead.MultiHeadAttention(0, 1, rngs=nnx.Rngs(0)))
custom("multihead.MultiHeadAttention", "sizes", "dropout 1.0", ValueError, "dropout", [],
       lambda: j_multihead.MultiHeadAttention(D, N, 1.0, rngs=nnx.Rngs(0)))
custom("multihead.MultiHeadAttention", "depth", "queries of size 4 for D = 8", ValueError,
       "queries", [shape(B, T, Q)], lambda: j_multihead.MultiHeadAttention(D, N, rngs=nnx.Rngs(0))(
           f32(B, T, Q), f32(B, S, D), f32(B, S, D)))

# positional encodings ---------------------------------------------------------------------

case("positional.positional_encoding", "sizes", "num_steps 0", ValueError, "num_steps", [],
     kwargs={"num_steps": 0, "num_hiddens": 4}, jit=False)
case("positional.positional_encoding", "dtype", "float width", ValueError, "num_hiddens", [],
     kwargs={"num_steps": 4, "num_hiddens": 4.0}, jit=False)
for func, table_first in (("positional.add_positional_encoding", False),
                          ("positional.learned_positional_encoding", True)):
    def call(X, table, table_first=table_first):
        return (table, X) if table_first else (X, table)

    case(func, "rank", "1-D X", ValueError, "X", [shape(D)],
         lambda call=call: call(f32(D), f32(5, D)))
    case(func, "depth", "X of width 3", ValueError, "X", [shape(B, 5, 3), shape(5, D)],
         lambda call=call: call(f32(B, 5, 3), f32(5, D)))
    case(func, "positions", "T = 6 > max_len = 5", ValueError, "max_len",
         [shape(B, 6, D), shape(5, D)], lambda call=call: call(f32(B, 6, D), f32(5, D)))
case("positional.add_positional_encoding", "dtype", "int X", TypeError, "X", [shape(B, T, D)],
     lambda: (np.zeros((B, T, D), np.int32), f32(5, D)))
case("positional.learned_positional_encoding", "rank", "1-D table", ValueError, "table",
     [shape(D)], lambda: (f32(D), f32(B, T, D)))
case("positional.rotary_angles", "heads", "odd head_dim", ValueError, "head_dim", [],
     lambda: (i32([0, 1, 2]),), {"head_dim": 5})
case("positional.rotary_angles", "dtype", "float positions", TypeError, "positions", [shape(3)],
     lambda: (np.arange(3.0, dtype=np.float32),), {"head_dim": 4})
case("positional.rotary_embedding", "rank", "1-D X", ValueError, "X", [shape(4)],
     lambda: (f32(4),))
case("positional.rotary_embedding", "heads", "odd H", ValueError, "X", [shape(B, T, 5)],
     lambda: (f32(B, T, 5),))
case("positional.rotary_embedding", "length", "positions (4,) for T = 3", ValueError, "positions",
     [shape(B, T), shape(4)], lambda: (f32(B, T, 4), i32([0, 1, 2, 3])))
case("positional.rotary_embedding", "dtype", "int X", TypeError, "X", [shape(B, T, 4)],
     lambda: (np.zeros((B, T, 4), np.int32),))
case("positional.relative_positions", "sizes", "negative T", ValueError, "num_queries", [],
     kwargs={"num_queries": -1, "num_keys": 3}, jit=False)
case("positional.relative_positions", "dtype", "float offset", TypeError, "offset", [],
     kwargs={"num_queries": 2, "num_keys": 3, "offset": 0.5}, jit=False)
case("positional.relative_position_buckets", "dtype", "float positions", TypeError,
     "relative_positions", [shape(2, 3)], lambda: (f32(2, 3),))
case("positional.relative_position_buckets", "sizes", "odd num_buckets", ValueError,
     "num_buckets", [], lambda: (np.zeros((2, 3), np.int32),), {"num_buckets": 5})
case("positional.clipped_relative_positions", "dtype", "float positions", TypeError,
     "relative_positions", [shape(2, 3)], lambda: (f32(2, 3),), {"max_distance": 2})
case("positional.clipped_relative_positions", "sizes", "max_distance 0", ValueError,
     "max_distance", [], lambda: (np.zeros((2, 3), np.int32),), {"max_distance": 0})
case("positional.relative_position_bias", "rank", "1-D indices", ValueError, "indices",
     [shape(5)], lambda: (f32(4, N), np.arange(5, dtype=np.int32)))
case("positional.relative_position_bias", "rank", "1-D table", ValueError, "table", [shape(4)],
     lambda: (f32(4), np.zeros((2, 3), np.int32)))
case("positional.relative_position_bias", "dtype", "float indices", TypeError, "indices",
     [shape(2, 3)], lambda: (f32(4, N), f32(2, 3)))
case("positional.relative_position_bias", "ids", "index 4 of 4 rows", ValueError, "indices",
     [shape(4, N), shape(1, 2), "[0, 4)"], lambda: (f32(4, N), i32([[0, 4]])))
case("positional.relative_position_bias", "ids", "index -1", ValueError, "indices",
     [shape(1, 2)], lambda: (f32(4, N), i32([[0, -1]])))
custom("positional.PositionalEncoding", "positions", "T = 6 > max_len = 5", ValueError, "max_len",
       [shape(B, 6, 4), shape(5, 4)],
       lambda: j_positional.PositionalEncoding(4, 0.0, max_len=5)(f32(B, 6, 4)))
custom("positional.PositionalEncoding", "depth", "X of width 3", ValueError, "X",
       [shape(B, 4, 3), shape(5, 4)],
       lambda: j_positional.PositionalEncoding(4, 0.0, max_len=5)(f32(B, 4, 3)))
custom("positional.PositionalEncoding", "sizes", "dropout 1.5", ValueError, "dropout", [],
       lambda: j_positional.PositionalEncoding(4, 1.5))
custom("positional.LearnedPositionalEmbedding", "positions", "T = 6 > max_len = 5", ValueError,
       "max_len", [shape(B, 6, 4), shape(5, 4)],
       lambda: j_positional.LearnedPositionalEmbedding(5, 4, rngs=nnx.Rngs(0))(f32(B, 6, 4)))
custom("positional.LearnedPositionalEmbedding", "sizes", "max_len 0", ValueError, "max_len", [],
       lambda: j_positional.LearnedPositionalEmbedding(0, 4, rngs=nnx.Rngs(0)))
custom("positional.RelativePositionBias", "sizes", "mode", ValueError, "mode", [],
       lambda: j_positional.RelativePositionBias(N, mode="nearest", rngs=nnx.Rngs(0)))

# Bahdanau seq2seq -------------------------------------------------------------------------


def _gru_layer():
    return bahdanau_params()["encoder"]["gru"]["layer_0"]


def _decoder():
    return bahdanau_params()["decoder"]


custom("bahdanau.param_shapes", "sizes", "tgt_vocab_size 0", ValueError, "tgt_vocab_size", [],
       lambda: j_bahdanau.param_shapes(VOCAB, 0, E, H_GRU, L_GRU))
custom("bahdanau.init_params", "sizes", "num_layers 0", ValueError, "num_layers", [],
       lambda: j_bahdanau.init_params(jax.random.key(0), VOCAB, VOCAB, E, H_GRU, 0))
case("bahdanau.gru_cell", "rank", "1-D inputs", ValueError, "inputs", [shape(E), shape(B, H_GRU)],
     lambda: (_gru_layer(), f32(E), f32(B, H_GRU)))
case("bahdanau.gru_cell", "batch", "state B = 3", ValueError, "state",
     [shape(B, E), shape(3, H_GRU)], lambda: (_gru_layer(), f32(B, E), f32(3, H_GRU)))
case("bahdanau.gru_cell", "depth", "inputs of size E + 1", ValueError, "params['W_x']",
     [shape(E + 1, 3 * H_GRU), shape(E, 3 * H_GRU)],
     lambda: (_gru_layer(), f32(B, E + 1), f32(B, H_GRU)))
case("bahdanau.gru", "rank", "2-D inputs", ValueError, "inputs", [shape(B, E)],
     lambda: (bahdanau_params()["encoder"]["gru"], f32(B, E)))
case("bahdanau.gru", "batch", "state B = 3", ValueError, "state",
     [shape(L_GRU, B, H_GRU), shape(L_GRU, 3, H_GRU)],
     lambda: (bahdanau_params()["encoder"]["gru"], f32(B, T, E), gru_state(3)))
case("bahdanau.gru", "depth", "inputs of size E + 1", ValueError, "params['W_x']",
     [shape(E + 1, 3 * H_GRU)], lambda: (bahdanau_params()["encoder"]["gru"], f32(B, T, E + 1)))
case("bahdanau.encoder", "rank", "1-D src", ValueError, "src", [shape(S)],
     lambda: (bahdanau_params()["encoder"], i32([1] * S)))
case("bahdanau.encoder", "dtype", "float src", ValueError, "src", [shape(B, S)],
     lambda: (bahdanau_params()["encoder"], f32(B, S)))
case("bahdanau.encoder", "ids", "id V", ValueError, "src", [shape(1, 2), "[0, 7)"],
     lambda: (bahdanau_params()["encoder"], i32([[0, VOCAB]])))
case("bahdanau.encoder", "ids", "id -1", ValueError, "src", [shape(1, 2)],
     lambda: (bahdanau_params()["encoder"], i32([[-1, 0]])))
case("bahdanau.decoder_step", "rank", "2-D tokens", ValueError, "tokens", [shape(B, 1), "(2,)"],
     lambda: (_decoder(), np.ones((B, 1), np.int32), gru_state(), enc_outputs_gru(), i32([S, 1])))
case("bahdanau.decoder_step", "rank", "2-D state", ValueError, "state", [shape(B, H_GRU)],
     lambda: (_decoder(), i32([1, 1]), f32(B, H_GRU), enc_outputs_gru(), i32([S, 1])))
case("bahdanau.decoder_step", "batch", "tokens B = 3", ValueError, "tokens", [shape(3), "(2,)"],
     lambda: (_decoder(), i32([1, 1, 1]), gru_state(), enc_outputs_gru(), i32([S, 1])))
case("bahdanau.decoder_step", "batch", "enc_outputs B = 1", ValueError, "enc_outputs",
     [shape(1, S, H_GRU), shape(L_GRU, B, H_GRU)],
     lambda: (_decoder(), i32([1, 1]), gru_state(), enc_outputs_gru(batch=1), i32([S, 1])))
case("bahdanau.decoder_step", "depth", "enc_outputs of width 4", ValueError, "enc_outputs",
     [shape(B, S, 4)], lambda: (_decoder(), i32([1, 1]), gru_state(), f32(B, S, 4), i32([S, 1])))
case("bahdanau.decoder_step", "lens", "above S", ValueError, "valid_lens", [shape(B), "[0, 5]"],
     lambda: (_decoder(), i32([1, 1]), gru_state(), enc_outputs_gru(), i32([S + 1, 1])))
case("bahdanau.decoder_step", "ids", "token V", ValueError, "tokens", [shape(B), "[0, 7)"],
     lambda: (_decoder(), i32([1, VOCAB]), gru_state(), enc_outputs_gru(), i32([S, 1])))
case("bahdanau.decoder", "rank", "1-D dec_input", ValueError, "dec_input", [shape(B)],
     lambda: (_decoder(), i32([1, 1]), gru_state(), enc_outputs_gru(), i32([S, 1])))
case("bahdanau.decoder", "batch", "dec_input B = 1", ValueError, "dec_input",
     [shape(1, T), "(2, T)"],
     lambda: (_decoder(), np.ones((1, T), np.int32), gru_state(), enc_outputs_gru(), i32([S, 1])))
case("bahdanau.decoder", "ids", "id -1", ValueError, "dec_input", [shape(B, T)],
     lambda: (_decoder(), -np.ones((B, T), np.int32), gru_state(), enc_outputs_gru(),
              i32([S, 1])))
case("bahdanau.seq2seq", "batch", "dec_input B = 1", ValueError, "dec_input",
     [shape(1, T), shape(B, S)],
     lambda: (bahdanau_params(), np.ones((B, S), np.int32), i32([S, 1]), np.ones((1, T), np.int32)))
case("bahdanau.seq2seq", "lens", "negative", ValueError, "valid_lens", [shape(B)],
     lambda: (bahdanau_params(), np.ones((B, S), np.int32), i32([-1, 1]),
              np.ones((B, T), np.int32)))
case("bahdanau.seq2seq", "ids", "src id V", ValueError, "src", [shape(B, S)],
     lambda: (bahdanau_params(), np.full((B, S), VOCAB, np.int32), i32([S, 1]),
              np.ones((B, T), np.int32)))
case("bahdanau.teacher_forcing_inputs", "rank", "1-D tgt", ValueError, "tgt", [shape(T)],
     lambda: (i32([1, 2, 3]),), {"bos_id": 1})
case("bahdanau.teacher_forcing_inputs", "dtype", "float tgt", ValueError, "tgt", [shape(B, T)],
     lambda: (f32(B, T),), {"bos_id": 1})
case("bahdanau.teacher_forcing_inputs", "ids", "bos_id -1", ValueError, "bos_id", [],
     lambda: (np.ones((B, T), np.int32),), {"bos_id": -1})


def _logits():
    return rand(B, T, VOCAB)


case("bahdanau.masked_cross_entropy", "rank", "2-D logits", ValueError, "logits",
     [shape(B, VOCAB)], lambda: (rand(B, VOCAB), np.ones((B, T), np.int32), i32([T, 1])))
case("bahdanau.masked_cross_entropy", "length", "labels (B, 1)", ValueError, "labels",
     [shape(B, 1), shape(B, T), shape(B, T, VOCAB)],
     lambda: (_logits(), np.ones((B, 1), np.int32), i32([T, 1])))
case("bahdanau.masked_cross_entropy", "batch", "valid_len (3,)", ValueError, "valid_len",
     [shape(3), "(2,)"], lambda: (_logits(), np.ones((B, T), np.int32), i32([T, 1, 1])))
case("bahdanau.masked_cross_entropy", "dtype", "float labels", ValueError, "labels",
     [shape(B, T)], lambda: (_logits(), f32(B, T), i32([T, 1])))
case("bahdanau.masked_cross_entropy", "ids", "label V", ValueError, "labels",
     [shape(B, T), "[0, 7)"], lambda: (_logits(), np.full((B, T), VOCAB, np.int32), i32([T, 1])))
case("bahdanau.masked_cross_entropy", "lens", "above T", ValueError, "valid_len",
     [shape(B), "[0, 3]"], lambda: (_logits(), np.ones((B, T), np.int32), i32([T + 1, 1])))
case("bahdanau.teacher_forcing_loss", "ids", "tgt id V", ValueError, "tgt", [shape(B, T)],
     lambda: (bahdanau_params(), np.ones((B, S), np.int32), i32([S, 1]),
              np.full((B, T), VOCAB, np.int32), i32([T, 1])), {"bos_id": 1})
case("bahdanau.teacher_forcing_loss", "lens", "tgt_valid_len above T", ValueError,
     "tgt_valid_len", [shape(B), "[0, 3]"],
     lambda: (bahdanau_params(), np.ones((B, S), np.int32), i32([S, 1]),
              np.ones((B, T), np.int32), i32([T + 1, 1])), {"bos_id": 1})
_GREEDY = {"bos_id": 1, "eos_id": 2, "pad_id": 0, "max_len": 3}
custom("bahdanau.greedy_decode", "lens", "src_valid_len above S", ValueError, "src_valid_len",
       [shape(B), "[0, 5]"],
       lambda: j_bahdanau.greedy_decode(bahdanau_params(), np.ones((B, S), np.int32),
                                        i32([S + 1, 1]), **_GREEDY),
       lambda: n_bahdanau.greedy_decode(bahdanau_params(), np.ones((B, S), np.int32),
                                        i32([S + 1, 1]), **_GREEDY))
custom("bahdanau.greedy_decode", "ids", "bos_id V", ValueError, "bos_id", ["(2, 7)"],
       lambda: j_bahdanau.greedy_decode(bahdanau_params(), np.ones((B, S), np.int32), i32([S, 1]),
                                        **{**_GREEDY, "bos_id": VOCAB}),
       lambda: n_bahdanau.greedy_decode(bahdanau_params(), np.ones((B, S), np.int32), i32([S, 1]),
                                        **{**_GREEDY, "bos_id": VOCAB}))
custom("bahdanau.greedy_decode", "sizes", "max_len 0", ValueError, "max_len", [],
       lambda: j_bahdanau.greedy_decode(bahdanau_params(), np.ones((B, S), np.int32), i32([S, 1]),
                                        **{**_GREEDY, "max_len": 0}),
       lambda: n_bahdanau.greedy_decode(bahdanau_params(), np.ones((B, S), np.int32), i32([S, 1]),
                                        **{**_GREEDY, "max_len": 0}))
custom("bahdanau.translate", "dtype", "a number for a sentence", TypeError, "sentences", [],
       lambda: j_bahdanau.translate(bahdanau_params(), [1], None, None, 4))
custom("bahdanau.translate", "sizes", "num_steps 0", ValueError, "num_steps", [],
       lambda: j_bahdanau.translate(bahdanau_params(), "hi .", None, None, 0))
custom("bahdanau.GRULayer", "sizes", "num_hiddens 0", ValueError, "num_hiddens", [],
       lambda: j_bahdanau.GRULayer(E, 0, rngs=nnx.Rngs(0)))
custom("bahdanau.GRULayer", "batch", "state B = 3", ValueError, "state",
       [shape(B, E), shape(3, H_GRU)],
       lambda: j_bahdanau.GRULayer(E, H_GRU, rngs=nnx.Rngs(0))(f32(B, E), f32(3, H_GRU)))
custom("bahdanau.GRU", "sizes", "num_layers 0", ValueError, "num_layers", [],
       lambda: j_bahdanau.GRU(E, H_GRU, 0, rngs=nnx.Rngs(0)))
custom("bahdanau.Seq2SeqEncoder", "sizes", "vocab_size 0", ValueError, "vocab_size", [],
       lambda: j_bahdanau.Seq2SeqEncoder(0, E, H_GRU, 1, rngs=nnx.Rngs(0)))
custom("bahdanau.Seq2SeqEncoder", "ids", "id V", ValueError, "src", [shape(1, 2)],
       lambda: j_bahdanau.Seq2SeqEncoder(VOCAB, E, H_GRU, 1, rngs=nnx.Rngs(0))(i32([[0, VOCAB]])))
custom("bahdanau.Seq2SeqAttentionDecoder", "sizes", "embed_size 0", ValueError, "embed_size", [],
       lambda: j_bahdanau.Seq2SeqAttentionDecoder(VOCAB, 0, H_GRU, 1, rngs=nnx.Rngs(0)))
custom("bahdanau.BahdanauSeq2Seq", "sizes", "dropout 1.0", ValueError, "dropout", [],
       lambda: j_bahdanau.BahdanauSeq2Seq(VOCAB, VOCAB, E, H_GRU, 1, 1.0, rngs=nnx.Rngs(0)))

# Transformer ------------------------------------------------------------------------------


def _block(part="encoder"):
    return transformer_params()[part]["blocks"]["block_0"]


def _src(batch=B, length=S, fill=1):
    return np.full((batch, length), fill, np.int32)


_T_GREEDY = {"num_heads": N, "bos_id": 1, "eos_id": 2, "pad_id": 0, "max_len": 3}

custom("transformer.param_shapes", "sizes", "num_hiddens 2.5", ValueError, "num_hiddens", [],
       lambda: j_transformer.param_shapes(VOCAB, VOCAB, 2.5, F, 1))
custom("transformer.init_params", "heads", "8 by 3", ValueError, "num_heads", [],
       lambda: j_transformer.init_params(jax.random.key(0), VOCAB, VOCAB, D, F, 3, 1))
custom("transformer.init_params", "sizes", "num_layers 0", ValueError, "num_layers", [],
       lambda: j_transformer.init_params(jax.random.key(0), VOCAB, VOCAB, D, F, N, 0))
case("transformer.position_wise_ffn", "depth", "X of width 5", ValueError, "X", [shape(B, T, 5)],
     lambda: (_block()["ffn"], f32(B, T, 5)))
case("transformer.layer_norm", "depth", "X of width 5", ValueError, "X", [shape(B, T, 5)],
     lambda: (_block()["addnorm_1"], f32(B, T, 5)))
case("transformer.add_norm", "length", "Y of T + 1", ValueError, "Y",
     [shape(B, T, D), shape(B, T + 1, D)], lambda: (_block()["addnorm_1"], f32(B, T, D),
                                                    f32(B, T + 1, D)))
case("transformer.attention", "batch", "keys_values B = 1", ValueError, "keys",
     [shape(B, T, D), shape(1, S, D)], lambda: (_block()["attention"], f32(B, T, D), f32(1, S, D)),
     {"num_heads": N})
case("transformer.attention", "depth", "keys_values of width 5", ValueError, "keys_values",
     [shape(B, S, 5)], lambda: (_block()["attention"], f32(B, T, D), f32(B, S, 5)),
     {"num_heads": N})
case("transformer.attention", "heads", "8 by 3", ValueError, "num_heads", [shape(D, D)],
     lambda: (_block()["attention"], f32(B, T, D), f32(B, S, D)), {"num_heads": 3})
case("transformer.attention", "lens", "above S", ValueError, "valid_lens", [shape(B), "[0, 5]"],
     lambda: (_block()["attention"], f32(B, T, D), f32(B, S, D), i32([S + 1, 1])),
     {"num_heads": N})
case("transformer.encoder_block", "rank", "2-D X", ValueError, "X", [shape(S, D)],
     lambda: (_block(), f32(S, D), None), {"num_heads": N})
case("transformer.encoder_block", "heads", "8 by 3", ValueError, "num_heads", [shape(D, D)],
     lambda: (_block(), f32(B, S, D), None), {"num_heads": 3})
case("transformer.encoder_block", "lens", "negative", ValueError, "src_valid_len", [shape(B)],
     lambda: (_block(), f32(B, S, D), i32([-1, 1])), {"num_heads": N})
case("transformer.encoder", "rank", "1-D src", ValueError, "src", [shape(S)],
     lambda: (transformer_params()["encoder"], i32([1] * S), None), {"num_heads": N})
case("transformer.encoder", "heads", "8 by 3", ValueError, "num_heads", [shape(D, D)],
     lambda: (transformer_params()["encoder"], _src(), None), {"num_heads": 3})
case("transformer.encoder", "lens", "above S", ValueError, "src_valid_len", [shape(B)],
     lambda: (transformer_params()["encoder"], _src(), i32([S + 1, 1])), {"num_heads": N})
case("transformer.encoder", "ids", "id V", ValueError, "src", [shape(B, S), "[0, 7)"],
     lambda: (transformer_params()["encoder"], _src(fill=VOCAB), None), {"num_heads": N})
case("transformer.encoder", "positions", "S = 5 > max_positions = 4", ValueError, "src",
     [shape(B, S), "max_positions = 4"], lambda: (transformer_params()["encoder"], _src(), None),
     {"num_heads": N, "max_positions": 4})
case("transformer.encoder", "sizes", "max_positions 0", ValueError, "max_positions", [],
     lambda: (transformer_params()["encoder"], _src(), None), {"num_heads": N, "max_positions": 0},
     jit=False)
case("transformer.decoder_block", "batch", "enc_outputs B = 1", ValueError, "enc_outputs",
     [shape(B, T, D), shape(1, S, D)], lambda: (_block("decoder"), f32(B, T, D), f32(1, S, D),
                                                None), {"num_heads": N})
case("transformer.decoder_block", "depth", "enc_outputs of width 5", ValueError, "enc_outputs",
     [shape(B, S, 5)], lambda: (_block("decoder"), f32(B, T, D), f32(B, S, 5), None),
     {"num_heads": N})
case("transformer.decoder_block", "heads", "8 by 3", ValueError, "num_heads", [shape(D, D)],
     lambda: (_block("decoder"), f32(B, T, D), f32(B, S, D), None), {"num_heads": 3})
case("transformer.decoder", "batch", "enc_outputs B = 1", ValueError, "enc_outputs",
     [shape(B, T), shape(1, S, D)],
     lambda: (transformer_params()["decoder"], _src(length=T), f32(1, S, D), None),
     {"num_heads": N})
case("transformer.decoder", "depth", "enc_outputs of width 5", ValueError, "enc_outputs",
     [shape(B, S, 5)], lambda: (transformer_params()["decoder"], _src(length=T), f32(B, S, 5),
                                None), {"num_heads": N})
case("transformer.decoder", "ids", "id -1", ValueError, "dec_input", [shape(B, T)],
     lambda: (transformer_params()["decoder"], _src(length=T, fill=-1), f32(B, S, D), None),
     {"num_heads": N})
case("transformer.decoder", "positions", "T = 3 > max_positions = 2", ValueError, "dec_input",
     [shape(B, T), "max_positions = 2"],
     lambda: (transformer_params()["decoder"], _src(length=T), f32(B, S, D), None),
     {"num_heads": N, "max_positions": 2})
case("transformer.transformer", "batch", "dec_input B = 1", ValueError, "dec_input",
     [shape(1, T), shape(B, S)],
     lambda: (transformer_params(), _src(), None, _src(batch=1, length=T)), {"num_heads": N})
case("transformer.transformer", "ids", "dec_input id V", ValueError, "dec_input", [shape(B, T)],
     lambda: (transformer_params(), _src(), None, _src(length=T, fill=VOCAB)), {"num_heads": N})
case("transformer.transformer", "positions", "S = 5 > max_positions = 4", ValueError, "src",
     [shape(B, S)], lambda: (transformer_params(), _src(), None, _src(length=T)),
     {"num_heads": N, "max_positions": 4})
case("transformer.teacher_forcing_loss", "ids", "tgt id V", ValueError, "tgt", [shape(B, T)],
     lambda: (transformer_params(), _src(), i32([S, 1]), _src(length=T, fill=VOCAB),
              i32([T, 1]), 1), {"num_heads": N})
case("transformer.teacher_forcing_loss", "lens", "tgt_valid_len negative", ValueError,
     "tgt_valid_len", [shape(B)], lambda: (transformer_params(), _src(), i32([S, 1]),
                                           _src(length=T), i32([-1, 1]), 1), {"num_heads": N})
case("transformer.init_decoder_state", "rank", "2-D enc_outputs", ValueError, "enc_outputs",
     [shape(S, D)], lambda: (transformer_params()["decoder"], f32(S, D), None),
     {"num_heads": N, "max_len": 4})
case("transformer.init_decoder_state", "heads", "8 by 3", ValueError, "num_heads",
     [shape(D, D)], lambda: (transformer_params()["decoder"], f32(B, S, D), None),
     {"num_heads": 3, "max_len": 4})
case("transformer.init_decoder_state", "lens", "above S", ValueError, "src_valid_len",
     [shape(B), "[0, 5]"], lambda: (transformer_params()["decoder"], f32(B, S, D), i32([S + 1, 1])),
     {"num_heads": N, "max_len": 4})
case("transformer.init_decoder_state", "sizes", "max_len 0", ValueError, "max_len", [],
     lambda: (transformer_params()["decoder"], f32(B, S, D), None), {"num_heads": N, "max_len": 0},
     jit=False)
case("transformer.decoder_step", "batch", "tokens B = 3", ValueError, "tokens", [shape(3), "(2,)"],
     lambda: (transformer_params()["decoder"], transformer_state(), i32([1, 1, 1])),
     {"num_heads": N})
case("transformer.decoder_step", "heads", "state of 2 heads, num_heads 4", ValueError,
     "num_heads", [shape(B, 1, N, 4, D // N)],
     lambda: (transformer_params()["decoder"], transformer_state(), i32([1, 1])),
     {"num_heads": 4})
case("transformer.decoder_step", "ids", "token V", ValueError, "tokens", [shape(B), "[0, 7)"],
     lambda: (transformer_params()["decoder"], transformer_state(), i32([1, VOCAB])),
     {"num_heads": N})
case("transformer.decoder_step", "ids", "position past the cache", ValueError,
     "state['position']", [shape(B), "[0, 4)"],
     lambda: (transformer_params()["decoder"],
              dict(transformer_state(), position=i32([4, 4])), i32([1, 1])), {"num_heads": N})
case("transformer.decoder_step", "positions", "cache of 4 > max_positions = 3", ValueError,
     "state['self_keys']", [shape(B, 1, N, 4, D // N), "max_positions = 3"],
     lambda: (transformer_params()["decoder"], transformer_state(), i32([1, 1])),
     {"num_heads": N, "max_positions": 3})
custom("transformer.greedy_decode", "heads", "8 by 3", ValueError, "num_heads", [],
       lambda: j_transformer.greedy_decode(transformer_params(), _src(), i32([S, 1]),
                                           **{**_T_GREEDY, "num_heads": 3}),
       lambda: n_transformer.greedy_decode(transformer_params(), _src(), i32([S, 1]),
                                           **{**_T_GREEDY, "num_heads": 3}))
custom("transformer.greedy_decode", "lens", "src_valid_len negative", ValueError,
       "src_valid_len", [shape(B)],
       lambda: j_transformer.greedy_decode(transformer_params(), _src(), i32([-1, 1]),
                                           **_T_GREEDY),
       lambda: n_transformer.greedy_decode(transformer_params(), _src(), i32([-1, 1]),
                                           **_T_GREEDY))
custom("transformer.greedy_decode", "ids", "pad_id V", ValueError, "pad_id", ["(2, 7)"],
       lambda: j_transformer.greedy_decode(transformer_params(), _src(), i32([S, 1]),
                                           **{**_T_GREEDY, "pad_id": VOCAB}),
       lambda: n_transformer.greedy_decode(transformer_params(), _src(), i32([S, 1]),
                                           **{**_T_GREEDY, "pad_id": VOCAB}))
custom("transformer.greedy_decode", "positions", "max_len 5 > max_positions = 4", ValueError,
       "max_len", ["max_positions = 4"],
       lambda: j_transformer.greedy_decode(transformer_params(), _src(length=3), i32([3, 1]),
                                           **{**_T_GREEDY, "max_len": 5}, max_positions=4),
       lambda: n_transformer.greedy_decode(transformer_params(), _src(length=3), i32([3, 1]),
                                           **{**_T_GREEDY, "max_len": 5}, max_positions=4))
custom("transformer.beam_decode", "ids", "eos_id V", ValueError, "eos_id", ["(4, 7)"],
       lambda: j_transformer.beam_decode(transformer_params(), _src(), i32([S, 1]), beam_size=2,
                                         **{**_T_GREEDY, "eos_id": VOCAB}))
custom("transformer.beam_decode", "positions", "src of 5 > max_positions = 4", ValueError, "src",
       [shape(B, S)], lambda: j_transformer.beam_decode(transformer_params(), _src(), i32([S, 1]),
                                                        beam_size=2, **_T_GREEDY, max_positions=4))
custom("transformer.beam_decode", "sizes", "beam_size 0", ValueError, "beam_size", [],
       lambda: j_transformer.beam_decode(transformer_params(), _src(), i32([S, 1]), beam_size=0,
                                         **_T_GREEDY))
custom("transformer.translate", "dtype", "a number for a sentence", TypeError, "sentences", [],
       lambda: j_transformer.translate(transformer_params(), [1], None, None, 4, num_heads=N))
custom("transformer.translate", "sizes", "beam_size 0", ValueError, "beam_size", [],
       lambda: j_transformer.translate(transformer_params(), "hi .", None, None, 4, num_heads=N,
                                       beam_size=0))
custom("transformer.PositionWiseFFN", "depth", "X of width 4", ValueError, "X", [shape(B, T, 4)],
       lambda: j_transformer.PositionWiseFFN(D, F, rngs=nnx.Rngs(0))(f32(B, T, 4)))
custom("transformer.PositionWiseFFN", "sizes", "ffn_num_hiddens 0", ValueError,
       "ffn_num_hiddens", [], lambda: j_transformer.PositionWiseFFN(D, 0, rngs=nnx.Rngs(0)))
custom("transformer.AddNorm", "depth", "X of width 4", ValueError, "X", [shape(B, T, 4)],
       lambda: j_transformer.AddNorm(D, rngs=nnx.Rngs(0))(f32(B, T, 4), f32(B, T, 4)))
custom("transformer.AddNorm", "sizes", "num_hiddens 0", ValueError, "num_hiddens", [],
       lambda: j_transformer.AddNorm(0, rngs=nnx.Rngs(0)))
custom("transformer.TransformerEncoderBlock", "depth", "X of width 4", ValueError, "X",
       [shape(B, S, 4)], lambda: j_transformer.TransformerEncoderBlock(D, F, N, rngs=nnx.Rngs(0))(
           f32(B, S, 4), None))
custom("transformer.TransformerEncoderBlock", "heads", "8 by 3", ValueError, "num_heads", [],
       lambda: j_transformer.TransformerEncoderBlock(D, F, 3, rngs=nnx.Rngs(0)))
custom("transformer.TransformerEncoder", "positions", "S = 5 > max_positions = 4", ValueError,
       "src", [shape(B, S)], lambda: j_transformer.TransformerEncoder(
           VOCAB, D, F, N, 1, max_positions=4, rngs=nnx.Rngs(0),
           params=transformer_params()["encoder"])(_src(), None))
custom("transformer.TransformerEncoder", "sizes", "max_positions 0", ValueError, "max_positions",
       [], lambda: j_transformer.TransformerEncoder(VOCAB, D, F, N, 1, max_positions=0,
                                                    rngs=nnx.Rngs(0)))
custom("transformer.TransformerDecoderBlock", "heads", "8 by 3", ValueError, "num_heads", [],
       lambda: j_transformer.TransformerDecoderBlock(D, F, 3, rngs=nnx.Rngs(0)))
custom("transformer.TransformerDecoder", "positions", "T = 3 > max_positions = 2", ValueError,
       "dec_input", [shape(B, T)], lambda: j_transformer.TransformerDecoder(
           VOCAB, D, F, N, 1, max_positions=2, rngs=nnx.Rngs(0),
           params=transformer_params()["decoder"])(_src(length=T), f32(B, S, D), None))
custom("transformer.TransformerSeq2Seq", "heads", "8 by 3", ValueError, "num_heads", [],
       lambda: j_transformer.TransformerSeq2Seq(VOCAB, VOCAB, D, F, 3, 1, rngs=nnx.Rngs(0)))
custom("transformer.TransformerSeq2Seq", "positions", "greedy max_len 5 > max_positions = 4",
       ValueError, "max_len", ["max_positions = 4"],
       lambda: j_transformer.TransformerSeq2Seq(
           VOCAB, VOCAB, D, F, N, 1, max_positions=4, params=transformer_params(),
           rngs=nnx.Rngs(0)).greedy_decode(_src(length=3), i32([3, 1]), bos_id=1, eos_id=2,
                                           pad_id=0, max_len=5))
custom("transformer.TransformerSeq2Seq", "sizes", "dropout 1.0", ValueError, "dropout", [],
       lambda: j_transformer.TransformerSeq2Seq(VOCAB, VOCAB, D, F, N, 1, 1.0,
                                                params=transformer_params(), rngs=nnx.Rngs(0)))

# decoding and metrics ---------------------------------------------------------------------

_SEARCH = {"bos_id": 1, "eos_id": 2, "pad_id": 0, "max_len": 3}
custom("decoding.greedy_search", "ids", "bos_id 5 of V = 5", ValueError, "bos_id", ["(2, 5)"],
       lambda: j_decoding.greedy_search(greedy_step(), None, B, **{**_SEARCH, "bos_id": 5}))
custom("decoding.greedy_search", "depth", "logits of 3 rows for B = 2", ValueError, "logits",
       [shape(3, 5), "(2, V)"], lambda: j_decoding.greedy_search(greedy_step(rows=3), None, B,
                                                                 **_SEARCH))
custom("decoding.greedy_search", "sizes", "batch_size -1", ValueError, "batch_size", [],
       lambda: j_decoding.greedy_search(greedy_step(), None, -1, **_SEARCH))
custom("decoding.beam_search", "ids", "eos_id 5 of V = 5", ValueError, "eos_id", ["(4, 5)"],
       lambda: j_decoding.beam_search(greedy_step(), f32(B, 1), B, beam_size=2,
                                      **{**_SEARCH, "eos_id": 5}))
custom("decoding.beam_search", "batch", "state leaf of batch 3", ValueError, "state leaf",
       [shape(3, 1)], lambda: j_decoding.beam_search(greedy_step(), f32(3, 1), B, beam_size=2,
                                                     **_SEARCH))
custom("decoding.beam_search", "sizes", "beam_size 0", ValueError, "beam_size", [],
       lambda: j_decoding.beam_search(greedy_step(), f32(B, 1), B, beam_size=0, **_SEARCH))
custom("decoding.beam_search", "empty", "batch_size 0", ValueError, "batch_size", [],
       lambda: j_decoding.beam_search(greedy_step(), f32(0, 1), 0, beam_size=2, **_SEARCH))
custom("metrics.bleu", "dtype", "a list for a sentence", TypeError, "pred_seq", [],
       lambda: j_metrics.bleu(["a"], "a b", 2))
custom("metrics.bleu", "sizes", "k 0", ValueError, "k", [], lambda: j_metrics.bleu("a", "a", 0))
custom("metrics.corpus_bleu", "length", "1 prediction, 2 references", ValueError, "predictions",
       [], lambda: j_metrics.corpus_bleu(["a"], ["a", "b"]))
custom("metrics.corpus_bleu", "dtype", "a str for the corpus", TypeError, "predictions", [],
       lambda: j_metrics.corpus_bleu("a b", ["a b"]))
custom("metrics.corpus_bleu", "sizes", "k 2.0", ValueError, "k", [],
       lambda: j_metrics.corpus_bleu(["a"], ["a"], 2.0))


# --------------------------------------------------------------------------- empty sequences


@dataclass(frozen=True)
class Empty:
    """An input with an axis of size 0 and its defined result: the shapes of the result's leaves
    (``jax.tree.leaves`` order), whether every float in it is zero (the output of a query with no
    key to attend), and the NumPy twin that must give the same."""

    func: str
    detail: str
    jax: Callable
    numpy: Callable | None
    shapes: tuple
    zero: bool = False


EMPTY: list[Empty] = []


def empty(func, detail, shapes, args, kwargs=None, *, zero=False, jax_only=False):
    stem, name = func.split(".")
    kwargs = kwargs or {}
    jax_fn = getattr(JAX_MODULES[stem], name)
    np_fn = None if jax_only else getattr(NUMPY_MODULES.get(stem), name, None)
    # Under jit: the shapes are static, so the result is the eager one, and this shows it.
    EMPTY.append(Empty(func, detail,
                       lambda: jax.jit(functools.partial(jax_fn, **kwargs))(*args()),
                       None if np_fn is None else (lambda: np_fn(*args(), **kwargs)),
                       tuple(shapes), zero))


def empty_custom(func, detail, shapes, jax_call, numpy_call=None, *, zero=False):
    EMPTY.append(Empty(func, detail, jax_call, numpy_call, tuple(shapes), zero))


empty("masking.masked_softmax", "S = 0", [(B, T, 0)], lambda: (f32(B, T, 0), i32([0, 0])))
empty("masking.masked_softmax", "T = 0", [(B, 0, S)], lambda: (f32(B, 0, S), i32([1, 2])))
empty("masking.masked_softmax", "B = 0", [(0, T, S)], lambda: (f32(0, T, S), i32([])))
empty("masking.sequence_mask", "S = 0", [(B, 0)], lambda: (f32(B, 0), i32([0, 0])))
empty("masking.valid_lens_mask", "S = 0", [(B, T, 0)], lambda: (i32([0, 0]),),
      {"num_queries": T, "num_keys": 0})
empty("masking.causal_mask", "T = 0", [(0, S)], lambda: (), {"num_queries": 0, "num_keys": S})
empty("masking.local_window_mask", "T = 0", [(0, S)], lambda: (),
      {"num_queries": 0, "num_keys": S, "local_window_size": (1, 0)})
empty("masking.combine_masks", "T = 0", [(0, S)],
      lambda: (np.ones((0, S), bool), np.ones((1, S), bool)))
empty_custom("masking.attention_mask", "T = 0", [(B, 0, S)],
             lambda: j_masking.attention_mask((B, 0, S), i32([1, 2]), is_causal=True),
             lambda: n_masking.attention_mask((B, 0, S), i32([1, 2]), is_causal=True))
for func in ("scoring.dot_product_attention", "scoring.additive_attention"):
    params = (additive_params(),) if "additive" in func else ()
    empty(func, "S = 0", [(B, T, V), (B, T, 0)],
          lambda params=params: (*params, f32(B, T, Q), f32(B, 0, K), f32(B, 0, V), i32([0, 0])),
          zero=True)
    empty(func, "T = 0", [(B, 0, V), (B, 0, S)],
          lambda params=params: (*params, f32(B, 0, Q), *qkv()[1:], i32([1, 2])))
    empty(func, "B = 0", [(0, T, V), (0, T, S)],
          lambda params=params: (*params, f32(0, T, Q), f32(0, S, K), f32(0, S, V), i32([])))
    empty(func + "_weights", "S = 0", [(B, T, 0)],
          lambda params=params: (*params, f32(B, T, Q), f32(B, 0, K)))
empty_custom("scoring.DotProductAttention", "S = 0", [(B, T, V)],
             lambda: j_scoring.DotProductAttention()(f32(B, T, Q), f32(B, 0, K), f32(B, 0, V)),
             zero=True)
empty_custom("scoring.AdditiveAttention", "S = 0", [(B, T, V)],
             lambda: j_scoring.AdditiveAttention(Q, K, 7, rngs=nnx.Rngs(0))(
                 f32(B, T, Q), f32(B, 0, K), f32(B, 0, V)), zero=True)
empty_custom("efficient.dot_product_attention", "S = 0", [(B, T, V)],
             lambda: j_efficient.dot_product_attention(f32(B, T, Q), f32(B, 0, K), f32(B, 0, V)),
             lambda: n_scoring.dot_product_attention(f32(B, T, Q), f32(B, 0, K), f32(B, 0, V))[0],
             zero=True)
empty_custom("efficient.dot_product_attention", "T = 0", [(B, 0, V)],
             lambda: j_efficient.dot_product_attention(f32(B, 0, Q), *qkv()[1:], i32([1, 2])),
             lambda: n_scoring.dot_product_attention(f32(B, 0, Q), *qkv()[1:], i32([1, 2]))[0])
empty("attention_pooling.average_pooling", "K = 0", [(3,), (3, 0)],
      lambda: (f32(3), f32(0), f32(0)), zero=True)
empty("attention_pooling.nadaraya_watson", "K = 0", [(3,), (3, 0)],
      lambda: (f32(3), f32(0), f32(0)), zero=True)
empty("attention_pooling.nadaraya_watson", "Q = 0", [(0,), (0, 4)],
      lambda: (f32(0), rand(4), rand(4)))
empty("attention_pooling.nadaraya_watson_weights", "K = 0", [(3, 0)], lambda: (f32(3), f32(0)))
empty("multihead.split_heads", "T = 0", [(B, N, 0, D // N)], lambda: (f32(B, 0, D),),
      {"num_heads": N})
empty("multihead.merge_heads", "T = 0", [(B, 0, D)], lambda: (f32(B, N, 0, D // N),))
empty("multihead.multi_head_attention", "S = 0", [(B, T, D), (B, N, T, 0)],
      lambda: (mha_params(), f32(B, T, Q), f32(B, 0, K), f32(B, 0, V), i32([0, 0])),
      {"num_heads": N}, zero=True)
empty("multihead.multi_head_attention", "T = 0", [(B, 0, D), (B, N, 0, S)],
      lambda: (mha_params(), f32(B, 0, Q), *qkv()[1:]), {"num_heads": N})
empty_custom("multihead.MultiHeadAttention", "S = 0", [(B, T, D)],
             lambda: j_multihead.MultiHeadAttention(D, N, rngs=nnx.Rngs(0))(
                 f32(B, T, D), f32(B, 0, D), f32(B, 0, D)), zero=True)
empty("positional.add_positional_encoding", "T = 0", [(B, 0, D)], lambda: (f32(B, 0, D),
                                                                            f32(5, D)))
empty("positional.learned_positional_encoding", "T = 0", [(B, 0, D)],
      lambda: (f32(5, D), f32(B, 0, D)))
empty("positional.rotary_embedding", "T = 0", [(B, 0, 4)], lambda: (f32(B, 0, 4),))
empty("positional.relative_positions", "T = 0", [(0, S)], lambda: (),
      {"num_queries": 0, "num_keys": S})
empty("positional.relative_position_buckets", "T = 0", [(0, S)],
      lambda: (np.zeros((0, S), np.int32),), {"num_buckets": 8, "max_distance": 16})
empty("positional.relative_position_bias", "T = 0", [(1, N, 0, S)],
      lambda: (rand(4, N), np.zeros((0, S), np.int32)))
empty_custom("positional.PositionalEncoding", "T = 0", [(B, 0, 4)],
             lambda: j_positional.PositionalEncoding(4, 0.0, max_len=5)(f32(B, 0, 4)))
empty_custom("positional.RelativePositionBias", "T = 0", [(1, N, 0, S)],
             lambda: j_positional.RelativePositionBias(N, 8, 16, rngs=nnx.Rngs(0))(0, S))
empty("bahdanau.gru", "T = 0", [(B, 0, H_GRU), (L_GRU, B, H_GRU)],
      lambda: (bahdanau_params()["encoder"]["gru"], f32(B, 0, E)))
empty("bahdanau.gru_cell", "B = 0", [(0, H_GRU)],
      lambda: (bahdanau_params()["encoder"]["gru"]["layer_0"], f32(0, E), f32(0, H_GRU)))
empty("bahdanau.encoder", "S = 0", [(B, 0, H_GRU), (L_GRU, B, H_GRU)],
      lambda: (bahdanau_params()["encoder"], np.zeros((B, 0), np.int32)))
empty("bahdanau.decoder", "T = 0", [(B, 0, VOCAB), (L_GRU, B, H_GRU), (B, 0, S)],
      lambda: (bahdanau_params()["decoder"], np.zeros((B, 0), np.int32), gru_state(),
               enc_outputs_gru(), i32([S, 1])))
empty("bahdanau.seq2seq", "S = 0", [(B, T, VOCAB), (B, T, 0)],
      lambda: (bahdanau_params(), np.zeros((B, 0), np.int32), i32([0, 0]),
               np.ones((B, T), np.int32)))
empty("bahdanau.teacher_forcing_inputs", "T = 0", [(B, 0)], lambda: (np.zeros((B, 0), np.int32),),
      {"bos_id": 1})
empty("bahdanau.masked_cross_entropy", "T = 0", [(B,)],
      lambda: (f32(B, 0, VOCAB), np.zeros((B, 0), np.int32), i32([0, 0])), zero=True)
empty_custom("bahdanau.greedy_decode", "B = 0", [(0, 2), (0,), (0, 2, S)],
             lambda: j_bahdanau.greedy_decode(bahdanau_params(), np.zeros((0, S), np.int32),
                                              i32([]), bos_id=1, eos_id=2, pad_id=0, max_len=2),
             lambda: n_bahdanau.greedy_decode(bahdanau_params(), np.zeros((0, S), np.int32),
                                              i32([]), bos_id=1, eos_id=2, pad_id=0, max_len=2))
empty("transformer.position_wise_ffn", "T = 0", [(B, 0, D)],
      lambda: (_block()["ffn"], f32(B, 0, D)))
empty("transformer.layer_norm", "T = 0", [(B, 0, D)], lambda: (_block()["addnorm_1"], f32(B, 0, D)))
empty("transformer.add_norm", "T = 0", [(B, 0, D)],
      lambda: (_block()["addnorm_1"], f32(B, 0, D), f32(B, 0, D)))
empty("transformer.attention", "S = 0", [(B, T, D), (B, N, T, 0)],
      lambda: (_block()["attention"], rand(B, T, D), f32(B, 0, D)), {"num_heads": N}, zero=True)
empty("transformer.encoder_block", "S = 0", [(B, 0, D), (B, N, 0, 0)],
      lambda: (_block(), f32(B, 0, D), i32([0, 0])), {"num_heads": N})
empty("transformer.encoder", "S = 0", [(B, 0, D), (1, B, N, 0, 0)],
      lambda: (transformer_params()["encoder"], np.zeros((B, 0), np.int32), i32([0, 0])),
      {"num_heads": N})
empty("transformer.decoder_block", "T = 0", [(B, 0, D), (B, N, 0, 0), (B, N, 0, S)],
      lambda: (_block("decoder"), f32(B, 0, D), rand(B, S, D), i32([S, 1])), {"num_heads": N})
# float64 encoder outputs: the NumPy decoder computes in float64 (its position table is).
empty("transformer.decoder", "T = 0", [(B, 0, VOCAB), (1, B, N, 0, 0), (1, B, N, 0, S)],
      lambda: (transformer_params()["decoder"], np.zeros((B, 0), np.int32),
               rand(B, S, D).astype(np.float64), i32([S, 1])), {"num_heads": N})
empty("transformer.transformer", "S = 0",
      [(B, T, VOCAB), (1, B, N, T, T), (1, B, N, T, 0), (1, B, N, 0, 0)],
      lambda: (transformer_params(), np.zeros((B, 0), np.int32), i32([0, 0]), _src(length=T)),
      {"num_heads": N})
empty("transformer.teacher_forcing_loss", "T = 0", [(B,)],
      lambda: (transformer_params(), _src(), i32([S, 1]), np.zeros((B, 0), np.int32),
               i32([0, 0]), 1), {"num_heads": N}, zero=True)
empty("transformer.init_decoder_state", "S = 0",
      [(B, 1, N, 0, D // N), (B, 1, N, 0, D // N), (B,), (B, 1, N, 4, D // N),
       (B, 1, N, 4, D // N), (B,)],
      lambda: (transformer_params()["decoder"], f32(B, 0, D), i32([0, 0])),
      {"num_heads": N, "max_len": 4}, jax_only=True)
empty_custom("transformer.greedy_decode", "S = 0", [(B, 2), (B,), (B, 2, 0)],
             lambda: j_transformer.greedy_decode(transformer_params(), np.zeros((B, 0), np.int32),
                                                 i32([0, 0]), **{**_T_GREEDY, "max_len": 2}),
             lambda: n_transformer.greedy_decode(transformer_params(), np.zeros((B, 0), np.int32),
                                                 i32([0, 0]), **{**_T_GREEDY, "max_len": 2}))
empty_custom("decoding.greedy_search", "B = 0", [(0, 3), (0,), (0, 3, 3)],
             lambda: j_decoding.greedy_search(greedy_step(), None, 0, **_SEARCH))
empty_custom("metrics.bleu", "empty prediction", [()],
             lambda: np.asarray(j_metrics.bleu("", "a b", 2)), zero=True)
empty_custom("metrics.corpus_bleu", "empty corpus", [()],
             lambda: np.asarray(j_metrics.corpus_bleu([], [])), zero=True)


# --------------------------------------------------------------------------- traced values


@dataclass(frozen=True)
class Traced:
    """Out-of-range values passed as traced arguments of a jitted function (``bad``), and the same
    values clipped into range (``good``): the documented rule says the results are equal."""

    func: str
    rule: str
    detail: str
    fn: Callable
    bad: Callable
    good: Callable


TRACED: list[Traced] = []


def traced(func, rule, detail, fn, bad, good, static=None):
    """``jax.jit(fn)(*bad())`` must equal ``jax.jit(fn)(*good())`` (one compilation for both)."""
    TRACED.append(Traced(func, rule, detail, functools.partial(fn, **(static or {})), bad, good))


traced("masking.masked_softmax", "lens", "-1 and S + 4", j_masking.masked_softmax,
       lambda: (rand(B, T, S), i32([-1, S + 4])), lambda: (rand(B, T, S), i32([0, S])))
traced("masking.sequence_mask", "lens", "-1 and S + 4", j_masking.sequence_mask,
       lambda: (rand(B, S), i32([-1, S + 4])), lambda: (rand(B, S), i32([0, S])))
traced("masking.valid_lens_mask", "lens", "-1 and S + 4", j_masking.valid_lens_mask,
       lambda: (i32([-1, S + 4]),), lambda: (i32([0, S]),), {"num_queries": T, "num_keys": S})
traced("scoring.dot_product_attention", "lens", "-1 and S + 4", j_scoring.dot_product_attention,
       lambda: (*qkv(), i32([-1, S + 4])), lambda: (*qkv(), i32([0, S])))
traced("scoring.additive_attention", "lens", "-1 and S + 4", j_scoring.additive_attention,
       lambda: (additive_params(), *qkv(), i32([-1, S + 4])),
       lambda: (additive_params(), *qkv(), i32([0, S])))
traced("efficient.dot_product_attention", "lens", "-1 and S + 4",
       j_efficient.dot_product_attention, lambda: (*qkv(k_shape=(B, S, Q)), i32([-1, S + 4])),
       lambda: (*qkv(k_shape=(B, S, Q)), i32([0, S])), {"key_chunk_size": 2})
traced("multihead.multi_head_attention", "lens", "-1 and S + 4", j_multihead.multi_head_attention,
       lambda: (mha_params(), *qkv(), i32([-1, S + 4])),
       lambda: (mha_params(), *qkv(), i32([0, S])), {"num_heads": N})
traced("positional.relative_position_bias", "ids", "-1 and 9 of 4 rows",
       j_positional.relative_position_bias, lambda: (rand(4, N), i32([[-1, 9], [1, 2]])),
       lambda: (rand(4, N), i32([[0, 3], [1, 2]])))
traced("bahdanau.encoder", "ids", "-1 and V + 3", j_bahdanau.encoder,
       lambda: (bahdanau_params()["encoder"], i32([[-1, 2], [VOCAB + 3, 1]])),
       lambda: (bahdanau_params()["encoder"], i32([[0, 2], [VOCAB - 1, 1]])))
traced("bahdanau.decoder_step", "ids", "-1 and V + 3", j_bahdanau.decoder_step,
       lambda: (_decoder(), i32([-1, VOCAB + 3]), gru_state(), enc_outputs_gru(), i32([S, 2])),
       lambda: (_decoder(), i32([0, VOCAB - 1]), gru_state(), enc_outputs_gru(), i32([S, 2])))
traced("bahdanau.masked_cross_entropy", "ids", "labels -1 and V + 3, lengths -1 and T + 4",
       j_bahdanau.masked_cross_entropy,
       lambda: (_logits(), i32([[-1, 2, 3], [VOCAB + 3, 1, 0]]), i32([-1, T + 4])),
       lambda: (_logits(), i32([[0, 2, 3], [VOCAB - 1, 1, 0]]), i32([0, T])))
traced("transformer.encoder", "ids", "-1 and V + 3", j_transformer.encoder,
       lambda: (transformer_params()["encoder"], i32([[-1, 2, 1], [VOCAB + 3, 1, 1]]), i32([3, 2])),
       lambda: (transformer_params()["encoder"], i32([[0, 2, 1], [VOCAB - 1, 1, 1]]), i32([3, 2])),
       {"num_heads": N})
traced("transformer.decoder", "ids", "-1 and V + 3", j_transformer.decoder,
       lambda: (transformer_params()["decoder"], i32([[-1, 2], [VOCAB + 3, 1]]), rand(B, S, D),
                i32([S, 2])),
       lambda: (transformer_params()["decoder"], i32([[0, 2], [VOCAB - 1, 1]]), rand(B, S, D),
                i32([S, 2])), {"num_heads": N})
traced("transformer.decoder_step", "ids", "tokens -1 and V + 3, position past the cache",
       j_transformer.decoder_step,
       lambda: (transformer_params()["decoder"], dict(transformer_state(), position=i32([6, 9])),
                i32([-1, VOCAB + 3])),
       lambda: (transformer_params()["decoder"], dict(transformer_state(), position=i32([3, 3])),
                i32([0, VOCAB - 1])), {"num_heads": N})


# --------------------------------------------------------------------------- the tests


def _runs():
    for c in CASES:
        for impl in ("jax", "numpy", "jit"):
            if getattr(c, impl) is not None:
                yield pytest.param(c, impl, id=f"{c.id}-{impl}")


@pytest.mark.parametrize("case, impl", list(_runs()))
def test_bad_input_raises_naming_the_argument_and_the_shapes(case, impl):
    with pytest.raises(case.error) as info:
        getattr(case, impl)()
    message = str(info.value)
    assert case.arg in message, f"{case.arg!r} not named in: {message}"
    for expected in case.shapes:
        assert expected in message, f"{expected!r} missing from: {message}"


def _leaves(tree):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


@pytest.mark.parametrize("case", EMPTY, ids=lambda c: f"{c.func}-{c.detail}")
def test_empty_sequences_give_defined_results(case):
    got = _leaves(case.jax())
    assert [leaf.shape for leaf in got] == list(case.shapes)
    for leaf in got:
        if leaf.dtype.kind == "f":
            assert np.all(np.isfinite(leaf))
            if case.zero:
                np.testing.assert_array_equal(leaf, 0)
    if case.numpy is not None:
        expected = _leaves(case.numpy())
        assert [leaf.shape for leaf in expected] == list(case.shapes)
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", TRACED, ids=lambda c: f"{c.func}-{c.detail}")
def test_traced_out_of_range_values_are_clipped_not_nan(case):
    compiled = jax.jit(case.fn)
    got, expected = _leaves(compiled(*case.bad())), _leaves(compiled(*case.good()))
    for a, b in zip(got, expected, strict=True):
        if a.dtype.kind == "f":
            assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_negative_index_does_not_wrap_around_to_the_last_row():
    # What jnp.take / x[i] would do under jit without the rule: -1 is the last row.
    table = np.arange(8, dtype=np.float32).reshape(4, 2)
    bias = jax.jit(j_positional.relative_position_bias)(table, i32([[-1]]))
    np.testing.assert_array_equal(np.asarray(bias)[0, :, 0, 0], table[0])


def test_shape_checks_hold_under_vmap():
    # vmap sees the per-example shapes: the same error, naming the per-example shapes.
    queries, keys = f32(4, B, T, Q), f32(4, B, S, 3)
    with pytest.raises(ValueError, match=r"queries and keys must have the same size") as info:
        jax.vmap(j_scoring.dot_product_attention)(queries, keys, f32(4, B, S, V))
    assert shape(B, T, Q) in str(info.value) and shape(B, S, 3) in str(info.value)
    with pytest.raises(ValueError, match=r"src must be integer token ids"):
        jax.vmap(lambda src: j_bahdanau.encoder(bahdanau_params()["encoder"], src))(
            np.ones((4, S), np.int32))


def test_vmapped_lengths_are_clipped_like_jitted_ones():
    X = rand(4, B, T, S)
    lens = i32([[-1, S + 2], [0, S], [1, 2], [S, 9]])
    got = jax.vmap(j_masking.masked_softmax)(X, lens)
    expected = np.stack([np.asarray(j_masking.masked_softmax(x, np.clip(l, 0, S)))
                         for x, l in zip(X, lens)])
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6, atol=1e-7)


def test_inventory_is_complete():
    public = set()
    for modules in (JAX_MODULES, NUMPY_MODULES):
        for stem, module in modules.items():
            public |= {f"{stem}.{name}" for name in module.__all__}
    assert public - set(INVENTORY) == set(), "public names missing from the inventory"
    assert set(INVENTORY) - public == set(), "inventory names that are not public"


def test_every_rule_of_the_inventory_is_tested():
    covered = ({(c.func, c.rule) for c in CASES} | {(e.func, "empty") for e in EMPTY}
               | {(t.func, t.rule) for t in TRACED})
    listed = {(func, rule) for func, rules in INVENTORY.items() if not isinstance(rules, str)
              for rule in rules}
    assert all(rule in RULES for _, rule in listed)
    assert listed - covered == set(), "rules listed in the inventory without a test"
    assert covered - listed == set(), "tests of rules the inventory does not list"


def test_numpy_and_jax_cover_the_same_functions():
    # Every case of a function that exists in both packages runs in both (same exception type,
    # same argument named): a NumPy twin is never silently left out.
    for c in CASES:
        stem, name = c.func.split(".")
        twin = NUMPY_MODULES.get(stem) is not None and hasattr(NUMPY_MODULES[stem], name)
        if c.numpy is None and twin and not name[0].isupper():
            assert c.jax is not None
            pytest.fail(f"{c.id}: the NumPy twin is not exercised")
