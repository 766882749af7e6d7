"""Where a number came from: device, driver, library versions, git sha, env flags, device health.

Also the GPU-profile check behind `--gpu NAME`: the name must match the real device.
"""

from __future__ import annotations

import os
import platform
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from .errors import UsageError

LIBRARIES = (
    "torch",
    "triton",
    "tilelang",
    "fla-core",
    "flash-linear-attention",
    "flashinfer-python",
    "flash-qla",
    "qla-bench",
)
# settings that change which kernels run or where (cache folders are not recorded: they change nothing)
ENV_FLAGS = (
    "FLA_FLASH_QLA",
    "FLA_DISABLE_BACKEND_DISPATCH",
    "FLA_TILELANG",
    "FLA_INTRACARD_CP",
    "CUDA_VISIBLE_DEVICES",
    "FLASHINFER_CUDA_ARCH_LIST",
    "QLA_KKT_IMPL",
    "QLA_FUSED_IMPL",
    "QLA_BWD_IMPL",
    "QLA_BWD_DSTATE",
    "QLA_BWD_GRADS",
    "QLA_BWD_GROUP_SUM",
    "QLA_BWD_STATES",
    "QLA_BWD_CP",
    "QLA_BWD_OVERLAP",
    "QLA_BWD_FUSED",
    "QLA_CP",
    "QLA_CP_PIECE",
    "QLA_CP_COMBINE",
    "QLA_CP_COMBINE_REV",
    "QLA_CP_COMBINE_BV",
    "QLA_CP_COMBINE_THREADS",
    "QLA_LONGEST_FIRST",
)
CPU_GPU_NAME = "CPU"


@lru_cache(maxsize=1)
def _library_versions() -> tuple[tuple[str, str], ...]:
    out = []
    for dist in LIBRARIES:
        try:
            out.append((dist, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            continue
    return tuple(out)


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries measured (read once per process: every row records them)."""
    return dict(_library_versions())


def env_flags() -> dict[str, str]:
    return {n: os.environ[n] for n in ENV_FLAGS if n in os.environ}


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5, check=False)
    return out.stdout.strip()


@lru_cache(maxsize=1)
def git_sha() -> str:
    """The checkout's commit (+'-dirty'); $QLA_GIT_SHA wins, for copies without .git (the GPU host)."""
    if os.environ.get("QLA_GIT_SHA"):
        return os.environ["QLA_GIT_SHA"]
    root = Path(__file__).resolve().parents[1]
    try:
        sha = _git(root, "rev-parse", "--short=12", "HEAD")
        if sha:
            dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
            return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def short_gpu_name(full: str) -> str:
    """'NVIDIA H200' -> 'H200', 'NVIDIA H100 80GB HBM3' -> 'H100' (the profile/results folder name)."""
    words = [w for w in full.replace("NVIDIA", "").split() if w]
    return words[0] if words else full


def device_info() -> dict[str, object]:
    """GPU name, SMs, L2, memory, driver and CUDA of the current device (or the CPU)."""
    import torch

    if not torch.cuda.is_available():
        return {
            "gpu": CPU_GPU_NAME,
            "device": platform.processor() or platform.machine(),
            "cuda": None,
            "cpu_count": os.cpu_count(),
        }
    props = torch.cuda.get_device_properties(0)
    info: dict[str, object] = {
        "gpu": short_gpu_name(props.name),
        "device": props.name,
        "sm_count": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "memory_bytes": props.total_memory,
        "cuda": torch.version.cuda,
    }
    drv = nvml_driver_version()
    if drv:
        info["driver"] = drv
    return info


def resolve_gpu(requested: str | None) -> str:
    """The profile name for this run. `--gpu NAME` must match the device; no GPU means 'CPU'."""
    actual = str(device_info()["gpu"])
    if requested is None:
        return actual
    if requested.upper() != actual.upper():
        if actual == CPU_GPU_NAME:
            raise UsageError(
                "--gpu",
                f"{requested} requested but no CUDA GPU is visible here",
                "omit --gpu on a CPU-only machine, or run on the GPU host",
            )
        raise UsageError("--gpu", f"{requested} requested but this device is {actual}", actual)
    return actual


def nvml_driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        return None


def read_health(index: int = 0) -> dict[str, object]:
    """SM/memory clocks, temperature, power and throttle reasons from NVML (read-only; {} without NVML)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        return {
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "throttle_reasons": int(reasons),
        }
    except Exception:
        return {}


# NVML clock-event (throttle) reason bits. Idle (0x1), application-clock (0x2), sync-boost (0x10) and
# display-clock (0x100) settings are benign; the others mean the card ran slower than it can.
THROTTLE_REASON_NAMES = {
    0x1: "idle",
    0x2: "app clocks",
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x10: "sync boost",
    0x20: "SW thermal",
    0x40: "HW thermal",
    0x80: "HW power brake",
    0x100: "display clocks",
}
_BAD_THROTTLE_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def is_throttled(before: dict[str, object], after: dict[str, object]) -> bool:
    return any(int(h.get("throttle_reasons", 0)) & _BAD_THROTTLE_BITS for h in (before, after) if h)


def throttle_names(bits: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASON_NAMES.items() if bits & bit]


def describe_health(health: dict[str, dict[str, object]]) -> str:
    """One line for a row's health readings: slowing reasons (before/after), SM clock, temperature, power."""
    snaps = [(w, health[w]) for w in ("before", "after") if health.get(w)]
    if not snaps:
        return "-"
    parts = []
    for when, h in snaps:
        bad = throttle_names(int(h.get("throttle_reasons", 0)) & _BAD_THROTTLE_BITS)
        if bad:
            parts.append(f"{', '.join(bad)} ({when})")

    def span(key: str, unit: str) -> str | None:
        vals = [float(h[key]) for _, h in snaps if h.get(key) is not None]
        if not vals:
            return None
        lo, hi = min(vals), max(vals)
        return f"{lo:.0f}{unit}" if lo == hi else f"{lo:.0f}-{hi:.0f}{unit}"

    for key, label, unit in (("sm_clock_mhz", "SM ", " MHz"), ("temp_c", "", " C"), ("power_w", "", " W")):
        text = span(key, unit)
        if text:
            parts.append(label + text)
    return "; ".join(parts)
