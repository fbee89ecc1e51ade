"""Ray: ``Dataset.to_ray()`` (a Ray Data datasource over arrowload's units) and
``loader(executor="ray")`` (maps and transforms as Ray tasks), checked against DuckDB,
plain pyarrow and the threaded loader; plus the Ray Train example on two CPU workers.

One local Ray session for the module (``ray.init(num_cpus=2)``, no dashboard, usage stats
off), every server of it on 127.0.0.1 only: conftest sets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
before Ray is imported, which makes the node address the loopback one (checked below, and
by the listening sockets: none on another address).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import arrowload as al
from arrowload.errors import ArgumentTypeError, InvalidArgumentError
from conftest import duck

ray = pytest.importorskip("ray")
from ray.data.expressions import col  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FILES, GROUPS, GROUP_ROWS = 4, 4, 250  # ids 0..3999 in source order, 16 row groups
ROWS = FILES * GROUPS * GROUP_ROWS


@pytest.fixture(scope="module")
def ray_session():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # the maps and transforms below are functions of this module, which Ray workers cannot
    # import by name: pickle them by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}, \
        "Ray must run on loopback only (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before importing ray)"
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("raylake")
    for f in range(FILES):
        lo = f * GROUPS * GROUP_ROWS
        ids = list(range(lo, lo + GROUPS * GROUP_ROWS))
        pq.write_table(pa.table({
            "id": pa.array(ids, pa.int64()),
            "label": pa.array([int(i % 3 == 0) for i in ids], pa.int8()),
            "x": pa.array([i * 0.5 for i in ids], pa.float64()),
            "text": [f"row {i} " * (1 + i % 4) for i in ids],
        }), root / f"part-{f}.parquet", row_group_size=GROUP_ROWS)
    return str(root)


def _duck(lake: str, where: str = "", columns: str = "*", order: str = "ORDER BY id"):
    return duck(f"SELECT {columns} FROM read_parquet('{lake}/*.parquet') {where} {order}")


def _boom(batch):
    if batch.num_rows:  # an empty batch (the output schema) passes
        raise LookupError("map ran")
    return batch


def _with_pid(batch):
    return batch.append_column("pid", pa.array([os.getpid()] * batch.num_rows, pa.int64()))


def _tokens(batch):  # a "CPU-heavy" map: token counts from the text column
    n = pc.list_value_length(pc.split_pattern(batch.column("text"), " "))
    return batch.append_column("tokens", n.cast(pa.int64()))


def _double(batch):
    return batch.append_column("x2", pc.multiply(batch.column("x"), 2.0))


# -- Dataset.to_ray() --------------------------------------------------------------------

def test_to_ray_rows_equal_arrowload_and_duckdb(ray_session, lake):
    ds = al.dataset(lake).filter("label = 1").select("id", "x", "text")
    rd = ds.to_ray(parallelism=3)
    got = pa.concat_tables(ray.get(rd.to_arrow_refs()))
    assert got.equals(ds.to_arrow())
    assert got.equals(_duck(lake, "WHERE label = 1", "id, x, text").cast(got.schema))
    rows = rd.take_all()
    assert [r["id"] for r in rows] == got.column("id").to_pylist()


def test_to_ray_map_runs_inside_the_read(ray_session, lake):
    ds = al.dataset(lake).filter("id % 7 = 0").map(_tokens, columns=["id", "text"])
    got = pa.concat_tables(ray.get(ds.to_ray().to_arrow_refs()))
    assert got.equals(ds.to_arrow())
    truth = _duck(lake, "WHERE id % 7 = 0", "id, text, len(string_split(text, ' ')) AS tokens")
    assert got.column("tokens").to_pylist() == truth.column("tokens").to_pylist()


def test_to_ray_count_is_metadata(ray_session, lake):
    ds = al.dataset(lake).filter("label = 1 AND id < 3000").map(_boom)  # reading any row raises
    rd = ds.to_ray()
    truth = _duck(lake, "WHERE label = 1 AND id < 3000", "id").num_rows
    assert rd.count() == truth
    with pytest.raises(LookupError, match="map ran"):  # the rows themselves do go through the map
        rd.take(1)


def test_to_ray_read_tasks_are_pruned_units(ray_session, lake):
    from arrowload.scaleout.datasource import ArrowloadDatasource
    every = ArrowloadDatasource(al.dataset(lake)).get_read_tasks(100)
    assert len(every) == FILES * GROUPS
    assert [t.metadata.num_rows for t in every] == [GROUP_ROWS] * (FILES * GROUPS)
    kept = ArrowloadDatasource(al.dataset(lake).filter("id >= 3600")).get_read_tasks(100)
    assert [t.metadata.num_rows for t in kept] == [150, 250]  # row groups 14 and 15 only
    assert all(list(t.metadata.input_files) == [os.path.join(lake, "part-3.parquet")] for t in kept)
    assert all(0 < t.metadata.size_bytes < every[0].metadata.size_bytes for t in kept[:1])
    grouped = ArrowloadDatasource(al.dataset(lake).filter("label = 1")).get_read_tasks(3)
    assert len(grouped) == 3
    assert sum(t.metadata.num_rows for t in grouped) == _duck(lake, "WHERE label = 1", "id").num_rows
    got = pa.concat_tables([b for t in grouped for b in t()])  # read in order, task after task
    assert got.column("id").to_pylist() == _duck(lake, "WHERE label = 1", "id").column("id").to_pylist()


def _read_op(rd):
    from ray.data._internal.logical.optimizers import LogicalOptimizer
    op = LogicalOptimizer().optimize(rd._logical_plan).dag
    while op.input_dependencies:
        op = op.input_dependencies[0]
    return op


def test_ray_pushdown_hooks_map_onto_the_plan(ray_session, lake):
    rd = al.dataset(lake).to_ray().filter(expr=(col("id") >= 3600) & (col("label") == 1)) \
        .select_columns(["x", "id"])
    source = _read_op(rd).datasource
    plan = source.dataset.optimized_plan()
    assert plan.schema.names == ["x", "id"]
    assert [t.metadata.num_rows for t in source.get_read_tasks(100)] == [50, 84]  # two row groups read
    got = pa.concat_tables(ray.get(rd.to_arrow_refs()))
    truth = _duck(lake, "WHERE id >= 3600 AND label = 1", "x, id")
    assert got.column_names == ["x", "id"]
    assert got.column("id").to_pylist() == truth.column("id").to_pylist()
    assert got.column("x").to_pylist() == truth.column("x").to_pylist()


def test_to_ray_arguments(lake):
    with pytest.raises(InvalidArgumentError, match="parallelism"):
        al.dataset(lake).to_ray(parallelism=0)
    with pytest.raises(ArgumentTypeError, match="parallelism"):
        al.dataset(lake).to_ray(parallelism="4")


def test_to_ray_sql_plan_reads_whole(ray_session, lake):
    ds = al.sql("SELECT label, count(*) AS n FROM t GROUP BY label ORDER BY label", t=al.dataset(lake))
    got = pa.concat_tables(ray.get(ds.to_ray().to_arrow_refs()))
    assert got.to_pylist() == _duck(lake, "GROUP BY label", "label, count(*) AS n", "ORDER BY label").to_pylist()


# -- loader(executor="ray") --------------------------------------------------------------

def _batches(loader, n=None):
    """The first ``n`` batches (all without ``n``), as lists; takes no batch more."""
    return [{k: v if isinstance(v, list) else v.tolist() for k, v in b.items()}
            for b in itertools.islice(loader, n)]


@pytest.mark.parametrize("shuffle", [False, "block", "global"])
def test_ray_executor_batches_equal_threads(ray_session, lake, shuffle):
    ds = al.dataset(lake).filter("label = 1").select("id", "text").map(_tokens, name="tokens-v1")
    kw = dict(shuffle=shuffle, seed=5, transform=lambda b: b.append_column("t2", pc.multiply(b["tokens"], 2)),
              shuffle_window=3)
    threads = _batches(ds.loader(64, **kw))
    on_ray = ds.loader(64, executor="ray", **kw)
    assert on_ray.shuffle_kind == ds.loader(64, **kw).shuffle_kind
    got = _batches(on_ray)
    assert got == threads
    assert sorted(i for b in got for i in b["id"]) == _duck(lake, "WHERE label = 1", "id").column("id").to_pylist()
    assert "executor     ray" in on_ray.explain()


@pytest.mark.parametrize("shuffle", [False, "block", "global"])
def test_ray_executor_runs_maps_and_transforms_on_ray_workers(ray_session, lake, shuffle):
    ds = al.dataset(lake).filter("id < 1200").map(_with_pid)
    here = os.getpid()
    add = lambda b: b.append_column("tpid", pa.array([os.getpid()] * b.num_rows, pa.int64()))  # noqa: E731
    ray_batches = _batches(ds.loader(100, shuffle=shuffle, executor="ray", transform=add))
    pids = {p for b in ray_batches for p in b["pid"] + b["tpid"]}
    assert pids and here not in pids  # every map and transform ran in a Ray worker process
    thread_batches = _batches(ds.loader(100, shuffle=shuffle, transform=add))
    assert {p for b in thread_batches for p in b["pid"] + b["tpid"]} == {here}


@pytest.mark.parametrize("shuffle", ["block", "global", False])
def test_ray_executor_resume_equals_uninterrupted(ray_session, lake, shuffle):
    ds = al.dataset(lake).map(_double, name="double-v1")
    kw = dict(shuffle=shuffle, seed=9, rank=1, world_size=2, drop_last=True, shuffle_window=2)
    whole = _batches(ds.loader(128, **kw))
    first = ds.loader(128, executor="ray", **kw)
    first.set_epoch(0)
    head = _batches(first, 5)
    state = first.state_dict()
    thread_first = ds.loader(128, **kw)
    _batches(thread_first, 5)
    assert state == thread_first.state_dict()
    resumed = ds.loader(128, executor="ray", **kw)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert head + _batches(resumed) == whole
    first.set_epoch(1)
    thread_first.set_epoch(1)
    assert _batches(first) == _batches(thread_first)


def test_ray_executor_with_a_one_byte_budget(ray_session, lake):
    """prefetch=1: one read and one transform in flight at a time (a lone request passes the
    budget), never a deadlock between the producer's transforms and the consumer."""
    ds = al.dataset(lake).filter("id < 2000").map(_double)
    kw = dict(shuffle="block", seed=2, prefetch=1, transform=lambda b: b.append_column("k", pc.add(b["id"], 1)))
    got = _batches(ds.loader(200, executor="ray", **kw))
    assert got == _batches(ds.loader(200, **kw))
    assert len(got) == 10


