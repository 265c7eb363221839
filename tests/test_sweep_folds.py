"""Sweeps judged on every fold (docs/sweeps.md#sweeps-judged-on-every-fold): the flags and their
refusals, the fold order, the study's one plan and its default settings' trial, the Wilcoxon
pruner on fold scores, the pooled interval and the paired verdict against the default trial.
Fast: nothing trains here (a tiny fold sweep end to end: tests/test_sweep_folds_run.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import optuna
import pytest
from tiny_runs import isolated_env

from kronos_mlflow.errors import UserError
from kronos_mlflow.workflows.sweep import folds as sf, pooled
from kronos_mlflow.workflows.walkforward import folds as fl

ROOT = Path(__file__).resolve().parents[1]


def _args(**given):
    values = {"folds": "0", "p_threshold": "0.1", "pruner": "", **{f"wf_{k}": d for k, (d, _) in sf.SETTINGS.items()}}
    values.update(given)
    return argparse.Namespace(**values)


def test_fold_order_is_latest_earliest_then_inwards():
    assert sf.fold_order(1) == [1]
    assert sf.fold_order(2) == [2, 1]
    assert sf.fold_order(4) == [4, 1, 3, 2]
    assert sf.fold_order(5) == [5, 1, 4, 2, 3]
    assert sorted(sf.fold_order(17)) == list(range(1, 18))


def test_the_pruner_is_wilcoxon_with_folds_and_the_old_default_without():
    args = _args()
    sf.check_args(args)
    assert (args.folds, args.pruner, args.fold_settings) == (0, "successive_halving", None)
    args = _args(folds="3", p_threshold="0.25")
    sf.check_args(args)
    assert (args.folds, args.pruner, args.p_threshold) == (3, "wilcoxon", 0.25)
    pruner = sf.pruner_of(args)
    assert isinstance(pruner, optuna.pruners.WilcoxonPruner)
    for given in ("none", "median"):  # a single-window sweep keeps every pruner
        args = _args(pruner=given)
        sf.check_args(args)
        assert args.pruner == given
    args = _args(folds="4", pruner="none")
    sf.check_args(args)
    assert isinstance(sf.pruner_of(args), optuna.pruners.NopPruner)


@pytest.mark.parametrize(("given", "words"), [
    ({"folds": "x"}, "--folds"), ({"folds": "-1"}, "--folds"), ({"folds": "101"}, "--folds"),
    ({"folds": "٣"}, "--folds"), ({"p_threshold": "0"}, "--p-threshold"), ({"p_threshold": "1"}, "--p-threshold"),
    ({"p_threshold": "1.5"}, "--p-threshold"), ({"p_threshold": "nan"}, "--p-threshold"),
    ({"pruner": "wilcoxon"}, "--folds 2 or more"), ({"folds": "1", "pruner": "wilcoxon"}, "--folds 2 or more"),
    ({"folds": "3", "pruner": "median"}, "fold by fold"), ({"folds": "3", "pruner": "wilcoxon:p=1"}, "no options"),
    ({"folds": "3", "wf_fold_length": "3Q"}, "fold_length"), ({"folds": "3", "wf_embargo": "-2"}, "embargo"),
])
def test_bad_fold_flags_are_one_line(given, words):
    with pytest.raises(UserError) as caught:
        sf.check_args(_args(**given))
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_bad_folds_on_the_command_line_exit_2_before_anything(commands, tmp_path):
    for flags in (["--folds", "3", "--p-threshold", "2"],):  # one command: the rest is test_bad_fold_flags_are_one_line
        proc = commands.run([sys.executable, str(ROOT / "sweeps" / "sweep.py"), *flags, "--check"], cwd=tmp_path,
                            env=isolated_env(tmp_path / "iso"), timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert flags[-1] in proc.stderr or flags[1] in proc.stderr
        assert [p.name for p in tmp_path.iterdir()] == []  # no store, no study, no file


def _study(name="s", direction="minimize", pruner=None):
    storage = optuna.storages.InMemoryStorage()
    return optuna.create_study(study_name=name, storage=storage, direction=direction, pruner=pruner)


def _settings(**kw):
    return fl.Settings.checked(folds=kw.get("folds", 3), fold_length="20", mode="expanding", train_length="",
                               embargo=None, val_length="", end="", retrain="predictor")


def _plan(k=3):
    return [fl.Fold(i, ("2011-01-03", "2020-01-01"), ("2020-01-02", "2020-02-01"), 5, ("2020-02-10", "2020-03-01"),
                    20, 20, 2000, {"train_time_range": ["2011-01-03", "2020-01-01"],
                                   "val_time_range": ["2019-12-01", "2020-02-01"],
                                   "test_time_range": ["2020-01-10", "2020-03-01"]}) for i in range(1, k + 1)]


def test_a_study_keeps_one_plan_and_starts_with_the_default_settings():
    study = _study()
    sf.check_study_plan(study, _plan(), _settings())
    sf.check_study_plan(study, _plan(), _settings())  # the same plan again: fine
    with pytest.raises(UserError, match="another fold plan"):
        sf.check_study_plan(study, _plan(2), _settings(folds=2))
    with pytest.raises(UserError, match="swept with another fold plan|its trials are not comparable"):
        sf.check_study_plan(study, [], None)
    space = {"weight_decay": {"include_zero": True}}
    sf.enqueue_default(study, {"tokenizer_learning_rate": 2e-4, "adam_weight_decay": 0.1}, space,
                       "tokenizer_learning_rate")
    (waiting,) = study.get_trials(deepcopy=False)
    assert waiting.user_attrs["default_settings"] is True
    assert waiting.system_attrs["fixed_params"] == {"learning_rate": 2e-4, "weight_decay": 0.1,
                                                    "weight_decay_is_zero": False}
    sf.enqueue_default(study, {"tokenizer_learning_rate": 1e-3, "adam_weight_decay": 0.1}, space,
                       "tokenizer_learning_rate")
    assert len(study.get_trials(deepcopy=False)) == 1  # only a fresh study gets it
    single = _study("t")  # a single-window sweep: nothing recorded, as before
    sf.check_study_plan(single, [], None)
    assert single.user_attrs == {}


def _report(trial, scores):
    for k in sf.fold_order(len(scores)):
        trial.report(scores[k - 1], k)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return sum(scores) / len(scores)


def test_wilcoxon_prunes_a_trial_worse_on_every_fold_after_the_first_pairs():
    args = _args(folds="4", p_threshold="0.3")
    sf.check_args(args)
    study = _study(pruner=sf.pruner_of(args))
    study.optimize(lambda t: _report(t, [1.0, 1.1, 1.2, 1.3]), n_trials=1)
    study.optimize(lambda t: _report(t, [2.0, 2.1, 2.2, 2.3]), n_trials=1)  # worse on every fold
    study.optimize(lambda t: _report(t, [0.9, 1.2, 1.1, 1.2]), n_trials=1)  # better on average: never pruned
    first, worse, mixed = study.trials
    assert worse.state == optuna.trial.TrialState.PRUNED
    assert list(worse.intermediate_values) == [4, 1]  # paid for two folds of four: the latest and the earliest
    assert mixed.state == optuna.trial.TrialState.COMPLETE and len(mixed.intermediate_values) == 4


def test_the_pooled_interval_is_over_folds():
    mean, low, high = pooled.pooled_interval([1.0, 2.0, 3.0, 4.0])
    assert mean == pytest.approx(2.5) and 1.0 <= low < mean < high <= 4.0
    assert pooled.pooled_interval([1.0, 2.0, 3.0, 4.0]) == (mean, low, high)  # a fixed seed
    one = pooled.pooled_interval([2.0])
    assert one[0] == 2.0 and all(x != x for x in one[1:])


def test_the_best_against_the_default_trial_is_paired_by_the_verdict_rule():
    default = {1: 1.00, 2: 1.20, 3: 0.90, 4: 1.10}
    better = {k: v * 0.9 for k, v in default.items()}  # 10% lower loss on every fold
    judged = pooled.versus_default(better, default, "minimize", 0.005)
    assert judged["verdict"] == "better" and judged["change"] == pytest.approx(-0.1) and judged["folds"] == 4
    noisy = {1: 0.90, 2: 1.30, 3: 0.85, 4: 1.15}
    assert pooled.versus_default(noisy, default, "minimize", 0.005)["verdict"] == "inconclusive"
    skill_default = {1: 0.01, 2: -0.02, 3: 0.00}
    skill_best = {k: v + 0.05 for k, v in skill_default.items()}
    assert pooled.versus_default(skill_best, skill_default, "maximize", 0.005)["verdict"] == "better"
    assert pooled.versus_default(skill_default, skill_best, "maximize", 0.005)["verdict"] == "worse"
    few = pooled.versus_default({1: 1.0}, {1: 2.0}, "minimize", 0.005)
    assert few["verdict"] == "inconclusive" and "two or more" in few["why"]
