"""The download of d2l's archive when the data is found nowhere (docs/design.md, Data; issue 17).

Never against the internet: a local HTTP server on 127.0.0.1, in a thread of this process, serves
the shared archive (``shared/data/fra-eng.zip``, whose SHA-1 is not d2l's: the expected URL and
SHA-1 are given through ``$JAX_ATTENTION_DATA_URL`` / ``$JAX_ATTENTION_DATA_SHA1``, the variables
for testing mirrors). The session forbids downloads (tests/conftest.py sets
``JAX_ATTENTION_NO_DOWNLOAD``); each test here opts in. Cases: a good file (downloaded once, then
found in the cache), a wrong checksum, a truncated transfer, a server that is gone, a server that
does not answer, ``--no-download`` and the environment variable; and the acceptance test of issue
17: a copy of the checkout without ``../shared`` beside it runs the README's training command
(shortened) to the end, the download included, and gives one clear error line with the server
down.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import http.server
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pooch
import pytest

from jax_attention.data import archive
# Imported here, before any test patches archive.checkout_candidates: nmt re-exports archive's
# names, and a first import under the patch would keep the patched one for the whole process.
from jax_attention.data import nmt  # noqa: F401
from jax_attention.cli import main
from jax_attention.cli.arguments import add_data_argument, check_data_argument
from tests.fault_support import assert_one_line, command_env, run_command
from tests.shared_runs import EPOCHS, tiny_flags

CHECKOUT = Path(__file__).resolve().parents[1]
SHARED_ARCHIVE = CHECKOUT.parent / "shared" / "data" / "fra-eng.zip"
SHARED_ARCHIVE_SHA1 = "c71a455baa82c44d779bffd1c4041b024fef0057"  # shared/data/README.md
PROG = "jax-attention train transformer"

pytestmark = pytest.mark.skipif(not SHARED_ARCHIVE.is_file(),
                                reason=f"the archive to serve, {SHARED_ARCHIVE}, is missing")


@pytest.fixture(scope="module")
def payload() -> bytes:
    payload = SHARED_ARCHIVE.read_bytes()
    assert hashlib.sha1(payload).hexdigest() == SHARED_ARCHIVE_SHA1
    return payload


class Server:
    """An HTTP server on 127.0.0.1 serving ``payload`` at ``/fra-eng.zip``: ``requests`` counts
    the GETs; with ``truncate_to`` set it announces the whole length but sends only that many
    bytes, then closes the connection; with ``stall_after`` set it sends that many bytes, then
    nothing more until the server is closed."""

    def __init__(self, payload: bytes):
        self.payload = payload
        self.truncate_to: int | None = None
        self.stall_after: int | None = None
        self.released = threading.Event()
        self.requests = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # http.server's name
                server.requests += 1
                if self.path != "/fra-eng.zip":
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/zip")
                self.send_header("Content-Length", str(len(server.payload)))
                self.end_headers()
                body = server.payload
                if server.truncate_to is not None:
                    body = body[:server.truncate_to]
                    self.close_connection = True
                if server.stall_after is not None:
                    self.wfile.write(body[:server.stall_after])
                    self.wfile.flush()
                    server.released.wait(60)
                    return
                self.wfile.write(body)

            def log_message(self, *args):  # quiet
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/fra-eng.zip"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


@pytest.fixture
def server(payload) -> Iterator[Server]:
    running = Server(payload)
    try:
        yield running
    finally:
        running.close()


def gone_url() -> str:
    """The URL of a server that is gone: a port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/fra-eng.zip"


@pytest.fixture
def nowhere(monkeypatch, tmp_path) -> Path:
    """No data anywhere (no --data, no $JAX_ATTENTION_DATA, no copy beside the checkout, an empty
    user cache), downloads allowed, d2l's SHA-1 replaced by the shared archive's; returns the
    cache folder the download goes to."""
    monkeypatch.delenv(archive.ENV_VAR, raising=False)
    monkeypatch.delenv(archive.NO_DOWNLOAD_VAR, raising=False)
    monkeypatch.delenv(archive.URL_VAR, raising=False)
    monkeypatch.setenv(archive.SHA1_VAR, SHARED_ARCHIVE_SHA1)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(archive, "checkout_candidates", lambda: [tmp_path / "none" / "x.zip"])
    return tmp_path / "cache" / "jax-attention"


