"""Intraday scale benchmark: a generated 1-minute market of tens of millions of bars.

    nice -n 10 python benchmarks/bench_data.py --minute-market 30000000      # via bench_data
    python benchmarks/bench_scale.py --bars 30000000 --symbols 250 --json    # directly

Writes a Qlib directory of 1-minute bars (two A-share sessions, 240 bars a day) symbol by symbol
in the layout of Qlib's ``dump_bin.py --freq 1min``, then measures, each in a fresh process:

- ``prepare``: wall time and peak RSS (``ru_maxrss``) of ``prepare_splits`` (Qlib read + the
  split arrays written), and the cache's size on disk;
- ``load``: opening ``QlibDataset("train")`` (memory-mapped) and one training epoch of
  ``n_train_iter`` windows through ``make_loader``: windows/s and peak RSS; also the daily
  demo market's epoch through the same code, for comparison.

Figures of a process's resident set count the memory-mapped pages it touched (file-backed,
shared with other processes, dropped first under pressure); the anonymous part is shown too.
Everything goes under a temporary directory (or ``--home``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BARS_PER_DAY = 240


def _status() -> dict:
    out = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("VmHWM", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) / 1024
    except OSError:
        pass
    out["ru_maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def write_minute_market(root: Path, n_symbols: int, n_days: int, seed: int = 0) -> int:
    """``n_symbols`` x ``n_days`` x 240 one-minute bars; returns the number of bars written."""
    import pandas as pd

    days = pd.bdate_range("2015-01-05", periods=n_days)
    minutes = [m for a, b in ((570, 690), (780, 900)) for m in range(a + 1, b + 1)]
    offsets = pd.to_timedelta(minutes, unit="min")
    cal = (days.values[:, None] + offsets.values[None, :]).ravel()
    (root / "calendars").mkdir(parents=True)
    (root / "calendars" / "1min.txt").write_text(
        "\n".join(pd.DatetimeIndex(cal).strftime("%Y-%m-%d %H:%M:%S")) + "\n")
    (root / "instruments").mkdir()
    first, last = str(days[0].date()), str(days[-1].date())
    lines = "".join(f"SYM{i:05d}\t{first}\t{last}\n" for i in range(n_symbols))
    for name in ("all", "csi300"):
        (root / "instruments" / f"{name}.txt").write_text(lines)
    rng = np.random.default_rng(seed)
    n = len(cal)
    for i in range(n_symbols):
        close = (10 * np.exp(np.cumsum(rng.normal(0, 0.0008, n)))).astype(np.float32)
        open_ = np.r_[close[:1], close[:-1]]
        wick = np.abs(rng.normal(0, 0.0004, n)).astype(np.float32)
        fields = {"open": open_, "close": close, "high": np.maximum(open_, close) * (1 + wick),
                  "low": np.minimum(open_, close) * (1 - wick),
                  "volume": rng.integers(100, 100_000, n).astype(np.float32)}
        folder = root / "features" / f"sym{i:05d}"
        folder.mkdir(parents=True)
        for name, col in fields.items():
            with open(folder / f"{name}.1min.bin", "wb") as fh:
                np.asarray([0], dtype="<f4").tofile(fh)
                col.astype("<f4").tofile(fh)
    return n * n_symbols


def _config(args, market: str, freq: str, home: Path) -> dict:
    from kronos_mlflow.config.core import load_config

    over = {"qlib_data_path": market, "freq": freq, "dataset_path": str(home / "processed"), "num_workers": 0}
    if freq != "day":
        over.update({"dataset_begin_time": args.begin, "dataset_end_time": args.end,
                     "train_time_range": f"{args.begin}:{args.train_end}",
                     "val_time_range": f"{args.val_begin}:{args.end}", "test_time_range": f"{args.test_begin}:{args.end}"})
    return load_config(over)


def stage_prepare(args, home: Path) -> dict:
    from kronos_mlflow.data import prepare_splits
    from kronos_mlflow.data.prepare import read_manifest

    cfg = _config(args, args.market, "1min", home)
    import qlib  # noqa: F401 - imported before the clock starts (seconds of imports, whatever the market)

    t0, c0 = time.perf_counter(), time.process_time()
    out = prepare_splits(cfg, progress=False, force=True)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    m = read_manifest(out)
    size = sum(p.stat().st_size for p in out.iterdir())
    return {"prepare_s": seconds, "prepare_cpu_s": cpu, "cache_bytes": size, "rows_kept": m["stats"]["rows_kept"],
            "windows": {s: m["splits"][s]["windows"] for s in ("train", "val", "test")}, **_status()}


def stage_load(args, home: Path, market: str, freq: str) -> dict:
    from kronos_mlflow.data import QlibDataset, make_loader, prepare_splits

    cfg = _config(args, market, freq, home)
    if freq == "day":
        prepare_splits(cfg, progress=False)  # not timed: the daily reference
    before = _status()
    t0 = time.perf_counter()
    ds = QlibDataset("train", cfg, progress=False)
    open_s = time.perf_counter() - t0
    loader = make_loader(ds, args.batch_size)
    rates, cpu_rates = [], []
    for epoch in range(args.epochs):
        ds.set_epoch_seed(epoch)
        n, t0, c0 = 0, time.perf_counter(), time.process_time()
        for x, _ in loader:
            n += x.shape[0]
        rates.append(n / (time.perf_counter() - t0))
        cpu_rates.append(n / (time.process_time() - c0))
        if epoch == 0:
            first = _status()
    return {"open_s": open_s, "epoch_windows": len(ds), "windows_per_s": sorted(rates)[len(rates) // 2],
            "windows_per_cpu_s": sorted(cpu_rates)[len(cpu_rates) // 2], "rates": rates, "after_first_epoch": first, "windows_total": ds.n_windows, "before": before, **_status()}


def _child(stage: str, args, home: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--stage", stage, "--home", str(home), "--market", args.market,
           "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"stage {stage} failed")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bars", type=int, default=30_000_000, help="bars in the generated market (default 30,000,000)")
    p.add_argument("--symbols", type=int, default=250)
    p.add_argument("--epochs", type=int, default=3, help="loader epochs (median windows/s reported)")
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--home", default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--stage", default=None, help=argparse.SUPPRESS)
    p.add_argument("--market", default="", help=argparse.SUPPRESS)
    p.add_argument("--freq", default="1min", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from kronos_mlflow.stages import build_registry

    build_registry()  # as every command does before it loads a config
    os.environ.setdefault("TQDM_DISABLE", "1")
    if args.stage:
        home = Path(args.home)
        os.environ["KRONOS_MLFLOW_HOME"] = str(home / "kronos_home")
        cal = (Path(args.market) / "calendars" / "1min.txt").read_text().split("\n") if args.market else []
        days = sorted({c[:10] for c in cal if c})
        if days:
            args.begin, args.end = days[0], days[-1]
            args.train_end = days[int(len(days) * 0.8)]
            args.val_begin, args.test_begin = days[int(len(days) * 0.75)], days[int(len(days) * 0.9)]
        if args.stage == "prepare":
            result = stage_prepare(args, home)
        else:
            result = stage_load(args, home, args.market if args.freq != "day" else "", args.freq)
        print(json.dumps(result))
        return 0
    if args.home:
        return _run(args, Path(args.home).expanduser().absolute())
    with tempfile.TemporaryDirectory(prefix="kronos-scale-") as tmp:
        return _run(args, Path(tmp))


def _run(args, home: Path) -> int:
    n_days = max(2, round(args.bars / args.symbols / BARS_PER_DAY))
    market = home / "minute_market"
    t0 = time.perf_counter()
    if not (market / "calendars" / "1min.txt").is_file():
        bars = write_minute_market(market, args.symbols, n_days)
    else:
        bars = args.symbols * n_days * BARS_PER_DAY
    gen_s = time.perf_counter() - t0
    args.market = str(market)
    prep = _child("prepare", args, home, [])
    load = _child("load", args, home, [])
    daily = _child("load", args, home, ["--freq", "day"])
    mib = 2**20
    res = {"bars": bars, "symbols": args.symbols, "days": n_days, "generate_s": gen_s, "prepare": prep,
           "load": load, "daily_load": daily}
    scale = 180e6 / bars
    print(f"1-minute market: {args.symbols} symbols x {n_days} days x {BARS_PER_DAY} bars = {bars:,} bars "
          f"({os.cpu_count()} CPUs)")
    rows = [
        ("market generation (s)", f"{gen_s:.1f}"),
        ("prepare: wall / CPU (s)", f"{prep['prepare_s']:.1f} / {prep['prepare_cpu_s']:.1f}"),
        ("prepare peak RSS (MiB)", f"{prep['ru_maxrss_mib']:.0f}"),
        ("cache on disk (MiB)", f"{prep['cache_bytes'] / mib:,.0f}"),
        ("windows train / val / test", "{train:,} / {val:,} / {test:,}".format(**prep["windows"])),
        ("open QlibDataset('train') (s)", f"{load['open_s']:.2f}"),
        (f"loader, one epoch of {load['epoch_windows']:,} windows: peak RSS (MiB)",
         f"{load['after_first_epoch']['ru_maxrss_mib']:.0f}"),
        (f"loader, after {args.epochs} epochs: peak RSS (MiB)", f"{load['ru_maxrss_mib']:.0f}"),
        ("  of which anonymous / file-backed at the end (MiB)",
         f"{load.get('RssAnon', 0):.0f} / {load.get('RssFile', 0):.0f}"),
        (f"loader windows/s (wall / CPU), median of {args.epochs}",
         f"{load['windows_per_s']:,.0f} / {load['windows_per_cpu_s']:,.0f}"),
        ("daily demo market: loader windows/s (wall / CPU)",
         f"{daily['windows_per_s']:,.0f} / {daily['windows_per_cpu_s']:,.0f}"),
        ("daily demo market: loader peak RSS (MiB)", f"{daily['ru_maxrss_mib']:.0f}"),
        ("extrapolated to 180 M bars: prepare CPU (min)", f"{prep['prepare_cpu_s'] * scale / 60:.0f}"),
        ("extrapolated to 180 M bars: cache (GiB)", f"{prep['cache_bytes'] * scale / 2**30:.1f}"),
    ]
    for k, v in rows:
        print(f"{k:58s} {v:>16s}")
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
