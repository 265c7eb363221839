"""A sweep judged on every fold (``--folds K``): each trial fine-tunes and scores the walk-forward's folds.

    python sweeps/sweep.py --folds 4 --fold-length 2M --n-trials 8
    mlflow run . -e sweep --env-manager local -P folds=4 -P fold_length=2M

The fold plan is the walk-forward's (:mod:`kronos_mlflow.workflows.walkforward.folds`): the same
``fold_length``, ``val_length``, ``embargo``, ``walkforward_mode``, ``train_length`` and
``walkforward_end`` give the same fold table as ``-e walkforward``; one plan for the whole study
(its digest is a study attribute: a worker with another plan is refused). A trial's run is a
child of the sweep's parent, and each fold a child of the trial's run: a training run on the
fold's train, validation and test ranges with the trial's learning rate and weight decay. The
fold's score is the objective's metric of that run (``best_val_loss``, ``best_val_skill``): chosen
on the fold's validation period only, so no test period chooses anything inside its fold. The
trial's value is the mean of its fold scores; each score is reported as step ``k`` (the fold's
number), and the pruner is asked after each fold.

Fold order: the latest fold first, then the earliest, then alternating inwards (4 folds: 4, 1, 3,
2). The first two paired observations then span the whole plan (the regime nearest deployment
and the one furthest from it), so a paired test has evidence from both ends before a trial pays
for the middle folds.

A fold that FINISHED with the same trial settings and ranges (tag ``sweep.fold_digest``) is reused,
not trained again: a stopped sweep's retried trial continues at the fold that stopped.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ...config import checks
from ...config.keys import OPTIMIZER
from ...config.sections import as_section
from ...errors import UserError
from ..walkforward import folds as fl

#: flag -> (default, help): the walk-forward's own settings, as the sweep takes them
SETTINGS = {
    "fold_length": ("3M", f"a fold's test period: {fl.LENGTH_ACCEPTED}"),
    "walkforward_mode": ("expanding", "expanding or rolling (train_length)"),
    "train_length": ("", "rolling mode: the training period's length"),
    "embargo": ("", "bars between a fold's validation end and its test start (default predict_window)"),
    "val_length": ("", "a fold's validation period (default one fold_length)"),
    "walkforward_end": ("", "the last fold's last date (default the end of test_time_range)"),
}
WILCOXON = "wilcoxon"
PRUNER_HELP = ("successive_halving (default), hyperband, median, percentile[:P], none; options as "
               "median:n_startup_trials=3,n_warmup_steps=1; with --folds 2 or more: wilcoxon (the default; "
               "--p-threshold), none")
DEFAULT_P_THRESHOLD = 0.1
FOLD_DIGEST_TAG, FOLD_TAG, PLAN_ATTR = "sweep.fold_digest", "sweep.fold", "fold_plan_digest"


def add_arguments(parser) -> None:
    parser.add_argument("--folds", default="0", help="judge each trial on the walk-forward's K folds (0: one "
                        "validation window, as without it); docs/sweeps.md#sweeps-judged-on-every-fold")
    parser.add_argument("--p-threshold", default=str(DEFAULT_P_THRESHOLD),
                        help="--pruner wilcoxon: prune a trial once its fold scores are worse than the best "
                             "trial's with this one-sided p-value (default 0.1)")
    for name, (default, text) in SETTINGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", dest=f"wf_{name}", default=default, metavar="VALUE",
                            help=f"--folds: {text}")


def check_args(args) -> None:
    """``--folds``, ``--p-threshold``, the fold settings and the pruner, each checked (one UserError);
    an empty ``--pruner`` (or the single-window default, successive_halving, the MLproject's
    default) becomes ``wilcoxon`` with folds > 1; else the single-window default."""
    from ...training.trial import DEFAULT_PRUNER, make_pruner  # lazy: optuna

    args.folds = checks.integer("folds", args.folds, 0, fl.MAX_FOLDS, what="argument --folds", error=UserError)
    args.p_threshold = checks.number("p_threshold", args.p_threshold, 0.0, 1.0, what="argument --p-threshold")
    if not 0.0 < args.p_threshold < 1.0:
        raise UserError(f"argument --p-threshold: {args.p_threshold:g} prunes every trial or none; expected a "
                        "p-value between 0 and 1 (exclusive), e.g. 0.1")
    args.fold_settings = settings_of(args) if args.folds else None
    pruner = str(args.pruner or "").strip()
    name = pruner.partition(":")[0].strip().lower()
    if not pruner or (pruner == DEFAULT_PRUNER and args.folds > 1):
        # empty, or the MLproject's default (which a one-window sweep records as today): the default
        # of the sweep's kind
        args.pruner = WILCOXON if args.folds > 1 else DEFAULT_PRUNER
    elif name == WILCOXON:
        if args.folds < 2:
            raise UserError(f"argument --pruner: {pruner} pairs fold scores across trials; expected --folds 2 or "
                            "more, or another pruner for a single-window sweep")
        if pruner.partition(":")[2].strip():
            raise UserError(f"argument --pruner: {pruner} takes no options; its p-value is --p-threshold")
        args.pruner = WILCOXON
    elif args.folds > 1 and name != "none":
        raise UserError(f"argument --pruner: {pruner} prunes on epochs of one validation window; a sweep with "
                        "--folds judges trials fold by fold: expected wilcoxon (the default) or none")
    if args.pruner != WILCOXON:
        make_pruner(args.pruner)


def settings_of(args) -> fl.Settings:
    return fl.Settings.checked(folds=args.folds, fold_length=args.wf_fold_length, mode=args.wf_walkforward_mode,
                               train_length=args.wf_train_length, embargo=args.wf_embargo,
                               val_length=args.wf_val_length, end=args.wf_walkforward_end, retrain="predictor")


def pruner_of(args):
    """The study's pruner: WilcoxonPruner on fold scores, else the single-window pruner by name."""
    import optuna

    from ...training.trial import make_pruner  # lazy: optuna

    if args.pruner == WILCOXON:
        import warnings

        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # stable since Optuna 3.6
        return optuna.pruners.WilcoxonPruner(p_threshold=args.p_threshold, n_startup_steps=2)
    return make_pruner(args.pruner)


