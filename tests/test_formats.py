"""The on-disk formats under ``formats/``: every golden example validates against its JSON
Schema, every ``invalid/`` document does not, and what the code actually writes (loader
states, selection indexes, random-access cache manifests) validates too. Damaged or
foreign cache documents are rebuilt, never trusted.

The golden documents are also fed to the code that reads them: loader-state examples to
``load_state_dict`` of a loader built as the spec's recipe says (and they resume the rest
of the epoch), cache documents to their readers, plan-fingerprint vectors to
``plan_fingerprint``; every invalid document is refused by its reader with a typed error.
"""

from __future__ import annotations

import glob
import json
import os
import re

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.dataset  # noqa: F401 - pa.dataset
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import arrowload as al
from arrowload.datagen import write_lake
from arrowload.order import ORDER_SINCE, ORDER_VERSION

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "formats")
VERSION_DIRS = sorted(glob.glob(os.path.join(ROOT, "*", "v*")))


def _rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def _docs(kind: str) -> list[str]:
    return sorted(p for d in VERSION_DIRS for p in glob.glob(os.path.join(d, kind, "*.json")))


def validator(name: str, version: int = 1) -> jsonschema.protocols.Validator:
    with open(os.path.join(ROOT, name, f"v{version}", "schema.json")) as f:
        schema = json.load(f)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _validator_for(path: str):
    version_dir = os.path.dirname(os.path.dirname(path))
    name = os.path.basename(os.path.dirname(version_dir))
    return validator(name, int(os.path.basename(version_dir)[1:]))


def test_every_format_is_complete():
    assert {os.path.basename(os.path.dirname(d)) for d in VERSION_DIRS} >= \
        {"loader_state", "selection_index", "ra_cache", "plan_cache", "plan_cache_lock", "snapshot_manifest"}
    for d in VERSION_DIRS:
        name, version = os.path.basename(os.path.dirname(d)), os.path.basename(d)
        assert re.fullmatch(r"v\d+", version)
        for part in ("spec.md", "schema.json"):
            assert os.path.isfile(os.path.join(d, part)), f"{_rel(d)} lacks {part}"
        assert glob.glob(os.path.join(d, "examples", "*.json")), f"{_rel(d)} has no examples"
        assert glob.glob(os.path.join(d, "invalid", "*.json")), f"{_rel(d)} has no invalid documents"
        with open(os.path.join(d, "schema.json")) as f:
            schema = json.load(f)
        assert schema["properties"]["format"] == {"const": f"arrowload.{name}"}
        assert schema["properties"]["version"] == {"const": int(version[1:])}
        assert {"format", "version"} <= set(schema["required"])


@pytest.mark.parametrize("path", _docs("examples"), ids=_rel)
def test_examples_validate(path):
    with open(path) as f:
        doc = json.load(f)
    _validator_for(path).validate(doc)


@pytest.mark.parametrize("path", _docs("invalid"), ids=_rel)
def test_invalid_documents_fail(path):
    with open(path) as f:
        doc = json.load(f)
    errors = list(_validator_for(path).iter_errors(doc))
    assert errors, f"{_rel(path)} validates but is meant not to"


# ---------------------------------------------------------------------------
# what the code writes


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("formats_lake")
    write_lake(path, rows=3_001, shards=3, row_group_size=400, features=2, emb_dim=4)
    return str(path)


def _ds(lake: str, pred: str = "label = 0") -> al.Dataset:
    return al.dataset(lake).filter(pred).select("id", "f0")


@pytest.mark.parametrize("kind", ["none", "block", "global"])
def test_loader_states_validate(lake, tmp_path, kind):
    check = validator("loader_state", 4)  # what state_dict() writes: version 4
    loader = _ds(lake).loader(100, shuffle=kind, rank=1, world_size=2, drop_last=kind == "block",
                              cache_dir=str(tmp_path))
    states = [loader.state_dict()]
    it = iter(loader)
    for _ in range(3):
        next(it)
    states.append(loader.state_dict())
    states.extend(loader.state_dict() for _ in it)  # ... through the end of the epoch
    loader.set_epoch(4)
    states.append(loader.state_dict())
    for state in states:
        doc = json.loads(json.dumps(state))
        check.validate(doc)
        assert doc["shuffle"] == kind and (doc["window"] is None) == (kind != "block")
    assert states[-2]["position"] == loader._rank_rows()[1] - loader._rank_rows()[0]


