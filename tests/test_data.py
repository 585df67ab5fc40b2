"""The English–French pipeline (d2l §10.5): lookup, download, preprocessing, vocabulary, batches.

Runs on the real file, ``shared/data/fra-eng.zip`` beside the checkout; the download is tested
with a ``file://`` URL, so nothing here needs the network.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import pickle
import struct
import warnings
import zipfile
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from jax_attention.data import archive, nmt as data
from tests.hypothesis_support import examples
from jax_attention.data.nmt import (
    RESERVED_TOKENS,
    Vocab,
    build_array,
    encode_source,
    load_data_nmt,
    preprocess,
    tokenize,
    truncate_pad,
)

FRA_TXT_SHA1 = "c43f99dce27311d3afd4d3e0716848194cfcc103"  # shared/data/README.md
FRA_TXT_LINES = 167_130
SAMPLE = "Go.\tVa !\nHi.\tSalut !\n"


def book_preprocess_nmt(text):
    """d2l 0.17 ``preprocess_nmt``, verbatim: the ground truth for :func:`preprocess`."""

    def no_space(char, prev_char):
        return char in set(',.!?') and prev_char != ' '

    text = text.replace('\u202f', ' ').replace('\xa0', ' ').lower()
    out = [' ' + char if i > 0 and no_space(char, text[i - 1]) else char
           for i, char in enumerate(text)]
    return ''.join(out)


@pytest.fixture(scope="module")
def raw_text():
    """The whole of fra.txt, found through the default lookup (beside the checkout in CI)."""
    return data.read_fra_eng()


@pytest.fixture(scope="module")
def preprocessed(raw_text):
    return preprocess(raw_text)


@pytest.fixture(scope="module")
def all_pairs(preprocessed):
    """``(source, target, skipped)`` of the whole file."""
    return tokenize(preprocessed, return_skipped=True)


@pytest.fixture(scope="module")
def book_pairs(preprocessed):
    """The first 600 pairs, preprocessing the WHOLE text as the book does."""
    return tokenize(preprocessed, 600)


@pytest.fixture(scope="module")
def nmt():
    return load_data_nmt(batch_size=64, num_steps=8, num_examples=600)


@pytest.fixture
def no_data_anywhere(monkeypatch, tmp_path):
    """No env var, an empty cache and no checkout copy: the lookup finds nothing."""
    monkeypatch.delenv(data.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    missing = [tmp_path / "beside-checkout" / "fra-eng.zip",
               tmp_path / "beside-cwd" / "fra-eng.zip"]
    monkeypatch.setattr(archive, "checkout_candidates", lambda: list(missing))
    return missing


def make_zip(path: Path, member: str = "fra-eng/fra.txt", text: str = SAMPLE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, text)
    return path


# --------------------------------------------------------------------------- the file


@pytest.mark.parametrize("module", [data, archive])
def test_data_modules_import_neither_jax_nor_flax(module):
    tree = ast.parse(Path(module.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert "numpy" in imported or module is archive
    assert not imported & {"jax", "jaxlib", "flax", "optax", "chex"}
    assert imported & {"jax_attention"} == ({"jax_attention"} if module is data else set())


def test_the_archive_names_stay_importable_from_data():
    # jax_attention.data.archive locates and reads the file; jax_attention.data.nmt re-exports it all.
    for name in archive.__all__:
        assert getattr(data, name) is getattr(archive, name), name
    assert set(archive.__all__) - {"ARCHIVE_NAME", "read_text"} <= set(data.__all__)


def test_found_beside_the_checkout(monkeypatch):
    monkeypatch.delenv(data.ENV_VAR, raising=False)
    found = data.find_data()
    assert found in data.checkout_candidates()
    assert found.name == "fra-eng.zip" and found.parent.name == "data"


def test_the_real_file(raw_text):
    assert hashlib.sha1(raw_text.encode("utf-8")).hexdigest() == FRA_TXT_SHA1
    lines = raw_text.split("\n")
    assert lines[-1] == "" and len(lines) - 1 == FRA_TXT_LINES
    # Exactly two columns everywhere in this edition (later ones add attribution columns).
    assert all(line.count("\t") == 1 for line in lines[:-1])
    assert lines[0] == "Go.\tVa !"


def test_explicit_path_and_environment_variable(monkeypatch, tmp_path):
    zip_path = make_zip(tmp_path / "mine.zip")
    assert data.find_data(zip_path) == zip_path
    assert data.read_fra_eng(str(zip_path)) == SAMPLE
    monkeypatch.setenv(data.ENV_VAR, str(zip_path))
    assert data.find_data() == zip_path
    # The argument wins over the environment variable.
    other = make_zip(tmp_path / "other.zip", text="Run!\tCours !\n")
    assert data.read_fra_eng(other) == "Run!\tCours !\n"


@pytest.mark.parametrize("layout", ["folder/fra-eng/fra.txt", "folder/fra.txt", "fra.txt",
                                    "zip-root"])
def test_folder_bare_file_and_zip_layouts(tmp_path, layout):
    if layout == "zip-root":  # manythings.org's own archive holds fra.txt at its root
        location = make_zip(tmp_path / "fra-eng.zip", member="fra.txt")
    else:
        text_file = tmp_path / layout
        text_file.parent.mkdir(parents=True, exist_ok=True)
        text_file.write_text(SAMPLE, encoding="utf-8")
        location = tmp_path / "folder" if layout.startswith("folder") else text_file
    assert data.find_data(location) == location
    if layout == "zip-root":  # a fra-eng.zip that is not d2l's: one warning, then used
        with pytest.warns(data.UnknownArchiveWarning):
            assert data.read_fra_eng(location) == SAMPLE
    else:
        assert data.read_fra_eng(location) == SAMPLE
    assert load_data_nmt(2, 4, num_examples=2, data=location).train.src.shape == (2, 4)


def test_windows_line_endings_read_as_newlines(tmp_path):
    text_file = tmp_path / "fra.txt"
    text_file.write_bytes(SAMPLE.replace("\n", "\r\n").encode("utf-8"))
    assert data.read_fra_eng(text_file) == SAMPLE


def test_user_choice_that_holds_no_data_is_an_error(monkeypatch, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"--data.*does not exist.*JAX_ATTENTION_DATA="):
        data.find_data(tmp_path / "missing.zip")
    empty_zip = make_zip(tmp_path / "empty.zip", member="readme.txt")
    with pytest.raises(FileNotFoundError, match="holds neither fra-eng/fra.txt nor fra.txt"):
        data.find_data(empty_zip)
    with pytest.raises(FileNotFoundError, match="holds neither"):
        data.find_data(tmp_path)  # a folder without the file
    monkeypatch.setenv(data.ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="environment variable JAX_ATTENTION_DATA"):
        data.find_data()


def test_nothing_found_lists_every_place(no_data_anywhere, tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        data.read_fra_eng()
    message = str(caught.value)
    for place in [*no_data_anywhere, tmp_path / "cache" / "jax-attention" / "fra-eng.zip"]:
        assert str(place) in message
    assert data.ENV_VAR in message and data.DATA_URL in message
    assert "--data PATH" in message and f"{data.ENV_VAR}=PATH" in message


def test_user_cache(no_data_anywhere, tmp_path):
    cached = make_zip(tmp_path / "cache" / "jax-attention" / "fra-eng.zip")
    assert data.cache_dir() == tmp_path / "cache" / "jax-attention"
    assert data.find_data() == cached


def test_cache_defaults_to_home(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert data.cache_dir() == tmp_path / ".cache" / "jax-attention"


# --------------------------------------------------------------------------- download


@pytest.fixture
def published(tmp_path):
    """A stand-in for d2l's archive: ``(file:// URL, its SHA-1, its bytes)``."""
    archive = make_zip(tmp_path / "server" / "fra-eng.zip")
    payload = archive.read_bytes()
    return archive.as_uri(), hashlib.sha1(payload).hexdigest(), payload


