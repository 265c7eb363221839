"""How much lower upstream's predictor validation loss reads than the causal one, on one checkpoint.

Upstream validates the predictor in eval mode, where the s2 head's cross-attention is not
causal: each position's s2 prediction reads the context of later positions, which holds the
tokens being predicted. This script scores the same predictor checkpoint on the same validation
windows, from the same random state, both ways (``predictor_validation: causal``, the default,
and ``upstream``) and prints the two losses and their ratio::

    python benchmarks/predictor_validation_leak.py --tokenizer DIR --predictor DIR [--config FILE.yaml] [--windows N] [--json]

The config (default: the demo market with the default window) decides the validation windows,
``n_val_iter`` of them (``--windows`` overrides it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(tokenizer_dir: str, predictor_dir: str, config_file: str | None = None, seed: int = 0,
            windows: int | None = None) -> dict:
    import torch

    from kronos_mlflow.config.core import load_config
    from kronos_mlflow.data import QlibDataset, prepare_splits
    from kronos_mlflow.data.loaders import val_loader_for
    from kronos_mlflow.model import Kronos, KronosTokenizer
    from kronos_mlflow.stages.predictor.training import PredictorStage

    tokenizer = KronosTokenizer.from_pretrained(tokenizer_dir)
    model = Kronos.from_pretrained(predictor_dir)
    figures = {}
    for mode in ("causal", "upstream"):
        overrides = {"stage": "predictor", "predictor_validation": mode}
        if windows:
            overrides["n_val_iter"] = windows
        config = load_config(overrides, path=config_file)
        prepare_splits(config)
        ds = QlibDataset("val", config)
        ds.set_epoch_seed(0)
        torch.manual_seed(seed)
        result = PredictorStage(tokenizer, config).run_validation(model, val_loader_for(ds, config, 0, 1), "cpu")
        figures[f"val_predictor_loss_{mode}"] = result.loss
        figures.update({f"{k}_{mode}": v for k, v in result.metrics.items()})
        figures["windows"] = len(ds)
    causal, upstream = figures["val_predictor_loss_causal"], figures["val_predictor_loss_upstream"]
    figures["upstream_lower_by"] = (causal - upstream) / causal
    return figures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--predictor", required=True)
    p.add_argument("--config", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--windows", type=int, default=None, help="validation windows (default: the config's n_val_iter)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from kronos_mlflow.stages import build_registry

    build_registry()  # as every command does before it loads a config
    figures = measure(args.tokenizer, args.predictor, args.config, args.seed, args.windows)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(f"{figures['windows']} validation windows: causal {figures['val_predictor_loss_causal']:.4f}, "
              f"upstream's {figures['val_predictor_loss_upstream']:.4f} ({figures['upstream_lower_by']:.1%} lower); "
              f"s2 accuracy {figures['val_s2_accuracy_causal']:.1%} vs {figures['val_s2_accuracy_upstream']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
