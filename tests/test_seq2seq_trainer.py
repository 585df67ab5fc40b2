"""train_seq2seq (jax_attention.train.seq2seq) for every registered model: the configs flow into
the result, held-out pairs are scored for any model, the earlier Transformer-only
evaluate_held_out gives the same figures, and bad settings are refused before any work."""

from __future__ import annotations

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
