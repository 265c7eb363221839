"""Hostile input through the real command lines: one clear line, exit code 2, nothing touched.

Each case runs a real entry point (``kronos-mlflow ...``, ``python -m kronos_mlflow.train --check
...``, the MLproject ``main`` check command rendered from the MLproject file the way ``mlflow run``
renders it, ``python sweeps/sweep.py ...``) in its own copy of a workspace holding a finished
run's outputs (best checkpoint, training state), a prepared data cache, a small Qlib market and
an MLflow store with a FINISHED run. Every case must:

- exit with code 2 and print exactly one non-empty line on stderr, without a traceback;
- name the bad value (``needle``);
- leave every file of the workspace as it was (SHA-256 of each file before and after; no new
  file either);
- never print a credential: COMET_API_KEY, MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_TOKEN are
  set for every case, and cases put secrets in a config file, a flag and a tracking URI.

The cases run in ``tests/forkrunner.py``: one interpreter that imports torch, MLflow, pandas and
Qlib once and forks a child per case; the child is the user's process (its own cwd, environment,
stdout/stderr files, ``sys.argv``, the console script's entry function, an uncaught exception
printed with exit code 1, atexit handlers run). ``test_fork_runner_catches_a_traceback_and_a_write``
proves that a case raising or writing a file fails the promise through the same path, and
``test_fork_agrees_with_a_real_process`` runs some cases both ways and compares.

``docs/hostile-input.md`` is generated from these cases and their actual messages::

    KRONOS_UPDATE_DOCS=1 python -m pytest -q tests/test_hostile_input.py -k docs

and ``test_docs_table_is_current`` fails when it is stale.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tiny_runs
from commands import CONSOLE_SCRIPT, entry_of
from tiny_runs import run_dir

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "hostile-input.md"
SECRETS = {
    "COMET_API_KEY": "cometkey-HOSTILE-SHOULD-NOT-LEAK-31",
    "MLFLOW_TRACKING_PASSWORD": "mlflowpass-HOSTILE-SHOULD-NOT-LEAK-32",
    "MLFLOW_TRACKING_TOKEN": "mlflowtoken-HOSTILE-SHOULD-NOT-LEAK-33",
}
CONFIG_SECRET = "sk-live-CONFIG-SECRET-987654"
FLAG_SECRET = "tok-FLAG-SECRET-123456"
URI_PASSWORD = "uri-PASSWORD-SECRET-2468"
NEVER_PRINTED = [*SECRETS.values(), CONFIG_SECRET, FLAG_SECRET, URI_PASSWORD]

TINY = {**tiny_runs.TINY, "comet": "off"}
DATES = {
    "dataset_begin_time": "2020-01-01", "dataset_end_time": "2021-12-31", "instrument": "csi300",
    "train_time_range": "2020-01-01:2021-06-30", "val_time_range": "2021-05-01:2021-09-30",
    "test_time_range": "2021-09-01:2021-12-31",
}


# ----------------------------------------------------------------------------- hostile files


def _write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def _checkpoint(inp: Path, name: str, ws: Path) -> Path:
    """A copy of the workspace's good best_model, to be damaged."""
    src = run_dir(ws / "outputs") / "checkpoints" / "best_model"
    dst = inp / name
    shutil.copytree(src, dst)
    return dst


def make_truncated_weights(inp: Path, ws: Path) -> None:
    path = _checkpoint(inp, "truncated_ckpt", ws) / "model.safetensors"
    path.write_bytes(path.read_bytes()[:1000])


def make_good_and_truncated(inp: Path, ws: Path) -> None:
    """A good checkpoint (a copy of the workspace's best_model) beside a truncated one."""
    _checkpoint(inp, "good_ckpt", ws)
    make_truncated_weights(inp, ws)


def make_int_weights(inp: Path, ws: Path) -> None:
    import json as _json

    ckpt = _checkpoint(inp, "int_ckpt", ws)
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = _json.loads(data[8:8 + n])
    name = "embed.weight"
    header[name]["dtype"] = "I32"  # same byte size as F32: only the dtype is wrong
    raw = _json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


def make_huge_config_json(inp: Path, ws: Path) -> None:
    import json as _json

    ckpt = _checkpoint(inp, "huge_ckpt", ws)
    config = _json.loads((ckpt / "config.json").read_text())
    config.update({"d_model": 65536, "n_heads": 64, "ff_dim": 262144, "n_enc_layers": 64, "n_dec_layers": 64})
    (ckpt / "config.json").write_text(_json.dumps(config))


def make_non_utf8_config_json(inp: Path, ws: Path) -> None:
    ckpt = _checkpoint(inp, "latin1_ckpt", ws)
    (ckpt / "config.json").write_bytes(b'{"d_model": 16, "note": "caf\xe9"}')


def make_pickle_only(inp: Path, ws: Path) -> None:
    ckpt = _checkpoint(inp, "pickle_ckpt", ws)
    (ckpt / "model.safetensors").unlink()
    _write(ckpt / "pytorch_model.bin", b"\x80\x04\x95 pickled weights would run code on load")


def _market_copy(inp: Path, ws: Path, name: str) -> Path:
    dst = inp / name
    shutil.copytree(ws.parent.parent.parent / "market", dst)  # <root>/market, shared read-only
    return dst


def make_market_without_calendar(inp: Path, ws: Path) -> None:
    (_market_copy(inp, ws, "no_calendar") / "calendars" / "day.txt").unlink()


def make_market_bad_calendar(inp: Path, ws: Path) -> None:
    _write(_market_copy(inp, ws, "bad_calendar") / "calendars" / "day.txt", b"2020-01-01\n\xff\xfe\x00\x01 not a date\n")


def make_market_truncated_bin(inp: Path, ws: Path) -> None:
    market = _market_copy(inp, ws, "short_bins")
    for path in (market / "features").rglob("close.day.bin"):
        path.write_bytes(path.read_bytes()[:6])  # not a whole float32


CSV_HEADER = "date,open,high,low,close,volume\n"


def make_csvs(inp: Path, ws: Path) -> None:
    _write(inp / "missing_col.csv", "date,open,high,low,volume\n2024-01-02,1,2,0.5,100\n")
    _write(inp / "not_number.csv", CSV_HEADER + "2024-01-02,1,2,0.5,1.5,100\n2024-01-03,1,2,0.5,abc,100\n")
    _write(inp / "latin1.csv", (CSV_HEADER + "2024-01-02,1,2,0.5,1.5,100\n").encode() + b"2024-01-03,1,2,0.5,1.5,\xe9\xe9\n")
    _write(inp / "empty.csv", b"")
    _write(inp / "bad_date.csv", CSV_HEADER + "2024-01-02,1,2,0.5,1.5,100\n31/02/2024x,1,2,0.5,1.5,100\n")
    _write(inp / "dup_day.csv", CSV_HEADER + "2024-01-02,1,2,0.5,1.5,100\n2024-01-02,1,2,0.5,1.6,100\n")
    _write(inp / "good.csv", CSV_HEADER + "2024-01-02,1,2,0.5,1.5,100\n2024-01-03,1,2,0.5,1.6,100\n")
    _write(inp / "two_zones.csv", CSV_HEADER + "2024-01-02T09:30:00+08:00,1,2,0.5,1.5,100\n"
           "2024-01-03T09:30:00+09:00,1,2,0.5,1.6,100\n")
    _write(inp / "zone_and_none.csv", CSV_HEADER + "2024-01-02 09:30:00+08:00,1,2,0.5,1.5,100\n"
           "2024-01-02 09:35:00,1,2,0.5,1.6,100\n")
    _write(inp / "offsets_no_zone.csv", CSV_HEADER + "2024-01-02 00:00:00-05:00,1,2,0.5,1.5,100\n"
           "2024-01-03 00:00:00-04:00,1,2,0.5,1.6,100\n")  # -04:00 in January: no zone's daylight saving
    _write(inp / "epoch_two_units.csv", CSV_HEADER + "1704067200,1,2,0.5,1.5,100\n1704153600000,1,2,0.5,1.6,100\n")
    _write(inp / "epoch_no_unit.csv", CSV_HEADER + "15000000000,1,2,0.5,1.5,100\n15000086400,1,2,0.5,1.6,100\n")
    _write(inp / "epoch_huge.csv", CSV_HEADER + "99999999999999999999999,1,2,0.5,1.5,100\n")
    _write(inp / "two_date_orders.csv", CSV_HEADER + "01/02/2024,1,2,0.5,1.5,100\n13/02/2024,1,2,0.5,1.6,100\n")


def make_configs(inp: Path, ws: Path) -> None:
    _write(inp / "latin1.yaml", b"epochs: 3\nrun_name: caf\xe9\n")
    _write(inp / "list.yaml", "- epochs\n- 3\n")
    _write(inp / "broken.yaml", "epochs: [1, 2\n")
    _write(inp / "secret.yaml", f"epochs: 2\ncomet_api_key: {CONFIG_SECRET}\n")
    _write(inp / "typo.yaml", "epoch: 3\n")
    _write(inp / "huge.yaml", "d_model: 16384\nn_heads: 64\nff_dim: 65536\nn_enc_layers: 64\nn_dec_layers: 64\n")
    _write(inp / "space.yaml", b"learning_rate: {low: 1.0e-5, high: \xff\xfe}\n")
    _write(inp / "spool.jsonl", b'{"type": "header", "format": "kronos-mlflow-spool", "run_id": "\xff"}\n')
    _write(inp / "nan.yaml", "clip: .nan\n")
    _write(inp / "space_high.yaml", "learning_rate: {low: 1.0e-5, high: 10.0}\nweight_decay: {low: 0.01, high: 0.2}\n")
    _write(inp / "space_mode.yaml", "learning_rate: {low: 1.0e-5, high: 1.0e-3}\nweight_decay: {low: 0.01, high: 0.2}\n"
                                    "finetune_mode: {choices: [full, half]}\n")
    _write(inp / "space_deep.yaml", "learning_rate: {low: 1.0e-5, high: 1.0e-3}\nweight_decay: {low: 0.01, high: 0.2}\n"
                                    "finetune_mode: {choices: [full, freeze]}\nfreeze_layers: {low: 0, high: 9}\n")
    make_yaml_traps(inp)
    # the pipeline's config: the workspace's sizes, dates and folders (the time ranges are its flags)
    import json as _json

    values = {**TINY, "dataset_begin_time": DATES["dataset_begin_time"], "dataset_end_time": DATES["dataset_end_time"],
              "dataset_path": str(ws / "cache"), "save_path": str(ws / "outputs")}
    stage2 = "".join(f"{k}: {_json.dumps(v)}\n" for k, v in values.items())  # quoted: YAML reads off as false
    _write(inp / "stage2.yaml", stage2)
    _write(inp / "stage2_context.yaml", stage2 + "max_context: 16\n")
    _write(inp / "stage2_backtest.yaml", stage2 + f"backtest_time_range: {NO_SIGNAL}\n")


#: 342 bytes whose aliases expand to 9**9 strings ("billion laughs"): before the event check, such
#: a file took tens of seconds and gigabytes of memory, then printed hundreds of megabytes.
ALIAS_BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
LONG_VALUE = "0" * 300  # never echoed back whole


def make_yaml_traps(inp: Path) -> None:
    """YAML that the reader refuses on its event stream (kronos_mlflow/config/yamlfile.py), and the seeds
    tests/test_config_properties.py found."""
    _write(inp / "bomb.yaml", ALIAS_BOMB)
    _write(inp / "list_key.yaml", "epochs: 2\n? [a, b]\n: 1\n")
    _write(inp / "map_key.yaml", "{a: 1}: x\n")
    _write(inp / "tag.yaml", "run_name: !!python/object/apply:os.system [echo hi]\n")
    _write(inp / "int_key.yaml", "epochs: 2\n1: x\n")
    _write(inp / "deep.yaml", "feature_list: " + "[" * 40 + "]" * 40 + "\n")
    _write(inp / "digits.yaml", "epochs: " + "9" * 5000 + "\n")
    _write(inp / "timestamp.yaml", "backtest_time_range: [2020-13-45, 2021-01-01]\n")
    _write(inp / "two_docs.yaml", "epochs: 2\n---\nepochs: 3\n")
    _write(inp / "long_value.yaml", f'adamw_impl: "{LONG_VALUE}"\n')
    _write(inp / "two_names.yaml", "learning_rate: 1.0e-4\ntokenizer_learning_rate: 2.0e-4\n")
    _write(inp / "space_tag.yaml", "learning_rate: !!set {low: 1.0e-5, high: 1.0e-3}\nweight_decay: {low: 0.01, high: 0.2}\n")
    _write(inp / "space_long_key.yaml", "learning_rate: {low: 1.0e-5, high: 1.0e-3}\nweight_decay: {low: 0.01, high: 0.2}\n"
           + "x" * 300 + ": {low: 1, high: 2}\n")


def make_nan_weights(inp: Path, ws: Path) -> None:
    """A checkpoint whose weights are all NaN (a diverged run's), same layout and dtypes."""
    import safetensors.torch
    import torch

    path = _checkpoint(inp, "nan_ckpt", ws) / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    tensors = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in tensors.items()}
    safetensors.torch.save_file(tensors, str(path), metadata={"format": "pt"})


def make_inf_weight(inp: Path, ws: Path) -> None:
    """One infinite value in one weight."""
    import safetensors.torch

    path = _checkpoint(inp, "inf_ckpt", ws) / "model.safetensors"
    tensors = safetensors.torch.load_file(str(path))
    tensors["head.weight"].view(-1)[3] = float("inf")
    safetensors.torch.save_file(tensors, str(path), metadata={"format": "pt"})


def _calendar_lines(market: Path) -> list[str]:
    return (market / "calendars" / "day.txt").read_text().splitlines()


def make_market_calendar_repeat(inp: Path, ws: Path) -> None:
    market = _market_copy(inp, ws, "cal_repeat")
    lines = _calendar_lines(market)
    _write(market / "calendars" / "day.txt", "\n".join(lines[:5] + [lines[4]] + lines[5:]) + "\n")


def make_market_calendar_unsorted(inp: Path, ws: Path) -> None:
    market = _market_copy(inp, ws, "cal_unsorted")
    lines = _calendar_lines(market)
    _write(market / "calendars" / "day.txt", "\n".join([lines[1], lines[0]] + lines[2:]) + "\n")


def make_market_span_reversed(inp: Path, ws: Path) -> None:
    market = _market_copy(inp, ws, "span_reversed")
    path = market / "instruments" / "csi300.txt"
    lines = path.read_text().splitlines()
    sym, a, b = lines[0].split("\t")
    _write(path, "\n".join([f"{sym}\t{b}\t{a}"] + lines[1:]) + "\n")


def make_market_symbol_path(inp: Path, ws: Path) -> None:
    market = _market_copy(inp, ws, "symbol_path")
    path = market / "instruments" / "csi300.txt"
    _write(path, path.read_text() + "../../../etc\t2020-01-01\t2021-12-31\n")


def _first_bin(market: Path, field: str = "close") -> Path:
    return sorted((market / "features").rglob(f"{field}.day.bin"))[0]


def _set_start(path: Path, value: float) -> None:
    import numpy as np

    data = np.fromfile(path, dtype="<f4")
    data[0] = value
    data.tofile(path)


def make_market_start_outside(inp: Path, ws: Path) -> None:
    _set_start(_first_bin(_market_copy(inp, ws, "start_outside")), 99999.0)


def make_market_start_nan(inp: Path, ws: Path) -> None:
    _set_start(_first_bin(_market_copy(inp, ws, "start_nan")), float("nan"))


def make_market_past_end(inp: Path, ws: Path) -> None:
    """A series that starts in the calendar but holds more days than are left in it."""
    import numpy as np

    path = _first_bin(_market_copy(inp, ws, "past_end"))
    data = np.fromfile(path, dtype="<f4")
    np.concatenate([data, np.ones(40, dtype="<f4")]).astype("<f4").tofile(path)


