"""The published Kronos checkpoints as the default start: ``auto``, ``fresh`` or a given path.

``pretrained_tokenizer_path`` and ``pretrained_predictor_path`` default to ``auto``: the
published checkpoint (:data:`PUBLISHED`: ``NeoQuasar/Kronos-Tokenizer-base``,
``NeoQuasar/Kronos-small``, upstream's starting points) when the local Hugging Face cache holds
it, or, unless ``HF_HUB_OFFLINE`` is set, when the hub can be reached (it is downloaded into
that cache once); else fresh weights. ``fresh`` asks for fresh weights; an empty value means
fresh too (what it meant before ``auto`` existed); anything else is a checkpoint directory,
MLflow URI or hub id, used as given.

:func:`source` is what every reader of these keys asks (the stages' model building, the
zero-shot pair, the config digest), so ``auto`` is decided once per process and the digest
holds the decision: a run that started from the published tokenizer never shares a run
directory, training state or pipeline step with one that started fresh. A training run prints
one line per key it reads saying which and why (:func:`lines`) and records it as the tag
``<key>_source`` (:func:`tags`); the param keeps what was asked (``auto``). Under torchrun,
rank 0's decision is every rank's (:func:`adopt`). Config validation never reaches the hub: it
asks :func:`known` (the cache alone); a training run decides once its config is checked and keeps
the answer in its record (:mod:`kronos_mlflow.training.resolved`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from . import names
from ..errors import UserError, short_reason
from .stage_keys import PUBLISHED, stage_keys

AUTO, FRESH = "auto", "fresh"
_FILES = ("config.json", "model.safetensors")
#: a ref holds a commit hash (40 hex characters); what is read of one (a longer one is refused)
_REF_BYTES = 128
_REDOWNLOAD = ("remove that folder and download the checkpoint again (`hf download {hub_id}`), or set "
               "pretrained_tokenizer_path / pretrained_predictor_path to a checkpoint directory or fresh")
#: key -> (what the key resolves to: '' for fresh weights, else the hub id; why), per process
_DECIDED: dict[str, tuple[str, str]] = {}


def source(config: Mapping[str, Any], key: str) -> str:
    """What ``config[key]`` starts from: '' (fresh weights) or a checkpoint directory, MLflow
    URI or hub id. ``auto`` is decided on first use (:func:`decide`)."""
    value = str(config.get(key) or "").strip()
    if value.lower() == FRESH:
        return ""
    if value.lower() != AUTO or key not in PUBLISHED:
        return value
    return decide(key)[0]


def reason(config: Mapping[str, Any], key: str) -> str:
    """Why :func:`source` says what it says, in a few words."""
    value = str(config.get(key) or "").strip()
    if value.lower() == AUTO and key in PUBLISHED:
        return decide(key)[1]
    if not value or value.lower() == FRESH:
        return "fresh weights, as asked" if value else "fresh weights (empty)"
    return "as given"


def known(config: Mapping[str, Any], key: str) -> str | None:
    """:func:`source` as far as it is known without the network: a given value, a decision
    already made (:func:`adopt`, :func:`decide`), or ``auto`` decided from the Hugging Face cache
    alone (found there, or not there with ``HF_HUB_OFFLINE`` set); None when only the hub could
    say. What config validation asks (:func:`kronos_mlflow.config.core.validate` never reaches the hub)."""
    value = str(config.get(key) or "").strip()
    if value.lower() != AUTO or key not in PUBLISHED:
        return source(config, key)
    if key not in _DECIDED:
        seen = _peek(PUBLISHED[key])
        if seen is None:
            return None
        _DECIDED[key] = seen
    return _DECIDED[key][0]


def decide(key: str) -> tuple[str, str]:
    """``auto`` for ``key``: (the hub id, why) when the cache or the hub has it, else ('', why)."""
    if key not in _DECIDED:
        _DECIDED[key] = _look(PUBLISHED[key])
    return _DECIDED[key]


def adopt(decided: Mapping[str, tuple[str, str]]) -> None:
    """Take another process's decisions (rank 0's, under torchrun): every rank builds the same model."""
    _DECIDED.update({k: (str(v[0]), str(v[1])) for k, v in decided.items() if k in PUBLISHED})


def decisions(keys: Iterable[str]) -> dict[str, tuple[str, str]]:
    """This process's decisions for ``keys`` (made now where not yet made)."""
    return {key: decide(key) for key in keys if key in PUBLISHED}


