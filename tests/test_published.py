"""The published checkpoints as the default start (``auto``): a Hugging Face cache written by the
test holds "published" upstream-format checkpoints (tests/hf_cache.py); the session's own cache
(tests/conftest.py) is empty, so everywhere else ``auto`` starts fresh. The quick start's
``mlflow run .`` from such a cache: tests/test_verdict_runs.py."""

from __future__ import annotations


import pytest
import torch
from hf_cache import write_published
from tiny_runs import TINY, forget_published

from kronos_mlflow.config import published
from kronos_mlflow.config.core import load_config, model_kwargs
from kronos_mlflow.config.digest import config_digest
from kronos_mlflow.errors import ConfigError

SIZES = ("d_model", "n_heads", "ff_dim", "n_enc_layers", "n_dec_layers", "s1_bits", "s2_bits")
TOKENIZER_ID, PREDICTOR_ID = published.PUBLISHED.values()


def _tiny_tokenizer(seed: int = 5):
    from kronos_mlflow.model import KronosTokenizer

    torch.manual_seed(seed)
    return KronosTokenizer(**model_kwargs(load_config({k: TINY[k] for k in SIZES})))


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """An empty hub cache of this test's own; ``auto`` decided again."""
    path = tmp_path / "hf-cache"
    path.mkdir()
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_CACHE", str(path))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(path))
    forget_published()
    yield path
    forget_published()


def test_auto_is_fresh_without_the_published_checkpoint_and_the_digest_is_an_empty_paths(cache):
    config = load_config({"stage": "tokenizer"})
    assert config["pretrained_tokenizer_path"] == "auto" and config["pretrained_predictor_path"] == "auto"
    assert published.source(config, "pretrained_tokenizer_path") == ""
    why = published.reason(config, "pretrained_tokenizer_path")
    assert why.startswith(f"fresh weights: {TOKENIZER_ID} is not in the Hugging Face cache ({cache})")
    assert "HF_HUB_OFFLINE" in why
    # fresh, empty and auto-found-nothing are one start: one digest, the digest runs made before auto had
    digests = {config_digest(load_config({"pretrained_tokenizer_path": v})) for v in ("auto", "fresh", "", "FRESH")}
    assert len(digests) == 1
    assert published.tags(config, published.read_by(config)) == {
        "pretrained_tokenizer_path_source": f"fresh (auto: {why})"}
    assert published.lines(config, ["pretrained_tokenizer_path"]) == [f"pretrained_tokenizer_path auto: {why}"]
    assert published.from_tag(f"fresh (auto: {why})") == ""


def test_auto_is_the_published_checkpoint_when_the_cache_holds_it(cache):
    write_published(cache, TOKENIZER_ID, _tiny_tokenizer())
    forget_published()  # building the tiny model loaded a config, which decided auto before the cache held it
    config = load_config({})
    assert published.source(config, "pretrained_tokenizer_path") == TOKENIZER_ID
    assert published.reason(config, "pretrained_tokenizer_path").startswith(
        f"published {TOKENIZER_ID}, in the Hugging Face cache (revision ")
    fresh = load_config({"pretrained_tokenizer_path": "fresh"})
    assert config_digest(config) != config_digest(fresh)  # reuse never mixes the two starts
    assert config_digest(config) == config_digest(load_config({"pretrained_tokenizer_path": TOKENIZER_ID}))
    tag = published.tags(config, ["pretrained_tokenizer_path"])["pretrained_tokenizer_path_source"]
    assert tag.startswith(f"{TOKENIZER_ID} (auto: published ") and published.from_tag(tag) == TOKENIZER_ID
    # the tokenizer stage builds it; a given path and fresh are used as they are
    from kronos_mlflow.stages import spec_of

    built = spec_of(config).build_model(config)
    for name, tensor in _tiny_tokenizer().state_dict().items():
        assert torch.equal(tensor, built.state_dict()[name]), name
    assert published.source(load_config({"pretrained_tokenizer_path": "./ckpt"}), "pretrained_tokenizer_path") == "./ckpt"
    assert published.tags(fresh, ["pretrained_tokenizer_path"]) == {"pretrained_tokenizer_path_source": "fresh"}


def test_a_rank_takes_rank_zeros_decision(cache):
    published.adopt({"pretrained_tokenizer_path": (TOKENIZER_ID, "rank 0 found it"), "other": ("x", "y")})
    config = load_config({})
    assert published.source(config, "pretrained_tokenizer_path") == TOKENIZER_ID
    assert published.reason(config, "pretrained_tokenizer_path") == "rank 0 found it"
    assert "other" not in published.decisions(["other"])


