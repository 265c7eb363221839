"""The MLflow UI as a user sees it, in a real headless Chromium (slow: about a minute).

A real ``mlflow server`` (sqlite + proxied artifacts in a temp dir) receives two tiny trainings
with different learning rates, run as ``python -m kronos_mlflow.train`` subprocesses. Playwright
then opens the experiment's runs page, the run-comparison page that ``kronos-mlflow compare
--url`` prints, and the best run's reconstruction plot and metric charts, and checks that both
runs show with their learning_rate and best_val_loss. Screenshots are kept in ``test-artifacts/`` (gitignored) and
their paths printed (``pytest -s`` or ``-rP`` shows them); ``ui_run_metrics.png``, the best run's
metric charts, is the picture in the README (docs/images/mlflow-run.png).

Needs Debian's Chromium at /usr/bin/chromium (``apt-get install -y chromium``); skipped, with
that reason, when it is missing. Playwright's own browser download is never used.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from browser import local_browser, needs_chromium
from tiny_runs import isolated_env, train_command

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
EXPERIMENT = "browser-e2e"
LEARNING_RATES = (1e-3, 2e-4)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    needs_chromium,
]


def _train_both(tmp_path: Path, base: str, server_log: Path) -> None:
    """The two trainings, one after the other (one sqlite store behind the server: no write
    contention to make the test flaky), sharing one demo market and data cache (so both runs
    carry the same data digest), each with its own outputs."""
    for lr in LEARNING_RATES:
        work = tmp_path / f"train-{lr:g}"
        work.mkdir()
        cmd = train_command(work, learning_rate=lr, experiment_name=EXPERIMENT, dataset_path=str(tmp_path / "cache"))
        proc = subprocess.run(cmd, cwd=work, env=isolated_env(tmp_path, base), capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=300)
        if proc.returncode != 0:
            pytest.fail(f"training with learning_rate {lr:g} failed (rc {proc.returncode}):\n"
                        f"{(proc.stdout + proc.stderr)[-3000:]}\n--- server log ---\n"
                        f"{server_log.read_text(errors='replace')[-2000:]}")


def _open(context, url: str, wait_text: str, timeout_ms: int = 60_000):
    """A new page per URL (a fragment-only goto can hang); the UI polls, so never networkidle."""
    page = context.new_page()
    page.goto(url, wait_until="domcontentloaded", timeout=timeout_ms)
    try:
        page.get_by_text(wait_text).first.wait_for(timeout=timeout_ms)
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        failed = ARTIFACTS / "ui_failed.png"
        page.screenshot(path=str(failed), full_page=True)
        print(f"screenshot of the page that never showed {wait_text!r}: {failed}", flush=True)
        raise
    page.wait_for_timeout(1500)  # let charts and tables settle
    return page


def _close_assistant(page) -> None:
    """The "MLflow Assistant" side panel opens by default (and its state is remembered across
    pages); close it when it is open, so the screenshots show the page's full width."""
    panel = page.get_by_text("MLflow Assistant")
    if not panel.count():
        return
    close = panel.first.locator("xpath=ancestor::*[.//button][1]").get_by_role("button", name="Close")
    if not close.count() or not close.first.is_visible():
        return  # already closed: only the floating launcher is left
    close.first.click()
    try:
        close.first.wait_for(state="hidden", timeout=5_000)
    except Exception:  # noqa: BLE001 - a later MLflow may differ: keep the panel, the checks do not need it
        return
    page.wait_for_timeout(1000)  # the main area re-flows into the freed width


def _shot(page, path: Path) -> None:
    """Screenshot ``page`` to ``path`` and print where it is (also when a later check fails)."""
    page.screenshot(path=str(path))
    print(f"screenshot: {path}", flush=True)


def _param_row(page, name: str) -> list[str]:
    """Cells of the compare page's Parameters table row ``name`` (run columns, in header order)."""
    row = page.locator("tr").filter(has=page.locator("th", has_text=re.compile(rf"^\s*{re.escape(name)}\s*$")))
    assert row.count() == 1, f"no single '{name}' row in the Parameters table"
    return [t.strip() for t in row.first.locator("td").all_inner_texts()]


def _metric_row(page, name: str) -> list[str]:
    """Values of metric ``name`` on the compare page: its Metrics grid holds the names in one grid
    and the values, row by row and one per run column, in the next."""
    values = page.evaluate(
        """(name) => {
            const links = [...document.querySelectorAll('a[title="Plot chart"]')];
            const link = links.find(a => a.textContent.trim() === name);
            if (!link) return null;
            const namesGrid = link.closest('[role=grid]');
            const names = [...namesGrid.querySelectorAll('a[title="Plot chart"]')].map(a => a.textContent.trim());
            const grids = [...document.querySelectorAll('[role=grid]')];
            const valuesGrid = grids[grids.indexOf(namesGrid) + 1];
            const cells = [...valuesGrid.querySelectorAll('[role=rowgroup] > div')].map(d => d.textContent.trim());
            const n = cells.length / names.length;
            const i = names.indexOf(name);
            return cells.slice(i * n, (i + 1) * n);
        }""",
        name,
    )
    assert values, f"metric '{name}' is not in the compare page's Metrics section"
    return values


