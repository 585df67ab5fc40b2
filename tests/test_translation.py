"""The code every seq2seq model shares (jax_attention.models.translation, jax_attention.models.seq2seq_module).

* one :func:`~jax_attention.models.translation.translate` over a model's decoder, one result type, and
  its rule for ``finished`` (``<eos>`` predicted within ``max_len``), checked on hand-made
  decoder outputs and, on the book's sentences, against the two rules the models used before;
* :func:`~jax_attention.models.translation.evaluate_held_out` with any batched decoder;
* the one parameter holder (:class:`~jax_attention.models.seq2seq_module.ParamTree`): the same NNX
  state paths as before (checkpoints record them) and Variables addressable by params-dict path.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
from flax import nnx

from jax_attention.models import bahdanau, transformer, transformer_cache, transformer_layers, translation
from jax_attention.data.nmt import TranslationArrays, Vocab, load_data_nmt
from jax_attention.params import flatten_params
from jax_attention.models.seq2seq_module import ParamTree, Seq2SeqModule

WORDS = "a b c d e".split()
VOCAB = Vocab([WORDS], reserved_tokens=["<pad>", "<bos>", "<eos>"])
PAD, BOS, EOS = VOCAB["<pad>"], VOCAB["<bos>"], VOCAB["<eos>"]


def test_both_models_share_the_functions_and_the_result_type():
    assert bahdanau.Translation is translation.Translation
    assert transformer.TransformerTranslation is translation.Translation
    assert bahdanau.masked_cross_entropy is translation.masked_cross_entropy
    assert bahdanau.teacher_forcing_inputs is translation.teacher_forcing_inputs
    assert transformer.position_wise_ffn is transformer_layers.position_wise_ffn
    assert transformer.decoder_step is transformer_cache.decoder_step
    assert issubclass(bahdanau.BahdanauSeq2Seq, Seq2SeqModule)
    assert issubclass(transformer.TransformerSeq2Seq, Seq2SeqModule)
    assert issubclass(bahdanau.GRULayer, ParamTree) and issubclass(transformer.AddNorm, ParamTree)


def _fake_decoder(tokens, lengths, scores=None):
    """A decoder returning fixed rows; its weights are ``(max_len, S)`` of row numbers."""
    calls = []

    def decode(src, src_valid_len, *, bos_id, eos_id, pad_id, max_len):
        assert (bos_id, eos_id, pad_id) == (BOS, EOS, PAD)
        calls.append((src.shape, src_valid_len.tolist(), max_len))

        def row_weights(row, steps, valid):
            return {"weights": np.full((max_len, src.shape[1]), row, np.float32)[:steps, :valid]}

        return translation.Decoded(np.asarray(tokens), np.asarray(lengths), row_weights,
                                   None if scores is None else np.asarray(scores))

    return decode, calls


def test_finished_means_eos_was_predicted_within_max_len():
    a, b, c = VOCAB["a"], VOCAB["b"], VOCAB["c"]
    tokens = [[a, EOS, PAD, PAD],   # <eos> at step 1: finished, 2 weight rows
              [a, b, c, a],         # no <eos> in max_len = 4 steps: cut
              [EOS, PAD, PAD, PAD],  # <eos> first: an empty, finished translation
              [a, b, PAD, PAD]]     # a decoder that stopped counting without <eos>: not finished
    decode, calls = _fake_decoder(tokens, [1, 4, 0, 2], scores=[-1.0, -2.0, -3.0, -4.0])
    results = translation.translate(decode, ["a b", "b c", "c", "d e a"], VOCAB, VOCAB, 5,
                                    max_len=4)
    assert calls == [((4, 5), [3, 3, 2, 4], 4)]
    assert [r.tokens for r in results] == [["a"], ["a", "b", "c", "a"], [], ["a", "b"]]
    assert [r.finished for r in results] == [True, False, True, False]
    assert [r.weights.shape for r in results] == [(2, 3), (4, 3), (1, 2), (2, 4)]
    assert [r.score for r in results] == [-1.0, -2.0, -3.0, -4.0]
    for result in results:
        cut = any("no <eos> within max_len = 4" in note for note in result.notes)
        assert cut == (not result.finished)
        assert result.encoder_self is None and result.decoder_self is None


def test_translate_checks_the_decoders_output():
    decode, _ = _fake_decoder([[EOS, PAD]], [0])
    with pytest.raises(ValueError, match=r"tokens \(B, max_len\) = \(1, 3\)"):
        translation.translate(decode, "a", VOCAB, VOCAB, 3)


def test_special_id_names_the_missing_token():
    assert translation.special_id(VOCAB, "<eos>") == EOS
    with pytest.raises(ValueError, match="'<bos>'"):
        translation.special_id(Vocab([WORDS]), "<bos>")


def _former_rules(tokens, lengths, max_len, eos_id):
    """The rules of the former bahdanau.translate and transformer.translate."""
    bahdanau_rule = [int(n) < max_len for n in lengths]
    transformer_rule = [int(n) < max_len and bool(np.any(row == eos_id))
                        for row, n in zip(tokens, lengths)]
    return bahdanau_rule, transformer_rule


@pytest.fixture(scope="module")
def book(data_path):
    """The book's first 600 pairs: vocabularies and the source sentences as the models read them."""
    nmt = load_data_nmt(64, 10, 600, data=data_path)
    stop = {nmt.src_vocab["<eos>"], nmt.src_vocab["<pad>"]}
    sentences = []
    for row in nmt.train.src[::10]:
        words = []
        for i in row:
            if int(i) in stop:
                break
            words.append(nmt.src_vocab.to_tokens(int(i)))
        sentences.append(" ".join(words))
    return nmt, sentences