def test_ray_executor_errors_are_the_same_type(ray_session, lake):
    def bad_transform(batch):
        raise LookupError(f"batch of {batch.num_rows} rows refused")

    ds = al.dataset(lake)
    with pytest.raises(LookupError) as on_threads:
        _batches(ds.loader(100, transform=bad_transform))
    with pytest.raises(LookupError) as on_ray:
        _batches(ds.loader(100, transform=bad_transform, executor="ray"))
    assert type(on_ray.value) is type(on_threads.value)
    assert str(on_ray.value) == str(on_threads.value)
    mapped = ds.map(_boom)
    with pytest.raises(Exception) as map_threads:
        _batches(mapped.loader(100))
    with pytest.raises(Exception) as map_ray:
        _batches(mapped.loader(100, executor="ray"))
    assert type(map_ray.value) is type(map_threads.value)
    assert str(map_ray.value) == str(map_threads.value)


def test_executor_argument_is_checked(lake):
    ds = al.dataset(lake)
    with pytest.raises(InvalidArgumentError, match="executor"):
        ds.loader(10, executor="dask")
    with pytest.raises(ArgumentTypeError, match="executor"):
        ds.loader(10, executor=1)
    assert al.LoaderOptions(batch_size=10).executor == "thread"


# -- the Ray Train example ---------------------------------------------------------------

def test_ray_train_example_two_workers_cover_the_epoch_once(ray_session, lake, tmp_path):
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("ray_train_example", REPO / "examples" / "ray_train.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    data = tmp_path / "lake"
    from arrowload.datagen import write_lake
    write_lake(data, rows=3_001, shards=3, row_group_size=400, emb_dim=2)
    out = tmp_path / "ids"
    out.mkdir()
    example.run(str(data), workers=2, batch_size=100, epochs=2, out_dir=str(out),
                storage_path=str(tmp_path / "runs"))
    docs = [json.loads((out / f"ids-rank{r}.json").read_text()) for r in (0, 1)]
    assert [d["world_size"] for d in docs] == [2, 2]
    a, b = (d["ids"] for d in docs)
    assert len(a) == len(b) == 1_500  # 3001 rows: one left out so both ranks get the same number
    assert not set(a) & set(b)
    assert len(set(a) | set(b)) == 3_000
    assert set(a) | set(b) <= set(pq.read_table(data, columns=["id"]).column("id").to_pylist())