def test_download_with_the_right_checksum(tmp_path, published, monkeypatch):
    url, sha1, payload = published
    renames = []

    def recording(rename):
        def recording_rename(src, dst, *args, **kwargs):
            renames.append((Path(src), Path(dst)))
            return rename(src, dst, *args, **kwargs)
        return recording_rename

    # pooch renames its temporary file onto the target (shutil.move, i.e. os.rename on one file
    # system); os.replace is recorded too, whichever of the two does it.
    for name in ("rename", "replace"):
        monkeypatch.setattr(archive.os, name, recording(getattr(archive.os, name)))
    target = data.download_fra_eng(url, sha1, directory=tmp_path / "cache")
    assert target == tmp_path / "cache" / "fra-eng.zip"
    assert target.read_bytes() == payload
    # Written beside the target under another name, then renamed onto it in one step.
    [(source, destination)] = renames
    assert source.parent == destination.parent and source != destination
    assert destination == target
    assert sorted(p.name for p in target.parent.iterdir()) == ["fra-eng.zip"]


def test_download_with_a_wrong_checksum_leaves_nothing(tmp_path, published):
    url, _, _ = published
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="SHA-1 mismatch"):
        data.download_fra_eng(url, "0" * 40, directory=cache)
    assert list(cache.iterdir()) == []
    # A good copy already there is not overwritten by a bad download.
    good = make_zip(cache / "fra-eng.zip")
    before = good.read_bytes()
    with pytest.raises(ValueError, match="SHA-1 mismatch"):
        data.download_fra_eng(url, "0" * 40, directory=cache)
    assert good.read_bytes() == before and list(cache.iterdir()) == [good]


def test_find_data_downloads_into_the_cache_only_when_allowed(no_data_anywhere, tmp_path,
                                                               published, monkeypatch):
    url, sha1, _ = published
    monkeypatch.delenv(archive.NO_DOWNLOAD_VAR, raising=False)  # opt in: a file:// URL
    monkeypatch.setattr(archive, "DATA_URL", url)
    monkeypatch.setattr(archive, "DATA_SHA1", "f" * 40)
    with pytest.raises(ValueError, match="SHA-1 mismatch"):
        data.find_data(download=True)
    assert list((tmp_path / "cache" / "jax-attention").iterdir()) == []
    monkeypatch.setattr(archive, "DATA_SHA1", sha1)
    with pytest.raises(FileNotFoundError, match="not downloaded: download=False"):
        data.find_data()
    cached = tmp_path / "cache" / "jax-attention" / "fra-eng.zip"
    assert data.find_data(download=True) == cached
    assert data.find_data() == cached  # the next lookup finds the cache, no download needed
    assert data.read_fra_eng() == SAMPLE


def test_failed_download_is_listed_in_the_error(no_data_anywhere, tmp_path, monkeypatch):
    monkeypatch.delenv(archive.NO_DOWNLOAD_VAR, raising=False)  # opt in: a file:// URL
    monkeypatch.setattr(archive, "DATA_URL", (tmp_path / "no-such.zip").as_uri())
    with pytest.raises(FileNotFoundError, match="download failed"):
        data.find_data(download=True)


# --------------------------------------------------------------------------- preprocessing


def test_preprocess_matches_the_book(raw_text):
    for text in [raw_text[:300_000], raw_text[-50_000:], ".start", "a..b!?", "Hi,you", "x\t!y",
                 "\n.", "Cours\u202f!", "Ah\xa0?", "Recule\u2009!", "", "ΣΑΣ. ΟΔΟΣ!"]:
        assert preprocess(text) == book_preprocess_nmt(text)


def test_preprocess_the_book_example(preprocessed):
    text = preprocessed
    assert text.startswith("go .\tva !\nhi .\tsalut !\nrun !\tcours !\n")


def test_tokenize_the_book_examples(book_pairs):
    source, target = book_pairs
    assert source[:6] == [["go", "."], ["hi", "."], ["run", "!"], ["run", "!"], ["who", "?"],
                          ["wow", "!"]]
    assert target[:6] == [["va", "!"], ["salut", "!"], ["cours", "!"], ["courez", "!"],
                          ["qui", "?"], ["ça", "alors", "!"]]


def test_tokenize_keeps_exactly_num_examples(raw_text):
    text = preprocess(raw_text[:raw_text.index("\n", 20_000) + 1])
    for num_examples in (1, 6, 600):
        source, target = tokenize(text, num_examples)
        assert len(source) == len(target) == num_examples  # the book's loop keeps one more
    source, target = tokenize(text)
    assert len(source) == text.count("\n")


def test_tokenize_whole_file(all_pairs):
    source, target, skipped = all_pairs
    assert len(source) == len(target) == FRA_TXT_LINES
    assert skipped == dict.fromkeys(data.SKIP_REASONS, 0)
    # Token for token what the loader gave before it skipped and counted malformed lines.
    tokens = json.dumps([source, target], ensure_ascii=False).encode()
    assert hashlib.sha256(tokens).hexdigest() == ALL_TOKENS_DIGEST
    assert source[-1][:4] == ["it", "may", "be", "impossible"]
    assert target[-1][-3:] == ["les", "erreurs", "."]
    # No empty tokens anywhere, and no token holds a space.
    assert all(token and " " not in token for line in source + target for token in line)


