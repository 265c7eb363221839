"""What a fine-tune trains (``finetune_mode``): every weight (``full``, upstream's), low-rank adapters
through Hugging Face ``peft`` (``lora``), or the top of the model with its embeddings and bottom
blocks frozen (``freeze``); docs/finetune-modes.md. peft loads only for ``lora`` (it imports
transformers: seconds).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config.core import lora_targets
from ..config.sections import as_section
from ..errors import ConfigError
from ..runtime.disks import writing

ADAPTER = "default"  # peft's adapter name
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # how PeftModel.save_pretrained names the adapters' tensors


def partial(finetune: Any) -> bool:
    """Whether the run trains part of the model only (its training state holds that part);
    ``finetune``: the config's finetune section (or the whole config)."""
    return as_section(finetune, "finetune").finetune_mode != "full"


def lora_config(config: Mapping[str, Any]):
    """peft's ``LoraConfig`` of the run's ``lora_*`` keys."""
    from peft import LoraConfig  # lazy: transformers

    settings = as_section(config, "finetune")
    return LoraConfig(r=int(settings.lora_rank), lora_alpha=float(settings.lora_alpha),
                      lora_dropout=float(settings.lora_dropout), target_modules=list(lora_targets(config)),
                      bias="none")


def freeze(model: nn.Module, finetune: Any, spec) -> None:
    """``finetune_mode: freeze``: the stage's input embeddings and its bottom ``freeze_layers``
    blocks stop training (one line when the model has fewer blocks); ``finetune``: the config's
    finetune section (or the whole config)."""
    inputs, blocks = spec.layers(model)
    n = int(as_section(finetune, "finetune").freeze_layers)
    if n > len(blocks):
        raise ConfigError(f"freeze_layers: {n} is more than the {len(blocks)} transformer blocks of the {spec.name} "
                          f"model; expected 0 to {len(blocks)}")
    for module in [*inputs, *blocks[:n]]:
        for p in module.parameters():
            p.requires_grad_(False)


def apply(model: nn.Module, config: Mapping[str, Any], spec) -> nn.Module:
    """The model a run of ``config`` trains, from the stage's starting ``model`` (the same
    object for ``full``; adapters injected in place for ``lora``), with what the stage trains
    beside it in every mode (``spec.extend_model``: a predictor's return head, always trained)."""
    mode = as_section(config, "finetune").finetune_mode
    if adapter_layers(model):  # already the model a run trains (the seed's train_model called again)
        return spec.extend_model(model, config)
    if mode == "freeze":
        freeze(model, config, spec)
    elif mode == "lora":
        from peft import inject_adapter_in_model  # lazy: transformers

        targets = lora_targets(config)
        present = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)}
        if not present & set(targets):
            raise ConfigError(f"lora_targets: {','.join(targets)} matches no Linear layer of this {spec.name} model; "
                              f"expected names among {', '.join(sorted(present))}")
        model = inject_adapter_in_model(lora_config(config), model, adapter_name=ADAPTER)
    return spec.extend_model(model, config)  # what trains beside it in every mode (a return head)


def counts(model: nn.Module) -> dict[str, Any]:
    """``trainable_params`` and ``trainable_fraction`` (of every parameter the model has, the
    adapters included), as a run records them."""
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"trainable_params": trained, "trainable_fraction": round(trained / total, 6) if total else 0.0}


def describe(model: nn.Module, config: Mapping[str, Any]) -> str:
    """The console line of what the run trains."""
    n = counts(model)
    settings = as_section(config, "finetune")
    mode = settings.finetune_mode
    how = {"full": "every weight",
           "lora": (f"LoRA adapters (rank {settings.lora_rank}, alpha {settings.lora_alpha:g}) on "
                    f"{','.join(lora_targets(config))}"),
           "freeze": f"all but the embeddings and the bottom {settings.freeze_layers} blocks"}[mode]
    head = getattr(model, "return_head", None)
    beside = f" and the return head ({sum(p.numel() for p in head.parameters()):,})" if head is not None else ""
    return (f"finetune_mode {mode}: training {how}{beside}: {n['trainable_params']:,} parameters "
            f"({100 * n['trainable_fraction']:.2f}% of the model)")


def adapter_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, layer)`` of every peft adapter layer in ``model`` (none for full and freeze).
    A model can hold one only once peft's LoRA layers are imported, so a process that never
    imported them (every ``full`` and ``freeze`` run) answers without importing peft."""
    layer = sys.modules.get("peft.tuners.lora.layer")
    lora_layer = getattr(layer, "LoraLayer", None)
    if lora_layer is None:
        return []
    return [(name, m) for name, m in model.named_modules() if isinstance(m, lora_layer)]


def merged(model: nn.Module) -> nn.Module:
    """A plain model with the same forward as ``model``: ``model`` itself without adapters, else a
    copy whose adapters peft merged into their base layers (``safe_merge`` refuses non-finite
    weights), each base layer put back where its adapter was. ``model`` is not changed. It is what
    every file a colleague reads holds (``best_model``, the start the verdict compares with, the
    forecasts of ``objective: val_skill``)."""
    layers = adapter_layers(model)
    if not layers:
        return model
    plain = copy.deepcopy(model)
    for name, layer in adapter_layers(plain):
        layer.merge(safe_merge=True, adapter_names=[ADAPTER])
        parent_name, _, child = name.rpartition(".")
        parent = plain.get_submodule(parent_name) if parent_name else plain
        setattr(parent, child, layer.get_base_layer())
    for p in plain.parameters():
        p.requires_grad_(True)
    return plain


def save_adapter(model: nn.Module, config: Mapping[str, Any], directory: str | os.PathLike) -> Path | None:
    """The adapters of ``model`` in peft's format under ``directory`` (None: it has none). Each
    file is written beside its final name, then renamed over it."""
    if not adapter_layers(model):
        return None
    import safetensors.torch
    from peft import get_peft_model_state_dict  # lazy: transformers

    directory = Path(directory)
    with writing(directory):
        directory.mkdir(parents=True, exist_ok=True)
    tensors = {PEFT_PREFIX + name: t.detach().to("cpu", torch.float32).contiguous().clone()
               for name, t in get_peft_model_state_dict(model, adapter_name=ADAPTER).items()}
    settings = lora_config(config).to_dict()
    settings.update({"peft_type": "LORA", "base_model_name_or_path": None, "inference_mode": True})
    settings = {k: (sorted(v) if isinstance(v, set) else v) for k, v in settings.items()}
    weights_tmp, config_tmp = directory / f".{ADAPTER_WEIGHTS}.tmp", directory / f".{ADAPTER_CONFIG}.tmp"
    with writing(directory):  # a full disk: one line naming the folder
        safetensors.torch.save_file(tensors, str(weights_tmp), metadata={"format": "pt"})
        config_tmp.write_text(json.dumps(settings, indent=2, sort_keys=True, default=str), encoding="utf-8")
        os.replace(weights_tmp, directory / ADAPTER_WEIGHTS)
        os.replace(config_tmp, directory / ADAPTER_CONFIG)
    return directory


def frozen_digest(model: nn.Module) -> str:
    """SHA-256 of the frozen parameters (names, shapes, bytes), '' when nothing is frozen."""
    digest, any_frozen = hashlib.sha256(), False
    for name, p in model.named_parameters():
        if p.requires_grad:
            continue
        any_frozen = True
        t = p.detach().to("cpu").contiguous()
        digest.update(f"{name}:{t.dtype}:{list(t.shape)};".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest() if any_frozen else ""
