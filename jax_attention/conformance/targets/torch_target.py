"""``--against torch``: PyTorch's built-ins where they exist, the book's PyTorch code for the rest.

Built-ins, parameters loaded with :func:`jax_attention.interop.to_torch`:

* ``torch.nn.functional.scaled_dot_product_attention`` (output; it returns no weights) — valid
  lengths, boolean masks and sliding windows as its boolean ``attn_mask`` (True = attend), a
  score bias as a float ``attn_mask`` (added to the scores), ``is_causal`` and ``scale``
  natively, grouped-query heads ``(B, N_kv, S, d)`` with ``enable_gqa=True``; it has no logit
  soft-capping (n/a);
* ``torch.nn.attention.flex_attention`` (output), called eagerly — every dot-product case: the
  masks as its block mask, the logit soft cap and a score bias as its ``score_mod``, ``scale``
  and ``enable_gqa`` natively;
* on the mods' cases (``mods.dot_product_attention``): ``flex_attention`` (output and
  log-sum-exp) with the case's mask and score mods written here with torch operations (its own
  idiom: functions of ``b, h, q_idx, kv_idx`` indexing the case's tensors), the mask as its
  block mask; attention sinks, which it has not, added with its log-sum-exp (``output *
  exp(lse - logaddexp(lse, sink))``, as Hugging Face's FlexAttention path adds gpt-oss's); and
  ``scaled_dot_product_attention`` (output) with the mask mod as a boolean ``attn_mask`` and an
  additive score mod (a bias, ALiBi, clipped or T5 relative biases) as a float one, evaluated in
  NumPy — a soft cap (no bias) and sinks (no log-sum-exp to add them with) n/a for it;
* ``torch.nn.MultiheadAttention`` (``batch_first``) — valid lengths ``(B,)`` as
  ``key_padding_mask``, per-query lengths and the causal mask as ``attn_mask`` (True = not
  allowed); called as by default (``need_weights=True``, with ``average_attn_weights=False``
  for the weights per head) and with ``need_weights=False`` (output only; PyTorch then takes
  its ``scaled_dot_product_attention`` path); a sliding window joins ``attn_mask``, and
  unbatched inputs ``(T, q)`` go in as such, their lengths in ``attn_mask``. It has one
  head count and one head size for queries, keys and values, and no ``scale``: cases with
  grouped-query heads, value heads of another size, a scale or soft-capping are n/a;
* ``torch.nn.functional.linear + scaled_dot_product_attention`` (output) — multi-head attention
  as PyTorch code writes grouped-query attention: the four projections with
  ``torch.nn.functional.linear``, head ``n`` = columns ``n*H .. (n+1)*H - 1``, and
  ``scaled_dot_product_attention`` with ``enable_gqa``, ``scale`` and the masks (a sliding window
  included) as ``attn_mask``; every multi-head case but soft-capping;
* ``torch.nn.GRU`` (``batch_first``), ``torch.nn.LayerNorm`` (eps 1e-5) and
  ``torch.nn.functional.embedding`` (the relative position bias table).

The rest runs through :mod:`jax_attention.interop.torch_models`, the book's PyTorch models
rewritten with our masking semantics (fully masked rows: zero weights), loaded with
:func:`~jax_attention.interop.to_torch` (components ``additive_attention``, ``multihead``,
``ffn``, ``layer_norm``, ``gru``, ``bahdanau``, ``transformer``; a block's ``state_dict`` is
assembled from its parts under the book's names). The mirror's attention modules take a
sliding window as their boolean ``mask``, and ``MultiHeadAttention`` grouped-query heads
(``num_kv_heads``); like the book's, they have no score bias, ``scale``, soft-capping or value
head size of their own, ``DotProductAttention`` no grouped keys and values, and they take valid
lengths (and, for multi-head attention, inputs) only with a batch axis: those cases are n/a for
them. Everything runs on the CPU in eval mode under
``torch.no_grad()``, with the modules and tensors in the run's dtype.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np

from jax_attention.conformance.cases import Case
from jax_attention.conformance.target import Implementation, Target
from jax_attention.conformance.targets._common import (
    first_reason,
    grouped_heads_reason,
    heads,
    keep_mask,
    local_window_keep,
    mha_heads,
    mods_heads,
    mods_reason,
    no_scale_reason,
    no_softcap_reason,
    valid_lens_keep,
    value_head_size_reason,
    window_of,
)
from jax_attention.conformance.targets.torch_mods import flex_mask_mod, flex_score_mod


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
        """``module`` in the run's dtype with ``state_dict`` loaded (strictly), in eval mode."""
        module = module.to(self.dtype)
        module.load_state_dict(state_dict)  # strict: every key and shape must match
        return module.eval()

    def state(self, params, component):
        """Our ``params`` as the ``state_dict`` of ``component``'s PyTorch module, in the run's
        dtype."""
        return self.to_torch(params, component, dtype=self.dtype)

    def implementation(self, label, forward, not_applicable=None) -> Implementation:
        """``forward(case, inputs as tensors, params as NumPy)`` under ``torch.no_grad()``."""

        def run(case, inputs, params):
            with self.torch.no_grad():
                return forward(case, self.tensors(inputs), params)

        return Implementation(label, run, not_applicable or (lambda case: None))