def test_selection_index_validates_and_damage_is_rebuilt(lake, tmp_path):
    cache = str(tmp_path / "cache")
    check = validator("selection_index")
    truth = _ds(lake).count()
    assert _ds(lake).loader(64, cache_dir=cache).num_rows == truth
    (path,) = glob.glob(os.path.join(cache, "selection-*.json"))
    with open(path) as f:
        doc = json.load(f)
    check.validate(doc)
    assert sum(doc["counts"]) == truth and len(doc["counts"]) == len(doc["units"])
    damaged = {
        "other version": dict(doc, version=2, counts=[0] * len(doc["counts"])),
        "other snapshot": dict(doc, snapshot="0" * 32, counts=[0] * len(doc["counts"])),
        "short counts": dict(doc, counts=doc["counts"][:-1]),
        "negative counts": dict(doc, counts=[-1] * len(doc["counts"])),
        "truncated": None,
    }
    for what, bad in damaged.items():
        with open(path, "w") as f:
            f.write(json.dumps(doc)[:40] if bad is None else json.dumps(bad))
        assert _ds(lake).loader(64, cache_dir=cache).num_rows == truth, what
        with open(path) as f:
            check.validate(json.load(f))  # rewritten whole


def test_ra_cache_manifest_validates_and_damage_is_rebuilt(lake, tmp_path):
    cache = str(tmp_path / "cache")
    check = validator("ra_cache")

    def ids(loader):
        return np.concatenate([b["id"] for b in loader])

    reference = ids(_ds(lake).loader(64, shuffle="global", seed=3, memory_budget=1, cache_dir=cache))
    (manifest,) = glob.glob(os.path.join(cache, "ra-*.json"))
    arrow = manifest[:-len(".json")] + ".arrow"
    with open(manifest) as f:
        doc = json.load(f)
    check.validate(doc)
    with pa.memory_map(arrow) as src:
        assert pa.ipc.open_file(src).read_all().num_rows == doc["num_rows"] == _ds(lake).count()
    for what, bad in {"other version": dict(doc, version=2), "other snapshot": dict(doc, snapshot="x"),
                      "wrong row count": dict(doc, num_rows=doc["num_rows"] + 1)}.items():
        with open(manifest, "w") as f:
            json.dump(bad, f)
        loader = _ds(lake).loader(64, shuffle="global", seed=3, memory_budget=1, cache_dir=cache)
        assert np.array_equal(ids(loader), reference), what
        with open(manifest) as f:
            rebuilt = json.load(f)
        check.validate(rebuilt)
        assert rebuilt == doc, what


# ---------------------------------------------------------------------------
# plan fingerprints: golden vectors (formats/plan_fingerprint/v1)

FINGERPRINT_TABLE = pa.schema([("id", pa.int64()), ("x", pa.float64()), ("s", pa.string()),
                               ("country", pa.string()), ("emb", pa.list_(pa.float32()))])


def fingerprint_steps(steps: list[dict]) -> al.Dataset:
    """The Dataset a plan_fingerprint vector's ``steps`` describe, over an empty table of
    ``FINGERPRINT_TABLE`` (the spec's recipe)."""
    ds = al.dataset(FINGERPRINT_TABLE.empty_table())
    for step in steps:
        if "filter" in step:
            ds = ds.filter(step["filter"])
        elif "select" in step or "as" in step:
            ds = ds.select(*step.get("select", ()), **step.get("as", {}))
        elif "limit" in step:
            ds = ds.limit(step["limit"])
        elif "map" in step:
            ds = ds.map(lambda b: b, columns=step.get("columns"), name=step["map"])
        elif "sql" in step:
            ds = al.sql(step["sql"], t=ds)
        else:  # pragma: no cover - the schema allows nothing else
            raise AssertionError(step)
    return ds


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "plan_fingerprint", "v1", "examples", "*.json"))),
                         ids=_rel)