def _cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _cache_repo(hub_id: str) -> Path:
    """``hub_id``'s folder in the Hugging Face cache (``models--OWNER--NAME``), from the cache's
    location and the id alone (never from a ref's content)."""
    return Path(_cache_dir()) / ("models--" + "--".join(hub_id.split("/")))


def check_ref(hub_id: str) -> None:
    """``refs/main`` of ``hub_id``'s cache folder, when there is one, names a snapshot: a plain
    name (a commit hash), never a path; else one line naming the cache and the ref."""
    ref = _cache_repo(hub_id) / "refs" / "main"
    if not os.path.lexists(ref):
        return
    try:
        if not ref.is_file():
            raise OSError("not a regular file")
        with open(ref, "rb") as fh:
            text = fh.read(_REF_BYTES + 1).decode("utf-8", errors="replace")
    except OSError as exc:
        raise UserError(f"Hugging Face cache {_cache_repo(hub_id)}: refs/main cannot be read "
                        f"({short_reason(exc, 80)}); expected a commit hash: {_REDOWNLOAD.format(hub_id=hub_id)}") from None
    try:
        names.plain_name(text, f"Hugging Face cache {_cache_repo(hub_id)}: refs/main", what="revision")
    except names.BadName as exc:
        raise UserError(f"{exc}: {_REDOWNLOAD.format(hub_id=hub_id)}") from None


def check_snapshot(hub_id: str, snapshot: str | os.PathLike) -> Path:
    """``snapshot`` (what ``huggingface_hub`` resolved for ``hub_id``) as a real path, when it lies
    inside the cache folder's ``snapshots/`` and its checkpoint files inside the cache folder
    (real paths: links followed); else one line naming the cache and the snapshot."""
    repo = _cache_repo(hub_id)
    where = f"Hugging Face cache {repo}: {hub_id}'s snapshot"
    try:
        real = names.inside(snapshot, repo / "snapshots", where)
        for name in _FILES:
            if os.path.lexists(os.path.join(real, name)):
                names.inside(os.path.join(real, name), repo, f"{where} file {name}")
    except names.BadName as exc:
        raise UserError(f"{exc}: {_REDOWNLOAD.format(hub_id=hub_id)}") from None
    return real