#: The label of FlexAttention's rows.
FLEX = "torch.nn.attention.flex_attention"
#: The prefix of the rows of the book's PyTorch code (jax_attention.interop.torch_models).
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


def _attend(module, case: Case, i: dict, mask=None) -> dict:
    """One of the mirror's attention modules called as the book calls it, with the case's masks
    (``mask``: the case's boolean mask with a sliding window folded in, when it has one):
    ``{"output", "weights"}``."""
    output, weights = module(i["queries"], i["keys"], i["values"], i.get("valid_lens"),
                             mask=i.get("mask") if mask is None else mask,
                             is_causal=bool(case.config.get("is_causal")))
    return {"output": output, "weights": weights}


def _window_mask(t: _Torch, case: Case, i: dict, mask_shape=None):
    """The case's boolean mask with its sliding window ANDed in, as a tensor (True = attend),
    for a module that takes a mask but no window; ``None`` without a window. ``mask_shape``
    shapes the window (``(T, S)`` by default)."""
    window = window_of(case.config)
    if window is None:
        return None
    T, S = i["queries"].shape[-2], i["keys"].shape[-2]
    keep = local_window_keep(T, S, window)
    if mask_shape is not None:
        keep = keep.reshape(mask_shape)
    if i.get("mask") is not None:
        keep = i["mask"].numpy() & keep
    return t.torch.from_numpy(np.ascontiguousarray(keep))


def _no_score_bias(name: str):
    def reason(case: Case) -> str | None:
        if "bias" in case.inputs:
            return f"{name}, as the book's, takes no score bias"
        return None

    return reason


def _no_unbatched_lengths(name: str):
    def reason(case: Case) -> str | None:
        if case.inputs["queries"].ndim == 2 and "valid_lens" in case.inputs:
            return (f"{name}, as the book's, takes valid lengths only with a batch axis ((B,) or "
                    f"(B, T)); the case is unbatched, with valid lengths of shape "
                    f"{case.inputs['valid_lens'].shape}")
        return None

    return reason


def _sdpa_mask(torch, keep, bias):
    """``scaled_dot_product_attention``'s ``attn_mask`` from NumPy ``keep`` (boolean, True =
    attend) and ``bias`` (float, added to the scores), each broadcastable to ``(B, N, T, S)`` or
    ``None``: ``keep`` as a boolean mask, ``bias`` as a float one, and with both the bias where
    attended and ``-inf`` elsewhere."""
    attn_mask = None if keep is None else torch.from_numpy(np.ascontiguousarray(keep))
    if bias is None:
        return attn_mask
    bias = torch.from_numpy(np.ascontiguousarray(bias))  # a float attn_mask is added to the scores
    return bias if attn_mask is None else torch.where(
        attn_mask, bias, torch.tensor(float("-inf"), dtype=bias.dtype))


