"""Footer checks remembered across processes (``formats/footer_checks/v1``): a loader writes
the file versions whose footers passed; a later process (simulated by forgetting what this
one knows: ``forget_checks``) reads neither those footers' bytes a second time nor decodes
them; any change of a file, of the document or of the check's rules means checking again.
Bytes are counted through a counting fsspec filesystem."""

from __future__ import annotations

import glob
import json
import os

import jsonschema
import pyarrow.parquet as pq
import pytest

import arrowload as al
from arrowload.datagen import write_lake
from arrowload.source import footer
from _support import CountingLocalFileSystem

SCHEMA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "formats", "footer_checks", "v1", "schema.json")


@pytest.fixture()
def lake(tmp_path):
    path = tmp_path / "lake"
    write_lake(path, rows=3_000, shards=3, row_group_size=500, features=2, emb_dim=4)
    return str(path)


def _build(lake: str, cache: str):
    """A fresh process's filtered loader over a counting filesystem; returns the filesystem
    with what listing the files (their footers, and the check's reads) cost."""
    footer.forget_checks()
    fs = CountingLocalFileSystem()
    ds = al.dataset(lake, filesystem=fs).filter("id < 700").select("id", "f0")
    listing = fs.stats.snapshot()
    with ds.loader(64, cache_dir=cache) as loader:
        rows = sum(len(b["id"]) for b in loader)
    assert rows == 700
    fs.listing = listing
    return fs


def _footer_bytes(fs) -> int:
    return fs.listing["bytes"]


def _doc_paths(cache: str) -> list[str]:
    return sorted(glob.glob(os.path.join(cache, "footer-checks", "*.json")))


def _doc(cache: str) -> dict:
    """The one document of a cache dir that has seen one lake (one folder)."""
    paths = _doc_paths(cache)
    assert len(paths) == 1, paths
    with open(paths[0]) as f:
        return json.load(f)


def test_a_loader_remembers_the_files_that_passed(lake, tmp_path):
    cache = str(tmp_path / "cache")
    _build(lake, cache)
    doc = _doc(cache)
    with open(SCHEMA) as f:
        jsonschema.validate(doc, json.load(f))
    assert doc["rules"] == footer.CHECK_RULES
    files = sorted(glob.glob(os.path.join(lake, "*.parquet")))
    by_path = {os.path.basename(k[1]): k for k in doc["passed"]}
    assert sorted(by_path) == [os.path.basename(p) for p in files]
    for p in files:
        st = os.stat(p)
        k = by_path[os.path.basename(p)]
        # (fsspec reports local modification times as float seconds: to the microsecond)
        assert (k[2], k[4]) == (st.st_size, f"ino={st.st_ino}") and abs(k[3] - st.st_mtime_ns) < 1000


def test_a_later_process_reads_no_footer_twice(lake, tmp_path, monkeypatch):
    cold_cache, warm_cache = str(tmp_path / "cold"), str(tmp_path / "warm")
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", warm_cache)  # where the dataset looks (before any loader)
    _build(lake, warm_cache)
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", cold_cache)
    cold = _build(lake, cold_cache)  # nothing remembered: every footer's bytes read for the check
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", warm_cache)
    warm = _build(lake, warm_cache)
    sizes = {p: os.path.getsize(p) for p in glob.glob(os.path.join(lake, "*.parquet"))}
    footer_len = {p: pq.ParquetFile(p).metadata.serialized_size for p in sizes}
    # each file's footer is read by pyarrow once either way; the check's own read is gone
    saved = _footer_bytes(cold) - _footer_bytes(warm)
    assert saved >= sum(footer_len.values())
    assert warm.listing["reads"] < cold.listing["reads"]


def test_a_loader_with_its_own_cache_dir_keeps_the_checks_where_datasets_look(lake, tmp_path, monkeypatch):
    """A loader naming a cache dir of its own writes the checks there and in the user cache
    dir, which a dataset reads when it opens (before the loader): a later process reads no
    footer twice. Truth: the same later process with nothing remembered."""
    user, own = str(tmp_path / "user"), str(tmp_path / "own")
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", user)
    _build(lake, own)
    assert _doc(own)["passed"] and sorted(map(tuple, _doc(user)["passed"])) == sorted(map(tuple, _doc(own)["passed"]))
    warm = _build(lake, own)
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", str(tmp_path / "empty"))
    cold = _build(lake, str(tmp_path / "own-cold"))
    footer_len = sum(pq.ParquetFile(p).metadata.serialized_size for p in glob.glob(os.path.join(lake, "*.parquet")))
    assert _footer_bytes(cold) - _footer_bytes(warm) >= footer_len