def check(argv: list[str], capsys) -> tuple[int | None, str]:
    """The CLI's data check on ``argv`` (``--data`` / ``--no-download``) as ``train transformer``
    runs it before any work: ``(exit status or None when it passed, stderr)``."""
    parser = argparse.ArgumentParser(prog=PROG)
    add_data_argument(parser)
    args = parser.parse_args(argv)
    status = None
    try:
        check_data_argument(args, parser)
    except SystemExit as exit_info:
        status = exit_info.code
    return status, capsys.readouterr().err


def test_good_file_is_downloaded_once_into_the_cache(nowhere, server, monkeypatch, capsys):
    monkeypatch.setenv(archive.URL_VAR, server.url)
    status, err = check([], capsys)
    assert status is None, err
    cached = nowhere / "fra-eng.zip"
    assert cached.read_bytes() == server.payload and server.requests == 1
    assert sorted(path.name for path in nowhere.iterdir()) == ["fra-eng.zip"]  # no .part left
    # Not a terminal: one line instead of a progress bar, with the URL, the size and the folder.
    mib = len(server.payload) / (1 << 20)
    assert err.strip() == f"downloading {server.url} ({mib:.1f} MiB) into {nowhere}"
    # The next command finds it in the cache: no second download, nothing printed.
    status, err = check([], capsys)
    assert status is None and err == "" and server.requests == 1
    assert archive.find_data() == cached == archive.ensure_data()
    assert server.requests == 1


def test_pooch_notes_are_silenced_for_the_download_only(nowhere, server, tmp_path):
    """pooch logs "Downloading data from <url> ..." through its own logger and handler (to
    stderr, whatever the process's logging set-up): dropped during the download, by a filter that
    is gone afterwards; the logger's level, filters and handlers are as they were."""
    logger = pooch.get_logger()
    before = (logger.level, list(logger.filters), list(logger.handlers), logger.disabled)
    records: list[logging.LogRecord] = []

    class Recording(logging.Handler):
        def emit(self, record):
            records.append(record)

    recording = Recording(logging.DEBUG)
    logger.addHandler(recording)
    try:
        url = gone_url()
        with pytest.raises(archive.DownloadError, match="Connection refused"):  # failed: the same
            archive.download_fra_eng(url, SHARED_ARCHIVE_SHA1, directory=tmp_path / "failed")
        assert archive.download_fra_eng(server.url, SHARED_ARCHIVE_SHA1, directory=nowhere,
                                        progress=False).read_bytes() == server.payload
        assert server.requests == 1
        assert [record.getMessage() for record in records] == []
    finally:
        logger.removeHandler(recording)
    assert (logger.level, list(logger.filters), list(logger.handlers), logger.disabled) == before
    # Nothing is left filtering: pooch's note about the same URL would pass again (checked with
    # the logger's filters, not emitted: pooch's handler writes to the stderr of its import).
    note = logging.LogRecord("pooch", logging.INFO, __file__, 0,
                             "Downloading data from '%s' to file '%s'.", (server.url, "x"), None)
    assert logger.filter(note)


def test_a_good_copy_in_the_cache_is_not_downloaded_again(nowhere, server, monkeypatch, capsys):
    monkeypatch.setenv(archive.URL_VAR, server.url)
    cached = archive.download_fra_eng(directory=nowhere, progress=False)
    capsys.readouterr()
    assert archive.download_fra_eng(directory=nowhere, progress=False) == cached
    assert server.requests == 1 and capsys.readouterr().err == ""
    assert sorted(path.name for path in nowhere.iterdir()) == ["fra-eng.zip"]


