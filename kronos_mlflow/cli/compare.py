"""``kronos-mlflow compare``: the fine-tunes of an experiment (or one sweep's trials), best first.

Runs are read through MLflow's API, grouped (each stage's fine-tunes, evaluations, pipeline
parents) and each group ranked by its own number; the columns, the order and ``--url``:
docs/comparing-runs.md#comparing-runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import UserError
from ..config.names import ascii_digits, shown as shown_value
from ..tracking.keys import BASE_PREFIX, BEST_METRIC, TEST_LOSS_CHANGE, USAGE_FULL, USAGE_S1, VERDICT_TAG
from ..config.secrets import redact_uri
from ..stages import get as stage_spec, names as stage_names
from ..tracking.server import resolve_tracking_uri

# mlflow is imported inside the functions: `kronos-mlflow compare --help` and bad flags answer at once.

LOCAL_UI = "http://127.0.0.1:5000"
PARENT_TAG = "mlflow.parentRunId"
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


# --------------------------------------------------------------------------- command line


#: The most runs --top shows of a group.
TOP_MAX = 1_000_000


def _positive_int(text: str) -> int:
    digits = str(text).strip()
    if not ascii_digits(digits[1:] if digits.startswith(("+", "-")) else digits):
        raise argparse.ArgumentTypeError(f"'{shown_value(text)}' is not a whole number (digits 0-9); expected 1 to "
                                         f"{TOP_MAX:,}")
    value = int(digits) if len(digits) <= 9 else TOP_MAX + 1
    if not 1 <= value <= TOP_MAX:
        raise argparse.ArgumentTypeError(f"{shown_value(text)} is out of range; expected the number of runs to "
                                         f"show, 1 to {TOP_MAX:,}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (parser.description or "") + (
        ". Reads MLflow through its API; the columns and sorting: docs/comparing-runs.md."
    )
    parser.add_argument("--experiment", metavar="NAME",
                        help="experiment name (or id); default: MLFLOW_EXPERIMENT_NAME, MLFLOW_EXPERIMENT_ID, "
                             "the --parent run's experiment, else 'Default'")
    parser.add_argument("--parent", metavar="RUN_ID", help="list only the child runs (sweep trials) of this run")
    parser.add_argument("--top", metavar="N", type=_positive_int, help="show only the N best runs of each group")
    parser.add_argument("--url", action="store_true",
                        help="after the tables, print the MLflow UI address comparing the listed runs")
    parser.add_argument("--json", action="store_true", help="print the runs (and the UI address) as JSON")
    parser.add_argument("--tracking-uri", metavar="URI",
                        help="MLflow tracking URI; default: MLFLOW_TRACKING_URI, else MLflow's default "
                             "(sqlite:///mlflow.db in the current directory)")


def run(args: argparse.Namespace) -> int:
    uri = resolve_tracking_uri(getattr(args, "tracking_uri", None))
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    rows, experiment_ids, skipped = collect(client, experiment=args.experiment, parent=args.parent, top=args.top)
    url = compare_url(uri, [r.run_id for r in rows], experiment_ids=_unique(r.experiment_id for r in rows))
    if args.json:
        json.dump({"tracking_uri": redact_uri(uri), "experiment_ids": experiment_ids,
                   "runs": [r.as_json() for r in rows], "compare_url": url if rows else None},
                  sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    if skipped and not args.url:
        print(f"({skipped} sweep parent run{'s' if skipped > 1 else ''} not listed; "
              "`kronos-mlflow compare --parent RUN_ID` lists a sweep's trials)", file=sys.stderr)
    if not rows:
        where = f"child runs of {args.parent}" if args.parent else f"runs in experiment(s) {', '.join(experiment_ids)}"
        print(f"no {where} at {_shown_uri(uri)}", file=sys.stderr)
        return 0
    groups = grouped(rows)
    for n, (group, members) in enumerate(groups.items()):
        if len(groups) > 1:
            print(("\n" if n else "") + f"{group} runs ({len(members)}), {GROUP_ORDER.get(group, ORDER_BY_LOSS)}:")
        print(format_table(members))
    if args.url:  # the table, then the page comparing its runs (the last line: easy to pipe)
        if not _is_http(uri):
            print(f"(start the UI with: mlflow ui --backend-store-uri {_shown_uri(uri)} --port 5000)", file=sys.stderr)
        print(url)
    return 0


# --------------------------------------------------------------------------- tracking URI


def _is_http(uri: str) -> bool:
    return urllib.parse.urlsplit(uri).scheme.lower() in ("http", "https")


def _shown_uri(uri: str) -> str:
    return redact_uri(uri)


def compare_url(tracking_uri: str, run_ids: Sequence[str], experiment_ids: Sequence[str]) -> str:
    """The MLflow UI run-comparison address (hash router) for ``run_ids``.

    ``<base>/#/compare-runs?runs=<url-encoded JSON list>&experiments=<url-encoded JSON list>``,
    where base is the tracking server (credentials removed) or http://127.0.0.1:5000 (``mlflow
    ui``) for a database or directory.
    """
    if _is_http(tracking_uri):
        parts = urllib.parse.urlsplit(tracking_uri)
        netloc = parts.netloc.rpartition("@")[2]
        base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    else:
        base = LOCAL_UI

    def encoded(values: Sequence[str]) -> str:
        return urllib.parse.quote(json.dumps([str(v) for v in values], separators=(",", ":")), safe="")

    return f"{base}/#/compare-runs?runs={encoded(run_ids)}&experiments={encoded(experiment_ids)}"


# --------------------------------------------------------------------------- reading runs


EVALUATION, PARENT = "evaluation", "parent"
ORDER_BY_LOSS = "best first by best_val_loss"
GROUP_ORDER = {EVALUATION: "best first by skill_vs_zeroshot", PARENT: "newest first"}


@dataclass
class RunRow:
    run_id: str
    run_name: str
    experiment_id: str
    status: str
    #: a stage's name (its fine-tunes), ``evaluation`` or ``parent``
    group: str = ""
    #: an evaluation's ``--model``
    model: str | None = None
    learning_rate: float | None = None
    weight_decay: float | None = None
    epochs_planned: int | None = None
    epochs_done: int | None = None
    best_val_loss: float | None = None
    best_val_skill: float | None = None  # objective val_skill: the best epoch's validation forecast skill
    finetune_mode: str | None = None  # what it trained: full, lora r=R, freeze N (docs/finetune-modes.md)
    best_epoch: int | None = None
    test_loss: float | None = None
    base_test_loss: float | None = None
    test_loss_change: float | None = None
    test_loss_change_ci_low: float | None = None
    test_loss_change_ci_high: float | None = None
    verdict: str | None = None
    codebook_usage_s1: int | None = None
    codebook_usage_full: int | None = None
    codebook_bits: str | None = None
    duration_s: float | None = None
    start_time: int = 0
    trial_number: int | None = None
    trial_state: str | None = None
    parent_run_id: str | None = None
    #: the scorecard's skills (a predictor run or ``kronos-mlflow evaluate``): baseline ->
    #: (skill, ci_low, ci_high, verdict)
    skills: dict[str, tuple] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _unique(values: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for v in values:
        seen.setdefault(v, None)
    return list(seen)


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _integer(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number == int(number) else None


def resolve_experiments(client, experiment: str | None, parent_run=None) -> list[str]:
    """Experiment ids to search: ``--experiment``, the parent's, the environment's, or Default."""
    from mlflow.exceptions import MlflowException

    name = (experiment or "").strip()
    if not name and parent_run is not None:
        return [parent_run.info.experiment_id]
    if not name:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "").strip()
    if not name and os.environ.get("MLFLOW_EXPERIMENT_ID", "").strip():
        env_id = os.environ["MLFLOW_EXPERIMENT_ID"].strip()
        return [_experiment_by_id(client, env_id, "MLFLOW_EXPERIMENT_ID").experiment_id]
    name = name or "Default"
    exp = client.get_experiment_by_name(name)
    if exp is None and ascii_digits(name):
        try:
            exp = client.get_experiment(name)
        except MlflowException:
            exp = None
    if exp is None:
        known = [e.name for e in client.search_experiments(max_results=20)]
        shown = ", ".join(f"'{n}'" for n in known[:8]) + (" ..." if len(known) > 8 else "")
        raise UserError(f"experiment '{name}' does not exist; expected one of {shown or '(none)'}")
    if exp.lifecycle_stage == "deleted":
        raise UserError(f"experiment '{name}' is deleted; restore it or choose another experiment")
    return [exp.experiment_id]


def _experiment_by_id(client, experiment_id: str, source: str):
    from mlflow.exceptions import MlflowException

    try:
        exp = client.get_experiment(experiment_id)
    except MlflowException:
        raise UserError(f"experiment id '{experiment_id}' ({source}) does not exist; set an existing id") from None
    if exp.lifecycle_stage == "deleted":
        raise UserError(f"experiment id '{experiment_id}' ({source}) is deleted; restore it or choose another")
    return exp


def _get_parent(client, parent: str):
    from mlflow.exceptions import MlflowException

    if not _RUN_ID.match(parent):
        raise UserError(f"--parent '{parent}' is not a run id; expected the 32-character id MLflow shows for a run")
    try:
        return client.get_run(parent)
    except MlflowException:
        raise UserError(
            f"--parent run '{parent}' does not exist; expected the run id of a sweep's parent run"
        ) from None


def search_all(client, experiment_ids: Sequence[str], filter_string: str = "") -> list:
    """Every active run matching ``filter_string`` (all pages)."""
    from mlflow.entities import ViewType

    runs, token = [], None
    while True:
        page = client.search_runs(list(experiment_ids), filter_string=filter_string,
                                  run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def group_of(params: Mapping[str, str], metrics: Mapping[str, float], tags: Mapping[str, str]) -> str:
    """A run's group: ``parent`` (a pipeline's parent), ``evaluation`` (it scored a model: its
    ``model`` and ``zeroshot_*`` params, or the pipeline's evaluation step), else the stage it
    fine-tuned (its ``stage`` param; a run made before that param existed: the stage whose
    validation metric it logged, else the first stage)."""
    if tags.get("pipeline.role") == PARENT:
        return PARENT
    if tags.get("pipeline.step") == EVALUATION or ("model" in params and (
            "zeroshot_predictor" in params or "base" in params)):  # evaluate, evaluate-tokenizer --log
        return EVALUATION
    known = stage_names()
    if params.get("stage") in known:
        return params["stage"]
    return next((name for name in known if stage_spec(name).val_metric in metrics), known[0])


def grouped(rows: Iterable[RunRow]) -> dict[str, list[RunRow]]:
    """``rows`` by group, in the order stages, evaluation, parent (each group's own order kept)."""
    order = [*stage_names(), EVALUATION, PARENT]
    out: dict[str, list[RunRow]] = {}
    for row in sorted(rows, key=lambda r: order.index(r.group) if r.group in order else len(order)):
        out.setdefault(row.group, []).append(row)
    return out


def _row(run, now_ms: int) -> RunRow:
    params, metrics, tags = run.data.params, run.data.metrics, run.data.tags
    info = run.info
    end = info.end_time or (now_ms if info.status == "RUNNING" else None)
    group = group_of(params, metrics, tags)
    if group in (EVALUATION, PARENT):  # a training run's params, logged beside them, do not apply
        params = {"model": params["model"]} if "model" in params else {}
    return RunRow(
        run_id=info.run_id,
        run_name=info.run_name or tags.get("mlflow.runName", "") or info.run_id[:8],
        experiment_id=info.experiment_id,
        status=info.status,
        group=group,
        model=params.get("model"),
        learning_rate=_number(params.get("learning_rate", params.get("tokenizer_learning_rate"))),
        weight_decay=_number(params.get("weight_decay", params.get("adam_weight_decay"))),
        epochs_planned=_integer(params.get("epochs")),
        best_val_loss=_number(metrics.get(BEST_METRIC)),
        best_val_skill=_number(metrics.get("best_val_skill")),
        finetune_mode=_mode(params),
        test_loss=_number(metrics.get(_test_loss(group))),
        base_test_loss=_number(metrics.get(f"{BASE_PREFIX}{_test_loss(group)}")),
        test_loss_change=_number(metrics.get(TEST_LOSS_CHANGE)),
        test_loss_change_ci_low=_number(metrics.get(f"{TEST_LOSS_CHANGE}_ci_low")),
        test_loss_change_ci_high=_number(metrics.get(f"{TEST_LOSS_CHANGE}_ci_high")),
        verdict=tags.get(VERDICT_TAG),
        codebook_usage_s1=_integer(metrics.get(USAGE_S1)),
        codebook_usage_full=_integer(metrics.get(USAGE_FULL)),
        codebook_bits=tags.get("codebook_bits"),
        duration_s=(end - info.start_time) / 1000.0 if end and info.start_time else None,
        start_time=int(info.start_time or 0),
        trial_number=_integer(tags.get("optuna.trial_number")),
        trial_state=tags.get("optuna.trial_state"),
        parent_run_id=tags.get(PARENT_TAG),
        skills={name: (_number(metrics.get(name)), _number(metrics.get(f"{name}_ci_low")),
                       _number(metrics.get(f"{name}_ci_high")), tags.get(verdict) if verdict else None)
                for name, verdict in SKILL_COLUMNS if name in metrics},
        tags={k: v for k, v in tags.items() if k in (
            "instrument", "model_size", "codebook_bits", "data_digest", "mlflow.source.git.commit",
            "optuna.study_name", "optuna.trial_number", "optuna.trial_state", "best_model_uri")},
    )


def _mode(params) -> str | None:
    """The fine-tune mode a run's params record, with what sizes it (None: a run made before it)."""
    mode = params.get("finetune_mode")
    if mode == "lora":
        return f"lora r={params.get('lora_rank', '?')}"
    if mode == "freeze":
        return f"freeze {params.get('freeze_layers', '?')}"
    return mode


def _test_loss(group: str) -> str:
    """The held-out loss a run of ``group`` records (its stage's; none for other groups)."""
    return stage_spec(group).test_loss if group in stage_names() else ""


def _at_best_epoch(client, row: RunRow) -> None:
    """Epochs done and best epoch (from the validation history of the run's stage), and the
    codebook usage at that epoch where the stage logs it (the latest value is the last epoch's)."""
    history = client.get_metric_history(row.run_id, stage_spec(row.group).val_metric)
    if not history:
        return
    by_step = {m.step: m.value for m in history}
    row.epochs_done = len(by_step)
    best_step = min(sorted(by_step), key=lambda s: by_step[s])  # the first minimum, as training keeps it
    row.best_epoch = best_step
    for key, attr in ((USAGE_S1, "codebook_usage_s1"), (USAGE_FULL, "codebook_usage_full")):
        values = {m.step: m.value for m in client.get_metric_history(row.run_id, key)}
        if best_step in values:
            setattr(row, attr, _integer(values[best_step]))


def sort_rows(rows: list[RunRow], by_skill: bool = False) -> list[RunRow]:
    """Lowest best_val_loss first (``by_skill``: highest best_val_skill first, as a sweep on
    ``objective: val_skill`` ranks its trials); runs without one last, newest first. Rows of
    one group: :func:`collect` sorts each group with its own rule (:func:`sort_group`)."""
    if by_skill:
        return sorted(rows, key=lambda r: (r.best_val_skill is None,
                                           -r.best_val_skill if r.best_val_skill is not None else 0.0, -r.start_time))
    return sorted(rows, key=lambda r: (r.best_val_loss is None,
                                       r.best_val_loss if r.best_val_loss is not None else 0.0, -r.start_time))


def sort_group(group: str, rows: list[RunRow], by_skill: bool = False) -> list[RunRow]:
    """One group ranked by its own number: a stage's runs by :func:`sort_rows`, evaluations by
    ``skill_vs_zeroshot`` descending, parents newest first; runs without the number last, newest first."""
    if group == EVALUATION:
        def skill(r: RunRow) -> float | None:
            return r.skills.get("skill_vs_zeroshot", (None,))[0]
        return sorted(rows, key=lambda r: (skill(r) is None, -(skill(r) or 0.0), -r.start_time))
    if group == PARENT:
        return sorted(rows, key=lambda r: -r.start_time)
    return sort_rows(rows, by_skill)


def collect(client, experiment: str | None = None, parent: str | None = None,
            top: int | None = None) -> tuple[list[RunRow], list[str], int]:
    """Rows (sorted, the best epoch's details filled in), the experiment ids searched, and the
    number of sweep parent runs left out."""
    parent_run = _get_parent(client, parent.strip()) if parent else None
    experiment_ids = resolve_experiments(client, experiment, parent_run)
    filter_string = f"tags.`{PARENT_TAG}` = '{parent_run.info.run_id}'" if parent_run is not None else ""
    runs = search_all(client, experiment_ids, filter_string)
    now_ms = int(time.time() * 1000)
    skipped = 0
    rows = []
    for r in runs:
        if parent_run is None and r.data.tags.get("sweep.role") == "parent":
            skipped += 1
            continue
        rows.append(_row(r, now_ms))
    by_skill = parent_run is not None and parent_run.data.tags.get("sweep.objective") == "val_skill"
    rows = [row for group, members in grouped(rows).items()
            for row in sort_group(group, members, by_skill)[:top or None]]
    for row in rows:
        if row.group in stage_names():
            _at_best_epoch(client, row)
    return rows, experiment_ids, skipped


# --------------------------------------------------------------------------- table


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _usage(used: int | None, bits: int | None) -> str:
    if used is None:
        return "-"
    return f"{used}/{1 << bits}" if bits is not None and bits <= 40 else str(used)


def _change(row: RunRow) -> str:
    """``-2.9% [-3.4%, -2.5%]``: the test loss change and its 95% interval."""
    from ..evaluation.verdict import percent  # lazy: numpy

    if row.test_loss_change is None:
        return "-"
    text = percent(row.test_loss_change)
    if row.test_loss_change_ci_low is not None and row.test_loss_change_ci_high is not None:
        text += f" [{percent(row.test_loss_change_ci_low)}, {percent(row.test_loss_change_ci_high)}]"
    return text


#: the scorecard's columns: metric, the tag of its verdict (docs/forecast-evaluation.md)
SKILL_COLUMNS = (("skill_vs_zeroshot", "verdict_vs_zeroshot"), ("skill_vs_persistence", "verdict_vs_persistence"),
                 ("wql_skill_vs_persistence", "verdict_wql_vs_persistence"), ("win_rate_vs_persistence", None))


def _skill(row: RunRow, name: str) -> str:
    """``+0.120 [+0.050, +0.200] better``: a scorecard skill, its 95% interval and verdict (a
    win rate: the share, ``0.540``)."""
    if name not in row.skills or row.skills[name][0] is None:
        return "-"
    value, low, high, verdict = row.skills[name]
    text = f"{value:.3f}" if name.startswith("win_rate") else f"{value:+.3f}"
    if low is not None and high is not None:
        text += f" [{low:+.3f}, {high:+.3f}]"
    return text + (f" {verdict}" if verdict else "")


def _s1_bits(row: RunRow) -> int | None:
    if row.codebook_bits and "+" in row.codebook_bits:
        return _integer(row.codebook_bits.split("+", 1)[0])
    return None


def table_rows(rows: Sequence[RunRow]) -> tuple[list[str], list[list[str]]]:
    """The header and cells of one group's table (:func:`grouped`)."""
    with_skills = [name for name, _ in SKILL_COLUMNS if any(name in r.skills for r in rows)]
    if rows and all(r.group in (EVALUATION, PARENT) for r in rows):  # scored, not trained: no training columns
        with_model = any(r.model for r in rows)
        header = ["name"] + (["model"] if with_model else []) + with_skills + ["duration", "status", "run_id"]
        return header, [[r.run_name, *([r.model or "-"] if with_model else []), *(_skill(r, b) for b in with_skills),
                         _duration(r.duration_s), r.status, r.run_id] for r in rows]
    with_trials = any(r.trial_number is not None for r in rows)
    with_val_skill = any(r.best_val_skill is not None for r in rows)
    with_mode = any(r.finetune_mode not in (None, "full") for r in rows)  # a column once some run trained part
    # codebook usage: the columns of a group where some run recorded it (the tokenizer's)
    with_codes = any(r.codebook_usage_s1 is not None or r.codebook_usage_full is not None for r in rows)
    header = ["name"] + (["mode"] if with_mode else []) + ["learning_rate", "weight_decay", "epochs", "best_val_loss"] + (
        ["best_val_skill"] if with_val_skill else []) + ["test_loss", "base_loss", "change", "verdict"] + (
        ["codes_s1", "codes_full"] if with_codes else []) + ["duration", "status"]
    header += with_skills
    header += (["trial"] if with_trials else []) + ["run_id"]
    body = []
    for r in rows:
        epochs = "-" if r.epochs_planned is None else str(r.epochs_planned)
        if r.epochs_done is not None and r.epochs_done != r.epochs_planned:
            epochs = f"{r.epochs_done}/{epochs}"
        line = [
            r.run_name,
            *([r.finetune_mode or "full"] if with_mode else []),
            "-" if r.learning_rate is None else f"{r.learning_rate:.2e}",
            "-" if r.weight_decay is None else f"{r.weight_decay:g}",
            epochs,
            "-" if r.best_val_loss is None else f"{r.best_val_loss:.6f}",
            *(["-" if r.best_val_skill is None else f"{r.best_val_skill:+.4f}"] if with_val_skill else []),
            "-" if r.test_loss is None else f"{r.test_loss:.6f}",
            "-" if r.base_test_loss is None else f"{r.base_test_loss:.6f}",
            _change(r),
            r.verdict or "-",
            *([_usage(r.codebook_usage_s1, _s1_bits(r)), _usage(r.codebook_usage_full, None)] if with_codes else []),
            _duration(r.duration_s),
            r.status,
            *(_skill(r, b) for b in with_skills),
        ]
        if with_trials:
            line.append("-" if r.trial_number is None else f"#{r.trial_number} {r.trial_state or ''}".strip())
        line.append(r.run_id)
        body.append(line)
    return header, body


def format_table(rows: Sequence[RunRow]) -> str:
    header, body = table_rows(rows)
    numeric = {"learning_rate", "weight_decay", "epochs", "best_val_loss", "best_val_skill", "test_loss", "base_loss", "change",
               "codes_s1", "codes_full", "duration"}
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=True)]

    def fmt(cells: Sequence[str]) -> str:
        padded = (c.rjust(w) if h in numeric else c.ljust(w) for c, w, h in zip(cells, widths, header, strict=True))
        return "  ".join(padded).rstrip()

    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(line) for line in body)])
