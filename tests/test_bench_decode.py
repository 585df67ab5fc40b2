"""``bench decode``: the recompute-the-prefix baseline decoder, the record on tiny models, the CLI.

Speed is not tested (tiny models, shared machine); the tests check that every peer translates
the same sentences the same way and that the record holds what the schema promises. The tiny
Transformer has multi-query attention (``num_kv_heads = 1``): every peer, the PyTorch mirror
included, decodes it, and the record's ``kv_cache`` measures its cache against the ungrouped one.
"""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest

pytest.importorskip("torch")

from jax_attention.models import bahdanau, transformer  # noqa: E402
from jax_attention.bench.decode import bench_decode, format_decode, greedy_decode_recompute  # noqa: E402
from jax_attention.cli import main  # noqa: E402
from jax_attention.data.nmt import load_data_nmt  # noqa: E402
from jax_attention.train import save_checkpoint  # noqa: E402

NUM_EXAMPLES = 64
TINY = {
    "transformer": {"num_hiddens": 8, "ffn_num_hiddens": 16, "num_heads": 2, "num_kv_heads": 1,
                    "num_layers": 1, "dropout": 0.0, "num_steps": 6, "max_positions": 16},
    "bahdanau": {"embed_size": 8, "num_hiddens": 8, "num_layers": 1, "dropout": 0.0,
                 "num_steps": 6},
}


def _checkpoint(directory, model: str):
    """A checkpoint of a freshly initialised tiny model on the first pairs: the decoders' speed
    and agreement do not need a trained one, and training would only add compilations."""
    sizes = TINY[model]
    data = load_data_nmt(32, sizes["num_steps"], NUM_EXAMPLES)
    V_src, V_tgt = len(data.src_vocab), len(data.tgt_vocab)
    if model == "transformer":
        params = transformer.init_params(jax.random.key(0), V_src, V_tgt, sizes["num_hiddens"],
                                         sizes["ffn_num_hiddens"], sizes["num_heads"],
                                         sizes["num_layers"], num_kv_heads=sizes["num_kv_heads"])
    else:
        params = bahdanau.init_params(jax.random.key(0), V_src, V_tgt, sizes["embed_size"],
                                      sizes["num_hiddens"], sizes["num_layers"])
    config = {"model": model, "src_vocab_size": V_src, "tgt_vocab_size": V_tgt, **sizes,
              "training": {"num_examples": NUM_EXAMPLES, "seed": 0}}
    return save_checkpoint(directory, params, data.src_vocab, data.tgt_vocab, config)


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def transformer_checkpoint(tmp_path_factory):
    return _checkpoint(tmp_path_factory.mktemp("decode") / "transformer", "transformer")


@pytest.fixture(scope="module")
def record(transformer_checkpoint):
    # long_steps = num_steps: the long run reuses the compiled decoders.
    return bench_decode(["transformer"], checkpoints={"transformer": transformer_checkpoint},
                        long_steps=TINY["transformer"]["num_steps"], eager_sentences=2,
                        repeats=5, warmup=0)


def test_recompute_decoder_equals_the_cached_one(transformer_checkpoint, record):
    """Same tokens, lengths and weights; the shapes of the record's run (compiled once)."""
    from jax_attention.train import load_checkpoint

    loaded = load_checkpoint(transformer_checkpoint)
    data = load_data_nmt(1, TINY["transformer"]["num_steps"], NUM_EXAMPLES)
    ids = {name: loaded.tgt_vocab[token] for name, token in
           (("bos_id", "<bos>"), ("eos_id", "<eos>"), ("pad_id", "<pad>"))}
    args = (loaded.params, data.train.src, data.train.src_valid_len)
    kwargs = {"num_heads": 2, "max_len": TINY["transformer"]["num_steps"], "max_positions": 16,
              **ids}
    cached = transformer.greedy_decode(*args, **kwargs)
    recomputed = greedy_decode_recompute(*args, **kwargs)
    np.testing.assert_array_equal(recomputed[0], cached[0])
    np.testing.assert_array_equal(recomputed[1], cached[1])
    np.testing.assert_allclose(recomputed[2], cached[2], atol=1e-5)