def test_ctrl_c_during_the_download_leaves_nothing(server, payload, tmp_path):
    """A real SIGINT while the transfer is under way (the server stalls after some bytes, which
    are in pooch's temporary file): KeyboardInterrupt, and the folder is left empty."""
    server.stall_after = len(payload) // 4
    cache = tmp_path / "cache"
    # Python's own Ctrl-C handler, whatever the test runner's: a process started in the
    # background of a non-interactive shell (CI) inherits SIGINT ignored, and Python keeps that.
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from jax_attention.data import archive; "
            "archive.download_fra_eng(sys.argv[1], sys.argv[2], directory=sys.argv[3])")
    process = subprocess.Popen([sys.executable, "-c", code, server.url, SHARED_ARCHIVE_SHA1,
                                str(cache)], cwd=CHECKOUT, env=command_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (cache.is_dir() and any(path.stat().st_size for path in cache.iterdir())):
            assert process.poll() is None, f"the download ended first: {process.returncode}"
            assert time.monotonic() < deadline, "no byte of the download reached the folder"
            time.sleep(0.05)
        [partial] = list(cache.iterdir())
        assert partial.name != "fra-eng.zip"  # a temporary name beside it
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode != 0 and "KeyboardInterrupt" in err, err
    assert list(cache.iterdir()) == []


def test_progress_bar_on_a_terminal(nowhere, server, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(archive.URL_VAR, server.url)
    target = archive.download_fra_eng(directory=tmp_path / "bar", progress=True)
    assert target.read_bytes() == server.payload
    err = capsys.readouterr().err
    assert "downloading fra-eng.zip" in err and "100%" in err, err


def test_wrong_checksum_is_one_line_and_leaves_nothing(nowhere, server, monkeypatch, capsys):
    monkeypatch.setenv(archive.URL_VAR, server.url)
    monkeypatch.setenv(archive.SHA1_VAR, archive.DATA_SHA1)  # d2l's: not the file served
    status, err = check([], capsys)
    line = assert_one_line(err, "SHA-1 mismatch", server.url, SHARED_ARCHIVE_SHA1,
                           archive.DATA_SHA1, "the download was deleted", "--data PATH",
                           status=2, returncode=status)
    assert line.startswith(f"{PROG}: error: ")
    assert list(nowhere.iterdir()) == []


def test_truncated_transfer_is_one_line_and_leaves_nothing(nowhere, server, monkeypatch,
                                                          capsys):
    monkeypatch.setenv(archive.URL_VAR, server.url)
    server.truncate_to = len(server.payload) // 3
    status, err = check([], capsys)
    assert_one_line(err, f"truncated download of {server.url}",
                    f"received {server.truncate_to} of the {len(server.payload)} bytes of its "
                    "Content-Length", "--data PATH", status=2, returncode=status)
    assert list(nowhere.iterdir()) == []
    with pytest.raises(archive.DownloadError, match="truncated download"):
        archive.download_fra_eng(server.url, SHARED_ARCHIVE_SHA1, directory=nowhere)
    assert list(nowhere.iterdir()) == []


def test_server_gone_is_one_line_naming_the_url(nowhere, monkeypatch, capsys):
    url = gone_url()
    monkeypatch.setenv(archive.URL_VAR, url)
    status, err = check([], capsys)
    assert_one_line(err, f"cannot download {url}: Connection refused", "download failed",
                    "--data PATH", status=2, returncode=status)
    assert list(nowhere.iterdir()) == []


def test_server_that_does_not_answer_times_out(nowhere, monkeypatch, capsys):
    with socket.socket() as listening:  # accepts connections (the kernel does), never answers
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        url = f"http://127.0.0.1:{listening.getsockname()[1]}/fra-eng.zip"
        monkeypatch.setenv(archive.URL_VAR, url)
        monkeypatch.setattr(archive, "DOWNLOAD_TIMEOUT", 0.5)
        status, err = check([], capsys)
    assert_one_line(err, f"cannot download {url}: timed out", status=2, returncode=status)
    assert list(nowhere.iterdir()) == []


def test_http_error_is_one_line(nowhere, server, monkeypatch, capsys):
    url = server.url.replace("fra-eng.zip", "missing.zip")
    monkeypatch.setenv(archive.URL_VAR, url)
    status, err = check([], capsys)
    assert_one_line(err, f"cannot download {url}: HTTP 404 Not Found", status=2, returncode=status)
    with pytest.raises(archive.DownloadError) as error:
        archive.download_fra_eng(url, SHARED_ARCHIVE_SHA1, directory=nowhere)
    assert (error.value.url, error.value.reason) == (url, "Not Found")
    assert list(nowhere.iterdir()) == []
    # The error response (its body never read) is closed: collected now, an open socket would be
    # a ResourceWarning, an error in this suite, here rather than in some later test.
    gc.collect()


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_download_forbidden_says_how_to_supply_the_file(how, nowhere, server, monkeypatch,
                                                        capsys):
    monkeypatch.setenv(archive.URL_VAR, server.url)
    argv = ["--no-download"] if how == "flag" else []
    if how == "environment":
        monkeypatch.setenv(archive.NO_DOWNLOAD_VAR, "1")
    status, err = check(argv, capsys)
    forbidden_by = "--no-download" if how == "flag" else "JAX_ATTENTION_NO_DOWNLOAD=1"
    assert_one_line(err, "the English–French data (fra-eng/fra.txt) was not found",
                    f"{forbidden_by} forbids its download", "'--data PATH'",
                    f"{archive.ENV_VAR}=PATH", status=2, returncode=status)
    assert server.requests == 0 and not nowhere.exists()
    # "0" and "" do not forbid it.
    monkeypatch.setenv(archive.NO_DOWNLOAD_VAR, "0")
    assert not archive.download_forbidden()
    monkeypatch.setenv(archive.NO_DOWNLOAD_VAR, "")
    assert not archive.download_forbidden()


@pytest.mark.parametrize("command", [["train", "transformer"], ["train", "bahdanau"],
                                     ["bench", "train"], ["bench", "decode"]])
def test_every_command_with_data_takes_no_download(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--data PATH" in out and "--no-download" in out


def test_given_data_is_never_replaced_by_a_download(nowhere, server, monkeypatch, tmp_path,
                                                    capsys):
    monkeypatch.setenv(archive.URL_VAR, server.url)
    status, err = check(["--data", str(tmp_path / "no-such.zip")], capsys)
    assert_one_line(err, "does not exist", status=2, returncode=status)
    assert server.requests == 0


# --------------------------------------------------------------------------- issue 17 acceptance


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory) -> Path:
    """The working tree as a fresh clone would have it (the files git tracks or would track,
    uncommitted changes included), in a folder with no ``shared`` beside it."""
    root = tmp_path_factory.mktemp("clone")
    clone = root / "jax-attention"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=CHECKOUT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = CHECKOUT / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    assert not (root / "shared").exists() and (clone / "jax_attention" / "__main__.py").is_file()
    return clone


def clone_env(clone: Path, cache: Path, url: str) -> dict[str, str]:
    env = command_env(PYTHONPATH=str(clone), XDG_CACHE_HOME=str(cache),
                      JAX_ATTENTION_DATA_URL=url, JAX_ATTENTION_DATA_SHA1=SHARED_ARCHIVE_SHA1)
    for name in (archive.NO_DOWNLOAD_VAR, archive.ENV_VAR):
        env.pop(name, None)
    return env


# The README's first training command (`make run`), at the session's tiny Transformer's size
# (tests/shared_runs.py: its programs are in the session's compilation cache).
README_COMMAND = ("train", "transformer", *tiny_flags("transformer"))


def test_fresh_clone_downloads_its_data_and_trains(fresh_clone, server, tmp_path):
    env = clone_env(fresh_clone, tmp_path / "cache", server.url)
    where = "import jax_attention; print(jax_attention.__file__)"
    used = subprocess.run([sys.executable, "-c", where], cwd=fresh_clone, env=env,
                          capture_output=True, text=True, check=True).stdout.strip()
    assert Path(used).is_relative_to(fresh_clone)  # the clone's code, not the checkout's
    status, out, err = run_command(*README_COMMAND, env=env, cwd=fresh_clone, timeout=600)
    assert status == 0, err
    cached = tmp_path / "cache" / "jax-attention" / "fra-eng.zip"
    assert hashlib.sha1(cached.read_bytes()).hexdigest() == SHARED_ARCHIVE_SHA1
    assert server.requests == 1
    assert f"downloading {server.url} (" in err and f"into {cached.parent}" in err
    assert "Traceback" not in err and f"epoch {EPOCHS}" in out and "bleu" in out, out
    assert "Downloading data from" not in err  # pooch's own note, silenced
    assert (fresh_clone / "runs" / "transformer" / "config.json").is_file()


def test_fresh_clone_with_the_server_down_gives_one_error_line(fresh_clone, tmp_path):
    url = gone_url()
    env = clone_env(fresh_clone, tmp_path / "cache", url)
    status, _, err = run_command(*README_COMMAND, "--checkpoint", str(tmp_path / "model"),
                                   env=env, cwd=fresh_clone, timeout=300)
    assert_one_line(err, f"cannot download {url}", "Connection refused", "--data PATH",
                    status=2, returncode=status)
    assert not (tmp_path / "model").exists()
    cache = tmp_path / "cache" / "jax-attention"
    assert not cache.exists() or list(cache.iterdir()) == []


# --------------------------------------------------------------------------- the docs build's data


def test_the_data_command_downloads_once_and_prints_the_path(fresh_clone, server, tmp_path):
    """`jax-attention data` (what `make docs` runs before the tutorials) in a clone with no data
    anywhere: the archive downloaded into the user cache, its path alone on stdout; a second run
    finds it there."""
    env = clone_env(fresh_clone, tmp_path / "cache", server.url)
    cached = tmp_path / "cache" / "jax-attention" / "fra-eng.zip"
    errors = []
    for _ in range(2):
        status, out, err = run_command("data", env=env, cwd=fresh_clone, timeout=120)
        assert status == 0 and out == f"{cached}\n", (out, err)
        assert "Traceback" not in err
        errors.append(err)
    assert server.requests == 1 and f"downloading {server.url} (" in errors[0]
    assert "downloading" not in errors[1]
    assert hashlib.sha1(cached.read_bytes()).hexdigest() == SHARED_ARCHIVE_SHA1


def test_the_data_command_with_no_way_to_the_data_stops_with_one_line(fresh_clone, tmp_path):
    url = gone_url()
    env = clone_env(fresh_clone, tmp_path / "cache", url)
    status, out, err = run_command("data", env=env, cwd=fresh_clone, timeout=120)
    assert_one_line(err, f"cannot download {url}", "--data PATH", status=2, returncode=status)
    assert out == ""
    damaged = tmp_path / "fra-eng.zip"
    damaged.write_bytes(SHARED_ARCHIVE.read_bytes()[:5000])
    status, out, err = run_command("data", "--data", str(damaged), env=env, cwd=fresh_clone,
                                   timeout=120)
    assert_one_line(err, "damaged or truncated archive", status=2, returncode=status)
    assert out == "" and damaged.stat().st_size == 5000  # the user's file left as it was


def test_make_docs_hands_the_tutorials_the_data_found_or_downloaded():
    """The docs build runs `jax-attention data` first, stops when it fails, and gives the
    tutorials (which train on the data) its path."""
    recipe = subprocess.run(["make", "-n", "docs", "BIN=.venv/bin", "VENV=/nonexistent-venv"],
                            cwd=CHECKOUT, capture_output=True, text=True)
    commands = recipe.stdout
    assert "data=$(.venv/bin/jax-attention data) &&" in commands, commands
    assert 'JAX_ATTENTION_DATA="$data" .venv/bin/python -m sphinx' in commands, commands


def test_a_download_into_the_cache_removes_what_a_stopped_one_left(fresh_clone, server,
                                                                  tmp_path):
    """`jax-attention data` stopped by Ctrl-C in its download exits 130 with one line and no
    clean-up (the commands' Ctrl-C), leaving pooch's temporary file; the next download into the
    user cache deletes such a file once nothing has written to it for a while, keeps a fresh one
    (a download under way) and anything else in the folder."""
    server.stall_after = len(server.payload) // 4
    cache = tmp_path / "cache" / "jax-attention"
    env = clone_env(fresh_clone, tmp_path / "cache", server.url)
    # Python's own Ctrl-C handler: a background process of a non-interactive shell (CI) inherits
    # SIGINT ignored, and the command then keeps it ignored.
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from jax_attention.cli import main; sys.exit(main(['data']))")
    process = subprocess.Popen([sys.executable, "-c", code], cwd=fresh_clone, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (cache.is_dir() and any(path.stat().st_size for path in cache.iterdir())):
            assert process.poll() is None, f"the download ended first: {process.returncode}"
            assert time.monotonic() < deadline, "no byte of the download reached the folder"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert_one_line(err, "interrupted (Ctrl-C)", status=130, returncode=process.returncode)
    assert out == ""
    [left] = list(cache.iterdir())
    assert left.name.startswith("tmp") and left.stat().st_size > 0
    stale = time.time() - 3 * archive.DOWNLOAD_TIMEOUT
    os.utime(left, (stale, stale))
    fresh, mine = cache / "tmpabcd1234", cache / "tmpnotes.txt"
    fresh.write_bytes(b"a download under way")
    mine.write_text("a file of the user's")
    os.utime(mine, (stale, stale))
    mine_dir = cache / "tmpdir"
    mine_dir.mkdir()
    server.stall_after = None
    status, out, err = run_command("data", env=env, cwd=fresh_clone, timeout=120)
    assert status == 0 and out == f"{cache / 'fra-eng.zip'}\n", err
    assert sorted(path.name for path in cache.iterdir()) == [
        "fra-eng.zip", "tmpabcd1234", "tmpdir", "tmpnotes.txt"]