def test_tokenize_columns_and_spaces():
    text = "go  .\tva !\tCC-BY 2.0 (France)\tAttribution\nno tab here\n tom ! \t\n hi .\t  salut\n"
    source, target, skipped = tokenize(text, return_skipped=True)
    # No empty tokens; the tab-less line and the one with an empty French side skipped.
    assert source == [["go", "."], ["hi", "."]]
    assert target == [["va", "!"], ["salut"]]  # attribution columns ignored
    assert skipped == {"invalid_utf8": 0, "stray_cr": 0, "no_tab": 1, "empty_side": 1}
    assert tokenize(text) == (source, target)  # without return_skipped: the pair of lists


def test_only_the_lines_needed_are_preprocessed(monkeypatch, book_pairs):
    seen = []
    real = data.preprocess
    monkeypatch.setattr(data, "preprocess", lambda text: (seen.append(len(text)), real(text))[1])
    nmt = load_data_nmt(64, 8, num_examples=600)
    assert seen and max(seen) < 50_000  # the whole file has 11.5 million characters
    # ...and the result is that of preprocessing the whole text.
    source, target = book_pairs
    assert nmt.src_vocab == Vocab(source, min_freq=2, reserved_tokens=RESERVED_TOKENS)
    np.testing.assert_array_equal(nmt.train.src, build_array(source, nmt.src_vocab, 8)[0])
    np.testing.assert_array_equal(nmt.train.tgt, build_array(target, nmt.tgt_vocab, 8)[0])


# --------------------------------------------------------------------------- vocabulary


def test_vocabulary_sizes_and_reserved_tokens(nmt):
    print(f"600 examples, min_freq=2: {len(nmt.src_vocab)} source, {len(nmt.tgt_vocab)} target")
    # The book reports 184 and 201 for its 601 lines (tokenize_nmt's off-by-one). The 601st pair,
    # "i exhaled .\tj’ai expiré .", brings no token to the count of 2, and the Vocab here is the
    # book's (same ordering, same min_freq cut), so exactly 600 pairs give the same sizes.
    assert (len(nmt.src_vocab), len(nmt.tgt_vocab)) == (184, 201)
    for vocab in (nmt.src_vocab, nmt.tgt_vocab):
        assert vocab.idx_to_token[:4] == ["<unk>", "<pad>", "<bos>", "<eos>"]
        assert [vocab["<unk>"], vocab["<pad>"], vocab["<bos>"], vocab["<eos>"]] == [0, 1, 2, 3]
        assert vocab.unk == 0
    assert nmt.src_vocab["."] == 4  # the most frequent word
    assert nmt.src_vocab["xylophone"] == nmt.src_vocab.unk
    assert nmt.tgt_vocab[["va", "xylophone", "!"]] == [nmt.tgt_vocab["va"], 0,
                                                       nmt.tgt_vocab["!"]]


def test_vocab_order_frequency_and_ties():
    tokens = [["b", "a", "c"], ["a", "d", "c"], ["e"]]
    vocab = Vocab(tokens, reserved_tokens=["<pad>"])
    # a and c twice (a first seen after b, but more frequent), then b, d, e in first-seen order.
    assert vocab.idx_to_token == ["<unk>", "<pad>", "a", "c", "b", "d", "e"]
    assert Vocab([t for line in tokens for t in line], reserved_tokens=["<pad>"]) == vocab
    assert Vocab(tokens, min_freq=2).idx_to_token == ["<unk>", "a", "c"]
    assert len(Vocab()) == 1 and Vocab()["anything"] == 0


def test_vocab_to_tokens():
    vocab = Vocab([["a", "b", "a"]])
    assert vocab.to_tokens(1) == "a"
    assert vocab.to_tokens([1, 2, 0]) == ["a", "b", "<unk>"]
    assert vocab.to_tokens(np.array([2, 1], dtype=np.int32)) == ["b", "a"]
    assert vocab.to_tokens(vocab[["b", "a", "zzz"]]) == ["b", "a", "<unk>"]
    for index in (3, -1):
        with pytest.raises(ValueError, match=rf"index {index} is outside the vocabulary.*< 3"):
            vocab.to_tokens(index)
    with pytest.raises(ValueError, match="index 7"):
        vocab.to_tokens([0, 7])


def test_vocab_json_round_trip(nmt):
    for vocab in (nmt.src_vocab, nmt.tgt_vocab, Vocab(), Vocab(["é", "\u2009"], min_freq=1)):
        again = Vocab.from_json(vocab.to_json())
        assert again == vocab
        assert again.idx_to_token == vocab.idx_to_token
        assert again.token_to_idx == vocab.token_to_idx
        assert again.token_freqs == vocab.token_freqs
    with pytest.raises(ValueError, match="Vocab.to_json"):
        Vocab.from_json('{"idx_to_token": ["a"]}')


def test_vocab_bad_arguments():
    with pytest.raises(ValueError, match="reserved_tokens"):
        Vocab([["a"]], reserved_tokens=["<unk>"])
    with pytest.raises(ValueError, match="reserved_tokens"):
        Vocab([["a"]], reserved_tokens=["<pad>", "<pad>"])
    with pytest.raises(ValueError, match="min_freq"):
        Vocab([["a"]], min_freq=-1)
    with pytest.raises(TypeError, match="tokens"):
        Vocab([["a", 3]])


# --------------------------------------------------------------------------- arrays


def test_truncate_pad_the_book_example(nmt, book_pairs):
    source, _ = book_pairs
    vocab = nmt.src_vocab
    # The book's example pads "go ." to 10 steps; its printed ids ([47, 4, 1, ...]) come from an
    # older vocabulary, here "go" is the 6th most frequent word.
    assert truncate_pad(vocab[source[0]], 10, vocab["<pad>"]) == [9, 4] + [1] * 8
    assert truncate_pad([5, 6, 7], 2, 0) == [5, 6]
    assert truncate_pad([], 2, 0) == [0, 0]