def test_record_schema_and_agreement(record):
    assert record["benchmark"] == "decode" and list(record["models"]) == ["transformer"]
    result = record["models"]["transformer"]
    assert result["num_sentences"] == NUM_EXAMPLES and result["eager_sentences"] == 2
    assert result["weights"].startswith("checkpoint ")
    peers = result["peers"]
    assert set(peers) == {"batched_kv", "batched_recompute", "eager_loop", "torch_eager_loop"}
    for name, peer in peers.items():
        assert _positive(peer["sentences_per_s"]) and _positive(peer["median_s"])
        # Every peer translates its sentences exactly as the cached batched decoder.
        assert peer["agree_with_batched_kv"] == peer["sentences"], name
    assert all(_positive(ratio) for ratio in result["ratios"].values())
    long = result["long"]
    assert long["max_len"] == TINY["transformer"]["num_steps"]
    assert _positive(long["ratio_kv/recompute"])
    assert long["peers"]["batched_recompute"]["agree_with_batched_kv"] == NUM_EXAMPLES
    json.dumps(record)
    assert "cache / recompute" in format_decode(record)


def test_record_measures_the_key_value_cache_per_token(record):
    """Bytes per token read off the decoder state, with and without grouping: the model's sizes
    (N = 2: N_kv 2 and 1) and the book's (N = 4: N_kv 4, 2, 1), float32."""
    kv_cache = record["models"]["transformer"]["kv_cache"]
    model, book = kv_cache["model"], kv_cache["book"]
    assert model["num_kv_heads"] == 1 and model["dtype"] == "float32"
    assert [v["num_kv_heads"] for v in model["variants"]] == [2, 1]
    assert [v["num_kv_heads"] for v in book["variants"]] == [4, 2, 1]
    # The book's model: L = 2 blocks, H = 8, keys and values, 4 bytes: 2 * 2 * N_kv * 8 * 4.
    assert [v["bytes_per_token"] for v in book["variants"]] == [512, 256, 128]
    assert [v["saved_factor"] for v in book["variants"]] == [1, 2, 4]
    assert book["variants"][2]["attention"] == "multi-query"
    for footprint in (model, book):
        N, L = footprint["sizes"]["num_heads"], footprint["sizes"]["num_layers"]
        H = footprint["sizes"]["num_hiddens"] // N
        ungrouped = footprint["variants"][0]["bytes_per_token"]
        for v in footprint["variants"]:
            assert v["bytes_per_token"] == v["formula_bytes_per_token"] == \
                v["cross_bytes_per_source_token"] == 2 * L * v["num_kv_heads"] * H * 4
            assert v["self_keys_shape"] == [1, L, v["num_kv_heads"], footprint["max_len"], H]
            assert ungrouped / v["bytes_per_token"] == v["saved_factor"] == N / v["num_kv_heads"]
    text = format_decode(record)
    assert "key/value cache (book: D 32, N 4, L 2, float32)" in text
    assert "the model has N_kv = 1" in text


def test_bad_arguments():
    with pytest.raises(ValueError, match="models must be among"):
        bench_decode(["gpt"])
    with pytest.raises(ValueError, match="long_steps must be an integer >= 1"):
        bench_decode(long_steps=0)


def test_cli_with_a_checkpoint_writes_json(tmp_path, capsys):
    checkpoint = _checkpoint(tmp_path / "bahdanau", "bahdanau")
    path = tmp_path / "decode.json"
    status = main(["bench", "decode", "--models", "bahdanau", "--bahdanau-checkpoint",
                   str(checkpoint), "--eager-sentences", "2", "--repeats", "5", "--warmup", "0",
                   "--json", str(path), "--no-progress"])
    assert status == 0
    assert "batched/eager_loop" in capsys.readouterr().out
    written = json.loads(path.read_text())
    result = written["models"]["bahdanau"]
    assert written["command"] == "bench decode" and result["weights"] == f"checkpoint {checkpoint}"
    assert result["num_sentences"] == NUM_EXAMPLES
    assert result["peers"]["eager_loop"]["agree_with_batched"] == 2


def test_cli_rejects_a_checkpoint_of_the_other_model(tmp_path, capsys):
    checkpoint = _checkpoint(tmp_path / "bahdanau", "bahdanau")
    with pytest.raises(SystemExit) as error:
        main(["bench", "decode", "--models", "transformer", "--transformer-checkpoint",
              str(checkpoint), "--no-progress"])
    assert error.value.code == 2
    assert "holds a bahdanau model" in capsys.readouterr().err


def test_every_registered_model_has_decoding_peers():
    from jax_attention.bench.decode import DECODING_PEERS, MODELS
    from jax_attention.models.registry import MODELS as REGISTRY

    assert set(DECODING_PEERS) == set(REGISTRY) == set(MODELS)
