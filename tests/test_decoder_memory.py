"""Decoder measurements remembered in the cache dir (``formats/decoder_choice/v1``,
``arrowload/scan/memory.py``): the golden documents go through the reader, invalid ones
are refused with typed errors, what a unit reader writes validates, a later reader in the
same situation chooses at once (without the trials) and still reads exactly pyarrow's
rows, and a damaged or foreign document is ignored and rewritten. Also: while one reader
thread imports polars, the others read with another decoder, with the same rows."""

from __future__ import annotations

import glob
import json
import os

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import arrowload as al
from arrowload.errors import ArrowloadError, CorruptFileError, UnsupportedError
from arrowload.scan import memory
from arrowload.scan.choose import Chooser
from arrowload.scan.units import UnitReader

FORMAT_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "formats", "decoder_choice", "v1")


def _schema_validator():
    with open(os.path.join(FORMAT_DIR, "schema.json")) as f:
        return jsonschema.Draft202012Validator(json.load(f))


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(FORMAT_DIR, "examples", "*.json"))),
                         ids=os.path.basename)
def test_golden_documents_are_read(path):
    with open(path) as f:
        doc = json.load(f)
    got = memory.read_decoder_choice(doc, path)
    assert got.chosen in got.costs and got.costs == {k: float(v) for k, v in doc["costs"].items()}
    assert got.key == doc["key"] and got.measured == doc["measured"]


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(FORMAT_DIR, "invalid", "*.json"))),
                         ids=os.path.basename)
def test_invalid_documents_are_refused_with_typed_errors(path):
    with open(path) as f:
        doc = json.load(f)
    with pytest.raises((CorruptFileError, UnsupportedError)) as info:
        memory.read_decoder_choice(doc, path)
    assert isinstance(info.value, ArrowloadError) and path in str(info.value)


def test_a_chosen_decoder_must_be_one_measured():
    doc = {"format": memory.FORMAT, "version": 1, "key": "k", "situation": {}, "chosen": "duckdb",
           "costs": {"pyarrow": 1e-9}, "measured": 2}
    with pytest.raises(CorruptFileError, match="chosen"):
        memory.read_decoder_choice(doc, "d.json")


def test_chooser_starts_from_remembered_costs_and_keeps_measuring():
    c = Chooser(["a", "b"], warmup=1, trials=2, recheck=4)
    c.remember({"a": 3.0, "b": 1.0}, measured=6)
    assert c.chosen == "b"  # no warm-up, no trials
    costs = {"a": 0.1, "b": 1.0}  # the machine changed: "a" is cheaper now
    picks = []
    for _ in range(64):
        name, measure = c.pick()
        picks.append((name, measure))
        c.done(name, costs[name] if measure else None, 1)
    # a candidate's first read in the process (its warm-up) is never measured
    assert picks[[n for n, _ in picks].index("a")] == ("a", False)
    assert c.chosen == "a" and c.measured > 6


def test_a_candidate_added_later_uses_its_remembered_cost():
    c = Chooser(["a"], warmup=1, trials=2)
    c.remember({"a": 2.0, "b": 1.0})
    assert c.pick() == ("a", False)
    c.done("a", None, 1)
    c.add("b")
    assert c.chosen == "b"


@pytest.fixture
def lake(tmp_path):
    rng = np.random.default_rng(0)
    n = 24_000
    path = str(tmp_path / "lake")
    os.makedirs(path)
    for i in range(2):
        pq.write_table(pa.table({"k": rng.integers(0, 5, n), "x": rng.random(n), "y": rng.random(n)}),
                       os.path.join(path, f"part-{i}.parquet"), row_group_size=1000)
    return path


def _truth(lake):
    t = pa.concat_tables(pq.read_table(p) for p in sorted(glob.glob(os.path.join(lake, "*.parquet"))))
    return t.filter(pc.equal(t["k"], 3)).select(["x", "y"])


def _read_all(reader):
    return pa.concat_tables(reader.read(i) for i in range(reader.num_units))


