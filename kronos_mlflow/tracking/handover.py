"""Files another run hands over (a walk-forward parent's ``walkforward/folds.json``, an evaluation
run's ``evaluation/origins.parquet`` and ``forecasts.parquet``, a logged forecaster's
``calibrator/calibrator.json``), each read through one reader that
checks it whole (the fold table's, :func:`kronos_mlflow.workflows.walkforward.folds.read_folds_json`,
with this module's checks): any way it can be wrong is one :class:`~kronos_mlflow.errors.UserError`
line naming the file and where it came from, never another exception (docs/reliability.md#what-a-name-may-be).
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config import names
from ..errors import UserError, short_reason
from ..runtime.fsutil import JsonFileError, load_json

FOLDS_JSON = "walkforward/folds.json"
ORIGINS_PARQUET = "evaluation/origins.parquet"
FORECASTS_PARQUET = "evaluation/forecasts.parquet"
ACI_STATE_JSON = "evaluation/aci_state.json"  # the levels a period's ACI ended at (evaluation/aci_carry.py)
#: the artifacts :func:`download` fetches: a fixed path each, never one read from outside
ARTIFACTS = (FOLDS_JSON, ORIGINS_PARQUET, FORECASTS_PARQUET, ACI_STATE_JSON)

MAX_JSON_BYTES = 1 << 20
#: a handed-over table's most bytes on disk, rows, and bytes its columns read may decode to (a
#: scorecard of 100,000 origins, 4 forecasters and 60 steps decodes to about 3 GB)
MAX_PARQUET_BYTES = 1 << 30
MAX_ROWS = 50_000_000
MAX_DECODED_BYTES = 4 << 30
MAX_TEXT = 128  # an instrument's or a length's text
MAX_STEP = 10_000
MAX_BARS = 10**8
MAX_EMBARGO = 10**6
#: the forecasters a scorecard writes (origins' ``<name>_mase`` columns, forecasts' ``forecaster``)
FORECASTERS = ("finetuned", "zeroshot", "persistence", "seasonal_naive", "histvol", "finetuned_calibrated", "ensemble",
               "aci")
QUANTILES = tuple(f"q{level / 10:.1f}" for level in range(1, 10))
#: what newer scorecards add: the ends of the 50% and 90% intervals, the PIT, p_up
EXTRA_FORECAST_COLUMNS = ("q0.05", "q0.25", "q0.75", "q0.95", "pit", "p_up")
BOOTSTRAP_UNITS = ("date", "origin")

_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}(T[0-9]{2}:[0-9]{2}(:[0-9]{2})?)?")


# ----------------------------------------------------------------------------- downloads


def download(client, run_id: Any, artifact_path: str, scratch: str | os.PathLike, source: str) -> Path:
    """``artifact_path`` (one of :data:`ARTIFACTS`) of the run ``run_id``, downloaded into a new
    folder under ``scratch`` (the command's own temporary directory); the local file's path.
    A run id that is not one (:func:`kronos_mlflow.config.names.run_id`), or an artifact the run
    lacks, is one line naming ``source``; no path component comes from the file's content."""
    if artifact_path not in ARTIFACTS:
        raise ValueError(f"{artifact_path!r} is not a handed-over artifact this module reads")
    run_id = names.run_id(run_id, source)
    into = Path(tempfile.mkdtemp(prefix="handover-", dir=os.fspath(scratch)))
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact_path, dst_path=str(into),
                                                    tracking_uri=client.tracking_uri)
    except (MlflowException, OSError, ValueError) as exc:
        raise UserError(f"{source}: run {run_id} has no {artifact_path} that can be downloaded "
                        f"({short_reason(exc, 120)}); expected the file its command logged") from None
    return names.inside(local, into, f"{source}: the download of {artifact_path}")


# ----------------------------------------------------------------------------- helpers


def _regular_file(path: Path, source: str, max_bytes: int) -> int:
    """The size of ``path``, a regular file of at most ``max_bytes``; else one line."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{source} is missing; expected the file its command logged") from None
    except OSError as exc:
        raise UserError(f"{source} cannot be read ({short_reason(exc, 120)})") from None
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"{source} is not a regular file; expected the file its command logged")
    if info.st_size > max_bytes:
        raise UserError(f"{source} is {info.st_size:,} bytes, more than the {max_bytes:,} such a file may have")
    return info.st_size


def json_value(path: Path, source: str, expected: str, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON value of ``path`` (a regular file of at most ``max_bytes``, read by
    :func:`kronos_mlflow.runtime.fsutil.load_json`), or one line naming ``source`` (never the
    local copy's path: a scratch file the user never sees)."""
    try:
        return load_json(path, max_bytes)
    except JsonFileError as exc:
        if exc.kind in ("missing", "not-regular"):
            raise UserError(f"{source} {exc.detail}; expected the file its command logged") from None
        if exc.kind in ("too-large", "unreadable"):
            raise UserError(f"{source} {exc.detail}") from None
        raise UserError(f"{source} {exc.detail}; expected {expected}") from None


