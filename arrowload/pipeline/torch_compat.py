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

from .board import follow


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
        follow(self.loader)  # the epoch the training process set last
        yield from iter(self.loader) if workers <= 1 else self.loader._worker_iter(worker, workers)