def test_a_reader_remembers_and_a_later_one_chooses_at_once(lake, tmp_path):
    import polars  # noqa: F401 - imported: polars is a candidate from the first read
    cache = str(tmp_path / "cache")
    plan = al.dataset(lake).filter("k = 3").select("x", "y").optimized_plan()
    first = UnitReader(plan, al.Options(), cache_dir=cache)
    assert first.decoder is None and len(first.candidates) > 1
    assert _read_all(first).equals(_truth(lake))
    docs = glob.glob(os.path.join(cache, "decoders-*.json"))
    assert len(docs) == 1
    with open(docs[0]) as f:
        doc = json.load(f)
    _schema_validator().validate(doc)
    assert doc["key"] == memory.situation_key(doc["situation"]) and doc["chosen"] in first.candidates
    assert doc["situation"]["filter"]["columns"] == [["k", "int64"]]
    first.close()

    second = UnitReader(plan, al.Options(), cache_dir=cache)
    assert second.decoder == doc["chosen"]  # chosen before any read
    described = second.describe()
    assert described["started_from_remembered"] and described["remembered"] == docs[0]
    assert not first.describe()["started_from_remembered"]
    assert _read_all(second).equals(_truth(lake))
    second.close()
    # another filter shape (other columns) is another situation
    other = UnitReader(al.dataset(lake).filter("x < 0.5").select("y").optimized_plan(), al.Options(),
                       cache_dir=cache)
    assert other.decoder is None
    other.close()


@pytest.mark.parametrize("damage", ["not json{", '{"format": "arrowload.decoder_choice", "version": 9}', "[]"])
def test_a_damaged_document_is_ignored_and_rewritten(lake, tmp_path, damage):
    import polars  # noqa: F401
    cache = str(tmp_path / "cache")
    plan = al.dataset(lake).filter("k = 3").select("x", "y").optimized_plan()
    reader = UnitReader(plan, al.Options(), cache_dir=cache)
    key = reader._memory_key
    reader.close()
    os.makedirs(cache, exist_ok=True)
    with open(memory.path_for(cache, key), "w") as f:
        f.write(damage)
    reader = UnitReader(plan, al.Options(), cache_dir=cache)
    assert reader.decoder is None  # nothing trusted: measured again
    assert _read_all(reader).equals(_truth(lake))
    reader.close()
    with open(memory.path_for(cache, key)) as f:
        _schema_validator().validate(json.load(f))


def test_a_loader_remembers_in_its_cache_dir(lake, tmp_path, monkeypatch):
    """The loader's unit reader saves its decoder measurements in the loader's cache dir.
    Its epochs read per unit (with polars imported they would stream, and only the counting
    would go through the unit reader: its threads could count every unit with pyarrow while
    polars' first trial ran, leaving no choice to save -- about 1 run in 20), one read at a
    time, so the candidates' trials alternate and end within a few reads."""
    import polars  # noqa: F401
    monkeypatch.setenv("ARROWLOAD_STREAM", "0")
    cache = str(tmp_path / "cache")
    ds = al.dataset(lake).filter("k = 3").select("x", "y")
    rows = [sum(len(b["x"]) for b in ds.loader(500, cache_dir=cache, io_threads=1)) for _ in range(2)]
    assert rows == [_truth(lake).num_rows] * 2
    assert glob.glob(os.path.join(cache, "decoders-*.json"))


def test_threads_read_on_while_one_imports_polars(lake):
    """A fresh process, polars not imported, several threads reading with polars pinned
    beside pyarrow: every unit's rows are pyarrow's, and polars did get imported."""
    from test_real_files import run_isolated
    out = run_isolated(f"""
        import json, sys
        from concurrent.futures import ThreadPoolExecutor
        import pyarrow as pa
        import arrowload as al
        from arrowload.scan.units import UnitReader
        assert "polars" not in sys.modules
        plan = al.dataset({lake!r}).filter("k = 3").select("x", "y").optimized_plan()
        reader = UnitReader(plan, al.Options(), decoders=["pyarrow", "polars"])
        with ThreadPoolExecutor(4) as pool:
            parts = list(pool.map(reader.read, range(reader.num_units)))
        t = pa.concat_tables(parts)
        print(json.dumps({{"x": t["x"].to_pylist(), "y": t["y"].to_pylist(),
                          "polars": "polars" in sys.modules}}))
    """)
    truth = _truth(lake)
    assert out == {"x": truth["x"].to_pylist(), "y": truth["y"].to_pylist(), "polars": True}