def test_plan_fingerprint_golden_vectors(path):
    from arrowload.plan.fingerprint import plan_fingerprint
    with open(path) as f:
        doc = json.load(f)

    def digest(steps):
        return plan_fingerprint(fingerprint_steps(steps).plan, data=False)

    assert digest(doc["steps"]) == doc["digest"], "the fingerprint changed: a new format version?"
    for steps in doc.get("same_as", []):
        assert digest(steps) == doc["digest"], steps
    for steps in doc.get("differs_from", []):
        assert digest(steps) != doc["digest"], steps


def test_plan_fingerprint_is_stable_across_processes_and_hash_seeds():
    import subprocess
    import sys
    code = ("import sys, json; sys.path.insert(0, 'tests'); from test_formats import fingerprint_steps; "
            "from arrowload.plan.fingerprint import plan_fingerprint; "
            "print(plan_fingerprint(fingerprint_steps(json.loads(sys.argv[1])).plan, data=False))")
    steps = [{"filter": "x > 0.5 AND country IN ('US', 'DE')"}, {"select": ["id", "x"], "as": {"y": "x * 2"}}]
    root = os.path.dirname(ROOT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    outs = {subprocess.run([sys.executable, "-c", code, json.dumps(steps)], cwd=root, capture_output=True, text=True,
                           check=True, env=dict(env, PYTHONHASHSEED=seed)).stdout.strip() for seed in ("1", "2")}
    from arrowload.plan.fingerprint import plan_fingerprint
    assert outs == {plan_fingerprint(fingerprint_steps(steps).plan, data=False)}


def test_plan_fingerprint_with_data_follows_the_snapshot(lake, tmp_path):
    from arrowload.plan.fingerprint import plan_fingerprint
    import shutil
    a = plan_fingerprint(_ds(lake).plan)
    assert a == plan_fingerprint(_ds(lake + "/").plan) == plan_fingerprint(_ds(lake.replace("/", "//")).plan)
    copy = str(tmp_path / "copy")
    shutil.copytree(lake, copy)
    assert plan_fingerprint(_ds(copy).plan) != a  # other files
    assert plan_fingerprint(_ds(copy).plan, data=False) == plan_fingerprint(_ds(lake).plan, data=False)


@pytest.mark.parametrize("lib", ["arrow", "polars"])
def test_long_value_lists_of_pyarrow_and_polars_filters_name_their_plans(lake, tmp_path, lib):
    """pyarrow and polars print an ``is_in`` value set of more than 20 values as its first
    and last 10: two filters that differ only in the middle had one fingerprint, so a
    loader state taken over one loaded into a loader over the other. It is now refused
    there (and loads where the filter is the same); each epoch yields pyarrow's rows."""
    import pyarrow.compute as pc
    from arrowload.errors import StateMismatchError
    from arrowload.plan.fingerprint import plan_fingerprint
    a = list(range(0, 600, 20))
    b = list(a)
    b[15] = 7  # 30 values each, differing in the 16th
    if lib == "arrow":
        def make(vals): return pc.field("id").isin(vals)
    else:
        import polars as pl

        def make(vals): return pl.col("id").is_in(vals)

    def loader(vals):
        return al.dataset(lake).filter(make(vals)).select("id").loader(7, shuffle=True, seed=1,
                                                                        cache_dir=str(tmp_path))
    assert plan_fingerprint(loader(a)._dataset.plan) != plan_fingerprint(loader(b)._dataset.plan)
    with loader(a) as first:
        it = iter(first)
        next(it)
        state = first.state_dict()
    with pytest.raises(StateMismatchError):
        loader(b).load_state_dict(state)
    again = loader(a)
    again.load_state_dict(state)
    for ld, vals in ((again, a), (loader(b), b)):
        got = sorted(int(i) for batch in ld for i in np.asarray(batch["id"]))
        want = pa.dataset.dataset(lake).to_table(filter=pc.field("id").isin(vals)).column("id").to_pylist()
        assert set(got) <= set(want) and len(got) >= len(want) - 7
        ld.close()


# ---------------------------------------------------------------------------
# golden documents through the real readers


def _example_loader(doc: dict, rank: int | None = None, world_size: int | None = None):
    """The loader the loader_state spec's recipe builds for ``doc`` (version 4 documents
    name no rank: ``rank`` says which; ``world_size`` defaults to the document's)."""
    table = pa.table({"id": pa.array(np.arange(doc["num_rows"]), pa.int64())})
    return al.dataset(table).loader(doc["batch_size"], shuffle=doc["shuffle"], seed=doc["seed"],
                                    shuffle_window=doc["window"] or 8,
                                    rank=doc["rank"] if rank is None else rank,
                                    world_size=world_size or doc["world_size"], drop_last=doc["drop_last"])


def _replay(doc: dict) -> tuple[dict, list[int]]:
    """The v4 recipe: every segment of ``doc`` (then its current one) run on all its ranks
    from the state of the one before. The state (checked identical on every rank) and the
    ids every rank yielded."""
    state, seen = None, []
    for seg in doc["segments"] + [{"world_size": doc["world_size"], "position": doc["position"]}]:
        docs = []
        for rank in range(seg["world_size"]):
            loader = _example_loader(doc, rank, seg["world_size"])
            loader.set_epoch(doc["epoch"])
            if state is not None:
                loader.load_state_dict(state)
            it = iter(loader)
            for _ in range(-(-seg["position"] // doc["batch_size"])):
                seen.extend(next(it)["id"].tolist())
            it.close()
            docs.append(json.loads(json.dumps(loader.state_dict())))
        assert all(d == docs[0] for d in docs), "the state differs between ranks"
        state = docs[0]
    return state, seen


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "loader_state", "v*", "examples", "*.json"))),
                         ids=_rel)
