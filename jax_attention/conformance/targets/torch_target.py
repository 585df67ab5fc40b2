"""``--against torch``: PyTorch's built-ins where they exist, the book's PyTorch code for the rest.

Built-ins, parameters loaded with :func:`jax_attention.interop.to_torch`:

* ``torch.nn.functional.scaled_dot_product_attention`` (output; it returns no weights) — valid
  lengths and boolean masks as its boolean ``attn_mask`` (True = attend), a score bias as a float
  ``attn_mask`` (added to the scores), ``is_causal`` natively;
* ``torch.nn.MultiheadAttention`` (``batch_first``) — valid lengths ``(B,)`` as
  ``key_padding_mask``, per-query lengths and the causal mask as ``attn_mask`` (True = not
  allowed); called as by default (``need_weights=True``, with ``average_attn_weights=False``
  for the weights per head) and with ``need_weights=False`` (output only; PyTorch then takes
  its ``scaled_dot_product_attention`` path);
* ``torch.nn.GRU`` (``batch_first``), ``torch.nn.LayerNorm`` (eps 1e-5) and
  ``torch.nn.functional.embedding`` (the relative position bias table).

The rest runs through :mod:`jax_attention.interop.torch_models`, the book's PyTorch models
rewritten with our masking semantics (fully masked rows: zero weights), loaded with
:func:`~jax_attention.interop.to_torch` (components ``additive_attention``, ``multihead``,
``ffn``, ``layer_norm``, ``gru``, ``bahdanau``, ``transformer``; a block's ``state_dict`` is
assembled from its parts under the book's names). Everything runs on the CPU in eval mode under
``torch.no_grad()``, with the modules and tensors in the run's dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from jax_attention.conformance.cases import Case
from jax_attention.conformance.target import Implementation, Target
from jax_attention.conformance.targets._common import keep_mask, valid_lens_keep


def _import_torch():
    try:
        import torch
    except ImportError as error:
        raise RuntimeError("--against torch needs PyTorch: pip install 'jax-attention[torch]' "
                           f"({error})") from None
    return torch


def _prefixed(prefix: str, state_dict: dict) -> dict:
    return {f"{prefix}{key}": value for key, value in state_dict.items()}


@dataclass(frozen=True)
class _Torch:
    """What every builder below needs: PyTorch, the book's PyTorch code
    (:mod:`jax_attention.interop.torch_models`), the run's dtype and how to load and call a
    module in it."""

    torch: ModuleType
    tm: ModuleType
    to_torch: Callable
    dtype: object  # torch.float64 or torch.float32

    def tensors(self, tree):
        """NumPy (already in the run's dtype; ids int32, masks bool) -> CPU tensors, nested."""
        if isinstance(tree, dict):
            return {name: self.tensors(value) for name, value in tree.items()}
        return None if tree is None else self.torch.from_numpy(np.ascontiguousarray(tree))

    def loaded(self, module, state_dict):
        module = module.to(self.dtype)
        module.load_state_dict(state_dict)  # strict: every key and shape must match
        return module.eval()

    def state(self, params, component):
        return self.to_torch(params, component, dtype=self.dtype)

    def implementation(self, label, forward, not_applicable=None) -> Implementation:
        """``forward(case, inputs as tensors, params as NumPy)`` under ``torch.no_grad()``."""

        def run(case, inputs, params):
            with self.torch.no_grad():
                return forward(case, self.tensors(inputs), params)

        return Implementation(label, run, not_applicable or (lambda case: None))


# The book's PyTorch code: jax_attention.interop.torch_models.
MIRROR = "torch_models."


def _masking_and_pooling(t: _Torch) -> dict[str, list[Implementation]]:
    """Masking and Nadaraya–Watson pooling."""
    tm = t.tm

    def sequence_mask(case, i, p):
        return {"output": tm.sequence_mask(i["X"], i["valid_len"], **case.config)}

    def masked_softmax(case, i, p):
        return {"weights": tm.masked_softmax(i["X"], i.get("valid_lens"), mask=i.get("mask"))}

    def nadaraya_watson(case, i, p):
        output, weights = tm.nadaraya_watson(i["queries"], i["keys"], i["values"],
                                             t.torch.from_numpy(p["w"]))
        return {"output": output, "weights": weights}

    return {
        "masking.sequence_mask": [t.implementation(MIRROR + "sequence_mask", sequence_mask)],
        "masking.masked_softmax": [t.implementation(MIRROR + "masked_softmax", masked_softmax)],
        "attention_pooling.nadaraya_watson": [
            t.implementation(MIRROR + "nadaraya_watson", nadaraya_watson)],
    }


def _positional(t: _Torch) -> dict[str, list[Implementation]]:
    """The sinusoidal encoding, rotary embedding, relative position buckets and bias table."""
    torch, tm = t.torch, t.tm

    def positional(case, i, p):
        T, D = case.config["num_steps"], case.config["num_hiddens"]
        module = tm.PositionalEncoding(D, 0.0, max_len=T).eval()
        return {"P": module(torch.zeros((1, T, D), dtype=t.dtype))[0]}

    def rotary(case, i, p):
        return {"output": tm.rotary_embedding(i["X"], i.get("positions"), **case.config)}

    def buckets(case, i, p):
        return {"buckets": tm.relative_position_buckets(i["relative_positions"], **case.config)}

    def bias_table(case, i, p):
        table = torch.from_numpy(p["table"])
        return {"bias": torch.nn.functional.embedding(i["indices"].long(), table)
                .permute(2, 0, 1).unsqueeze(0)}

    implementation = t.implementation
    return {
        "positional.positional_encoding": [
            implementation(MIRROR + "PositionalEncoding", positional)],
        "positional.rotary_embedding": [implementation(MIRROR + "rotary_embedding", rotary)],
        "positional.relative_position_buckets": [
            implementation(MIRROR + "relative_position_buckets", buckets)],
        "positional.relative_position_bias": [
            implementation("torch.nn.functional.embedding", bias_table)],
    }


def _attend(module, case: Case, i: dict) -> dict:
    """One of the mirror's attention modules called as the book calls it, with the case's masks:
    ``{"output", "weights"}``."""
    output, weights = module(i["queries"], i["keys"], i["values"], i.get("valid_lens"),
                             mask=i.get("mask"), is_causal=bool(case.config.get("is_causal")))
    return {"output": output, "weights": weights}


def _no_score_bias(name: str):
    def reason(case: Case) -> str | None:
        if "bias" in case.inputs:
            return f"{name}, as the book's, takes no score bias"
        return None

    return reason


def _scoring(t: _Torch) -> dict[str, list[Implementation]]:
    """Scaled dot-product attention (the built-in and the mirror) and additive attention."""
    torch, tm = t.torch, t.tm

    def sdpa(case, i, p):
        q, k, v = i["queries"], i["keys"], i["values"]
        T, S = q.shape[1], k.shape[1]
        masks = {n: i[n].numpy() for n in ("valid_lens", "mask") if n in i}
        is_causal = bool(case.config.get("is_causal", False))
        keep = None
        if masks or "bias" in i:  # SDPA refuses is_causal with an attn_mask: fold it in
            keep = keep_mask(masks, T, S, is_causal=is_causal)
            is_causal = False
        attn_mask = None if keep is None else torch.from_numpy(keep)
        if "bias" in i:  # a float attn_mask is added to the scores
            bias = i["bias"]
            attn_mask = bias if attn_mask is None else torch.where(
                attn_mask, bias, torch.tensor(float("-inf"), dtype=bias.dtype))
        return {"output": torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal)}

    def dot_mirror(case, i, p):
        return _attend(tm.DotProductAttention().eval(), case, i)

    def additive(case, i, p):
        (q, h), k = p["W_q"].shape, p["W_k"].shape[0]
        module = t.loaded(tm.AdditiveAttention(q, k, h), t.state(p, "additive_attention"))
        return _attend(module, case, i)

    implementation = t.implementation
    return {
        "scoring.dot_product_attention": [
            implementation("torch.nn.functional.scaled_dot_product_attention", sdpa),
            implementation(MIRROR + "DotProductAttention", dot_mirror,
                           _no_score_bias(MIRROR + "DotProductAttention"))],
        "scoring.additive_attention": [implementation(MIRROR + "AdditiveAttention", additive)],
    }