def test_a_decoder_remembered_as_dearer_is_not_imported_to_be_measured_again_on_a_short_run(lake, tmp_path):
    """Where this situation's remembered measurements chose pyarrow, a fresh process does not
    import polars to re-measure it until the reader has read REMEASURE_IMPORT_BYTES (its import
    costs 0.2 CPU s and ~50 MiB); polars' remembered cost is kept in the document meanwhile."""
    from test_real_files import run_isolated
    cache = str(tmp_path / "cache")
    script = """
        import json, sys, threading
        import pyarrow as pa
        import arrowload as al
        from arrowload.scan import units
        units.POLARS_BYTES = 0  # this small lake: polars a candidate at once unless remembered dearer
        units.REMEASURE_IMPORT_BYTES = {remeasure}
        plan = al.dataset({lake!r}).filter("k = 3").select("x", "y").optimized_plan()
        reader = units.UnitReader(plan, al.Options(), cache_dir={cache!r})
        rows = sum(reader.read(i).num_rows for i in range(reader.num_units))
        # a pick of polars starts its import on a thread of its own: under load that thread
        # may not have begun importing by the last read, so wait for it (it was started or not)
        for t in threading.enumerate():
            if t.name == "arrowload-import-polars":
                t.join()
        print(json.dumps({{"rows": rows, "polars": "polars" in sys.modules,
                          "decoded": reader.decoded_counts(), "units": reader.num_units}}))
    """
    first = run_isolated(script.format(remeasure=1 << 30, lake=lake, cache=cache))
    assert first["polars"] and first["rows"] == _truth(lake).num_rows  # measured: imported
    (path,) = glob.glob(os.path.join(cache, "decoders-*.json"))
    with open(path) as f:
        doc = json.load(f)
    doc["chosen"], doc["costs"] = "pyarrow", {"pyarrow": 1e-9, "polars": 3e-9}
    with open(path, "w") as f:
        json.dump(doc, f)

    short = run_isolated(script.format(remeasure=1 << 30, lake=lake, cache=cache))
    assert short == {"rows": _truth(lake).num_rows, "polars": False, "decoded": {"pyarrow": short["units"]},
                     "units": short["units"]}
    with open(path) as f:
        assert json.load(f)["costs"]["polars"] == 3e-9  # kept, though not measured in that process

    # "long": past the threshold after the first read, polars joins with its remembered cost and
    # the early check of remembered costs hands it its warm-up read at once, which starts its
    # import. (Before that check, polars was picked only at the 64th read, or when pyarrow's
    # recheck at the 32nd, averaged with the planted 1e-9, came out dearer than polars' 3e-9:
    # a timing, which failed about 3 runs in 10 under load.)
    long = run_isolated(script.format(remeasure=1, lake=lake, cache=cache))
    assert long["polars"] and long["rows"] == _truth(lake).num_rows


@pytest.mark.parametrize("plain_bytes", [1 << 30, 0])
def test_polars_joins_plain_reads_only_past_its_own_threshold(lake, tmp_path, plain_bytes):
    """Without a filter polars prefilters, its reads cost about what pyarrow's do, so a fresh
    process imports it for them only once the reader's units hold POLARS_PLAIN_BYTES (1 GiB),
    not POLARS_BYTES (256 MiB, the filtered threshold): a short unfiltered read stays with
    pyarrow and never imports polars, with or without a remembered choice."""
    from test_real_files import run_isolated
    out = run_isolated(f"""
        import json, sys, threading
        import arrowload as al
        from arrowload.scan import units
        units.POLARS_BYTES = 0                 # the filtered threshold: met by any lake
        units.POLARS_PLAIN_BYTES = {plain_bytes}
        plan = al.dataset({lake!r}).select("x", "y").optimized_plan()
        reader = units.UnitReader(plan, al.Options(), cache_dir={str(tmp_path)!r})
        rows = sum(reader.read(i).num_rows for i in range(reader.num_units))
        for t in threading.enumerate():
            if t.name == "arrowload-import-polars":
                t.join()
        print(json.dumps({{"rows": rows, "polars": "polars" in sys.modules,
                          "decoded": sorted(reader.decoded_counts()), "units": reader.num_units}}))
    """)
    assert out["rows"] == pq.read_table(lake).num_rows
    if plain_bytes:
        assert out["polars"] is False and out["decoded"] == ["pyarrow"]
    else:  # past the threshold: polars is a candidate, imported and measured
        assert out["polars"] is True