class HubUnreachable(Exception):
    """The hub (or, with ``local_only``, the cache) does not give the files; ``cause`` says why."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def fetch(hub_id: str, files: Iterable[str] = _FILES, *, local_only: bool = False,
          etag_timeout: float | None = None) -> Path:
    """The one hub download: ``hub_id``'s snapshot of ``files`` from the Hugging Face cache (and,
    unless ``local_only``, the hub), as a real path inside the cache folder. The cache's ref is
    checked before the cache is read through it and the snapshot after (:func:`check_ref`,
    :func:`check_snapshot`: a UserError for a cache that points elsewhere); a snapshot the cache
    or hub does not give is :class:`HubUnreachable` with the reason."""
    from huggingface_hub import snapshot_download

    check_ref(hub_id)
    options: dict[str, Any] = {"local_files_only": True} if local_only else {}
    if etag_timeout is not None:
        options["etag_timeout"] = etag_timeout
    try:
        snapshot = snapshot_download(repo_id=hub_id, allow_patterns=list(files), **options)
    except Exception as exc:  # noqa: BLE001 - offline, unknown repo, network, bad id: all the same to the user
        raise HubUnreachable(exc) from None
    return check_snapshot(hub_id, snapshot)


def _peek(hub_id: str) -> tuple[str, str] | None:
    """``auto`` for ``hub_id`` from the cache alone: the cache's snapshot, or fresh weights when it
    has none and ``HF_HUB_OFFLINE`` is set; None when only the hub could say (no network here)."""
    try:
        snapshot = str(fetch(hub_id, local_only=True))
    except HubUnreachable:  # not in the cache (or a cache it cannot read): the same to the user
        snapshot = ""
    if snapshot and all(os.path.isfile(os.path.join(snapshot, name)) for name in _FILES):
        revision = os.path.basename(os.path.normpath(snapshot))
        return hub_id, f"published {hub_id}, in the Hugging Face cache (revision {revision[:12]})"
    if _offline():
        return "", (f"fresh weights: {hub_id} is not in the Hugging Face cache ({_cache_dir()}) and HF_HUB_OFFLINE "
                    f"is set; `hf download {hub_id}` where there is network access fine-tunes the published model")
    return None


def _look(hub_id: str) -> tuple[str, str]:
    seen = _peek(hub_id)
    if seen is not None:
        return seen
    try:
        fetch(hub_id, etag_timeout=5)
    except HubUnreachable as exc:  # offline, unknown repo, network: fresh weights, said why
        return "", (f"fresh weights: {hub_id} is not in the Hugging Face cache ({_cache_dir()}) and the hub could "
                    f"not be reached ({short_reason(exc.cause, 100)}); set HF_HUB_OFFLINE=1 to skip the attempt")
    return hub_id, f"published {hub_id}, downloaded from the Hugging Face hub into {_cache_dir()}"


def used_keys(config: Mapping[str, Any], keys: Iterable[str]) -> list[str]:
    """The keys among ``keys`` that may be ``auto`` (in a stage's order)."""
    return [key for key in keys if key in PUBLISHED and key in config]


def read_by(config: Mapping[str, Any]) -> list[str]:
    """The keys a training run of ``config`` reads: its stage's models' (a predictor's tokenizer,
    also its zero-shot pair's), and the predictor ``objective: val_skill`` forecasts with."""
    keys = [key for names in stage_keys(config).models.values() for key in names]
    if config.get("objective") in ("val_skill", "val_ic"):
        keys.append("pretrained_predictor_path")
    return used_keys(config, dict.fromkeys(keys))


def given_instead(config: Mapping[str, Any]) -> dict[str, tuple[str, str, str]]:
    """The keys of :data:`PUBLISHED` that do not name the model the run builds because a key
    before them does (a predictor run's ``finetuned_tokenizer_path``, MLproject ``tokenizer``):
    key -> (the model, the key that names it, its value). Such a key is read for the zero-shot
    pair only."""
    out = {}
    for model, keys in stage_keys(config).models.items():
        first, value = keys[0], str(config.get(keys[0]) or "").strip()
        if first not in PUBLISHED and value:
            out.update({key: (model, first, value) for key in keys[1:]})
    return out


def lines(config: Mapping[str, Any], keys: Iterable[str]) -> list[str]:
    """One console line per model named by a key given in its place (``tokenizer:
    runs:/<id>/best_model (finetuned_tokenizer_path)``), then one per ``auto`` key: what it
    starts from and why (a given path needs none); a key read for the zero-shot pair only says so."""
    instead = given_instead(config)
    out = [f"{model}: {value} ({key})" for model, key, value in dict.fromkeys(instead.values())]
    for key in used_keys(config, keys):
        if str(config.get(key) or "").strip().lower() == AUTO:
            only = (f" (the zero-shot pair's only: the run's {instead[key][0]} is {instead[key][1]}'s)"
                    if key in instead else "")
            out.append(f"{key} auto: {reason(config, key)}{only}")
    return out


def tags(config: Mapping[str, Any], keys: Iterable[str]) -> dict[str, str]:
    """``<key>_source``: what each key started from: ``fresh``, the path or hub id as given, or
    for ``auto`` the choice and why (``NeoQuasar/Kronos-small (auto: published ..., in the cache ...)``);
    a key read for the zero-shot pair only names what the run used instead
    (``fresh (auto: ...; the zero-shot pair's only: the run's tokenizer is finetuned_tokenizer_path runs:/...)``)."""
    out, instead = {}, given_instead(config)
    for key in used_keys(config, keys):
        what = source(config, key) or FRESH
        notes = [f"auto: {reason(config, key)}"] if str(config.get(key) or "").strip().lower() == AUTO else []
        if key in instead:
            model, by, value = instead[key]
            notes.append(f"the zero-shot pair's only: the run's {model} is {by} {value}")
        out[f"{key}_source"] = f"{what} ({'; '.join(notes)})" if notes else what
    return out


def from_tag(value: str) -> str:
    """What a ``<key>_source`` tag says the run started from: '' (fresh) or the checkpoint."""
    what = str(value or "").split(" (", 1)[0].strip()
    return "" if what == FRESH else what
