"""The bridge to ``torch.utils.data`` for code that insists on a DataLoader.

Imported only by ``Loader.torch_dataset()``, so ``import arrowload`` never imports torch.
The class lives at module level so DataLoader workers started with ``spawn`` /
``forkserver`` (the default from Python 3.14) can unpickle it.
"""

from __future__ import annotations

try:
    import torch.utils.data as tud
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise ImportError("Loader.torch_dataset() needs torch: pip install 'arrowload[torch]'") from exc

from ..errors import UnsupportedError


class TorchBatches(tud.IterableDataset):
    """Whole batches of an arrowload Loader. Use with ``batch_size=None``. With
    ``num_workers=n`` each worker process yields batches ``w, w+n, ...`` of the epoch
    (no row twice; the DataLoader's in-order round-robin restores the loader's order).
    Call ``set_epoch`` here (or on the loader) before each epoch."""

    def __init__(self, loader) -> None:
        super().__init__()
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        info = tud.get_worker_info()
        if info is None:
            return iter(self.loader)
        return self._in_worker(info.id, info.num_workers)

    def _in_worker(self, worker: int, workers: int):
        # at the first batch, not in iter(): the DataLoader re-raises a batch's error in
        # the training process (an error in iter() only kills the worker)
        loader = self.loader
        follow(loader)  # the epoch the training process set last
        board = loader._board
        if board is not None and board.used() == loader._loads:
            # an earlier pass went through the loaded position: this one starts the epoch
            # afresh (this worker's copy of the loader still holds the position)
            loader._drop_resume()
            board.mark_afresh(loader._loads)
        it = iter(loader) if workers <= 1 else loader._worker_iter(worker, workers)
        try:
            yield from it
        finally:
            # a worker ended early (the DataLoader dropped, a break): its reader threads and
            # polars query stop now, not at the process's exit
            close = getattr(it, "close", None)
            if close is not None:
                close()
        if board is not None:
            board.mark_used(loader._loads)


def follow(loader) -> None:
    """In a DataLoader worker, before an epoch: take up the epoch the training process set;
    refuse a state loaded there after this worker started (its copy cannot see it)."""
    board = loader._board
    if board is None:
        return
    epoch, loads = board.read()
    if loads != loader._loads:
        raise UnsupportedError(
            "load_state_dict was called after this DataLoader's workers started (persistent_workers=True keeps "
            "them, with the loader as it was): they cannot see the state. Build the DataLoader over "
            "loader.torch_dataset() after load_state_dict, or leave persistent_workers off")
    if epoch != loader.epoch:
        loader.set_epoch(epoch)
