"""The NNX plumbing shared by the seq2seq models: a parameter holder, dropout, the model base.

The models (:class:`jax_attention.models.bahdanau.BahdanauSeq2Seq`,
:class:`jax_attention.models.transformer.TransformerSeq2Seq`) are thin NNX shells over their functional
cores, which take the parameters as one nested dict. What the shells have in common lives here:

* :class:`ParamTree`, the one parameter holder: every module says, with
  :meth:`~ParamTree.param_layout`, where each leaf of its part of the nested dict is held (its
  ``nnx.Param`` attributes, or child modules), and :meth:`~ParamTree.params_dict` (the arrays)
  and :meth:`~ParamTree.param_variables` (the Variables, by ``/``-joined path) follow from it.
  Where a leaf is stored fixes its NNX state path, which checkpoints record: the Bahdanau
  modules keep named attributes (``encoder/gru/layers/0/W_x``), the Transformer's blocks one
  ``nnx.Dict`` ``params`` filled by :meth:`~ParamTree.hold` (``.../blocks/0/params/ffn__W_1``);
* :func:`dropout`, the functional (inverted) dropout both functional cores apply;
* :class:`Seq2SeqModule`, the base of the models: the dropout stream and training/evaluation
  mode, sowing the attention weights, the teacher-forced :meth:`~Seq2SeqModule.loss` and
  :meth:`~Seq2SeqModule.greedy_decode` on the model's parameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jax_attention._checks import check_choice, check_dropout
from jax_attention.nn.dropout import dropout  # noqa: F401 (its earlier home; part of __all__)
from jax_attention.params import flatten_params, unflatten_params
from jax_attention.models.translation import masked_cross_entropy, teacher_forcing_inputs

__all__ = ["dropout", "ParamTree", "Seq2SeqModule"]


def _flat_key(path: str) -> str:
    return path.replace("/", "__")


def _values(layout):
    """A layout (nested dict of Variables and ParamTrees) as the nested dict of arrays."""
    if isinstance(layout, ParamTree):
        return layout.params_dict()
    if isinstance(layout, dict):
        return {name: _values(value) for name, value in layout.items()}
    return layout[...]


class ParamTree(nnx.Module):
    """Holds part of a functional core's nested params dict as ``nnx.Param`` leaves.

    A subclass either stores its leaves as named attributes and overrides :meth:`param_layout`,
    or passes the flat ``{"a/b/W": value}`` dict to :meth:`hold`, which keeps them in one
    ``nnx.Dict`` attribute ``params`` (keys with ``/`` written ``__``) and serves the default
    :meth:`param_layout`.
    """

    def hold(self, values: dict) -> None:
        """Keep ``values`` (``{"a/b/W": array}``, in the params dict's order) as ``nnx.Param``."""
        self._paths = tuple(values)
        self.params = nnx.Dict({_flat_key(path): nnx.Param(value) for path, value in values.items()})

    def param_layout(self) -> dict:
        """The module's part of the params dict, with its ``nnx.Param`` (or child
        :class:`ParamTree`) where the arrays go."""
        return unflatten_params({path: self.params[_flat_key(path)] for path in self._paths})

    def params_dict(self) -> dict:
        """The parameters as the functional core's plain nested dict of arrays."""
        return _values(self.param_layout())

    def param_variables(self) -> dict:
        """``{"a/b/W": nnx.Param}``: every Variable of the params dict by its path (to load
        values into the module, e.g. ``module.param_variables()["ffn/W_1"][...] = W_1``)."""
        flat = {}
        for path, leaf in flatten_params(self.param_layout()).items():
            if isinstance(leaf, ParamTree):
                flat.update({f"{path}/{inner}": variable
                             for inner, variable in leaf.param_variables().items()})
            else:
                flat[path] = leaf
        return flat


class Seq2SeqModule(ParamTree):
    """The base of the encoder–decoder models: ``encoder`` and ``decoder`` child modules, whose
    parameters make ``{"encoder": ..., "decoder": ...}``.

    Dropout acts in training mode (the default; ``model.eval()`` turns it off, ``model.train()``
    back on), each call drawing a key from the ``dropout`` stream of the ``rngs`` given at
    construction (forked once, so the model owns its stream). With ``sow_weights=True`` every call
    sows the attention weights as ``nnx.Intermediate`` ``"attention_weights"`` (read them with
    ``nnx.capture``).

    A subclass builds ``self.encoder`` and ``self.decoder``, then calls :meth:`init_dropout`;
    it implements :meth:`forward` and, for :meth:`greedy_decode`, sets ``greedy_decode_function``
    (its functional ``greedy_decode``) and overrides :meth:`decoder_options` when that function
    takes more keyword arguments.
    """

    #: The model's functional ``greedy_decode(params, src, src_valid_len, *, bos_id, eos_id,
    #: pad_id, max_len, **decoder_options)``.
    greedy_decode_function = None

    def init_dropout(self, dropout: float, *, sow_weights: bool, rngs: nnx.Rngs,
                     dtype=None) -> None:
        """The rate, the training mode, the sowing switch, the model's own dropout stream and the
        computation's dtype (:meth:`computation_params`)."""
        if dtype is not None:
            dtype = jnp.dtype(check_choice("dtype", jnp.dtype(dtype).name,
                                           ("float32", "bfloat16", "float16", "float64")))
        self.dtype = dtype
        self.dropout = check_dropout(dropout)
        self.deterministic = False
        self.sow_weights = sow_weights
        self.dropout_rngs = rngs.dropout.fork() if self.dropout > 0 else nnx.data(None)

    def param_layout(self) -> dict:
        return {"encoder": self.encoder, "decoder": self.decoder}

    def _dropout_rng(self):
        """A fresh dropout key in training mode, ``None`` in evaluation mode or without dropout."""
        if self.deterministic or self.dropout == 0.0:
            return None
        return self.dropout_rngs()

    def computation_params(self) -> dict:
        """The parameters the forward pass computes with: :meth:`params_dict`, cast to ``dtype``
        when the model has one (mixed precision: ``bfloat16`` products and activations from the
        ``float32`` parameters that are trained — their gradients come back in ``float32``
        through the cast). The embedding tables keep their dtype: the cores cast the rows they
        look up, so that a table's gradient (the sum over every occurrence of a token) is
        accumulated in float32."""
        params = self.params_dict()
        if self.dtype is None:
            return params

        def cast(path, leaf):
            return leaf if path[-1].key == "embedding" else leaf.astype(self.dtype)

        return jax.tree_util.tree_map_with_path(cast, params)

    def forward(self, src, src_valid_len, dec_input, num_steps=None, segments=None):
        """``(logits (B, T, V), attention weights)`` of the teacher-forced model; ``num_steps``:
        the length the batch was padded to before its padding was cut (``None``: not cut), so
        that its dropout masks are the full-length batch's; ``segments``: a packed batch's
        (:class:`jax_attention.models.packing.Segments`), for a model that takes them."""
        raise NotImplementedError

    def __call__(self, src, src_valid_len, dec_input, *, num_steps=None, segments=None):
        """Teacher-forced logits ``(B, T, V)`` (the weights are sown with ``sow_weights``);
        ``num_steps``, ``segments``: see :meth:`forward`."""
        logits, weights = self.forward(src, src_valid_len, dec_input, num_steps, segments)
        if self.sow_weights:
            self.sow(nnx.Intermediate, "attention_weights", weights)
        return logits

    def loss(self, src, src_valid_len, tgt, tgt_valid_len, *, bos_id: int):
        """The book's per-sequence loss ``(B,)`` (:func:`~jax_attention.models.translation.
        masked_cross_entropy` of teacher forcing), dropout as the mode says."""
        logits = self(src, src_valid_len, teacher_forcing_inputs(tgt, bos_id))
        return masked_cross_entropy(logits, tgt, tgt_valid_len)

    def decoder_options(self) -> dict:
        """The model's own keyword arguments of its functional decoders (none by default)."""
        return {}

    def greedy_decode(self, src, src_valid_len, *, bos_id: int, eos_id: int, pad_id: int,
                      max_len: int):
        """The model's functional ``greedy_decode`` on its parameters (no dropout)."""
        return type(self).greedy_decode_function(
            self.params_dict(), src, src_valid_len, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
            max_len=max_len, **self.decoder_options())