# ---------------------------------------------------------------------------
# a remembered choice is checked early in every process (choose.py: the early check)


def _run(c, costs, picks):
    """``picks`` reads through chooser ``c`` whose candidates truly cost ``costs``; the picks."""
    seen = []
    for _ in range(picks):
        name, measure = c.pick()
        seen.append((name, measure))
        c.done(name, costs[name] if measure else None, 1, measured=measure)
    return seen


def test_a_remembered_choice_is_checked_within_the_first_reads():
    c = Chooser(["a", "b"], warmup=1, trials=3, recheck=32)
    c.remember({"a": 1.0, "b": 2e-9}, measured=6)  # "a" remembered absurdly dear: "b" chosen
    assert c.chosen == "b"
    seen = _run(c, {"a": 1e-9, "b": 2e-9}, 6)
    # "a": its warm-up (unmeasured), then one measured read; the chosen "b" is measured once too
    assert seen[:2] == [("a", False), ("a", True)] and ("b", True) in seen[2:4]
    assert c.chosen == "a" and c.costs() == {"a": 1e-9, "b": 2e-9}  # the fresh ones replaced the memory
    assert c.fresh() == {"a": 1, "b": 1}
    # and no more measurements until the RECHECK-th read
    seen = _run(c, {"a": 1e-9, "b": 2e-9}, 20)
    assert not any(m for _, m in seen) and c.fresh() == {"a": 1, "b": 1}


def test_a_remembered_choice_too_cheap_is_checked_too():
    """The lie the other way round: the chosen candidate's own remembered cost is wrong."""
    c = Chooser(["a", "b"], warmup=1, trials=3, recheck=32)
    c.remember({"a": 2e-9, "b": 1e-12})
    assert c.chosen == "b"
    _run(c, {"a": 2e-9, "b": 5e-9}, 8)
    assert c.chosen == "a" and c.costs()["b"] == 5e-9 and c.fresh() == {"a": 1, "b": 1}


def test_a_truthful_memory_costs_one_measured_read_per_candidate():
    c = Chooser(["a", "b", "c"], warmup=1, trials=3, recheck=32)
    c.remember({"a": 1e-9, "b": 2e-9, "c": 3e-9})
    seen = _run(c, {"a": 1e-9, "b": 2e-9, "c": 3e-9}, 31)
    assert c.fresh() == {"a": 1, "b": 1, "c": 1} and sum(m for _, m in seen) == 3
    # the non-chosen ones read twice each (a warm-up and the measured read), no trials
    assert sum(n == "b" for n, _ in seen) == 2 and sum(n == "c" for n, _ in seen) == 2
    assert c.chosen == "a"
    assert seen.index(("c", True)) < 2 * 3 + 1  # within the first ~2 x candidates picks


def test_fresh_costs_combine_with_the_remembered_one_as_one_sample():
    c = Chooser(["a", "b"], warmup=0, trials=3, recheck=2)
    c.remember({"a": 10.0, "b": 1.0})
    samples = iter([1.0, 3.0, 2.0, 4.0, 5.0])
    for _ in range(40):
        name, measure = c.pick()
        got = next(samples, None) if measure and name == "a" else None
        c.done(name, got if measure and name == "a" else (1.0 if measure else None), 1, measured=measure)
        if got is None:
            continue
        a = c.costs()["a"]
        if got == 1.0:
            assert a == 1.0  # against one fresh sample the remembered one gives way
        elif got == 3.0:
            assert a == 3.0  # median of 10 (remembered), 1, 3
        elif got == 2.0:
            assert a == 2.5  # median of 10, 1, 3, 2
        elif got == 4.0:
            assert a == 2.5  # KEEP (4) pushed the remembered 10 out: median of 1, 3, 2, 4
        elif got == 5.0:
            assert a == 3.5


def test_a_void_check_is_tried_again_and_a_read_by_another_decoder_is_no_warm_up():
    c = Chooser(["a", "b"], warmup=1, trials=3, recheck=64)
    c.remember({"a": 2.0, "b": 1.0})
    name, measure = c.pick()
    assert (name, measure) == ("a", False)
    c.done("a", None, 1, ran=False)  # another decoder read it (e.g. "a" was still importing)
    assert c.pick() == ("a", False)  # the warm-up again
    c.done("a", None, 1)
    tries = []
    for _ in range(10):
        name, measure = c.pick()
        if name == "a" and measure:
            tries.append(name)
        c.done(name, None, 1, measured=measure)  # every measurement void
    assert len(tries) == 3  # CHECKS tries, then it gives up for this process
    assert c.chosen == "b" and c.fresh() == {"a": 0, "b": 0}


