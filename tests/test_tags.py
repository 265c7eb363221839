"""Run tags: instrument, model size, codebook bits, and the git commit (never an error)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kronos_mlflow.training import tags

PACKAGE = Path(tags.__file__).resolve().parent


def test_run_tags_of_a_model():
    from kronos_mlflow.config.core import load_config, model_kwargs
    from kronos_mlflow.model import KronosTokenizer, count_parameters

    config = load_config({"d_model": 16, "n_heads": 2, "ff_dim": 32, "s1_bits": 4, "s2_bits": 4, "instrument": "mine"})
    model = KronosTokenizer(**model_kwargs(config))
    got = tags.run_tags(config, model)
    assert got["instrument"] == "mine"
    assert got["model_size"] == str(count_parameters(model.config)) == str(sum(p.numel() for p in model.parameters()))
    assert got["codebook_bits"] == "4+4"
    assert set(got) <= {"instrument", "model_size", "codebook_bits", tags.GIT_COMMIT_TAG}


@pytest.mark.skipif(shutil.which("git") is None or not (PACKAGE.parent / ".git").exists(),
                    reason="needs git and this package in a git checkout")
def test_git_commit_of_the_checkout():
    head = subprocess.run(["git", "-C", str(PACKAGE.parent), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("the checkout has no commit yet")
    assert tags.git_commit() == head.stdout.strip()


def test_no_git_commit_outside_a_checkout_or_without_git(tmp_path, monkeypatch):
    assert tags.git_commit(tmp_path / "pkg") is None  # not a git checkout (nor existing)
    # a package directory that is not at the top of the checkout is not credited with its commit
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
        nested = tmp_path / "repo" / "venv" / "site-packages" / "kronos_mlflow"
        nested.mkdir(parents=True)
        assert tags.git_commit(nested) is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no git at all
    assert tags.git_commit() is None
    assert tags.GIT_COMMIT_TAG not in tags.run_tags({"instrument": "csi300"})
