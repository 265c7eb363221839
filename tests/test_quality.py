"""Validation quality metrics: hand-checkable histograms and perplexities, per-feature MSE, the
stats gathered during the one validation pass, and the same numbers over two gloo ranks (with
the validation loss and the tokenizer's per-window test losses: one pair of ranks runs them all,
tests/two_ranks.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import two_ranks

from kronos_mlflow.evaluation import quality
from kronos_mlflow.data import loaders
from kronos_mlflow.evaluation.quality import CodeHistogram, ValidationStats
from kronos_mlflow.stages.tokenizer import training as tokenizer_training

# ----------------------------------------------------------------------------- pure functions


def test_code_histogram_by_hand():
    assert quality.code_histogram([0, 1, 1, 3, 3, 3], 2).tolist() == [1, 2, 0, 3]
    assert quality.code_histogram(torch.tensor([[7, 7], [0, 5]]), 3).tolist() == [1, 0, 0, 0, 0, 1, 0, 2]
    assert quality.code_histogram([], 1).tolist() == [0, 0]
    with pytest.raises(ValueError, match="code 4 is outside"):
        quality.code_histogram([0, 4], 2)


def test_perplexity_and_usage():
    # k equally used codes: perplexity k, whatever the count per code; unused bins do not count
    assert quality.perplexity([5] * 8) == pytest.approx(8.0)
    assert quality.perplexity([3, 0, 3, 0, 3, 3]) == pytest.approx(4.0)
    assert quality.perplexity([1024] * 1024) == pytest.approx(1024.0)
    assert quality.perplexity([42]) == pytest.approx(1.0)
    assert quality.perplexity([]) == 0.0 and quality.perplexity([0, 0]) == 0.0
    # a skewed pair by hand: p = (1/4, 3/4)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert quality.perplexity([1, 3]) == pytest.approx(math.exp(h))
    assert quality.usage([0, 2, 0, 1]) == 2


def test_s1_codes_are_the_low_bits():
    full = torch.tensor([0b1011_0110, 0b0000_1111, 0b1111_0000])
    assert quality.s1_codes(full, 4).tolist() == [0b0110, 0b1111, 0b0000]


def test_feature_mse_by_hand():
    target = torch.zeros(2, 3, 6)
    offsets = torch.tensor([0.0, 1.0, 2.0, 3.0, -1.0, 0.5])
    pred = target + offsets
    assert quality.feature_mse(pred, target).tolist() == pytest.approx((offsets ** 2).tolist())
    assert quality.feature_sse(pred, target).tolist() == pytest.approx((6 * offsets ** 2).tolist())
    with pytest.raises(ValueError, match="shape"):
        quality.feature_sse(pred, target[:, :2])


# ----------------------------------------------------------------------------- accumulators


@pytest.mark.parametrize("dense_max_bits", [20, 0])  # 0: the sparse path used above 20 bits
def test_code_histogram_accumulates_in_batches(dense_max_bits):
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 1 << 12, size=300_000) ** 2 % (1 << 12)  # skewed, some codes unused
    hist = CodeHistogram(12, dense_max_bits=dense_max_bits)
    assert hist.dense is (dense_max_bits >= 12)
    for chunk in np.array_split(codes, 37):  # more than one bulk count (every 65536 codes)
        hist.update(torch.from_numpy(chunk))
    hist.all_reduce()  # no process group: a no-op
    expected = np.bincount(codes, minlength=1 << 12)
    ids, counts = hist.ids_and_counts()
    assert ids.tolist() == np.nonzero(expected)[0].tolist()
    assert counts.tolist() == expected[expected > 0].tolist()
    assert hist.distinct == np.count_nonzero(expected) and hist.total == len(codes)
    assert hist.perplexity == pytest.approx(quality.perplexity(expected))


def test_sparse_histogram_takes_wide_codes():
    hist = CodeHistogram(62)
    assert not hist.dense
    big = (1 << 61) + 12345
    hist.update(torch.tensor([big, 3, big, (1 << 62) - 1]))
    ids, counts = hist.ids_and_counts()
    assert ids.tolist() == [3, big, (1 << 62) - 1] and counts.tolist() == [1, 2, 1]
    small = CodeHistogram(3)
    small.update(torch.tensor([8]))  # counted in bulk later: the range is checked then
    with pytest.raises(ValueError, match="code 8 is outside"):
        small.ids_and_counts()


def _tiny_model(s1_bits=4, s2_bits=4):
    from tiny_runs import TINY

    from kronos_mlflow.config.core import load_config, model_kwargs
    from kronos_mlflow.model import KronosTokenizer

    torch.manual_seed(0)
    return KronosTokenizer(**model_kwargs(load_config({**TINY, "s1_bits": s1_bits, "s2_bits": s2_bits}))).eval()


def test_validation_stats_match_direct_computation():
    model = _tiny_model()
    torch.manual_seed(1)
    batches = [torch.randn(5, 26, 6), torch.randn(3, 26, 6)]
    stats = ValidationStats.for_model(model)
    outs = []
    with torch.no_grad():
        for x in batches:
            (z_pre, z), _, _, codes = model(x)
            stats.update(x, z_pre, z, codes)
            outs.append((x, z_pre, z, codes))
    stats.all_reduce()
    m = stats.metrics()
    assert set(m) == set(quality.METRIC_NAMES)
    x = torch.cat([o[0] for o in outs])
    z_pre = torch.cat([o[1] for o in outs])
    z = torch.cat([o[2] for o in outs])
    codes = torch.cat([o[3] for o in outs]).reshape(-1)
    assert m["val_codebook_usage_full"] == len(torch.unique(codes))
    assert m["val_codebook_usage_s1"] == len(torch.unique(codes & 0xF))
    assert m["val_codebook_perplexity_full"] == pytest.approx(quality.perplexity(quality.code_histogram(codes, 8)))
    assert m["val_codebook_perplexity_s1"] == pytest.approx(quality.perplexity(quality.code_histogram(codes & 0xF, 4)))
    assert m["val_recon_loss_pre_epoch"] == pytest.approx(F.mse_loss(z_pre, x).item(), rel=1e-6)
    per_feature = [m[f"val_mse_{f}"] for f in ("open", "high", "low", "close", "vol", "amt")]
    assert per_feature == pytest.approx(((z - x) ** 2).mean(dim=(0, 1)).tolist(), rel=1e-6)
    # the six feature MSEs average to the full reconstruction's MSE
    assert np.mean(per_feature) == pytest.approx(F.mse_loss(z, x).item(), rel=1e-6)
    assert 1.0 <= m["val_codebook_perplexity_s1"] <= m["val_codebook_usage_s1"] <= 16
    assert "worst feature" in quality.describe(m, 4, 4)
    with pytest.raises(RuntimeError, match="already"):
        stats.all_reduce()


def test_empty_stats_have_no_metrics():
    assert ValidationStats(4, 4).metrics() == {}


class _CountingLoader:
    def __init__(self, loader):
        self.loader, self.passes = loader, 0

    def __iter__(self):
        self.passes += 1
        return iter(self.loader)


@pytest.fixture()
def val_setup(tiny):
    from kronos_mlflow.data import QlibDataset, prepare_splits

    config = tiny(n_val_iter=37, batch_size=5)  # odd count: uneven shards
    prepare_splits(config, progress=False)
    ds = QlibDataset("val", config)
    ds.set_epoch_seed(0)
    return config, ds


def test_stats_leave_the_validation_loss_unchanged_and_need_one_pass(val_setup):
    config, ds = val_setup
    model = _tiny_model()
    cpu = torch.device("cpu")
    plain = tokenizer_training.global_val_loss(model, loaders.val_loader_for(ds, config, 0, 1), cpu)
    loader = _CountingLoader(loaders.val_loader_for(ds, config, 0, 1))
    stats = ValidationStats.for_model(model)
    with_stats = tokenizer_training.global_val_loss(model, loader, cpu, stats)
    assert with_stats == plain  # bit for bit: val_tokenizer_loss_epoch is computed as before
    assert loader.passes == 1
    assert stats.rows == len(ds) * ds.window
    assert stats.s1.total == stats.full.total == len(ds) * ds.window
    feature_mses = [v for k, v in stats.metrics().items() if k.startswith("val_mse_")]
    assert np.mean(feature_mses) == pytest.approx(plain, rel=1e-5)


# ----------------------------------------------------------------------------- two ranks


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Each check of tests/two_ranks.py in one process and on one spawned pair of gloo ranks:
    ``{"single": {check: result}, "ranks": {check: [rank 0's, rank 1's]}, "val_windows": n}``."""
    from data_helpers import small_config, small_market_path
    from tiny_runs import TINY, isolate, tiny_config

    from kronos_mlflow.data import prepare_splits, provide_qlib_data

    root = tmp_path_factory.mktemp("two-ranks")
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, root)
        val = tiny_config(root, n_val_iter=37, batch_size=5)  # odd count: uneven shards
        provide_qlib_data(val)
        prepare_splits(val, progress=False)
        sizes = {k: TINY[k] for k in ("d_model", "n_heads", "ff_dim", "n_enc_layers", "n_dec_layers", "s1_bits",
                                      "s2_bits", "batch_size")}
        heldout = small_config(small_market_path(), root / "ds", **sizes, n_test_iter=19)  # odd: shares differ
        configs = {"heldout_scores": heldout, "val_loss": val, "val_stats": val}
        single = {name: two_ranks.CHECKS[name](config) for name, config in configs.items()}
        ds = two_ranks._val_dataset(val)
        return {"single": single, "ranks": two_ranks.run(configs, root), "val_windows": len(ds) * ds.window}