def _sdpa(t: _Torch, case: Case, i: dict, p: dict) -> dict:
    """``torch.nn.functional.scaled_dot_product_attention`` on the case's heads ``(B, N, T,
    d)``: the masks (and any bias) as its ``attn_mask``, ``is_causal`` natively when it is the
    only mask, ``scale`` and grouped-query heads (``enable_gqa``) natively."""
    torch = t.torch
    arrays = {n: x.numpy() for n, x in i.items()}
    is_causal = bool(case.config.get("is_causal", False))
    # SDPA refuses is_causal with an attn_mask: with any mask, bias or window, fold it in.
    fold = any(n in arrays for n in ("valid_lens", "mask", "bias")) or \
        window_of(case.config) is not None
    h = heads(arrays, case.config, fold_causal=fold, fold_window=True)
    attn_mask = _sdpa_mask(torch, h.keep, h.bias)
    q, k, v = (torch.from_numpy(np.ascontiguousarray(x))
               for x in (h.queries, h.keys, h.values))
    return {"output": h.restore(torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=is_causal and not fold,
        scale=case.config.get("scale"), enable_gqa=h.grouped))}


def _flex(t: _Torch, case: Case, i: dict, p: dict) -> dict:
    """``torch.nn.attention.flex_attention`` on the case's heads ``(B, N, T, d)``."""
    torch = t.torch
    # FlexAttention: the masks (valid lengths, boolean, causal, window) as a block mask, the
    # soft cap and the bias as its score_mod (in the reference's order), scale= and
    # enable_gqa= natively. Called eagerly (no torch.compile): its unfused path, which warns.
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    h = heads({n: x.numpy() for n, x in i.items()}, case.config, fold_causal=True,
              fold_window=True)
    q, k, v = (torch.from_numpy(np.ascontiguousarray(x))
               for x in (h.queries, h.keys, h.values))
    (B, N, T, _), S = q.shape, k.shape[2]
    cap = case.config.get("logit_softcap")
    bias = None if h.bias is None else torch.from_numpy(
        np.broadcast_to(h.bias, (B, N, T, S)).copy())

    def score_mod(score, b, head, t, s):
        if cap is not None:
            score = cap * torch.tanh(score / cap)
        return score if bias is None else score + bias[b, head, t, s]

    block_mask = None
    if h.keep is not None:
        keep = torch.from_numpy(np.broadcast_to(h.keep, (B, N, T, S)).copy())
        block_mask = create_block_mask(lambda b, head, t, s: keep[b, head, t, s], B, N, T, S,
                                       device="cpu")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        output = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                scale=case.config.get("scale"), enable_gqa=h.grouped)
    return {"output": h.restore(output)}


# --------------------------------------------------------------------------- the mods' cases


def _flex_mods(t: _Torch, case: Case, i: dict, p: dict) -> dict:
    """``torch.nn.attention.flex_attention`` on a mods case (output and log-sum-exp,
    ``return_aux=AuxRequest(lse=True)``): its mask mod as a block mask, its score mod as
    ``score_mod``, both written with torch operations; ``scale=`` and ``enable_gqa=`` natively.
    FlexAttention has no sinks: they are added with its log-sum-exp, as code around it does
    (Hugging Face's FlexAttention path for gpt-oss): ``output * exp(lse - lse')``,
    ``lse' = logaddexp(lse, sink)``."""
    torch = t.torch
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    h = heads({n: i[n].numpy() for n in ("queries", "keys", "values")}, {}, fold_causal=False,
              fold_window=False)
    q, k, v = (torch.from_numpy(np.ascontiguousarray(x))
               for x in (h.queries, h.keys, h.values))
    (B, N, T, _), S = q.shape, k.shape[2]
    tables = t.tensors(p)
    block_mask = score_mod = None
    if case.config.get("mask_mod") is not None:
        mask_mod = flex_mask_mod(torch, case.config["mask_mod"], i, (B, N, T, S))
        block_mask = create_block_mask(mask_mod, B, N, T, S, device="cpu")
    if case.config.get("score_mod") is not None:
        score_mod = flex_score_mod(torch, case.config["score_mod"], i, tables, (B, N, T, S))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        output, aux = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                     scale=case.config.get("scale"), enable_gqa=h.grouped,
                                     return_aux=AuxRequest(lse=True))
    lse = aux.lse.to(output.dtype)
    if "sinks" in tables:
        total = torch.logaddexp(lse, tables["sinks"][None, :, None])
        output, lse = output * torch.exp(lse - total)[..., None], total
    return {"output": h.restore(output), "lse": h.restore(lse)}