def test_runs_and_comparison_pages_show_both_runs(tmp_path, mlflow_server, commands):
    from mlflow import MlflowClient

    base, server_log = mlflow_server.url, mlflow_server.log_path
    client = MlflowClient(base)
    exp_id = client.create_experiment(EXPERIMENT)
    _train_both(tmp_path, base, server_log)

    runs = {r.data.params["learning_rate"]: r for r in client.search_runs([exp_id])}
    assert sorted(map(float, runs)) == sorted(LEARNING_RATES)
    for run in runs.values():
        assert run.info.status == "FINISHED" and "best_val_loss" in run.data.metrics
        assert "val_codebook_usage_s1" in run.data.metrics
        assert run.data.tags["instrument"] == "csi300" and run.data.tags["codebook_bits"] == "4+4"
    assert len({r.data.tags["data_digest"] for r in runs.values()}) == 1  # the same data

    # the address `kronos-mlflow compare --url` prints, best run first
    proc = commands.run([sys.executable, "-m", "kronos_mlflow", "compare", "--experiment", EXPERIMENT,
                         "--tracking-uri", base, "--url"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    compare_url = proc.stdout.strip().splitlines()[-1]  # after the table
    assert compare_url.startswith(f"{base}/#/compare-runs?runs=")
    print(proc.stdout)

    ARTIFACTS.mkdir(exist_ok=True)
    shots = {name: ARTIFACTS / f"ui_{name}.png"
             for name in ("runs", "compare", "compare_tables", "run_plot", "run_metrics")}
    best_run = min(runs.values(), key=lambda r: r.data.metrics["best_val_loss"])
    with local_browser(tmp_path / "chromium-profile", "the UI") as context:
        # 1. the experiment's runs table
        page = _open(context, f"{base}/#/experiments/{exp_id}/runs", runs[str(LEARNING_RATES[0])].info.run_name)
        for run in runs.values():
            assert page.get_by_text(run.info.run_name, exact=True).count() >= 1, run.info.run_name
        _close_assistant(page)
        _shot(page, shots["runs"])

        # 2. the comparison page: learning_rate and best_val_loss of both runs, in run-column order
        page = _open(context, compare_url, "Comparing 2 Runs")
        assert page.title().startswith("Compare Runs")
        _close_assistant(page)
        _shot(page, shots["compare"])
        header = [t.strip() for t in page.locator("thead tr").first.locator("th a").all_inner_texts()]
        assert sorted(header) == sorted(r.info.run_id for r in runs.values())
        by_id = {r.info.run_id: r for r in runs.values()}
        assert header[0] == best_run.info.run_id  # compare --url lists the best run first
        shown_lr = _param_row(page, "learning_rate")
        assert shown_lr == [by_id[i].data.params["learning_rate"] for i in header]
        assert sorted(float(v) for v in shown_lr) == sorted(LEARNING_RATES)
        shown_best = _metric_row(page, "best_val_loss")
        for value, run_id in zip(shown_best, header, strict=True):
            actual = by_id[run_id].data.metrics["best_val_loss"]
            # the UI rounds (3 decimals below 10)
            assert abs(float(value) - actual) <= max(5e-4, 1e-3 * abs(actual)), (value, actual)
        diff_only = page.get_by_role("switch", name="Parameters - Show diff only")
        if diff_only.count():
            diff_only.first.click()
            page.wait_for_timeout(500)
        page.set_viewport_size({"width": 1400, "height": 1600})
        page.get_by_text("Run details").first.scroll_into_view_if_needed()
        page.wait_for_timeout(800)
        _shot(page, shots["compare_tables"])

        # 3. the best run's reconstruction plot, as the artifact viewer shows it
        rid = best_run.info.run_id
        page = _open(context, f"{base}/#/experiments/{exp_id}/runs/{rid}/artifacts/plots/reconstruction.png",
                     "reconstruction.png")
        page.locator("img[src^='blob:']:visible").first.wait_for(timeout=30_000)
        page.wait_for_timeout(1000)
        _shot(page, shots["run_plot"])

        # 4. the best run's metric charts, in the UI's "Model training" view (the README's picture)
        # (charts are sorted by name and the held-out verdict's base_test_* come first: the search
        # box narrows them to the training curves)
        page = _open(context, f"{base}/#/experiments/{exp_id}/runs/{rid}/model-metrics?workflowType=machine_learning",
                     "Auto-refresh")
        _close_assistant(page)
        page.get_by_placeholder("Search metric charts").fill("train_")
        page.get_by_text("train_tokenizer_loss_batch").first.wait_for(timeout=60_000)
        assert page.get_by_text("base_test_mse_amt").count() == 0
        page.set_viewport_size({"width": 1400, "height": 1000})
        page.wait_for_timeout(800)
        _shot(page, shots["run_metrics"])

    # the plots also came back through the server's artifact proxy
    local = client.download_artifacts(best_run.info.run_id, "plots", str(tmp_path / "dl"))
    assert sorted(os.listdir(local)) == ["reconstruction.png", "token_usage.png"]
    for name in ("reconstruction.png", "token_usage.png"):
        target = ARTIFACTS / f"ui_best_run_{name}"
        target.write_bytes(Path(local, name).read_bytes())
        shots[f"best_run_{name}"] = target
        print(f"plot artifact: {target}")
    for path in shots.values():
        assert path.stat().st_size > 10_000, path
    (ARTIFACTS / "ui_browser.json").write_text(json.dumps(
        {"compare_url": compare_url, "runs": {k: v.info.run_id for k, v in runs.items()},
         "screenshots": {k: str(v) for k, v in shots.items()}}, indent=2))
