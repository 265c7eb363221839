"""Files and names handed over by another run, a colleague or a cache: each read through one reader
(:mod:`kronos_mlflow.tracking.handover`, :mod:`kronos_mlflow.config.names`) that returns a checked value or
refuses in one :class:`UserError` line naming the file, never another exception.

- each reader's refusals, one kind of damage at a time, and the good files read back;
- Hypothesis: any bytes, any JSON and any table given to each reader parse or are refused in one
  line; the names functions on any text never accept a separator, ``..`` or non-ASCII digits;
- ``walk-forward --aggregate`` of a parent (a real sqlite store) whose ``folds.json`` names folds
  by paths is refused before a fold's file is downloaded, and writes nothing outside its scratch
  directory; damaged ``origins.parquet`` / ``forecasts.parquet`` of a fold are refused;
- ``auto`` weights never follow a Hugging Face cache whose ref leaves ``snapshots/``;
- ``evaluate`` and ``evaluate-tokenizer`` never take a place to write from the run they score.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import handover_runs as hr
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_runs import forget_published

from kronos_mlflow.tracking import handover
from kronos_mlflow.config import names, published
from kronos_mlflow.errors import UserError
from kronos_mlflow.workflows.walkforward import folds as fl

QUICK = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                          HealthCheck.too_slow])


def _one_line(exc: BaseException, *needles: str) -> str:
    text = str(exc)
    assert isinstance(exc, UserError) and text and "\n" not in text, repr(exc)
    for needle in needles:
        assert needle in text, (needle, text)
    return text


# ----------------------------------------------------------------------------- folds.json


def _folds_file(tmp_path: Path, content) -> Path:
    path = tmp_path / "folds.json"
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return path


def _damaged(edit) -> dict:
    table = hr.folds_table()
    edit(table)
    return table


FOLDS_DAMAGE = {
    "not-json": (b"{\"settings\": ", "not JSON"),
    "not-utf8": (b"{\"settings\": \"\xe9\"}", "UTF-8"),
    "a-list": ([1, 2], "is a list"),
    "extra-key": (_damaged(lambda t: t.update(extra=1)), "unknown key 'extra'"),
    "missing-key": (_damaged(lambda t: t.pop("settings")), "lacks settings"),
    "fold-extra-key": (_damaged(lambda t: t["folds"][0].update(path="/etc")), "unknown key 'path'"),
    "fold-missing-key": (_damaged(lambda t: t["folds"][0].pop("ranges")), "lacks ranges"),
    "fold-abs-path": (_damaged(lambda t: t["folds"][0].update(fold="/home/someone/out")), "'/home/someone/out'"),
    "fold-dotdot": (_damaged(lambda t: t["folds"][0].update(fold="../../x")), "'../../x'"),
    "fold-bool": (_damaged(lambda t: t["folds"][0].update(fold=True)), "fold 'True'"),
    "fold-float": (_damaged(lambda t: t["folds"][0].update(fold=1.0)), "fold '1.0'"),
    "fold-arabic-digit": (_damaged(lambda t: t["folds"][0].update(fold="\u0661")), "is not a fold number"),
    "fold-zero": (_damaged(lambda t: t["folds"][0].update(fold=0)), "fold '0'"),
    "fold-order": (_damaged(lambda t: t["folds"][0].update(fold=2)), "fold 1 here"),
    "folds-not-list": (_damaged(lambda t: t.update(folds="all")), "folds is text"),
    "folds-count": (_damaged(lambda t: t["settings"].update(folds=2)), "settings.folds says 2"),
    "settings-type": (_damaged(lambda t: t["settings"].update(folds="1")), "settings.folds"),
    "settings-mode": (_damaged(lambda t: t["settings"].update(mode="sideways")), "sideways"),
    "settings-mode-number": (_damaged(lambda t: t["settings"].update(mode=5)), "settings.mode is an integer '5'"),
    "settings-embargo": (_damaged(lambda t: t["settings"].update(embargo=-1)), "settings.embargo is '-1'"),
    "date": (_damaged(lambda t: t["folds"][0].update(test=["2020-09-15", "2020-02-30"])), "2020-02-30"),
    "date-path": (_damaged(lambda t: t["folds"][0]["ranges"].update(test_time_range=["../x", "2020-01-01"])), "'../x'"),
    "date-order": (_damaged(lambda t: t["folds"][0].update(val=["2020-08-31", "2020-07-01"])), "back to"),
    "bars-negative": (_damaged(lambda t: t["folds"][0].update(test_bars=-1)), "test_bars"),
    "ranges-extra": (_damaged(lambda t: t["folds"][0]["ranges"].update(dataset_path=["a", "b"])), "dataset_path"),
    "huge-int": (b'{"settings": ' + b"9" * 5000 + b"}", "not JSON this reader accepts"),
    "deep": (b"[" * 100_000 + b"]" * 100_000, "folds.json"),
}


@pytest.mark.parametrize("kind", FOLDS_DAMAGE, ids=list(FOLDS_DAMAGE))
def test_a_damaged_folds_json_is_one_line_naming_it(tmp_path, kind):
    content, needle = FOLDS_DAMAGE[kind]
    with pytest.raises(UserError) as caught:
        fl.read_folds_json(_folds_file(tmp_path, content), "parent X's walkforward/folds.json")
    _one_line(caught.value, "walkforward/folds.json", needle)


def test_the_folds_json_a_walk_forward_logs_reads_back_with_its_digest(tmp_path):
    from kronos_mlflow.workflows.walkforward import folds as fl

    settings_, folds = fl.read_folds_json(_folds_file(tmp_path, hr.folds_table()), "folds.json")
    assert settings_ == hr.SETTINGS and folds == [hr.FOLD]
    assert fl.plan_digest(folds, settings_) == fl.plan_digest([hr.FOLD], hr.SETTINGS)


def test_a_folds_json_that_is_missing_a_folder_or_too_large_is_one_line(tmp_path):
    for path, needle in ((tmp_path / "none.json", "is missing"), (tmp_path, "not a regular file")):
        with pytest.raises(UserError) as caught:
            fl.read_folds_json(path, "walkforward/folds.json")
        _one_line(caught.value, "walkforward/folds.json", needle)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (handover.MAX_JSON_BYTES + 1))
    with pytest.raises(UserError) as caught:
        fl.read_folds_json(big, "walkforward/folds.json")
    _one_line(caught.value, "walkforward/folds.json", "bytes")


def test_every_json_reader_reads_through_the_one_bounded_reader(tmp_path):
    """A FIFO (a read would wait for a writer), a directory and an oversized file given to each
    JSON reader (a handed-over file, a config or state file, a spool) are one line each, the
    FIFO without blocking; good bytes read back alike."""
    from kronos_mlflow.errors import CheckpointError
    from kronos_mlflow.runtime import fsutil
    from kronos_mlflow.tracking import spool

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:  # sparse: larger than any of the readers' bounds (the spool's is 1 GiB), refused unread
        fh.truncate((1 << 30) + 1)
    readers = {
        "handover": lambda p: handover.json_value(p, "walkforward/folds.json", "a fold table"),
        "config": lambda p: fsutil.read_json(p, what="config file", max_bytes=handover.MAX_JSON_BYTES,
                                             advice="expected a JSON object", error=CheckpointError),
        "spool": lambda p: spool.read_spool(p),
    }
    for name, read in readers.items():
        for path, needle in ((fifo, "not a regular file"), (tmp_path, "directory" if name == "spool" else
                                                              "not a regular file"), (big, "bytes")):
            with pytest.raises(UserError) as caught:
                read(path)
            _one_line(caught.value, needle)
    good = tmp_path / "good.json"
    good.write_text('{"a": [1, 2.5, "x"]}')
    assert handover.json_value(good, "s", "e") == fsutil.load_json(good, 100) == {"a": [1, 2.5, "x"]}
    with pytest.raises(fsutil.JsonFileError) as caught:
        fsutil.load_json(good, 10)
    assert caught.value.kind == "too-large"


# ----------------------------------------------------------------------------- the parquet tables


def _parquet(tmp_path: Path, frame, name: str = "t.parquet") -> Path:
    path = tmp_path / name
    if isinstance(frame, bytes):
        path.write_bytes(frame)
    elif isinstance(frame, pa.Table):
        pq.write_table(frame, path)
    else:
        frame.to_parquet(path, index=False)
    return path


ORIGINS, FORECASTS = hr.tables()
TZ = ORIGINS.assign(datetime=pd.DatetimeIndex(ORIGINS["datetime"]).tz_localize("UTC"))
TABLE_DAMAGE = {
    "origins": {
        "not-parquet": (b"datetime,instrument\n2020-01-01,S0\n", "not a Parquet file"),
        "magic-only": (b"PAR1\x00\x00\x00\x00PAR1", "Parquet"),
        "lacks-mase": (ORIGINS.drop(columns="finetuned_mase"), "lacks the column finetuned_mase"),
        "lacks-datetime": (ORIGINS.drop(columns="datetime"), "lacks the column datetime"),
        "mase-text": (ORIGINS.assign(finetuned_mase="1.0"), "column finetuned_mase is of type"),
        "datetime-text": (ORIGINS.assign(datetime="2020-01-01"), "column datetime is of type"),
        "datetime-zone": (TZ, "timestamp without time zone"),
        "instrument-number": (ORIGINS.assign(instrument=1), "column instrument is of type"),
        "instrument-missing": (ORIGINS.assign(instrument=[None, "S1"] * 3), "missing values"),
        "instrument-long": (ORIGINS.assign(instrument="x" * 500), "500 characters"),
        "mase-infinite": (ORIGINS.assign(persistence_mase=np.inf), "infinite"),
        "base-mase-text": (ORIGINS.assign(zeroshot_mase="x"), "column zeroshot_mase"),
        "datetime-year-3000": (ORIGINS.assign(datetime=np.full(len(ORIGINS), "3000-01-01", dtype="datetime64[s]")),
                               "holds a time outside 1677..2262"),
        "datetime-missing": (ORIGINS.assign(datetime=[pd.NaT] + list(ORIGINS["datetime"][1:])), "missing values"),
        "columns-twice": (pa.table([pa.array([1.0]), pa.array([2.0]), pa.array(["a"]),
                                    pa.array([0], pa.timestamp("s"))],
                                   names=["finetuned_mase", "finetuned_mase", "instrument", "datetime"]), "twice"),
    },
    "forecasts": {
        "not-parquet": (b"\x00" * 64, "not a Parquet file"),
        "lacks-quantile": (FORECASTS.drop(columns="q0.5"), "lacks the column q0.5"),
        "step-float": (FORECASTS.assign(step=1.5), "column step is of type"),
        "step-zero": (FORECASTS.assign(step=0), "column step holds 0"),
        "forecaster-path": (FORECASTS.assign(forecaster="../datetime"), "'../datetime'"),
        "forecaster-key": (FORECASTS.assign(forecaster="instrument"), "'instrument'"),
        "actual-text": (FORECASTS.assign(actual="x"), "column actual"),
        "quantile-infinite": (FORECASTS.assign(**{"q0.9": -np.inf}), "infinite"),
    },
}
READERS = {"origins": handover.read_origins, "forecasts": handover.read_forecasts}


@pytest.mark.parametrize(("table", "kind"), [(t, k) for t, kinds in TABLE_DAMAGE.items() for k in kinds],
                         ids=[f"{t}-{k}" for t, kinds in TABLE_DAMAGE.items() for k in kinds])
def test_a_damaged_table_is_one_line_naming_it(tmp_path, table, kind):
    frame, needle = TABLE_DAMAGE[table][kind]
    source = f"run X's evaluation/{table}.parquet"
    with pytest.raises(UserError) as caught:
        READERS[table](_parquet(tmp_path, frame), source)
    _one_line(caught.value, f"evaluation/{table}.parquet", needle)


def test_the_tables_a_scorecard_writes_read_back(tmp_path):
    origins = handover.read_origins(_parquet(tmp_path, ORIGINS, "o.parquet"), "origins.parquet")
    assert list(origins.columns) == ["datetime", "instrument", "finetuned_mase", "persistence_mase"]
    assert origins["datetime"].dtype == "datetime64[ns]" and origins["finetuned_mase"].dtype == np.float64
    np.testing.assert_allclose(origins["finetuned_mase"], ORIGINS["finetuned_mase"])
    assert list(origins["instrument"]) == list(ORIGINS["instrument"])
    forecasts = handover.read_forecasts(_parquet(tmp_path, FORECASTS, "f.parquet"), "forecasts.parquet")
    assert list(forecasts.columns) == ["datetime", "instrument", "forecaster", "step", "actual", *handover.QUANTILES]
    assert forecasts["step"].dtype == np.int64 and set(forecasts["forecaster"]) == {"finetuned", "persistence"}
    # what the aggregation computes from them is what it computes from the frames a scorecard holds
    from kronos_mlflow.workflows.walkforward.aggregate import origin_wql

    pd.testing.assert_frame_equal(origin_wql(forecasts), origin_wql(FORECASTS.assign(
        datetime=pd.DatetimeIndex(FORECASTS["datetime"]).as_unit("ns"))), check_dtype=False)


def test_a_missing_scorecard_rule_param_is_the_default_and_a_bad_one_is_refused():
    assert handover.scorecard_rule({}, "run X") == (0.0, "date")
    assert handover.scorecard_rule({"verdict_min_change": "0.01", "bootstrap_unit": "origin"}, "run X") == (0.01,
                                                                                                          "origin")
    for params, needle in (({"verdict_min_change": "abc"}, "verdict_min_change"),
                           ({"verdict_min_change": "nan"}, "verdict_min_change"),
                           ({"bootstrap_unit": "../x"}, "bootstrap_unit")):
        with pytest.raises(UserError) as caught:
            handover.scorecard_rule(params, "run X")
        _one_line(caught.value, "run X", needle)


# ----------------------------------------------------------------------------- Hypothesis

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=20)
FIELD_VALUES = st.one_of(st.integers(-3, 200), st.booleans(), st.none(), st.text(max_size=12),
                         st.sampled_from(["2020-01-01", "2020-12-31", "../x", "/etc", "\u0661", "1", "3M", "rolling"]),
                         st.lists(st.sampled_from(["2020-01-01", "2021-01-01", "x"]), max_size=3))


@st.composite
def fold_tables(draw):
    """The good table with a few of its fields replaced (or dropped, or added): reaches every check."""
    table = hr.folds_table()
    parts = [table["settings"], table["folds"][0], table["folds"][0]["ranges"], table]  # before any is replaced
    for _ in range(draw(st.integers(0, 3))):
        target = draw(st.sampled_from(parts))
        key = draw(st.sampled_from(sorted(target) + ["extra"]))
        if draw(st.booleans()) or key == "extra":
            target[key] = draw(FIELD_VALUES)
        else:
            target.pop(key, None)
    return table


def _reads_or_refuses(read, path: Path, source: str):
    try:
        return read(path, source)
    except UserError as exc:
        _one_line(exc, source)
        return None


@QUICK
@given(st.one_of(st.binary(max_size=300), JSON.map(lambda v: json.dumps(v).encode()), fold_tables().map(
    lambda t: json.dumps(t).encode())))
def test_any_content_given_as_folds_json_is_a_plan_or_one_line(tmp_path, content):
    from kronos_mlflow.workflows.walkforward import folds as fl

    got = _reads_or_refuses(fl.read_folds_json, _folds_file(tmp_path, content), "walkforward/folds.json")
    if got is not None:
        settings_, folds = got
        assert isinstance(settings_, fl.Settings) and len(folds) == settings_.folds
        assert [f.fold for f in folds] == list(range(1, len(folds) + 1))
        fl.plan_digest(folds, settings_)  # what --aggregate computes next


ARROW_TYPES = [pa.float64(), pa.float32(), pa.int64(), pa.int8(), pa.uint64(), pa.string(), pa.bool_(),
               pa.timestamp("ns"), pa.timestamp("s"), pa.timestamp("us", tz="UTC"), pa.date32(),
               pa.dictionary(pa.int32(), pa.string()), pa.list_(pa.float64())]
_NUMBERS = [pa.float64(), pa.float32(), pa.int64()]
_TEXT = [pa.string(), pa.dictionary(pa.int32(), pa.string())]
_RIGHT = {"datetime": [pa.timestamp("ns"), pa.timestamp("s")], "instrument": _TEXT, "forecaster": _TEXT,
          "step": [pa.int64(), pa.int8(), pa.uint64()]}
COLUMN_NAMES = ["datetime", "instrument", "finetuned_mase", "zeroshot_mase", "persistence_mase", "forecaster", "step",
                "actual", *handover.QUANTILES, "mean", "other"]


def _values(kind: pa.DataType, draw, n: int) -> pa.Array:
    """``n`` values of ``kind``: nulls, edge values and what the readers expect, mixed."""
    def some(strategy):
        return draw(st.lists(strategy, min_size=n, max_size=n))

    texts = st.one_of(st.sampled_from(["finetuned", "persistence", "seasonal_naive", "S0", "datetime", "../x",
                                       "x" * 200]), st.none(), st.text(max_size=5))
    if pa.types.is_dictionary(kind):
        return pa.array(some(texts)).cast(pa.string()).dictionary_encode()
    if pa.types.is_list(kind):
        return pa.array([[1.0]] * n, kind)
    if pa.types.is_date(kind):
        return pa.array(some(st.one_of(st.none(), st.integers(0, 50_000))), pa.int32()).cast(kind)
    if pa.types.is_timestamp(kind):
        seconds = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[kind.unit]
        far = [st.just(3 * 10**11 * seconds)] if kind.unit != "ns" else []  # beyond 2262: no nanosecond time
        moments = st.one_of(st.none(), st.integers(0, 2**33).map(lambda v: v * seconds), *far)
        return pa.array(some(moments), pa.int64()).cast(kind)
    if pa.types.is_string(kind):
        return pa.array(some(texts), kind)
    if pa.types.is_boolean(kind):
        return pa.array(some(st.booleans()), kind)
    if pa.types.is_integer(kind):
        low, high = (0, 2**64 - 1) if kind == pa.uint64() else (-(2**(kind.bit_width - 1)), 2**(kind.bit_width - 1) - 1)
        return pa.array(some(st.one_of(st.none(), st.integers(low, high), st.integers(0, 12))), kind)
    return pa.array(some(st.one_of(st.none(), st.floats(width=kind.bit_width))), kind)


@st.composite
def tables(draw):
    n = draw(st.integers(0, 4))
    columns = draw(st.lists(st.sampled_from(COLUMN_NAMES), min_size=1, max_size=8, unique=True))
    if draw(st.booleans()):  # most of what a reader needs, so that the search reaches the value checks
        columns = list(dict.fromkeys(["datetime", "instrument", "finetuned_mase", "forecaster", "step", "actual",
                                      *handover.QUANTILES, *columns]))
    kinds = {c: draw(st.sampled_from(ARROW_TYPES if draw(st.integers(0, 9)) == 0 else _RIGHT.get(c, _NUMBERS)))
             for c in columns}  # mostly the type the column should have: the search reaches the values
    return pa.table([_values(kinds[c], draw, n) for c in columns], names=columns)


@QUICK
@given(st.one_of(tables(), st.binary(max_size=200)), st.sampled_from(sorted(READERS)))
def test_any_table_or_bytes_given_to_a_table_reader_is_a_frame_or_one_line(tmp_path, content, which):
    _frame_or_one_line(tmp_path, content, which)


def _frame_or_one_line(tmp_path: Path, content, which: str) -> None:
    source = f"evaluation/{which}.parquet"
    frame = _reads_or_refuses(READERS[which], _parquet(tmp_path, content), source)
    if frame is not None:
        assert frame["datetime"].dtype == "datetime64[ns]" and not frame["datetime"].isna().any()
        assert all(isinstance(v, str) for v in frame["instrument"])
        numbers = [c for c in frame.columns if c.endswith("_mase") or c in ("actual", *handover.QUANTILES)]
        for column in numbers:
            assert frame[column].dtype == np.float64 and not np.isinf(frame[column]).any()
        if which == "forecasts":
            assert set(frame["forecaster"]) <= set(handover.FORECASTERS) and frame["step"].between(1, 10_000).all()


@QUICK
@given(st.sampled_from(sorted(READERS)), st.lists(st.tuples(st.integers(0, 10**5), st.integers(0, 255)), min_size=1,
                                                  max_size=4))
def test_a_good_table_with_a_few_bytes_changed_is_a_frame_or_one_line(tmp_path, which, changes):
    """Bytes changed in a scorecard's own file reach pyarrow's decoders (footer, pages, strings),
    which random bytes never do: each such file still reads, or is refused in one line."""
    data = bytearray(_parquet(tmp_path, ORIGINS if which == "origins" else FORECASTS).read_bytes())
    for position, value in changes:
        data[position % len(data)] = value
    _frame_or_one_line(tmp_path, bytes(data), which)


@QUICK
@given(st.text(max_size=40) | st.sampled_from(["..", ".", "a/b", "a\\b", "\u0663", "12\u0663", "/etc", "..\\x",
                                               "0" * 32, "f" * 32, "F" * 32, " 1", "1 ", "+1", "1_0"]))
def test_names_never_accept_a_separator_dotdot_or_other_digits(text):
    for call in (lambda: names.plain_name(text, "t"), lambda: names.fold_number(text, "t"),
                 lambda: names.run_id(text, "t")):
        try:
            value = call()
        except names.BadName as exc:
            _one_line(exc, "t")
            continue
        shown = str(value)
        assert "/" not in shown and "\\" not in shown and shown not in (".", "..") and ".." not in shown.split("/")
        assert shown.isascii() and "\x00" not in shown
    if any(ch.isdigit() and not ch.isascii() for ch in text):
        with pytest.raises(names.BadName):
            names.fold_number(text, "t")
    if not names.ascii_digits(text):
        with pytest.raises(names.BadName):
            names.fold_number(text, "t")


# ----------------------------------------------------------------------------- walk-forward --aggregate


@pytest.fixture()
def store(tmp_path, monkeypatch):
    """A real sqlite store with an experiment whose artifacts live in ``tmp_path/artifacts``; the
    process's temporary directory moved to ``tmp_path/scratch`` (the command's scratch lives there)."""
    from mlflow import MlflowClient
    from tiny_runs import create_sqlite_store

    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    client = MlflowClient(create_sqlite_store(tmp_path))  # first: its template is made in the usual temp dir
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    experiment = client.create_experiment("handover", artifact_location=(tmp_path / "artifacts").as_uri())
    return client, experiment, scratch


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): (p.read_bytes().hex()[:64] if p.is_file() else "dir")
            for p in sorted(root.rglob("*")) if "mlflow.db" not in p.name}


def test_aggregate_refuses_path_like_fold_numbers_before_any_fold_download(tmp_path, store):
    """A colleague's parent whose folds.json numbers its folds by paths (an absolute folder of
    the user's, ``../``): one line naming the value, no file written anywhere but the scratch
    directory (which is gone afterwards), the victim's files untouched."""
    from kronos_mlflow.workflows.walkforward import command as wf

    client, experiment, scratch = store
    victim = tmp_path / "victim"
    (victim / "evaluation").mkdir(parents=True)
    (victim / "evaluation" / "origins.parquet").write_text("the user's own file\n")
    for bad in (str(victim), "../outside", "../../" + victim.name):
        table = hr.folds_table()
        table["folds"][0]["fold"] = bad
        ids = hr.log_walkforward(client, experiment, tmp_path / "staging", name=f"h{abs(hash(bad)) % 1000}",
                                 folds_json=table)
        before = _tree(tmp_path)
        with pytest.raises(UserError) as caught:
            wf.aggregate_parent(client, ids["parent"], None)
        _one_line(caught.value, "walkforward/folds.json", f"'{names.shown(bad)}'")
        assert _tree(tmp_path) == before
        assert list(scratch.iterdir()) == []
        assert (victim / "evaluation" / "origins.parquet").read_text() == "the user's own file\n"