def _mha_sizes_reason(case: Case) -> str | None:
    W_q, W_o = case.params["W_q"], case.params["W_o"]
    if W_q.shape[0] != W_q.shape[1] or W_o.shape[0] != W_o.shape[1]:
        return (f"torch.nn.MultiheadAttention takes queries of size embed_dim and returns "
                f"embed_dim: W_q {W_q.shape}, W_o {W_o.shape} do not fit")
    return None


def _mha_builtin_reason(case: Case) -> str | None:
    if "fully_masked_row" in case.tags:
        return ("known difference: torch.nn.MultiheadAttention with need_weights=True (its "
                "default) returns NaN for a query that may attend no key "
                "(pytorch/pytorch#160064); ours gives zero weights and the output b_o, as "
                "it does with need_weights=False (next row)")
    return _mha_sizes_reason(case)


def _multihead(t: _Torch) -> dict[str, list[Implementation]]:
    """``torch.nn.MultiheadAttention`` (with and without weights) and the mirror."""
    torch, tm = t.torch, t.tm

    def mha_builtin(case, i, p, need_weights=True):
        N = case.config["num_heads"]
        D = p["W_q"].shape[1]
        has_bias = "b_q" in p
        module = torch.nn.MultiheadAttention(D, N, bias=has_bias, batch_first=True,
                                             kdim=p["W_k"].shape[0], vdim=p["W_v"].shape[0])
        module = t.loaded(module, t.to_torch(p, "torch.nn.MultiheadAttention", dtype=t.dtype,
                                             bias=has_bias))
        q = i["queries"]
        T, S = q.shape[1], i["keys"].shape[1]
        lens = i.get("valid_lens")
        is_causal = bool(case.config.get("is_causal", False))
        key_padding_mask = attn_mask = None
        if lens is not None and lens.dim() == 1:  # its own argument: True = padding
            key_padding_mask = ~torch.from_numpy(valid_lens_keep(lens.numpy(), 1, S)[:, 0])
            lens = None
        keep = keep_mask({} if lens is None else {"valid_lens": lens.numpy()}, T, S,
                         is_causal=is_causal)
        if keep is not None:  # True = not allowed; one (T, S) mask, or one per batch and head
            blocked = torch.from_numpy(~keep)
            attn_mask = (blocked[0] if blocked.shape[0] == 1
                         else blocked.repeat_interleave(N, dim=0))
        output, weights = module(q, i["keys"], i["values"], key_padding_mask=key_padding_mask,
                                 need_weights=need_weights, attn_mask=attn_mask,
                                 average_attn_weights=False)
        return {"output": output, "weights": weights} if need_weights else {"output": output}

    def mha_builtin_unweighted(case, i, p):
        return mha_builtin(case, i, p, need_weights=False)

    def mha_mirror(case, i, p):
        D = p["W_q"].shape[1]
        module = tm.MultiHeadAttention(D, case.config["num_heads"], bias="b_q" in p,
                                       query_size=p["W_q"].shape[0], key_size=p["W_k"].shape[0],
                                       value_size=p["W_v"].shape[0])
        module = t.loaded(module, t.state(p, "multihead"))
        return _attend(module, case, i)

    implementation = t.implementation
    return {"multihead.multi_head_attention": [
        implementation("torch.nn.MultiheadAttention", mha_builtin, _mha_builtin_reason),
        implementation("torch.nn.MultiheadAttention(need_weights=False)",
                       mha_builtin_unweighted, _mha_sizes_reason),
        implementation(MIRROR + "MultiHeadAttention", mha_mirror)]}


