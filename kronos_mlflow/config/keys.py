"""Every config key, declared once: its section, type, default, bounds or choices, help text,
the MLproject entry points that take it, and whether it changes the numbers a run produces.

One :class:`Key` per key in :data:`KEYS`; everything else is read from them: the defaults and
help (``core.DEFAULTS``, ``core.HELP``, every ``--flag``), the checks of :func:`kronos_mlflow.config.core.validate`
(:meth:`Key.coerce` and :meth:`Key.check`, each refusal one line naming the key, the value and
what is accepted), the config digest (:mod:`kronos_mlflow.config.digest`: ``neutral``,
``added_later``, ``read_when``) and the typed sections (:mod:`kronos_mlflow.config.sections`).
Checks across keys (``batch_size`` and ``accumulation_steps``, the models' sizes, the time
ranges) stay in :func:`~kronos_mlflow.config.core.validate`.

Adding a key is one ``Key(...)`` here, in the section of the component that reads it (a
stage's own key in the stage's section): a key whose default is what runs did before it existed
says ``added_later=True`` (runs made before keep their digest and run directory), a key that
never changes the numbers (where things are written, how they are tracked, how fast they are
computed, what is measured after training) says ``neutral=True``. docs/configuration.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import checks
from ..errors import ConfigError
from .names import ascii_digits
from .stage_keys import DEFAULT_STAGE, stage_keys, stage_names, stage_of
from .timeranges import parse_date_or_auto, parse_time_range

# ---------------------------------------------------------------------------------- sections
JOB = "job"  # what runs, where it writes, on what, resumed or not
DATA = "data"  # the market, the windows and the splits
TRAINING = "training"  # epochs, batches, what a sweep ranks by
VERDICT = "verdict"  # the end-of-run held-out test loss and its verdict (docs/verdict.md)
EVALUATION = "evaluation"  # the predictor's scorecard (docs/forecast-evaluation.md)
OPTIMIZER = "optimizer"  # AdamW and its schedule (the learning rates are the stages')
TOKENIZER = "tokenizer"  # the tokenizer stage's own keys
PREDICTOR = "predictor"  # the predictor stage's own keys
FINETUNE = "finetune"  # what a fine-tune trains (docs/finetune-modes.md)
PERFORMANCE = "performance"  # speed only: the numbers are the same up to float rounding (bf16 aside)
MODEL = "model"  # a fresh model's architecture
BACKTEST = "backtest"  # the Qlib backtest of the forecast signals
TRACKING = "tracking"  # MLflow names and system metrics
COMET = "comet"  # Comet, beside MLflow
#: The sections, in the order ``kronos-mlflow train --help`` meets them.
SECTIONS = (JOB, DATA, TRAINING, VERDICT, EVALUATION, OPTIMIZER, TOKENIZER, PREDICTOR, FINETUNE, PERFORMANCE, MODEL,
            BACKTEST, TRACKING, COMET)

# ------------------------------------------------------------------------------ value rules
POSITIVE = "> 0"  # "{key}: {value} must be greater than 0"
NON_NEGATIVE = ">= 0"  # "{key}: {value} must be 0 or greater"
UNIT_OPEN = "[0, 1)"  # "{key}: {value} must be in [0, 1)"
#: Kinds besides the type of the default (int, float, text, names, bool).
KINDS = ("int", "float", "text", "names", "bool", "time_range", "optional_time_range", "date", "on_off")
#: The choices of an on/off switch (a YAML boolean reads as one), and of one that may be auto.
ON_OFF, AUTO_ON_OFF = ("on", "off"), ("auto", "on", "off")

#: The MLproject entry points (MLproject) that take a key as a parameter (under its key name or
#: an alias); a test reads the MLproject against them.
EVERY_RUN = ("main", "predictor", "evaluate", "pipeline", "walkforward", "sweep")
TRAINING_RUNS = ("main", "predictor", "pipeline", "walkforward", "sweep")
NO_SWEEP = ("main", "predictor", "pipeline", "walkforward")  # (the sweep draws or fixes them itself)
SCORECARD_RUNS = ("predictor", "evaluate", "pipeline", "walkforward")  # the runs that score a predictor


@dataclass(frozen=True)
class Key:
    """One config key. Its value's type is its default's (an int key accepts integral floats such
    as ``1e5``, a float key accepts ints), unless ``kind`` says more."""

    name: str
    section: str  #: one of :data:`SECTIONS`
    default: Any
    help: str  #: one line for ``--help`` and docs
    kind: str = ""  #: one of :data:`KINDS`; empty: from the default's type
    #: the values it accepts (a callable for choices known at run time: the registered stages)
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()
    low: str = ""  #: :data:`POSITIVE`, :data:`NON_NEGATIVE` or :data:`UNIT_OPEN`
    high: int | float | None = None  #: the largest value (every number has one, or a rule of its own)
    least: int | float | None = None  #: the smallest value, where it is above what ``low`` says
    #: the key's own check beyond these: ``rule(key, value, config)`` raises ConfigError
    rule: Callable[[Key, Any, Mapping[str, Any]], None] | None = None
    inside: str = ""  #: the value is one file or folder name inside this key's directory
    directory: bool = False  #: the value is a directory, or can be made one (an output path)
    #: where a scoring command's windows come from: taken from the run it scores unless given
    window: bool = False
    entry_points: tuple[str, ...] = ()  #: the MLproject entry points that take it as a parameter
    neutral: bool = False  #: never changes the numbers a run produces: left out of the config digest
    #: added after runs were made: at its default (what those runs did) left out of the digest
    added_later: bool = False
    #: (key, value): read only when that key has that value; left out of the digest otherwise
    read_when: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if self.section not in SECTIONS:
            raise ValueError(f"config key {self.name}: section {self.section!r} is not one of {', '.join(SECTIONS)}")
        if not self.kind:
            default = self.default
            kind = ("bool" if isinstance(default, bool) else "int" if isinstance(default, int)
                    else "float" if isinstance(default, float) else "names" if isinstance(default, list) else "text")
            object.__setattr__(self, "kind", kind)
        if self.kind not in KINDS:
            raise ValueError(f"config key {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")

    @property
    def type(self) -> type:
        """The Python type of a validated value (a section holds lists as tuples)."""
        return {"bool": bool, "int": int, "float": float}.get(self.kind, list if self.kind in (
            "names", "time_range", "optional_time_range") else str)

    def accepted(self) -> tuple[str, ...]:
        return self.choices() if callable(self.choices) else self.choices

    # ---------------------------------------------------------------------------- coercion
    def coerce(self, value: Any) -> Any:
        """``value`` as given (YAML, a flag's text, an MLproject parameter) as the key's type;
        a value that is not one raises ConfigError naming the key."""
        key, kind = self.name, self.kind
        if kind == "time_range":
            return parse_time_range(key, value)
        if kind == "optional_time_range":
            empty = value is None or (isinstance(value, (str, list, tuple)) and not (
                value.strip() if isinstance(value, str) else value))
            return [] if empty else parse_time_range(key, value)
        if kind == "date":
            return parse_date_or_auto(key, value)
        if kind == "on_off":
            # YAML reads a bare on/off/true/false as a boolean; the key takes them as on/off.
            text = str(value).strip().lower()
            if isinstance(value, bool) or text in ("true", "false", "yes", "no", "1", "0"):
                return "on" if (value if isinstance(value, bool) else text in ("true", "yes", "1")) else "off"
            return text
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ConfigError(f"{key}: '{checks.shown(value)}' is not a boolean; expected true or false")
        if kind == "int":
            return self._integer(value)
        if kind == "float":
            return self._float(value)
        if kind == "names":
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
                raise ConfigError(f"{key}: '{checks.shown(value)}' is not a list of names")
            return [i.strip() for i in items]
        if value is None:
            return ""
        if not isinstance(value, (str, int, float)):
            raise ConfigError(f"{key}: '{checks.shown(value)}' is not a string")
        return str(value)

    def _integer(self, value: Any) -> int:
        key = self.name
        if isinstance(value, bool):
            raise ConfigError(f"{key}: '{value}' is not an integer")
        if isinstance(value, int):  # however large: the ranges refuse it by name
            return int(value)
        text = str(value).strip() if not isinstance(value, float) else ""
        checks.number_text(key, value, text, self.high if self.high is not None else 1.0)
        if re.fullmatch(r"[+-]?[0-9]+", text):  # exact: the ranges refuse it by name
            return int(text)
        try:
            number = float(text) if not isinstance(value, float) else value
        except (ValueError, OverflowError):
            raise ConfigError(f"{key}: '{checks.shown(value)}' is not an integer") from None
        if not math.isfinite(number) or number != int(number):
            raise ConfigError(f"{key}: '{checks.shown(value)}' is not an integer")
        return int(number)

    def _float(self, value: Any) -> float:
        key = self.name
        if isinstance(value, bool):
            raise ConfigError(f"{key}: '{value}' is not a number")
        text = str(value).strip() if not isinstance(value, (int, float)) else ""
        checks.number_text(key, value, text, self.high if self.high is not None else 1.0)
        try:
            number = float(text) if not isinstance(value, (int, float)) else float(value)
        except (ValueError, OverflowError):
            raise ConfigError(f"{key}: '{checks.shown(value)}' is not a number") from None
        if not math.isfinite(number):
            raise ConfigError(f"{key}: '{checks.shown(value)}' is not a finite number")
        return number

    # ------------------------------------------------------------------------------ checks
    def check(self, config: Mapping[str, Any], given: Mapping[str, Any]) -> None:
        """The key's own rules on the coerced ``config`` (``given``: the values as typed, which
        the sign rules show): its sign, its own rule, its range, its place, its choices."""
        key, value = self.name, config[self.name]
        shown = checks.shown
        if self.low == POSITIVE and value <= 0:
            raise ConfigError(f"{key}: {shown(repr(given.get(key, value)))} must be greater than 0")
        if self.low == NON_NEGATIVE and value < 0:
            raise ConfigError(f"{key}: {shown(repr(given.get(key, value)))} must be 0 or greater")
        if self.low == UNIT_OPEN and not 0.0 <= value < 1.0:
            raise ConfigError(f"{key}: {value!r} must be in [0, 1)")
        if self.rule is not None:
            self.rule(self, value, config)
        if self.high is not None and value > self.high:
            raise ConfigError(f"{key}: {shown(value)} is too large; expected at most {checks.limit_text(self.high)}")
        if self.least is not None and value < self.least:
            raise ConfigError(f"{key}: {shown(value)} is too small; expected at least {checks.limit_text(self.least)}")
        if self.inside:
            checks.child_name(key, value, self.inside)
        accepted = self.accepted()
        if accepted and value not in accepted:
            raise ConfigError(f"{key}: '{shown(value)}' is not one of {', '.join(accepted)}")


# ----------------------------------------------------------------------------- own rules
def _fraction_of_start(key: Key, value: Any, config: Mapping[str, Any]) -> None:
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"{key.name}: {value!r} must be in [0, 1): a fraction of the starting weights' test loss "
                          "(0.005 = 0.5%)")


def _probability_mass(key: Key, value: Any, config: Mapping[str, Any]) -> None:
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"{key.name}: {value!r} must be in (0, 1] (upstream's 0.9)")


def _horizons(key: Key, value: Any, config: Mapping[str, Any]) -> None:
    horizons(config)  # steps inside the forecast


def _lora_targets(key: Key, value: Any, config: Mapping[str, Any]) -> None:
    lora_targets(config)  # names of Linear layers the stage's models have


def _universe(key: Key, value: Any, config: Mapping[str, Any]) -> None:
    if not checks.NAME_RE.match(value):
        raise ConfigError(
            f"{key.name}: '{checks.shown(value)}' is not a universe name; expected the name of a file "
            "under <qlib_data_path>/instruments/ (letters, digits, '_', '.', '-'), e.g. csi300 or all"
        )


def _instrument_code(key: Key, value: Any, config: Mapping[str, Any]) -> None:
    if value and not checks.NAME_RE.match(value):
        raise ConfigError(f"{key.name}: '{checks.shown(value)}' is not an instrument code; "
                          "expected a Qlib code such as SH000300 (letters, digits, '_', '.', '-'), or empty")


def _features(key: Key, value: Any, config: Mapping[str, Any]) -> None:
    if len(value) != 6:
        raise ConfigError(f"{key.name}: {checks.shown(value)} must name 6 features (open high low close vol amt)")


def _calendar_features(key: Key, value: Any, config: Mapping[str, Any]) -> None:
    if len(value) != 5:
        raise ConfigError(f"{key.name}: {checks.shown(value)} must name 5 calendar features")


def _experiment(key: Key, value: Any, config: Mapping[str, Any]) -> None:
    checks.mlflow_experiment_name(key.name, value)


def _model_name(key: Key, value: Any, config: Mapping[str, Any]) -> None:
    checks.mlflow_model_name(key.name, value)


def _run_name(key: Key, value: Any, config: Mapping[str, Any]) -> None:
    checks.mlflow_run_name(key.name, value)


# --------------------------------------------------------------------------------- the keys
#: What only one fine-tune mode reads (docs/finetune-modes.md).
IN_LORA, IN_FREEZE = ("finetune_mode", "lora"), ("finetune_mode", "freeze")
#: Every key, by section, in the order ``--help`` lists them.
KEYS: tuple[Key, ...] = (
    # ---- job
    Key("stage", JOB, DEFAULT_STAGE, choices=stage_names, entry_points=("sweep",),
        help="What the run fine-tunes: tokenizer (stage one) or predictor (stage two: the Kronos predictor on the "
             "frozen tokens of finetuned_tokenizer_path)."),
    Key("seed", JOB, 100, low=NON_NEGATIVE, high=checks.SEED_MAX, entry_points=NO_SWEEP,
        help="Random seed; each rank adds its rank."),
    # the save directory itself is where the training state lives: neutral
    Key("save_path", JOB, "./outputs/models", directory=True, neutral=True,
        help="Root of the output directories."),
    Key("device", JOB, "auto", choices=("auto", "cpu", "cuda"), neutral=True,
        help="auto (CUDA when present, else CPU), cpu, or cuda."),
    # recorded from the launcher; the digest takes the real process count as world_size
    Key("nproc_per_node", JOB, 1, low=POSITIVE, high=256, entry_points=TRAINING_RUNS, neutral=True,
        help="Processes per node the launcher started (recorded as a param)."),
    Key("resume", JOB, "auto", choices=("auto", "never", "must"), neutral=True,
        help="Resume from {save_dir}/checkpoints/last: auto (when saved with the same config), never (start over; the "
             "state is replaced), or must (refuse to start without one)."),
    # ---- data
    Key("qlib_data_path", DATA, "", window=True, entry_points=EVERY_RUN,
        help="Qlib provider directory (e.g. ~/.qlib/qlib_data/cn_data); empty (default) = the built-in demo market."),
    Key("instrument", DATA, "csi300", window=True, entry_points=EVERY_RUN, rule=_universe,
        help="Qlib instrument universe (a file under instruments/), e.g. csi300 or all."),
    Key("dataset_begin_time", DATA, "auto", kind="date", window=True, entry_points=EVERY_RUN,
        help="First date read from Qlib; auto = the earliest start of the time ranges."),
    Key("dataset_end_time", DATA, "auto", kind="date", window=True, entry_points=EVERY_RUN,
        help="Last date read from Qlib; auto = the latest end of the time ranges."),
    Key("lookback_window", DATA, 90, low=POSITIVE, high=100_000, least=2, window=True,
        help="Past steps per window; normalisation statistics come from this part."),
    Key("predict_window", DATA, 10, low=POSITIVE, high=100_000, window=True,
        help="Future steps per window (the window is lookback + predict + 1 long)."),
    Key("max_context", DATA, 512, low=POSITIVE, high=1_000_000, window=True,
        help="Longest context the forecasting model accepts (kept for compatibility)."),
    Key("feature_list", DATA, ["open", "high", "low", "close", "vol", "amt"], rule=_features,
        help="The six K-line features, in order."),
    Key("time_feature_list", DATA, ["minute", "hour", "weekday", "day", "month"], rule=_calendar_features,
        help="Calendar features, in order."),
    Key("train_time_range", DATA, ["2011-01-01", "2022-12-31"], kind="time_range", window=True, entry_points=EVERY_RUN,
        help="Training dates, START:END inclusive."),
    Key("val_time_range", DATA, ["2022-09-01", "2024-06-30"], kind="time_range", window=True, entry_points=EVERY_RUN,
        help="Validation dates (overlaps train to give its lookback)."),
    Key("test_time_range", DATA, ["2024-04-01", "2025-06-05"], kind="time_range", window=True, entry_points=EVERY_RUN,
        help="Test dates."),
    Key("dataset_path", DATA, "./data/processed_datasets", directory=True, neutral=True,
        help="Where prepared splits are cached (safe formats, keyed)."),
    Key("clip", DATA, 5.0, low=POSITIVE, high=1e30, window=True,
        help="Normalised features are clipped to +-clip."),
    Key("freq", DATA, "day", choices=("day", "1min", "5min", "15min", "30min", "60min"), window=True,
        entry_points=EVERY_RUN,
        help="Bar frequency read from Qlib: day, 1min, 5min, 15min, 30min or 60min."),
    Key("membership_gaps", DATA, "split", choices=("split", "join"), window=True, entry_points=EVERY_RUN,
        help="Index membership spans of one symbol: split (a window never crosses the gap between two spans) or join "
             "(the spans' bars form one series, as upstream)."),
    # ---- training
    Key("epochs", TRAINING, 30, low=POSITIVE, high=1_000_000, entry_points=TRAINING_RUNS,
        help="Training epochs."),
    Key("log_interval", TRAINING, 100, low=POSITIVE, high=10**12, neutral=True,
        help="Optimizer steps between console summaries."),
    Key("batch_size", TRAINING, 50, low=POSITIVE, high=10_000_000, entry_points=TRAINING_RUNS,
        help="Windows per optimizer step, per process."),
    Key("n_train_iter", TRAINING, 100_000, low=POSITIVE, high=10**12, entry_points=TRAINING_RUNS,
        help="Training windows per epoch (over all processes)."),
    Key("n_val_iter", TRAINING, 20_000, low=POSITIVE, high=10**12, entry_points=TRAINING_RUNS,
        help="Validation windows per epoch (over all processes)."),
    # objective val_skill forecasts inside a forked random state: the training numbers are the same
    Key("objective", TRAINING, "val_loss", choices=("val_loss", "val_skill", "val_ic"),
        entry_points=TRAINING_RUNS[1:], neutral=True,
        help="What a sweep ranks trials by: val_loss (the validation loss, minimised), val_skill (each epoch's "
             "forecast skill against persistence on the validation split's origins, maximised) or val_ic (each "
             "epoch's mean per-date rank IC of the forecast return on those origins, maximised); a tokenizer "
             "forecasts with pretrained_predictor_path's predictor."),
    Key("n_val_skill_windows", TRAINING, 500, low=POSITIVE, high=10**9, neutral=True,
        help="Most validation forecast origins objective val_skill scores each epoch (evenly spaced whole dates "
             "beyond it; each costs a forecast per epoch)."),
    Key("accumulation_steps", TRAINING, 1, low=POSITIVE, high=10_000_000, entry_points=NO_SWEEP,
        help="Sub-batches each batch is split into (batch_size must divide evenly)."),
    # ---- verdict
    # the end-of-run test evaluation only: training does the same with any value, so a killed run
    # resumes whatever they are now
    Key("n_test_iter", VERDICT, 0, low=NON_NEGATIVE, high=10**12, entry_points=TRAINING_RUNS, neutral=True,
        help="Test windows the end-of-run evaluation scores (every test window up to this many, else an evenly spaced "
             "subset of them); 0 = as many as n_val_iter."),
    Key("verdict_min_change", VERDICT, 0.005, neutral=True, rule=_fraction_of_start,
        help="Smallest change of the test loss, as a fraction of the starting weights' (0.005 = 0.5%), that the "
             "verdict calls better or worse; its whole 95% interval must lie beyond it."),
    # ---- evaluation
    Key("evaluate", EVALUATION, "on", kind="on_off", choices=ON_OFF, neutral=True,
        help="Predictor stage: score the fine-tuned pair against its zero-shot pair, persistence and (intraday) "
             "seasonal naive on the test split's forecast origins at the end of the run: on or off."),
    Key("eval_stride", EVALUATION, 0, low=NON_NEGATIVE, high=10**9, neutral=True,
        help="Calendar bars between two forecast origins of the scorecard; 0 = predict_window."),
    Key("n_eval_windows", EVALUATION, 2000, low=POSITIVE, high=10**9, neutral=True,
        help="Most forecast origins the scorecard scores (evenly spaced whole dates beyond it)."),
    Key("eval_horizons", EVALUATION, "", neutral=True, rule=_horizons,
        help="Forecast steps the scorecard also scores alone (test_mase_close_h<k>), comma separated, each in "
             "1..predict_window; empty = 1,5,predict_window."),
    Key("calibration", EVALUATION, "auto", kind="on_off", choices=AUTO_ON_OFF, entry_points=SCORECARD_RUNS,
        neutral=True,
        help="on: quantiles and p_up recalibrated on validation origins, scored (finetuned_calibrated), logged with "
             "the model and served by default (docs/calibration.md), with the ensemble and aci; refused with fewer "
             "than calibration_min_origins; auto: the same when validation holds that many, else the run goes on "
             "without it, saying why in one line; off."),
    Key("calibration_min_origins", EVALUATION, 30, low=POSITIVE, high=10**9, neutral=True,
        help="Fewest calibration origins (validation forecast origins) calibration on accepts (auto goes on "
             "without calibration below it)."),
    Key("ensemble_rounds", EVALUATION, 25, low=NON_NEGATIVE, high=10_000, neutral=True,
        help="Rounds of greedy ensemble selection (with replacement) of the ensemble forecaster, fit on the "
             "calibration origins with the calibrator, scored, logged with the model and served by default "
             "(docs/calibration.md#the-ensemble-forecaster-ensemble); 0 = no ensemble."),
    Key("aci_step", EVALUATION, 0.01, low=NON_NEGATIVE, high=1.0, neutral=True,
        help="Step size of adaptive conformal inference (aci, scored on the test origins in date order): how far "
             "one origin date's outcomes move each band's level (docs/calibration.md#bands-that-adapt-aci); "
             "0 = no aci."),
    Key("bootstrap_unit", EVALUATION, "date", choices=("date", "origin"), neutral=True,
        help="What the scorecard's bootstrap intervals resample: date (whole origin dates, since a date's "
             "cross-section moves together) or origin (each origin alone)."),
    Key("inference_T", EVALUATION, 0.6, low=POSITIVE, high=1e6, least=0.0001, neutral=True,
        help="Sampling temperature of the scorecard's forecasts (upstream's inference default)."),
    Key("inference_top_p", EVALUATION, 0.9, neutral=True, rule=_probability_mass,
        help="Nucleus (top-p) sampling of the scorecard's forecasts, in (0, 1]."),
    Key("inference_top_k", EVALUATION, 0, low=NON_NEGATIVE, high=1 << 31, neutral=True,
        help="Top-k sampling of the scorecard's forecasts; 0 = off (1 = greedy)."),
    Key("inference_sample_count", EVALUATION, 5, low=POSITIVE, high=10_000, neutral=True,
        help="Sample paths per forecast origin in the scorecard."),
    # ---- optimizer
    Key("adam_beta1", OPTIMIZER, 0.9, low=UNIT_OPEN, help="AdamW beta1."),
    Key("adam_beta2", OPTIMIZER, 0.95, low=UNIT_OPEN, help="AdamW beta2."),
    Key("adam_weight_decay", OPTIMIZER, 0.1, low=NON_NEGATIVE, high=1e6, entry_points=NO_SWEEP,
        help="AdamW weight decay."),
    Key("weight_decay_scope", OPTIMIZER, "all", choices=("all", "matrices"),
        help="Parameters weight decay applies to: all (upstream) or matrices (2-D weights only)."),
    Key("cycle_momentum", OPTIMIZER, "on", kind="on_off", choices=ON_OFF, added_later=True,
        help="on (upstream's): the one-cycle schedule also cycles AdamW's beta1 between 0.85 and 0.95, overriding "
             "adam_beta1; off: beta1 stays adam_beta1."),
    # ---- tokenizer
    Key("tokenizer_learning_rate", TOKENIZER, 2e-4, low=POSITIVE, high=1.0,
        entry_points=("main", "pipeline", "walkforward"),
        help="Peak learning rate of the one-cycle schedule."),
    Key("grad_clip_norm", TOKENIZER, 2.0, low=POSITIVE, high=1e30,
        help="Gradients are clipped to this global norm before each step."),
    Key("tokenizer_save_folder_name", TOKENIZER, "finetune_tokenizer_demo", inside="save_path", neutral=True,
        help="Run folder under save_path."),
    Key("pretrained_tokenizer_path", TOKENIZER, "auto", entry_points=NO_SWEEP,
        help="Checkpoint directory or hub id; auto = the published NeoQuasar/Kronos-Tokenizer-base when the Hugging "
             "Face cache or hub has it, else fresh weights; fresh (or empty) = fresh weights, base architecture."),
    # ---- predictor
    Key("predictor_learning_rate", PREDICTOR, 4e-5, low=POSITIVE, high=1.0,
        entry_points=("predictor", "pipeline", "walkforward"),
        help="Predictor stage: peak learning rate of the one-cycle schedule."),
    Key("predictor_grad_clip_norm", PREDICTOR, 3.0, low=POSITIVE, high=1e30,
        help="Predictor stage: gradients are clipped to this global norm (upstream's 3.0)."),
    Key("predictor_validation", PREDICTOR, "causal", choices=("causal", "upstream"),
        help="Predictor stage: causal (the s2 head never reads later positions, as in training) or upstream "
             "(eval-mode cross-attention reads them: upstream's optimistic validation loss, for exact replication)."),
    Key("predictor_objective", PREDICTOR, "tokens", choices=("tokens", "tokens+return"), entry_points=TRAINING_RUNS[1:],
        added_later=True, help="Predictor stage: tokens (the token cross-entropy, upstream's) or tokens+return (and a "
        "return head on the origin's context, on 1 - its batch correlation with the horizon's return; "
        "docs/objectives.md)."),
    Key("return_loss_weight", PREDICTOR, 1.0, low=POSITIVE, high=1e6, entry_points=TRAINING_RUNS[1:], added_later=True,
        read_when=("predictor_objective", "tokens+return"),
        help="predictor_objective tokens+return: the loss is the token loss + this weight x the return head's loss."),
    Key("predictor_save_folder_name", PREDICTOR, "finetune_predictor_demo", inside="save_path", neutral=True,
        help="Predictor stage: run folder under save_path."),
    Key("pretrained_predictor_path", PREDICTOR, "auto", entry_points=("predictor", "pipeline", "walkforward", "sweep"),
        help="Predictor stage: checkpoint directory or hub id; auto = the published NeoQuasar/Kronos-small when the "
             "Hugging Face cache or hub has it, else fresh weights; fresh (or empty) = fresh weights, Kronos-mini's "
             "dropouts at the config's sizes."),
    Key("finetuned_tokenizer_path", PREDICTOR, "", entry_points=("predictor", "sweep"),
        help="Predictor stage: the frozen tokenizer: a checkpoint directory, runs:/<id>/best_model, "
             "models:/NAME@ALIAS or a hub id; empty = pretrained_tokenizer_path, else fresh tokenizer weights from "
             "the seed."),
    Key("n_layers", PREDICTOR, 4, low=POSITIVE, high=256,
        help="Fresh predictor: transformer blocks (it shares d_model, n_heads and ff_dim)."),
    # ---- finetune
    Key("finetune_mode", FINETUNE, "full", choices=("full", "lora", "freeze"), 
        entry_points=TRAINING_RUNS, added_later=True,
        help="What the run trains: full (every weight, upstream's), lora (low-rank adapters on lora_targets through "
             "peft; the base weights stay frozen and the logged model is merged), or freeze (the embeddings and the "
             "bottom freeze_layers blocks frozen, the rest trained)."),
    Key("lora_rank", FINETUNE, 8, low=POSITIVE, high=65536, entry_points=TRAINING_RUNS, read_when=IN_LORA,
        help="finetune_mode lora: the rank r of each adapter (its B A has r columns and rows)."),
    Key("lora_alpha", FINETUNE, 16.0, low=POSITIVE, high=1e6, entry_points=TRAINING_RUNS, read_when=IN_LORA,
        help="finetune_mode lora: the adapters' scale is lora_alpha / lora_rank."),
    Key("lora_dropout", FINETUNE, 0.0, low=UNIT_OPEN, entry_points=TRAINING_RUNS, read_when=IN_LORA,
        help="finetune_mode lora: dropout on each adapter's input, in [0, 1)."),
    Key("lora_targets", FINETUNE, "both", entry_points=TRAINING_RUNS, read_when=IN_LORA,
        rule=_lora_targets,
        help="finetune_mode lora: the Linear layers given adapters: attention (q_proj, k_proj, v_proj, out_proj), ffn "
             "(w1, w2, w3), both, or a comma-separated list of layer names."),
    Key("freeze_layers", FINETUNE, 2, low=NON_NEGATIVE, high=512, entry_points=TRAINING_RUNS, read_when=IN_FREEZE,
        help="finetune_mode freeze: transformer blocks frozen from the bottom, with the embeddings (a tokenizer's "
             "encoder blocks come first, then its decoder's)."),
    # ---- performance
    # speed only: the epoch order is a pure function of (seed, epoch), whatever the workers
    Key("num_workers", PERFORMANCE, 0, low=NON_NEGATIVE, high=256, neutral=True,
        help="DataLoader worker processes per rank (windows are cheap: 0 is usually fastest)."),
    Key("num_threads", PERFORMANCE, 0, low=NON_NEGATIVE, high=4096, neutral=True,
        help="Intra-op CPU threads per process; 0 = the CPUs this process may use / processes per node."),
    Key("compile", PERFORMANCE, "auto", kind="on_off", choices=AUTO_ON_OFF, neutral=True,
        help="torch.compile the training model: auto (on for CUDA; on CPU for runs of 1000+ optimizer steps, when a "
             "C++ compiler is present), on, or off."),
    Key("precision", PERFORMANCE, "auto", choices=("auto", "fp32", "bf16"),
        help="auto (bf16 autocast and TF32 matmuls on CUDA, fp32 on CPU), fp32, or bf16 (autocast)."),
    Key("adamw_impl", PERFORMANCE, "auto", choices=("auto", "fused", "foreach", "for-loop"), neutral=True,
        help="AdamW kernel: auto (fused where torch has it, else foreach), fused, foreach, or for-loop."),
    Key("fused_layers", PERFORMANCE, "auto", kind="on_off", choices=AUTO_ON_OFF, neutral=True,
        help="Stacked q/k/v and w1/w3 matmuls, one-pass rotary, one batched decoder pass (same numbers to 1e-6): auto "
             "(on for CUDA, off on CPU, where it measured slower), on, or off."),
    Key("malloc_reuse", PERFORMANCE, "auto", kind="on_off", choices=AUTO_ON_OFF, neutral=True,
        help="Keep freed tensor memory in the process for the next step instead of returning it to the OS after every "
             "op (glibc): auto (on under glibc), on, or off (glibc's defaults)."),
    # ---- model
    Key("d_model", MODEL, 256, low=POSITIVE, high=65536, help="Fresh model: hidden size."),
    Key("n_heads", MODEL, 4, low=POSITIVE, high=1024, help="Fresh model: attention heads."),
    Key("ff_dim", MODEL, 512, low=POSITIVE, high=262144, help="Fresh model: feed-forward size."),
    Key("n_enc_layers", MODEL, 4, low=POSITIVE, high=256,
        help="Fresh model: encoder depth (n-1 blocks, as upstream)."),
    Key("n_dec_layers", MODEL, 4, low=POSITIVE, high=256,
        help="Fresh model: decoder depth (n-1 blocks, as upstream)."),
    Key("s1_bits", MODEL, 10, low=POSITIVE, high=31, help="Fresh model: coarse code bits."),
    Key("s2_bits", MODEL, 10, low=POSITIVE, high=31, help="Fresh model: fine code bits."),
    # ---- backtest
    Key("backtest_time_range", BACKTEST, [], kind="optional_time_range", neutral=True,
        help="Backtest dates, START:END; empty (default) = the test range, from the first date a signal has "
             "(upstream: 2024-07-01:2025-06-05)."),
    Key("backtest_n_symbol_hold", BACKTEST, 0, low=NON_NEGATIVE, high=100_000, neutral=True,
        help="Backtest: symbols held (TopkDropoutStrategy's topk); 0 = upstream's 50, or a fifth of the symbols with "
             "a signal when that is fewer. A top-k holding half of them or more is skipped: it trades alike on any "
             "signal."),
    Key("backtest_n_symbol_drop", BACKTEST, 5, low=NON_NEGATIVE, high=100_000, neutral=True,
        help="Backtest: held symbols swapped for better-scored ones each day (n_drop)."),
    Key("backtest_hold_thresh", BACKTEST, 5, low=POSITIVE, high=100_000, neutral=True,
        help="Backtest: days a symbol is held before it may be sold (hold_thresh)."),
    Key("backtest_signal_stride", BACKTEST, 1, low=NON_NEGATIVE, high=10**9, entry_points=SCORECARD_RUNS, neutral=True,
        help="Backtest: trading days between two signal dates; the Kronos pairs forecast every symbol on each (1 = "
             "every day, as upstream; each date costs a forecast per symbol). 0 = the scorecard's origin dates only "
             "(no forecast of its own)."),
    Key("backtest_n_random", BACKTEST, 20, low=NON_NEGATIVE, high=10_000, neutral=True,
        help="Backtest: random signals the fine-tuned signal is compared with, each one backtest (backtest_random_*, "
             "tag backtest_verdict); 0 = none."),
    Key("backtest_benchmark", BACKTEST, "", neutral=True, rule=_instrument_code,
        help="Backtest benchmark: a Qlib instrument code with a close series; empty = upstream's index for the "
             "instrument (csi300 SH000300, csi800 SH000906, csi1000 SH000852; SH000300 for any other universe)."),
    # ---- tracking
    Key("experiment_name", TRACKING, "", neutral=True, rule=_experiment,
        help="MLflow experiment; empty = MLFLOW_EXPERIMENT_NAME/ID or MLflow's default."),
    Key("run_name", TRACKING, "", neutral=True, rule=_run_name,
        help="MLflow run name; empty = one made from the learning rate and weight decay."),
    Key("registered_model_name", TRACKING, "", entry_points=TRAINING_RUNS, neutral=True, rule=_model_name,
        help="Register the best model under this name; empty = do not register."),
    Key("system_metrics", TRACKING, "on", kind="on_off", choices=ON_OFF, neutral=True,
        help="MLflow system metrics (CPU, memory, disk, network; GPU with nvidia-ml-py) on the run: on or off."),
    Key("system_metrics_interval_s", TRACKING, 30.0, low=POSITIVE, high=86_400.0, least=0.1, neutral=True,
        help="Seconds between logged system-metric points (each the mean of 3 samples)."),
    # ---- comet
    Key("comet", COMET, "auto", choices=("auto", "online", "offline", "off"), entry_points=TRAINING_RUNS, neutral=True,
        help="auto (online when COMET_API_KEY is set, else off), online, offline, or off."),
    Key("comet_project_name", COMET, "kronos-tokenizer", neutral=True,
        help="Comet project."),
    Key("comet_workspace", COMET, "", neutral=True,
        help="Comet workspace; empty = the key's default."),
    Key("comet_offline_directory", COMET, "", directory=True, neutral=True,
        help="Where offline Comet archives go; empty = COMET_OFFLINE_DIRECTORY or ./.cometml-runs."),
    Key("comet_tag", COMET, "finetune_demo", neutral=True,
        help="Tag added to the Comet experiment (upstream's key)."),
    Key("comet_name", COMET, "finetune_demo", neutral=True,
        help="Comet experiment name (upstream's key)."),
)

#: key name -> its declaration.
KEY: dict[str, Key] = {key.name: key for key in KEYS}
if len(KEY) != len(KEYS):
    raise ValueError("a config key is declared twice")


def section_keys(section: str) -> tuple[Key, ...]:
    """The keys of ``section``, in declaration order."""
    if section not in SECTIONS:
        raise KeyError(section)
    return tuple(key for key in KEYS if key.section == section)


#: ``lora_targets``' groups: the Linear layers of every transformer block of both models.
LORA_GROUPS = {"attention": ("q_proj", "k_proj", "v_proj", "out_proj"), "ffn": ("w1", "w2", "w3")}
LORA_GROUPS["both"] = LORA_GROUPS["attention"] + LORA_GROUPS["ffn"]


def lora_targets(config: Mapping[str, Any]) -> tuple[str, ...]:
    """``lora_targets`` as Linear layer names: a group of :data:`LORA_GROUPS`, or names the
    stage's models have (``stage_keys(config).linear_layers``); one line naming them otherwise."""
    raw = str(config.get("lora_targets") or "").strip()
    if raw in LORA_GROUPS:
        return LORA_GROUPS[raw]
    known = stage_keys(config).linear_layers
    names = [part.strip() for part in raw.split(",")]
    if not raw or not all(name in known for name in names):
        bad = next((name for name in names if name not in known), raw)
        raise ConfigError(f"lora_targets: '{checks.shown(bad)}' matches no Linear layer of the {stage_of(config)}; "
                          f"expected {', '.join(LORA_GROUPS)}, or names among {', '.join(known)}")
    return tuple(dict.fromkeys(names))