def test_aggregate_reads_good_files_and_refuses_damaged_ones_in_one_line(tmp_path, store):
    from kronos_mlflow.workflows.walkforward import command as wf

    client, experiment, scratch = store
    good = hr.log_walkforward(client, experiment, tmp_path / "staging", name="good")
    summary = wf.aggregate(client, good["parent"], [hr.FOLD], {1: good["evaluation"]})
    assert summary["metrics"]["pooled_origins"] == len(hr.tables()[0])
    for name, damage, needle in (("json", {"folds_json": b"\x00not json"}, "walkforward/folds.json"),
                                 ("origins", {"origins": b"PAR1 not parquet PAR1"}, "evaluation/origins.parquet"),
                                 ("forecasts", {"forecasts": hr.tables()[1].drop(columns="actual")},
                                  "evaluation/forecasts.parquet")):
        ids = hr.log_walkforward(client, experiment, tmp_path / "staging", name=name, **damage)
        with pytest.raises(UserError) as caught:
            wf.aggregate_parent(client, ids["parent"], None)
        _one_line(caught.value, needle)
        assert not client.get_run(ids["parent"]).data.metrics  # nothing pooled from a damaged fold
    assert list(scratch.iterdir()) == []


def test_a_fold_run_id_tag_that_is_not_a_run_id_is_one_line(tmp_path, store):
    from kronos_mlflow.workflows.walkforward import command as wf

    client, experiment, _ = store
    ids = hr.log_walkforward(client, experiment, tmp_path / "staging", name="tag")
    client.set_tag(ids["parent"], "walkforward.fold1_run_id", "../../etc")
    with pytest.raises(UserError) as caught:
        wf.aggregate_parent(client, ids["parent"], None)
    _one_line(caught.value, "walkforward.fold1_run_id", "'../../etc'")


