"""``bench decode``: greedy translation of the training sources, batched and compiled vs one by one.

The sources are the book's training pairs (``load_data_nmt``, 600 by default), encoded as in
training; the weights come from a checkpoint of ``jax-attention train`` or from a training run
with the book's settings made here. Peers, all greedy (argmax fed back) and all stopping a
sentence at its ``<eos>``:

* ``batched_kv`` (Transformer) — :func:`jax_attention.models.transformer.greedy_decode`: every source
  in one batch, one compiled call (``lax.scan`` over the steps), the key/value cache;
* ``batched_recompute`` (Transformer) — :func:`greedy_decode_recompute`: the same, but each step
  runs the whole decoder over a fixed ``(B, max_len)`` buffer of the tokens so far (causal
  self-attention: position ``t`` reads only positions ``<= t``) instead of updating a cache —
  the fair compiled baseline of the cache;
* ``batched`` (Bahdanau) — :func:`jax_attention.models.bahdanau.greedy_decode` (the GRU state is the
  decoder's whole state);
* ``eager_loop`` — the book's ``predict_seq2seq``: one sentence at a time, our functions called
  without ``jit`` (each operation dispatched on its own; a ``lax.scan`` as one), a Python loop
  per output token that stops at ``<eos>``, the Transformer with its key/value cache
  (:func:`~jax_attention.models.transformer.decoder_step`);
* ``torch_eager_loop`` — the same loop with the PyTorch mirror of the model and the same weights
  (:mod:`jax_attention.interop.torch_models`), under ``torch.inference_mode``. The Bahdanau
  mirror decodes step by step with its GRU state, exactly the book's loop; the Transformer
  mirror has no incremental state, so each token re-runs its decoder on the prefix.

The one-by-one loops are slow, so they translate an evenly spaced subset of the sources
(``eager_sentences``); rates are sentences per second either way. The loops' translations are
checked against the batched ones (``agree``), and the recompute decoder's against the cache's.

A second comparison (Transformer) runs both batched decoders for ``long_steps`` output steps
(50 by default): the cost of recomputing the prefix grows with the square of the length, the
cache's linearly.

The Transformer's record also holds ``kv_cache`` (:func:`kv_cache_footprint`): the bytes its
key/value cache takes per token, with and without grouped-query attention (every ``N_kv``
dividing ``N``: ``N`` is plain multi-head attention, 1 multi-query), for the model's sizes and
the book's — measured on the state :func:`jax_attention.models.transformer.init_decoder_state` returns
(the ``nbytes`` of its cache leaves over the positions they hold), with the formula
``2 * L * N_kv * H * itemsize`` beside it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from jax_attention._checks import check_int
from jax_attention.bench.common import (environment, format_environment, format_table,
                                        load_average, summarize, time_interleaved)
from jax_attention.bench.torch_support import torch_model, torch_num_threads
from jax_attention.models.registry import get_model

__all__ = ["MODELS", "greedy_decode_recompute", "kv_cache_footprint", "bench_decode",
           "format_decode"]

#: The models :func:`bench_decode` can decode with, in the order they are run: the names of
#: :data:`jax_attention.models.registry.MODELS` (``bench decode --models`` chooses among them).
MODELS = ("transformer", "bahdanau")


# --------------------------------------------------------------------------- the baseline decoder


@functools.partial(jax.jit, static_argnames=(
    "num_heads", "bos_id", "eos_id", "pad_id", "max_len", "max_positions"))
def _greedy_decode_recompute(params, src, src_valid_len, *, num_heads, bos_id, eos_id, pad_id,
                             max_len, max_positions):
    import jax.numpy as jnp
    from jax import lax

    from jax_attention.models import transformer
    from jax_attention.models.decoding import greedy_search

    enc_outputs, _ = transformer.encoder(params["encoder"], src, src_valid_len,
                                         num_heads=num_heads, max_positions=max_positions)
    B = src.shape[0]

    def step(state, tokens):
        buffer, position = state
        # The token fed at step t is the decoder input at position t.
        buffer = lax.dynamic_update_slice(buffer, tokens[:, None],
                                          (jnp.zeros((), jnp.int32), position))
        logits, weights = transformer.decoder(params["decoder"], buffer, enc_outputs,
                                              src_valid_len, num_heads=num_heads,
                                              max_positions=max_positions)
        step_logits = lax.dynamic_index_in_dim(logits, position, axis=1, keepdims=False)
        cross = lax.dynamic_index_in_dim(weights["encoder_decoder"][-1], position, axis=2,
                                         keepdims=False)  # (B, N, S)
        return step_logits, (buffer, position + 1), jnp.mean(cross, axis=1)

    start = (jnp.full((B, max_len), pad_id, jnp.int32), jnp.zeros((), jnp.int32))
    return greedy_search(step, start, B, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                         max_len=max_len)


def greedy_decode_recompute(params, src, src_valid_len, *, num_heads: int, bos_id: int,
                            eos_id: int, pad_id: int, max_len: int,
                            max_positions: int = 1000):
    """Batched greedy Transformer decoding under ``jit`` that recomputes the prefix at every step.

    The baseline of :func:`jax_attention.models.transformer.greedy_decode` (same arguments, same
    results): no key/value cache; step ``t`` writes its input token into a fixed ``(B, max_len)``
    buffer and runs :func:`jax_attention.models.transformer.decoder` over the whole buffer, reading the
    logits at position ``t`` (causal self-attention keeps the positions after ``t`` out). Fixed
    shapes, one compilation; ``max_len`` steps of ``max_len`` positions each.

    Returns:
      ``(tokens (B, max_len) int32, lengths (B,) int32, weights (B, max_len, S))`` as
      :func:`~jax_attention.models.transformer.greedy_decode`.
    """
    import jax.numpy as jnp

    from jax_attention._checks import (check_max_len_fits,
                                       check_positions,
                                       check_tokens)

    src = check_tokens("src", src, jnp.shape(params["encoder"]["embedding"])[0], ndim=2)
    check_positions("src", src.shape[1], max_positions)
    max_len = check_max_len_fits(max_len, max_positions)
    return _greedy_decode_recompute(params, src, jnp.asarray(src_valid_len), num_heads=num_heads,
                                    bos_id=bos_id, eos_id=eos_id, pad_id=pad_id,
                                    max_len=max_len, max_positions=max_positions)


# --------------------------------------------------------------------------- the cache's memory


def _cache_variant(sizes: dict, num_kv_heads: int, *, max_len: int, source_len: int,
                   dtype) -> dict:
    """The cache bytes of one ``N_kv``, read off a real decoder state of one sequence."""
    import jax.numpy as jnp

    from jax_attention.models import transformer

    D, N, L = sizes["num_hiddens"], sizes["num_heads"], sizes["num_layers"]
    shapes = transformer.param_shapes(1, 1, D, sizes["ffn_num_hiddens"], L, num_heads=N,
                                      num_kv_heads=num_kv_heads)
    # The state's size depends on the parameters' shapes, not on their values.
    params = jax.tree.map(lambda shape: jnp.zeros(shape, dtype), shapes,
                          is_leaf=lambda x: isinstance(x, tuple))
    state = transformer.init_decoder_state(params["decoder"], jnp.zeros((1, source_len, D), dtype),
                                           None, num_heads=N, max_len=max_len)
    self_bytes = state["self_keys"].nbytes + state["self_values"].nbytes
    cross_bytes = state["cross_keys"].nbytes + state["cross_values"].nbytes
    per_token = self_bytes / max_len  # one sequence: the positions are the cache's M slots
    return {"num_kv_heads": num_kv_heads,
            "attention": "multi-head" if num_kv_heads == N else
                         "multi-query" if num_kv_heads == 1 else "grouped-query",
            "self_keys_shape": list(state["self_keys"].shape),
            "cross_keys_shape": list(state["cross_keys"].shape),
            "bytes_per_token": per_token,
            "cross_bytes_per_source_token": cross_bytes / source_len,
            "formula_bytes_per_token": 2 * L * num_kv_heads * (D // N) * jnp.dtype(dtype).itemsize,
            "bytes_per_sequence": self_bytes + cross_bytes}


def kv_cache_footprint(sizes: dict, *, max_len: int, source_len: int,
                       dtype: str = "float32") -> dict:
    """The Transformer's key/value cache bytes per token, for every ``N_kv`` dividing ``N``.

    Measured, not computed: for each ``N_kv`` the parameters of :func:`~jax_attention.
    transformer.param_shapes` (zeros) give a decoder state of one sequence
    (:func:`~jax_attention.models.transformer.init_decoder_state`, ``max_len`` cache slots, a source of
    ``source_len`` tokens), and ``bytes_per_token`` is the ``nbytes`` of its ``self_keys`` and
    ``self_values`` over ``max_len`` (``cross_bytes_per_source_token``: the encoder–decoder
    cache over ``source_len``). ``formula_bytes_per_token`` is ``2 L N_kv H itemsize``;
    ``saved_factor`` the multi-head bytes over these, ``N / N_kv``.

    Args:
      sizes: ``num_hiddens``, ``ffn_num_hiddens``, ``num_heads``, ``num_layers`` (a config's
        record; other keys are ignored).
      max_len, source_len: ``M`` and ``S``. dtype: the cache's dtype (the parameters').

    Returns:
      ``{"dtype", "max_len", "source_len", "sizes", "variants": [...]}``, the variants from
      ``N_kv = N`` (no grouping) down to 1.
    """
    sizes = {name: int(sizes[name]) for name in
             ("num_hiddens", "ffn_num_hiddens", "num_heads", "num_layers")}
    N = sizes["num_heads"]
    variants = [_cache_variant(sizes, n, max_len=max_len, source_len=source_len, dtype=dtype)
                for n in range(N, 0, -1) if N % n == 0]
    for variant in variants:
        variant["saved_factor"] = variants[0]["bytes_per_token"] / variant["bytes_per_token"]
    return {"dtype": str(dtype), "max_len": max_len, "source_len": source_len, "sizes": sizes,
            "variants": variants}


def _transformer_cache(params, config) -> dict:
    """``kv_cache`` of the record: the model's sizes (its ``num_kv_heads`` marked) and the
    book's, one sequence of ``num_steps`` source and output tokens, in the parameters' dtype."""
    from jax_attention.models.configs import TransformerConfig

    dtype = str(jax.numpy.asarray(params["decoder"]["embedding"]).dtype)
    steps = {"max_len": config["num_steps"], "source_len": config["num_steps"]}
    model = kv_cache_footprint(config, dtype=dtype, **steps)
    model["num_kv_heads"] = config.get("num_kv_heads") or config["num_heads"]
    book = TransformerConfig().record()
    return {"model": model,
            "book": kv_cache_footprint(book, dtype=dtype, max_len=book["num_steps"],
                                       source_len=book["num_steps"])}


#: The registered models whose decoder keeps a key/value cache, and how to measure it.
CACHE_FOOTPRINTS = {"transformer": _transformer_cache}


# --------------------------------------------------------------------------- one sentence at a time


def _eager_bahdanau(params, src_row, valid_len: int, *, bos_id: int, eos_id: int, max_len: int):
    """The book's ``predict_seq2seq`` with our functions, un-jitted: token ids without ``<eos>``."""
    import jax.numpy as jnp

    from jax_attention.models import bahdanau

    src = jnp.asarray(src_row[None])
    src_valid_len = jnp.asarray([valid_len], jnp.int32)
    enc_outputs, state = bahdanau.encoder(params["encoder"], src)
    token, output = bos_id, []
    for _ in range(max_len):
        logits, state, _ = bahdanau.decoder_step(params["decoder"], jnp.asarray([token], jnp.int32),
                                                 state, enc_outputs, src_valid_len)
        token = int(jnp.argmax(logits[0]))
        if token == eos_id:
            break
        output.append(token)
    return output