def test_loader_state_examples_resume_the_rest_of_their_epoch(path):
    doc = _load(path)
    if doc["version"] >= 4:
        _check_global_example(doc)
        return
    reference = _example_loader(doc)
    reference.set_epoch(doc["epoch"])
    full = [b["id"] for b in reference]
    assert doc["batches"] == -(-doc["position"] // doc["batch_size"]) <= len(full)
    loader = _example_loader(doc)
    if doc.get("order", 1) < ORDER_SINCE[doc["shuffle"]] and 0 < doc["position"] < doc["num_rows"]:
        # its kind's order changed since the arrowload that wrote it: refused mid-epoch, and the
        # same document under this order version resumes
        with pytest.raises(al.StateMismatchError, match=rf"^order: .*{doc['shuffle']}.*changed in version"):
            loader.load_state_dict(doc)
        if doc["version"] == 1:  # it has no order field: every version 1 state is order 1
            return
        doc = dict(doc, order=ORDER_VERSION)
    loader.load_state_dict(doc)  # as written: golden snapshot and plan digests included
    rest = [b["id"] for b in loader]
    assert len(rest) == len(full) - doc["batches"]
    assert all(np.array_equal(a, b) for a, b in zip(rest, full[doc["batches"]:]))
    assert loader.state_dict()["batches"] == len(full)


def _check_global_example(doc: dict) -> None:
    """A version 4 document is what its recipe writes on every rank; loaded on every rank it
    resumes the rest of the uninterrupted epoch (no segments), and over the whole epoch the
    rows yielded are each selected row at most once, all but the last segment's remainder
    (< world_size) and drop_last tails (< batch_size per rank)."""
    state, seen = _replay(doc)
    assert state == doc
    world, bs = doc["world_size"], doc["batch_size"]
    rest = []
    for rank in range(world):
        loader = _example_loader(doc, rank)
        loader.load_state_dict(doc)
        got = [b["id"].tolist() for b in loader]
        rest.append(sum(got, []))
        if not doc["segments"]:
            reference = _example_loader(doc, rank)
            reference.set_epoch(doc["epoch"])
            full = [b["id"].tolist() for b in reference]
            assert got == full[doc["batches"]:]
    assert len({len(r) for r in rest}) == 1, "ranks resumed unequal shares"
    every = seen + sum(rest, [])
    assert len(every) == len(set(every)) and set(every) <= set(range(doc["num_rows"]))
    left_out = doc["num_rows"] - len(every)
    assert 0 <= left_out < world + (world * bs if doc["drop_last"] else 0)
    if not doc["drop_last"]:
        assert left_out < world


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "loader_state", "v*", "invalid", "*.json"))),
                         ids=_rel)