def _bahdanau(t: _Torch) -> dict[str, list[Implementation]]:
    """``torch.nn.GRU``, the encoder and the Bahdanau seq2seq model (and its loss)."""
    torch, tm = t.torch, t.tm

    def gru(case, i, p):
        L, (I, g) = len(p), p["layer_0"]["W_x"].shape
        module = t.loaded(torch.nn.GRU(I, g // 3, L, batch_first=True), t.state(p, "gru"))
        outputs, final = module(i["inputs"], i.get("state"))
        return {"outputs": outputs, "state": final}

    def encoder(case, i, p):
        (V, E), h, L = p["embedding"].shape, p["gru"]["layer_0"]["W_h"].shape[0], len(p["gru"])
        state_dict = {"embedding.weight": torch.from_numpy(p["embedding"]),
                      **_prefixed("rnn.", t.state(p["gru"], "gru"))}
        module = t.loaded(tm.Seq2SeqEncoder(V, E, h, L), state_dict)
        outputs, final = module(i["src"])
        return {"outputs": outputs, "state": final}

    def bahdanau_model(p):
        enc, dec = p["encoder"], p["decoder"]
        model = tm.BahdanauSeq2Seq(enc["embedding"].shape[0], dec["embedding"].shape[0],
                                   enc["embedding"].shape[1], dec["attention"]["W_q"].shape[0],
                                   len(enc["gru"]))
        return t.loaded(model, t.state(p, "bahdanau"))

    def seq2seq(case, i, p):
        model = bahdanau_model(p)
        # model(src, src_valid_len, dec_input) is these two lines, less the weights.
        decoder_state = model.decoder.init_state(model.encoder(i["src"]), i["src_valid_len"])
        logits, _, weights = model.decoder(i["dec_input"], decoder_state)
        return {"logits": logits, "weights": weights}

    def bahdanau_loss(case, i, p):
        return {"loss": bahdanau_model(p).loss(i["src"], i["src_valid_len"], i["tgt"],
                                               i["tgt_valid_len"], case.config["bos_id"])}

    implementation = t.implementation
    return {
        "bahdanau.gru": [implementation("torch.nn.GRU", gru)],
        "bahdanau.encoder": [implementation(MIRROR + "Seq2SeqEncoder", encoder)],
        "bahdanau.seq2seq": [implementation(MIRROR + "BahdanauSeq2Seq", seq2seq)],
        "bahdanau.teacher_forcing_loss": [
            implementation(MIRROR + "BahdanauSeq2Seq.loss", bahdanau_loss)],
    }


def _transformer_parts(t: _Torch) -> dict[str, list[Implementation]]:
    """The FFN, ``torch.nn.LayerNorm``, add & norm and the two blocks."""
    torch, tm = t.torch, t.tm

    def ffn(case, i, p):
        module = t.loaded(tm.PositionWiseFFN(*p["W_1"].shape), t.state(p, "ffn"))
        return {"output": module(i["X"])}

    def layer_norm(case, i, p):
        module = t.loaded(torch.nn.LayerNorm(p["gamma"].shape[0], eps=1e-5),
                          t.state(p, "layer_norm"))
        return {"output": module(i["X"])}

    def add_norm(case, i, p):
        module = t.loaded(tm.AddNorm(p["gamma"].shape[0]),
                          _prefixed("ln.", t.state(p, "layer_norm")))
        return {"output": module(i["X"], i["Y"])}

    def block_state(p, parts):
        """A block's state_dict under the book's names, from its parts' conversions."""
        state_dict = {}
        for ours, book, component in parts:
            state_dict.update(_prefixed(book, t.state(p[ours], component)))
        return state_dict

    def encoder_block(case, i, p):
        module = tm.TransformerEncoderBlock(*p["ffn"]["W_1"].shape, case.config["num_heads"])
        module = t.loaded(module, block_state(p, [
            ("attention", "attention.", "multihead"), ("addnorm_1", "addnorm1.ln.", "layer_norm"),
            ("ffn", "ffn.", "ffn"), ("addnorm_2", "addnorm2.ln.", "layer_norm")]))
        output, weights = module(i["X"], i["src_valid_len"])
        return {"output": output, "weights": weights}

    def decoder_block(case, i, p):
        module = tm.TransformerDecoderBlock(*p["ffn"]["W_1"].shape, case.config["num_heads"])
        module = t.loaded(module, block_state(p, [
            ("self_attention", "attention1.", "multihead"),
            ("addnorm_1", "addnorm1.ln.", "layer_norm"),
            ("cross_attention", "attention2.", "multihead"),
            ("addnorm_2", "addnorm2.ln.", "layer_norm"), ("ffn", "ffn.", "ffn"),
            ("addnorm_3", "addnorm3.ln.", "layer_norm")]))
        output, self_weights, cross_weights = module(i["X"], i["enc_outputs"], i["src_valid_len"])
        return {"output": output, "self_weights": self_weights, "cross_weights": cross_weights}

    implementation = t.implementation
    return {
        "transformer.position_wise_ffn": [implementation(MIRROR + "PositionWiseFFN", ffn)],
        "transformer.layer_norm": [implementation("torch.nn.LayerNorm", layer_norm)],
        "transformer.add_norm": [implementation(MIRROR + "AddNorm", add_norm)],
        "transformer.encoder_block": [
            implementation(MIRROR + "TransformerEncoderBlock", encoder_block)],
        "transformer.decoder_block": [
            implementation(MIRROR + "TransformerDecoderBlock", decoder_block)],
    }


def _transformer_model(t: _Torch) -> dict[str, list[Implementation]]:
    """The Transformer seq2seq model (and its loss)."""

    def model(case, p):
        enc, dec = p["encoder"], p["decoder"]
        D, F = enc["blocks"]["block_0"]["ffn"]["W_1"].shape
        net = t.tm.TransformerSeq2Seq(enc["embedding"].shape[0], dec["embedding"].shape[0], D, F,
                                      case.config["num_heads"], len(enc["blocks"]))
        return t.loaded(net, t.state(p, "transformer"))

    def transformer(case, i, p):
        logits, weights = model(case, p).forward_with_weights(
            i["src"], i["src_valid_len"], i["dec_input"])
        return {"logits": logits, **weights}

    def transformer_loss(case, i, p):
        return {"loss": model(case, p).loss(
            i["src"], i["src_valid_len"], i["tgt"], i["tgt_valid_len"], case.config["bos_id"])}

    return {
        "transformer.transformer": [
            t.implementation(MIRROR + "TransformerSeq2Seq", transformer)],
        "transformer.teacher_forcing_loss": [
            t.implementation(MIRROR + "TransformerSeq2Seq.loss", transformer_loss)],
    }


def make_torch_target(dtype: str) -> Target:
    torch = _import_torch()
    from jax_attention.interop import to_torch
    from jax_attention.interop import torch_models as tm

    t = _Torch(torch, tm, to_torch, {"float64": torch.float64, "float32": torch.float32}[dtype])
    implementations = {}
    for build in (_masking_and_pooling, _scoring, _multihead, _positional, _bahdanau,
                  _transformer_parts, _transformer_model):
        implementations.update(build(t))
    environment = {
        "platform": f"PyTorch on the CPU ({torch.get_num_threads()} threads); eval mode, no_grad",
        "precision": f"torch float32 matmul precision {torch.get_float32_matmul_precision()!r}",
        "versions": f"torch {torch.__version__}",
    }
    return Target("torch", "PyTorch built-ins where they exist, the book's PyTorch code "
                           "(jax_attention.interop.torch_models) for the rest",
                  implementations, environment, contextlib.nullcontext)