def _eager_transformer(params, src_row, valid_len: int, *, bos_id: int, eos_id: int,
                       max_len: int, num_heads: int, max_positions: int):
    """The book's ``predict_seq2seq`` with our functions (key/value cache), un-jitted."""
    import jax.numpy as jnp

    from jax_attention.models import transformer

    src = jnp.asarray(src_row[None])
    src_valid_len = jnp.asarray([valid_len], jnp.int32)
    enc_outputs, _ = transformer.encoder(params["encoder"], src, src_valid_len,
                                         num_heads=num_heads, max_positions=max_positions)
    state = transformer.init_decoder_state(params["decoder"], enc_outputs, src_valid_len,
                                           num_heads=num_heads, max_len=max_len)
    token, output = bos_id, []
    for _ in range(max_len):
        logits, state, _ = transformer.decoder_step(params["decoder"], state,
                                                    jnp.asarray([token], jnp.int32),
                                                    num_heads=num_heads,
                                                    max_positions=max_positions)
        token = int(jnp.argmax(logits[0]))
        if token == eos_id:
            break
        output.append(token)
    return output


def _torch_loop(net, src_row, valid_len: int, *, bos_id: int, eos_id: int, max_len: int):
    """The book's ``predict_seq2seq`` with the PyTorch mirror (its ``predict``): the Bahdanau
    decoder one step at a time from its GRU state; the Transformer, which has no incremental
    state, re-running its decoder on the prefix for every new token."""
    return net.predict(src_row, valid_len, bos_id=bos_id, eos_id=eos_id, max_len=max_len)