def test_a_download_stays_in_a_folder_of_its_own_under_the_scratch(tmp_path, store):
    client, experiment, scratch = store
    ids = hr.log_walkforward(client, experiment, tmp_path / "staging", name="dl")
    local = handover.download(client, ids["parent"], handover.FOLDS_JSON, scratch, "parent")
    assert scratch in local.parents and local.parent.parent == scratch and local.name == "folds.json"
    with pytest.raises(UserError) as caught:
        handover.download(client, ids["fold"], handover.FOLDS_JSON, scratch, "fold run")
    _one_line(caught.value, "fold run", "walkforward/folds.json")
    with pytest.raises(names.BadName):
        handover.download(client, "../" + ids["parent"], handover.FOLDS_JSON, scratch, "parent")
    with pytest.raises(ValueError):
        handover.download(client, ids["parent"], "../../etc/passwd", scratch, "parent")


# ----------------------------------------------------------------------------- the Hugging Face cache


@pytest.fixture()
def hf_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    path = tmp_path / "hf-cache"
    path.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(path))
    forget_published()
    yield path
    forget_published()


def _published_cache(cache: Path) -> tuple[Path, Path]:
    """A "published" tokenizer in ``cache`` (tests/hf_cache.py): its repo folder and snapshot."""
    import torch
    from hf_cache import write_published
    from tiny_runs import TINY

    from kronos_mlflow.config.core import load_config, model_kwargs
    from kronos_mlflow.model import KronosTokenizer

    sizes = ("d_model", "n_heads", "ff_dim", "n_enc_layers", "n_dec_layers", "s1_bits", "s2_bits")
    torch.manual_seed(5)
    model = KronosTokenizer(**model_kwargs(load_config({k: TINY[k] for k in sizes})))
    hub_id = published.PUBLISHED["pretrained_tokenizer_path"]
    snapshot = write_published(cache, hub_id, model)
    forget_published()
    return snapshot.parent.parent, snapshot