def _sdpa_mods(t: _Torch, case: Case, i: dict, p: dict) -> dict:
    """``scaled_dot_product_attention`` on a mods case: the mask mod as its boolean ``attn_mask``
    and an additive score mod as a float one (both evaluated in NumPy, :func:`mods_heads`),
    ``scale=`` and ``enable_gqa=`` natively."""
    torch = t.torch
    h = mods_heads(case, {n: x.numpy() for n, x in i.items()}, p)
    q, k, v = (torch.from_numpy(np.ascontiguousarray(x))
               for x in (h.queries, h.keys, h.values))
    return {"output": h.restore(torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=_sdpa_mask(torch, h.keep, h.bias), scale=case.config.get("scale"),
        enable_gqa=h.grouped))}


def _mods(t: _Torch) -> dict[str, list[Implementation]]:
    """The mods' cases: ``scaled_dot_product_attention`` (:func:`_sdpa_mods`) and FlexAttention
    (:func:`_flex_mods`)."""
    sdpa_name = "torch.nn.functional.scaled_dot_product_attention"
    return {"mods.dot_product_attention": [
        t.implementation(sdpa_name, functools.partial(_sdpa_mods, t), mods_reason(sdpa_name)),
        t.implementation(FLEX, functools.partial(_flex_mods, t))]}


def _scoring(t: _Torch) -> dict[str, list[Implementation]]:
    """Scaled dot-product attention (the built-ins, :func:`_sdpa` and :func:`_flex`, and the
    mirror) and additive attention."""
    tm = t.tm

    def dot_mirror(case, i, p):
        return _attend(tm.DotProductAttention().eval(), case, i, _window_mask(t, case, i))

    def additive(case, i, p):
        (q, h), k = p["W_q"].shape, p["W_k"].shape[0]
        module = t.loaded(tm.AdditiveAttention(q, k, h), t.state(p, "additive_attention"))
        return _attend(module, case, i)

    sdpa_name = "torch.nn.functional.scaled_dot_product_attention"
    mirror_name = MIRROR + "DotProductAttention"
    implementation = t.implementation
    return {
        "scoring.dot_product_attention": [
            implementation(sdpa_name, functools.partial(_sdpa, t), no_softcap_reason(sdpa_name)),
            implementation(FLEX, functools.partial(_flex, t)),
            implementation(mirror_name, dot_mirror, first_reason(
                no_scale_reason(mirror_name), no_softcap_reason(mirror_name),
                grouped_heads_reason(mirror_name), _no_unbatched_lengths(mirror_name),
                _no_score_bias(mirror_name)))],
        "scoring.additive_attention": [implementation(MIRROR + "AdditiveAttention", additive)],
    }


def _mha_sizes_reason(case: Case) -> str | None:
    W_q, W_o = case.params["W_q"], case.params["W_o"]
    if W_q.shape[0] != W_q.shape[1] or W_o.shape[0] != W_o.shape[1]:
        return (f"torch.nn.MultiheadAttention takes queries of size embed_dim and returns "
                f"embed_dim: W_q {W_q.shape}, W_o {W_o.shape} do not fit")
    return None