# --------------------------------------------------------------------------- the benchmark


def _weights(kind: str, checkpoint, *, epochs, seed, data, num_examples, sizes, say):
    """``(params, src_vocab, tgt_vocab, config, source)``: from a checkpoint, or trained here."""
    if checkpoint is not None:
        from jax_attention.runtime.export import load_model

        loaded = load_model(checkpoint)
        if loaded.config["model"] != kind:
            raise ValueError(f"checkpoint {str(checkpoint)!r} holds a {loaded.config['model']} "
                             f"model, expected {kind}")
        return loaded.params, loaded.src_vocab, loaded.tgt_vocab, loaded.config, \
            f"checkpoint {checkpoint}"
    from jax_attention.models.registry import get_model
    from jax_attention.train import train_seq2seq

    spec = get_model(kind)
    model_settings, train_settings, _ = spec.split_settings(
        {"seed": seed, "num_examples": num_examples, **(sizes or {}),
         **({} if epochs is None else {"epochs": epochs})})
    say(f"{kind}: training with the book's settings"
        + (f" ({epochs} epochs)" if epochs is not None else ""))
    result = train_seq2seq(spec, spec.model_config(**model_settings),
                           spec.train_config(**train_settings), data=data, progress=False,
                           log=None)
    return result.params, result.src_vocab, result.tgt_vocab, result.config, \
        f"trained here: {result.config['training']['epochs']} epochs, seed {seed}"


