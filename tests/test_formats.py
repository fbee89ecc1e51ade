"""The on-disk formats under ``formats/``: every golden example validates against its JSON
Schema, every ``invalid/`` document does not, and what the code actually writes (loader
states, selection indexes, random-access cache manifests) validates too. Damaged or
foreign cache documents are rebuilt, never trusted.
"""

from __future__ import annotations

import glob
import json
import os
import re

import jsonschema
import numpy as np
import pyarrow as pa
import pytest

import arrowload as al
from arrowload.datagen import write_lake

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
        {"loader_state", "selection_index", "ra_cache"}
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
    check = validator("loader_state")
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
