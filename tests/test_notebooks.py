"""Every notebook in notebooks/ runs top to bottom in a fresh python3 kernel, offline, on
the data it generates itself (the notebooks assert their own results), and is stored
without outputs."""

from __future__ import annotations

import glob
import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

HERE = os.path.dirname(os.path.abspath(__file__))
NOTEBOOKS = sorted(glob.glob(os.path.join(HERE, "..", "notebooks", "*.ipynb")))


def test_there_are_notebooks():
    names = {os.path.basename(p) for p in NOTEBOOKS}
    for stem in ("01-quickstart", "02-pushdown", "03-training-torch", "04-jax", "05-lake-tables"):
        assert f"{stem}.ipynb" in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(p) for p in NOTEBOOKS])
def test_notebook_is_stored_without_outputs(path):
    book = nbformat.read(path, as_version=4)
    nbformat.validate(book)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, \
                f"{os.path.basename(path)}: strip outputs before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[os.path.basename(p) for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    if "torch" in os.path.basename(path):
        pytest.importorskip("torch")
    if "jax" in os.path.basename(path):
        pytest.importorskip("jax")
    # The kernel inherits this environment: its caches and temporary lakes stay in tmp_path.
    monkeypatch.setenv("ARROWLOAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    book = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(book, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [out for cell in book.cells if cell.cell_type == "code"
              for out in cell.outputs if out.output_type == "error"]
    assert not errors