def _rows(tokens, lengths, rows) -> list[list[int]]:
    return [[int(t) for t in tokens[row, :int(lengths[row])]] for row in rows]


def _training_sources(kind: str, src_vocab, tgt_vocab, config, *, num_examples, data, seed):
    """``(src, src_valid_len, n)``: the training pairs' sources, read as the weights were trained
    and checked to share their vocabularies."""
    from jax_attention.data.nmt import load_data_nmt

    examples = config.get("training", {}).get("num_examples", num_examples)
    nmt = load_data_nmt(1, config["num_steps"], examples, data=data, seed=seed)
    if [nmt.src_vocab.idx_to_token, nmt.tgt_vocab.idx_to_token] != \
            [src_vocab.idx_to_token, tgt_vocab.idx_to_token]:
        raise ValueError(f"the {kind} weights were trained on other data: their vocabularies "
                         "differ from those of the training pairs read now")
    return nmt.train.src, nmt.train.src_valid_len, len(nmt.train)


def _transformer_peers(params, config, src, src_valid_len, ids: dict):
    """The Transformer's decoders (see :func:`_decoders`): the KV cache and recomputing."""
    from jax_attention.models import transformer

    heads, positions = config["num_heads"], config["max_positions"]

    def batched(decode, max_len):
        def run():
            return jax.block_until_ready(decode(params, src, src_valid_len, num_heads=heads,
                                                max_len=max_len, max_positions=positions, **ids))
        return run

    def eager(row):
        return _eager_transformer(params, src[row], int(src_valid_len[row]), bos_id=ids["bos_id"],
                                  eos_id=ids["eos_id"], max_len=config["num_steps"],
                                  num_heads=heads, max_positions=positions)

    peers = {"batched_kv": transformer.greedy_decode,
             "batched_recompute": greedy_decode_recompute}
    return batched, peers, eager, _torch_loop


def _bahdanau_peers(params, config, src, src_valid_len, ids: dict):
    """The Bahdanau model's decoders (see :func:`_decoders`)."""
    from jax_attention.models import bahdanau

    def batched(decode, max_len):
        def run():
            return jax.block_until_ready(decode(params, src, src_valid_len, max_len=max_len,
                                                **ids))
        return run

    def eager(row):
        return _eager_bahdanau(params, src[row], int(src_valid_len[row]), bos_id=ids["bos_id"],
                               eos_id=ids["eos_id"], max_len=config["num_steps"])

    return batched, {"batched": bahdanau.greedy_decode}, eager, _torch_loop