def test_build_array_by_hand():
    vocab = Vocab([["a", "b", "a", "b"]], min_freq=2, reserved_tokens=RESERVED_TOKENS)
    assert vocab.idx_to_token == ["<unk>", "<pad>", "<bos>", "<eos>", "a", "b"]
    array, valid_len = build_array([["a"], ["b", "zz", "a"], ["a", "a", "a", "a"], []], vocab, 4)
    np.testing.assert_array_equal(array, [[4, 3, 1, 1], [5, 0, 4, 3], [4, 4, 4, 4], [3, 1, 1, 1]])
    np.testing.assert_array_equal(valid_len, [2, 4, 4, 1])  # the truncated row lost its <eos>
    assert array.dtype == np.int32 and valid_len.dtype == np.int32
    empty, empty_len = build_array([], vocab, 4)
    assert empty.shape == (0, 4) and empty_len.shape == (0,) and empty.dtype == np.int32
    with pytest.raises(ValueError, match="'<eos>'"):
        build_array([["a"]], Vocab([["a"]]), 4)
    with pytest.raises(ValueError, match="num_steps"):
        build_array([["a"]], vocab, 0)


def test_load_data_nmt_arrays(nmt):
    for name in ("src", "tgt"):
        array, valid_len = getattr(nmt.train, name), getattr(nmt.train, name + "_valid_len")
        assert array.dtype == np.int32 and valid_len.dtype == np.int32
        assert array.shape == (600, 8) and valid_len.shape == (600,)
        np.testing.assert_array_equal(valid_len, (array != 1).sum(axis=1))
        assert valid_len.min() >= 2  # at least a word and <eos>
    src_vocab, tgt_vocab = nmt.src_vocab, nmt.tgt_vocab
    assert src_vocab.to_tokens(nmt.train.src[0]) == ["go", ".", "<eos>"] + ["<pad>"] * 5
    # "alors" occurs once in the 600 pairs: below min_freq=2, so <unk>.
    assert tgt_vocab.to_tokens(nmt.train.tgt[5]) == ["ça", "<unk>", "!", "<eos>"] + ["<pad>"] * 4
    assert nmt.val.src.shape == (0, 8) and len(nmt.val) == 0
    assert (nmt.num_steps, nmt.batch_size) == (8, 64)


# --------------------------------------------------------------------------- batches


def _rows(batches):
    return np.concatenate([np.concatenate([src, tgt], axis=1) for src, _, tgt, _ in batches])


def test_batches_cover_every_example_once(nmt):
    batches = list(nmt.batches(epoch=0))
    assert [len(src) for src, *_ in batches] == [64] * 9 + [24]  # the last, partial batch kept
    assert nmt.num_batches == 10
    rows = _rows(batches)
    expected = np.concatenate([nmt.train.src, nmt.train.tgt], axis=1)
    assert rows.shape == expected.shape
    np.testing.assert_array_equal(rows[np.lexsort(rows.T)], expected[np.lexsort(expected.T)])
    for src, src_valid_len, tgt, tgt_valid_len in batches:  # rows and lengths stay together
        np.testing.assert_array_equal(src_valid_len, (src != 1).sum(axis=1))
        np.testing.assert_array_equal(tgt_valid_len, (tgt != 1).sum(axis=1))
        assert all(a.dtype == np.int32 for a in (src, src_valid_len, tgt, tgt_valid_len))


def test_batches_deterministic_per_seed_and_epoch(nmt):
    first = _rows(nmt.batches(0))
    np.testing.assert_array_equal(first, _rows(nmt.batches(0)))
    assert not np.array_equal(first, _rows(nmt.batches(1)))
    other_seed = load_data_nmt(64, 8, num_examples=600, seed=1)
    assert not np.array_equal(first, _rows(other_seed.batches(0)))
    with pytest.raises(ValueError, match="epoch"):
        next(nmt.batches(-1))


def test_validation_split_is_the_last_pairs(book_pairs):
    source, target = book_pairs
    held = load_data_nmt(32, 8, num_examples=600, val_fraction=0.1)
    assert (len(held.train), len(held.val)) == (540, 60)
    # Vocabularies from the training pairs only.
    assert held.src_vocab == Vocab(source[:540], min_freq=2, reserved_tokens=RESERVED_TOKENS)
    np.testing.assert_array_equal(held.train.src, build_array(source[:540], held.src_vocab, 8)[0])
    np.testing.assert_array_equal(held.val.src, build_array(source[540:], held.src_vocab, 8)[0])
    np.testing.assert_array_equal(held.val.tgt, build_array(target[540:], held.tgt_vocab, 8)[0])
    # Batches come from the training split only.
    assert sum(len(src) for src, *_ in held.batches(0)) == 540
    # A word that occurs twice only among the held-out pairs is unknown.
    held_out_only = {t for line in target[540:] for t in line} - {t for line in target[:540]
                                                                  for t in line}
    assert held_out_only and all(held.tgt_vocab[t] == 0 for t in held_out_only)
    tiny = load_data_nmt(2, 4, num_examples=5, val_fraction=0.01)
    assert (len(tiny.train), len(tiny.val)) == (4, 1)  # a positive fraction holds out at least one


def test_encode_source(nmt):
    vocab = nmt.src_vocab
    ids, valid_len = encode_source("Go.", vocab, 8)
    np.testing.assert_array_equal(ids, nmt.train.src[0])
    assert ids.dtype == np.int32 and ids.shape == (8,) and valid_len == 3  # go . <eos>
    ids, valid_len = encode_source("I'm  HOME!", vocab, 8)
    assert vocab.to_tokens(ids)[:5] == ["i'm", "home", "!", "<eos>", "<pad>"] and valid_len == 4
    ids, _ = encode_source("Zebras swim.", vocab, 8)
    assert vocab.to_tokens(ids)[:4] == ["<unk>", "<unk>", ".", "<eos>"]
    ids, valid_len = encode_source("go go go go go go go go go go", vocab, 8)
    assert ids.shape == (8,) and valid_len == 8 and vocab["<eos>"] not in ids
    for empty in ("", "   "):
        ids, valid_len = encode_source(empty, vocab, 8)
        assert vocab.to_tokens(ids) == ["<eos>"] + ["<pad>"] * 7 and valid_len == 1


# --------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize("kwargs, name", [
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": 2.5}, "batch_size"),
    ({"num_steps": 0}, "num_steps"),
    ({"num_examples": 0}, "num_examples"),
    ({"num_examples": True}, "num_examples"),
    ({"val_fraction": 1.0}, "val_fraction"),
    ({"val_fraction": -0.1}, "val_fraction"),
    ({"seed": -1}, "seed"),
])
def test_bad_arguments(kwargs, name):
    arguments = {"batch_size": 2, "num_steps": 4, "num_examples": 10, **kwargs}
    with pytest.raises(ValueError, match=rf"^{name} must be .* got {kwargs[name]!r}"):
        load_data_nmt(**arguments)


