"""Speed settings for training, resolved from the config: threads, precision, compile, AdamW kernel,
the model's fused path and the allocator (``auto``: what measured fastest on a 2-core CPU, or what
is standard for a GPU). Nothing here changes what is computed beyond float rounding, except
``precision: bf16`` (autocast); docs/speed.md.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import torch

from ..errors import ConfigError

# ----------------------------------------------------------------------------------- threads


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask), else os.cpu_count()."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def local_world_size() -> int:
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def configure_threads(num_threads: int = 0, n_local_processes: int | None = None) -> dict[str, int]:
    """Set torch's intra-op threads (``num_threads``, or CPUs / local processes when 0, so ranks on
    one machine never oversubscribe its cores) and one inter-op thread (eager training never runs
    ops in parallel at the inter-op level). Returns what is in effect. The inter-op pool can be sized only before its
    first use; later calls leave it as it is."""
    n_local = n_local_processes if n_local_processes is not None else local_world_size()
    n = int(num_threads) if num_threads else max(1, available_cpus() // max(1, n_local))
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    if torch.get_num_interop_threads() != 1:
        with contextlib.suppress(RuntimeError):  # "cannot set ... after parallel work has started"
            torch.set_num_interop_threads(1)
    return {"num_threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads()}


# ----------------------------------------------------------------------------------- allocator

#: glibc ``mallopt`` parameters (malloc.h) and the values ``malloc_reuse`` sets: blocks up to
#: 1 GiB come from the heap (not a fresh ``mmap`` each), and the heap's free top is never
#: trimmed back to the OS (2 GiB - 1 is the largest value the int parameter takes).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
REUSE_MMAP_THRESHOLD = 1 << 30
REUSE_TRIM_THRESHOLD = (1 << 31) - 1


def _glibc():
    """The process's C library through ctypes when it is glibc (has ``mallopt``), else None."""
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt  # noqa: B018 - raises AttributeError when missing
    except (OSError, AttributeError):
        return None
    return libc


def malloc_reuse_available() -> bool:
    return _glibc() is not None


def resolve_malloc_reuse(choice: str) -> bool:
    """Whether to keep freed memory in the process for the config's ``malloc_reuse``."""
    if choice == "off":
        return False
    if choice == "on" and not malloc_reuse_available():
        raise ConfigError("malloc_reuse: on needs glibc's mallopt, which this platform's C library lacks; "
                          "use malloc_reuse auto or off")
    return malloc_reuse_available()


def set_malloc_thresholds(mmap_threshold: int, trim_threshold: int) -> bool:
    """Set glibc's mmap and trim thresholds (bytes). False where there is no glibc or it refused."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, int(mmap_threshold))) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, int(trim_threshold)))


def configure_malloc(choice: str) -> bool:
    """Apply ``malloc_reuse`` to this process; returns whether freed memory is now kept.
    ``off`` leaves glibc's (adaptive) defaults alone."""
    if not resolve_malloc_reuse(choice):
        return False
    return set_malloc_thresholds(REUSE_MMAP_THRESHOLD, REUSE_TRIM_THRESHOLD)


# ----------------------------------------------------------------------------------- precision


def _cuda_bf16(device: torch.device) -> bool:
    try:
        return torch.cuda.is_bf16_supported()
    except Exception:  # noqa: BLE001 - any failure: treat as unsupported
        return False


def resolve_precision(choice: str, device: torch.device) -> str:
    """``fp32`` or ``bf16`` for the config's ``precision`` on ``device``."""
    device = torch.device(device)
    if choice == "auto":
        return "bf16" if device.type == "cuda" and _cuda_bf16(device) else "fp32"
    if choice == "bf16" and device.type == "cuda" and not _cuda_bf16(device):
        raise ConfigError("precision: bf16 was asked for but this GPU has no bf16 support; use precision fp32 or auto")
    if choice not in ("fp32", "bf16"):
        raise ConfigError(f"precision: '{choice}' is not one of auto, fp32, bf16")
    return choice


def autocast(precision: str, device: torch.device):
    """The forward's context: bf16 autocast, or nothing for fp32."""
    if precision == "bf16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def configure_matmul(precision: str, device: torch.device) -> None:
    """TF32 for the fp32 matmuls autocast leaves (CUDA, bf16 runs); exact fp32 otherwise."""
    if torch.device(device).type != "cuda":
        return
    torch.set_float32_matmul_precision("high" if precision == "bf16" else "highest")
    torch.backends.cudnn.allow_tf32 = precision == "bf16"


# ----------------------------------------------------------------------------------- compile

#: On CPU, ``compile: auto`` compiles runs of at least this many optimizer steps. Compiling the
#: base tokenizer's training graph costs about 25 s on 2 cores (a few seconds once inductor's
#: cache holds it) and saves about a quarter of each ~1 s step, so it pays for itself after
#: roughly a hundred steps; the margin keeps short test and smoke runs eager.
CPU_COMPILE_MIN_STEPS = 1000


def _cxx_compiler() -> str | None:
    """The C++ compiler inductor would use on CPU, if one is on PATH."""
    import shutil

    try:
        from torch._inductor import config as inductor_config

        names = [c for c in (inductor_config.cpp.cxx or ()) if c]
    except Exception:  # noqa: BLE001 - layout of inductor's config changed: try the usual names
        names = []
    for name in [*names, "g++", "c++", "clang++"]:
        found = shutil.which(name)
        if found:
            return found
    return None


