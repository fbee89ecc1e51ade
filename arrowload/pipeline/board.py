"""The epoch a loader's DataLoader workers follow (``Loader.torch_dataset()``).

A torch ``DataLoader`` with ``persistent_workers=True`` keeps its worker processes, each
with the copy of the loader it started with, from one epoch to the next: ``set_epoch``
called on the loader in the training process never reaches them. ``Board`` holds the
epoch (and how many states were loaded) in shared memory: the training process writes
it, a worker reads it before each epoch (``torch_compat.follow``). Shared with forked workers by inheritance and
with spawned / forkserver ones while they start; a loader pickled any other way leaves
it out.
"""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.context import get_spawning_popen

class Board:
    """``[epoch, loads, used, afresh]`` in shared memory (int64s, no lock: each is written
    whole). ``used``: the ``loads`` count whose loaded position a DataLoader pass went
    through to its end (its workers mark it); ``afresh``: the ``loads`` count for which a
    later pass started the epoch afresh, as an iteration of the loader itself does after
    one that resumed (-1: none). The training process reads ``afresh`` to count
    ``dataloader_batches`` from the epoch's start."""

    def __init__(self, epoch: int, loads: int) -> None:
        self._values = mp.RawArray("q", [epoch, loads, -1, -1])

    def post(self, epoch: int, loads: int) -> None:
        self._values[0], self._values[1] = epoch, loads

    def read(self) -> tuple[int, int]:
        return int(self._values[0]), int(self._values[1])

    def mark_used(self, loads: int) -> None:
        self._values[2] = loads

    def used(self) -> int:
        return int(self._values[2])

    def mark_afresh(self, loads: int) -> None:
        self._values[3] = loads

    def afresh(self) -> int:
        return int(self._values[3])


def post(loader) -> None:
    """After ``set_epoch`` / ``load_state_dict`` in the training process: the workers' board
    says so (where ``torch_dataset()`` made one)."""
    if loader._board is not None:
        loader._board.post(loader.epoch, loader._loads)


def torch_batches(loader):
    """``loader.torch_dataset()``: the loader as a torch ``IterableDataset`` of whole
    batches, with the board its DataLoader workers follow."""
    from .torch_compat import TorchBatches
    if loader._board is None:
        loader._board = Board(loader.epoch, loader._loads)
    return TorchBatches(loader)


def shared(board: Board | None) -> Board | None:
    """``board`` where it can travel with a pickled loader (a worker process starting), else
    None."""
    return board if board is not None and get_spawning_popen() is not None else None
