"""``loader.profile(n)``: stage timings that add up, a plot, and an untouched loader.

No timing is asserted: only relations every run satisfies (a single thread cannot be
busy longer than the wall time, N reader threads not longer than N times it) and
counts (batches, rows) against the loader's own contract.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

import arrowload as al
from arrowload.pipeline.profile import STAGES, Profile

EPS = 1e-6


def _loader(lake, tmp_path, **kw):
    sel = al.dataset(lake).filter("label = 1").select("id", "f0", "f1")
    kw.setdefault("cache_dir", str(tmp_path))
    return sel.loader(kw.pop("batch_size", 100), **kw)


@pytest.mark.parametrize("shuffle", [False, "block", "global"])
def test_stage_timings_add_up(parquet_lake, tmp_path, shuffle):
    with _loader(parquet_lake, tmp_path, shuffle=shuffle, io_threads=3) as loader:
        prof = loader.profile(7)
        full = loader.profile()
        n_rows, n_batches = loader.num_rows, len(loader)
    assert isinstance(prof, Profile)
    assert prof.batches == 7 and prof.rows == 700 == int(prof.batch_rows.sum())
    assert len(prof.arrivals) == 7 and np.all(np.diff(prof.arrivals) >= 0)
    assert 0 < prof.first_batch_s == prof.arrivals[0] <= prof.wall_s
    assert full.batches == n_batches and full.rows == n_rows
    for p in (prof, full):
        st = p.stages()
        assert tuple(st) == STAGES
        assert all(v >= 0 for v in st.values())
        busy = st["collate"] + st["transform"] + st["convert"]
        assert busy <= p.wall_s + EPS                          # one producer thread
        assert abs(busy + st["producer idle"] - p.wall_s) <= EPS
        assert st["read"] <= p.io_threads * p.wall_s + EPS    # io_threads readers
        assert st["consumer wait"] <= p.wall_s + EPS
        assert p.rows_per_s > 0 and p.bottleneck()
        assert p.stats.rows >= p.rows
        json.dumps(p.as_dict())                                # plain data


def test_profile_leaves_the_loader_where_it_was(parquet_lake, tmp_path):
    with _loader(parquet_lake, tmp_path, shuffle="block", seed=5) as loader, \
            _loader(parquet_lake, tmp_path, shuffle="block", seed=5) as twin:
        everything = [b["id"].tolist() for b in twin]
        state0, stats0 = loader.state_dict(), loader.stats()
        loader.profile(4)
        assert loader.state_dict() == state0 and loader.stats() == stats0
        assert [b["id"].tolist() for b in loader] == everything

        it = iter(twin)
        first = [next(it)["id"].tolist() for _ in range(3)]
        state = twin.state_dict()
        loader.load_state_dict(state)
        loader.profile()                        # a pending resume survives profiling
        assert loader.state_dict() == state
        assert first + [b["id"].tolist() for b in loader] == everything


def test_plot_is_a_matplotlib_figure(parquet_lake, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    with _loader(parquet_lake, tmp_path) as loader:
        prof = loader.profile(10)
    fig = prof.plot()
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert set(labels) == set(STAGES)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    assert buf.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
    t, rate = prof.throughput()
    assert len(t) == len(rate) > 0
    assert np.isclose(np.sum(rate * (t[1] - t[0] if len(t) > 1 else prof.wall_s)), prof.rows)


def test_bad_arguments(parquet_lake, tmp_path):
    with _loader(parquet_lake, tmp_path) as loader:
        with pytest.raises(ValueError):
            loader.profile(0)
        text = str(loader.profile(2))
    for stage in STAGES:
        assert stage in text
