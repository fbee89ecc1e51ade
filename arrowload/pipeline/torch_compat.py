"""The bridge to ``torch.utils.data`` for code that insists on a DataLoader."""

from __future__ import annotations


def _iterable_dataset_base():
    try:
        import torch.utils.data as tud
    except ImportError as exc:
        raise ImportError("Loader.torch_dataset() needs torch: pip install 'arrowload[torch]'") from exc
    return tud


class TorchBatches:
    """Factory: ``TorchBatches(loader)`` returns an ``IterableDataset`` over whole batches."""

    def __new__(cls, loader):
        tud = _iterable_dataset_base()

        class LoaderBatches(tud.IterableDataset):
            """Whole batches of an arrowload Loader. Use with ``batch_size=None``. With
            ``num_workers=n`` each worker process yields batches ``w, w+n, ...`` of the
            epoch (no row twice; the DataLoader's in-order round-robin restores the order).
            Call ``set_epoch`` here (or on the loader) before each epoch."""

            def __init__(self, inner):
                super().__init__()
                self.loader = inner

            def set_epoch(self, epoch: int) -> None:
                self.loader.set_epoch(epoch)

            def __len__(self) -> int:
                return len(self.loader)

            def __iter__(self):
                info = tud.get_worker_info()
                if info is None or info.num_workers <= 1:
                    return iter(self.loader)
                return self.loader._worker_iter(info.id, info.num_workers)

        return LoaderBatches(loader)