def _mha_variants_reason(name: str, *, grouped: bool = False):
    """What a multi-head module without a value head size of its own, a scale or soft-capping
    (and, unless ``grouped``, without grouped-query heads) cannot express."""
    reasons = [value_head_size_reason(name), no_scale_reason(name), no_softcap_reason(name)]
    return first_reason(*([] if grouped else [grouped_heads_reason(name)]), *reasons)


def _batched_only(name: str):
    def reason(case: Case) -> str | None:
        if case.inputs["queries"].ndim == 2:
            return (f"{name}, as the book's, takes batched inputs (B, T, q) only; the case is "
                    f"unbatched, queries {case.inputs['queries'].shape}")
        return None

    return reason


_MHA = "torch.nn.MultiheadAttention"
#: The label of the multi-head rows computed by PyTorch's projections and SDPA.
MHA_SDPA = "torch.nn.functional.linear + scaled_dot_product_attention"


def _mha_builtin_reason(case: Case) -> str | None:
    if "fully_masked_row" in case.tags:
        return ("known difference: torch.nn.MultiheadAttention with need_weights=True (its "
                "default) returns NaN for a query that may attend no key "
                "(pytorch/pytorch#160064); ours gives zero weights and the output b_o, as "
                "it does with need_weights=False (next row)")
    return _mha_unweighted_reason(case)


def _mha_unweighted_reason(case: Case) -> str | None:
    return first_reason(_mha_variants_reason(_MHA), _mha_sizes_reason)(case)


def _mha_sdpa(t: _Torch, case: Case, i: dict, p: dict) -> dict:
    """Multi-head attention as PyTorch code writes grouped-query attention: projections
    (``torch.nn.functional.linear``, kernels ``(in, out)`` transposed to its ``(out, in)``), heads
    split as the columns ``n*H .. (n+1)*H - 1``, and ``scaled_dot_product_attention`` with
    ``enable_gqa``, ``scale=`` and every mask as its boolean ``attn_mask`` (the causal mask natively
    when alone)."""
    torch = t.torch
    F = torch.nn.functional
    N, N_kv, H, H_v = mha_heads(case)
    P = t.tensors(p)
    unbatched = i["queries"].dim() == 2
    arrays = {n: x.numpy() for n, x in i.items()}
    if unbatched:  # (T, q) -> a batch of one, lengths () / (T,) -> (1,) / (1, T)
        arrays = {n: x[None] if n in ("queries", "keys", "values", "valid_lens")
                  or x.ndim == 3 else x for n, x in arrays.items()}

    def project(name, X, heads, size):
        Y = F.linear(torch.from_numpy(X), P[f"W_{name}"].T, P.get(f"b_{name}"))
        return Y.unflatten(-1, (heads, size)).transpose(1, 2)  # (B, heads, len, size)

    q = project("q", arrays["queries"], N, H)
    k = project("k", arrays["keys"], N_kv, H)
    v = project("v", arrays["values"], N_kv, H_v)
    T, S = q.shape[-2], k.shape[-2]
    is_causal = bool(case.config.get("is_causal", False))
    masks = {n: arrays[n] for n in ("valid_lens",) if n in arrays}
    fold = bool(masks) or "mask" in arrays or "bias" in arrays or \
        window_of(case.config) is not None
    keep = keep_mask(masks, T, S, is_causal=is_causal and fold, window=window_of(case.config))
    keep = None if keep is None else keep[:, None]  # (B | 1, 1, T, S)
    if "mask" in arrays:  # (T, S) or (B | 1, N | 1, T, S)
        mask = arrays["mask"].reshape((1,) * (4 - arrays["mask"].ndim) + arrays["mask"].shape)
        keep = mask if keep is None else keep & mask
    bias = arrays.get("bias")  # (T, S) or (B | 1, N | 1, T, S)
    if bias is not None:
        bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
    attn_mask = _sdpa_mask(torch, keep, bias)
    heads = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, is_causal=is_causal and not fold,
        scale=case.config.get("scale"), enable_gqa=N_kv != N)
    output = F.linear(heads.transpose(1, 2).flatten(2), P["W_o"].T, P.get("b_o"))
    return {"output": output[0] if unbatched else output}


