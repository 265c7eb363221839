"""The return head: a small network on the predictor's last hidden state at the origin that
predicts the horizon's normalised return, with its ranking loss and its own safetensors file
(docs/objectives.md#the-return-head).

- What it reads: the predictor's context ``h`` (:meth:`kronos_mlflow.model.kronos.Kronos.context`,
  the normed output of its causal blocks) at the origin's position ``lookback - 1``, taken by a
  forward hook on the model's final norm (:class:`ContextTap`), so the predictor's forward and its
  numbers are untouched. The tokens up to the origin come from the lookback's bars alone (the
  window is z-scored with its lookback's mean and std, the tokenizer's and the predictor's blocks
  are causal), so the head never sees the horizon it predicts.
- What it predicts (:func:`return_target`): the close's move from the origin to ``horizon`` bars
  later in the window's z-scored units, ``x[L - 1 + H, close] - x[L - 1, close]``: the return over
  the lookback's price spread, comparable across symbols.
- Its loss (:func:`correlation_loss`): ``1 - Pearson corr(prediction, target)`` over a batch's
  windows. A correlation fits a ranking (its scale is the signal's own, free, as a ranking's is)
  and is insensitive to the target's fat tails the way an MSE is not; the windows of a batch are
  drawn across dates, so it is pooled over the batch rather than per date.
- Its file (:func:`save_head`, :func:`load_head`): ``return_head.safetensors`` beside the
  backbone, whose own files stay upstream's; its shape and window in the file's metadata.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from ..config.sections import as_section
from ..errors import CheckpointError

HEAD_FILE = "return_head.safetensors"
HEAD_ATTR = "return_head"  # the submodule a tokens+return run trains (never in the backbone's own files)
JOINT = "tokens+return"  # the predictor_objective that trains it
CLOSE_COLUMN = 3  # the close among the six features (open, high, low, close, vol, amt)
HIDDEN = 64  # the head's hidden width
CORR_EPS = 1e-8


class ReturnHead(nn.Module):
    """``Linear(d_model, hidden) -> GELU -> Linear(hidden, 1)`` on the context at the origin:
    ``forward(context (B, T, d_model), origin)`` -> the signal (B,)."""

    def __init__(self, d_model: int, hidden: int = HIDDEN):
        super().__init__()
        self.d_model, self.hidden = int(d_model), int(hidden)
        self.net = nn.Sequential(nn.Linear(self.d_model, self.hidden), nn.GELU(), nn.Linear(self.hidden, 1))

    def forward(self, context: torch.Tensor, origin: int) -> torch.Tensor:
        return self.net(context[:, origin].float()).squeeze(-1)


class ContextTap:
    """The predictor's context of its last forward, kept by a hook on ``model.norm`` (use as a
    context manager; :meth:`remove` takes the hook off). The forward's outputs are unchanged."""

    def __init__(self, model: nn.Module):
        self.context: torch.Tensor | None = None
        self._handle = model.norm.register_forward_hook(self._keep)

    def _keep(self, module, inputs, output) -> None:
        self.context = output

    def take(self) -> torch.Tensor:
        """The last forward's context, forgotten here (a kept tensor would hold its graph)."""
        context, self.context = self.context, None
        if context is None:
            raise RuntimeError("the return head's tap saw no forward of the predictor")
        return context

    def remove(self) -> None:
        self._handle.remove()

    def __enter__(self) -> ContextTap:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def return_target(x: torch.Tensor, lookback: int, horizon: int, close: int = CLOSE_COLUMN) -> torch.Tensor:
    """The normalised return each window (B, W, F) of z-scored bars holds: the close ``horizon``
    bars after the origin (bar ``lookback - 1``) minus the origin's close, (B,)."""
    if lookback < 1 or horizon < 1 or lookback - 1 + horizon >= x.shape[1]:
        raise ValueError(f"a window of {x.shape[1]} bars has no bar {horizon} after a lookback of {lookback}")
    return (x[:, lookback - 1 + horizon, close] - x[:, lookback - 1, close]).float()


