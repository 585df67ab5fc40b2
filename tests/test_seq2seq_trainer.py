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