def test_two_ranks_gather_the_same_counts_as_one_process(pair):
    single, ranks = pair["single"]["val_stats"], pair["ranks"]["val_stats"]
    assert single["dense"]["s1"] == single["sparse"]["s1"] and single["dense"]["full"] == single["sparse"]["full"]
    for name in ("dense", "sparse"):
        for got in ranks:
            # the code counts are exact: the same histogram on every rank as in one process
            assert got[name]["s1"] == single[name]["s1"], name
            assert got[name]["full"] == single[name]["full"], name
            assert got[name]["rows"] == single[name]["rows"] == pair["val_windows"]
            assert got[name]["metrics"].keys() == single[name]["metrics"].keys()
            for key, value in single[name]["metrics"].items():
                assert got[name]["metrics"][key] == pytest.approx(value, rel=1e-9), (name, key)
        assert ranks[0][name]["metrics"] == ranks[1][name]["metrics"]
    assert ranks[0]["loss"] == pytest.approx(single["loss"], rel=1e-6)


def test_validation_over_two_ranks_equals_one_process(pair):
    """The validation loss of two ranks (uneven shards) is the one process's, on both ranks."""
    single, ranks = pair["single"]["val_loss"], pair["ranks"]["val_loss"]
    assert ranks[0]["loss"] == pytest.approx(ranks[1]["loss"], rel=1e-12)
    assert ranks[0]["loss"] == pytest.approx(single["loss"], rel=1e-6)
    # every validation sample counted exactly once across the ranks
    shards = [list(range(r, single["n"], 2)) for r in range(2)]
    assert sorted(shards[0] + shards[1]) == list(range(single["n"]))


def test_two_ranks_score_every_window_once_and_agree(pair):
    """The tokenizer's per-window test losses: both ranks hold every window's loss and the
    metrics of one process."""
    single, ranks = pair["single"]["heldout_scores"], pair["ranks"]["heldout_scores"]
    for got in ranks:
        assert np.allclose(got["losses"], single["losses"], rtol=1e-6)
        assert got["metrics"].keys() == single["metrics"].keys()
        for key, value in single["metrics"].items():
            assert got["metrics"][key] == pytest.approx(value, rel=1e-6), key
    assert ranks[0] == ranks[1]