#: Each registered model's decoding peers (the registry's names; a test checks that every
#: model of jax_attention.models.registry.MODELS has an entry).
DECODING_PEERS = {"transformer": _transformer_peers, "bahdanau": _bahdanau_peers}


def _decoders(kind: str, params, config, src, src_valid_len, ids: dict):
    """The model's decoders: ``(batched, batched_peers, eager, torch_loop)``.

    ``batched(decode, max_len)`` runs one of the compiled ``batched_peers`` over every source
    (the first is the one translation uses; more than one are compared at ``--long-steps``);
    ``eager(row)`` translates one source with our functions un-jitted; ``torch_loop`` does it
    with the PyTorch mirror.
    """
    return DECODING_PEERS[kind](params, config, src, src_valid_len, ids)


def _first_calls(functions: dict) -> tuple[dict, dict]:
    """``(seconds, outputs)`` of each function's first (compiling) call."""
    compile_s, outputs = {}, {}
    for name, function in functions.items():
        start = time.perf_counter()
        outputs[name] = function()
        compile_s[name] = time.perf_counter() - start
    return compile_s, outputs


def _agreement(outputs: dict, batched_peers, subset, n: int) -> tuple[list, dict]:
    """``(reference, agree)``: the first batched peer's translations, and how many sentences
    each peer translated the same."""
    first = next(iter(batched_peers))
    reference = _rows(outputs[first][0], outputs[first][1], range(n))
    agree = {name: sum(out == reference[row] for row, out in zip(subset, outputs[name]))
             for name in ("eager_loop", "torch_eager_loop")}
    for name in batched_peers:
        agree[name] = sum(a == b for a, b in zip(_rows(outputs[name][0], outputs[name][1],
                                                       range(n)), reference))
    return reference, agree


def _decode_peers(samples: dict, batched_peers, n: int, subset, agree: dict,
                  compile_s: dict) -> dict:
    """Each peer's timings, sentences per second, agreement and first call."""
    first = next(iter(batched_peers))
    peers = {}
    for name, times in samples.items():
        count = n if name in batched_peers else len(subset)
        summary = summarize(times)
        peers[name] = {**summary, "sentences": count,
                       "sentences_per_s": count / summary["median_s"],
                       "agree_with_" + first: agree[name],
                       "first_call_s": compile_s[name]}
    return peers


def _decode_ratios(peers: dict, first: str) -> dict:
    """The first batched peer's sentences per second over each loop's and the fastest loop's."""
    best_loop = max(("eager_loop", "torch_eager_loop"), key=lambda k: peers[k]["sentences_per_s"])
    return {
        f"{first}/eager_loop": peers[first]["sentences_per_s"]
        / peers["eager_loop"]["sentences_per_s"],
        f"{first}/torch_eager_loop": peers[first]["sentences_per_s"]
        / peers["torch_eager_loop"]["sentences_per_s"],
        f"{first}/fastest_loop": peers[first]["sentences_per_s"]
        / peers[best_loop]["sentences_per_s"],
    }


def _long_run(batched, batched_peers, n: int, *, long_steps: int, repeats: int,
              warmup: int) -> dict:
    """The cache-vs-recompute comparison: both batched decoders for ``long_steps`` steps."""
    long = {name: batched(decode, long_steps) for name, decode in batched_peers.items()}
    long_outputs = {name: function() for name, function in long.items()}
    long_samples = time_interleaved(long, repeats=repeats, warmup=warmup)
    long_peers = {}
    for name, times in long_samples.items():
        summary = summarize(times)
        long_peers[name] = {**summary, "sentences_per_s": n / summary["median_s"],
                            "output_steps_per_s": n * long_steps / summary["median_s"]}
    long_peers["batched_recompute"]["agree_with_batched_kv"] = int(np.sum(np.all(
        np.asarray(long_outputs["batched_recompute"][0])
        == np.asarray(long_outputs["batched_kv"][0]), axis=1)))
    return {
        "max_len": long_steps, "peers": long_peers,
        "ratio_kv/recompute": long_peers["batched_kv"]["sentences_per_s"]
        / long_peers["batched_recompute"]["sentences_per_s"],
    }