def test_a_changed_file_is_checked_again(lake, tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", cache)
    _build(lake, cache)
    first = sorted(glob.glob(os.path.join(lake, "*.parquet")))[0]
    table = pq.read_table(first)
    pq.write_table(table, first + ".tmp", row_group_size=500, compression="zstd")
    os.replace(first + ".tmp", first)  # a new version: other inode and mtime
    fs = _build(lake, cache)
    warm = _build(lake, cache)
    meta = pq.ParquetFile(first).metadata.serialized_size
    # the new version's footer read twice (pyarrow's parse, the check), the others once
    assert _footer_bytes(fs) - _footer_bytes(warm) >= meta
    st = os.stat(first)
    keys = [k for k in _doc(cache)["passed"] if k[1].endswith(os.path.basename(first))]
    assert any(k[4] == f"ino={st.st_ino}" and abs(k[3] - st.st_mtime_ns) < 1000 for k in keys)


@pytest.mark.parametrize("damage", ["garbage", "rules", "version", "entry"])
def test_a_damaged_or_foreign_document_is_ignored_and_rewritten(lake, tmp_path, monkeypatch, damage):
    cache = str(tmp_path / "cache")
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", cache)
    _build(lake, cache)
    path, = _doc_paths(cache)
    good = _doc(cache)
    bad = {"garbage": "{not json", "rules": json.dumps(dict(good, rules=footer.CHECK_RULES + 1)),
           "version": json.dumps(dict(good, version=2)),
           "entry": json.dumps(dict(good, passed=[k[:4] for k in good["passed"]]))}[damage]
    with open(path, "w") as f:
        f.write(bad)
    damaged = _build(lake, cache)
    warm = _build(lake, cache)  # rewritten by the build before
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", str(tmp_path / "other"))
    cold = _build(lake, str(tmp_path / "other"))
    # nothing trusted: the footers are read for the check as with nothing remembered ...
    assert _footer_bytes(damaged) == _footer_bytes(cold) > _footer_bytes(warm)
    # ... and the document is whole again
    assert sorted(map(tuple, _doc(cache)["passed"])) == sorted(map(tuple, good["passed"]))


def test_a_process_reads_the_documents_of_the_folders_it_opens_only(lake, tmp_path, monkeypatch):
    """One document per folder: checks remembered for other lakes are neither read nor
    rewritten by a process over this one (one document for every folder ever seen grew to
    15,000 entries, read and validated by every loader build). Truth: the other folder's
    document, byte for byte, and what the process knows afterwards."""
    cache = str(tmp_path / "cache")
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", cache)
    other = tmp_path / "other"
    write_lake(other, rows=200, shards=2, row_group_size=100, features=1, emb_dim=2)
    footer.forget_checks()
    with al.dataset(str(other)).select("id").loader(64, cache_dir=cache) as loader:
        assert sum(len(b["id"]) for b in loader) == 200
    other_doc, = _doc_paths(cache)
    with open(other_doc, "rb") as f:
        before = f.read()
    _build(lake, cache)
    assert len(_doc_paths(cache)) == 2
    with open(other_doc, "rb") as f:
        assert f.read() == before
    known_paths = {k[1] for k in footer._KNOWN}
    assert known_paths and not any(str(other) in p for p in known_paths)
    # and a later process over the other lake recalls its checks only
    footer.forget_checks()
    with al.dataset(str(other)).select("id").loader(64, cache_dir=cache) as loader:
        assert sum(len(b["id"]) for b in loader) == 200
    assert {k[1].rpartition("/")[0] for k in footer._KNOWN} == {str(other)}
    with open(other_doc, "rb") as f:
        assert f.read() == before  # nothing new to write


def test_golden_documents_through_the_reader():
    root = os.path.join(os.path.dirname(SCHEMA))
    for path in sorted(glob.glob(os.path.join(root, "examples", "*.json"))):
        with open(path) as f:
            doc = json.load(f)
        keys = footer.read_footer_checks(doc, path)
        assert keys == [tuple(k) for k in doc["passed"]]
    for path in sorted(glob.glob(os.path.join(root, "invalid", "*.json"))):
        with open(path) as f:
            doc = json.load(f)
        with pytest.raises((al.CorruptFileError, al.UnsupportedError)) as info:
            footer.read_footer_checks(doc, path)
        assert path in str(info.value)


def test_a_loader_writes_the_folders_it_reads_and_old_files_age_out(tmp_path, monkeypatch):
    """A loader writes the documents of its own files' folders only (a new cache dir
    named after 2,000 lakes got 2,001 documents, and every build walked every check the
    process knew); a folder's document keeps its live files and a bounded number besides
    (files replaced one by one grew it by one entry each, forever). Truth: the documents on
    disk against the files on disk."""
    monkeypatch.setattr(footer, "_OTHERS_KEPT", 3)
    cache = str(tmp_path / "cache")
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", cache)
    footer.forget_checks()
    lakes = []
    for name in ("a", "b"):
        path = tmp_path / name
        write_lake(path, rows=400, shards=2, row_group_size=100, features=1, emb_dim=2)
        lakes.append(str(path))
        with al.dataset(str(path)).select("id").loader(64) as loader:
            assert sum(len(b["id"]) for b in loader) == 400
    assert len(_doc_paths(cache)) == 2
    own = str(tmp_path / "own")
    with al.dataset(lakes[1]).select("id").loader(64, cache_dir=own) as loader:
        list(loader)
    assert len(_doc_paths(own)) == 1 and all(lakes[1] in k[1] for k in _doc(own)["passed"])
    # a folder whose files are replaced one at a time: the live ones and at most 3 others
    files = sorted(glob.glob(os.path.join(lakes[0], "*.parquet")))
    table = pq.read_table(files[0])
    for step in range(8):
        os.remove(files[0])
        files[0] = os.path.join(lakes[0], f"part-new-{step}.parquet")
        pq.write_table(table, files[0], row_group_size=100)
        footer.forget_checks()
        with al.dataset(lakes[0]).select("id").loader(64) as loader:
            assert sum(len(b["id"]) for b in loader) == 400
        [doc] = [d for d in map(_read, _doc_paths(cache)) if any(lakes[0] in k[1] for k in d["passed"])]
        paths = [k[1] for k in doc["passed"]]
        assert set(files) <= set(paths) and len(paths) <= len(files) + 3 and len(set(paths)) == len(paths)


def _read(path: str) -> dict:
    with open(path) as f:
        return json.load(f)