def test_a_predictor_run_reads_both_keys_a_tokenizer_run_one():
    assert published.read_by(load_config({})) == ["pretrained_tokenizer_path"]
    assert published.read_by(load_config({"stage": "predictor"})) == ["pretrained_tokenizer_path",
                                                                        "pretrained_predictor_path"]


def test_a_predictor_given_a_tokenizer_names_it_and_its_pretrained_key_says_it_is_the_zero_shot_pairs(cache):
    """``-P tokenizer=runs:/<id>/best_model``: the start line names the tokenizer the run uses, and
    ``pretrained_tokenizer_path`` (auto: fresh here) says it serves the zero-shot pair only; its tag
    still starts with what auto chose (what ``evaluate`` reads for the zero-shot pair)."""
    uri = "runs:/0123456789abcdef0123456789abcdef/best_model"
    config = load_config({"stage": "predictor", "finetuned_tokenizer_path": uri})
    keys = published.read_by(config)
    lines = published.lines(config, keys)
    assert lines[0] == f"tokenizer: {uri} (finetuned_tokenizer_path)"
    assert lines[1].startswith("pretrained_tokenizer_path auto: fresh weights: ")
    assert lines[1].endswith("(the zero-shot pair's only: the run's tokenizer is finetuned_tokenizer_path's)")
    assert not any(line.startswith("pretrained_tokenizer_path auto: fresh weights") and "zero-shot" not in line
                   for line in lines)
    tags = published.tags(config, keys)
    tag = tags["pretrained_tokenizer_path_source"]
    assert tag.startswith("fresh (auto: fresh weights: ") and tag.endswith(
        f"; the zero-shot pair's only: the run's tokenizer is finetuned_tokenizer_path {uri})")
    assert published.from_tag(tag) == ""  # the zero-shot pair's start, as before
    assert tags["pretrained_predictor_path_source"].startswith("fresh (auto: ")  # the predictor: what it started from
    # a given pretrained_tokenizer_path: no auto line, the given tokenizer still named
    given = load_config({"stage": "predictor", "finetuned_tokenizer_path": uri, "pretrained_tokenizer_path": "fresh"})
    assert published.lines(given, ["pretrained_tokenizer_path"]) == [f"tokenizer: {uri} (finetuned_tokenizer_path)"]
    assert published.tags(given, ["pretrained_tokenizer_path"])["pretrained_tokenizer_path_source"] == (
        f"fresh (the zero-shot pair's only: the run's tokenizer is finetuned_tokenizer_path {uri})")
    # without a given tokenizer the auto line is the run's own tokenizer, as before
    plain = load_config({"stage": "predictor"})
    assert [x for x in published.lines(plain, published.read_by(plain)) if "zero-shot" in x or "tokenizer:" in x] == []


def test_validating_auto_never_reaches_the_hub_and_the_record_leaves_the_config_as_it_was(cache, monkeypatch):
    """Online (no HF_HUB_OFFLINE) with an empty cache: loading and validating a config of ``auto``
    opens no connection; the record made after the checks decides (here the hub is unreachable:
    fresh weights, said why) and the config stays as validated."""
    import copy
    import socket

    from kronos_mlflow.training.resolved import resolve

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls = []

    def refuse(self, address, *args):
        calls.append(address)
        raise OSError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    config = load_config({"stage": "predictor", "objective": "val_skill", "val_time_range": "2022-09-01:2025-01-31"})
    assert calls == [] and published.known(config, "pretrained_tokenizer_path") is None
    asked = copy.deepcopy(config)
    record = resolve(config, environ={})
    assert config == asked and config["run_name"] == "" and config["pretrained_tokenizer_path"] == "auto"
    assert record.start("pretrained_tokenizer_path")[0] == "" and "could not be reached" in record.start(
        "pretrained_tokenizer_path")[1]
    assert record.run_name.startswith("predictor ") and record.run_config(config)["run_name"] == record.run_name
    assert record.as_json()["starts"]["pretrained_predictor_path"]["source"] == ""
    # a check that waits on auto's answer is made with the record, in validation's words
    forget_published()
    tokenizer = load_config({"objective": "val_skill", "val_time_range": "2022-09-01:2025-01-31"})
    with pytest.raises(ConfigError, match="objective val_skill for the tokenizer .* auto found no published predictor"):
        resolve(tokenizer, environ={})