def test_auto_refuses_a_cache_whose_ref_leaves_snapshots(tmp_path, hf_cache):
    """refs/main naming a folder outside snapshots/ (which holds a complete checkpoint): ``auto``
    refuses in one line naming the cache and the ref, never "found the published checkpoint"."""
    repo, snapshot = _published_cache(hf_cache)
    key = "pretrained_tokenizer_path"
    assert published.decide(key)[0]  # the cache as written is found
    outside = tmp_path / "elsewhere" / "ckpt"
    outside.parent.mkdir()
    os.rename(snapshot, outside)
    for ref in (os.path.relpath(outside, repo / "snapshots"), str(outside), "../../../../" + outside.name):
        (repo / "refs" / "main").write_text(ref)
        forget_published()
        with pytest.raises(UserError) as caught:
            published.decide(key)
        _one_line(caught.value, str(repo), "refs/main")
    # a snapshot folder that is a link out of snapshots/: refused as well, on the real path
    (repo / "refs" / "main").write_text(snapshot.name)
    snapshot.symlink_to(outside, target_is_directory=True)
    forget_published()
    with pytest.raises(UserError) as caught:
        published.decide(key)
    _one_line(caught.value, str(repo), "snapshot", "outside")
    # the loader refuses it too, for a hub id given by hand
    from kronos_mlflow.errors import CheckpointError
    from kronos_mlflow.model import KronosTokenizer

    with pytest.raises(CheckpointError) as caught:
        KronosTokenizer.from_pretrained(published.PUBLISHED[key])
    _one_line(caught.value, str(repo))
    # put back: found again
    snapshot.unlink()
    os.rename(outside, snapshot)
    forget_published()
    assert published.decide(key)[0] == published.PUBLISHED[key]