def test_bad_arguments_of_the_helpers():
    with pytest.raises(ValueError, match="num_examples"):
        tokenize("a\tb", num_examples=-1)
    with pytest.raises(ValueError, match="num_steps"):
        truncate_pad([1], 0, 0)
    with pytest.raises(TypeError, match="text must be a str"):
        preprocess(b"go.")
    with pytest.raises(ValueError, match="leaves no training pair"):
        load_data_nmt(2, 4, num_examples=1, val_fraction=0.5)


# --------------------------------------------------------------------------- malformed lines

# Digests of what the loader gave for the real file before malformed lines were skipped and
# counted (the code of commit 688322f): the skipping must change nothing on the book's file.
FIRST_600_DIGEST = "6bcd929bb3e8e795bcae05e6f773fdd61d05c87a75b97311de3ed61b59237e35"
ALL_TOKENS_DIGEST = "a707c2dccfa4de72647ab2cb6722351b00b2872037e3b7aa66cdd39c113bf4ed"


def _digest(nmt):
    """SHA-256 of every array (dtype, shape, bytes) of both splits and of both vocabularies."""
    digest = hashlib.sha256()
    for split in (nmt.train, nmt.val):
        for array in (split.src, split.src_valid_len, split.tgt, split.tgt_valid_len):
            digest.update(str(array.dtype).encode())
            digest.update(str(array.shape).encode())
            digest.update(array.tobytes())
    digest.update(nmt.src_vocab.to_json().encode())
    digest.update(nmt.tgt_vocab.to_json().encode())
    return digest.hexdigest()


def test_the_real_file_gives_the_same_pairs_and_arrays(nmt):
    # filterwarnings=error: a MalformedLinesWarning here would fail the test.
    assert _digest(nmt) == FIRST_600_DIGEST
    assert nmt.skipped == dict.fromkeys(data.SKIP_REASONS, 0)
    # The whole file's tokens: test_tokenize_whole_file (ALL_TOKENS_DIGEST).


GOOD_LINES = [b"Go.\tVa !", b"Hi.\tSalut !", b"Run!\tCours !", b"Run!\tCourez !",
              b"Who?\tQui ?", b"Wow!\t\xc3\x87a alors !"]
# One malformed line of each kind, as bytes in the file, with the reason it is skipped for.
MALFORMED_LINES = [
    (b"no tab here", "no_tab"),
    (b"", "no_tab"),  # a blank line
    (b"\tSalut !", "empty_side"),
    (b"Hello.\t", "empty_side"),
    (b" \xc2\xa0\t \xe2\x80\xaf", "empty_side"),  # spaces and no-break spaces only
    (b"Bad \xff byte.\tMauvais octet !", "invalid_utf8"),
    (b"Caf\xc3.\tCaf\xc3\xa9 !", "invalid_utf8"),  # a truncated two-byte character
    (b"\xed\xa0\x80\tsurrogate", "invalid_utf8"),  # an encoded surrogate is not valid UTF-8
    (b"Stray\rCR.\tRetour\r chariot !", "stray_cr"),
    (b"Go.\tVa\r !", "stray_cr"),  # universal newlines would have made it the pair (go ., va)
]


def _expected_pairs(lines):
    return tokenize(preprocess("".join(line.decode() + "\n" for line in lines)))


def _malformed_file(tmp_path, layout, line_end=b"\n"):
    """GOOD_LINES with every MALFORMED_LINES entry between them, in the given layout."""
    body = b""
    for i, good in enumerate(GOOD_LINES):
        body += good + line_end
        body += b"".join(bad + line_end for bad, _ in MALFORMED_LINES[2 * i:2 * i + 2])
    if layout == "zip":
        location = tmp_path / "malformed.zip"  # not fra-eng.zip: no UnknownArchiveWarning
        with zipfile.ZipFile(location, "w") as archive:
            archive.writestr("fra-eng/fra.txt", body)
    else:
        location = tmp_path / "fra.txt"
        location.write_bytes(body)
    return location, body


@pytest.mark.parametrize("layout", ["zip", "fra.txt"])
@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"], ids=["LF", "CRLF"])
def test_malformed_lines_are_skipped_and_counted(tmp_path, layout, line_end):
    location, _ = _malformed_file(tmp_path, layout, line_end)
    expected = {reason: sum(kind == reason for _, kind in MALFORMED_LINES)
                for reason in data.SKIP_REASONS}
    with pytest.warns(data.MalformedLinesWarning) as caught:
        nmt = load_data_nmt(2, 5, num_examples=None, data=location)
    assert nmt.skipped == expected == {"invalid_utf8": 3, "stray_cr": 2, "no_tab": 2,
                                       "empty_side": 3}
    [warning] = caught
    message = str(warning.message)
    assert str(location) in message and "10 malformed lines skipped" in message
    for words in ("3 not valid UTF-8", "2 with a stray carriage return", "2 without a tab",
                  "3 with an empty English or French side"):
        assert words in message
    # Exactly the good pairs, as from a file that holds nothing else.
    source, target = _expected_pairs(GOOD_LINES)
    assert len(nmt.train) == len(GOOD_LINES) == len(source)
    assert nmt.src_vocab == Vocab(source, min_freq=2, reserved_tokens=RESERVED_TOKENS)
    assert nmt.tgt_vocab == Vocab(target, min_freq=2, reserved_tokens=RESERVED_TOKENS)
    np.testing.assert_array_equal(nmt.train.src, build_array(source, nmt.src_vocab, 5)[0])
    np.testing.assert_array_equal(nmt.train.tgt, build_array(target, nmt.tgt_vocab, 5)[0])


def test_skipped_lines_do_not_count_towards_num_examples(tmp_path):
    location, _ = _malformed_file(tmp_path, "fra.txt")
    with pytest.warns(data.MalformedLinesWarning, match="4 malformed lines skipped"):
        nmt = load_data_nmt(2, 5, num_examples=3, data=location)
    assert len(nmt.train) == 3
    # Only the lines read before the third good pair: the four between the first three.
    assert nmt.skipped == {"invalid_utf8": 0, "stray_cr": 0, "no_tab": 2, "empty_side": 2}
    np.testing.assert_array_equal(
        nmt.train.src, build_array(_expected_pairs(GOOD_LINES[:3])[0], nmt.src_vocab, 5)[0])


