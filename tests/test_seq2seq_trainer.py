"""train_seq2seq (jax_attention.train.seq2seq) for every registered model: the configs flow into
the result, held-out pairs are scored for any model, the earlier Transformer-only
evaluate_held_out gives the same figures, and bad settings are refused before any work."""

from __future__ import annotations

import logging
import threading

import pytest

from jax_attention.data.nmt import load_data_nmt
from jax_attention.models.registry import MODELS
from jax_attention.train import evaluate_held_out, score_held_out, train_seq2seq
from tests.shared_runs import EPOCHS, tiny_settings

#: The session's tiny runs (tests/shared_runs.py), as (model settings, training settings).
_SPLIT = {name: spec.split_settings(tiny_settings(name)) for name, spec in MODELS.items()}
TINY = {name: split[0] for name, split in _SPLIT.items()}
TRAINING = {name: split[1] for name, split in _SPLIT.items()}


@pytest.fixture(scope="module", params=sorted(MODELS))
def run(request, data_path):
    spec = MODELS[request.param]
    result = train_seq2seq(spec, spec.model_config(**TINY[spec.name]),
                           spec.train_config(**TRAINING[spec.name]), data=data_path,
                           progress=False, log=None)
    return spec, result


def test_the_configs_flow_into_the_result(run):
    spec, result = run
    assert result.model_config == spec.model_config(
        **TINY[spec.name], src_vocab_size=len(result.src_vocab),
        tgt_vocab_size=len(result.tgt_vocab))
    assert result.train_config == spec.train_config(**TRAINING[spec.name])
    fingerprint = result.config["data"]
    assert result.config == {"model": spec.name, **result.model_config.record(),
                             "training": result.train_config.record(), "data": fingerprint}
    # The data's fingerprint: the pairs used (training and held out) and the vocabularies.
    assert (fingerprint["src_vocab_size"], fingerprint["tgt_vocab_size"]) == (
        len(result.src_vocab), len(result.tgt_vocab))
    assert fingerprint["num_pairs"] == TRAINING[spec.name]["num_examples"]
    assert len(result.losses) == EPOCHS and len(result.translations) == 4


def test_held_out_pairs_are_scored_for_every_model(run, data_path):
    spec, result = run
    training = TRAINING[spec.name]
    nmt = load_data_nmt(training["batch_size"], TINY[spec.name]["num_steps"],
                        training["num_examples"], data=data_path,
                        val_fraction=training["val_fraction"])
    assert result.validation["num_pairs"] == len(nmt.val) == 16
    assert score_held_out(spec, result.params, result.model_config, nmt.val, result.src_vocab,
                          result.tgt_vocab) == result.validation
    if spec.name == "transformer":  # the earlier, Transformer-only signature
        config = result.model_config
        assert evaluate_held_out(result.params, nmt.val, result.src_vocab, result.tgt_vocab,
                                 num_heads=config.num_heads, num_steps=config.num_steps,
                                 max_positions=config.max_positions) == result.validation


def test_a_config_of_another_model_is_refused():
    with pytest.raises(TypeError, match="model_config must be a TransformerConfig"):
        train_seq2seq("transformer", MODELS["bahdanau"].model_config())


def test_an_unknown_model_is_refused():
    with pytest.raises(ValueError, match=r"model must be one of \['bahdanau', 'transformer'\]"):
        train_seq2seq("lstm")


