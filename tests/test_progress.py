"""Progress bars: off in tests and pipes unless asked, switchable by option and by
environment, wired into counting, the random-access table and loader epochs, and never
changing a result."""

from __future__ import annotations

import pytest

import arrowload as al
from arrowload import progress


class Recorder:
    """Stands in for tqdm: records every bar made and how far it got."""

    bars: list["Recorder"] = []

    def __init__(self, total=None, desc="", unit="it", **kwargs) -> None:
        self.total, self.desc, self.unit, self.n, self.closed = total, desc, unit, 0, False
        Recorder.bars.append(self)

    def update(self, n=1):
        self.n += n

    def set_postfix_str(self, *args, **kwargs):
        pass

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture
def recorded(monkeypatch):
    """Bars forced on, drawn by the Recorder."""
    Recorder.bars = []
    monkeypatch.setattr(progress, "_TQDM", Recorder)
    monkeypatch.setenv("ARROWLOAD_PROGRESS", "1")
    return Recorder.bars


def test_default_is_quiet_where_nobody_watches(monkeypatch, capsys, parquet_lake, tmp_path):
    monkeypatch.delenv("ARROWLOAD_PROGRESS", raising=False)
    assert progress.get_progress() == "auto"
    assert not progress.active()        # pytest captures stderr: no terminal, no notebook
    sel = al.dataset(parquet_lake).filter("label = 1").select("f0", "label")
    with sel.loader(128, shuffle="global", cache_dir=str(tmp_path)) as loader:
        list(loader.progress())
    sel.to_arrow()
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_switches(monkeypatch):
    monkeypatch.delenv("ARROWLOAD_PROGRESS", raising=False)
    try:
        al.set_progress(True)
        assert progress.active()
        with al.progress_enabled(False):
            assert not progress.active()
            assert isinstance(progress.bar(10), progress._NoBar)
        assert progress.active()
        monkeypatch.setenv("ARROWLOAD_PROGRESS", "0")      # the environment wins
        assert not progress.active()
        al.set_progress(False)
        monkeypatch.setenv("ARROWLOAD_PROGRESS", "1")
        assert progress.active()
    finally:
        al.set_progress("auto")
    with pytest.raises(ValueError):
        al.set_progress("sometimes")


def test_env_off_silences_even_explicit_setting(monkeypatch, capsys):
    monkeypatch.setenv("ARROWLOAD_PROGRESS", "0")
    al.set_progress(True)
    try:
        for _ in progress.track(range(3), desc="x", delay=0):
            pass
    finally:
        al.set_progress("auto")
    assert capsys.readouterr().err == ""


def test_real_tqdm_draws_when_asked(monkeypatch, capsys):
    pytest.importorskip("tqdm")
    monkeypatch.setenv("ARROWLOAD_PROGRESS", "1")
    for _ in progress.track(range(3), desc="drawing", delay=0):
        pass
    assert "drawing" in capsys.readouterr().err


def test_counting_and_random_access_table_report_progress(recorded, parquet_lake, tmp_path):
    ds = al.dataset(parquet_lake)
    sel = ds.filter("label = 1").select("f0", "label")
    with sel.loader(128, shuffle="block", cache_dir=str(tmp_path / "a")) as loader:
        units = len(loader._source.counts)
    counting = [b for b in recorded if "counting" in b.desc]
    assert len(counting) == 1 and counting[0].total == units and counting[0].n == units
    assert counting[0].closed
    recorded.clear()
    with ds.select("f0", "label").loader(128, shuffle="global", cache_dir=str(tmp_path / "b")) as loader:
        rows = loader.num_rows
    table = [b for b in recorded if "random-access" in b.desc]
    assert len(table) == 1 and table[0].total == rows == table[0].n


def test_results_do_not_depend_on_progress(recorded, monkeypatch, parquet_lake, tmp_path):
    sel = al.dataset(parquet_lake).select("id", "f0")
    shown = sel.to_arrow()
    bars = [b for b in recorded if b.desc == "to_arrow"]
    assert len(bars) == 1 and bars[0].total == bars[0].n == shown.num_rows
    monkeypatch.setenv("ARROWLOAD_PROGRESS", "0")
    quiet = sel.to_arrow()
    monkeypatch.setenv("ARROWLOAD_PROGRESS", "1")
    assert shown.equals(quiet)

    sel = al.dataset(parquet_lake).select("id")
    with sel.loader(300, shuffle="block", seed=1, cache_dir=str(tmp_path)) as a, \
            sel.loader(300, shuffle="block", seed=1, cache_dir=str(tmp_path)) as b:
        plain = [x["id"].tolist() for x in a]
        tracked = [x["id"].tolist() for x in b.progress(enabled=True)]
        assert plain == tracked
        assert a.state_dict() == b.state_dict()
    epoch_bars = [r for r in recorded if r.desc == "epoch 0"]
    assert epoch_bars and epoch_bars[-1].n == len(plain) == epoch_bars[-1].total