def correlation_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``1 - corr(prediction, target)`` over the batch (Pearson; 1 where either is constant)."""
    p = prediction.float() - prediction.float().mean()
    t = target.float() - target.float().mean()
    denom = torch.sqrt((p * p).sum() * (t * t).sum())
    if not float(denom.detach()) > CORR_EPS:
        return (p * 0.0).sum() + 1.0  # no spread: no gradient, the loss of no signal
    return 1.0 - (p * t).sum() / denom


def save_head(head: ReturnHead, directory: str | os.PathLike, *, lookback: int, horizon: int) -> Path:
    """Write ``return_head.safetensors`` into ``directory`` (its weights, and ``d_model``,
    ``hidden``, ``lookback`` and ``horizon`` as metadata); return its path."""
    from safetensors.torch import save_file  # lazy: only a head's run writes one

    path = Path(directory) / HEAD_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{HEAD_FILE}.tmp")
    tensors = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    save_file(tensors, str(tmp), metadata={"d_model": str(head.d_model), "hidden": str(head.hidden),
                                           "lookback": str(int(lookback)), "horizon": str(int(horizon))})
    os.replace(tmp, path)
    return path


def load_head(directory: str | os.PathLike) -> tuple[ReturnHead, dict[str, int]]:
    """The head in ``directory``'s ``return_head.safetensors`` and its metadata (``lookback``,
    ``horizon``); anything else is one CheckpointError line naming the file."""
    from safetensors import SafetensorError, safe_open  # lazy: only a head's model reads one

    path = Path(directory) / HEAD_FILE
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        shape = {k: int(meta[k]) for k in ("d_model", "hidden", "lookback", "horizon")}
        head = ReturnHead(shape["d_model"], shape["hidden"])
        head.load_state_dict(tensors, strict=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no return head here; expected the {HEAD_FILE} a tokens+return run "
                              "logs") from None
    except (SafetensorError, OSError, KeyError, ValueError, RuntimeError) as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path}: not a return head ({reason}); expected the {HEAD_FILE} a "
                              "tokens+return run logs") from None
    return head.eval(), {"lookback": shape["lookback"], "horizon": shape["horizon"]}


def joint(predictor) -> bool:
    """Whether the ``predictor`` section (or the whole config) trains the return head with the
    predictor (``predictor_objective``)."""
    return as_section(predictor, "predictor").predictor_objective == JOINT


def attach(model: nn.Module, config, head: ReturnHead | None = None) -> nn.Module:
    """``model`` with a return head as its submodule ``return_head`` (``head``, else a fresh one drawn
    from ``config``'s seed in a forked random state: training draws what it draws without one) and a
    :class:`ContextTap` kept as ``return_head.tap``, when ``config`` says ``tokens+return`` (else
    ``model`` as it is). As a submodule the head is in the optimizer, in DDP's averaged gradients, in
    the gradient clip and in the training state; :func:`kronos_mlflow.model.io.write_checkpoint`
    leaves it out of the backbone's files (:func:`save_head` writes its own)."""
    if not joint(config) or isinstance(getattr(model, HEAD_ATTR, None), ReturnHead):
        return model
    if head is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(config.get("seed", 0)))
            head = ReturnHead(model.d_model)
    data = as_section(config, "data")
    lookback, horizon = int(data.lookback_window), int(data.predict_window)
    head.lookback, head.horizon = lookback, horizon
    param = next(model.parameters(), None)
    model.add_module(HEAD_ATTR, head.to(param.device) if param is not None else head)
    head.tap = ContextTap(model)
    return model


def head_of(model: nn.Module) -> ReturnHead | None:
    """The return head ``model`` (a plain module) trains, None without one."""
    head = getattr(model, HEAD_ATTR, None)
    return head if isinstance(head, ReturnHead) else None