def _bench_model(kind: str, params, src_vocab, tgt_vocab, config, *, num_examples, data, seed,
                 long_steps, eager_sentences, repeats, warmup, torch_threads, say) -> dict:
    import torch

    num_steps = config["num_steps"]
    src, src_valid_len, n = _training_sources(kind, src_vocab, tgt_vocab, config,
                                              num_examples=num_examples, data=data, seed=seed)
    bos_id, eos_id, pad_id = (tgt_vocab[t] for t in ("<bos>", "<eos>", "<pad>"))
    ids = {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id}
    subset = np.unique(np.linspace(0, n - 1, min(eager_sentences, n)).round().astype(int))
    params = jax.tree.map(jax.numpy.asarray, params)
    batched, batched_peers, eager, torch_loop = _decoders(kind, params, config, src,
                                                          src_valid_len, ids)
    spec = get_model(kind)
    net = torch_model(kind, spec.config_class.from_record({**config, "dropout": 0.0}),
                      jax.tree.map(np.asarray, params))
    net.eval()

    def torch_run():
        with torch.inference_mode():
            return [torch_loop(net, src[row], int(src_valid_len[row]), bos_id=bos_id,
                               eos_id=eos_id, max_len=num_steps) for row in subset]

    functions = {name: batched(decode, num_steps) for name, decode in batched_peers.items()}
    functions["eager_loop"] = lambda: [eager(row) for row in subset]
    functions["torch_eager_loop"] = torch_run
    say(f"{kind}: compiling and checking the decoders")
    compile_s, outputs = _first_calls(functions)
    first = next(iter(batched_peers))
    reference, agree = _agreement(outputs, batched_peers, subset, n)
    say(f"{kind}: {warmup} warm-up and {repeats} timed rounds")
    with torch_num_threads(torch_threads):
        samples = time_interleaved(functions, repeats=repeats, warmup=warmup)
    peers = _decode_peers(samples, batched_peers, n, subset, agree, compile_s)
    record = {
        "num_sentences": n,
        "eager_sentences": len(subset),
        "max_len": num_steps,
        "mean_output_tokens": float(np.mean([len(r) for r in reference])),
        "peers": peers,
        "ratios": _decode_ratios(peers, first),
    }
    if kind in CACHE_FOOTPRINTS:
        record["kv_cache"] = CACHE_FOOTPRINTS[kind](params, config)
    if len(batched_peers) > 1:  # the production decoder against the baseline beside it
        second = list(batched_peers)[1]
        record["ratios"][f"{first}/{second}"] = (
            peers[first]["sentences_per_s"] / peers[second]["sentences_per_s"])
        say(f"{kind}: the batched decoders at {long_steps} output steps")
        record["long"] = _long_run(batched, batched_peers, n, long_steps=long_steps,
                                   repeats=repeats, warmup=warmup)
    return record


def bench_decode(models: Sequence[str] = MODELS, *, checkpoints: dict | None = None,
                 epochs: int | None = None, seed: int = 0, data=None, num_examples: int = 600,
                 long_steps: int = 50, eager_sentences: int = 100, repeats: int = 5,
                 warmup: int = 1, torch_threads: int = 1, sizes: dict | None = None,
                 log: Callable[[str], object] | None = None) -> dict:
    """Sentences per second of greedy translation of the training sources, per peer and model.

    Args:
      models: among :data:`MODELS`.
      checkpoints: ``{model: directory}`` of ``jax-attention train`` checkpoints; a model without
        one is trained here with the book's settings (``epochs``, ``sizes`` override them).
      epochs: training epochs when training here (``None``: the book's).
      seed, data, num_examples: the data (and the training here).
      long_steps: output steps of the cache-vs-recompute comparison (Transformer).
      eager_sentences: sources translated by the one-by-one loops (evenly spaced).
      repeats: timed rounds (>= 5); warmup: untimed rounds after the first call.
      torch_threads: PyTorch's threads for its loop (one sentence at a time: 1 is fastest).
      sizes: ``{model: {setting: value}}`` passed to the training here (tests: tiny models).
      log: called with progress lines, or ``None``.

    Returns:
      A JSON-ready dict; see :func:`format_decode`.
    """
    for model in models:
        if model not in MODELS:
            raise ValueError(f"models must be among {MODELS}, got {model!r}")
    check_int("long_steps", long_steps, 1)
    check_int("eager_sentences", eager_sentences, 1)
    say = log or (lambda line: None)
    checkpoints = checkpoints or {}
    record = {"benchmark": "decode", "load_average": {"before": load_average()},
              "settings": {"models": list(models), "seed": seed, "num_examples": num_examples,
                           "long_steps": long_steps, "eager_sentences": eager_sentences,
                           "repeats": repeats, "warmup": warmup, "torch_threads": torch_threads},
              "environment": environment(), "models": {}}
    for model in models:
        params, src_vocab, tgt_vocab, config, source = _weights(
            model, checkpoints.get(model), epochs=epochs, seed=seed, data=data,
            num_examples=num_examples, sizes=(sizes or {}).get(model), say=say)
        result = _bench_model(model, params, src_vocab, tgt_vocab, config,
                              num_examples=num_examples, data=data, seed=seed,
                              long_steps=long_steps, eager_sentences=eager_sentences,
                              repeats=repeats, warmup=warmup, torch_threads=torch_threads,
                              say=say)
        record["models"][model] = {"weights": source, **result}
    record["load_average"]["after"] = load_average()
    return record


