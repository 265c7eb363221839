"""The predictor stage's inputs: which frozen tokenizer it trains on and the predictor it starts
from, each one line naming the bad value when it cannot be used.

The tokenizer is ``finetuned_tokenizer_path`` (MLproject ``tokenizer``): a checkpoint
directory, ``runs:/<id>/best_model``, ``models:/NAME@ALIAS`` or a hub id; empty means
``pretrained_tokenizer_path``, and when that is empty too, fresh tokenizer weights from the
config's sizes and ``seed`` (the same on every rank: a smoke test, not a useful model). A run
keeps the tokenizer it used in ``checkpoints/tokenizer/``, written once by rank 0 when the run
starts; every rank, and a resumed run, reads that copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ...config.core import model_kwargs
from ...config.published import source
from ...config.sections import as_section
from ...errors import ConfigError, UserError
from ...evaluation.sources import resolve_tokenizer, source_run
from ...tracking.keys import TOKENIZER_RUN_TAG, TOKENIZER_URI_TAG
from ...model import Kronos, KronosTokenizer
from ...config.model_spec import PREDICTOR_CONFIGS

FRESH = "fresh"


def tokenizer_spec(config: Mapping[str, Any]) -> str:
    """What names the predictor's tokenizer (``''``: fresh weights)."""
    tuned = as_section(config, "predictor").finetuned_tokenizer_path
    return str(tuned or "").strip() or source(config, "pretrained_tokenizer_path")


def configured_tokenizer(config: Mapping[str, Any], device="cpu"):
    """The tokenizer ``config`` names, in eval mode, on ``device``."""
    spec = tokenizer_spec(config)
    if spec:
        tuned = as_section(config, "predictor").finetuned_tokenizer_path
        what = "finetuned_tokenizer_path" if tuned else "pretrained_tokenizer_path"
        return resolve_tokenizer(spec, device, what=what)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(as_section(config, "job").seed))
        return KronosTokenizer(**model_kwargs(config)).to(device).eval()


def tokenizer_tags(config: Mapping[str, Any]) -> dict[str, str]:
    """``tokenizer_uri`` (as given, or ``fresh``) and, for ``runs:/`` and ``models:/`` URIs, the
    ``tokenizer_run_id`` of the run that trained it (when the store says)."""
    spec = tokenizer_spec(config)
    tags = {TOKENIZER_URI_TAG: spec or FRESH}
    run_id = source_run(spec)
    if run_id:
        tags[TOKENIZER_RUN_TAG] = run_id
    return tags


def build_predictor(config: Mapping[str, Any], tokenizer):
    """``pretrained_predictor_path`` loaded strictly, else a fresh ``Kronos`` at the config's
    sizes (``n_layers``, ``d_model``, ``n_heads``, ``ff_dim``) with Kronos-mini's dropouts and
    the tokenizer's bits. A predictor whose bits differ from the tokenizer's is refused."""
    predictor = as_section(config, "predictor")
    path = source(config, "pretrained_predictor_path")
    if path:
        try:
            model = Kronos.from_pretrained(path)
        except UserError as exc:  # the checkpoint's own line, with the argument it came from
            raise UserError(f"pretrained_predictor_path: {exc}") from None
    else:
        sizes = {**PREDICTOR_CONFIGS["Kronos-mini"], "s1_bits": tokenizer.s1_bits, "s2_bits": tokenizer.s2_bits,
                 "n_layers": int(predictor.n_layers),
                 **{k: int(getattr(as_section(config, "model"), k)) for k in ("d_model", "n_heads", "ff_dim")}}
        model = Kronos(**sizes)
    if (model.s1_bits, model.s2_bits) != (tokenizer.s1_bits, tokenizer.s2_bits):
        raise ConfigError(
            f"the predictor's codes are {model.s1_bits}+{model.s2_bits} bits but the tokenizer's "
            f"({tokenizer_spec(config) or FRESH}) are {tokenizer.s1_bits}+{tokenizer.s2_bits}; expected a tokenizer "
            "and predictor with the same s1_bits and s2_bits (Kronos-small and -base pair with "
            "NeoQuasar/Kronos-Tokenizer-base, Kronos-mini with NeoQuasar/Kronos-Tokenizer-2k)"
            + ("; pretrained_predictor_path auto chose the published predictor: give "
               "pretrained_predictor_path=fresh for fresh weights at the tokenizer's bits"
               if str(predictor.pretrained_predictor_path or "").strip().lower() == "auto" and path else "")
        )
    return model
