"""Plots: each PNG is written, non-empty and of the expected size; the run-level helper draws from
the best checkpoint, logs under plots/, and never fails a run."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from recording import Recorder

from kronos_mlflow.evaluation import plots
from kronos_mlflow.config.features import normalize_windows
from kronos_mlflow.evaluation.quality import ValidationStats

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _assert_png(path, width, height):
    import matplotlib.image as mpimg

    data = open(path, "rb").read()
    assert data[:8] == PNG_MAGIC and len(data) > 20_000, path
    image = mpimg.imread(path)
    assert image.shape[:2] == (height, width)
    assert image[..., :3].std() > 0.05  # something is drawn, not a blank canvas


def _raw_window(t=26, seed=0):
    rng = np.random.default_rng(seed)
    close = 50 * np.exp(np.cumsum(rng.normal(0, 0.02, t)))
    open_ = close * (1 + rng.normal(0, 0.01, t))
    high = np.maximum(open_, close) * (1 + rng.uniform(0, 0.01, t))
    low = np.minimum(open_, close) * (1 - rng.uniform(0, 0.01, t))
    vol = rng.uniform(1e5, 1e6, t)
    amt = (open_ + high + low + close) / 4 * vol
    return np.stack([open_, high, low, close, vol, amt], axis=1).astype(np.float32)


def test_denormalize_inverts_the_training_normalisation():
    raw = _raw_window()
    z = normalize_windows(raw, 20, clip=1e9)
    assert np.allclose(plots.denormalize(z, raw, 20), raw, rtol=1e-5)


def test_reconstruction_png(tmp_path):
    raw = _raw_window()
    x = normalize_windows(raw, 20, 5.0)
    rng = np.random.default_rng(1)
    out = plots.plot_reconstruction(raw, x, x + rng.normal(0, 0.5, x.shape), x + rng.normal(0, 0.1, x.shape), 20,
                                    str(tmp_path / "r.png"), title="test window")
    assert out == str(tmp_path / "r.png")
    _assert_png(out, 1600, 720)


@pytest.mark.parametrize("s1_bits, s2_bits", [(4, 4), (10, 10), (13, 13)])  # 13: too many s1 codes to show by id
def test_token_usage_png(tmp_path, s1_bits, s2_bits):
    rng = np.random.default_rng(0)
    full = rng.zipf(1.3, size=5000) % (1 << (s1_bits + s2_bits))
    s1 = full & ((1 << s1_bits) - 1)
    s1_ids, s1_counts = np.unique(s1, return_counts=True)
    full_ids, full_counts = np.unique(full, return_counts=True)
    out = plots.plot_token_usage(s1_ids, s1_counts, full_ids, full_counts, s1_bits, s2_bits,
                                 str(tmp_path / "u.png"))
    _assert_png(out, 1500, 540)


@pytest.fixture()
def trained_dir(tmp_path, tiny):
    """A best_model checkpoint, the validation split and stats of a fresh TINY model (no training)."""
    from kronos_mlflow.config.core import model_kwargs
    from kronos_mlflow.data import QlibDataset, prepare_splits
    from kronos_mlflow.model import KronosTokenizer
    from kronos_mlflow.data.loaders import val_loader_for
    from kronos_mlflow.stages.tokenizer.training import global_val_loss

    config = tiny(run_name="plot-test")
    prepare_splits(config, progress=False)
    torch.manual_seed(0)
    model = KronosTokenizer(**model_kwargs(config))
    save_dir = tmp_path / "run"
    model.save_pretrained(save_dir / "checkpoints" / "best_model")
    ds = QlibDataset("val", config)
    ds.set_epoch_seed(0)
    stats = ValidationStats.for_model(model)
    global_val_loss(model, val_loader_for(ds, config, 0, 1), torch.device("cpu"), stats)
    return config, save_dir, ds, stats


def test_log_validation_plots_draws_the_fixed_window_and_logs_under_plots(trained_dir):
    config, save_dir, ds, stats = trained_dir
    ds.set_epoch_seed(7)  # the plot must still take window 0 of epoch seed 0, and restore the seed
    logger = Recorder()
    paths = plots.log_validation_plots(logger, config, str(save_dir), ds, stats, best_epoch=1)
    assert [p.rsplit("/", 1)[1] for p in paths] == [plots.RECONSTRUCTION_PNG, plots.TOKEN_USAGE_PNG]
    assert logger.calls == [("log_artifact", p, "plots") for p in paths]
    for path in paths:
        assert path.startswith(str(save_dir / "plots"))
    _assert_png(paths[0], 1600, 720)
    _assert_png(paths[1], 1500, 540)
    assert ds.epoch_seed == 7
    # the same window as the validation's first sample of epoch seed 0
    inputs = plots.reconstruction_inputs(plots_model(save_dir), ds)
    ds.set_epoch_seed(0)
    assert np.array_equal(inputs["x_norm"], ds[0][0].numpy())
    assert np.array_equal(inputs["raw"], ds.raw_windows([0])[0])
    assert inputs["info"]["symbol"].startswith("DEMO")


def plots_model(save_dir):
    from kronos_mlflow.model import KronosTokenizer

    return KronosTokenizer.from_pretrained(save_dir / "checkpoints" / "best_model")


def test_plot_failures_never_fail_the_run(trained_dir, caplog):
    config, save_dir, ds, stats = trained_dir
    down = Recorder(fail_on="log_artifact", error=OSError("artifact store is down"))
    with caplog.at_level(logging.WARNING, logger="kronos_mlflow.evaluation.plots"):
        assert plots.log_validation_plots(down, config, str(save_dir), ds, stats, 0) == []
    assert "artifact store is down" in caplog.text
    # no checkpoint (e.g. no epoch finished): nothing to draw, no error
    assert plots.log_validation_plots(Recorder(), config, str(save_dir / "missing"), ds, stats, 0) == []
    # no validation split: only what can be drawn
    paths = plots.write_validation_plots(str(save_dir / "p2"), plots_model(save_dir), None, stats, config, None)
    assert [p.rsplit("/", 1)[1] for p in paths] == [plots.TOKEN_USAGE_PNG]