def _multihead(t: _Torch) -> dict[str, list[Implementation]]:
    """``torch.nn.MultiheadAttention`` (with and without weights), the mirror, and PyTorch's
    projections with ``scaled_dot_product_attention`` (:func:`_mha_sdpa`)."""
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
        T, S = q.shape[-2], i["keys"].shape[-2]
        lens = i.get("valid_lens")
        if q.dim() == 2 and lens is not None:  # unbatched, as it takes them: lengths in attn_mask
            lens = lens[None]
        is_causal = bool(case.config.get("is_causal", False))
        key_padding_mask = attn_mask = None
        if lens is not None and lens.dim() == 1 and q.dim() == 3:  # its own argument: True = pad
            key_padding_mask = ~torch.from_numpy(valid_lens_keep(lens.numpy(), 1, S)[:, 0])
            lens = None
        keep = keep_mask({} if lens is None else {"valid_lens": lens.numpy()}, T, S,
                         is_causal=is_causal, window=window_of(case.config))
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
        N, N_kv, _, _ = mha_heads(case)
        grouped = {} if N_kv == N else {"num_kv_heads": N_kv}  # the mirror's grouped-query heads
        module = tm.MultiHeadAttention(D, N, bias="b_q" in p, query_size=p["W_q"].shape[0],
                                       key_size=p["W_k"].shape[0], value_size=p["W_v"].shape[0],
                                       **grouped)
        if grouped:  # to_torch's "multihead" takes W_k, W_v of width D only: nn.Linear by hand
            state = {f"{name}.{kind}": torch.from_numpy(np.ascontiguousarray(
                         p[name if kind == "weight" else "b_" + name[2:]].T)).to(t.dtype)
                     for name in ("W_q", "W_k", "W_v", "W_o")
                     for kind in (("weight", "bias") if "b_q" in p else ("weight",))}
        else:
            state = t.state(p, "multihead")
        module = t.loaded(module, state)
        return _attend(module, case, i, _window_mask(t, case, i))

    implementation = t.implementation
    mirror_name = MIRROR + "MultiHeadAttention"
    return {"multihead.multi_head_attention": [
        implementation(_MHA, mha_builtin, _mha_builtin_reason),
        implementation(_MHA + "(need_weights=False)", mha_builtin_unweighted,
                       _mha_unweighted_reason),
        implementation(mirror_name, mha_mirror, first_reason(
            _mha_variants_reason(mirror_name, grouped=True), _batched_only(mirror_name))),
        implementation(MHA_SDPA, functools.partial(_mha_sdpa, t), no_softcap_reason(MHA_SDPA))]}


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
    """``--against torch``: PyTorch's built-ins and the book's PyTorch code (on the CPU).

    Raises:
      RuntimeError: PyTorch is not installed.
    """
    torch = _import_torch()
    from jax_attention.interop import to_torch
    from jax_attention.interop import torch_models as tm

    t = _Torch(torch, tm, to_torch, {"float64": torch.float64, "float32": torch.float32}[dtype])
    implementations = {}
    for build in (_masking_and_pooling, _scoring, _multihead, _positional, _bahdanau,
                  _transformer_parts, _transformer_model, _mods):
        implementations.update(build(t))
    environment = {
        "platform": f"PyTorch on the CPU ({torch.get_num_threads()} threads); eval mode, no_grad",
        "precision": f"torch float32 matmul precision {torch.get_float32_matmul_precision()!r}",
        "versions": f"torch {torch.__version__}",
    }
    return Target("torch", "PyTorch built-ins where they exist, the book's PyTorch code "
                           "(jax_attention.interop.torch_models) for the rest",
                  implementations, environment, contextlib.nullcontext)