def test_invalid_loader_states_are_refused_by_load_state_dict(path):
    version_dir = os.path.dirname(os.path.dirname(path))
    loader = _example_loader(_load(os.path.join(version_dir, "examples", "block_start.json")), rank=0)
    with pytest.raises(al.StateMismatchError):
        loader.load_state_dict(_load(path))


def test_v1_block_states_are_refused_mid_epoch_only():
    """The block order changed in order versions 2 and 3: an older block state inside its
    epoch would resume into other rows, so it is refused naming ``order``; at the start or
    the end of an epoch it loads. Unshuffled states of any version load anywhere (the
    examples)."""
    doc = _load(os.path.join(ROOT, "loader_state", "v1", "examples", "block_start.json"))
    loader = _example_loader(doc)
    n = len(loader)
    for position, ok in ((0, True), (doc["batch_size"], False), (doc["num_rows"], True)):
        state = dict(doc, position=position, batches=-(-position // doc["batch_size"]))
        if ok:
            loader.load_state_dict(state)
            assert len(list(loader)) == (n if position == 0 else 0)
        else:
            with pytest.raises(al.StateMismatchError, match=r"^order: .*block.*changed in version 3"):
                loader.load_state_dict(state)
            with pytest.raises(al.StateMismatchError, match=r"^order: .*block.*changed in version 3"):
                loader.load_state_dict(dict(state, version=2, order=2))
    # the same position under version 3 resumes
    v3 = dict(doc, version=2, order=3, position=doc["batch_size"], batches=1)
    loader.load_state_dict(v3)
    assert len(list(loader)) == n - 1
    with pytest.raises(al.StateMismatchError, match=r"^order: .*newer"):
        loader.load_state_dict(dict(v3, order=4))


def _reader(path: str):
    from arrowload.pipeline import documents
    from arrowload.plancache import documents as plan_cache
    name = os.path.basename(os.path.dirname(os.path.dirname(os.path.dirname(path))))
    return {"selection_index": documents.read_selection_index, "ra_cache": documents.read_ra_manifest,
            "plan_cache": plan_cache.read_commit, "plan_cache_lock": plan_cache.read_lock}[name]


CACHE_DOCS = [p for name in ("selection_index", "ra_cache", "plan_cache", "plan_cache_lock")
              for p in sorted(glob.glob(os.path.join(ROOT, name, "v1", "*", "*.json")))]


@pytest.mark.parametrize("path", CACHE_DOCS, ids=_rel)
def test_cache_documents_through_their_readers(path):
    doc = _load(path)
    if os.path.basename(os.path.dirname(path)) == "examples":
        value = _reader(path)(doc, path)
        if hasattr(value, "to_doc"):  # plan cache documents: read, then written, give the same document
            assert value.to_doc() == doc
            return
        assert {k: getattr(value, k) for k in doc if k not in ("format", "version")} == \
            {k: tuple(v) if isinstance(v, list) else v for k, v in doc.items() if k not in ("format", "version")}
    else:
        with pytest.raises((al.CorruptFileError, al.UnsupportedError)) as info:
            _reader(path)(doc, path)
        assert path in str(info.value)
    bad_version = _reader(path)
    with pytest.raises(al.UnsupportedError, match="version 2"):
        bad_version(dict(doc, version=2), path)


def test_plan_cache_documents_written_validate(lake, tmp_path):
    """The commit and the writer's lock, as the code writes them, validate; the lock is read
    while the entry is written (from inside the map)."""
    root = str(tmp_path / "cache")
    locks = []

    def peek(batch):
        if batch.num_rows and not locks:
            locks.extend(_load(p) for p in glob.glob(os.path.join(root, "plans", "*", "writer.lock")))
        return batch

    al.dataset(lake).map(peek, name="peek-v1").cache(root).count()
    [commit] = glob.glob(os.path.join(root, "plans", "*", "commit.json"))
    validator("plan_cache").validate(_load(commit))
    assert len(locks) == 1
    validator("plan_cache_lock").validate(locks[0])
    assert locks[0]["key"] == _load(commit)["key"] == os.path.basename(os.path.dirname(commit))


MANIFEST_DOCS = sorted(glob.glob(os.path.join(ROOT, "snapshot_manifest", "v1", "*", "*.json")))


@pytest.mark.parametrize("path", MANIFEST_DOCS, ids=_rel)
def test_snapshot_manifests_through_their_reader(path):
    """Examples are read (their snapshot ids recomputed from their files: golden vectors of
    the digest); invalid ones are refused naming the manifest; a future version is refused
    saying which versions this arrowload reads."""
    from arrowload.source.snapshot import read_manifest
    doc = _load(path)
    if os.path.basename(os.path.dirname(path)) == "examples":
        assert read_manifest(doc, path) == doc
    else:
        with pytest.raises((al.CorruptFileError, al.UnsupportedError)) as info:
            read_manifest(doc, path)
        assert path in str(info.value)
    with pytest.raises(al.UnsupportedError, match=r"version 2 is not supported \(this arrowload reads version 1\)"):
        read_manifest(dict(doc, version=2), path)


def test_snapshot_manifest_written_validates_and_future_version_is_refused_when_opened(lake, tmp_path):
    import shutil
    copy = str(tmp_path / "lake")
    shutil.copytree(lake, copy)
    path = str(tmp_path / "snap.json")
    sid = al.dataset(copy).pin().save_manifest(path)
    doc = _load(path)
    validator("snapshot_manifest").validate(doc)
    assert doc["snapshot_id"] == sid == al.dataset(copy).snapshot_id
    assert list(doc)[:2] == ["format", "version"]  # the header comes first
    assert [f["path"] for f in doc["files"]] == sorted(n for n in os.listdir(copy) if n.endswith(".parquet"))
    assert doc["num_rows"] == sum(f["rows"] for f in doc["files"]) == pa.dataset.dataset(copy).count_rows()
    with open(path, "w") as f:
        json.dump(dict(doc, version=2), f)
    with pytest.raises(al.UnsupportedError, match="version 2 is not supported"):
        al.dataset(path)


# the fingerprint ignores SQL spelling (keyword / unquoted-name case, spaces, redundant
# parentheses) and follows every literal, column and operator


_COMPARE = st.sampled_from(["=", "<>", "<", "<=", ">", ">="])


@st.composite
def _predicate(draw):
    """(canonical text, the same with random spelling, a different predicate)."""
    n = draw(st.integers(1, 3))
    parts = [(draw(st.sampled_from(["id", "x"])), draw(_COMPARE), draw(st.integers(-50, 50))) for _ in range(n)]
    joins = [draw(st.sampled_from(["AND", "OR"])) for _ in range(n - 1)]

    def render(items, respell):
        out = []
        for i, (col, op, lit) in enumerate(items):
            if respell:
                col = "".join(c.upper() if draw(st.booleans()) else c for c in col)
                pad = draw(st.sampled_from(["", " ", "  "]))
                term = f"{col}{pad}{op}{pad}{lit}"
                term = f"({term})" if draw(st.booleans()) else term
            else:
                term = f"{col} {op} {lit}"
            if i:
                join = joins[i - 1]
                out.append(join.lower() if respell and draw(st.booleans()) else join)
            out.append(term)
        return " ".join(out)

    k = draw(st.integers(0, n - 1))
    col, op, lit = parts[k]
    changed = list(parts)
    changed[k] = (col, op, lit + draw(st.integers(1, 5)))
    return render(parts, False), render(parts, True), render(changed, False)


@settings(max_examples=60, deadline=None)
@given(_predicate())
def test_fingerprint_ignores_sql_spelling_and_follows_meaning(texts):
    from arrowload.plan.fingerprint import plan_fingerprint
    plain, respelled, changed = texts

    def digest(pred):
        return plan_fingerprint(fingerprint_steps([{"filter": pred}, {"select": ["id"]}]).plan, data=False)

    assert digest(plain) == digest(respelled), (plain, respelled)
    assert digest(plain) != digest(changed), (plain, changed)


# ---------------------------------------------------------------------------
# mixture states (formats/mixture_state/v1): the spec's recipe, the code's documents

MIX_EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "mixture_state", "v1", "examples", "*.json")))
MIX_INVALID = sorted(glob.glob(os.path.join(ROOT, "mixture_state", "v1", "invalid", "*.json")))