def make_predictor_5_5(inp: Path, ws: Path) -> None:
    """The workspace's tokenizer (4+4 bits) beside a predictor of 5+5 bits, and a pickle-only predictor."""
    import torch

    from kronos_mlflow.model import Kronos

    _checkpoint(inp, "good_ckpt", ws)
    torch.manual_seed(0)
    Kronos(s1_bits=5, s2_bits=5, n_layers=1, d_model=16, n_heads=2, ff_dim=32, ffn_dropout_p=0.0, attn_dropout_p=0.0,
           resid_dropout_p=0.0, token_dropout_p=0.0, learn_te=True).save_pretrained(inp / "pred_5_5")
    _write(inp / "pred_pickle" / "pytorch_model.bin", b"\x80\x04not really a pickle")
    _write(inp / "pred_pickle" / "config.json", "{}")


def make_forecaster(inp: Path, ws: Path) -> None:
    """A forecaster directory (the workspace's tokenizer with a 4+4-bit predictor), the same two
    swapped, and make_predictor_5_5's checkpoints (for the zero-shot pair)."""
    import torch

    from kronos_mlflow.model import Kronos

    make_predictor_5_5(inp, ws)
    torch.manual_seed(0)
    Kronos(s1_bits=4, s2_bits=4, n_layers=1, d_model=16, n_heads=2, ff_dim=32, ffn_dropout_p=0.0, attn_dropout_p=0.0,
           resid_dropout_p=0.0, token_dropout_p=0.0, learn_te=True).save_pretrained(inp / "pair" / "predictor")
    shutil.copytree(inp / "good_ckpt", inp / "pair" / "tokenizer")
    shutil.copytree(inp / "pair" / "predictor", inp / "swapped" / "tokenizer")
    shutil.copytree(inp / "pair" / "tokenizer", inp / "swapped" / "predictor")


#: damaged calibrators a forecaster may carry (``calibrator/calibrator.json`` next to its
#: checkpoints): the case's name -> an edit of a good one's JSON, or bytes
CALIBRATOR_DAMAGE = {
    "rate": lambda good: {**good, "base_rate": 5},
    "json": lambda good: b"{not json",
    "range": lambda good: {**good, "time_range": ["last spring", "2021-08-31T00:00:00"]},
    "origins": lambda good: json.dumps(good).replace('"origins": 40', '"origins": 1e400').encode(),
}


def make_damaged_calibrators(inp: Path, ws: Path) -> None:
    """make_forecaster's pair, and a copy of it per :data:`CALIBRATOR_DAMAGE` carrying that
    damaged calibrator: ``cal_<name>``."""
    import numpy as np

    from kronos_mlflow.serving.forecasting.quantiles import Calibrator

    make_forecaster(inp, ws)
    good = Calibrator(np.full((6, 5), 0.5), np.array([0.0, 1.0]), np.array([0.3, 0.7]), 40, 0.5,
                      ("2021-05-01T00:00:00", "2021-08-31T00:00:00")).to_json()
    for name, damage in CALIBRATOR_DAMAGE.items():
        shutil.copytree(inp / "pair", inp / f"cal_{name}")
        value = damage(good)
        _write(inp / f"cal_{name}" / "calibrator" / "calibrator.json",
               value if isinstance(value, bytes) else json.dumps(value))


def make_fifo(inp: Path, ws: Path) -> None:
    os.mkfifo(inp / "fifo.yaml")


def _run_named(ws: Path, name: str) -> str:
    """The id of the workspace store's run called ``name`` (read with sqlite3: no MLflow import)."""
    import sqlite3

    con = sqlite3.connect(f"file:{ws / 'mlflow.db'}?mode=ro", uri=True)
    try:
        return con.execute("SELECT run_uuid FROM runs WHERE name = ?", (name,)).fetchone()[0]
    finally:
        con.close()


def finished_run_id(ws: Path) -> str:
    """The workspace store's FINISHED run, owned as a training leaves it."""
    return _run_named(ws, "finished")


def stopped_run_id(ws: Path) -> str:
    """The workspace store's KILLED run, owned by a training whose files are elsewhere."""
    return _run_named(ws, "stopped")


def _owner_token(ws: Path) -> str:
    """The FINISHED run's own token, from its run directory's owner.json."""
    import json as _json

    return _json.loads((run_dir(ws / "outputs") / "owner.json").read_text())["token"]


HIJACK_VARIANTS = {  # save folder -> (run named, token held): states a colleague might hand over
    "s_finished": ("finished", "own"), "s_forged": ("finished", "forged"), "s_none": ("finished", None),
    "s_unknown": ("unknown", "own"),
}


def make_hijack_states(inp: Path, ws: Path) -> None:
    """Training states, each in the run directory of the case's config (``--save-path
    {in}/<variant> --epochs 3``, the digest rewritten to match), naming the workspace's FINISHED
    run (or a run the store lacks) with its own token, a forged one or none."""
    import json as _json

    from kronos_mlflow.config.core import load_config
    from kronos_mlflow.config.digest import config_digest
    from kronos_mlflow.config.layout import RunLayout

    source = run_dir(ws / "outputs") / "checkpoints" / "last"
    for folder, (run, token) in HIJACK_VARIANTS.items():
        config = load_config({**TINY, **DATES, "qlib_data_path": str(ws.parent.parent.parent / "market"),
                              "dataset_path": str(ws / "cache"), "save_path": str(inp / folder), "epochs": 3})
        target = RunLayout.of(config, 1).training_state
        shutil.copytree(source, target)
        state = _json.loads((target / "state.json").read_text())
        state["config_digest"] = config_digest(config, world_size=1)
        state["run_ids"] = {"mlflow_run_id": finished_run_id(ws) if run == "finished" else "0123456789abcdef" * 2,
                            **({} if token is None else {"owner_token": _owner_token(ws) if token == "own" else "f" * 64})}
        (target / "state.json").write_text(_json.dumps(state))


_HELD: list = []  # locks this test process holds while the cases run (another live writer)


def make_busy_directory(inp: Path, ws: Path) -> None:
    """The run directory of the case's config, held by a live process (this one)."""
    from kronos_mlflow.config.core import load_config
    from kronos_mlflow.config.layout import RunLayout
    from kronos_mlflow.runtime.runlock import WRITER_LOCK, hold

    config = load_config({**TINY, **DATES, "qlib_data_path": str(ws.parent.parent.parent / "market"),
                          "dataset_path": str(ws / "cache"), "save_path": str(inp / "busy")})
    _HELD.append(hold(RunLayout.of(config, 1).root / WRITER_LOCK, "test"))