def test_read_fra_eng_never_fails_and_keeps_the_bytes(tmp_path):
    location, body = _malformed_file(tmp_path, "fra.txt")
    text = data.read_fra_eng(location)  # the old reader raised UnicodeDecodeError here
    assert text.encode("utf-8", "surrogateescape") == body
    # A lone CR stays inside its line; only line feeds end lines.
    assert text.split("\n")[1:3] == ["no tab here", ""]
    assert "Stray\rCR.\tRetour\r chariot !" in text.split("\n")


def test_byte_order_mark_and_final_cr(tmp_path):
    text_file = tmp_path / "fra.txt"
    # A file saved by a Windows editor: a BOM, CRLF endings, the last line without its LF.
    text_file.write_bytes(b"\xef\xbb\xbfGo.\tVa !\r\nHi.\tSalut !\r")
    assert data.read_fra_eng(text_file) == "Go.\tVa !\nHi.\tSalut !"
    nmt = load_data_nmt(2, 4, num_examples=2, data=text_file)  # no warning: nothing skipped
    assert dict(nmt.src_vocab.token_freqs) == {"go": 1, ".": 2, "hi": 1}  # no "\ufeffgo"
    assert tokenize("go .\tva !\nhi .\tsalut !") == ([["go", "."], ["hi", "."]],
                                                      [["va", "!"], ["salut", "!"]])


def test_a_file_without_a_pair_is_one_clear_error(tmp_path):
    text_file = tmp_path / "fra.txt"
    text_file.write_bytes(b"just a title\n\n\xff\xfe\tbroken\nEnglish only\t\n")
    with pytest.raises(ValueError, match=r"holds no English–French pair .*4 malformed lines "
                                         r"skipped \(1 not valid UTF-8, 2 without a tab, 1 with"):
        load_data_nmt(2, 4, num_examples=None, data=text_file)
    text_file.write_bytes(b"")
    with pytest.raises(ValueError, match=r"holds no English–French pair.*0 malformed lines"):
        load_data_nmt(2, 4, num_examples=None, data=text_file)


_LINE_KINDS = [(good, None) for good in GOOD_LINES] + MALFORMED_LINES


@settings(max_examples=examples(ci=40, dev=400))
@given(st.lists(st.sampled_from(range(len(_LINE_KINDS))), max_size=12),
       st.sampled_from([b"\n", b"\r\n"]), st.booleans())
def test_any_mix_of_lines_never_crashes(tmp_path_factory, kinds, line_end, final_newline):
    """Any sequence of good and malformed lines: the good ones in order, the others counted."""
    lines = [_LINE_KINDS[kind] for kind in kinds]
    body = line_end.join(line for line, _ in lines) + (line_end if final_newline and lines
                                                        else b"")
    location = tmp_path_factory.mktemp("mix") / "fra.txt"
    location.write_bytes(body)
    source, target, skipped = tokenize(preprocess(data.read_fra_eng(location)),
                                       return_skipped=True)
    good = [line for line, reason in lines if reason is None]
    assert (source, target) == _expected_pairs(good)
    # A blank last line without its line end is no line at all.
    counted = lines[:-1] if lines and lines[-1][0] == b"" and not final_newline else lines
    assert skipped == {reason: sum(kind == reason for _, kind in counted)
                       for reason in data.SKIP_REASONS}


# --------------------------------------------------------------------------- damaged archives

SHARED_ARCHIVE_SHA1 = "c71a455baa82c44d779bffd1c4041b024fef0057"  # shared/data/fra-eng.zip


@pytest.fixture(scope="module")
def shared_archive():
    """``(bytes, ZipInfo of fra-eng/fra.txt)`` of ``shared/data/fra-eng.zip``."""
    location = next(path for path in data.checkout_candidates() if path.is_file())
    payload = location.read_bytes()
    with zipfile.ZipFile(io.BytesIO(payload)) as archive:
        return payload, archive.getinfo("fra-eng/fra.txt")


def _data_start(payload, info) -> int:
    """Where ``info``'s compressed bytes begin: after its local header, name and extra field."""
    name_length, extra_length = struct.unpack(
        "<HH", payload[info.header_offset + 26:info.header_offset + 30])
    return info.header_offset + 30 + name_length + extra_length


def _assert_damaged(location, reason=""):
    """Both readers raise DamagedArchiveError (nothing else) with a one-line message."""
    assert data.find_data(location) == location  # the lookup stays a lookup
    for read in (lambda: data.read_fra_eng(location),
                 lambda: load_data_nmt(2, 4, num_examples=5, data=location)):
        with pytest.raises(data.DamagedArchiveError) as caught:
            read()
        message = str(caught.value)
        assert "damaged or truncated archive" in message and str(location) in message
        assert reason in message and "\n" not in message
        assert isinstance(caught.value, ValueError) and caught.value.path == location
    assert str(pickle.loads(pickle.dumps(caught.value))) == message
    return message


def test_the_shared_archive_is_a_known_one(shared_archive):
    payload, info = shared_archive
    # Not d2l's archive byte for byte, but the same fra.txt repacked (see KNOWN_ARCHIVE_SHA1S).
    assert hashlib.sha1(payload).hexdigest() == SHARED_ARCHIVE_SHA1 != data.DATA_SHA1
    assert set(data.KNOWN_ARCHIVE_SHA1S) == {data.DATA_SHA1, SHARED_ARCHIVE_SHA1}
    with zipfile.ZipFile(io.BytesIO(payload)) as archive:
        assert archive.namelist() == ["fra-eng/_about.txt", "fra-eng/fra.txt"]
        assert archive.comment == b"" and all(not member.extra for member in archive.infolist())
        assert b"Date of this file:\n  2019-04-07" in archive.read("fra-eng/_about.txt")
    assert (info.file_size, info.CRC) == (11_669_748, 0xC7F777DF)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no UnknownArchiveWarning for it
        assert len(load_data_nmt(2, 4, num_examples=5).train) == 5


_TRUNCATIONS = ([("fra-eng.zip", keep) for keep in (0, 2, 4, 30, 1_000, "half", -100, -22, -1)]
                # Not named .zip but beginning with the zip signature: not text either.
                + [("fra-eng.bin", keep) for keep in (4, 1_000, "half", -1)])


@pytest.mark.parametrize("name, keep", _TRUNCATIONS)
def test_truncated_archive(tmp_path, shared_archive, name, keep):
    payload, _ = shared_archive
    keep = len(payload) // 2 if keep == "half" else keep
    location = tmp_path / name
    location.write_bytes(payload[:keep])  # keep < 0: all but the last -keep bytes
    _assert_damaged(location)