def _eos_biased(params, eos_id, bias):
    """Random parameters made to predict <eos> early in some rows, late or never in others."""
    params = jax.tree.map(np.array, params)
    params["decoder"]["dense"]["b"][eos_id] += bias
    return params


@pytest.mark.parametrize("name", ["bahdanau", "transformer"])
def test_the_finished_rule_agrees_with_the_former_ones_on_the_books_sentences(book, name):
    nmt, sentences = book
    V_src, V_tgt, eos = len(nmt.src_vocab), len(nmt.tgt_vocab), nmt.tgt_vocab["<eos>"]
    ids = {"bos_id": nmt.tgt_vocab["<bos>"], "eos_id": eos, "pad_id": nmt.tgt_vocab["<pad>"]}
    src = np.stack([nmt.train.src[i] for i in range(0, len(nmt.train), 10)])
    src_valid_len = np.asarray(nmt.train.src_valid_len[::10])
    if name == "bahdanau":
        params = _eos_biased(bahdanau.init_params(jax.random.key(0), V_src, V_tgt, 16, 16, 2),
                             eos, 0.38)
        decoders = {1: functools.partial(bahdanau.greedy_decode, params)}
        translate = functools.partial(bahdanau.translate, params)
    else:
        params = _eos_biased(transformer.init_params(jax.random.key(0), V_src, V_tgt, 16, 32, 2,
                                                     2), eos, 0.85)
        decoders = {1: functools.partial(transformer.greedy_decode, params, num_heads=2),
                    3: functools.partial(transformer.beam_decode, params, num_heads=2,
                                         beam_size=3)}
        translate = functools.partial(transformer.translate, params, num_heads=2)
    seen = set()
    for beam, decode in decoders.items():
        for max_len in (2, 10):
            tokens, lengths = jax.device_get(decode(src, src_valid_len, max_len=max_len,
                                                    **ids))[:2]
            if beam > 1:
                tokens, lengths = tokens[:, 0], lengths[:, 0]
            former = _former_rules(tokens, lengths, max_len, eos)
            extra = {} if name == "bahdanau" else {"beam_size": beam}
            results = translate(sentences, nmt.src_vocab, nmt.tgt_vocab, 10, max_len=max_len,
                                **extra)
            finished = [r.finished for r in results]
            assert finished == former[0] == former[1]
            seen.update(finished)
    assert seen == {True, False}  # both cases occur


def test_evaluate_held_out_with_any_batched_decoder():
    # A decoder that copies its source: with the target equal to the source, BLEU is 1.
    rows = [[VOCAB[w] for w in words] + [EOS] + [PAD] * (5 - len(words))
            for words in (["a", "b", "c", "d"], ["b", "c", "d", "e"], ["c", "d", "e", "a"],
                          ["d", "e", "a", "b"], ["e", "a", "b", "c"])]
    src = np.asarray(rows, np.int32)
    split = TranslationArrays(src, (src != PAD).sum(1).astype(np.int32), src,
                              (src != PAD).sum(1).astype(np.int32))
    shapes = []

    def copy(src, src_valid_len, *, bos_id, eos_id, pad_id, max_len):
        shapes.append(src.shape)
        return src[:, :max_len], np.minimum(src_valid_len - 1, max_len), "extras ignored"

    result = translation.evaluate_held_out(copy, split, VOCAB, VOCAB, max_len=6, batch_size=2,
                                           num_examples_shown=2)
    assert shapes == [(2, 6)] * 3  # the last batch padded to the batch size
    assert result["num_pairs"] == 5 and result["corpus_bleu"] == 1.0
    assert result["mean_sentence_bleu"] == 1.0
    assert result["examples"] == [
        {"source": "a b c d", "translation": "a b c d", "reference": "a b c d", "bleu": 1.0},
        {"source": "b c d e", "translation": "b c d e", "reference": "b c d e", "bleu": 1.0}]


MODELS = {
    "bahdanau": (lambda: bahdanau.BahdanauSeq2Seq(7, 6, 4, 4, 2, 0.1, rngs=nnx.Rngs(0)),
                 ["encoder/embedding", "encoder/gru/layers/1/W_x", "decoder/W_q", "decoder/w_v",
                  "decoder/gru/layers/0/b_h", "decoder/W", "decoder/b", "dropout_rngs/key"]),
    "transformer": (lambda: transformer.TransformerSeq2Seq(7, 6, 4, 8, 2, 2, 0.1,
                                                           rngs=nnx.Rngs(0)),
                    ["encoder/embedding", "encoder/blocks/1/params/attention__W_q",
                     "encoder/blocks/0/params/ffn__b_2", "decoder/blocks/1/params/addnorm_3__gamma",
                     "decoder/blocks/0/params/cross_attention__W_k", "decoder/W", "decoder/b",
                     "dropout_rngs/key"]),
}


def _state_paths(module) -> set[str]:
    flat = nnx.to_flat_state(nnx.state(module))
    return {"/".join(str(part) for part in path) for path, _ in flat}


@pytest.mark.parametrize("name", MODELS)
def test_the_holder_keeps_the_state_paths_and_addresses_variables_by_param_path(name):
    build, some_paths = MODELS[name]
    model = build()
    assert set(some_paths) <= _state_paths(model)
    params = model.params_dict()
    variables = model.param_variables()
    assert list(variables) == list(flatten_params(params))
    for path, value in flatten_params(params).items():
        np.testing.assert_array_equal(variables[path][...], value)
    # Writing through a Variable changes the model's parameters.
    path = "decoder/dense/b"
    variables[path][...] = variables[path][...] + 1.0
    np.testing.assert_array_equal(flatten_params(model.params_dict())[path],
                                  flatten_params(params)[path] + 1.0)