def make_busy_out(inp: Path, ws: Path) -> None:
    """An ``--out`` folder another live import is writing: this process holds the lock an import
    takes (``flock`` on the folder)."""
    import fcntl

    folder = inp / "volume"
    folder.mkdir()
    fd = os.open(folder, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _HELD.append(fd)


def _spool(folder: Path, run_id: str, records: list[dict], experiment_id: str = "0", name: str | None = None,
           token: str | None = None) -> Path:
    import json as _json

    header = {"type": "header", "format": "kronos-mlflow-spool", "version": 1, "run_id": run_id,
              "experiment_id": experiment_id, "tracking_uri": "sqlite:///elsewhere.db",
              **({"owner_token": token} if token else {})}
    lines = [_json.dumps(header)] + [_json.dumps(r) for r in records]
    return _write(folder / (name or f"{run_id}.jsonl"), "\n".join(lines) + "\n")


def make_spools(inp: Path, ws: Path) -> None:
    """Hand-made spools naming the workspace's FINISHED run: what a colleague might hand over."""
    run_id = finished_run_id(ws)
    metric = {"type": "metric", "key": "best_val_loss", "value": 0.01, "step": 7, "timestamp": 1}
    _spool(inp / "sp_outside", run_id, [metric, {"type": "artifact", "local_path": "/etc/hostname",
                                                 "artifact_path": None},
                                        {"type": "terminate", "status": "FAILED", "end_time": 1}])
    _write(inp / "sp_dotdot" / "secret.txt", "not the spool's\n")
    _spool(inp / "sp_dotdot" / "sub", run_id, [{"type": "artifact", "local_path": "../secret.txt",
                                               "artifact_path": None}])
    _spool(inp / "sp_status", run_id, [metric, {"type": "terminate", "status": "FAILED", "end_time": 1}],
           token=_owner_token(ws))  # the run's own token: refused for being FINISHED
    _spool(inp / "sp_experiment", run_id, [metric], experiment_id="7")
    _spool(inp / "sp_renamed", run_id, [metric], name="from-a-colleague.jsonl")
    _spool(inp / "sp_key", run_id, [{**metric, "key": "../../x"}])
    stopped = stopped_run_id(ws)  # a stopped run another training owns: its token is not here
    _spool(inp / "sp_no_token", stopped, [metric])
    _spool(inp / "sp_forged_token", stopped, [metric], token="e" * 64)
    _spool(inp / "sp_parent", stopped, [{"type": "tag", "key": "mlflow.parentRunId", "value": run_id}], token="e" * 64)
    _spool(inp / "sp_owner", stopped, [{"type": "tag", "key": "kronos.owner", "value": "sha256:00"}], token="e" * 64)
    _spool(inp / "sp_rename_run", stopped, [{"type": "tag", "key": "mlflow.runName", "value": "mine now"}],
           token="e" * 64)


def make_handover_runs(inp: Path, ws: Path) -> None:
    """One-fold walk-forward parents in the workspace's store (tests/handover_runs.py), each with
    one handed-over file damaged, what a colleague's parent may hold: ``handover_<kind>_parent``
    (the artifacts in the case's input directory, outside the hashed workspace)."""
    import handover_runs as hr
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{ws / 'mlflow.db'}")
    experiment = client.create_experiment("handover", artifact_location=(inp / "artifacts").as_uri())
    path_like, extra = hr.folds_table(), hr.folds_table()
    path_like["folds"][0]["fold"] = "../../outside"  # with the plan tag that matches it
    extra["folds"][0]["surprise"] = 1
    origins, forecasts = hr.tables()
    for name, damage in {"path": {"folds_json": path_like}, "json": {"folds_json": b"{not json"},
                         "key": {"folds_json": extra}, "origins": {"origins": b"origins, as CSV\n"},
                         "forecasts": {"forecasts": forecasts.assign(step=forecasts["step"] + 0.5)}}.items():
        hr.log_walkforward(client, experiment, inp / "staging", f"handover_{name}", **damage)


#: The workspace store's runs a case may name, as the docs show their ids: ``<NAME-run-id>``
#: (with those named ``handover_...``, :func:`make_handover_runs`).
NAMED_RUNS = ("finished", "stopped", "running", "deleted", "elsewhere", "busy")


def _named_runs(ws: Path) -> dict[str, str]:
    """The ids of the workspace store's :data:`NAMED_RUNS` and ``handover_...`` runs, read at
    once: name -> id."""
    import sqlite3

    con = sqlite3.connect(f"file:{ws / 'mlflow.db'}?mode=ro", uri=True)
    try:
        runs: dict[str, str] = {}
        for name, run_id in con.execute("SELECT name, run_uuid FROM runs"):
            if name in NAMED_RUNS or name.startswith("handover_"):
                runs.setdefault(name, run_id)
    finally:
        con.close()
    assert set(NAMED_RUNS) <= set(runs), runs
    return runs


def make_all(inp: Path, ws: Path) -> None:
    """Every hostile file, in the case's own input directory (outside the hashed workspace)."""
    make_configs(inp, ws)
    make_csvs(inp, ws)
    _write(inp / "a_file", "not a directory\n")
    (inp / "empty_dir").mkdir()


# ----------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    id: str
    area: str
    what: str  # the hostile input, in words (the docs table)
    argv: tuple[str, ...]  # placeholders: {ws} workspace, {in} inputs, {py} python
    needle: str  # the bad value, named in the message
    make: Callable[[Path, Path], None] | None = None
    env: dict[str, str] = field(default_factory=dict)


#: A backtest range before the test range: no day with a signal.
NO_SIGNAL = "2020-01-01:2020-03-01"
#: A test range too short for one lookback_window + predict_window: no forecast origin.
NO_ORIGIN = "2021-12-10:2021-12-31"
UNKNOWN_RUN = "0123456789abcdef0123456789abcdef"

TRAIN = ("{py}", "-m", "kronos_mlflow.train", "--check")
TRAIN_RUN = ("{py}", "-m", "kronos_mlflow.train")  # the training itself: it must refuse as --check does
PREDICT = ("{py}", "-m", "kronos_mlflow.train_predictor", "--check")
CLI = ("kronos-mlflow",)  # the console script
SWEEP = ("{py}", str(ROOT / "sweeps" / "sweep.py"))
MLPROJECT = ("<mlproject>",)
PIPELINE = CLI + ("pipeline", "--qlib-data-path", "{market}")
WALKFORWARD = CLI + ("walk-forward", "--qlib-data-path", "{market}")


def _flags(values: dict) -> tuple[str, ...]:
    out: list[str] = []
    for key, value in values.items():
        out += [f"--{key.replace('_', '-')}", str(value)]
    return tuple(out)


BASE = _flags({**TINY, **DATES, "qlib_data_path": "{market}", "dataset_path": "{ws}/cache",
               "save_path": "{ws}/outputs"})
#: The stage-two doors on the workspace's market and sizes: the pipeline (sizes in its config
#: file, the data its flags), the predictor sweep and the scorecard of a forecaster directory.
RANGES = _flags({k: v for k, v in DATES.items() if not k.startswith("dataset_")})
STAGE2 = PIPELINE + ("--config", "{in}/stage2.yaml") + RANGES
SWEEP2 = SWEEP + ("--stage", "predictor") + BASE
EVAL2 = CLI + ("evaluate", "--model", "{in}/pair") + BASE

#: Every door of the store gate (kronos_mlflow.tracking.gate.DOORS), as a user runs it: the command
#: itself (not only --check) and its make. ``test_every_door_is_attacked`` keeps it complete.
DOOR_COMMANDS: dict[str, tuple[tuple[str, ...], Callable | None]] = {
    "train": (TRAIN_RUN + BASE + ("--save-path", "{in}/fresh"), None),
    "train-predictor": (("{py}", "-m", "kronos_mlflow.train_predictor") + BASE
                        + ("--tokenizer", "{in}/good_ckpt", "--save-path", "{in}/fresh"), make_predictor_5_5),
    "evaluate": (EVAL2, make_forecaster),
    "pipeline": (STAGE2, None),
    "walk-forward": (WALKFORWARD + ("--config", "{in}/stage2.yaml") + RANGES, None),
    "sweep": (SWEEP + BASE, None),
}
#: MLFLOW_RUN_ID naming a run no command may write: (the run's name in the workspace, the needle, in words).
HOSTILE_RUNS = (("finished", "FINISHED", "a FINISHED run"), ("deleted", "deleted", "a deleted run"),
                ("elsewhere", "in experiment", "a run of another experiment"),
                ("busy", "already holds", "a colleague's RUNNING run holding metrics and a note"))
DOOR_CASES = [
    *(Case(f"gate-{door}-{name}", "gate", f"`MLFLOW_RUN_ID` of {words}, for `{door}`", argv, needle, make=make,
           env={"MLFLOW_RUN_ID": "{" + name + "}"})
      for door, (argv, make) in DOOR_COMMANDS.items() for name, needle, words in HOSTILE_RUNS),
    *(Case(f"gate-mlproject-{entry}", "gate", f"`MLFLOW_RUN_ID` of a FINISHED run, for `mlflow run . -e {entry}`",
           (f"<mlproject:{entry}>", "model={in}/pair", "tokenizer={in}/good_ckpt",
            f"search_space={ROOT / 'sweeps' / 'search_space.yaml'}"), "FINISHED", make=make_forecaster,
           env={"MLFLOW_RUN_ID": "{finished}"})
      for entry in ("main", "predictor", "evaluate", "pipeline", "walkforward", "sweep")),
    Case("gate-pipeline-check", "gate", "`MLFLOW_RUN_ID` of a FINISHED run, `pipeline --check`",
         STAGE2 + ("--check",), "FINISHED", env={"MLFLOW_RUN_ID": "{finished}"}),
    Case("gate-sweep-check", "gate", "`MLFLOW_RUN_ID` of a deleted run, `sweep --check`", SWEEP + BASE + ("--check",),
         "deleted", env={"MLFLOW_RUN_ID": "{deleted}"}),
    Case("gate-aggregate-deleted", "gate", "`walk-forward --aggregate <a deleted run>`",
         CLI + ("walk-forward", "--aggregate", "{deleted}"), "deleted"),
    Case("gate-aggregate-not-a-parent", "gate", "`walk-forward --aggregate <a training run>` (not a walk-forward parent)",
         CLI + ("walk-forward", "--aggregate", "{finished}"), "not a walk-forward parent"),
    Case("gate-parent-deleted-check", "gate", "`walk-forward --parent-run-id <a deleted run> --check`",
         WALKFORWARD + ("--config", "{in}/stage2.yaml") + RANGES + ("--folds", "1", "--fold-length", "2M",
                                                                   "--parent-run-id", "{deleted}", "--check"),
         "deleted"),
    Case("gate-run-id-path", "gate", "`MLFLOW_RUN_ID=../../etc` (not a run id)", STAGE2, "'../../etc'",
         env={"MLFLOW_RUN_ID": "../../etc"}),
]

CASES: list[Case] = [
    # --- command-line flags (python -m kronos_mlflow.train --check / kronos-mlflow train --check)
    Case("flag-epochs-zero", "flag", "`--epochs 0`", TRAIN + BASE + ("--epochs", "0"), "epochs"),
    Case("flag-lr-text", "flag", "`--learning-rate fast`", TRAIN + BASE + ("--learning-rate", "fast"), "'fast'"),
    Case("flag-weight-decay-nan", "flag", "`--weight-decay nan`", TRAIN + BASE + ("--weight-decay", "nan"), "nan"),
    Case("flag-unknown", "flag", "`--no-such-key 1`", TRAIN + BASE + ("--no-such-key", "1"), "--no-such-key"),
    Case("finetune-lora-rank-zero", "flag", "`--finetune-mode lora --lora-rank 0`",
         TRAIN + BASE + ("--finetune-mode", "lora", "--lora-rank", "0"), "lora_rank"),
    Case("finetune-lora-alpha-negative", "flag", "`--finetune-mode lora --lora-alpha -1`",
         TRAIN + BASE + ("--finetune-mode", "lora", "--lora-alpha", "-1"), "lora_alpha"),
    Case("finetune-lora-targets-none", "flag", "`--finetune-mode lora --lora-targets nowhere`",
         TRAIN + BASE + ("--finetune-mode", "lora", "--lora-targets", "nowhere"), "nowhere"),
    Case("finetune-freeze-too-deep", "flag", "`--finetune-mode freeze --freeze-layers 9` (a fresh model of 2 blocks)",
         TRAIN + BASE + ("--finetune-mode", "freeze", "--freeze-layers", "9"), "freeze_layers"),
    Case("flag-secret", "flag", "`--comet-api-key <secret>` (a credential on the command line)",
         TRAIN + BASE + ("--comet-api-key", FLAG_SECRET), "--comet-api-key"),
    Case("flag-range-inverted", "flag", "`--train-time-range 2021-06-30:2020-01-01`",
         CLI + ("train", "--check") + BASE + ("--train-time-range", "2021-06-30:2020-01-01"), "2021-06-30"),
    Case("flag-device", "flag", "`--device tpu`", TRAIN + BASE + ("--device", "tpu"), "'tpu'"),
    Case("flag-accumulation", "flag", "`--batch-size 8 --accumulation-steps 3`",
         TRAIN + BASE + ("--accumulation-steps", "3"), "accumulation_steps 3"),
    Case("flag-gigabytes", "flag", "`--d-model 16384 --ff-dim 65536 --n-enc-layers 64 ...` (terabytes to train)",
         TRAIN + BASE + ("--d-model", "16384", "--n-heads", "64", "--ff-dim", "65536", "--n-enc-layers", "64",
                         "--n-dec-layers", "64"), "parameters"),
    # --- MLproject parameters (the `main` entry point's check command, as `mlflow run` renders it)
    Case("mlproject-date", "MLproject", "`-P train_time_range=2020-02-30:2021-01-01`",
         MLPROJECT + ("train_time_range=2020-02-30:2021-01-01",), "2020-02-30"),
    Case("mlproject-comet", "MLproject", "`-P comet=maybe`", MLPROJECT + ("comet=maybe",), "'maybe'"),
    Case("mlproject-instrument", "MLproject", "`-P instrument=../../etc/passwd`",
         MLPROJECT + ("instrument=../../etc/passwd",), "../../etc/passwd"),
    Case("mlproject-config-missing", "MLproject", "`-P config_file=/nonexistent/run.yaml`",
         MLPROJECT + ("config_file=/nonexistent/run.yaml",), "/nonexistent/run.yaml"),
    Case("mlproject-checkpoint", "MLproject", "`-P pretrained_tokenizer_path=<truncated checkpoint>`",
         MLPROJECT + ("pretrained_tokenizer_path={in}/truncated_ckpt",), "model.safetensors",
         make=make_truncated_weights),
    # --- config files
    Case("config-not-utf8", "config file", "YAML file with Latin-1 bytes",
         TRAIN + BASE + ("--config", "{in}/latin1.yaml"), "latin1.yaml"),
    Case("config-not-mapping", "config file", "YAML file holding a list", TRAIN + BASE + ("--config", "{in}/list.yaml"),
         "list.yaml"),
    Case("config-invalid-yaml", "config file", "YAML with an unclosed `[`",
         TRAIN + BASE + ("--config", "{in}/broken.yaml"), "broken.yaml"),
    Case("config-secret", "config file", "`comet_api_key: <secret>` in the YAML",
         TRAIN + BASE + ("--config", "{in}/secret.yaml"), "comet_api_key"),
    Case("config-typo", "config file", "`epoch: 3` (typo)", TRAIN + BASE + ("--config", "{in}/typo.yaml"), "'epoch'"),
    Case("config-gigabytes", "config file", "sizes giving 5.4e11 parameters (terabytes to train)",
         TRAIN + ("--config", "{in}/huge.yaml") + _flags({**DATES, "qlib_data_path": "{market}"}), "parameters"),
    # --- Qlib directories
    Case("qlib-missing", "Qlib dir", "`--qlib-data-path` that does not exist",
         TRAIN + BASE + ("--qlib-data-path", "{in}/no_such_market"), "no_such_market"),
    Case("qlib-file", "Qlib dir", "`--qlib-data-path` naming a file", TRAIN + BASE + ("--qlib-data-path", "{in}/a_file"),
         "a_file"),
    Case("qlib-empty", "Qlib dir", "an empty directory", TRAIN + BASE + ("--qlib-data-path", "{in}/empty_dir"),
         "empty_dir"),
    Case("qlib-no-calendar", "Qlib dir", "no calendars/day.txt",
         TRAIN + BASE + ("--qlib-data-path", "{in}/no_calendar"), "calendars/day.txt", make=make_market_without_calendar),
    Case("qlib-bad-calendar", "Qlib dir", "calendars/day.txt with binary garbage",
         TRAIN + BASE + ("--qlib-data-path", "{in}/bad_calendar"), "day.txt", make=make_market_bad_calendar),
    Case("qlib-truncated-bin", "Qlib dir", "features/*/close.day.bin cut to 6 bytes",
         TRAIN + BASE + ("--qlib-data-path", "{in}/short_bins"), "close.day.bin", make=make_market_truncated_bin),
    Case("qlib-instrument", "Qlib dir", "`--instrument nasdaq` (not in instruments/)",
         TRAIN + BASE + ("--instrument", "nasdaq"), "nasdaq"),
    # --- CSV files (kronos-mlflow import-csv)
    Case("csv-missing-column", "CSV", "no `close` column",
         CLI + ("import-csv", "{in}/missing_col.csv", "--out", "{ws}/imported"), "close"),
    Case("csv-not-number", "CSV", "`abc` in the close column",
         CLI + ("import-csv", "{in}/not_number.csv", "--out", "{ws}/imported"), "'abc'"),
    Case("csv-not-utf8", "CSV", "Latin-1 bytes in a cell",
         CLI + ("import-csv", "{in}/latin1.csv", "--out", "{ws}/imported"), "latin1.csv"),
    Case("csv-empty", "CSV", "an empty file", CLI + ("import-csv", "{in}/empty.csv", "--out", "{ws}/imported"),
         "empty.csv"),
    Case("csv-bad-date", "CSV", "`31/02/2024x` as a date",
         CLI + ("import-csv", "{in}/bad_date.csv", "--out", "{ws}/imported"), "31/02/2024x"),
    Case("csv-duplicate-day", "CSV", "two rows for one day",
         CLI + ("import-csv", "{in}/dup_day.csv", "--out", "{ws}/imported"), "2024-01-02"),
    Case("csv-out-is-checkpoints", "CSV", "`--out` pointing at the existing outputs",
         CLI + ("import-csv", "{in}/good.csv", "--out", "{ws}/outputs"), "outputs"),
    Case("csv-out-being-written", "CSV", "`--out` a folder another import is writing (two started together)",
         CLI + ("import-csv", "{in}/good.csv", "--out", "{in}/volume"), "volume", make=make_busy_out),
    # --- checkpoints (--pretrained-tokenizer-path)
    Case("ckpt-truncated", "checkpoint", "model.safetensors cut to 1000 bytes",
         TRAIN + BASE + ("--pretrained-tokenizer-path", "{in}/truncated_ckpt"), "model.safetensors",
         make=make_truncated_weights),
    Case("ckpt-wrong-dtype", "checkpoint", "a weight stored as I32",
         TRAIN + BASE + ("--pretrained-tokenizer-path", "{in}/int_ckpt"), "I32", make=make_int_weights),
    Case("ckpt-gigabytes", "checkpoint", "config.json asking for d_model 65536, 64 layers",
         TRAIN + BASE + ("--pretrained-tokenizer-path", "{in}/huge_ckpt"), "config.json", make=make_huge_config_json),
    Case("ckpt-config-not-utf8", "checkpoint", "config.json with a Latin-1 byte",
         TRAIN + BASE + ("--pretrained-tokenizer-path", "{in}/latin1_ckpt"), "config.json",
         make=make_non_utf8_config_json),
    Case("ckpt-pickle-only", "checkpoint", "only pytorch_model.bin (a pickle)",
         TRAIN + BASE + ("--pretrained-tokenizer-path", "{in}/pickle_ckpt"), "pytorch_model.bin",
         make=make_pickle_only),
    # --- sweeps/sweep.py
    Case("sweep-n-trials", "sweep", "`--n-trials 0`", SWEEP + ("--n-trials", "0"), "--n-trials"),
    Case("sweep-pruner", "sweep", "`--pruner sometimes`", SWEEP + ("--pruner", "sometimes"), "sometimes"),
    Case("sweep-folds-word", "sweep", "`--folds two`", SWEEP + ("--folds", "two"), "--folds"),
    Case("sweep-p-threshold", "sweep", "`--folds 3 --p-threshold 1.5`", SWEEP + ("--folds", "3", "--p-threshold", "1.5"),
         "--p-threshold"),
    Case("sweep-wilcoxon-one-window", "sweep", "`--pruner wilcoxon` without `--folds`", SWEEP + ("--pruner", "wilcoxon"),
         "wilcoxon"),
    Case("sweep-folds-epoch-pruner", "sweep", "`--folds 3 --pruner median`", SWEEP + ("--folds", "3", "--pruner", "median"),
         "median"),
    Case("sweep-space-not-utf8", "sweep", "search space with binary bytes",
         SWEEP + ("--search-space", "{in}/space.yaml"), "not UTF-8"),
    Case("sweep-secret-flag", "sweep", "`--mlflow-tracking-token <secret>` passed to training",
         SWEEP + ("--mlflow-tracking-token", FLAG_SECRET), "mlflow_tracking_token"),
    # --- tracking
    Case("tracking-uri-password", "tracking", "`MLFLOW_TRACKING_URI=http://user:<password>@127.0.0.1:9` (down)",
         TRAIN + BASE, "127.0.0.1:9", env={"MLFLOW_TRACKING_URI": f"http://kronos:{URI_PASSWORD}@127.0.0.1:9"}),
    Case("spool-not-utf8", "spool", "a spool file with a non-UTF-8 byte",
         CLI + ("upload-spool", "{in}/spool.jsonl"), "spool.jsonl"),
    Case("spool-missing", "spool", "a spool path that does not exist",
         CLI + ("upload-spool", "{in}/no_such_spool"), "no_such_spool"),
    # ===== numbers the libraries cannot hold, counts beyond memory, non-finite numbers
    Case("flag-seed-2p32", "flag", "`--seed 4294967296` (beyond 32 bits)", TRAIN + BASE + ("--seed", "4294967296"),
         "4294967296"),
    Case("flag-train-iter-huge", "flag", "`--n-train-iter 1e18`", TRAIN + BASE + ("--n-train-iter", "1e18"),
         "n_train_iter"),
    Case("flag-workers-huge", "flag", "`--num-workers 1000000` (a process each)",
         TRAIN + BASE + ("--num-workers", "1000000"), "num_workers"),
    Case("flag-nproc-huge", "flag", "`--nproc-per-node 1000000`", TRAIN + BASE + ("--nproc-per-node", "1000000"),
         "nproc_per_node"),
    Case("flag-lr-huge", "flag", "`--learning-rate 1e308`", TRAIN + BASE + ("--learning-rate", "1e308"), "1e+308"),
    Case("flag-clip-overflow", "flag", "`--clip 1e400` (overflows to inf)", TRAIN + BASE + ("--clip", "1e400"),
         "1e400"),
    Case("flag-metrics-interval", "flag", "`--system-metrics-interval-s 1e-300` (a busy loop)",
         TRAIN + BASE + ("--system-metrics-interval-s", "1e-300"), "1e-300"),
    Case("flag-batch-over-windows", "flag", "`--batch-size 65` with 64 training windows per epoch",
         TRAIN + BASE + ("--batch-size", "65"), "batch_size 65"),
    Case("config-nan", "config file", "`clip: .nan` in the YAML", TRAIN + BASE + ("--config", "{in}/nan.yaml"), "nan"),
    # ===== names MLflow refuses (at the run's start or, for the registry, after the whole training)
    Case("flag-registered-model", "flag", "`--registered-model-name 'a/b:c%'`",
         TRAIN + BASE + ("--registered-model-name", "a/b:c%"), "a/b:c%"),
    Case("mlproject-registered-model", "MLproject", "`-P registered_model_name=a/b:c%`",
         MLPROJECT + ("registered_model_name=a/b:c%",), "a/b:c%"),
    Case("flag-experiment-long", "flag", "`--experiment-name` of 300 characters",
         TRAIN + BASE + ("--experiment-name", "e" * 300), "experiment_name"),
    Case("flag-run-name-long", "flag", "`--run-name` of 300 characters", TRAIN + BASE + ("--run-name", "r" * 300),
         "run_name"),
    Case("tracking-deleted-experiment", "tracking", "`--experiment-name retired` (deleted in the store)",
         TRAIN + BASE + ("--experiment-name", "retired"), "retired"),
    # ===== paths that must be directories, names that must stay inside their parent
    Case("flag-save-path-file", "flag", "`--save-path` naming a regular file",
         TRAIN + BASE + ("--save-path", "{in}/a_file"), "a_file"),
    Case("flag-save-path-under-file", "flag", "`--save-path` under a regular file",
         CLI + ("train", "--check") + BASE + ("--save-path", "{in}/a_file/models"), "a_file"),
    Case("flag-dataset-path-file", "flag", "`--dataset-path` naming a regular file",
         TRAIN + BASE + ("--dataset-path", "{in}/a_file"), "a_file"),
    Case("flag-comet-dir-file", "flag", "`--comet offline --comet-offline-directory` naming a file",
         TRAIN + BASE + ("--comet", "offline", "--comet-offline-directory", "{in}/a_file"), "a_file"),
    Case("flag-folder-escape", "flag", "`--tokenizer-save-folder-name ../../x`",
         TRAIN + BASE + ("--tokenizer-save-folder-name", "../../x"), "../../x"),
    Case("flag-instrument-escape", "flag", "`--instrument ../calendars/day`",
         TRAIN + BASE + ("--instrument", "../calendars/day"), "../calendars/day"),
    Case("prepare-instrument-escape", "Qlib dir", "`kronos-mlflow prepare --instrument ../calendars/day`",
         CLI + ("prepare", "--qlib-data-path", "{market}", "--dataset-path", "{ws}/cache", "--instrument",
                "../calendars/day"), "../calendars/day"),
    Case("csv-instrument-escape", "CSV", "`import-csv --instrument ../x`",
         CLI + ("import-csv", "{in}/good.csv", "--out", "{ws}/imported", "--instrument", "../x"), "../x"),
    # ===== start-of-run refusals --check now finds first
    Case("flag-comet-online-no-key", "flag", "`--comet online` without COMET_API_KEY",
         TRAIN + BASE + ("--comet", "online"), "online", env={"COMET_API_KEY": "", "HOME": "{ws}/home"}),
    Case("flag-resume-must", "flag", "`--resume must` with no saved state for this config",
         TRAIN + BASE + ("--resume", "must", "--epochs", "3"), "resume"),
    Case("mlproject-max-restarts", "MLproject", "`-P max_restarts=abc`", MLPROJECT + ("max_restarts=abc",), "abc"),
    Case("mlproject-nproc", "MLproject", "`-P nproc_per_node=1000000`", MLPROJECT + ("nproc_per_node=1000000",),
         "nproc_per_node"),
    Case("config-dev-zero", "config file", "`--config /dev/zero` (endless)", TRAIN + BASE + ("--config", "/dev/zero"),
         "/dev/zero"),
    Case("config-fifo", "config file", "`--config` naming a FIFO (would block)",
         TRAIN + BASE + ("--config", "{in}/fifo.yaml"), "fifo.yaml", make=make_fifo),
    # ===== data sanity (DATA_SANITY below, in the generated page)
    Case("qlib-calendar-repeat", "Qlib dir", "calendars/day.txt repeats a date",
         TRAIN + BASE + ("--qlib-data-path", "{in}/cal_repeat"), "repeats", make=make_market_calendar_repeat),
    Case("qlib-calendar-unsorted", "Qlib dir", "calendars/day.txt out of order",
         TRAIN + BASE + ("--qlib-data-path", "{in}/cal_unsorted"), "comes before", make=make_market_calendar_unsorted),
    Case("qlib-span-reversed", "Qlib dir", "an instruments line whose start is after its end",
         TRAIN + BASE + ("--qlib-data-path", "{in}/span_reversed"), "after its end", make=make_market_span_reversed),
    Case("qlib-symbol-path", "Qlib dir", "an instruments line whose symbol is `../../../etc`",
         TRAIN + BASE + ("--qlib-data-path", "{in}/symbol_path"), "../../../etc", make=make_market_symbol_path),
    Case("qlib-start-outside", "Qlib dir", "a bin file starting at calendar index 99999",
         TRAIN + BASE + ("--qlib-data-path", "{in}/start_outside"), "99999", make=make_market_start_outside),
    Case("qlib-start-nan", "Qlib dir", "a bin file whose start index is NaN",
         TRAIN + BASE + ("--qlib-data-path", "{in}/start_nan"), "nan", make=make_market_start_nan),
    Case("qlib-past-end", "Qlib dir", "a bin file running past the calendar's last day",
         CLI + ("prepare", "--qlib-data-path", "{in}/past_end", "--dataset-path", "{ws}/cache"), "past the calendar",
         make=make_market_past_end),
    Case("csv-two-zones", "CSV", "timestamps at +08:00 and +09:00 in one file",
         CLI + ("import-csv", "{in}/two_zones.csv", "--out", "{ws}/imported"), "+09:00"),
    Case("csv-offsets-no-daylight-saving", "CSV", "offsets `-05:00` then `-04:00` in January (no zone's daylight "
         "saving: yfinance's moving offsets are imported, these are not)",
         CLI + ("import-csv", "{in}/offsets_no_zone.csv", "--out", "{ws}/imported"), "-04:00"),
    Case("csv-zone-and-none", "CSV", "one timestamp with an offset, the next without",
         CLI + ("import-csv", "{in}/zone_and_none.csv", "--out", "{ws}/imported"), "no offset"),
    Case("csv-epoch-two-units", "CSV", "epoch seconds then epoch milliseconds in one file",
         CLI + ("import-csv", "{in}/epoch_two_units.csv", "--out", "{ws}/imported"), "'1704153600000'"),
    Case("csv-epoch-no-unit", "CSV", "`15000000000` (a time from 1971 to 2262 in no unit)",
         CLI + ("import-csv", "{in}/epoch_no_unit.csv", "--out", "{ws}/imported"), "'15000000000'"),
    Case("csv-epoch-huge", "CSV", "a 23-digit epoch number",
         CLI + ("import-csv", "{in}/epoch_huge.csv", "--out", "{ws}/imported"), "99999999999999999999999"),
    Case("csv-time-unit-dates", "CSV", "`--time-unit ms` on a file of dates",
         CLI + ("import-csv", "{in}/good.csv", "--out", "{ws}/imported", "--time-unit", "ms"), "'2024-01-02'"),
    Case("csv-time-unit-unknown", "CSV", "`--time-unit sec`",
         CLI + ("import-csv", "{in}/good.csv", "--out", "{ws}/imported", "--time-unit", "sec"), "'sec'"),
    Case("csv-two-date-orders", "CSV", "`01/02/2024` then `13/02/2024` (month first, then day first)",
         CLI + ("import-csv", "{in}/two_date_orders.csv", "--out", "{ws}/imported"), "'13/02/2024'"),
    Case("ckpt-nan-weights", "checkpoint", "every weight NaN (a diverged run's checkpoint)",
         TRAIN + BASE + ("--pretrained-tokenizer-path", "{in}/nan_ckpt"), "NaN", make=make_nan_weights),
    Case("mlproject-inf-weight", "MLproject", "`-P pretrained_tokenizer_path=` a checkpoint with one inf weight",
         MLPROJECT + ("pretrained_tokenizer_path={in}/inf_ckpt",), "head.weight", make=make_inf_weight),
    # ===== sweeps/sweep.py
    Case("sweep-percentile-150", "sweep", "`--pruner percentile:150`", SWEEP + ("--pruner", "percentile:150"), "150"),
    Case("sweep-pruner-negative", "sweep", "`--pruner median:n_startup_trials=-1`",
         SWEEP + ("--pruner", "median:n_startup_trials=-1"), "-1"),
    Case("sweep-pruner-reduction", "sweep", "`--pruner hyperband:reduction_factor=1`",
         SWEEP + ("--pruner", "hyperband:reduction_factor=1"), "reduction_factor"),
    Case("sweep-sampler-seed", "sweep", "`--sampler-seed 4294967296`", SWEEP + ("--sampler-seed", "4294967296"),
         "4294967296"),
    Case("sweep-timeout-nan", "sweep", "`--timeout nan`", SWEEP + ("--timeout", "nan"), "nan"),
    Case("sweep-nproc-huge", "sweep", "`--nproc-per-node 1000000`", SWEEP + ("--nproc-per-node", "1000000"),
         "1000000"),
    Case("sweep-storage-scheme", "sweep", "`--storage ftp://host/db`", SWEEP + ("--storage", "ftp://host/db"), "ftp"),
    Case("sweep-model-name", "sweep", "`--registered-model-name a/b`", SWEEP + ("--registered-model-name", "a/b"),
         "a/b"),
    Case("sweep-output-file", "sweep", "`--output-dir` naming a regular file", SWEEP + ("--output-dir", "{in}/a_file"),
         "a_file"),
    Case("sweep-space-above-training", "sweep", "a search space whose learning_rate reaches 10",
         SWEEP + ("--search-space", "{in}/space_high.yaml"), "learning_rate"),
    Case("sweep-space-mode-unknown", "sweep", "a search space whose finetune_mode choices hold `half`",
         SWEEP + ("--search-space", "{in}/space_mode.yaml"), "half"),
    Case("sweep-space-freeze-too-deep", "sweep", "a search space whose freeze_layers reaches 9 (a fresh tokenizer of 2 blocks)",
         SWEEP + ("--search-space", "{in}/space_deep.yaml"), "freeze_layers"),
    Case("sweep-train-seed", "sweep", "`--seed 1e30` passed to training", SWEEP + ("--seed", "1e30"), "seed"),
    # ===== tracking URIs whose scheme no store serves
    Case("tracking-uri-scheme", "tracking", "`MLFLOW_TRACKING_URI=ftp://host/x`", TRAIN + BASE, "ftp",
         env={"MLFLOW_TRACKING_URI": "ftp://host/x"}),
    Case("tracking-sqlite-no-folder", "tracking", "`MLFLOW_TRACKING_URI=sqlite:////nonexistent/dir/m.db`",
         TRAIN + BASE, "/nonexistent/dir", env={"MLFLOW_TRACKING_URI": "sqlite:////nonexistent/dir/m.db"}),
    Case("tracking-registry-scheme", "tracking", "`MLFLOW_REGISTRY_URI=ftp://host/x`", TRAIN + BASE, "ftp",
         env={"MLFLOW_REGISTRY_URI": "ftp://host/x"}),
    Case("tracking-database-down", "tracking", "`MLFLOW_TRACKING_URI=postgresql://kronos:<password>@127.0.0.1:9/mlflow` "
         "(nothing listens)", TRAIN + BASE, "127.0.0.1:9",
         env={"MLFLOW_TRACKING_URI": f"postgresql://kronos:{URI_PASSWORD}@127.0.0.1:9/mlflow"}),
    Case("flag-comet-offline-env-file", "flag", "`--comet offline` with COMET_OFFLINE_DIRECTORY naming a file",
         TRAIN + BASE + ("--comet", "offline"), "COMET_OFFLINE_DIRECTORY", env={"COMET_OFFLINE_DIRECTORY": "{in}/a_file"}),
    Case("compare-uri-scheme", "tracking", "`kronos-mlflow compare --tracking-uri ftp://host/x`",
         CLI + ("compare", "--tracking-uri", "ftp://host/x"), "ftp"),
    Case("sweep-uri-scheme", "sweep", "`MLFLOW_TRACKING_URI=nosuch://x` for a sweep", SWEEP, "nosuch",
         env={"MLFLOW_TRACKING_URI": "nosuch://x"}),
    # ===== spools: data, not commands (each names the workspace's FINISHED run)
    Case("spool-artifact-outside", "spool", "a spool uploading /etc/hostname and marking a FINISHED run FAILED",
         CLI + ("upload-spool", "{in}/sp_outside"), "/etc/hostname", make=make_spools),
    Case("spool-artifact-dotdot", "spool", "a spool artifact `../secret.txt`",
         CLI + ("upload-spool", "{in}/sp_dotdot/sub"), "../secret.txt", make=make_spools),
    Case("spool-ended-run", "spool", "a spool with the run's own token marking a FINISHED run FAILED", CLI + ("upload-spool", "{in}/sp_status"),
         "FINISHED", make=make_spools),
    Case("spool-other-experiment", "spool", "a spool whose header says experiment 7 (the run is in 0)",
         CLI + ("upload-spool", "{in}/sp_experiment", "--dry-run"), "experiment 7", make=make_spools),
    Case("spool-renamed", "spool", "a spool file not named after its header's run",
         CLI + ("upload-spool", "{in}/sp_renamed/from-a-colleague.jsonl"), "from-a-colleague.jsonl", make=make_spools),
    Case("spool-key-path", "spool", "a spool metric named `../../x`", CLI + ("upload-spool", "{in}/sp_key"),
         "../../x", make=make_spools),
    Case("spool-uri-scheme", "spool", "`upload-spool --tracking-uri ftp://host/x`",
         CLI + ("upload-spool", "{in}/sp_status", "--tracking-uri", "ftp://host/x"), "ftp", make=make_spools),
    Case("spool-no-token", "spool", "a spool naming another training's stopped run, its header without a run token",
         CLI + ("upload-spool", "{in}/sp_no_token"), "holds no run token", make=make_spools),
    Case("spool-forged-token", "spool", "a spool naming another training's stopped run with a token it does not carry",
         CLI + ("upload-spool", "{in}/sp_forged_token", "--dry-run"), "a token that run does not carry",
         make=make_spools),
    Case("spool-parent-tag", "spool", "a spool setting `mlflow.parentRunId` (re-parenting a run)",
         CLI + ("upload-spool", "{in}/sp_parent"), "mlflow.parentRunId", make=make_spools),
    Case("spool-run-name-tag", "spool", "a spool setting `mlflow.runName` (renaming a run)",
         CLI + ("upload-spool", "{in}/sp_rename_run"), "mlflow.runName", make=make_spools),
    Case("spool-owner-tag", "spool", "a spool setting the owner tag `kronos.owner`",
         CLI + ("upload-spool", "{in}/sp_owner"), "kronos.owner", make=make_spools),
    # ===== run ownership: a training state, MLFLOW_RUN_ID or a live writer never hands over another run
    Case("state-finished-run", "ownership", "a training state (with its token) naming a FINISHED run: the training "
         "itself, not --check", TRAIN_RUN + BASE + ("--save-path", "{in}/s_finished", "--epochs", "3"), "FINISHED",
         make=make_hijack_states),
    Case("state-finished-run-check", "ownership", "the same state, `--check`",
         TRAIN + BASE + ("--save-path", "{in}/s_finished", "--epochs", "3"), "FINISHED", make=make_hijack_states),
    Case("state-other-experiment", "ownership", "a training state naming a run of another experiment than the "
         "command's (`--experiment-name mine`)",
         TRAIN_RUN + BASE + ("--save-path", "{in}/s_finished", "--epochs", "3", "--experiment-name", "mine"),
         "'mine' (not created)", make=make_hijack_states),
    Case("state-forged-token", "ownership", "a training state naming a run with a token that run does not carry",
         TRAIN_RUN + BASE + ("--save-path", "{in}/s_forged", "--epochs", "3"), "a token that run does not carry",
         make=make_hijack_states),
    Case("state-no-token", "ownership", "a hand-made training state naming a run, with no token",
         TRAIN_RUN + BASE + ("--save-path", "{in}/s_none", "--epochs", "3"), "holds no run token",
         make=make_hijack_states),
    Case("state-unknown-run", "ownership", "a training state naming a run the tracking store lacks",
         TRAIN + BASE + ("--save-path", "{in}/s_unknown", "--epochs", "3"), "0123456789abcdef0123456789abcdef",
         make=make_hijack_states),
    Case("run-id-finished", "ownership", "`MLFLOW_RUN_ID` naming a FINISHED run, for a new training",
         TRAIN_RUN + BASE + ("--save-path", "{in}/fresh"), "FINISHED", env={"MLFLOW_RUN_ID": "{finished}"}),
    Case("run-id-owned", "ownership", "`MLFLOW_RUN_ID` naming a stopped run of another training",
         TRAIN_RUN + BASE + ("--save-path", "{in}/fresh"), "already belongs to another training",
         env={"MLFLOW_RUN_ID": "{stopped}"}),
    Case("run-id-owned-check", "ownership", "the same, `--check`", TRAIN + BASE + ("--save-path", "{in}/fresh"),
         "already belongs to another training", env={"MLFLOW_RUN_ID": "{stopped}"}),
    Case("run-directory-busy", "ownership", "the run directory of the config held by another live training",
         TRAIN_RUN + BASE + ("--save-path", "{in}/busy"), "being written by another process",
         make=make_busy_directory),
    Case("run-directory-busy-check", "ownership", "the same, `--check`", TRAIN + BASE + ("--save-path", "{in}/busy"),
         "being written by another process", make=make_busy_directory),
    *DOOR_CASES,
    # ===== the verdict: its config keys, the sweep's promote rule, kronos-mlflow evaluate-tokenizer
    Case("flag-n-test-iter", "flag", "`--n-test-iter -1`", TRAIN + BASE + ("--n-test-iter", "-1"), "n_test_iter"),
    Case("flag-verdict-min-change", "flag", "`--verdict-min-change 1.5`",
         TRAIN + BASE + ("--verdict-min-change", "1.5"), "verdict_min_change"),
    Case("sweep-promote", "sweep", "`--promote sometimes`", SWEEP + ("--promote", "sometimes"), "sometimes"),
    Case("evaluate-missing", "evaluate", "`kronos-mlflow evaluate-tokenizer` of a directory that does not exist",
         CLI + ("evaluate-tokenizer", "{in}/no_such_ckpt"), "no_such_ckpt"),
    Case("evaluate-unknown-run", "evaluate", "`evaluate-tokenizer runs:/<a run id the store lacks>/best_model`",
         CLI + ("evaluate-tokenizer", "runs:/0123456789abcdef0123456789abcdef/best_model"),
         "0123456789abcdef0123456789abcdef"),
    Case("evaluate-unknown-alias", "evaluate", "`evaluate-tokenizer models:/kronos-tokenizer@champion` (no such model)",
         CLI + ("evaluate-tokenizer", "models:/kronos-tokenizer@champion"), "models:/kronos-tokenizer@champion"),
    Case("evaluate-hub-offline", "evaluate", "`evaluate-tokenizer NeoQuasar/Kronos-Tokenizer-base` with no network",
         CLI + ("evaluate-tokenizer", "NeoQuasar/Kronos-Tokenizer-base"), "NeoQuasar/Kronos-Tokenizer-base"),
    Case("evaluate-base-truncated", "evaluate", "`--base` whose model.safetensors is cut to 1000 bytes",
         CLI + ("evaluate-tokenizer", "{in}/good_ckpt", "--base", "{in}/truncated_ckpt"), "--base: weights file",
         make=make_good_and_truncated),
    Case("evaluate-split", "evaluate", "`evaluate-tokenizer MODEL --split train`",
         CLI + ("evaluate-tokenizer", "{in}/no_such_ckpt", "--split", "train"), "'train'"),
    # ===== the predictor stage (python -m kronos_mlflow.train_predictor --check, the MLproject predictor check)
    Case("predictor-tokenizer-missing", "predictor", "`--tokenizer` a directory that does not exist",
         PREDICT + BASE + ("--tokenizer", "{in}/no_such_tokenizer"), "no_such_tokenizer"),
    Case("predictor-tokenizer-run", "predictor", "`--tokenizer runs:/<a run id the store lacks>/best_model`",
         PREDICT + BASE + ("--tokenizer", "runs:/0123456789abcdef0123456789abcdef/best_model"),
         "0123456789abcdef0123456789abcdef"),
    Case("predictor-missing", "predictor", "`--pretrained-predictor-path` a directory that does not exist",
         PREDICT + BASE + ("--tokenizer", "{in}/good_ckpt", "--pretrained-predictor-path", "{in}/no_such_predictor"),
         "no_such_predictor", make=make_predictor_5_5),
    Case("predictor-bits", "predictor", "a 5+5-bit predictor for a 4+4-bit tokenizer",
         PREDICT + BASE + ("--tokenizer", "{in}/good_ckpt", "--pretrained-predictor-path", "{in}/pred_5_5"),
         "5+5", make=make_predictor_5_5),
    Case("predictor-pickle", "predictor", "`--pretrained-predictor-path` holding only a pickle (`pytorch_model.bin`)",
         PREDICT + BASE + ("--tokenizer", "{in}/good_ckpt", "--pretrained-predictor-path", "{in}/pred_pickle"),
         "pred_pickle", make=make_predictor_5_5),
    Case("predictor-tokenizer-is-predictor", "predictor", "`--tokenizer` naming a predictor checkpoint",
         PREDICT + BASE + ("--tokenizer", "{in}/pred_5_5"), "pred_5_5", make=make_predictor_5_5),
    Case("predictor-inference-T", "predictor", "`--inference-T 0` (upstream's key, capital T)",
         PREDICT + BASE + ("--inference-T", "0"), "inference_T"),
    Case("predictor-inference-T-tiny", "predictor", "`--inference-T 1e-5` (logits / T overflows float32)",
         PREDICT + BASE + ("--inference-T", "1e-5"), "1e-05"),
    Case("flag-lookback-one", "flag", "`--lookback-window 1` (no spread to normalise a forecast by)",
         TRAIN + BASE + ("--lookback-window", "1"), "lookback_window"),
    Case("predictor-validation", "predictor", "`--predictor-validation sideways`",
         PREDICT + BASE + ("--predictor-validation", "sideways"), "sideways"),
    Case("predictor-lr-zero", "predictor", "`--learning-rate 0` (the predictor's)",
         PREDICT + BASE + ("--learning-rate", "0"), "predictor_learning_rate"),
    Case("predictor-n-layers", "predictor", "`--n-layers 100000`", PREDICT + BASE + ("--n-layers", "100000"),
         "n_layers"),
    Case("predictor-stage", "predictor", "`--stage forecaster`", TRAIN + BASE + ("--stage", "forecaster"),
         "forecaster"),
    Case("sweep-predictor-lr", "sweep", "`sweeps/sweep.py --stage predictor --predictor-learning-rate 1e-4`",
         SWEEP + ("--stage", "predictor", "--predictor-learning-rate", "1e-4"), "--predictor-learning-rate"),
    # ===== the return head (predictor_objective tokens+return)
    Case("flag-predictor-objective", "flag", "`--predictor-objective returns`",
         PREDICT + BASE + ("--predictor-objective", "returns"), "returns"),
    Case("flag-return-loss-weight-zero", "flag", "`--predictor-objective tokens+return --return-loss-weight 0`",
         PREDICT + BASE + ("--predictor-objective", "tokens+return", "--return-loss-weight", "0"), "return_loss_weight"),
    Case("pipeline-predictor-objective", "pipeline", "`pipeline --check --predictor-objective tokens+returns`",
         PIPELINE + ("--check", "--predictor-objective", "tokens+returns"), "tokens+returns"),
    # ===== sweeps on forecast skill (objective val_skill)
    Case("sweep-objective", "sweep", "`--objective val_los`", SWEEP + ("--objective", "val_los"), "val_los"),
    Case("sweep-val-skill-tokenizer", "sweep", "`--objective val_skill` for the tokenizer without a predictor",
         SWEEP + ("--objective", "val_skill"), "auto found no published predictor"),
    Case("flag-val-skill-late-train", "flag", "`--objective val_skill` with training ending after validation",
         PREDICT + BASE + ("--objective", "val_skill", "--train-time-range", "2011-01-01:2024-06-30"),
         "ends no later than train_time_range"),
    Case("flag-val-skill-bits", "flag", "`--objective val_skill` pairing a 4+4-bit tokenizer with a 5+5-bit predictor",
         TRAIN + BASE + ("--objective", "val_skill", "--pretrained-predictor-path", "{in}/pred_5_5"), "5+5",
         make=make_predictor_5_5),
    Case("flag-val-skill-predictor-missing", "flag", "`--objective val_skill` for the tokenizer with a "
         "`--pretrained-predictor-path` that does not exist",
         TRAIN + BASE + ("--objective", "val_skill", "--pretrained-predictor-path", "{in}/no_such_predictor"),
         "no_such_predictor"),
    Case("flag-n-val-skill-windows", "flag", "`--n-val-skill-windows 0`",
         PREDICT + BASE + ("--n-val-skill-windows", "0"), "n_val_skill_windows"),
    # ===== the scorecard: its config keys, kronos-mlflow evaluate
    Case("flag-n-eval-windows", "flag", "`--n-eval-windows 0`", PREDICT + BASE + ("--n-eval-windows", "0"),
         "n_eval_windows"),
    Case("flag-inference-top-p", "flag", "`--inference-top-p 1.5`", PREDICT + BASE + ("--inference-top-p", "1.5"),
         "inference_top_p"),
    Case("flag-evaluate", "flag", "`--evaluate sometimes`", PREDICT + BASE + ("--evaluate", "sometimes"), "sometimes"),
    Case("scorecard-missing", "evaluate", "`kronos-mlflow evaluate --model` a directory that does not exist",
         CLI + ("evaluate", "--model", "{in}/no_such_forecaster"), "no_such_forecaster"),
    Case("scorecard-unknown-run", "evaluate", "`evaluate --model runs:/<a run id the store lacks>/best_model`",
         CLI + ("evaluate", "--model", "runs:/0123456789abcdef0123456789abcdef/best_model"),
         "0123456789abcdef0123456789abcdef"),
    Case("scorecard-sample-count", "evaluate", "`evaluate --model DIR --inference-sample-count 0`",
         CLI + ("evaluate", "--model", "{in}/no_such_forecaster", "--inference-sample-count", "0"),
         "inference_sample_count"),
    # ===== the pipeline: its own flags, checked before any run is made
    Case("pipeline-force", "pipeline", "`kronos-mlflow pipeline --force maybe`",
         PIPELINE + ("--force", "maybe"), "'maybe'"),
    Case("pipeline-predictor-epochs", "pipeline", "`kronos-mlflow pipeline --predictor-epochs 0`",
         PIPELINE + ("--predictor-epochs", "0"), "predictor step: epochs"),
    Case("pipeline-model-name", "pipeline", "`kronos-mlflow pipeline --registered-model-name a/b`",
         PIPELINE + ("--registered-model-name", "a/b"), "'a/b'"),
    Case("pipeline-promote", "pipeline", "`kronos-mlflow pipeline --promote sometimes`",
         PIPELINE + ("--promote", "sometimes"), "sometimes"),
    Case("pipeline-nproc", "pipeline", "`kronos-mlflow pipeline --nproc-per-node 0`",
         PIPELINE + ("--nproc-per-node", "0"), "nproc"),
    # ===== numbers, lengths and digits with bounds; --check refuses what the command refuses; the demo market
    Case("bounds-fold-length-huge", "bounds", "`walk-forward --fold-length 99999999999Y` (was an OverflowError "
         "traceback)", WALKFORWARD + ("--fold-length", "99999999999Y"), "99999999999Y"),
    Case("bounds-val-length-digits", "bounds", "`walk-forward --val-length` a 5,000-digit number of bars",
         WALKFORWARD + ("--val-length", "9" * 5000), "val_length"),
    Case("bounds-embargo-huge", "bounds", "`walk-forward --embargo 1e400`", WALKFORWARD + ("--embargo", "1e400"),
         "1e400"),
    Case("bounds-fold-length-arabic-digit", "bounds", "`walk-forward --fold-length ٣M` (an Arabic-Indic 3)",
         WALKFORWARD + ("--fold-length", "٣M"), "'٣M'"),
    Case("bounds-epochs-arabic-digit", "bounds", "`--epochs ٣` (Python's int() reads 3)",
         TRAIN + BASE + ("--epochs", "٣"), "'٣'"),
    Case("bounds-horizon-superscript", "bounds", "`--eval-horizons 1,²` (str.isdigit() is True for ²)",
         PREDICT + BASE + ("--eval-horizons", "1,²"), "1,²"),
    Case("bounds-horizon-digits", "bounds", "`--eval-horizons` a 5,000-digit step (was a ValueError traceback)",
         PREDICT + BASE + ("--eval-horizons", "9" * 5000), "eval_horizons"),
    Case("bounds-n-val-iter-overflow", "bounds", "`--n-val-iter 1e400` (beyond every range)",
         TRAIN + BASE + ("--n-val-iter", "1e400"), "n_val_iter"),
    Case("bounds-pruner-arabic-digit", "bounds", "`sweep.py --pruner median:n_startup_trials=٣`",
         SWEEP + ("--pruner", "median:n_startup_trials=٣"), "٣"),
    Case("bounds-pruner-huge", "bounds", "`sweep.py --pruner hyperband:max_resource=1e300`",
         SWEEP + ("--pruner", "hyperband:max_resource=1e300"), "max_resource"),
    Case("bounds-compare-top-arabic-digit", "bounds", "`kronos-mlflow compare --top ٣`",
         CLI + ("compare", "--top", "٣"), "'٣'"),
    Case("bounds-demo-symbols-arabic-digit", "bounds", "`kronos-mlflow demo-data --symbols ٨`",
         CLI + ("demo-data", "--out", "{ws}/demo", "--symbols", "٨"), "'٨'"),
    Case("check-test-after-data-pipeline", "pipeline", "`pipeline --check --test-time-range 2030-01-01:2030-12-31` "
         "(after the data, which ends 2021)", STAGE2 + ("--check", "--test-time-range", "2030-01-01:2030-12-31"),
         "2030-01-01:2030-12-31"),
    Case("check-test-after-data-evaluate", "evaluate", "`evaluate --check --test-time-range 2030-01-01:2030-12-31`",
         EVAL2 + ("--check", "--test-time-range", "2030-01-01:2030-12-31"), "2030-01-01:2030-12-31", make=make_forecaster),
    Case("check-two-day-val-skill", "predictor", "`train-predictor --check --objective val_skill --val-time-range "
         "2021-07-01:2021-07-02` (shorter than one validation window)",
         CLI + ("train-predictor", "--check") + BASE + ("--objective", "val_skill", "--val-time-range", "2021-07-01:2021-07-02"),
         "2021-07-01:2021-07-02"),
    Case("demo-train-check-refused", "demo data", "`train --check --batch-size 65` on the demo market, not made yet "
         "(a refusal makes none)", CLI + ("train", "--check") + _flags({**TINY, "dataset_path": "{ws}/cache", "save_path": "{ws}/outputs"})
         + ("--batch-size", "65"), "batch_size 65"),
    Case("demo-pipeline-refused", "demo data", "`pipeline --n-train-iter 4` on the demo market, not made yet",
         CLI + ("pipeline", "--config", "{in}/stage2.yaml", "--n-train-iter", "4"), "batch_size 8"),
    Case("demo-walkforward-refused", "demo data", "`walk-forward --check --n-train-iter 4` on the demo market, "
         "not made yet", CLI + ("walk-forward", "--check", "--config", "{in}/stage2.yaml", "--folds", "2",
                                "--fold-length", "2M", "--n-train-iter", "4"), "batch_size 8"),
    Case("demo-prepare-refused", "demo data", "`prepare --qlib-data-path '' --instrument nasdaq` (the demo market "
         "has none)", CLI + ("prepare", "--qlib-data-path", "", "--dataset-path", "{ws}/cache", "--instrument",
                             "nasdaq"), "nasdaq"),
    # ===== the walk-forward: its fold settings, checked before any run is made
    Case("walkforward-folds", "walk-forward", "`kronos-mlflow walk-forward --folds 0`",
         WALKFORWARD + ("--folds", "0"), "folds: 0"),
    Case("walkforward-fold-length", "walk-forward", "`walk-forward --fold-length 3Q`",
         WALKFORWARD + ("--fold-length", "3Q"), "'3Q'"),
    Case("walkforward-rolling", "walk-forward", "`walk-forward --walkforward-mode rolling` without `--train-length`",
         WALKFORWARD + ("--walkforward-mode", "rolling"), "train_length"),
    Case("walkforward-embargo", "walk-forward", "`walk-forward --embargo -3`",
         WALKFORWARD + ("--embargo", "-3"), "embargo: -3"),
    Case("walkforward-too-many-folds", "walk-forward", "`walk-forward --folds 100 --fold-length 1Y` (more than the "
         "data holds)", WALKFORWARD + RANGES + ("--folds", "100", "--fold-length", "1Y"), "fewer folds"),
    Case("walkforward-parent-not-a-run-id", "walk-forward", "`walk-forward --parent-run-id ../x`",
         WALKFORWARD + ("--parent-run-id", "../x"), "'../x'"),
    Case("walkforward-aggregate-unknown", "walk-forward", "`walk-forward --aggregate <a run id the store lacks>`",
         CLI + ("walk-forward", "--aggregate", UNKNOWN_RUN), UNKNOWN_RUN),
    # ===== handed-over files: another run's folds.json and scorecard tables, read through one reader each
    Case("handover-folds-path", "handover", "`walk-forward --aggregate` of a parent whose folds.json numbers a fold "
         "`../../outside` (a path; its plan tag matches)", CLI + ("walk-forward", "--aggregate",
                                                                  "{handover_path_parent}"), "'../../outside'",
         make=make_handover_runs),
    Case("handover-folds-not-json", "handover", "`walk-forward --aggregate` of a parent whose folds.json is not JSON",
         CLI + ("walk-forward", "--aggregate", "{handover_json_parent}"), "walkforward/folds.json",
         make=make_handover_runs),
    Case("handover-folds-extra-key", "handover", "`walk-forward --aggregate` of a parent whose folds.json has a key "
         "a fold table never has", CLI + ("walk-forward", "--aggregate", "{handover_key_parent}"), "'surprise'",
         make=make_handover_runs),
    Case("handover-origins-not-parquet", "handover", "`walk-forward --aggregate` of a fold whose evaluation run's "
         "origins.parquet is CSV text", CLI + ("walk-forward", "--aggregate", "{handover_origins_parent}"),
         "evaluation/origins.parquet", make=make_handover_runs),
    Case("handover-forecasts-step-float", "handover", "`walk-forward --aggregate` of a fold whose forecasts.parquet "
         "has fractional steps", CLI + ("walk-forward", "--aggregate", "{handover_forecasts_parent}"),
         "column step", make=make_handover_runs),
    # ===== stage-two doors: what a step, a trial or the scorecard would refuse, before any run or cache
    Case("pipeline-predictor-is-tokenizer", "pipeline", "`pipeline --pretrained-predictor-path` a tokenizer checkpoint",
         STAGE2 + ("--pretrained-predictor-path", "{in}/good_ckpt"), "holds a tokenizer's config",
         make=make_predictor_5_5),
    Case("pipeline-tokenizer-is-predictor", "pipeline", "`pipeline --pretrained-tokenizer-path` a predictor checkpoint",
         STAGE2 + ("--pretrained-tokenizer-path", "{in}/pred_5_5"), "holds a predictor's config",
         make=make_predictor_5_5),
    Case("pipeline-bits", "pipeline", "`pipeline --pretrained-predictor-path` a 5+5-bit predictor, fresh 4+4-bit "
         "tokenizer", STAGE2 + ("--pretrained-predictor-path", "{in}/pred_5_5"), "5+5", make=make_predictor_5_5),
    Case("pipeline-context", "pipeline", "`max_context: 16` with lookback_window 20 + predict_window 5",
         PIPELINE + ("--config", "{in}/stage2_context.yaml") + RANGES, "max_context 16"),
    Case("pipeline-no-origin", "pipeline", f"`pipeline --test-time-range {NO_ORIGIN}` (no forecast origin)",
         STAGE2 + ("--test-time-range", NO_ORIGIN), NO_ORIGIN),
    Case("pipeline-no-signal-day", "pipeline", f"`backtest_time_range: {NO_SIGNAL}` (before every signal)",
         PIPELINE + ("--config", "{in}/stage2_backtest.yaml") + RANGES, NO_SIGNAL),
    Case("pipeline-windows", "pipeline", "`pipeline --n-train-iter 4` with batch_size 8",
         STAGE2 + ("--n-train-iter", "4"), "batch_size 8"),
    Case("sweep2-tokenizer-running", "sweep", "`sweep.py --stage predictor --tokenizer runs:/<a RUNNING run>/best_model`",
         SWEEP2 + ("--tokenizer", "runs:/{running}/best_model"), "RUNNING"),
    Case("sweep2-tokenizer-deleted", "sweep", "`sweep.py --stage predictor --tokenizer runs:/<a deleted run>/best_model`",
         SWEEP2 + ("--tokenizer", "runs:/{deleted}/best_model"), "deleted"),
    Case("sweep2-tokenizer-unknown", "sweep", "`sweep.py --stage predictor --tokenizer runs:/<a run the store lacks>/...`",
         SWEEP2 + ("--tokenizer", f"runs:/{UNKNOWN_RUN}/best_model"), UNKNOWN_RUN),
    Case("sweep2-tokenizer-is-predictor", "sweep", "`sweep.py --stage predictor --tokenizer` a predictor checkpoint",
         SWEEP2 + ("--tokenizer", "{in}/pred_5_5"), "holds a predictor's config", make=make_predictor_5_5),
    Case("sweep2-predictor-is-tokenizer", "sweep", "`sweep.py --stage predictor --pretrained-predictor-path` a tokenizer",
         SWEEP2 + ("--tokenizer", "{in}/good_ckpt", "--pretrained-predictor-path", "{in}/good_ckpt"),
         "holds a tokenizer's config", make=make_predictor_5_5),
    Case("sweep2-bits", "sweep", "`sweep.py --stage predictor` a 5+5-bit predictor on a 4+4-bit tokenizer",
         SWEEP2 + ("--tokenizer", "{in}/good_ckpt", "--pretrained-predictor-path", "{in}/pred_5_5"), "5+5",
         make=make_predictor_5_5),
    Case("sweep2-context", "sweep", "`sweep.py --stage predictor --max-context 16` (window 20 + 5)",
         SWEEP2 + ("--max-context", "16"), "max_context 16"),
    Case("sweep2-val-skill-origins", "sweep", "`--objective val_skill` with a validation range holding no origin "
         "after training", SWEEP2 + ("--objective", "val_skill", "--val-time-range", "2021-06-20:2021-07-10"),
         "2021-06-20:2021-07-10"),
    Case("sweep2-no-signal-day", "sweep", f"`sweep.py --stage predictor --backtest-time-range {NO_SIGNAL}`",
         SWEEP2 + ("--backtest-time-range", NO_SIGNAL), NO_SIGNAL),
    Case("sweep2-resume-must", "sweep", "`sweep.py --resume must` (every trial starts in a new folder)",
         SWEEP2 + ("--resume", "must"), "must"),
    Case("scorecard-nothing-to-score", "evaluate", f"`evaluate --test-time-range {NO_ORIGIN}` (no forecast origin)",
         EVAL2 + ("--test-time-range", NO_ORIGIN), NO_ORIGIN, make=make_forecaster),
    Case("scorecard-context", "evaluate", "`evaluate --max-context 16` (window 20 + 5)",
         EVAL2 + ("--max-context", "16"), "max_context 16", make=make_forecaster),
    Case("scorecard-no-signal-day", "evaluate", f"`evaluate --backtest-time-range {NO_SIGNAL}`",
         EVAL2 + ("--backtest-time-range", NO_SIGNAL), NO_SIGNAL, make=make_forecaster),
    Case("scorecard-horizon-zero", "evaluate", "`evaluate --eval-horizons 0`", EVAL2 + ("--eval-horizons", "0"),
         "eval_horizons", make=make_forecaster),
    Case("scorecard-horizon-text", "evaluate", "`evaluate --eval-horizons 1,x`", EVAL2 + ("--eval-horizons", "1,x"),
         "1,x", make=make_forecaster),
    Case("scorecard-horizon-beyond", "evaluate", "`evaluate --eval-horizons 99` (predict_window 5)",
         EVAL2 + ("--eval-horizons", "99"), "99", make=make_forecaster),
    Case("scorecard-horizon-zero-listed", "evaluate", "`evaluate --eval-horizons 3,0`",
         EVAL2 + ("--eval-horizons", "3,0"), "eval_horizons", make=make_forecaster),
    Case("scorecard-bootstrap-unit", "evaluate", "`evaluate --bootstrap-unit day`",
         EVAL2 + ("--bootstrap-unit", "day"), "'day'", make=make_forecaster),
    Case("scorecard-calibration", "evaluate", "`evaluate --calibration maybe`",
         EVAL2 + ("--calibration", "maybe"), "calibration", make=make_forecaster),
    Case("scorecard-calibration-too-few", "evaluate",
         "`evaluate --calibration on --calibration-min-origins 1000000` (more than validation has)",
         EVAL2 + ("--calibration", "on", "--calibration-min-origins", "1000000"), "calibration_min_origins",
         make=make_forecaster),
    Case("scorecard-ensemble-rounds", "evaluate", "`evaluate --ensemble-rounds -1`",
         EVAL2 + ("--ensemble-rounds", "-1"), "ensemble_rounds", make=make_forecaster),
    Case("scorecard-aci-step", "evaluate", "`evaluate --aci-step 2` (a level moved by more than 1 a date)",
         EVAL2 + ("--aci-step", "2"), "aci_step", make=make_forecaster),
    Case("scorecard-aci-start-run", "evaluate", "`evaluate --aci-start-run ../x` (not a run id)",
         EVAL2 + ("--aci-start-run", "../x"), "--aci-start-run", make=make_forecaster),
    Case("scorecard-signal-stride", "evaluate", "`evaluate --backtest-signal-stride -1`",
         EVAL2 + ("--backtest-signal-stride", "-1"), "backtest_signal_stride", make=make_forecaster),
    Case("scorecard-random-controls", "evaluate", "`evaluate --backtest-n-random 1000000` (a backtest each)",
         EVAL2 + ("--backtest-n-random", "1000000"), "backtest_n_random", make=make_forecaster),
    Case("scorecard-swapped", "evaluate", "`evaluate --model` a directory whose tokenizer/ holds a predictor",
         CLI + ("evaluate", "--model", "{in}/swapped") + BASE, "holds a predictor's config", make=make_forecaster),
    Case("scorecard-zeroshot-kind", "evaluate", "`evaluate --zeroshot-predictor` a tokenizer checkpoint",
         EVAL2 + ("--zeroshot-predictor", "{in}/good_ckpt"), "--zeroshot-predictor", make=make_forecaster),
    Case("scorecard-zeroshot-bits", "evaluate", "`evaluate --zeroshot-predictor` a 5+5-bit predictor",
         EVAL2 + ("--zeroshot-predictor", "{in}/pred_5_5"), "--zeroshot-predictor", make=make_forecaster),
    Case("scorecard-running-run", "evaluate", "`evaluate --model runs:/<a RUNNING run>/best_model`",
         CLI + ("evaluate", "--model", "runs:/{running}/best_model"), "RUNNING"),
    Case("scorecard-deleted-run", "evaluate", "`evaluate --model runs:/<a deleted run>/best_model`",
         CLI + ("evaluate", "--model", "runs:/{deleted}/best_model"), "deleted"),
    Case("scorecard-no-store", "evaluate", "`evaluate --model runs:/<id>/best_model` against a sqlite file that does "
         "not exist (no store is made)", CLI + ("evaluate", "--model", f"runs:/{UNKNOWN_RUN}/best_model"),
         "no MLflow database", env={"MLFLOW_TRACKING_URI": "sqlite:///{ws}/new.db"}),
    # ===== a forecaster's calibrator, read by the handed-over files' reader; a lookback too short for its volatility
    Case("calibrator-base-rate-check", "evaluate", "`evaluate --check --model` a forecaster whose "
         "calibrator/calibrator.json says `base_rate: 5`", CLI + ("evaluate", "--model", "{in}/cal_rate", "--check")
         + BASE, "base_rate is '5'", make=make_damaged_calibrators),
    Case("calibrator-not-json-check", "evaluate", "`evaluate --check --model` a forecaster whose calibrator.json is "
         "not JSON", CLI + ("evaluate", "--model", "{in}/cal_json", "--check") + BASE, "calibrator/calibrator.json",
         make=make_damaged_calibrators),
    Case("calibrator-time-range", "evaluate", "`evaluate --model` a forecaster whose calibrator's time_range is not "
         "a date (was a traceback)", CLI + ("evaluate", "--model", "{in}/cal_range") + BASE, "'last spring'",
         make=make_damaged_calibrators),
    Case("calibrator-origins-inf", "evaluate", "`evaluate --model` a forecaster whose calibrator says "
         "`origins: 1e400` (was a traceback)", CLI + ("evaluate", "--model", "{in}/cal_origins") + BASE,
         "origins is 'inf'", make=make_damaged_calibrators),
    Case("calibration-lookback-two", "evaluate", "`evaluate --calibration on --lookback-window 2` (no volatility "
         "for the calibrator to scale by)", EVAL2 + ("--calibration", "on", "--lookback-window", "2"), "lookback_window 2",
         make=make_forecaster),
    # ===== demo-data
    Case("demo-seed-huge", "demo data", "`kronos-mlflow demo-data --seed 99999999999999999999`",
         CLI + ("demo-data", "--out", "{ws}/demo", "--seed", "99999999999999999999"), "99999999999999999999"),
    Case("demo-symbols-float", "demo data", "`kronos-mlflow demo-data --symbols 1e9`",
         CLI + ("demo-data", "--out", "{ws}/demo", "--symbols", "1e9"), "1e9"),
    Case("demo-signal-nan", "demo data", "`kronos-mlflow demo-data --signal nan`",
         CLI + ("demo-data", "--out", "{ws}/demo", "--signal", "nan"), "--signal"),
    Case("demo-signal-intraday", "demo data", "`kronos-mlflow demo-data --freq 5min --signal 0.1` (a planted "
         "signal is for daily bars)", CLI + ("demo-data", "--out", "{ws}/demo", "--freq", "5min", "--signal", "0.1"),
         "daily market only"),
    # ===== YAML read with limits (kronos_mlflow/config/yamlfile.py): refused on the parser's events, never echoed
    Case("config-alias-bomb", "config file", "a 342-byte YAML alias bomb (`*a` nine times, nine levels deep)",
         TRAIN + BASE + ("--config", "{in}/bomb.yaml"), "alias"),
    Case("config-alias-bomb-train", "config file", "`kronos-mlflow train --config` the alias bomb (no --check)",
         CLI + ("train",) + BASE + ("--config", "{in}/bomb.yaml"), "alias"),
    Case("config-list-key", "config file", "a list as a key (`? [a, b]`) via `kronos-mlflow train-predictor --check`",
         CLI + ("train-predictor", "--check") + BASE + ("--config", "{in}/list_key.yaml"), "a list used as a key"),
    Case("mlproject-config-map-key", "MLproject", "`-P config_file=` a file with a mapping as a key (`{a: 1}: x`)",
         MLPROJECT + ("config_file={in}/map_key.yaml",), "a mapping used as a key"),
    Case("pipeline-config-tag", "pipeline", "`kronos-mlflow pipeline --config` a file with `!!python/object/apply:`",
         PIPELINE + ("--config", "{in}/tag.yaml"), "explicit tag"),
    Case("evaluate-config-int-key", "evaluate", "`kronos-mlflow evaluate --config` a file with the key `1:`",
         CLI + ("evaluate", "--model", "{in}/no_such_forecaster", "--config", "{in}/int_key.yaml"),
         "a key that YAML reads as a number"),
    Case("config-deep", "config file", "lists nested 40 deep", TRAIN + BASE + ("--config", "{in}/deep.yaml"),
         "nested more than 10 deep"),
    Case("config-number-digits", "config file", "`epochs:` a number of 5,000 digits (was a ValueError traceback)",
         TRAIN + BASE + ("--config", "{in}/digits.yaml"), "5,000 characters"),
    Case("config-timestamp", "config file", "`backtest_time_range: [2020-13-45, 2021-01-01]` (was a ValueError "
         "traceback)",
         TRAIN + BASE + ("--config", "{in}/timestamp.yaml"), "2020-13-45"),
    Case("config-two-documents", "config file", "two YAML documents (`---`)",
         TRAIN + BASE + ("--config", "{in}/two_docs.yaml"), "second YAML document"),
    Case("config-two-names", "config file", "`learning_rate:` and `tokenizer_learning_rate:` (one key, two names) "
         "in one file", TRAIN + BASE + ("--config", "{in}/two_names.yaml"), "sets tokenizer_learning_rate twice"),
    Case("config-long-value", "config file", "`adamw_impl:` a 300-character value (found by the property tests)",
         TRAIN + BASE + ("--config", "{in}/long_value.yaml"), "adamw_impl"),
    Case("sweep-config-alias", "sweep", "`sweeps/sweep.py --config` the alias bomb",
         SWEEP + ("--config", "{in}/bomb.yaml"), "alias"),
    Case("sweep-space-tag", "sweep", "a search space with `!!set`", SWEEP + ("--search-space", "{in}/space_tag.yaml"),
         "explicit tag"),
    Case("sweep-space-long-key", "sweep", "a search space with a 300-character parameter name (found by the "
         "property tests)", SWEEP + ("--search-space", "{in}/space_long_key.yaml"), "unknown parameter"),
    # ===== flags (found by the property tests)
    Case("flag-stray-long-value", "flag", "a 300-character value with no flag",
         TRAIN + BASE + (LONG_VALUE,), "unexpected argument"),
    Case("flag-save-path-too-long", "flag", "`--save-path` with a 300-character folder name (was an OSError traceback)",
         TRAIN + BASE + ("--save-path", "{ws}/" + "s" * 300), "save_path"),
    # ===== names that become folders (kronos_mlflow.config.checks.child_name)
    Case("sweep-study-traversal", "sweep", "`--study-name ../../x` (trials would write OUTPUT_DIR/../../x)",
         SWEEP + ("--output-dir", "{ws}/sweeps/out", "--study-name", "../../x"), "../../x"),
    Case("sweep-study-absolute", "sweep", "`--study-name` an absolute path",
         SWEEP + ("--output-dir", "{ws}/sweeps", "--study-name", "{ws}/elsewhere"), "would not stay inside --output-dir"),
    # ===== KRONOS_* settings (kronos_mlflow/config/settings.py): refused, not warned about
    Case("env-http-timeout", "environment", "`KRONOS_MLFLOW_HTTP_TIMEOUT_S=ten`", TRAIN + BASE,
         "KRONOS_MLFLOW_HTTP_TIMEOUT_S", env={"KRONOS_MLFLOW_HTTP_TIMEOUT_S": "ten"}),
    Case("env-finalize-wait", "environment", "`KRONOS_MLFLOW_FINALIZE_WAIT_S=-5` for a sweep", SWEEP,
         "KRONOS_MLFLOW_FINALIZE_WAIT_S", env={"KRONOS_MLFLOW_FINALIZE_WAIT_S": "-5"}),
    Case("env-progress-seconds-unit", "environment", "`KRONOS_PROGRESS_SECONDS=5s` (a unit after the number)",
         TRAIN + BASE, "'5s'", env={"KRONOS_PROGRESS_SECONDS": "5s"}),
    Case("env-progress-seconds-negative", "environment", "`KRONOS_PROGRESS_SECONDS=-1` for `pipeline`", STAGE2,
         "KRONOS_PROGRESS_SECONDS", env={"KRONOS_PROGRESS_SECONDS": "-1"}),
    Case("env-progress-seconds-nan", "environment", "`KRONOS_PROGRESS_SECONDS=nan` for a sweep", SWEEP,
         "'nan'", env={"KRONOS_PROGRESS_SECONDS": "nan"}),
    Case("env-spool-dir-file", "environment", "`KRONOS_MLFLOW_SPOOL_DIR` naming a file, for `upload-spool`",
         CLI + ("upload-spool",), "KRONOS_MLFLOW_SPOOL_DIR", env={"KRONOS_MLFLOW_SPOOL_DIR": "{in}/a_file"}),
    Case("env-home-too-long", "environment", "`KRONOS_MLFLOW_HOME` with a 300-character folder name, for `prepare` "
         "(was an OSError traceback)", CLI + ("prepare", "--qlib-data-path", "", "--dataset-path", "{ws}/cache"),
         "KRONOS_MLFLOW_HOME", env={"KRONOS_MLFLOW_HOME": "{ws}/" + "h" * 300}),
    # ===== the dates read from the market (auto: the time ranges' span)
    Case("mlproject-dataset-begin", "MLproject", "`-P dataset_begin_time=2011-02-30`",
         MLPROJECT + ("dataset_begin_time=2011-02-30",), "dataset_begin_time: '2011-02-30' is not a date"),
    Case("flag-dataset-span", "flag", "`--dataset-begin-time` after `--dataset-end-time`",
         TRAIN + BASE + ("--dataset-begin-time", "2021-06-01", "--dataset-end-time", "2020-06-01"),
         "dataset_begin_time 2021-06-01 is after dataset_end_time 2020-06-01"),
]


# Not in the table: a case that breaks the promise on purpose, run with the others (see
# test_fork_runner_catches_a_traceback_and_a_write).
SELF_CHECK = Case("runner-self-check", "runner", "a case that writes a file and raises", ("<self-check>",), "-")


# ----------------------------------------------------------------------------- the workspace


def _build_template(root: Path) -> Path:
    """A finished run's workspace: market, prepared cache, best checkpoint, training state, MLflow store."""
    import torch
    from mlflow import MlflowClient

    from kronos_mlflow.training import checkpoint as ckpt
    from kronos_mlflow.config.core import load_config, model_kwargs
    from kronos_mlflow.data import prepare_splits, write_demo_market
    from kronos_mlflow.model import KronosTokenizer

    ws = root / "ws"
    market = write_demo_market(root.parent / "market", 8, 3, start="2020-01-01", end="2021-12-31")
    config = load_config({**TINY, **{k: v for k, v in DATES.items()}, "qlib_data_path": str(market),
                          "dataset_path": str(ws / "cache"), "save_path": str(ws / "outputs")})
    prepare_splits(config, progress=False)
    torch.manual_seed(0)
    model = KronosTokenizer(**model_kwargs(config))
    from kronos_mlflow.config.layout import RunLayout

    save_dir = RunLayout.of(config).root  # outputs/finetune_tokenizer_demo/cfg-<digest>
    model.save_pretrained(save_dir / "checkpoints" / "best_model")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=10)
    ckpt.save_training_state(ckpt.state_dir(save_dir), model=model, optimizer=optimizer, scheduler=scheduler,
                             epoch=0, global_step=4, best_val_loss=0.5, run_ids={"mlflow_run_id": "x"},
                             config_digest=ckpt.config_digest(config))
    (save_dir / "summary.json").write_text('{"best_val_loss": 0.5}\n')
    client = MlflowClient(tiny_runs.create_sqlite_store(ws))
    from kronos_mlflow.tracking.ownership import TAG, new_token, token_hash, write_owner

    token = new_token()  # the finished run is owned, as a training leaves it; its token is in owner.json
    run = client.create_run("0", run_name="finished", tags={TAG: token_hash(token), "run_directory": str(save_dir)})
    write_owner(save_dir, token, run.info.run_id, "0")
    client.log_metric(run.info.run_id, "best_val_loss", 0.5)
    client.set_terminated(run.info.run_id)
    stopped = client.create_run("0", run_name="stopped", tags={TAG: token_hash(new_token())})  # files elsewhere
    client.set_terminated(stopped.info.run_id, "KILLED")
    client.delete_experiment(client.create_experiment("retired"))  # a name a run may not use
    client.create_run("0", run_name="running")  # a run still training: its model is not final
    deleted = client.create_run("0", run_name="deleted").info.run_id
    client.set_terminated(deleted)
    client.delete_run(deleted)
    # a colleague's runs: one of another experiment, as mlflow run makes it, and one training now
    client.create_run(client.create_experiment("colleagues"), run_name="elsewhere",
                      tags={"mlflow.project.entryPoint": "main"})
    busy = client.create_run("0", run_name="busy", tags={"mlflow.note.content": "my colleague's notes"}).info.run_id
    client.log_metric(busy, "train_loss", 1.0)
    (ws / "home").mkdir()
    return ws


