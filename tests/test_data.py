"""turngym.data: registry resolution, download with SHA-256 and range resume, against a local server."""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import threading
import zipfile

import pytest

from turngym.data import Dataset, DataNotFound, RemoteFile, dataset_path, register_dataset
from turngym.data import cli as data_cli
from turngym.data.catalog import flatten_single_subdir, lmrl_prepare
from turngym.data.downloader import ChecksumError, DownloadError, download, extract, fetch, load_pins
from turngym.data.registry import COMPLETE_STAMP, DATASETS, download_dir

PAYLOAD = bytes(range(256)) * 400  # 102,400 bytes


class _Server:
    """A tiny HTTP file server with Range support and switchable failure modes."""

    def __init__(self):
        self.files: dict[str, bytes] = {"/f.bin": PAYLOAD}
        self.types: dict[str, str] = {}
        self.ranges: list[str | None] = []
        self.ignore_range = False
        self.cut_first = 0  # close the connection after this many bytes, once
        self.status = 200
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.ranges.append(self.headers.get("Range"))
                if outer.status != 200:
                    self.send_response(outer.status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = outer.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                start = 0
                rng = self.headers.get("Range")
                if rng and not outer.ignore_range:
                    start = int(rng.split("=")[1].split("-")[0])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                if self.path in outer.types:
                    self.send_header("Content-Type", outer.types[self.path])
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if outer.cut_first:
                    n, outer.cut_first = outer.cut_first, 0
                    self.wfile.write(body[:n])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TURNGYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TURNGYM_DATA", raising=False)


SHA = hashlib.sha256(PAYLOAD).hexdigest()


def test_fetch_verifies_checksum(server, tmp_path):
    dest = tmp_path / "f.bin"
    assert fetch(server.url + "/f.bin", dest, SHA) == SHA
    assert dest.read_bytes() == PAYLOAD


def test_checksum_mismatch_is_a_clear_error_and_leaves_nothing(server, tmp_path):
    dest = tmp_path / "f.bin"
    with pytest.raises(ChecksumError, match="SHA-256 mismatch.*expected 0000"):
        fetch(server.url + "/f.bin", dest, "0" * 64)
    assert not dest.exists() and not (tmp_path / "f.bin.part").exists()


def test_resume_appends_to_partial_file(server, tmp_path):
    dest = tmp_path / "f.bin"
    (tmp_path / "f.bin.part").write_bytes(PAYLOAD[:30_000])
    assert fetch(server.url + "/f.bin", dest, SHA) == SHA
    assert server.ranges == ["bytes=30000-"]
    assert dest.read_bytes() == PAYLOAD


def test_server_ignoring_range_restarts_from_zero(server, tmp_path):
    server.ignore_range = True
    dest = tmp_path / "f.bin"
    (tmp_path / "f.bin.part").write_bytes(b"garbage" * 10)
    assert fetch(server.url + "/f.bin", dest, SHA) == SHA


def test_dropped_connection_is_resumed_on_retry(server, tmp_path):
    server.cut_first = 40_000
    dest = tmp_path / "f.bin"
    assert fetch(server.url + "/f.bin", dest, SHA, backoff_s=0.01) == SHA
    assert server.ranges[0] is None and server.ranges[1] is not None and server.ranges[1].startswith("bytes=")
    assert int(server.ranges[1].split("=")[1].rstrip("-")) > 0


def test_5xx_retries_then_fails_and_4xx_fails_fast(server, tmp_path):
    server.status = 503
    with pytest.raises(DownloadError, match="3 attempts"):
        fetch(server.url + "/f.bin", tmp_path / "x", retries=2, backoff_s=0.01)
    assert len(server.ranges) == 3
    server.status = 200
    with pytest.raises(DownloadError, match="404"):
        fetch(server.url + "/missing", tmp_path / "y", retries=2, backoff_s=0.01)


def test_html_page_instead_of_the_file_is_refused(server, tmp_path):
    server.files["/big.zip"] = b"<html>Google Drive can't scan this file for viruses</html>"
    server.types["/big.zip"] = "text/html; charset=utf-8"
    with pytest.raises(DownloadError, match="web page"):
        fetch(server.url + "/big.zip", tmp_path / "big.zip", retries=0)


def test_archive_dataset_is_extracted_and_a_bad_archive_is_never_pinned(server, tmp_path):
    buf = tmp_path / "a.zip"
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("pkg-123/python_programs/x.py", "print(2)")
    server.files["/a.zip"] = buf.read_bytes()
    server.files["/junk.zip"] = b"this is not an archive"
    register_dataset(Dataset("toyzip", "toy", (RemoteFile(server.url + "/a.zip", "a.zip", extract=True),),
                             ("python_programs",), prepare=flatten_single_subdir))
    register_dataset(Dataset("toyjunk", "toy", (RemoteFile(server.url + "/junk.zip", "junk.zip", extract=True),), ("x",)))
    try:
        folder = download("toyzip", log=lambda m: None)
        assert (folder / "python_programs" / "x.py").read_text() == "print(2)" and not (folder / "a.zip").exists()
        assert dataset_path("toyzip") == folder
        with pytest.raises(ValueError, match="neither a zip nor a tar"):
            download("toyjunk", log=lambda m: None)
        pins = load_pins()
        assert server.url + "/a.zip" in pins and server.url + "/junk.zip" not in pins
    finally:
        DATASETS.pop("toyzip", None)
        DATASETS.pop("toyjunk", None)


def _toy_dataset(server, name="toyds", sha=None):
    return register_dataset(Dataset(name, "toy", (RemoteFile(server.url + "/f.bin", "f.bin", sha),), ("f.bin",)))


def test_download_pins_unknown_digest_then_enforces_it(server):
    _toy_dataset(server)
    try:
        logs: list[str] = []
        folder = download("toyds", log=logs.append)
        assert (folder / "f.bin").read_bytes() == PAYLOAD and (folder / COMPLETE_STAMP).exists()
        assert load_pins()[server.url + "/f.bin"] == SHA
        assert any("pinned sha256=" + SHA in m for m in logs)
        assert dataset_path("toyds") == folder
        server.files["/f.bin"] = PAYLOAD[::-1]  # upstream changed (or was tampered with)
        with pytest.raises(ChecksumError):
            download("toyds", force=True, retries=0)
        with pytest.raises(DataNotFound):  # the failed re-download left no "complete" stamp
            dataset_path("toyds")
    finally:
        DATASETS.pop("toyds", None)


def test_known_digest_mismatch_fails_download(server):
    _toy_dataset(server, "toyds2", sha="ab" * 32)
    try:
        with pytest.raises(ChecksumError):
            download("toyds2", retries=0)
    finally:
        DATASETS.pop("toyds2", None)


def test_resolution_order_and_errors(tmp_path, monkeypatch):
    local = tmp_path / "local" / "lmrl"
    local.mkdir(parents=True)
    (local / "global_cities.txt").write_text("x")
    explicit = tmp_path / "explicit" / "lmrl"
    explicit.mkdir(parents=True)
    (explicit / "wordle_official.txt").write_text("x")
    with pytest.raises(DataNotFound, match="turngym data download lmrl"):
        dataset_path("lmrl")
    monkeypatch.setenv("TURNGYM_DATA", str(tmp_path / "local"))
    assert dataset_path("lmrl") == local
    assert dataset_path("lmrl", data_dir=tmp_path / "explicit") == explicit
    # a half-finished download (no stamp) is skipped
    monkeypatch.delenv("TURNGYM_DATA")
    half = download_dir("lmrl")
    half.mkdir(parents=True)
    (half / "global_cities.txt").write_text("x")
    with pytest.raises(DataNotFound):
        dataset_path("lmrl")
    with pytest.raises(KeyError, match="known"):
        dataset_path("no-such-dataset")


@pytest.mark.data
def test_shared_data_layout_is_a_valid_local_copy(shared_data):
    for name in ("spider", "hotpotqa", "lmrl", "alfworld", "quixbugs"):
        assert dataset_path(name, data_dir=shared_data) == shared_data / name


def test_extract_refuses_path_traversal(tmp_path):
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("../evil.txt", "x")
    with pytest.raises(ValueError, match="unsafe path"):
        extract(bad, tmp_path / "out")
    assert not (tmp_path / "evil.txt").exists()
    good = tmp_path / "good.zip"
    with zipfile.ZipFile(good, "w") as z:
        z.writestr("QuixBugs-abc/python_programs/a.py", "print(1)")
    out = tmp_path / "out2"
    extract(good, out)
    flatten_single_subdir(out)
    assert (out / "python_programs" / "a.py").read_text() == "print(1)"


def test_lmrl_prepare_reads_the_object_literal_without_running_it(tmp_path):
    (tmp_path / "_twenty_questions_data.py").write_text(
        "import os\nos.system('false')\nDEFAULT_OBJECT_DICT = {'Animals': ['Cat', 'Dog;Puppy']}\n"
    )
    lmrl_prepare(tmp_path)
    assert json.loads((tmp_path / "twenty_questions_objects.json").read_text()) == {"Animals": ["Cat", "Dog;Puppy"]}
    assert not (tmp_path / "_twenty_questions_data.py").exists()


def test_cli_list_and_path(tmp_path, capsys, monkeypatch):
    ap = argparse.ArgumentParser()
    data_cli.add_arguments(ap)
    assert data_cli.main(ap.parse_args(["list"])) == 0
    out = capsys.readouterr().out
    assert "spider" in out and "hotpotqa" in out and "lmrl" in out
    assert data_cli.main(ap.parse_args(["path", "spider"])) == 1
    assert "turngym data download spider" in capsys.readouterr().err
    (tmp_path / "spider").mkdir()
    (tmp_path / "spider" / "questions.csv").write_text("database,question,sql\n")
    assert data_cli.main(ap.parse_args(["--data-dir", str(tmp_path), "path", "spider"])) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "spider")
    assert data_cli.main(ap.parse_args(["path", "nope"])) == 2