def resolve_compile(choice: str, device: torch.device, run_steps: int | None = None) -> bool:
    """Whether to ``torch.compile`` the training model for the config's ``compile``.

    ``auto``: on for CUDA (when triton is importable); on CPU when the run has at least
    :data:`CPU_COMPILE_MIN_STEPS` optimizer steps (``run_steps``; None = a long run) and a C++
    compiler is on PATH (on CPU it measured about 1.3x faster per step: inductor fuses RMSNorm,
    rotary, SwiGLU and the loss, the memory-bound third of an eager step). Under ``auto`` a compile
    failure falls back to eager (dynamo's ``suppress_errors``); ``on`` lets it raise.
    """
    if choice == "on":
        return True
    if choice == "off":
        return False
    if torch.device(device).type == "cuda":
        try:  # inductor on CUDA needs triton
            import triton  # noqa: F401
        except Exception:  # noqa: BLE001
            warnings.warn("compile: auto found no triton for this CUDA torch; training runs eagerly", stacklevel=2)
            return False
        return True
    if run_steps is not None and run_steps < CPU_COMPILE_MIN_STEPS:
        return False
    return _cxx_compiler() is not None


def settings_of(section: Any) -> Any:
    """``section`` read by attribute: a config section (``sections(config).performance``) as it
    is, a whole config mapping as a namespace of its keys. ``runtime`` sits below ``config``, so
    the caller builds the section; a caller still holding the whole config may hand that."""
    return SimpleNamespace(**section) if isinstance(section, Mapping) else section


def run_steps(training: Any, world_size: int = 1) -> int:
    """Optimizer steps a run takes at most (``n_train_iter`` caps each epoch). ``training``: the
    config's training section (or the whole config)."""
    training = settings_of(training)
    per_epoch = int(training.n_train_iter) // max(1, int(world_size)) // int(training.batch_size)
    return int(training.epochs) * per_epoch


def compile_model(model, choice: str):
    """``torch.compile(model)``; under ``auto`` errors fall back to eager instead of failing."""
    if choice == "auto":
        from torch._dynamo import config as dynamo_config

        dynamo_config.suppress_errors = True
    return torch.compile(model)


# ----------------------------------------------------------------------------------- fused layers


def resolve_fused(choice: str, device: torch.device) -> bool:
    """Whether training runs the model's fused path (``KronosTokenizer.set_fused``).

    ``auto``: on for CUDA (the stacked matmuls and one batched decoder pass halve the kernel
    launches that bound a model this small on a GPU), off on CPU, where it measured 1-3% slower
    (the batched decoder's larger working set costs more than the saved calls).
    """
    if choice in ("on", "off"):
        return choice == "on"
    return torch.device(device).type == "cuda"


# ----------------------------------------------------------------------------------- AdamW


def _fused_adamw_supported(device: torch.device) -> bool:
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        return torch.device(device).type in _get_fused_kernels_supported_devices()
    except Exception:  # noqa: BLE001 - private helper moved: CUDA always had it
        return torch.device(device).type == "cuda"


def resolve_adamw(choice: str, device: torch.device) -> str:
    """``fused``, ``foreach`` or ``for-loop`` for the config's ``adamw_impl`` on ``device``."""
    if choice == "auto":
        return "fused" if _fused_adamw_supported(device) else "foreach"
    if choice == "fused" and not _fused_adamw_supported(device):
        raise ConfigError(f"adamw_impl: fused AdamW is not available on {torch.device(device).type} in this torch; "
                          "use adamw_impl auto or foreach")
    return choice


def adamw_kwargs(impl: str) -> dict[str, bool]:
    """Keyword arguments selecting a (resolved) AdamW implementation."""
    return {"fused": {"fused": True}, "foreach": {"foreach": True},
            "for-loop": {"foreach": False, "fused": False}}[impl]


def describe(performance: Any, device: torch.device, steps: int | None = None) -> dict[str, Any]:
    """The resolved speed settings, for logs and the benchmark (``steps``: see resolve_compile).
    ``performance``: the config's performance section (or the whole config)."""
    performance = settings_of(performance)
    return {
        "precision": resolve_precision(performance.precision, device),
        "compile": resolve_compile(performance.compile, device, steps),
        "adamw_impl": resolve_adamw(performance.adamw_impl, device),
        "fused_layers": resolve_fused(performance.fused_layers, device),
        "malloc_reuse": resolve_malloc_reuse(performance.malloc_reuse),
        "num_threads": torch.get_num_threads(),
    }


def configure_process(performance: Any, device, local_world_size: int | None = None,
                      run_steps: int | None = None) -> dict:
    """Per-process speed settings: intra-op threads (``num_threads``; 0 = CPUs / local
    processes), one inter-op thread, the allocator, and TF32 matmuls for bf16 runs on CUDA.
    Returns the resolved settings (threads, precision, compile, AdamW kernel, fused layers).
    ``performance``: the config's performance section (or the whole config)."""
    performance = settings_of(performance)
    threads = configure_threads(performance.num_threads, local_world_size)
    configure_malloc(performance.malloc_reuse)
    configure_matmul(resolve_precision(performance.precision, device), device)
    return {**describe(performance, device, run_steps), **threads}