def kind_of(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "true/false", int: "an integer", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def keys_of(value: Any, expected, source: str, where: str) -> dict:
    """``value``, an object with exactly the keys ``expected``."""
    shown = ", ".join(expected)
    if not isinstance(value, dict):
        raise UserError(f"{source}: {where} is {kind_of(value)}; expected an object with the keys {shown}")
    missing = [k for k in expected if k not in value]
    extra = [k for k in value if k not in expected]
    if missing or extra:
        said = "; ".join(part for part in (f"lacks {', '.join(missing)}" if missing else "",
                                           f"has the unknown key '{names.shown(extra[0])}'" if extra else "") if part)
        raise UserError(f"{source}: {where} {said}; expected exactly the keys {shown}")
    return value


def integer(value: Any, source: str, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UserError(f"{source}: {where} is '{names.shown(value)}'; expected an integer from {low:,} to {high:,}")
    return value


def format_and_version(data: Mapping[str, Any], source: str, fmt: str, version: int, what: str) -> None:
    """``data["format"]`` is ``fmt`` and ``data["version"]`` the integer ``version`` (of ``what``,
    e.g. the calibrator, that this kronos-mlflow reads), and ``data["method"]`` text; else one
    line naming ``source`` and the field."""
    if data["format"] != fmt:
        raise UserError(f"{source}: format is '{names.shown(data['format'])}'; expected '{fmt}'")
    if isinstance(data["version"], bool) or data["version"] != version:
        raise UserError(f"{source}: version is '{names.shown(data['version'])}'; expected {version} (the {what} "
                        "version this kronos-mlflow reads)")
    text(data["method"], source, "method")


def text(value: Any, source: str, where: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise UserError(f"{source}: {where} is {kind_of(value)} '{names.shown(value)}'; expected text of at most "
                        f"{MAX_TEXT} characters")
    return value


def date(value: Any, source: str, where: str) -> str:
    ok = isinstance(value, str) and _DATE.fullmatch(value)
    if ok:
        try:
            _dt.datetime.fromisoformat(value)
        except ValueError:
            ok = False
    if not ok:
        raise UserError(f"{source}: {where} is '{names.shown(value)}'; expected a date YYYY-MM-DD or YYYY-MM-DDTHH:MM")
    return value


def period(value: Any, source: str, where: str) -> tuple[str, str]:
    if not isinstance(value, list) or len(value) != 2:
        raise UserError(f"{source}: {where} is '{names.shown(value)}'; expected a list of two dates [first, last]")
    first, last = (date(v, source, f"{where}[{i}]") for i, v in enumerate(value))
    if _dt.datetime.fromisoformat(first) > _dt.datetime.fromisoformat(last):
        raise UserError(f"{source}: {where} runs from {first} back to {last}; expected its first date before its last")
    return first, last


# ----------------------------------------------------------------------------- folds.json


# ----------------------------------------------------------------------------- parquet tables


def _parquet(path: Path, source: str, required: Mapping[str, str], optional: Mapping[str, str]):
    """The pyarrow table of ``path``'s columns ``required`` (all) and ``optional`` (those it
    has), each checked against its kind (``time``, ``text``, ``number``, ``integer``), and the
    columns read with their kinds. The file is read from its footer first: its schema (names,
    types), its row count and the uncompressed size of the columns read are checked before any
    column is decoded."""
    import pyarrow.parquet as pq

    _regular_file(path, source, MAX_PARQUET_BYTES)
    try:
        reader = pq.ParquetFile(path)
        schema, meta = reader.schema_arrow, reader.metadata
    except Exception as exc:  # noqa: BLE001 - pyarrow's many ways of saying "not Parquet"
        raise UserError(f"{source} is not a Parquet file ({short_reason(exc, 120)}); expected the table its "
                        "command logged") from None
    try:
        wanted = _checked_footer(schema, meta, source, required, optional)
        table = reader.read(columns=list(wanted), use_threads=False)
        if table.num_rows != meta.num_rows or table.column_names != list(wanted):
            raise ValueError("the file's footer does not describe its data")
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged page, a footer that lies
        raise UserError(f"{source} cannot be read as Parquet ({short_reason(exc, 120)}); expected the table its "
                        "command logged") from None
    finally:
        reader.close()
    return table, wanted


def _checked_footer(schema, meta, source: str, required: Mapping[str, str], optional: Mapping[str, str]) -> dict:
    """The columns to read (in the file's order) with their kinds, once the footer passes."""
    import pyarrow as pa

    columns = list(schema.names)
    if len(set(columns)) != len(columns):
        twice = next(c for c in columns if columns.count(c) > 1)
        raise UserError(f"{source} has the column {names.shown(twice)} twice; expected each column once")
    missing = [c for c in required if c not in columns]
    if missing:
        raise UserError(f"{source} lacks the column{'s' if len(missing) > 1 else ''} {', '.join(missing)}; expected "
                        f"the columns {', '.join(required)}")
    if meta.num_rows > MAX_ROWS:
        raise UserError(f"{source} has {meta.num_rows:,} rows, more than the {MAX_ROWS:,} such a table may have")
    kinds = {**required, **optional}
    wanted = {c: kinds[c] for c in columns if c in kinds}
    for name, kind in wanted.items():
        if not _is_kind(schema.field(name).type, kind, pa):
            raise UserError(f"{source}: column {name} is of type {schema.field(name).type}; expected {_KINDS[kind]}")
    # each row group's own total (every column's uncompressed bytes): a column chunk's metadata is
    # never built here, since pyarrow aborts the process on some damaged ones (a size histogram
    # of the wrong length) instead of raising
    decoded = sum(max(int(meta.row_group(g).total_byte_size), 0) for g in range(meta.num_row_groups))
    if decoded > MAX_DECODED_BYTES:
        raise UserError(f"{source}: its columns decode to {decoded:,} bytes, more than the {MAX_DECODED_BYTES:,} "
                        "such a table may have")
    return wanted


_KINDS = {"time": "a timestamp without time zone", "text": "text", "number": "numbers (floats or integers)",
          "integer": "integers"}


def _is_kind(kind_type, kind: str, pa) -> bool:
    t = pa.types
    if t.is_dictionary(kind_type):
        kind_type = kind_type.value_type
    if kind == "time":
        return t.is_timestamp(kind_type) and kind_type.tz is None
    if kind == "text":
        return t.is_string(kind_type) or t.is_large_string(kind_type)
    if kind == "integer":
        return t.is_integer(kind_type)
    return t.is_floating(kind_type) or t.is_integer(kind_type)


def _frame(table, wanted: Mapping[str, str], source: str):
    """The checked columns as a pandas DataFrame: times as datetime64[ns], text as str, numbers
    as float64, integers as int64; a missing time or text, or an infinite number, refused."""
    try:
        return _columns(table, wanted, source)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - a type pyarrow cannot convert (float16, an integer too large)
        raise UserError(f"{source} cannot be read as a table ({short_reason(exc, 120)}); expected the table its "
                        "command logged") from None


def _columns(table, wanted: Mapping[str, str], source: str):
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    out = {}
    for name, kind in wanted.items():
        column = table.column(name)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if kind in ("time", "text", "integer") and column.null_count:
            raise UserError(f"{source}: column {name} has {column.null_count:,} missing values; expected "
                            f"{_KINDS[kind]} in every row")
        if kind == "time":
            try:
                values = column.cast(pa.timestamp("ns")).to_numpy()
            except (pa.ArrowInvalid, OverflowError) as exc:
                raise UserError(f"{source}: column {name} holds a time outside 1677..2262 ({short_reason(exc, 80)}); "
                                "expected the dates of the data") from None
            out[name] = pd.DatetimeIndex(values).as_unit("ns")
        elif kind == "text":
            longest = pc.max(pc.utf8_length(column)).as_py() if len(column) else 0
            if longest is not None and longest > MAX_TEXT:
                raise UserError(f"{source}: column {name} holds text of {longest:,} characters; expected at most "
                                f"{MAX_TEXT}")
            out[name] = np.asarray(column.to_pylist(), dtype=object)
        elif kind == "integer":
            out[name] = column.cast(pa.int64()).to_numpy()
        else:
            values = column.cast(pa.float64()).to_numpy(zero_copy_only=False)
            if np.isinf(values).any():
                raise UserError(f"{source}: column {name} holds an infinite value; expected finite numbers (NaN for a "
                                "missing one)")
            out[name] = values
    return pd.DataFrame(out)


def read_origins(path: str | os.PathLike, source: str):
    """The scorecard's per-origin table (``evaluation/origins.parquet``): ``datetime``,
    ``instrument`` and each forecaster's ``<name>_mase`` it holds (``finetuned_mase`` required),
    or one UserError line naming ``source``."""
    required = {"datetime": "time", "instrument": "text", "finetuned_mase": "number"}
    optional = {f"{name}_mase": "number" for name in FORECASTERS if name != "finetuned"}
    table, wanted = _parquet(Path(path), source, required, optional)
    return _frame(table, wanted, source)


def read_forecasts(path: str | os.PathLike, source: str):
    """The scorecard's per-step forecasts (``evaluation/forecasts.parquet``): ``datetime``,
    ``instrument``, ``forecaster``, ``step``, ``actual``, the nine deciles and, where it holds them,
    ``q0.05``, ``q0.25``, ``q0.75``, ``q0.95``, ``pit`` and ``p_up``, or one UserError line naming
    ``source``."""
    required = {"datetime": "time", "instrument": "text", "forecaster": "text", "step": "integer",
                "actual": "number", **{q: "number" for q in QUANTILES}}
    table, wanted = _parquet(Path(path), source, required, {c: "number" for c in EXTRA_FORECAST_COLUMNS})
    frame = _frame(table, wanted, source)
    unknown = sorted(set(frame["forecaster"]) - set(FORECASTERS))
    if unknown:
        raise UserError(f"{source}: column forecaster holds '{names.shown(unknown[0])}'; expected one of "
                        f"{', '.join(FORECASTERS)}")
    if len(frame) and not (frame["step"].between(1, MAX_STEP)).all():
        bad = frame["step"][~frame["step"].between(1, MAX_STEP)].iloc[0]
        raise UserError(f"{source}: column step holds {bad}; expected steps from 1 to {MAX_STEP:,}")
    return frame


# ----------------------------------------------------------------------------- numbers


def number(value: Any, source: str, where: str, low: float, high: float) -> float:
    """``value``, a finite JSON number from ``low`` to ``high``, as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise UserError(f"{source}: {where} is '{names.shown(value)}'; expected a number from {low:g} to {high:g}")
    return float(value)


def numbers(value: Any, source: str, where: str, low: float, high: float, longest: int, *,
            ordered: bool = False) -> list[float]:
    """``value``, a list of at most ``longest`` numbers from ``low`` to ``high`` (non-decreasing
    when ``ordered``)."""
    if not isinstance(value, list) or len(value) > longest:
        size = f" of {len(value):,}" if isinstance(value, list) else ""
        raise UserError(f"{source}: {where} is {kind_of(value)}{size}; expected a list of at most {longest:,} numbers")
    out = [number(v, source, f"{where}[{i}]", low, high) for i, v in enumerate(value)]
    if ordered:
        for i in range(1, len(out)):
            if out[i] < out[i - 1]:
                raise UserError(f"{source}: {where}[{i}] is {out[i]:g}, below {where}[{i - 1}] {out[i - 1]:g}; "
                                "expected thresholds in increasing order")
    return out


# ----------------------------------------------------------------------------- a run's params


def scorecard_rule(params: Mapping[str, str], source: str) -> tuple[float, str]:
    """``(verdict_min_change, bootstrap_unit)`` as an evaluation run recorded them (defaults
    0.0 and ``date`` when absent), or one UserError line naming ``source``."""
    text = str(params.get("verdict_min_change") or "").strip()
    try:
        change = float(text) if text else 0.0
    except ValueError:
        change = float("nan")
    if not (math.isfinite(change) and 0.0 <= change < 1.0):
        raise UserError(f"{source}: param verdict_min_change '{names.shown(text)}'; expected a number in [0, 1)")
    unit = str(params.get("bootstrap_unit") or "date").strip()
    if unit not in BOOTSTRAP_UNITS:
        raise UserError(f"{source}: param bootstrap_unit '{names.shown(unit)}'; expected one of "
                        f"{', '.join(BOOTSTRAP_UNITS)}")
    return change, unit


__all__ = ["ARTIFACTS", "FOLDS_JSON", "FORECASTS_PARQUET", "ORIGINS_PARQUET", "download", "number", "numbers",
           "read_forecasts", "read_origins", "scorecard_rule"]
