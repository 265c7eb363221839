"""Hostile input through the real command lines: one clear line, exit code 2, nothing touched.

Each case runs a real entry point in a subprocess (``kronos-mlflow ...``, ``python -m
kronos_mlflow.train --check ...``, the MLproject ``main`` check command rendered from the
MLproject file the way ``mlflow run`` renders it, ``python sweeps/sweep.py ...``) in its own copy
of a workspace holding a finished run's outputs (best checkpoint, training state), a prepared
data cache, a small Qlib market and an MLflow store. Every case must:

- exit with code 2 and print exactly one non-empty line on stderr, without a traceback;
- name the bad value (``needle``);
- leave every file of the workspace as it was (SHA-256 of each file before and after; no new
  file either);
- never print a credential: COMET_API_KEY, MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_TOKEN are
  set for every case, and cases put secrets in a config file, a flag and a tracking URI.

``docs/hostile-input.md`` is generated from these cases and their actual messages::

    KRONOS_UPDATE_DOCS=1 python -m pytest -q tests/test_hostile_input.py -k docs

and ``test_docs_table_is_current`` fails when it is stale.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import tiny_runs
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


def make_configs(inp: Path, ws: Path) -> None:
    _write(inp / "latin1.yaml", b"epochs: 3\nrun_name: caf\xe9\n")
    _write(inp / "list.yaml", "- epochs\n- 3\n")
    _write(inp / "broken.yaml", "epochs: [1, 2\n")
    _write(inp / "secret.yaml", f"epochs: 2\ncomet_api_key: {CONFIG_SECRET}\n")
    _write(inp / "typo.yaml", "epoch: 3\n")
    _write(inp / "huge.yaml", "d_model: 16384\nn_heads: 64\nff_dim: 65536\nn_enc_layers: 64\nn_dec_layers: 64\n")
    _write(inp / "space.yaml", b"learning_rate: {low: 1.0e-5, high: \xff\xfe}\n")
    _write(inp / "spool.jsonl", b'{"type": "header", "format": "kronos-mlflow-spool", "run_id": "\xff"}\n')


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


TRAIN = ("{py}", "-m", "kronos_mlflow.train", "--check")
CLI = ("{py}", "-m", "kronos_mlflow.cli")
SWEEP = ("{py}", str(ROOT / "sweeps" / "sweep.py"))
MLPROJECT = ("<mlproject>",)


def _flags(values: dict) -> tuple[str, ...]:
    out: list[str] = []
    for key, value in values.items():
        out += [f"--{key.replace('_', '-')}", str(value)]
    return tuple(out)


BASE = _flags({**TINY, **DATES, "qlib_data_path": "{market}", "dataset_path": "{ws}/cache",
               "save_path": "{ws}/outputs"})

CASES: list[Case] = [
    # --- command-line flags (python -m kronos_mlflow.train --check / kronos-mlflow train --check)
    Case("flag-epochs-zero", "flag", "`--epochs 0`", TRAIN + BASE + ("--epochs", "0"), "epochs"),
    Case("flag-lr-text", "flag", "`--learning-rate fast`", TRAIN + BASE + ("--learning-rate", "fast"), "'fast'"),
    Case("flag-weight-decay-nan", "flag", "`--weight-decay nan`", TRAIN + BASE + ("--weight-decay", "nan"), "nan"),
    Case("flag-unknown", "flag", "`--no-such-key 1`", TRAIN + BASE + ("--no-such-key", "1"), "--no-such-key"),
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
]


# ----------------------------------------------------------------------------- the workspace


def _build_template(root: Path) -> Path:
    """A finished run's workspace: market, prepared cache, best checkpoint, training state, MLflow store."""
    import torch
    from mlflow import MlflowClient

    from kronos_mlflow import checkpoint as ckpt
    from kronos_mlflow.config import load_config, model_kwargs
    from kronos_mlflow.data import prepare_splits, write_demo_market
    from kronos_mlflow.model import KronosTokenizer

    ws = root / "ws"
    market = write_demo_market(root.parent / "market", 8, 3, start="2020-01-01", end="2021-12-31")
    config = load_config({**TINY, **{k: v for k, v in DATES.items()}, "qlib_data_path": str(market),
                          "dataset_path": str(ws / "cache"), "save_path": str(ws / "outputs")})
    prepare_splits(config, progress=False)
    torch.manual_seed(0)
    model = KronosTokenizer(**model_kwargs(config))
    from kronos_mlflow.layout import RunLayout

    save_dir = RunLayout.of(config).root  # outputs/finetune_tokenizer_demo/cfg-<digest>
    model.save_pretrained(save_dir / "checkpoints" / "best_model")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=10)
    ckpt.save_training_state(ckpt.state_dir(save_dir), model=model, optimizer=optimizer, scheduler=scheduler,
                             epoch=0, global_step=4, best_val_loss=0.5, run_ids={"mlflow_run_id": "x"},
                             config_digest=ckpt.config_digest(config))
    (save_dir / "summary.json").write_text('{"best_val_loss": 0.5}\n')
    uri = f"sqlite:///{ws / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run("0", run_name="finished")
    client.log_metric(run.info.run_id, "best_val_loss", 0.5)
    client.set_terminated(run.info.run_id)
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


def _mlproject_check_command(overrides: dict[str, str]) -> str:
    """The first (``--check``) half of MLproject's ``main`` command, rendered as ``mlflow run``
    renders it: every parameter shell-quoted, defaults for those not given."""
    import yaml

    spec = yaml.safe_load((ROOT / "MLproject").read_text())["entry_points"]["main"]
    values = {name: str(p.get("default", "")) for name, p in spec["parameters"].items()}
    values.update(overrides)
    command = spec["command"].split("&&")[0]
    return command.format(**{k: shlex.quote(v) for k, v in values.items()})


