"""A tokenizer named the way users name one: a checkpoint directory, ``runs:/<id>/best_model``,
``models:/NAME@ALIAS`` (or ``models:/NAME/VERSION``, ``models:/m-<id>``), or a Hugging Face hub
id. Every failure is one :class:`~kronos_mlflow.errors.UserError` line naming the input."""

from __future__ import annotations

from ..errors import UserError, short_reason

MLFLOW_SCHEMES = ("runs:/", "models:/")
ACCEPTED = ("a checkpoint directory (config.json + model.safetensors), runs:/<run id>/best_model, "
            "models:/NAME@ALIAS or a Hugging Face hub id")


def is_mlflow_uri(spec: str) -> bool:
    return str(spec).startswith(MLFLOW_SCHEMES)


def load_tokenizer(spec: str, device="cpu", *, tracking_uri: str | None = None, what: str = "MODEL"):
    """The ``KronosTokenizer`` that ``spec`` names, on ``device``, in eval mode."""
    spec = str(spec or "").strip()
    if not spec:
        raise UserError(f"{what} is empty; expected {ACCEPTED}")
    if is_mlflow_uri(spec):
        return _from_mlflow(spec, device, tracking_uri, what)
    from ..model import KronosTokenizer

    try:
        return KronosTokenizer.from_pretrained(spec, map_location=device).eval()
    except UserError as exc:  # which argument it was, then the checkpoint's own line
        raise UserError(f"{what}: {exc}") from None


def _from_mlflow(spec: str, device, tracking_uri: str | None, what: str):
    from mlflow.exceptions import MlflowException

    from ..compare import resolve_tracking_uri
    from ..mlflow_model import load_tokenizer as load_logged

    uri = resolve_tracking_uri(tracking_uri)  # an existing store: never a new empty database
    try:
        return load_logged(spec, map_location=str(device), tracking_uri=uri).eval()
    except UserError as exc:  # the downloaded checkpoint itself is bad
        raise UserError(f"{what} '{spec}': {exc}") from None
    except (MlflowException, OSError, ValueError) as exc:
        raise UserError(f"{what} '{spec}' cannot be loaded from the MLflow store ({short_reason(exc, 160)}); "
                        f"expected {ACCEPTED}") from None