def _edit(offset, value=None):
    """A damage: the byte at ``offset(payload, info)`` flipped, or bytes ``value`` written."""
    def damage(payload, info):
        at = offset(payload, info)
        if value is None:
            payload[at] ^= 0xFF
        else:
            payload[at:at + len(value)] = value
    return damage


_CD_OFFSET = slice(-6, -2)  # in the end of central directory record (no archive comment)
_DAMAGES = {
    "central directory signature": _edit(
        lambda payload, info: struct.unpack("<I", payload[_CD_OFFSET])[0], b"XXXX"),
    "central directory offset": _edit(lambda payload, info: len(payload) - 6),
    "central directory size": _edit(lambda payload, info: len(payload) - 10),
    "fra.txt local header": _edit(lambda payload, info: info.header_offset),
    # In fra.txt's central directory entry (the last): its compression method, its flags.
    **{f"fra.txt compression method {method}": _edit(
        lambda payload, info: payload.rfind(b"PK\x01\x02") + 10, method.to_bytes(2, "little"))
       for method in (0, 9, 12, 14, 99)},  # stored, deflate64, bzip2, LZMA, AES
    "fra.txt encryption flag": _edit(lambda payload, info: payload.rfind(b"PK\x01\x02") + 8,
                                     b"\x03"),
    "deflate stream, start": _edit(lambda payload, info: _data_start(payload, info) + 10),
    "deflate stream, middle": _edit(
        lambda payload, info: _data_start(payload, info) + info.compress_size // 2),
    "deflate stream, end": _edit(
        lambda payload, info: _data_start(payload, info) + info.compress_size - 10),
}


@pytest.mark.parametrize("damage", list(_DAMAGES))
def test_damaged_archive(tmp_path, shared_archive, damage):
    payload, info = shared_archive
    payload = bytearray(payload)
    _DAMAGES[damage](payload, info)
    location = tmp_path / "fra-eng.zip"
    location.write_bytes(bytes(payload))
    # num_examples=5 reads a few lines only: the rest is still read, for its CRC-32.
    _assert_damaged(location)


@pytest.fixture(scope="module")
def stored_archive(tmp_path_factory, shared_archive):
    """The shared fra.txt re-zipped without compression (ZIP_STORED): ``(path, bytes, info)``.

    A flipped byte of such a member always "decompresses" (it is copied): only the CRC-32 can
    tell.
    """
    payload, info = shared_archive
    with zipfile.ZipFile(io.BytesIO(payload)) as archive:
        text = archive.read(info)
    location = tmp_path_factory.mktemp("stored") / "stored.zip"
    with zipfile.ZipFile(location, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("fra-eng/fra.txt", text)
    stored = location.read_bytes()
    with zipfile.ZipFile(io.BytesIO(stored)) as archive:
        return location, stored, archive.getinfo("fra-eng/fra.txt"), text


@pytest.mark.parametrize("where", ["first pair", "middle", "last byte"])
def test_a_flipped_byte_that_still_reads_fails_the_crc(tmp_path, stored_archive, nmt, where):
    location, stored, info, text = stored_archive
    # The intact copy: the same pairs as the shared archive.
    assert load_data_nmt(64, 8, num_examples=600, data=location).fingerprint == nmt.fingerprint
    offset = {"first pair": text.index(b"Va !") + 1,  # "Va !" -> "Vc !": another word
              "middle": len(text) // 2, "last byte": len(text) - 1}[where]
    damaged = bytearray(stored)
    damaged[_data_start(stored, info) + offset] ^= 0x02
    location = tmp_path / "fra-eng.zip"
    location.write_bytes(bytes(damaged))
    _assert_damaged(location, reason="Bad CRC-32 for file 'fra-eng/fra.txt'")


def test_a_zip_that_is_plain_text(tmp_path):
    location = tmp_path / "fra-eng.zip"
    location.write_text(SAMPLE, encoding="utf-8")  # was read as text before
    message = _assert_damaged(location, reason="BadZipFile: File is not a zip file")
    assert message.startswith(f"damaged or truncated archive {str(location)!r} (")


def test_a_damaged_archive_in_the_cache_is_an_error(no_data_anywhere, tmp_path, shared_archive):
    payload, _ = shared_archive
    cached = tmp_path / "cache" / "jax-attention" / "fra-eng.zip"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(payload[:1_000])
    assert data.find_data() == cached  # found, not skipped for another copy or a download
    with pytest.raises(data.DamagedArchiveError, match="damaged or truncated archive"):
        data.read_fra_eng()


def test_unknown_fra_eng_zip_warns_once_per_file(tmp_path):
    location = make_zip(tmp_path / "a" / "fra-eng.zip")
    sha1 = hashlib.sha1(location.read_bytes()).hexdigest()
    with pytest.warns(data.UnknownArchiveWarning) as caught:
        first = load_data_nmt(2, 4, num_examples=2, data=location)
        assert load_data_nmt(2, 4, num_examples=2, data=location).fingerprint == first.fingerprint
        assert data.read_fra_eng(location) == SAMPLE  # used all the same
    [warning] = caught
    message = str(warning.message)
    assert message == (f"{str(location)!r} has SHA-1 {sha1}, not one of the known fra-eng.zip "
                       f"archives ({data.DATA_SHA1}, {SHARED_ARCHIVE_SHA1}); its CRC-32 checks "
                       "pass and it is used")
    assert warning.filename == __file__  # points at the caller
    load_data_nmt(2, 4, num_examples=2, data=location)  # filterwarnings=error: no second one
    other = make_zip(tmp_path / "b" / "fra-eng.zip")  # another file: its own warning
    with pytest.warns(data.UnknownArchiveWarning, match=str(other)):
        load_data_nmt(2, 4, num_examples=2, data=other)
    renamed = tmp_path / "mine.zip"  # any other name: no check
    renamed.write_bytes(location.read_bytes())
    assert load_data_nmt(2, 4, num_examples=2, data=renamed).fingerprint == first.fingerprint


# --------------------------------------------------------------------------- fingerprint

FIRST_600_FINGERPRINT = {
    "format": "jax-attention.data-fingerprint/1",
    "num_pairs": 600,
    "num_val": 0,
    "sha256": "3c8f3bbbf9a9c767add27e0a789aa7a4d7eb972dec5e1ed26a8282e5eae7ac19",
    "src_vocab_size": 184,
    "tgt_vocab_size": 201,
}
ALL_PAIRS_SHA256 = "2b7fe44462a44bdf95babc885afd8dfd661fbb2f40932d4e8755cbc5995fcf60"


def _pairs_text_by_definition(source, target) -> bytes:
    """The text TranslationData.fingerprint hashes, by its documented definition, pair by pair."""
    return "\n".join(" ".join(src) + "\t" + " ".join(tgt)
                     for src, tgt in zip(source, target)).encode("utf-8")


def _pairs_sha256_by_definition(source, target):
    """TranslationData.fingerprint's documented definition, pair by pair."""
    return hashlib.sha256(_pairs_text_by_definition(source, target)).hexdigest()


def test_fingerprint_of_the_book_data(nmt, book_pairs):
    # Pinned: the same in every process and on every machine.
    assert nmt.fingerprint == FIRST_600_FINGERPRINT
    assert nmt.fingerprint["sha256"] == _pairs_sha256_by_definition(*book_pairs)
    assert json.loads(json.dumps(nmt.fingerprint)) == nmt.fingerprint
    assert nmt.num_pairs == 600
    nmt.fingerprint["num_pairs"] = 0  # a new dict each time
    assert nmt.fingerprint == FIRST_600_FINGERPRINT
    # Batching, padding and shuffling are not the data.
    assert load_data_nmt(16, 5, num_examples=600, seed=3).fingerprint == FIRST_600_FINGERPRINT


def test_fingerprint_changes_with_the_data(nmt, raw_text, tmp_path):
    fingerprints = [nmt.fingerprint] + [
        load_data_nmt(64, 8, **kwargs).fingerprint
        for kwargs in ({"num_examples": 599}, {"num_examples": 601},
                       {"num_examples": 600, "val_fraction": 0.1})]
    assert len({json.dumps(fingerprint) for fingerprint in fingerprints}) == 4
    # The same 600 pairs from a fra.txt: the same fingerprint; with one word changed: another.
    lines = raw_text.split("\n")[:600]
    text_file = tmp_path / "fra.txt"
    text_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert load_data_nmt(64, 8, num_examples=600, data=text_file).fingerprint == nmt.fingerprint
    assert lines[1] == "Hi.\tSalut !"
    lines[1] = "Hi.\tBonjour !"
    text_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    changed = load_data_nmt(64, 8, num_examples=600, data=text_file).fingerprint
    assert changed["sha256"] != nmt.fingerprint["sha256"]
    assert changed["num_pairs"] == 600


def test_fingerprint_of_the_whole_file_hashes_the_text_as_it_is(preprocessed, all_pairs,
                                                                 monkeypatch):
    """The book's file takes the bulk path: its bytes go to SHA-256 as they are, not rebuilt pair
    by pair (the slow way, several times the cost), and only the few lines with spaces that
    tokenising drops are rebuilt. Checked by what reaches the hash, not by a clock."""
    source, target, skipped = all_pairs
    body = preprocessed.removesuffix("\n").encode("utf-8")
    updates = []  # (bytes, whether the text was passed as it is: a view of ``body``)
    sha256 = hashlib.sha256

    class Spy:
        def __init__(self, *initial):
            assert not initial, "the pairs were joined into one new text: the slow path"
            self._digest = sha256()

        def update(self, chunk):
            updates.append((bytes(chunk), isinstance(chunk, memoryview)))
            self._digest.update(chunk)

        def hexdigest(self):
            return self._digest.hexdigest()

    monkeypatch.setattr(data.hashlib, "sha256", Spy)
    digest = data._pairs_sha256(preprocessed, source, target, skipped)
    monkeypatch.undo()
    assert digest == ALL_PAIRS_SHA256 == _pairs_sha256_by_definition(source, target)
    as_is = sum(len(chunk) for chunk, view in updates if view)
    rebuilt = [chunk for chunk, view in updates if not view]
    assert b"".join(chunk for chunk, _ in updates) == _pairs_text_by_definition(source, target)
    assert as_is > 0.99 * len(body)
    assert 0 < len(rebuilt) < len(source) // 100  # the book's file has a few such lines
    assert all(b"\n" not in line for line in rebuilt)  # each rebuilt piece is one line


@pytest.mark.parametrize("text", [
    "go .\tva !\n",
    "go  .\tva   !",  # runs of spaces
    " go .\t va ! \n  hi .  \tsalut  !  \n",  # spaces at the ends of columns and lines
    "go .\tva !\tCC-BY 2.0\n",  # a third column
    "go .\tva !\n\nhi .\tsalut !\n",  # a skipped line
    "a\u2009b \x0b\tc\x0c d\n",  # other spaces are inside tokens
])
def test_fingerprint_hash_follows_its_definition(text):
    source, target, skipped = tokenize(text, return_skipped=True)
    assert data._pairs_sha256(text, source, target, skipped) == _pairs_sha256_by_definition(
        source, target)


@settings(max_examples=examples(ci=60, dev=600))
@given(st.lists(st.tuples(st.text(" a.é\u2009", max_size=6), st.text(" b!\xe7", max_size=6)),
                min_size=1, max_size=5),
       st.booleans())
def test_fingerprint_hash_follows_its_definition_for_any_spacing(columns, final_newline):
    text = "\n".join(f"{src}\t{tgt}" for src, tgt in columns) + "\n" * final_newline
    source, target, skipped = tokenize(text, return_skipped=True)
    if source:
        assert data._pairs_sha256(text, source, target, skipped) == \
            _pairs_sha256_by_definition(source, target)


def test_more_examples_than_the_file_holds(tmp_path):
    text_file = tmp_path / "fra.txt"
    text_file.write_text(SAMPLE, encoding="utf-8")
    with pytest.warns(data.FewerPairsWarning) as caught:
        nmt = load_data_nmt(2, 4, num_examples=10, data=text_file)
    [warning] = caught
    assert str(warning.message) == (f"num_examples=10 asked for, but {str(text_file)!r} has 2 "
                                    "pairs; using 2")
    assert warning.filename == __file__
    assert nmt.num_pairs == nmt.fingerprint["num_pairs"] == len(nmt.train) == 2
    # No warning when the count is met or all pairs are asked for; the data is the same.
    assert load_data_nmt(2, 4, num_examples=2, data=text_file).fingerprint == nmt.fingerprint
    assert load_data_nmt(2, 4, num_examples=None, data=text_file).fingerprint == nmt.fingerprint
