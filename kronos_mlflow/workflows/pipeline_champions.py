"""The pipeline's champions: with ``--registered-model-name NAME``, the tokenizer step's model
is registered as ``NAME-tokenizer`` and the predictor step's forecaster as ``NAME-predictor``;
each alias ``champion`` moves by the sweep's rule (:func:`kronos_mlflow.workflows.sweep.champion.promotion`)
read on its own verdict against its starting weights: the tokenizer run's ``verdict`` (held-out
token loss), the predictor run's ``verdict_vs_zeroshot`` (the scorecard). ``--promote always``
moves it whatever the verdict. The parent run's tags say where each alias went, or why not.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import UserError
from ..stages import get, names
from .sweep.champion import promotion, register_as_champion


def move_champions(client, parent_id: str, runs: Mapping[str, str], configs: Mapping[str, Mapping], args) -> dict[str, str]:
    """Register and promote each stage's model; returns step -> what happened (tagged on the parent)."""
    from ..tracking.gate import own_model_uri  # lazy: numpy, urllib/http

    done = {}
    for step in names():  # each stage's rule: its name suffix, the verdict that must be better
        spec = get(step)
        suffix, verdict_tag = spec.champion_suffix, spec.pipeline_verdict_tag
        name = f"{args.registered_model_name}{suffix}"
        run = client.get_run(runs[step])
        uri, reason = run.data.tags.get("best_model_uri"), ""
        if uri:  # a tag is a claim: only the run's own model moves the alias
            try:
                uri = own_model_uri(client, run, f"run {run.info.run_id}'s tag best_model_uri")
            except UserError as exc:
                uri, reason = None, str(exc)
        if not uri:
            reason = reason or f"run {run.info.run_id} logged no model"
        else:
            decision = promotion(client, name, run, configs[step], args.promote, verdict_tag=verdict_tag)
            reason = decision.reason
            if decision.move:
                version = register_as_champion(client, name, run.info.run_id, uri)
                client.set_tag(parent_id, f"{step}_champion", f"{name}/{version}")
                done[step] = f"{name}/{version}"
                print(f"[pipeline] champion {name} -> version {version}", flush=True)
                continue
        client.set_tag(parent_id, f"{step}_champion_unchanged", reason)
        done[step] = reason
        print(f"[pipeline] champion {name} unchanged: {reason}", flush=True)
    return done
