"""The one fake logger of the tests: every call of the logger protocol
(kronos_mlflow/tracking/protocol.py), recorded in order."""

from __future__ import annotations

from typing import Any


class Recorder:
    """An :class:`~kronos_mlflow.tracking.protocol.ExperimentLogger` that appends
    ``(name, method, *args)`` to ``journal`` for every call (mappings copied). Several recorders
    may share one journal, to see the order in which a MultiLogger reached them.

    ``fail_on``: the method that raises ``error`` (default ``RuntimeError("<name> broke in
    <method>")``) instead of being recorded. ``attempts`` counts every call, failed ones too.
    ``essential`` is what MultiLogger reads to decide whether a failure propagates."""

    def __init__(self, name: str = "recorder", journal: list | None = None, essential: bool = True,
                 fail_on: str | None = None, error: Exception | None = None):
        self.name, self.essential, self.fail_on, self.error = name, essential, fail_on, error
        self.journal: list[tuple] = [] if journal is None else journal
        self.attempts = 0

    def _record(self, method: str, *args: Any) -> None:
        self.attempts += 1
        if method == self.fail_on:
            raise self.error or RuntimeError(f"{self.name} broke in {method}")
        self.journal.append((self.name, method) + args)

    # the protocol

    def log_hyperparams(self, params):
        self._record("log_hyperparams", dict(params))

    def log_metrics(self, metrics, step):
        self._record("log_metrics", dict(metrics), step)

    def log_artifact(self, local_path, artifact_path=None):
        self._record("log_artifact", local_path, artifact_path)

    def set_tags(self, tags):
        self._record("set_tags", dict(tags))

    def persist(self):
        self._record("persist")

    def finalize(self, status, reason=None):
        self._record("finalize", status, reason)

    # queries

    @property
    def calls(self) -> list[tuple]:
        """This recorder's calls, in order, as ``(method, *args)``."""
        return [entry[1:] for entry in self.journal if entry[0] == self.name]

    def calls_to(self, method: str) -> list[tuple]:
        """The arguments of each call of ``method``, in order."""
        return [call[1:] for call in self.calls if call[0] == method]

    @property
    def metrics(self) -> list[tuple[int, dict]]:
        """Each ``log_metrics`` call as ``(step, metrics)``."""
        return [(step, metrics) for metrics, step in self.calls_to("log_metrics")]

    def history(self, name: str) -> list[tuple[int, float]]:
        """The metric ``name``'s ``(step, value)`` pairs, in the order they were logged."""
        return [(step, float(metrics[name])) for step, metrics in self.metrics if name in metrics]
