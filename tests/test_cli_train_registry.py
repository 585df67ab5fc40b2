"""``jax-attention train MODEL`` for every registered model: one command per registry entry, its
flags built from the configs' fields, the parsed flags rebuilt into the same configs the Python
API takes (jax_attention.models.registry, jax_attention.models.configs, jax_attention.cli.train)."""

from __future__ import annotations

import dataclasses

import pytest

from jax_attention.cli import build_parser
from jax_attention.cli.train import config_flags
from jax_attention.models.configs import DeviceConfig, LongRunConfig, TrainConfig
from jax_attention.models.registry import MODELS


def _parse(argv):
    args = build_parser().parse_args(argv)
    return args, args.command_parser


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_registered_model_has_a_train_command_with_its_config_flags(name):
    spec = MODELS[name]
    args, _ = _parse(["train", name])
    expected = {**spec.model_config().record(), **spec.train_config().record()}
    for config_class in (spec.config_class, TrainConfig):
        for field in dataclasses.fields(config_class):
            if field.metadata.get("flag"):
                assert getattr(args, field.name) == expected[field.name], field.name
            else:
                assert not hasattr(args, field.name), field.name
    assert args.epochs == spec.default_epochs
    assert str(args.checkpoint) == f"runs/{name}"
    assert hasattr(args, "model_parallel") == spec.tensor_parallel


@pytest.mark.parametrize("name", sorted(MODELS))
def test_parsed_flags_rebuild_the_configs(name):
    spec = MODELS[name]
    flags = [flag for flag, _ in config_flags(spec.config_class)]
    argv = ["train", name, "--num-layers", "3", "--dropout", "0.25", "--lr", "0.01",
            "--seed", "7", "--checkpoint-dir", "ckpts", "--keep", "2", "--devices", "1"]
    assert "--num-layers" in flags and "--dropout" in flags
    args, _ = _parse(argv)
    model_config = spec.config_class(**{f.name: getattr(args, f.name) for f in
                                        dataclasses.fields(spec.config_class)
                                        if hasattr(args, f.name)})
    assert model_config == spec.model_config(num_layers=3, dropout=0.25)
    assert TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                          if hasattr(args, f.name)}) == spec.train_config(lr=0.01, seed=7)
    assert LongRunConfig(**{f.name: getattr(args, f.name) for f in
                            dataclasses.fields(LongRunConfig)}).keep == 2
    assert DeviceConfig(devices=args.devices).devices == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["--embed-size", "0"], "expected an integer >= 1, got 0"),
    (["--dropout", "1"], "expected a number in [0, 1)"),
    (["--lr", "-1"], "expected a finite number > 0"),
    (["--seed", "-1"], "expected an integer >= 0, got -1"),
])
def test_flag_types_come_from_the_config_checks(argv, message, capsys):
    with pytest.raises(SystemExit) as error:
        build_parser().parse_args(["train", "bahdanau", *argv])
    assert error.value.code == 2 and message in capsys.readouterr().err