@dataclass
class Result:
    case: Case
    returncode: int
    stdout: str
    stderr: str
    changed: list[str]
    ws: Path
    inp: Path

    @property
    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]

    def normalise(self, text: str) -> str:
        market = str(self.ws.parent.parent.parent / "market")
        text = text.replace(str(self.ws), "<ws>").replace(str(self.inp), "<in>").replace(market, "<market>")
        return text.replace(sys.executable, "python")


def _run_case(case: Case, template: Path, root: Path) -> Result:
    base = root / case.id
    ws, inp = base / "ws", base / "in"
    shutil.copytree(template, ws, symlinks=True)
    inp.mkdir(parents=True)
    make_all(inp, ws)
    if case.make:
        case.make(inp, ws)
    before = _hashes(ws)
    env = tiny_runs.isolated_env(ws, extra={**SECRETS, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    env.update(case.env)
    market = root.parent / "market"
    fill = {"ws": str(ws), "in": str(inp), "py": sys.executable, "market": str(market)}
    if case.argv[0] == "<mlproject>":
        overrides = {"qlib_data_path": str(market), "config_file": str(inp / "mlproject.yaml"),
                     **{k: v for k, v in DATES.items()}}
        _write(inp / "mlproject.yaml", "".join(f"{k}: {v}\n" for k, v in {
            **TINY, "dataset_path": str(ws / "cache"), "save_path": str(ws / "outputs")}.items()))
        for item in case.argv[1:]:
            key, _, value = item.partition("=")
            overrides[key] = value.format(**fill)
        argv = ["bash", "-c", _mlproject_check_command(overrides)]
    else:
        argv = [a.format(**fill) for a in case.argv]
    proc = subprocess.run(argv, cwd=ws, env=env, capture_output=True, text=True, timeout=300)
    after = _hashes(ws)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return Result(case, proc.returncode, proc.stdout, proc.stderr, changed, ws, inp)


@pytest.fixture(scope="module")
def results() -> dict[str, Result]:
    """Every case, run once, three at a time (each in its own workspace copy)."""
    root = Path(tempfile.mkdtemp(prefix="kronos-hostile-"))
    try:
        template = _build_template(root / "template")
        market_before = _hashes(root / "market")
        with ThreadPoolExecutor(max_workers=3) as pool:
            futures = {c.id: pool.submit(_run_case, c, template, root / "cases") for c in CASES}
            out = {cid: f.result() for cid, f in futures.items()}
        assert _hashes(root / "market") == market_before, "a case changed the shared Qlib market"
        yield out
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ----------------------------------------------------------------------------- the tests


def test_config_size_guard_matches_the_model():
    """The config's size guard counts a fresh model's parameters without building it: the count
    equals the parameters of the model built from the same config."""
    from kronos_mlflow.config import fresh_parameter_count, load_config, model_kwargs
    from kronos_mlflow.model import KronosTokenizer

    for sizes in ({}, TINY, {"d_model": 128, "n_heads": 8, "ff_dim": 384, "n_enc_layers": 5, "n_dec_layers": 3,
                             "s1_bits": 9, "s2_bits": 11}):
        config = load_config({k: v for k, v in sizes.items() if k != "comet"})
        built = sum(p.numel() for p in KronosTokenizer(**model_kwargs(config)).parameters())
        assert fresh_parameter_count(config) == built


def test_there_are_enough_cases_across_all_areas():
    assert len(CASES) >= 20 and len({c.id for c in CASES}) == len(CASES)
    assert {c.area for c in CASES} >= {"flag", "MLproject", "config file", "Qlib dir", "CSV", "checkpoint", "sweep"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_one_line_exit_2_and_touches_nothing(results, case):
    r = results[case.id]
    detail = f"rc={r.returncode}\nstderr:\n{r.stderr[-3000:]}\nstdout:\n{r.stdout[-1000:]}"
    assert r.returncode == 2, detail
    assert "Traceback" not in r.stderr + r.stdout, detail
    assert len(r.lines) == 1, detail
    assert case.needle in r.lines[0], detail
    assert r.changed == [], f"files changed in the workspace: {r.changed}"
    for secret in NEVER_PRINTED:
        assert secret not in r.stdout + r.stderr, f"{secret} printed:\n{detail}"


def test_no_secret_written_anywhere(results):
    """The secret-bearing cases left no credential in any file of their workspace either."""
    for cid in ("config-secret", "flag-secret", "sweep-secret-flag", "tracking-uri-password"):
        r = results[cid]
        for path in r.ws.rglob("*"):
            if path.is_file():
                blob = path.read_bytes()
                for secret in NEVER_PRINTED:
                    assert secret.encode() not in blob, (cid, path)


def render_table(results: dict[str, Result]) -> str:
    lines = [
        "# Hostile input: what each bad input gets",
        "",
        "Generated by `tests/test_hostile_input.py` from its cases and the messages they actually print",
        "(regenerate: `KRONOS_UPDATE_DOCS=1 python -m pytest -q tests/test_hostile_input.py -k docs`).",
        "Every case exits with code 2, prints this one line on stderr and nothing else there (no traceback),",
        "and leaves the existing checkpoints, training state, data cache and MLflow store byte-for-byte",
        "unchanged. `<ws>` is the working directory (a finished run's outputs), `<in>` holds the hostile files.",
        "Credentials (from the environment, a config file, a flag or a tracking URI) are never printed.",
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



