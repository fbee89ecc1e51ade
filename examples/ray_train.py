"""Ray Train with arrowload: a ``TorchTrainer`` on CPU workers, each with its own loader.

Each Ray Train worker builds an arrowload loader over the same lake, taking its rank and
the world size from the train context, so the workers read disjoint rows that together
cover the epoch exactly once (arrowload's sharding: every rank the same number of rows).
A tiny linear model trains a couple of steps per epoch; each worker reports its loss and,
when ``out_dir`` is given, writes the ids it saw to ``out_dir/ids-rank<r>.json``.

Run it (pip install 'arrowload[ray,torch]')::

    python examples/ray_train.py                 # a local Ray, a generated lake
    python examples/ray_train.py --path s3://bucket/events/ --workers 8

``train_loop`` is the part to copy: it is what every worker runs.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

FEATURES = ["f0", "f1", "f2", "f3"]


def train_loop(config: dict) -> None:
    """One Ray Train worker: an arrowload loader for this rank, a linear model, SGD."""
    import ray.train
    import torch

    import arrowload as al

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    ds = al.dataset(config["path"]).select("id", *FEATURES, label="CAST(label AS FLOAT)")
    loader = ds.loader(config["batch_size"], shuffle=True, seed=config.get("seed", 0),
                       rank=rank, world_size=world, output="torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(len(FEATURES), 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[int] = []
    loss = torch.tensor(float("nan"))
    for epoch in range(config.get("epochs", 1)):
        loader.set_epoch(epoch)
        for batch in loader:
            x = torch.stack([batch[c] for c in FEATURES], dim=1).float()  # (a lake's features may be float64)
            y = batch["label"].unsqueeze(1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if epoch == 0:
                seen.extend(batch["id"].tolist())
    loader.close()
    if config.get("out_dir"):
        with open(os.path.join(config["out_dir"], f"ids-rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world_size": world, "batches": len(loader), "ids": seen}, f)
    ray.train.report({"loss": loss.item(), "rank": rank, "rows": len(seen)})


def run(path: str, *, workers: int = 2, batch_size: int = 256, epochs: int = 1,
        out_dir: str | None = None, storage_path: str | None = None):
    """Train with ``workers`` CPU workers on the running Ray session (``ray.init()`` first)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"path": path, "batch_size": batch_size, "epochs": epochs, "out_dir": out_dir},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=False),
        run_config=RunConfig(storage_path=storage_path or tempfile.mkdtemp(prefix="arrowload-ray-train-")),
    )
    return trainer.fit()


def main() -> None:
    import ray

    from arrowload.datagen import write_lake

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--path", help="a lake arrowload can open (default: a generated one)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    path = args.path
    if path is None:
        path = tempfile.mkdtemp(prefix="arrowload-lake-")
        write_lake(path, rows=8_192, shards=4, row_group_size=1_024, emb_dim=4)
    ray.init(num_cpus=max(2, args.workers), include_dashboard=False)
    out_dir = tempfile.mkdtemp(prefix="arrowload-ids-")
    result = run(path, workers=args.workers, batch_size=args.batch_size, epochs=args.epochs, out_dir=out_dir)
    if result.error is not None:
        raise result.error
    for name in sorted(os.listdir(out_dir)):
        with open(os.path.join(out_dir, name)) as f:
            doc = json.load(f)
        print(f"rank {doc['rank']}/{doc['world_size']}: {len(doc['ids'])} rows in {doc['batches']} batches")


if __name__ == "__main__":
    main()
