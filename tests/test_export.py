"""Trained-model export (jax_attention.runtime.export): models exported by earlier versions still load and
translate the same; save/load round trips the config objects; the config is rebuilt from the
file; errors name the file.

tests/fixtures/exported_main_a86d8b7/ holds a tiny Bahdanau and a tiny Transformer model exported
by main at a86d8b7 (before the registry and the config objects), with the greedy translations
they gave then (``expected_translations.json``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import chex
import numpy as np
import pytest

from jax_attention.runtime import export
from jax_attention.models.configs import BahdanauConfig, TrainConfig, TransformerConfig
from jax_attention.models.registry import MODELS

FIXTURES = Path(__file__).parent / "fixtures" / "exported_main_a86d8b7"
EXPECTED = json.loads((FIXTURES / "expected_translations.json").read_text())
SENTENCES = ["go .", "i lost ."]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_model_exported_by_earlier_main_loads_and_translates_the_same(name):
    loaded = export.load_model(FIXTURES / name)
    assert loaded.spec is MODELS[name]
    assert isinstance(loaded.model_config, MODELS[name].config_class)
    assert loaded.model_config.src_vocab_size == len(loaded.src_vocab) == 30
    assert loaded.model_config.tgt_vocab_size == len(loaded.tgt_vocab) == 23
    assert loaded.train_config == TrainConfig(batch_size=16, lr=0.005, epochs=2,
                                              num_examples=60, seed=0,
                                              val_fraction=loaded.train_config.val_fraction)
    translations = [t.translation for t in loaded.translate(SENTENCES)]
    assert translations == EXPECTED[name]
    # The earlier names give the same object.
    assert export.load_checkpoint(FIXTURES / name).config == loaded.config


def test_the_fixture_configs_are_rebuilt_field_by_field():
    bahdanau = export.load_model(FIXTURES / "bahdanau").model_config
    assert bahdanau == BahdanauConfig(embed_size=8, num_hiddens=8, num_layers=1, dropout=0.1,
                                      num_steps=10, src_vocab_size=30, tgt_vocab_size=23)
    transformer = export.load_model(FIXTURES / "transformer").model_config
    assert transformer == TransformerConfig(num_hiddens=8, ffn_num_hiddens=16, num_heads=2,
                                            num_layers=1, dropout=0.1, num_steps=10,
                                            max_positions=16, src_vocab_size=30,
                                            tgt_vocab_size=23)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_save_then_load_round_trips(name, tmp_path):
    loaded = export.load_model(FIXTURES / name)
    written = export.save_model(tmp_path / "model", loaded.params, loaded.src_vocab,
                                loaded.tgt_vocab, loaded.model_config,
                                training=loaded.train_config)
    again = export.load_model(written)
    assert again.model_config == loaded.model_config
    assert again.train_config == loaded.train_config
    chex.assert_trees_all_equal(again.params, loaded.params)
    record = json.loads((written / "config.json").read_text())
    assert record["format"] == MODELS[name].export_format and record["model"] == name
    assert {key: record[key] for key in loaded.model_config.record()} == \
        loaded.model_config.record()
    assert set(record["versions"]) >= {"jax-attention", "jax", "flax", "optax", "numpy"}


def test_save_refuses_a_config_without_vocabulary_sizes(tmp_path):
    loaded = export.load_model(FIXTURES / "bahdanau")
    with pytest.raises(ValueError, match="vocabulary sizes"):
        export.save_model(tmp_path / "m", loaded.params, loaded.src_vocab, loaded.tgt_vocab,
                          BahdanauConfig())


def test_save_refuses_a_non_export_directory_and_leaves_it_alone(tmp_path):
    loaded = export.load_model(FIXTURES / "bahdanau")
    target = tmp_path / "notes"
    target.mkdir()
    (target / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="holds no checkpoint"):
        export.save_model(target, loaded.params, loaded.src_vocab, loaded.tgt_vocab,
                          loaded.model_config)
    assert (target / "mine.txt").read_text() == "keep me"


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c.update(embed_size=0), r"config.json: embed_size must be an integer >= 1"),
    (lambda c: c.pop("num_layers"), r"config.json lacks \['num_layers'\]"),
    (lambda c: c.update(model="transformer"), r"says model 'transformer' but has the format"),
    (lambda c: c.update(format="jax-attention.other/9"),
     r"is not a Bahdanau checkpoint config nor a Transformer one"),
])
def test_a_damaged_config_is_named(edit, message, tmp_path):
    directory = tmp_path / "model"
    shutil.copytree(FIXTURES / "bahdanau", directory)
    record = json.loads((directory / "config.json").read_text())
    edit(record)
    (directory / "config.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=message):
        export.load_model(directory)


def test_an_export_without_model_key_is_a_bahdanau_one(tmp_path):
    """Exports written before the Transformer carry no "model"."""
    directory = tmp_path / "model"
    shutil.copytree(FIXTURES / "bahdanau", directory)
    record = json.loads((directory / "config.json").read_text())
    del record["model"]
    (directory / "config.json").write_text(json.dumps(record))
    loaded = export.load_model(directory)
    assert loaded.spec is MODELS["bahdanau"]
    np.testing.assert_array_equal(loaded.params["decoder"]["attention"]["w_v"],
                                  export.load_model(FIXTURES / "bahdanau").params["decoder"]
                                  ["attention"]["w_v"])


def test_translate_refuses_what_the_model_cannot_do():
    with pytest.raises(ValueError, match="beam search is not implemented for the bahdanau model"):
        export.load_model(FIXTURES / "bahdanau").translate(SENTENCES, beam_size=2)
    with pytest.raises(ValueError, match="exceeds the model's max_positions = 16"):
        export.load_model(FIXTURES / "transformer").translate(SENTENCES, max_len=17)
