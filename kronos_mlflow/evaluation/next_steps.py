"""What a finished command prints last: where its run is, how to look at it, and the number the
user came for with the file that holds it (a few lines, rank 0 only)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config.secrets import redact_uri


def look_command(tracking_uri: str, experiment_id: str | None = None, run_id: str | None = None) -> str:
    """How to see a run: its page on a tracking server, else ``mlflow ui`` on the store used."""
    uri = redact_uri(str(tracking_uri))
    if uri.startswith(("http://", "https://")):
        page = f"/#/experiments/{experiment_id}/runs/{run_id}" if experiment_id and run_id else ""
        return f"open {uri.rstrip('/')}{page}"
    return f"mlflow ui --backend-store-uri {uri}"


def _ci(metrics: Mapping[str, Any], name: str) -> str:
    low, high = metrics.get(f"{name}_ci_low"), metrics.get(f"{name}_ci_high")
    return f" [{low:+.4f}, {high:+.4f}]" if low is not None and high is not None else ""


def _start_and_why(test: Mapping[str, Any]) -> str:
    """``the start`` or ``fresh weights`` (what the run started from), and why an ``inconclusive``
    whose interval excludes 0 is one."""
    from .verdict import inconclusive_why, start_words  # lazy: numpy

    words = start_words(str(test.get("base_label") or ""))
    low, high = test.get("ci_low"), test.get("ci_high")
    why = (inconclusive_why(float(low), float(high), float(test.get("min_change") or 0.0))
           if test.get("verdict") == "inconclusive" and not test.get("reason") and low is not None and high is not None
           else "")
    return f"{words}: {why}" if why else words


def training_lines(result: Mapping[str, Any], *, run_id: str, experiment_id: str | None, tracking_uri: str,
                   run_directory: Path) -> list[str]:
    """The end of a training run: its id, the best validation loss and the held-out verdict,
    the scorecard's skill with its file (a predictor run), its directory, how to look at it."""
    lines = []
    best = result.get("best_val_loss")
    epoch = result.get("best_epoch")
    at = f"epoch {epoch + 1}" if isinstance(epoch, int) and epoch >= 0 else "the start"
    shown = f"best_val_loss {best:.6f} ({at})" if best is not None and best == best else \
        "no validation loss"
    test = result.get("test") or {}
    verdict = test.get("verdict")
    change = test.get("change")
    held = (f", verdict {verdict} (test loss {100 * change:+.2f}% against {_start_and_why(test)})"
            if verdict and change is not None else f", verdict {verdict}" if verdict else "")
    lines.append(f"done: run {run_id}: {shown}{held}")
    card = result.get("scorecard") or {}
    metrics, tags = card.get("metrics") or {}, card.get("tags") or {}
    if "skill_vs_zeroshot" in metrics:
        lines.append(f"scorecard: skill_vs_zeroshot {metrics['skill_vs_zeroshot']:+.4f}{_ci(metrics, 'skill_vs_zeroshot')} "
                     f"({tags.get('verdict_vs_zeroshot', '?')}), in {run_directory / 'evaluation' / 'scorecard.json'}")
    lines.append(f"files: {run_directory}")
    lines.append(f"look at it: {look_command(tracking_uri, experiment_id, run_id)}")
    return lines


def sweep_lines(*, parent_id: str, experiment_id: str | None, tracking_uri: str, value_metric: str,
                best: Mapping[str, Any] | None, output_dir: str) -> list[str]:
    """The end of a sweep: the parent run, the best trial with its number and verdict, how to
    list the trials, where their files are, how to look at it."""
    if best:
        found = (f"best trial #{best['number']} (run {best.get('run_id') or '?'}): {value_metric} "
                 f"{best['value']:.6f}" + (f", verdict {best['verdict']}" if best.get("verdict") else ""))
    else:
        found = "no trial finished"
    return [f"done: sweep parent run {parent_id}: {found}",
            f"its trials: kronos-mlflow compare --parent {parent_id}",
            f"files: {output_dir}",
            f"look at it: {look_command(tracking_uri, experiment_id, parent_id)}"]
