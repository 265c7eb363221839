"""The in-process two-rank checks: what each gloo rank computes, and one spawned pair running them all.

A rank pays a process start, its imports and a process group; the checks of
tests/test_quality.py (the tokenizer's per-window test losses, the validation loss and the
validation stats) share one pair. Each check is a function ``f(config, rank, world_size)``
returning JSON-able values; called with ``rank=0, world_size=1`` outside a process group it is
the one-process side the test compares with.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def _model(config: dict | None = None, eval_mode: bool = True):
    """The tiny tokenizer, seed 0: TINY's sizes, or ``config``'s when given."""
    from tiny_runs import TINY

    from kronos_mlflow.config.core import load_config, model_kwargs
    from kronos_mlflow.model import KronosTokenizer

    torch.manual_seed(0)
    model = KronosTokenizer(**model_kwargs(config if config is not None else load_config(TINY)))
    return model.eval() if eval_mode else model


def heldout_scores(config: dict, rank: int = 0, world_size: int = 1) -> dict:
    """Per-window test losses and metrics of the held-out scoring (batches of 4)."""
    from kronos_mlflow.evaluation.windows import heldout_windows
    from kronos_mlflow.stages.tokenizer.heldout import score

    kwargs = {"rank": rank, "world_size": world_size} if world_size > 1 else {}
    losses, metrics = score(_model(), heldout_windows(config, "test"), "cpu", batch_size=4, **kwargs)
    return {"losses": losses.tolist(), "metrics": metrics}


def _val_dataset(config: dict):
    from kronos_mlflow.data import QlibDataset

    ds = QlibDataset("val", config)
    ds.set_epoch_seed(0)
    return ds


def val_loss(config: dict, rank: int = 0, world_size: int = 1) -> dict:
    """The validation loss of a fresh model built from ``config`` (not in eval mode), and the split's size."""
    from kronos_mlflow.data import loaders
    from kronos_mlflow.stages.tokenizer import training as tokenizer_training

    model = _model(config, eval_mode=False)
    ds = _val_dataset(config)
    loss = tokenizer_training.global_val_loss(model, loaders.val_loader_for(ds, config, rank, world_size),
                                              torch.device("cpu"))
    return {"loss": loss, "n": len(ds)}


def _stats_snapshot(stats) -> dict:
    return {
        "metrics": stats.metrics(),
        "s1": [a.tolist() for a in stats.s1.ids_and_counts()],
        "full": [a.tolist() for a in stats.full.ids_and_counts()],
        "rows": stats.rows,
    }


def val_stats(config: dict, rank: int = 0, world_size: int = 1) -> dict:
    """The validation stats gathered during the validation pass, dense and sparse code counts."""
    from kronos_mlflow.data import loaders
    from kronos_mlflow.evaluation.quality import ValidationStats
    from kronos_mlflow.stages.tokenizer import training as tokenizer_training

    model = _model()
    ds = _val_dataset(config)
    out = {}
    for name, dense_max_bits in (("dense", 20), ("sparse", 0)):
        stats = ValidationStats.for_model(model, dense_max_bits=dense_max_bits)
        loader = loaders.val_loader_for(ds, config, rank, world_size)
        out["loss"] = tokenizer_training.global_val_loss(model, loader, torch.device("cpu"), stats)
        out[name] = _stats_snapshot(stats)
    return out


CHECKS = {"heldout_scores": heldout_scores, "val_loss": val_loss, "val_stats": val_stats}


def _worker(rank: int, world_size: int, init_file: str, configs: dict, out_dir: str) -> None:
    import torch.distributed as dist

    from kronos_mlflow.stages import build_registry

    build_registry()  # a spawned rank builds the stage registry as a command does
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    out = {name: CHECKS[name](config, rank, world_size) for name, config in configs.items()}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def run(configs: dict[str, dict], out_dir: Path) -> dict[str, list[dict]]:
    """Every check named in ``configs`` (name -> its config) on two gloo ranks of one spawned
    pair: name -> [rank 0's result, rank 1's]."""
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(2, str(out_dir / "init"), configs, str(out_dir)), nprocs=2, join=True)
    ranks = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(2)]
    return {name: [got[name] for got in ranks] for name in configs}