def _hashes(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            out[rel + "/"] = "dir"
    return out


def _mlproject_check_command(overrides: dict[str, str], entry: str = "main") -> str:
    """MLproject's ``entry`` command (one command: tests/test_project_files.py), rendered as
    ``mlflow run`` renders it: every parameter shell-quoted, defaults for those not given,
    overrides only for the parameters the entry point declares."""
    import yaml

    spec = yaml.safe_load((ROOT / "MLproject").read_text())["entry_points"][entry]
    values = {name: str(p.get("default", "")) for name, p in spec["parameters"].items()}
    values.update({k: v for k, v in overrides.items() if k in values})
    return spec["command"].format(**{k: shlex.quote(v) for k, v in values.items()})


@dataclass
class Result:
    case: Case
    returncode: int
    stdout: str
    stderr: str
    changed: list[str]
    ws: Path
    inp: Path
    seconds: float = 0.0
    runs: dict[str, str] = field(default_factory=dict)  # the store's named runs (:func:`_named_runs`)

    @property
    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]

    def normalise(self, text: str) -> str:
        """The message as the docs show it: temporary paths, the store's run id and the run
        directory's config digest (both differ per build) replaced by placeholders."""
        import re

        market = str(self.ws.parent.parent.parent / "market")
        text = text.replace(str(self.ws), "<ws>").replace(str(self.inp), "<in>").replace(market, "<market>")
        for name, run_id in self.runs.items():
            text = text.replace(run_id, f"<{name}-run-id>")
        text = re.sub(r"cfg-[0-9a-f]{12}", "cfg-<digest>", text)
        if os.environ.get("HF_HUB_CACHE"):  # the tests' empty Hugging Face cache (tests/conftest.py)
            text = text.replace(os.environ["HF_HUB_CACHE"], "<hf-cache>")
        text = re.sub(r"\(pid \d+ on [^,]*, since [^)]*\)", "(pid <pid> on <host>, since <time>)", text)
        return text.replace(sys.executable, "python")




