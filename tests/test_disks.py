"""Disks: ``--check`` refuses a folder a command would write that cannot be written (a read-only
mount, an immutable folder: what stops root too); a full disk met mid-run is one line naming the
folder, the run ends FAILED saying why, and the same command resumes once there is space."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from data_helpers import small_market_path
from tiny_runs import TRACKING_ENV, create_sqlite_store, isolated_vars, tiny_values, train_command


def _unwritable(folder: Path):
    """``folder`` made unwritable for this process, root included (``chattr +i`` where it may: chmod
    does not stop root); a callable that makes it writable again. Skips where neither holds."""
    folder.chmod(0o555)
    undo = [lambda: folder.chmod(0o755)]
    if os.access(folder, os.W_OK) and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0:
        undo.insert(0, lambda: subprocess.run(["chattr", "-i", str(folder)], check=True))
    if os.access(folder, os.W_OK):
        for step in undo:
            step()
        pytest.skip("no way to make a folder unwritable for this process here (root without chattr +i)")
    return lambda: [step() for step in undo]


def test_check_refuses_an_existing_save_path_that_cannot_be_written(tmp_path, commands):
    save = tmp_path / "outputs"
    save.mkdir()
    writable_again = _unwritable(save)
    try:
        proc = commands.run(train_command(tmp_path) + ["--check"], cwd=tmp_path,
                            env={**os.environ, **isolated_vars(tmp_path)})
    finally:
        writable_again()
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"kronos-mlflow train: error: save_path: directory '{save}' is not writable; "
                                        "expected a writable directory path"]
    assert not (tmp_path / "cache").exists() and list(save.iterdir()) == []


def test_a_full_disk_mid_run_is_one_line_a_failed_run_and_the_same_command_resumes(tmp_path, monkeypatch, capsys):
    import safetensors.torch
    from mlflow import MlflowClient
    from safetensors import SafetensorError

    from kronos_mlflow.training.run import cli

    for name in TRACKING_ENV:
        monkeypatch.delenv(name, raising=False)
    uri = create_sqlite_store(tmp_path)
    for name, value in isolated_vars(tmp_path, uri).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    small = {"qlib_data_path": str(small_market_path()), "dataset_begin_time": "2020-01-01",
             "dataset_end_time": "2021-12-31", "train_time_range": "2020-01-01:2021-06-30",
             "val_time_range": "2021-05-01:2021-09-30", "test_time_range": "2021-09-01:2021-12-31"}
    argv = [a for k, v in tiny_values(tmp_path, epochs=2, **small).items() for a in (f"--{k.replace('_', '-')}", str(v))]

    saves = []
    real = safetensors.torch.save_file

    def full_at_the_last_epochs_state(tensors, filename, metadata=None):
        if Path(filename).parent.name.startswith(".last.tmp-"):  # the training state, every epoch
            saves.append(filename)
            if len(saves) == 5:  # 2 files before the first epoch, 2 after it; after the second: no space
                raise SafetensorError(f'Error while serializing: I/O error: No space left on device (os error 28) '
                                      f'at path "{filename}"')
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", full_at_the_last_epochs_state)
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "SafetensorError" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("kronos-mlflow train: error: no space left on the device writing '")
    assert "checkpoints/last' (No space left on device); free space there, then run the same command again" in line
    client = MlflowClient(uri)
    (run,) = client.search_runs(["0"])
    assert run.info.status == "FAILED" and "no space left on the device writing" in run.data.tags["failure_reason"]

    monkeypatch.setattr(safetensors.torch, "save_file", real)  # space again
    assert cli(argv) == 0
    assert "resuming at epoch 2/2" in capsys.readouterr().out  # the first epoch is not trained again
    (again,) = client.search_runs(["0"])
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