def test_model_parallel_needs_a_tensor_parallel_model():
    from jax_attention.models.configs import DeviceConfig

    with pytest.raises(ValueError, match="has no tensor-parallel layout"):
        train_seq2seq("bahdanau", devices=DeviceConfig(model_parallel=2))
    from jax_attention.train import train_bahdanau

    with pytest.raises(TypeError, match="unexpected keyword argument 'model_parallel'"):
        train_bahdanau(model_parallel=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'widht'"):
        train_bahdanau(widht=2)


def test_a_failed_background_compile_is_logged_and_the_run_goes_on(monkeypatch, caplog,
                                                                   data_path):
    """The evaluation's programs compile in a background thread while the epochs run; made to
    fail there (and only there), the run still ends with its evaluation, and the thread's error
    is logged once: a warning naming the exception's type and message, with its traceback."""
    from jax_attention.train import seq2seq

    translate_book_pairs = seq2seq._book_translations

    def fails_in_the_background(*args):
        if isinstance(threading.current_thread(), seq2seq._EvaluationCompile):
            raise RuntimeError("planted compile failure")
        return translate_book_pairs(*args)

    monkeypatch.setattr(seq2seq, "_book_translations", fails_in_the_background)
    spec = MODELS["bahdanau"]
    with caplog.at_level(logging.DEBUG, logger=seq2seq.__name__):
        result = train_seq2seq(spec, spec.model_config(**TINY[spec.name]),
                               spec.train_config(**TRAINING[spec.name]), data=data_path,
                               progress=False, log=None)
    assert len(result.losses) == EPOCHS and len(result.translations) == 4
    assert result.validation["num_pairs"] == 16
    records = [record for record in caplog.records if record.name == seq2seq.__name__]
    assert [record.levelno for record in records] == [logging.WARNING, logging.DEBUG]
    warning, debug = records
    assert {warning.threadName, debug.threadName} == {"jax-attention-compile-evaluation"}
    # The warning is one line (no traceback where logging is not configured) ...
    assert "RuntimeError: planted compile failure" in warning.getMessage()
    assert warning.exc_info is None and "\n" not in warning.getMessage()
    # ... and the debug record carries the exception for a user who asks for it.
    assert debug.exc_info is not None and debug.exc_info[0] is RuntimeError
    assert str(debug.exc_info[1]) == "planted compile failure"


@pytest.mark.parametrize("fails", [False, True])
def test_warm_up_runs_once_in_the_background_while_training(fails, caplog, data_path):
    """``warm_up`` (``jax-attention train`` imports its plotting modules with it) is called
    once, in the background thread, after the training step compiled and before the run
    returns; an error in it changes nothing of the run (one debug record)."""
    from jax_attention.train import seq2seq

    calls = []

    def warm_up():
        calls.append(threading.current_thread().name)
        if fails:
            raise ImportError("planted warm-up failure")

    spec = MODELS["bahdanau"]
    with caplog.at_level(logging.DEBUG, logger=seq2seq.__name__):
        result = train_seq2seq(spec, spec.model_config(**TINY[spec.name]),
                               spec.train_config(**TRAINING[spec.name]), data=data_path,
                               progress=False, log=None, warm_up=warm_up)
    assert calls == ["jax-attention-compile-evaluation"]
    assert len(result.losses) == EPOCHS and len(result.translations) == 4
    records = [record for record in caplog.records if record.name == seq2seq.__name__]
    if fails:
        assert [record.levelno for record in records] == [logging.DEBUG]
        assert records[0].exc_info[0] is ImportError
    else:
        assert records == []


@pytest.mark.parametrize("name", sorted(MODELS))
def test_batches_cut_to_the_longest_sentences_give_the_full_length_loss_and_gradients(
        name, data_path):
    """What ``trim_padding`` (on by default) rests on: a batch cut to the training pairs'
    longest sentences (:func:`padded_lengths`, the sources only where the model allows), its loss
    divided by ``num_steps``, gives the full-length batch's loss and gradients to rounding,
    dropout on: every mask is the full-length batch's at the positions kept."""
    import jax
    import numpy as np
    from flax import nnx

    from jax_attention.train.loop import epoch_batches, loss_and_grads, padded_lengths
    from jax_attention.train.seq2seq import setup, training_lengths
    from jax_attention.models.translation import teacher_forcing_inputs

    spec = MODELS[name]
    train_config = spec.train_config(**TRAINING[name])
    model_config = spec.model_config(**{**TINY[name], "dropout": 0.2, "num_steps": 10})
    nmt, _, module, _ = setup(spec, model_config, train_config, data=data_path)
    lengths = training_lengths(spec, nmt, train_config)
    assert lengths == padded_lengths(nmt, trim_source=spec.trims_source)
    assert lengths[1] < nmt.num_steps and (lengths[0] < nmt.num_steps) == spec.trims_source
    bos = nmt.tgt_vocab["<bos>"]

    def loss_and_grads_of(batches, **divisor):  # each from the same dropout key
        src, src_valid_len, tgt, tgt_valid_len = (array[0] for array in batches)
        loss, grads = loss_and_grads(nnx.clone(module), src, src_valid_len,
                                     teacher_forcing_inputs(tgt, bos), tgt, tgt_valid_len,
                                     **divisor)
        return float(loss), jax.tree.leaves(grads)

    full = loss_and_grads_of(epoch_batches(nmt, 0)[0])
    cut_batches, tokens = epoch_batches(nmt, 0, lengths)
    assert cut_batches[0].shape[-1] == lengths[0] and cut_batches[2].shape[-1] == lengths[1]
    assert tokens == epoch_batches(nmt, 0)[1]
    cut = loss_and_grads_of(cut_batches, num_steps=nmt.num_steps)
    assert full[0] > 0 and np.isclose(cut[0], full[0], rtol=1e-5)
    assert len(cut[1]) == len(full[1])
    for got, want in zip(cut[1], full[1], strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-6)
    # Without the book's length the loss is num_steps / T times larger, and the Transformer's
    # masks are others (Bahdanau's, drawn time first, are the full batch's whatever T is).
    plain = loss_and_grads_of(cut_batches)
    ratio = nmt.num_steps / lengths[1]
    assert np.isclose(plain[0], full[0] * ratio, rtol=1e-5) == (name == "bahdanau")
    module.eval()  # no dropout: only the divisor differs
    assert not np.isclose(loss_and_grads_of(epoch_batches(nmt, 0)[0])[0], full[0], rtol=1e-5)
    plain = loss_and_grads_of(cut_batches)
    assert np.isclose(plain[0], loss_and_grads_of(epoch_batches(nmt, 0)[0])[0] * ratio,
                      rtol=1e-5)
    if not spec.trims_source:  # Bahdanau: the encoder's final state runs over the padding
        source_cut = padded_lengths(nmt, trim_source=True)
        other = loss_and_grads_of(epoch_batches(nmt, 0, source_cut)[0], num_steps=nmt.num_steps)
        assert not np.isclose(other[0], full[0], rtol=1e-4)


def test_lengths_that_would_cut_a_sentence_are_refused(data_path):
    from jax_attention.train.loop import epoch_batches, padded_lengths

    nmt = load_data_nmt(8, 10, 60, data=data_path)
    source, target = padded_lengths(nmt)
    with pytest.raises(ValueError, match=r"lengths = \(\d+, \d+\) would cut a sentence"):
        epoch_batches(nmt, 0, (source, target - 1))
    assert padded_lengths(nmt, trim_source=False) == (10, target)


def test_trim_padding_flows_from_the_flag_to_the_record(run):
    spec, result = run
    assert result.train_config.trim_padding is True
    assert result.config["training"]["trim_padding"] is True


def _dtypes_of(primitive: str, jaxpr) -> list[tuple[str, ...]]:
    """The operands' and results' dtype names of every ``primitive`` equation of ``jaxpr``, nested
    ones too (for ``dot_general``: ``(lhs, rhs, result)``)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == primitive:
            found.append(tuple(v.aval.dtype.name for v in (*eqn.invars, *eqn.outvars)))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found.extend(_dtypes_of(primitive, inner))
    return found


@pytest.mark.parametrize("name, seed, dtype", [("bahdanau", 0, "float32"),
                                               ("transformer", 2**40 + 3, "float32"),
                                               ("transformer", 7, "bfloat16")])
def test_setup_builds_in_one_program_what_the_eager_construction_builds(name, seed, dtype,
                                                                        data_path):
    """``setup`` compiles the model's and Adam's initial state as one program: the same
    structure and values, bit for bit, as building the modules eagerly (the book's recipe:
    the parameters' key, dropout's "rbg" key, the model in training mode, clipped Adam), the
    dropout stream included, for any seed (a seed beyond 32 bits too)."""
    import jax
    import numpy as np
    from flax import nnx

    from jax_attention.train.loop import clipped_adam
    from jax_attention.train.seq2seq import setup

    spec = MODELS[name]
    train_config = spec.train_config(**{**TRAINING[name], "seed": seed, "dtype": dtype})
    nmt, model_config, module, optimizer = setup(spec, spec.model_config(**TINY[name]),
                                                 train_config, data=data_path)
    rngs = nnx.Rngs(params=jax.random.key(seed), dropout=jax.random.key(seed, impl="rbg"))
    eager = spec.build(model_config, rngs,
                       dtype=None if dtype == "float32" else jax.numpy.dtype(dtype))
    eager.train()
    eager_optimizer = nnx.Optimizer(eager, clipped_adam(train_config.lr,
                                                        train_config.clip_global_norm),
                                    wrt=nnx.Param)
    graphdef, state = nnx.split((module, optimizer))
    eager_graphdef, eager_state = nnx.split((eager, eager_optimizer))
    assert graphdef == eager_graphdef

    def values(state):
        return [np.asarray(jax.random.key_data(leaf)
                           if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key) else leaf)
                for leaf in jax.tree.leaves(state)]

    assert len(values(state)) == len(values(eager_state)) > 10
    for got, want in zip(values(state), values(eager_state), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bfloat16_training_keeps_float32_weights_moments_and_loss(name, data_path):
    """``dtype="bfloat16"`` (``train --dtype bfloat16``): the forward pass computes from a
    bfloat16 copy of the parameters, its dense products bfloat16 operands accumulated in float32;
    the parameters, their gradients (the embeddings' summed in float32), Adam's moments and the
    loss stay float32, and the first
    step's loss is the float32 one to bfloat16's precision."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from jax_attention.train.loop import epoch_batches, loss_and_grads, train_steps
    from jax_attention.train.seq2seq import setup
    from jax_attention.models.translation import teacher_forcing_inputs

    spec = MODELS[name]
    model_config = spec.model_config(**{**TINY[name], "dropout": 0.0})
    losses = {}
    for dtype in ("float32", "bfloat16"):
        train_config = spec.train_config(**TRAINING[name], dtype=dtype)
        nmt, _, module, optimizer = setup(spec, model_config, train_config, data=data_path)
        batches, _ = epoch_batches(nmt, 0)
        src, src_valid_len, tgt, tgt_valid_len = (array[0] for array in batches)
        bos = nmt.tgt_vocab["<bos>"]
        batch = (src, src_valid_len, teacher_forcing_inputs(tgt, bos), tgt, tgt_valid_len)
        loss, grads = loss_and_grads(module, *batch)
        losses[dtype] = float(loss)
        assert loss.dtype == jnp.float32
        assert {leaf.dtype for leaf in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
        if dtype == "bfloat16":
            assert module.dtype == jnp.bfloat16
            module_def, module_state = nnx.split(module)
            jaxpr = jax.make_jaxpr(lambda state, *b: loss_and_grads(
                nnx.merge(module_def, state), *b))(module_state, *batch).jaxpr
            products = _dtypes_of("dot_general", jaxpr)
            half = products.count(("bfloat16", "bfloat16", "float32"))
            assert half >= len(products) // 2, products  # the dense layers, both ways
            # The embeddings' gradients (a sum over every occurrence of a token) in float32.
            scatters = _dtypes_of("scatter-add", jaxpr)
            assert scatters and all(set(types) <= {"float32", "int32"} for types in scatters)
        graphdef, state = nnx.split((module, optimizer))
        state, step_losses = train_steps(graphdef, state, tuple(a[:1] for a in batches), bos)
        assert np.isfinite(np.asarray(step_losses)).all()
        floats = [leaf for leaf in jax.tree.leaves(state)
                  if jnp.issubdtype(leaf.dtype, jnp.floating)]
        assert floats and {leaf.dtype for leaf in floats} == {jnp.dtype(jnp.float32)}
    assert np.isclose(losses["bfloat16"], losses["float32"], rtol=2e-2)
    assert losses["bfloat16"] != losses["float32"]