@dataclass
class Prepared:
    """A case ready to run: its workspace, inputs, the command both as argv and as an entry point."""
    case: Case
    ws: Path
    inp: Path
    argv: list[str]  # the command a user types
    entry: str  # module:function that command's script calls
    script_argv: list[str]  # sys.argv as that script sees it
    env: dict[str, str]
    before: dict[str, str]
    runs: dict[str, str]


def _prepare_case(case: Case, template: Path, root: Path) -> Prepared:
    base = root / case.id
    ws, inp = base / "ws", base / "in"
    shutil.copytree(template, ws, symlinks=True)
    inp.mkdir(parents=True)
    make_all(inp, ws)
    if case.make:
        case.make(inp, ws)
    market = root.parent / "market"
    runs = _named_runs(ws)
    fill = {"ws": str(ws), "in": str(inp), "py": sys.executable, "market": str(market), **runs}
    env = tiny_runs.isolated_env(ws, extra={**SECRETS, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    env.update({k: v.format(**fill) for k, v in case.env.items()})
    if case.argv[0].startswith("<mlproject"):
        entry = case.argv[0][len("<mlproject"):-1].lstrip(":") or "main"
        overrides = {"qlib_data_path": str(market), "config_file": str(inp / "mlproject.yaml"),
                     **{k: v for k, v in DATES.items()}}
        _write(inp / "mlproject.yaml", "".join(f"{k}: {json.dumps(v)}\n" for k, v in {  # quoted: YAML reads off as false
            **TINY, "dataset_path": str(ws / "cache"), "save_path": str(ws / "outputs")}.items()))
        for item in case.argv[1:]:
            key, _, value = item.partition("=")
            overrides[key] = value.format(**fill)
        words = shlex.split(_mlproject_check_command(overrides, entry))  # as bash splits what mlflow run renders
        assert words[0] == "python", words[:3]
        argv = [sys.executable, *words[1:]]
        if argv[1:3] == ["-m", "kronos_mlflow"]:  # python -m kronos_mlflow COMMAND: the console script's main
            argv = ["kronos-mlflow", *argv[3:]]
        elif argv[1] == "sweeps/sweep.py":
            argv[1] = str(ROOT / "sweeps" / "sweep.py")
    else:
        argv = [a.format(**fill) for a in case.argv]
    entry, script_argv = entry_of(argv)
    return Prepared(case, ws, inp, argv, entry, script_argv, env, _hashes(ws), runs)


def _finish(p: Prepared, rc: int, stdout: str, stderr: str, seconds: float = 0.0) -> Result:
    after = _hashes(p.ws)
    changed = sorted(k for k in set(p.before) | set(after) if p.before.get(k) != after.get(k))
    return Result(p.case, rc, stdout, stderr, changed, p.ws, p.inp, seconds, p.runs)


def run_forked(prepared: list[Prepared], scratch: Path, parallel: int = 3) -> dict[str, Result]:
    """Every case through tests/forkrunner.py (one pre-imported interpreter, a fork per case)."""
    import json as _json

    scratch.mkdir(parents=True, exist_ok=True)
    requests = []
    for p in prepared:
        requests.append({"id": p.case.id, "entry": p.entry, "argv": p.script_argv, "cwd": str(p.ws), "env": p.env,
                         "stdout": str(p.inp.parent / "stdout.txt"), "stderr": str(p.inp.parent / "stderr.txt"),
                         "timeout": 240})
    (scratch / "requests.json").write_text(_json.dumps(requests))
    env = tiny_runs.isolated_env(scratch, extra={"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "forkrunner.py"), str(scratch / "requests.json"),
                           str(parallel)], cwd=scratch, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"the fork runner failed:\n{proc.stderr[-3000:]}"
    done = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            item = _json.loads(line)
            done[item["id"]] = item
    out = {}
    for p in prepared:
        item = done[p.case.id]
        out[p.case.id] = _finish(p, item["rc"], (p.inp.parent / "stdout.txt").read_text(errors="replace"),
                                 (p.inp.parent / "stderr.txt").read_text(errors="replace"), item["seconds"])
    return out


def run_subprocess(p: Prepared) -> Result:
    """The same case as a real process: the command exactly as a user types it."""
    argv = [CONSOLE_SCRIPT, *p.argv[1:]] if p.argv[0] == "kronos-mlflow" else p.argv
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=p.ws, env=p.env, capture_output=True, text=True, timeout=300)
    return _finish(p, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


@pytest.fixture(scope="module")
def workspace_root():
    """A template workspace (a finished run) and the shared market, built once for the module."""
    root = Path(tempfile.mkdtemp(prefix="kronos-hostile-"))
    try:
        template = _build_template(root / "template")
        yield root, template
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def results(workspace_root) -> dict[str, Result]:
    """Every case, run once in its own workspace copy, through the fork runner."""
    root, template = workspace_root
    market_before = _hashes(root / "market")
    prepared = [_prepare_case(c, template, root / "cases") for c in [*CASES, SELF_CHECK]]
    out = run_forked(prepared, root / "runner")
    assert _hashes(root / "market") == market_before, "a case changed the shared Qlib market"
    return out


# ----------------------------------------------------------------------------- the tests


def test_config_size_guard_matches_the_model():
    """The config's size guard counts a fresh model's parameters without building it: the count
    equals the parameters of the model built from the same config."""
    from kronos_mlflow.config.core import fresh_parameter_count, load_config, model_kwargs
    from kronos_mlflow.model import KronosTokenizer

    for sizes in ({}, TINY, {"d_model": 128, "n_heads": 8, "ff_dim": 384, "n_enc_layers": 5, "n_dec_layers": 3,
                             "s1_bits": 9, "s2_bits": 11}):
        config = load_config({k: v for k, v in sizes.items() if k != "comet"})
        built = sum(p.numel() for p in KronosTokenizer(**model_kwargs(config)).parameters())
        assert fresh_parameter_count(config) == built


def test_there_are_enough_cases_across_all_areas():
    assert len(CASES) >= 76 and len({c.id for c in CASES}) == len(CASES)
    assert {c.area for c in CASES} >= {"flag", "MLproject", "config file", "Qlib dir", "CSV", "checkpoint", "sweep",
                                       "tracking", "spool", "demo data"}


def test_every_door_is_attacked():
    """Each command the store gate lets write a handed-over run, and each MLproject entry point, is
    run with MLFLOW_RUN_ID of every kind of run it must refuse."""
    import yaml

    from kronos_mlflow.tracking import gate

    assert set(DOOR_COMMANDS) == set(gate.DOORS)
    entries = set(yaml.safe_load((ROOT / "MLproject").read_text())["entry_points"])
    assert {c.argv[0][len("<mlproject:"):-1] for c in DOOR_CASES if c.argv[0].startswith("<mlproject:")} == entries
    attacked = {(c.argv, c.env["MLFLOW_RUN_ID"]) for c in DOOR_CASES if "MLFLOW_RUN_ID" in c.env}
    assert len(attacked) >= len(gate.DOORS) * len(HOSTILE_RUNS) + len(entries)


def promise_broken(r: Result) -> str | None:
    """Why ``r`` breaks the promise (None when it keeps it): exit 2, one line naming the bad
    value, no traceback, no file of the workspace changed, no credential printed."""
    detail = f"rc={r.returncode}\nstderr:\n{r.stderr[-3000:]}\nstdout:\n{r.stdout[-1000:]}"
    if r.returncode != 2:
        return f"exit code {r.returncode}, expected 2\n{detail}"
    if "Traceback" in r.stderr + r.stdout:
        return f"a traceback\n{detail}"
    if len(r.lines) != 1:
        return f"{len(r.lines)} lines on stderr, expected 1\n{detail}"
    if r.case.needle not in r.lines[0]:
        return f"the line does not name {r.case.needle!r}\n{detail}"
    if r.changed:
        return f"files changed in the workspace: {r.changed}"
    for secret in NEVER_PRINTED:
        if secret in r.stdout + r.stderr:
            return f"{secret} printed:\n{detail}"
    return None


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_one_line_exit_2_and_touches_nothing(results, case):
    broken = promise_broken(results[case.id])
    assert broken is None, broken


def test_fork_runner_catches_a_traceback_and_a_write(results):
    """A case that writes into its workspace and then raises, run in the same batch as the table's
    cases: the runner reports the interpreter's traceback and exit code 1, the hash check sees
    the new file, and the promise check fails it."""
    r = results[SELF_CHECK.id]
    assert r.returncode == 1, r.stderr
    assert "Traceback (most recent call last)" in r.stderr and "RuntimeError: deliberately raised" in r.stderr
    assert r.changed == ["written-by-the-case.txt"]
    assert r.stdout == "about to raise\n"  # a child's stdout is its own file, flushed at exit
    assert promise_broken(r) is not None


# One case of each kind of entry point, run as a real process as well.
AGREE = ("flag-registered-model", "csv-two-zones", "sweep-percentile-150", "spool-artifact-outside",
         "mlproject-max-restarts")


@pytest.mark.slow
def test_fork_agrees_with_a_real_process(workspace_root, results, tmp_path):
    """The fork runner shows what the real command shows: same exit code, same stderr, same
    (empty) set of changed files, case by case."""
    root, template = workspace_root
    for cid in AGREE:
        case = next(c for c in CASES if c.id == cid)
        real = run_subprocess(_prepare_case(case, template, tmp_path / "real"))
        forked = results[cid]
        assert real.returncode == forked.returncode, (cid, real.stderr, forked.stderr)
        assert real.normalise(real.stderr) == forked.normalise(forked.stderr), cid
        assert real.changed == forked.changed == [], cid


def test_long_values_are_never_echoed(results):
    """The 300-character value of a config key, a stray argument or a search-space key: the line
    shows at most its first 80 characters."""
    for cid in ("config-long-value", "flag-stray-long-value", "sweep-space-long-key", "flag-save-path-too-long",
                "env-home-too-long"):
        r = results[cid]
        assert "0" * 100 not in r.stderr and "x" * 100 not in r.stderr and "s" * 100 not in r.stderr, cid
        assert "h" * 100 not in r.stderr, cid


def test_alias_bomb_is_refused_at_once_in_little_memory(results, tmp_path):
    """The alias bomb: the command refuses it in well under 2 s (the fork runner's clock), and
    reading it grows a fresh interpreter's memory by a few megabytes, not gigabytes."""
    import json as _json

    for cid in ("config-alias-bomb", "config-alias-bomb-train", "sweep-config-alias"):
        assert results[cid].seconds < 2.0, (cid, results[cid].seconds)
    bomb = _write(tmp_path / "bomb.yaml", ALIAS_BOMB)
    probe = (
        "import json, resource, sys, time\n"
        "from kronos_mlflow.config.core import load_config\n"
        "from kronos_mlflow.errors import ConfigError\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "start = time.monotonic()\n"
        "try:\n    load_config(path=sys.argv[1])\nexcept ConfigError as exc:\n    message = str(exc)\n"
        "print(json.dumps({'s': time.monotonic() - start, 'grew_kb': resource.getrusage(resource.RUSAGE_SELF)"
        ".ru_maxrss - before, 'message': message}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe, str(bomb)], capture_output=True, text=True, timeout=60,
                          env=tiny_runs.isolated_env(tmp_path, extra={"PYTHONPATH": str(ROOT)}))
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = _json.loads(proc.stdout.strip().splitlines()[-1])
    assert "alias" in got["message"] and "lol" not in got["message"]
    assert got["s"] < 2.0, got
    assert got["grew_kb"] < 30 * 1024, got  # kilobytes: under 30 MB


def test_no_secret_written_anywhere(results):
    """The secret-bearing cases left no credential in any file of their workspace either."""
    for cid in ("config-secret", "flag-secret", "sweep-secret-flag", "tracking-uri-password", "tracking-database-down"):
        r = results[cid]
        for path in r.ws.rglob("*"):
            if path.is_file():
                blob = path.read_bytes()
                for secret in NEVER_PRINTED:
                    assert secret.encode() not in blob, (cid, path)


# The data-sanity policy (what is refused, what is dropped), part of the generated page.
DATA_SANITY = """\
## Data sanity: what is refused, what is dropped

Market data reaches training through two doors: a Qlib provider directory (`--qlib-data-path`,
read by `kronos-mlflow prepare` and by every training run) and CSV files turned into one
(`kronos-mlflow import-csv`). Bad data is never used silently. Each kind of problem is either

- **refused**: one line on stderr naming the file, the line or row and the value, exit code 2,
  and nothing written (no cache, no lock file, no output directory); or
- **dropped**: the offending bars are left out, and one line per symbol
  (`[kronos] warning: SYMBOL in 'PATH': N bars dropped (...)`) says how many and why; the
  prepared cache's `manifest.json` keeps the counts (`stats.rows_dropped_*`,
  `stats.bars_dropped_by_symbol`). At most 20 symbols get a line each; one more line counts the
  rest.

The rule of thumb: what breaks the *index* of the data (the calendar, the listing spans, where a
series starts) cannot be repaired by dropping a bar, so it is refused; a damaged *bar* is one
observation a quant would throw away, so it is dropped and reported.

### Qlib provider directories

| problem | what happens | why |
|---|---|---|
| `calendars/<freq>.txt` repeats a date, or a date comes before the previous one | refused (file, both line numbers and dates) | every `*.bin` file is indexed by calendar line numbers: one extra or misplaced line shifts every series after it |
| a calendar line that is not a date, or not UTF-8 | refused | as above |
| `instruments/<name>.txt`: a span whose start is after its end | refused (file, line, symbol, both dates) | a reversed span selects no bars or the wrong ones; which was meant cannot be known |
| `instruments/<name>.txt`: a symbol that is not a plain name (`../x`, `a/b`) | refused | it names a features folder outside `features/` |
| `--instrument` that is not a plain name (`../calendars/day`) | refused before any file is opened | it would be read from outside `instruments/` |
| a `features/<sym>/<field>.<freq>.bin` whose first value (the calendar index it starts at) is not a whole number inside the calendar (negative, NaN, past the last day) | refused (file, the index, the calendar's range) | the series would be placed on the wrong days or read as empty |
| a bin file holding more values than the calendar has days left | refused | it belongs to another calendar |
| a bin file that is not whole float32 values | refused | truncated or not Qlib's format |
| NaN in a bar | dropped, counted (`rows_dropped_nonfinite`), no per-symbol line | NaN is Qlib's own encoding of "no bar" (suspension days, before listing) |
| an infinite price, volume or amount (including an amount that overflows float32) | dropped, one line per symbol | a damaged value |
| a bar whose high is below its low | dropped, one line per symbol | an impossible bar |

A bar whose high is below its open or close (or low above them) is kept: vendors round prices
differently for the extremes and for open/close, and such bars are common in real data.
Negative volume is not checked.

### CSV imports (`kronos-mlflow import-csv`)

| problem | what happens | why |
|---|---|---|
| a missing column, a cell that is not a number or a date, a file that is not UTF-8 CSV | refused (file, row, column, value) | |
| two rows for one symbol and bar, or rows out of time order | refused (file, row) | which row is right cannot be known |
| timestamps of one file in different time zones (`+08:00` and `+09:00`, or one with an offset and one without) | refused (file, both rows and values) | offsets are dropped on import (bars keep the exchange's local clock time, as Qlib stores them); two clocks in one file would interleave wrongly (offsets that change only at one zone's daylight saving, as yfinance writes them, are one clock: imported) |
| a spacing of bars that is not one Qlib frequency | refused | |
| a symbol (column or file name) or `--instrument` that is not a plain name | refused | it becomes a folder or file name |
| an empty cell | kept as a missing bar (NaN) | what an empty cell means |
| a value that is infinite or beyond what a float32 bin holds (`inf`, `1e39`) | the bar is stored as missing (NaN in every field), one line per symbol | a damaged value; the rest of the series is good |
| a bar whose high is below its low | stored as missing, one line per symbol | an impossible bar |

No raw pandas or numpy warning reaches the console: the package's own warnings are one line
(`[kronos] warning: ...`), and the conversions that would overflow are checked before they run.

### Checkpoints

A pretrained checkpoint (`--pretrained-tokenizer-path`) whose weights hold a NaN or an infinite
value is refused before training, like a truncated one (the message names the first such tensor
and the count): such a model trains to the end with NaN losses and keeps no best model.
"""


def render_table(results: dict[str, Result]) -> str:
    lines = [
        "# Hostile input: what each bad input gets",
        "",
        "Generated by `tests/test_hostile_input.py` from its cases and the messages they actually print",
        "(regenerate: `KRONOS_UPDATE_DOCS=1 python -m pytest -q tests/test_hostile_input.py -k docs`).",
        "Every case exits with code 2, prints this one line on stderr and nothing else there (no traceback),",
        "and leaves the existing checkpoints, training state, data cache and MLflow store byte-for-byte",
        "unchanged. `<ws>` is the working directory (a finished run's outputs and an MLflow store holding that",
        "FINISHED run, owned as a training leaves it, and a KILLED run another training owns), `<in>` holds",
        "the hostile files, `<market>` a small Qlib market.",
        "Credentials (from the environment, a config file, a flag or a tracking URI) are never printed.",
        "",
        "Where each kind of value is checked:",
        "",
        "- numbers: every config key has a range (`kronos_mlflow/config/core.py`); the seed is 0 to 2^32-1, what",
        "  numpy's and Optuna's samplers take; `nan`, `inf` and overflowing numbers are refused everywhere a",
        "  number goes (flags, YAML, MLproject parameters, the sweep's flags and pruner options, spool records);",
        "- names that become a file or folder (instrument, tokenizer_save_folder_name, the sweep's --study-name,",
        "  symbols in CSV files and instruments files) stay inside their parent; names MLflow refuses (registered",
        "  model, experiment, run) are refused when the config is read, not after the training;",
        "- YAML files (configs, search spaces) are checked on the parser's events before any value is built: no",
        "  alias, no tag, text keys only, caps on size, values, nesting and number length; a long value is never",
        "  echoed back whole, by any refusal;",
        "- `KRONOS_*` settings (one declaration each, `kronos_mlflow/config/settings.py`): a malformed one is",
        "  refused at the start of every command that reads it;",
        "- output paths must be directories or creatable ones; tracking and storage URIs need a scheme some",
        "  store serves and, for sqlite, an existing folder;",
        "- `--check` (the MLproject's first step) refuses whatever the run would refuse at its start or end:",
        "  device and process count, speed settings, Comet's key for `comet: online`, the pretrained checkpoint",
        "  (finite weights), windows per rank, `resume`, the run and experiment it would log to, max_restarts;",
        "- the stage-two doors (`kronos-mlflow pipeline`, `sweeps/sweep.py`, `kronos-mlflow evaluate`) make every",
        "  check their steps, trials or scoring would make before their first run or data cache (the kind of",
        "  model each path holds, bits, `runs:/` runs that are unknown, deleted or RUNNING, `max_context`, origins,",
        "  the backtest's range): [checked before work](reliability.md#checked-before-work);",
        "- data: [Data sanity](#data-sanity-what-is-refused-what-is-dropped) below says what is refused and what",
        "  is dropped with one line per symbol;",
        "- spools are data, not commands: see `kronos-mlflow upload-spool --help` and the spool rows below;",
        "- a training state, a spool, `MLFLOW_RUN_ID` or a run directory names a run only as a claim: the run",
        "  must carry the file's token, be in the command's experiment and store, not be FINISHED, and no other",
        "  live process may be writing it ([reliability](reliability.md#who-may-write-a-run));",
        "- every door obtains the runs it writes from one gate (`kronos_mlflow/tracking/gate.py`): the `gate` rows",
        "  run each door, and each MLproject entry point, with `MLFLOW_RUN_ID` of a FINISHED, a deleted, another",
        "  experiment's and a colleague's busy run; each is refused before any data is read;",
        "- names read from outside (a run id, a fold number in a handed-over `folds.json`, a cache's ref) are names,",
        "  never paths ([what a name may be](reliability.md#what-a-name-may-be)); handed-over files are read by one",
        "  checking reader each (the `handover` rows);",
        "- under torchrun, rank 0 alone prints a refusal every rank reaches and exits 2; the other workers print",
        "  nothing and wait (at most 20 s) for torchrun to stop them after rank 0's exit, so torchrun never stops",
        "  rank 0 before its line is out; `python -m kronos_mlflow.launch`, torchrun's drop-in that the MLproject",
        "  runs, shows only that line, without torchrun's own failure report (tests/test_hostile_launchers.py).",
        "",
        DATA_SANITY,
        "## Every case",
        "",
        "| # | case | area | input | the one line on stderr | exit |",
        "|---|------|------|-------|------------------------|------|",
    ]
    for i, case in enumerate(CASES, start=1):
        r = results[case.id]
        message = r.normalise(r.lines[0] if r.lines else "").replace("|", "\\|")
        what = case.what.replace("|", "\\|")
        lines.append(f"| {i} | {case.id} | {case.area} | {what} | {message} | {r.returncode} |")
    return "\n".join(lines) + "\n"


def test_docs_table_is_current(results):
    table = render_table(results)
    if os.environ.get("KRONOS_UPDATE_DOCS") == "1" or not DOCS.exists():
        DOCS.parent.mkdir(parents=True, exist_ok=True)
        DOCS.write_text(table, encoding="utf-8")
    assert DOCS.read_text(encoding="utf-8") == table, (
        "docs/hostile-input.md is stale; regenerate: KRONOS_UPDATE_DOCS=1 python -m pytest -q "
        "tests/test_hostile_input.py -k docs"
    )