def test_auto_refuses_a_weights_file_linked_out_of_the_cache(tmp_path, hf_cache):
    repo, snapshot = _published_cache(hf_cache)
    stolen = tmp_path / "someone-elses.safetensors"
    os.rename(snapshot / "model.safetensors", stolen)
    (snapshot / "model.safetensors").symlink_to(stolen)
    with pytest.raises(UserError) as caught:
        published.decide("pretrained_tokenizer_path")
    _one_line(caught.value, str(repo), "model.safetensors")


# ----------------------------------------------------------------------------- inherited settings


def test_scoring_commands_never_inherit_a_place_to_write(tmp_path, monkeypatch):
    """``evaluate --model runs:/<id>`` and ``evaluate-tokenizer runs:/<id>`` take the data and the
    windows the run recorded, never where it wrote: its dataset_path, save_path and folders stay
    the command's own."""
    from mlflow import MlflowClient
    from tiny_runs import create_sqlite_store

    from kronos_mlflow.cli import evaluate
    from kronos_mlflow.config.core import DEFAULTS, load_config
    from kronos_mlflow.evaluation.sources import recorded_settings
    from kronos_mlflow.config.keys import PLACES_TO_WRITE
    from kronos_mlflow.stages.tokenizer import command as tok

    for keys in (evaluate.INHERITED_KEYS, tok.INHERITED_KEYS):
        assert not set(keys) & set(PLACES_TO_WRITE)
    uri = create_sqlite_store(tmp_path)
    client = MlflowClient(uri)
    run = client.create_run("0").info.run_id
    elsewhere = str(tmp_path / "not-yours")
    recorded = {"dataset_path": elsewhere, "save_path": elsewhere, "comet_offline_directory": elsewhere,
                "tokenizer_save_folder_name": "x", "predictor_save_folder_name": "y", "lookback_window": "30",
                "instrument": "mine"}
    for key, value in recorded.items():
        client.log_param(run, key, value)
    client.set_terminated(run)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    everything = (*evaluate.INHERITED_KEYS, *PLACES_TO_WRITE)  # even a caller asking for them gets none
    got, by = recorded_settings(f"runs:/{run}/best_model", everything, "--model")
    assert by == run and got == {"lookback_window": "30", "instrument": "mine"}
    config = load_config({}, beneath=got)
    assert config["dataset_path"] == DEFAULTS["dataset_path"] and config["save_path"] == DEFAULTS["save_path"]
    assert config["lookback_window"] == 30


def test_a_sweep_champion_never_follows_a_run_id_from_the_study_that_is_not_one():
    """The best trial's ``mlflow_run_id`` comes from the study's storage (a file or database a
    colleague may share): a value that is not a run id moves no alias and reads no run."""
    from types import SimpleNamespace

    from kronos_mlflow.workflows.sweep.champion import set_champion

    for value in ("../x", "runs:/" + "a" * 32, 12, "A" * 32):
        study = SimpleNamespace(best_trial=SimpleNamespace(number=3, user_attrs={"mlflow_run_id": value}))
        version, why = set_champion(None, study, "kronos", config={})  # no client: nothing may be read
        assert version is None and "best trial 3" in why and "not an MLflow run id" in why
