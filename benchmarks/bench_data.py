"""Data pipeline benchmark: demo generation, preprocessing, windows/s through DataLoader, memory.

    python benchmarks/bench_data.py                    # default demo market, batch 50, 5 epochs
    python benchmarks/bench_data.py --workers 0,2 --epochs 7 --json
    nice -n 10 python benchmarks/bench_data.py --minute-market 30000000   # intraday scale (bench_scale.py)

Each "epoch" is a full pass over ``len(train_ds)`` windows (n_train_iter = 100,000 by default,
i.e. 2,000 batches of 50); the table reports the median windows/s over the epochs. Reference
rows: ``__getitem__`` one window at a time (what a dataset without ``__getitems__`` costs) and
an upstream-style pandas ``iloc`` per window (upstream Kronos's ``QlibDataset``). Everything is
written under a temporary directory (or ``--home``), never into the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _rss_mib() -> float:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 2**20


def _epoch_rate(loader, ds, epoch: int) -> float:
    ds.set_epoch_seed(epoch)
    n = 0
    t0 = time.perf_counter()
    for x, _ in loader:
        n += x.shape[0]
    return n / (time.perf_counter() - t0)


def _per_sample_rate(ds, n: int) -> float:
    """``ds[i]`` one window at a time plus default_collate (no batched fetching)."""
    from torch.utils.data import DataLoader, Dataset

    class PerSample(Dataset):
        def __len__(self):
            return min(n, len(ds))

        def __getitem__(self, i):
            return ds[i]

    loader = DataLoader(PerSample(), batch_size=50)
    t0 = time.perf_counter()
    count = sum(x.shape[0] for x, _ in loader)
    return count / (time.perf_counter() - t0)


def _upstream_style_rate(ds, n: int) -> float:
    """Upstream Kronos's per-window work: a pandas ``iloc`` slice, ``.values``, numpy z-score."""
    import numpy as np
    import pandas as pd
    import torch

    feats = ["open", "high", "low", "close", "vol", "amt"]
    tfeats = ["minute", "hour", "weekday", "day", "month"]
    frames = []
    for k in range(len(ds.symbols)):
        a, b = int(ds.offsets[k]), int(ds.offsets[k + 1])
        df = pd.DataFrame(ds.x[a:b], columns=feats)
        df[tfeats] = ds.x_stamp[a:b]
        frames.append(df)
    rng = np.random.default_rng(0)
    index = [(k, s) for k, f in enumerate(frames) for s in range(len(f) - ds.window + 1)]
    t0 = time.perf_counter()
    for _ in range(n):
        k, s = index[rng.integers(len(index))]
        win = frames[k].iloc[s : s + ds.window]
        x = win[feats].values.astype(np.float32)
        x_stamp = win[tfeats].values.astype(np.float32)
        past = x[: ds.lookback]
        x = np.clip((x - past.mean(0)) / (past.std(0) + 1e-5), -5, 5)
        torch.from_numpy(x), torch.from_numpy(x_stamp)
    return n / (time.perf_counter() - t0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--symbols", type=int, default=None, help="demo market size (default: the built-in default)")
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--epochs", type=int, default=5, help="measured passes per setting (median reported)")
    p.add_argument("--workers", default="0,2", help="comma-separated num_workers values")
    p.add_argument("--n-train-iter", type=int, default=None, help="windows per epoch (default: config default)")
    p.add_argument("--home", default=None, help="KRONOS_MLFLOW_HOME and dataset_path root (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    p.add_argument("--minute-market", type=int, default=None, metavar="BARS",
                   help="instead: the intraday scale benchmark on a generated 1-minute market of BARS bars "
                        "(benchmarks/bench_scale.py)")
    args = p.parse_args(argv)
    from kronos_mlflow.stages import build_registry

    build_registry()  # as every command does before it loads a config

    if args.minute_market:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_scale

        extra = ["--home", args.home] if args.home else []
        return bench_scale.main(["--bars", str(args.minute_market), *extra] + (["--json"] if args.json else []))
    if args.home:
        return _bench(args, Path(args.home).expanduser())
    with tempfile.TemporaryDirectory(prefix="kronos-bench-") as tmp:
        return _bench(args, Path(tmp))


def _bench(args, home: Path) -> int:
    os.environ["KRONOS_MLFLOW_HOME"] = str(home)
    os.environ.setdefault("TQDM_DISABLE", "1")

    import torch

    from kronos_mlflow.config.core import load_config
    from kronos_mlflow.data import QlibDataset, make_loader, prepare_splits
    from kronos_mlflow.data import demo
    from kronos_mlflow.data.prepare import read_manifest

    n_symbols = args.symbols or demo.DEFAULT_SYMBOLS
    overrides = {"qlib_data_path": "", "dataset_path": str(home / "processed")}
    if args.n_train_iter:
        overrides["n_train_iter"] = args.n_train_iter
    cfg = load_config(overrides)
    results: dict = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
                     "torch_threads": torch.get_num_threads(), "symbols": n_symbols, "batch_size": args.batch_size}

    t0 = time.perf_counter()
    if args.symbols:
        market = demo.write_demo_market(home / "market", n_symbols)
        cfg = load_config({**overrides, "qlib_data_path": str(market)})
    else:
        demo.ensure_demo_market()
    results["demo_generate_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    out = prepare_splits(cfg, progress=False)
    results["prepare_cold_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    prepare_splits(cfg, progress=False)
    results["prepare_cached_s"] = time.perf_counter() - t0
    m = read_manifest(out)
    results["prepare_build_s"] = m["seconds"]
    results["windows"] = {s: m["splits"][s]["windows"] for s in ("train", "val", "test")}

    t0 = time.perf_counter()
    ds = QlibDataset("train", cfg, progress=False)
    results["dataset_open_s"] = time.perf_counter() - t0
    results["dataset_mib"] = (ds.x.nbytes + ds.x_stamp.nbytes + ds.starts.nbytes) / 2**20
    results["epoch_windows"] = len(ds)

    rates = {}
    for nw in [int(w) for w in args.workers.split(",") if w.strip()]:
        loader = make_loader(ds, args.batch_size, num_workers=nw, persistent_workers=nw > 0)
        _epoch_rate(loader, ds, 10_000)  # warm-up (starts persistent workers)
        per_epoch = [_epoch_rate(loader, ds, e) for e in range(args.epochs)]
        rates[f"workers={nw}"] = {"median": statistics.median(per_epoch), "min": min(per_epoch),
                                  "max": max(per_epoch)}
        del loader
    results["loader_windows_per_s"] = rates
    results["per_sample_getitem_windows_per_s"] = _per_sample_rate(ds, 20_000)
    results["upstream_style_pandas_windows_per_s"] = _upstream_style_rate(ds, 3_000)
    results["peak_rss_mib"] = _rss_mib()

    print(f"kronos_mlflow data benchmark: {n_symbols}-symbol demo market, batch {args.batch_size}, "
          f"{results['cpus']} CPUs, torch {results['torch']} ({results['torch_threads']} threads)")
    print(f"{'step':44s} {'value':>14s}")
    print("-" * 59)
    rows = [
        ("demo market generation (s)", f"{results['demo_generate_s']:.2f}"),
        ("prepare, cold: qlib.init + D.features (s)", f"{results['prepare_cold_s']:.2f}"),
        ("  of which building the splits (s)", f"{results['prepare_build_s']:.2f}"),
        ("prepare, cached (s)", f"{results['prepare_cached_s']:.3f}"),
        ("open QlibDataset('train') (s)", f"{results['dataset_open_s']:.3f}"),
        ("windows train / val / test", "{train} / {val} / {test}".format(**results["windows"])),
        ("train split arrays in memory (MiB)", f"{results['dataset_mib']:.1f}"),
    ]
    for k, v in rates.items():
        rows.append((f"DataLoader {k}, median of {args.epochs} (win/s)", f"{v['median']:,.0f}"))
        rows.append(("  min .. max", f"{v['min']:,.0f} .. {v['max']:,.0f}"))
    rows += [
        ("reference: ds[i] one at a time (win/s)", f"{results['per_sample_getitem_windows_per_s']:,.0f}"),
        ("reference: upstream-style pandas (win/s)", f"{results['upstream_style_pandas_windows_per_s']:,.0f}"),
        ("peak RSS of this process (MiB)", f"{results['peak_rss_mib']:.0f}"),
    ]
    for k, v in rows:
        print(f"{k:44s} {v:>14s}")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
