"""Loader arguments checked when the loader is built, and loader states checked field by
field when loaded.

Truths: the batches of an uninterrupted epoch, taken by a separate loader (a valid state
resumes exactly their rest), and the error classes / builtins the README promises.
Tampered states are generated with hypothesis from real ones.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import arrowload as al
from arrowload.datagen import write_lake
from _support import per_rank_state, state_after

KINDS = ("none", "block", "global")


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("state_lake") / "lake"
    write_lake(path, rows=1_201, shards=3, row_group_size=100, features=2, emb_dim=4)
    return str(path)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("state_cache"))


def ids(loader) -> list[list[int]]:
    return [b["id"].tolist() for b in loader]


# ---------------------------------------------------------------------------
# arguments, at build time

TABLE = pa.table({"id": np.arange(100, dtype=np.int64), "x": np.ones(100, np.float32)})

BAD_ARGUMENTS = [  # (keyword arguments, builtin, argument named)
    (dict(batch_size=0), ValueError, "batch_size"),
    (dict(batch_size=-1), ValueError, "batch_size"),
    (dict(batch_size=2.5), TypeError, "batch_size"),
    (dict(batch_size=True), TypeError, "batch_size"),
    (dict(batch_size="64"), TypeError, "batch_size"),
    (dict(rank=2, world_size=2), ValueError, "rank"),
    (dict(rank=-1, world_size=2), ValueError, "rank"),
    (dict(rank=0.0, world_size=2), TypeError, "rank"),
    (dict(rank=0, world_size=0), ValueError, "world_size"),
    (dict(world_size=True, rank=0), TypeError, "world_size"),
    (dict(shuffle="random"), ValueError, "shuffle"),
    (dict(shuffle=1), TypeError, "shuffle"),
    (dict(seed=-1), ValueError, "seed"),
    (dict(seed=1.5), TypeError, "seed"),
    (dict(seed=1 << 64), ValueError, "seed"),
    (dict(drop_last="yes"), TypeError, "drop_last"),
    (dict(prefetch=0), ValueError, "prefetch"),
    (dict(prefetch=1.5e9), TypeError, "prefetch"),
    (dict(io_threads=0), ValueError, "io_threads"),
    (dict(io_threads="4"), TypeError, "io_threads"),
    (dict(shuffle="block", shuffle_window=0), ValueError, "shuffle_window"),
    (dict(memory_budget=-1), ValueError, "memory_budget"),
    (dict(memory_budget=2.0), TypeError, "memory_budget"),
    (dict(pad_lists=True, pad_to=-3), ValueError, "pad_to"),
    (dict(pad_lists=True, pad_to=8.0), TypeError, "pad_to"),
    (dict(output="tensorflow"), ValueError, "output"),
    (dict(output=None), TypeError, "output"),
    (dict(output="numpy", device="cuda"), ValueError, "device"),
    (dict(output="torch", device="not-a-device"), ValueError, "device"),
    (dict(transform=42), TypeError, "transform"),
    (dict(pad_lists=3), TypeError, "pad_lists"),
    (dict(pad_lists=True, pad_value="x"), TypeError, "pad_value"),
    (dict(fill_null=0.0), TypeError, "fill_null"),
    (dict(cache_dir=3), TypeError, "cache_dir"),
    (dict(stack=["x"]), TypeError, "stack"),
    (dict(stack={"v": []}), ValueError, "stack"),
    (dict(stack={"v": ["x", 1]}), TypeError, "stack"),
]


@pytest.mark.parametrize("kwargs,builtin,argument", BAD_ARGUMENTS,
                         ids=[",".join(f"{k}={v!r}" for k, v in a.items()) for a, _, _ in BAD_ARGUMENTS])
def test_bad_loader_arguments_fail_at_build_with_a_typed_error(kwargs, builtin, argument):
    ds = al.dataset(TABLE)
    kwargs = dict(kwargs)
    batch_size = kwargs.pop("batch_size", 10)
    with pytest.raises(al.ArrowloadError) as info:
        ds.loader(batch_size, **kwargs)  # building, not iterating
    err = info.value
    assert isinstance(err, builtin), (type(err).__mro__, builtin)
    assert argument in str(err), str(err)


@pytest.mark.parametrize("batch_size", [np.int64(16), np.int32(16), np.uint16(16), 16])
def test_numpy_integers_are_integers(batch_size):
    loader = al.dataset(TABLE).loader(batch_size, seed=np.int64(3), rank=np.int64(1),
                                      world_size=np.int64(2), prefetch=np.int64(1 << 20),
                                      shuffle="global", drop_last=np.bool_(True))
    assert len(loader) == 50 // 16 and type(loader.options.batch_size) is int
    got = np.concatenate([b["id"] for b in loader])
    assert len(got) == 48 and len(set(got.tolist())) == 48


def test_shuffle_is_one_vocabulary():
    """The loader, the order layer, the state and the CLI spell shuffle kinds one way."""
    from arrowload.cli import build_parser
    from arrowload.order import KINDS as ORDER_KINDS, SHUFFLE_CHOICES, ShuffleKind
    ds = al.dataset(TABLE)
    for value in SHUFFLE_CHOICES + (True, False, ShuffleKind.BLOCK):
        loader = ds.loader(10, shuffle=value)
        assert loader.shuffle_kind in ORDER_KINDS
        assert loader.state_dict()["shuffle"] == loader.shuffle_kind
    assert {ds.loader(10, shuffle=k).shuffle_kind for k in ORDER_KINDS} == set(ORDER_KINDS)
    parser = build_parser()
    choices = {a.dest: a.choices for p in parser._subparsers._group_actions[0].choices.values()
               for a in p._actions if a.dest == "shuffle"}
    assert tuple(choices["shuffle"]) == SHUFFLE_CHOICES


def test_rank_from_a_bad_environment_is_a_typed_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "two")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(al.InvalidArgumentError, match="WORLD_SIZE"):
        al.dataset(TABLE).loader(10)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(al.InvalidArgumentError, match="RANK / WORLD_SIZE"):
        al.dataset(TABLE).loader(10)
    # one without the other read as rank 0 (WORLD_SIZE alone: every process the same rows)
    # or as the only process (RANK alone)
    monkeypatch.delenv("RANK")
    with pytest.raises(al.InvalidArgumentError, match="not RANK"):
        al.dataset(TABLE).loader(10)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(al.InvalidArgumentError, match="not WORLD_SIZE"):
        al.dataset(TABLE).loader(10)
    assert al.dataset(TABLE).loader(10, rank=1, world_size=2).rank == 1  # given: the environment is not asked


def test_set_epoch_checks_its_argument():
    loader = al.dataset(TABLE).loader(10)
    for bad, builtin in ((-1, ValueError), (1.0, TypeError), (True, TypeError)):
        with pytest.raises(al.ArrowloadError) as info:
            loader.set_epoch(bad)
        assert isinstance(info.value, builtin) and "epoch" in str(info.value)
    loader.set_epoch(np.int64(2))
    assert loader.epoch == 2


# ---------------------------------------------------------------------------
# states, field by field


def _build(lake, cache, kind="global", rank=1, world=2, bs=64, drop_last=False):
    return al.dataset(lake).filter("label = 0 OR f0 > 0.5").select("id", "f0").loader(
        bs, shuffle=kind, seed=5, rank=rank, world_size=world, drop_last=drop_last, cache_dir=cache)


def test_a_negative_position_never_reaches_another_ranks_rows(lake, cache):
    state = state_after(_build(lake, cache), 2)
    for position in (-100, -64, -1):
        with pytest.raises(al.StateMismatchError, match="position"):
            _build(lake, cache).load_state_dict(dict(state, position=position, batches=0))


def test_a_position_past_the_end_is_refused_not_an_empty_epoch(lake, cache):
    loader = _build(lake, cache)
    start, stop = loader._rank_rows()
    state = state_after(loader, 1)
    for position in (stop - start + 1, stop - start + 64, 10 ** 9):
        with pytest.raises(al.StateMismatchError, match="position") as info:
            _build(lake, cache).load_state_dict(dict(state, position=position, batches=-(-position // 64)))
        assert f"rows 0..{stop - start}" in str(info.value)


@pytest.mark.parametrize("field,value", [
    ("position", "abc"), ("position", 64.0), ("position", True), ("position", None),
    ("epoch", "0"), ("epoch", False), ("batches", 1.0), ("seed", "5"), ("world_size", 2.0),
    ("segments", {}), ("segments", [{"world_size": 2}]), ("segments", [{"world_size": 2, "position": "0"}]),
    ("batch_size", "64"), ("drop_last", 0), ("num_rows", None), ("window", "8"),
    ("snapshot", 1), ("plan", None), ("shuffle", True),
])
def test_a_field_of_the_wrong_type_is_named(lake, cache, field, value):
    state = state_after(_build(lake, cache), 1)
    with pytest.raises(al.StateMismatchError) as info:
        _build(lake, cache).load_state_dict(dict(state, **{field: value}))
    assert str(info.value).startswith(f"{field}:"), str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_and_missing_fields_are_named(lake, cache):
    state = state_after(_build(lake, cache), 1)
    with pytest.raises(al.StateMismatchError, match="'cursor'"):
        _build(lake, cache).load_state_dict(dict(state, cursor=3))
    for field in ("batches", "window", "num_rows"):
        partial = {k: v for k, v in state.items() if k != field}
        with pytest.raises(al.StateMismatchError, match=f"'{field}' missing"):
            _build(lake, cache).load_state_dict(partial)


def test_differences_are_said_in_words(lake, cache):
    state = state_after(_build(lake, cache), 1)
    old = per_rank_state(state, 3, 1)  # what arrowload wrote before states were global
    for words, loader in {
        "world_size: the state was taken at world_size 2, this loader has world_size 3":
            _build(lake, cache, world=3),
        "rank: the state belongs to rank 1, this loader is rank 0": _build(lake, cache, rank=0),
    }.items():
        with pytest.raises(al.StateMismatchError) as info:
            loader.load_state_dict(old)
        assert words in str(info.value), str(info.value)
        loader.load_state_dict(state)  # the global state loads there (elastic)
    cases = {
        "shuffle: the state was taken with shuffle 'global', this loader shuffles 'block'":
            _build(lake, cache, kind="block"),
        "batch_size: the state was taken at batch_size 64, this loader has batch_size 32":
            _build(lake, cache, bs=32),
    }
    for words, loader in cases.items():
        with pytest.raises(al.StateMismatchError) as info:
            loader.load_state_dict(state)
        assert words in str(info.value), str(info.value)
    with pytest.raises(al.StateMismatchError, match="epoch: -1 is negative"):
        _build(lake, cache).load_state_dict(dict(state, epoch=-1))


def test_batches_count_rounds_up_as_the_spec_says(lake, cache):
    loader = _build(lake, cache, kind="none")
    start, stop = loader._rank_rows()
    rows = stop - start
    assert rows % 64, "the test needs a short last batch"
    full = ids(loader)
    end = loader.state_dict()
    assert end["position"] == rows and end["batches"] == len(full) == -(-rows // 64)
    fresh = _build(lake, cache, kind="none")
    fresh.load_state_dict(end)
    assert ids(fresh) == []  # the epoch is done: nothing more
    assert fresh.state_dict()["batches"] == -(-rows // 64)
    with pytest.raises(al.StateMismatchError, match="batches"):
        _build(lake, cache, kind="none").load_state_dict(dict(end, batches=rows // 64))


# hypothesis: any valid state resumes exactly; any tampered one is refused


def _tampered(draw, state: dict, rank_rows: int) -> tuple[dict, str]:
    bs = state["batch_size"]
    how = draw(st.sampled_from(["position_out", "position_off", "batches", "type", "epoch", "extra",
                                "missing", "segments", "identity"]))
    bad = dict(state)
    if how == "position_out":
        p = draw(st.one_of(st.integers(-10 ** 6, -1), st.integers(rank_rows + 1, rank_rows + 10 ** 6)))
        bad.update(position=p, batches=max(0, -(-p // bs)))
        return bad, "position"
    if how == "position_off":
        p = draw(st.integers(1, max(1, rank_rows - 1)).filter(lambda p: p % bs and p != rank_rows))
        bad.update(position=p, batches=-(-p // bs))
        return bad, "position"
    if how == "batches":
        bad["batches"] = draw(st.integers(-5, 10 ** 4).filter(lambda b: b != state["batches"]))
        return bad, "batches"
    if how == "type":
        field = draw(st.sampled_from(["position", "epoch", "batches", "seed", "num_rows"]))
        bad[field] = draw(st.sampled_from([str(state[field]), float(state[field]), None, True, [1]]))
        return bad, field
    if how == "epoch":
        bad["epoch"] = draw(st.integers(-10 ** 6, -1))
        return bad, "epoch"
    if how == "extra":
        bad[draw(st.sampled_from(["cursor", "rng", "Position"]))] = 0
        return bad, "unknown field"
    if how == "missing":
        field = draw(st.sampled_from(sorted(state)))
        del bad[field]
        return bad, field
    if how == "segments":  # an earlier segment its ranks cannot have reached together
        world = draw(st.integers(1, 4))
        lane = state["num_rows"] // world
        p = draw(st.one_of(st.integers(lane + 1, lane + 10 ** 4), st.integers(-100, -1),
                           st.integers(1, max(1, lane - 1)).filter(lambda p: p % bs)))
        bad["segments"] = [{"world_size": world, "position": p}]
        return bad, "segments"
    field = draw(st.sampled_from(["seed", "num_rows", "batch_size"]))
    bad[field] = state[field] + draw(st.integers(1, 3))
    return bad, field


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), world=st.integers(1, 3), bs=st.integers(7, 200),
       drop_last=st.booleans(), data=st.data())
def test_valid_states_resume_exactly_and_tampered_ones_are_refused(lake, cache, kind, world, bs,
                                                                    drop_last, data):
    rank = data.draw(st.integers(0, world - 1), label="rank")

    def build():
        return _build(lake, cache, kind=kind, rank=rank, world=world, bs=bs, drop_last=drop_last)

    full = ids(build())
    k = data.draw(st.integers(0, len(full)), label="k")
    state = state_after(build(), k)
    fresh = build()
    fresh.load_state_dict(state)
    assert ids(fresh) == full[k:]
    start, stop = fresh._rank_rows()
    bad, named = _tampered(data.draw, state, stop - start)
    target = build()
    with pytest.raises(al.StateMismatchError) as info:
        target.load_state_dict(bad)
    assert named in str(info.value), (named, str(info.value))
    assert ids(target) == full  # a refused state leaves the loader at the start of its epoch


# ---------------------------------------------------------------------------
# path spelling


def test_a_state_loads_whatever_the_lake_path_spelling(lake, cache, monkeypatch, tmp_path):
    parent, name = os.path.split(lake)
    monkeypatch.chdir(parent)

    def build(path):
        return al.dataset(path).filter("label = 0").select("id", "f0").loader(
            50, shuffle="global", seed=1, rank=1, world_size=2, cache_dir=cache)

    full = ids(build(name + "/"))
    state = state_after(build(name + "/"), 3)
    for spelling in (lake, lake + "/", parent + "//" + name + "/", "./" + name, "file://" + lake):
        fresh = build(spelling)
        fresh.load_state_dict(state)
        assert ids(fresh) == full[3:], spelling
    # a copy elsewhere is other files: the snapshot is the files, so the state is refused
    copy = tmp_path / "copy"
    shutil.copytree(lake, copy)
    with pytest.raises(al.StateMismatchError, match="snapshot: the data is not"):
        build(str(copy)).load_state_dict(state)


@pytest.mark.parametrize("shuffle", [False, "block", "global"])
def test_a_state_resumes_after_appended_files_add_a_numeric_column(tmp_path, shuffle):
    """Files appended after a state was taken add a numeric column: a loader over the folder
    needs fill_null for it (the old rows have none), and loading the state then raised
    ColumnNotFoundError from that fill_null (the state's files lack the column). The fill
    is left out while the loader reads the state's snapshot. Truth: the uninterrupted
    epoch over the original files."""
    import pyarrow.parquet as pq
    lake = tmp_path / "lake"
    lake.mkdir()
    pq.write_table(pa.table({"id": np.arange(300), "v": np.arange(300) % 5}), str(lake / "a.parquet"),
                   row_group_size=50)
    kw = dict(shuffle=shuffle, seed=3, cache_dir=str(tmp_path / "cache"))
    whole = [int(i) for b in al.dataset(str(lake)).loader(32, **kw) for i in b["id"]]
    loader = al.dataset(str(lake)).loader(32, **kw)
    it = iter(loader)
    seen = [int(i) for _ in range(2) for i in next(it)["id"]]
    state = loader.state_dict()
    loader.close()
    pq.write_table(pa.table({"id": np.arange(1000, 1010), "v": np.arange(10) % 5, "w": np.arange(10.0)}),
                   str(lake / "b.parquet"))
    later = al.dataset(str(lake)).loader(32, fill_null={"w": 0.0}, **kw)
    later.load_state_dict(state)
    rest = [int(i) for b in later for i in b["id"]]
    assert seen + rest == whole
    # a name the state's data cannot give is a state mismatch, not a KeyError
    stacked = al.dataset(str(lake)).loader(32, fill_null={"w": 0.0}, stack={"x": ["v", "w"]}, **kw)
    with pytest.raises(al.StateMismatchError, match="added since"):
        stacked.load_state_dict(state)
    assert sum(len(b["x"]) for b in stacked) == 310  # it still reads its own data