def fold_order(k: int) -> list[int]:
    """The order a trial runs folds 1..k: latest, earliest, then alternating inwards (4: 4, 1, 3, 2)."""
    low, high, out = 1, k, []
    while low <= high:
        out.append(high)
        if low != high:
            out.append(low)
        low, high = low + 1, high - 1
    return out


def plan_of(args, config: Mapping[str, Any], check) -> list[fl.Fold]:
    """The study's fold table on the market's calendar (printed), each fold's config checked by
    ``check(args, config)`` (a refusal names the fold); [] without ``--folds``."""
    if not args.folds:
        return []
    from ...data.prepare import market_calendar  # lazy: pandas, the data provider

    folds = fl.plan(config, args.fold_settings, market_calendar(config))
    print(f"[sweep] every trial on {fl.describe(folds)}, in the order {', '.join(map(str, fold_order(len(folds))))}:",
          flush=True)
    print(fl.table(folds), flush=True)
    for fold in folds:
        try:
            check(args, fold_config(config, fold))
        except UserError as exc:
            raise UserError(f"fold {fold.fold}: {exc}") from None
    return folds


def prepare_study(study, args, config: Mapping[str, Any], space: Mapping[str, Any]) -> None:
    """A study keeps one fold plan; a fresh fold study starts with the default settings' trial."""
    folds = getattr(args, "fold_plan", [])
    check_study_plan(study, folds, args.fold_settings)
    if folds:
        from ...stages import spec_of  # lazy: the stage registry

        enqueue_default(study, config, space, spec_of(config).keys.learning_rate)


def parent_params(args) -> dict[str, Any]:
    """The sweep parent's params of ``--folds`` (none without it: a single-window sweep's are as before)."""
    if not args.folds:
        return {}
    s = args.fold_settings
    folds = getattr(args, "fold_plan", [])
    return {"folds": args.folds, "fold_length": s.fold_length, "walkforward_mode": s.mode,
            "train_length": s.train_length, "embargo": folds[0].embargo if folds else s.embargo,
            "val_length": s.val_length or s.fold_length, "walkforward_end": folds[-1].test[1] if folds else s.end,
            "p_threshold": args.p_threshold, "fold_order": " ".join(map(str, fold_order(args.folds)))}


def fold_config(config: Mapping[str, Any], fold: fl.Fold) -> dict[str, Any]:
    return {**config, **{key: list(value) for key, value in fold.ranges.items()}}


def check_study_plan(study, folds: Sequence[fl.Fold], settings: fl.Settings | None) -> None:
    """A study keeps one fold plan: a fresh study records it, another plan (or none) is refused
    (a study made before fold sweeps, without the attribute, stays a single-window study)."""
    digest = fl.plan_digest(list(folds), settings) if folds else ""
    have = study.user_attrs.get(PLAN_ATTR)
    if have is None and not study.get_trials(deepcopy=False):
        if digest:
            study.set_user_attr(PLAN_ATTR, digest)
        return
    if (have or "") != digest:
        what = "no folds" if not have else "another fold plan"
        raise UserError(f"study '{study.study_name}' was swept with {what}; its trials are not comparable with this "
                        "sweep's: expected the same --folds and fold settings, or another --study-name")


def enqueue_default(study, config: Mapping[str, Any], space: Mapping[str, Any], learning_rate_key: str) -> None:
    """The default settings' trial (the config's learning rate and weight decay) first in a fresh
    study: what the best trial is judged against, and the pruner's first reference."""
    if study.get_trials(deepcopy=False):
        return
    params: dict[str, Any] = {"learning_rate": float(config[learning_rate_key]),
                              "weight_decay": float(as_section(config, OPTIMIZER).adam_weight_decay)}
    if space["weight_decay"].get("include_zero"):
        params["weight_decay_is_zero"] = params["weight_decay"] == 0.0
        if params["weight_decay_is_zero"]:
            del params["weight_decay"]
    study.enqueue_trial(params, user_attrs={"default_settings": True}, skip_if_exists=True)


def fold_digest(base_flags: Sequence[str], values: Mapping[str, Any], fold: fl.Fold, study_name: str) -> str:
    """What names one fold of one trial's settings: a FINISHED run with it is reused."""
    text = json.dumps({"study": study_name, "flags": list(base_flags), "values": {k: repr(v) for k, v in values.items()},
                       "ranges": fold.ranges}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def finished_fold(client, experiment_id: str, digest: str, metric: str):
    """A FINISHED fold run of this digest with its score, or None."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{FOLD_DIGEST_TAG}` = '{digest}' "
                              "and attributes.status = 'FINISHED'", max_results=5)
    for run in runs:
        if metric in run.data.metrics and math.isfinite(run.data.metrics[metric]):
            return run
    return None


__all__ = ["SETTINGS", "WILCOXON", "add_arguments", "check_args", "check_study_plan", "enqueue_default",
           "finished_fold", "fold_config", "fold_digest", "fold_order", "parent_params", "plan_of", "prepare_study",
           "pruner_of"]