def horizons(config: Mapping[str, Any]) -> list[int]:
    """``eval_horizons`` as steps (ascending, distinct); empty: 1, 5 and ``predict_window`` (those inside it)."""
    horizon, raw = int(config["predict_window"]), str(config.get("eval_horizons") or "").strip()
    default = sorted({k for k in (1, 5, horizon) if k <= horizon})
    if not raw:
        return default
    steps = [part.strip() for part in raw.split(",")]
    if not all(ascii_digits(s) and len(s) <= 7 and 1 <= int(s) <= horizon for s in steps):
        raise ConfigError(f"eval_horizons: {checks.shown(raw)} is not a comma-separated list of forecast steps; expected "
                          f"integers in 1..predict_window ({horizon}), e.g. {','.join(map(str, default))}")
    return sorted({int(s) for s in steps})


#: The scorecard's and the backtest's keys (a predictor run's end-of-run evaluation).
EVALUATION_KEYS = tuple(key.name for key in KEYS if key.section in (EVALUATION, BACKTEST))
#: Where the windows come from and how long they are: what a scoring command (``evaluate``,
#: ``evaluate-tokenizer``) takes from the run that made the model it scores, unless given.
DATA_WINDOW_KEYS = tuple(key.name for key in KEYS if key.window)
#: Where a command writes (its data cache, its outputs, their folders): always the command's own
#: (its config file, flags, defaults), never taken from a run's recorded settings.
PLACES_TO_WRITE = tuple(key.name for key in KEYS if key.directory or key.inside)
