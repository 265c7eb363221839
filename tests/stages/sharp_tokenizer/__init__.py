"""A third training stage, registered from outside the package: the tokenizer with one different
hyper-parameter (its pre-quantisation reconstruction term weighs half).

This folder is all of it. A process finds it through the ``kronos_mlflow.stages`` entry-point
group (``tests/test_third_stage.py`` installs that entry point for its commands) or by importing
it; ``kronos_mlflow/`` never names it.
"""

from __future__ import annotations

import dataclasses

from kronos_mlflow.stages.base import StepOutput
from kronos_mlflow.stages.registry import register
from kronos_mlflow.stages.tokenizer import NOT_READ, TokenizerSpec

NAME = "sharp_tokenizer"
#: the one hyper-parameter it changes: the weight of the pre-quantisation reconstruction (1 upstream)
RECON_PRE_WEIGHT = 0.5


def training_piece():
    """The tokenizer's training piece with this stage's loss (torch is imported when a run builds it)."""
    import torch.nn.functional as F

    from kronos_mlflow.runtime.perf import autocast
    from kronos_mlflow.stages.tokenizer.training import TokenizerStage

    class SharpTokenizerStage(TokenizerStage):
        name = NAME

        def loss(self, model, x, stamp, precision):
            with autocast(precision, x.device):
                (z_pre, z), bsq_loss, _, _ = model(x)
            recon_pre = F.mse_loss(z_pre.float(), x)
            recon_all = F.mse_loss(z.float(), x)
            loss = (RECON_PRE_WEIGHT * recon_pre + recon_all + bsq_loss.float()) / 2
            return StepOutput(loss, {"bsq": bsq_loss.detach(), "recon_pre": recon_pre.detach(),
                                     "recon_all": recon_all.detach()})

    return SharpTokenizerStage()


class SharpTokenizerSpec(TokenizerSpec):
    name = NAME
    # the tokenizer's keys; "stage" is in its digest, so its runs never share a folder with the tokenizer's
    config_keys = dataclasses.replace(TokenizerSpec.config_keys,
                                      digest_excludes=tuple(k for k in NOT_READ if k != "stage"))
    default_study = "kronos-sharp-tokenizer-lr-wd"
    champion_suffix = "-sharp-tokenizer"
    pipeline_position = 1.5  # after the tokenizer, before the predictor (which is handed its model)
    pipeline_flags = {"sharp_epochs": ("sharp tokenizer epochs", "epochs")}

    def training(self, config, layout, info):
        return training_piece()


SPEC = register(SharpTokenizerSpec())