def _mix_recipe(stopping: str = "first_exhausted", seed: int = 0):
    ids = np.arange(3000)
    t = pa.table({"id": ids, "src": np.array(["a", "b", "c"])[(ids * 7) % 3]})
    ds = al.dataset(t)
    comps = {s: ds.filter(f"src = '{s}'").select("id", comp=f"'{s}'") for s in "abc"}
    return al.mix(comps, weights={"a": 0.5, "b": 0.3, "c": 0.2}, seed=seed, stopping=stopping)


def _mix_loader(doc: dict):
    """The loader the mixture_state spec's recipe builds for ``doc`` (world size 1)."""
    m = _mix_recipe(doc["stopping"], doc["seed"])
    shuffle = {"global": True, "block": "block", "none": False}[doc["components"][0]["shuffle"]]
    steps = None if doc["blocks"] is None or doc["stopping"] != "cycle" else doc["blocks"] // doc["world_size"]
    return m.loader(doc["batch_size"], shuffle=shuffle, steps=steps)


def _ids(loader) -> list[list[int]]:
    return [list(map(int, b["id"])) for b in loader]


@pytest.mark.parametrize("path", MIX_EXAMPLES, ids=_rel)
def test_mixture_state_examples_resume_the_rest_of_their_epoch(path):
    doc = _load(path)
    ld = _mix_loader(doc)
    ld.load_state_dict(doc)
    rest = _ids(ld)
    # the uninterrupted run at world size 1: the state's phases replayed, then its position
    full = _mix_loader(doc)
    full.set_epoch(doc["epoch"])
    start = {**doc, "position": 0, "drawn": [0] * len(doc["drawn"]), "phases": doc["phases"][:1]}
    start["blocks"] = doc["blocks"]
    if len(doc["phases"]) > 1:  # re-weighted: the state at the phase's start, loaded with its weights
        p = doc["phases"][1]
        first = _mix_loader(doc)
        first.set_epoch(doc["epoch"])
        it = iter(first)
        for _ in range(p["start"]):
            next(it)
        full.load_state_dict(first.state_dict(), weights=dict(zip("abc", p["weights"])))
        skip = doc["position"] - p["start"]
    else:
        skip = doc["position"]
    want = _ids(full)[skip:]
    assert rest == want[:len(rest)] and len(rest) == len(want)
    _validator_for(path).validate(ld.state_dict())


@pytest.mark.parametrize("path", MIX_INVALID, ids=_rel)
def test_invalid_mixture_states_are_refused_by_load_state_dict(path):
    doc = _load(path)
    ld = _mix_recipe().loader(50, shuffle=True)
    with pytest.raises(al.StateMismatchError):
        ld.load_state_dict(doc)


def test_mixture_states_written_validate():
    check = validator("mixture_state", 1)
    ld = _mix_recipe("all_exhausted").loader(30, shuffle=True)
    it = iter(ld)
    for _ in range(3):
        next(it)
    check.validate(ld.state_dict())
    ld.load_state_dict(ld.state_dict(), weights={"a": 1, "b": 1, "c": 2})
    check.validate(ld.state_dict())