@pytest.fixture
def small_lake(tmp_path):
    """One file of 24 row groups: fewer units than RECHECK, so only the early check measures."""
    rng = np.random.default_rng(1)
    path = str(tmp_path / "small")
    os.makedirs(path)
    pq.write_table(pa.table({"x": rng.random(24_000), "y": rng.random(24_000)}),
                   os.path.join(path, "part-0.parquet"), row_group_size=1000)
    return path


def _plant(cache, plan, chosen, costs):
    """Write a decoder_choice document for ``plan``'s situation holding ``costs``."""
    reader = UnitReader(plan, al.Options(), cache_dir=cache)
    key, situation = reader._memory_key, reader._situation
    reader.close()
    memory.save(cache, key, situation, chosen, costs, 6)
    return memory.path_for(cache, key)


@pytest.mark.parametrize("liar, other", [("pyarrow", "polars"), ("polars", "pyarrow")])
def test_a_lying_memory_is_measured_and_corrected_in_one_short_run(small_lake, tmp_path, liar, other):
    import polars  # noqa: F401 - imported: polars is a candidate from the first read
    cache = str(tmp_path / "cache")
    plan = al.dataset(small_lake).select("x", "y").optimized_plan()
    path = _plant(cache, plan, other, {liar: 1.0, other: 1e-9})  # ``liar`` absurdly dear
    reader = UnitReader(plan, al.Options(), cache_dir=cache)
    assert reader.decoder == other and reader.describe()["started_from_remembered"]
    truth = pq.read_table(small_lake)
    assert _read_all(reader).equals(truth.select(["x", "y"]))
    described = reader.describe()
    reader.close()
    assert described["measured_in_process"] == {"pyarrow": 1, "polars": 1}
    assert reader.decoded_counts()[liar] >= 2  # its warm-up and its measured read
    with open(path) as f:
        doc = json.load(f)
    _schema_validator().validate(doc)
    # the document holds this process's measurements, plausible ones, not the lie
    assert doc["costs"] == pytest.approx(described["cpu_per_byte"])
    assert 0 < doc["costs"][liar] < 1e-3 and doc["costs"][other] != 1e-9
    assert doc["chosen"] == described["decoder"] and doc["measured"] == 6 + 2


def test_a_truthful_memory_costs_no_trials(small_lake, tmp_path):
    """From a memory the first reader wrote: one measured read per candidate, not trials."""
    import polars  # noqa: F401
    cache = str(tmp_path / "cache")
    plan = al.dataset(small_lake).select("x", "y").optimized_plan()
    first = UnitReader(plan, al.Options(), cache_dir=cache)
    _read_all(first)
    first.close()
    fresh = first.describe()["measured_in_process"]
    assert sum(fresh.values()) >= 2 * len(fresh)  # trials (about TRIALS each) without a memory
    second = UnitReader(plan, al.Options(), cache_dir=cache)
    assert second.decoder is not None
    _read_all(second)
    second.close()
    assert second.describe()["measured_in_process"] == {"pyarrow": 1, "polars": 1}


def test_a_loader_epoch_corrects_a_lying_memory(small_lake, tmp_path, monkeypatch):
    """Through the loader (per-unit reads: the polars stream off): pyarrow remembered
    absurdly dear is read and measured in the epoch, and the document holds what it cost."""
    import polars  # noqa: F401
    monkeypatch.setenv("ARROWLOAD_STREAM", "0")
    cache = str(tmp_path / "cache")
    ds = al.dataset(small_lake).select("x", "y")
    path = _plant(cache, ds.optimized_plan(), "polars", {"pyarrow": 1.0, "polars": 1e-9})
    with ds.loader(1000, cache_dir=cache) as ld:
        rows = sum(len(b["x"]) for b in ld)
        decoders = ld.stats().decoders
    assert rows == 24_000 and decoders.get("pyarrow", 0) >= 2 and decoders.get("polars", 0) >= 1
    with open(path) as f:
        assert 0 < json.load(f)["costs"]["pyarrow"] < 1e-3