def _format_kv_cache(model: str, kv_cache: dict) -> list[str]:
    """A table of the cache's bytes per token, for the model's sizes and the book's."""
    lines = []
    for which, footprint in kv_cache.items():
        sizes = footprint["sizes"]
        rows = [[v["num_kv_heads"], v["attention"], f"{v['bytes_per_token']:.0f}",
                 f"{v['cross_bytes_per_source_token']:.0f}", f"{v['saved_factor']:.1f}x"]
                for v in footprint["variants"]]
        lines += [f"{model} key/value cache ({which}: D {sizes['num_hiddens']}, N "
                  f"{sizes['num_heads']}, L {sizes['num_layers']}, {footprint['dtype']}), "
                  f"measured on init_decoder_state"
                  + (f"; the model has N_kv = {footprint['num_kv_heads']}"
                     if "num_kv_heads" in footprint else ""),
                  format_table(["N_kv", "attention", "bytes/token", "bytes/source token",
                                "saved"], rows)]
    return lines


def format_decode(record: dict) -> str:
    """The environment, then per model a table of the peers, the ratios and the long run."""
    lines = [format_environment(record["environment"])]
    for model, result in record["models"].items():
        first = next(iter(result["peers"]))  # the batched decoder translation uses
        lines += ["", f"{model}: {result['num_sentences']} training sources, greedy, max_len "
                      f"{result['max_len']} (mean output {result['mean_output_tokens']:.1f} "
                      f"tokens); one-by-one loops on {result['eager_sentences']} of them; "
                      f"weights: {result['weights']}"]
        rows = []
        for name, peer in result["peers"].items():
            rows.append([name, peer["sentences"], f"{peer['median_s'] * 1e3:.1f}",
                         f"{peer['sentences_per_s']:.1f}",
                         f"{peer['agree_with_' + first]}/{peer['sentences']}"])
        lines.append(format_table(["peer", "sentences", "median ms", "sentences/s",
                                   f"same as {first}"], rows))
        lines.append("ratios (sentences/s): " + ", ".join(
            f"{name} {value:.1f}x" for name, value in result["ratios"].items()))
        if "long" in result:
            long = result["long"]
            rows = [[name, f"{peer['median_s'] * 1e3:.1f}", f"{peer['sentences_per_s']:.1f}",
                     f"{peer['output_steps_per_s']:.0f}"]
                    for name, peer in long["peers"].items()]
            lines += [f"{model} at {long['max_len']} output steps (every step computed): "
                      f"cache / recompute {long['ratio_kv/recompute']:.1f}x; recompute tokens "
                      f"equal the cache's in {long['peers']['batched_recompute']['agree_with_batched_kv']}"
                      f"/{result['num_sentences']} sentences",
                      format_table(["peer", "median ms", "sentences/s", "output steps/s"], rows)]
        if "kv_cache" in result:
            lines += _format_kv_cache(model, result["kv_cache"])
    load = record["load_average"]
    lines += ["", f"load average (1, 5, 15 min) before {load['before']}, after {load['after']}"]
    return "\n".join(lines)
