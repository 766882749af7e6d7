"""`kernels`: each backend's kernels for one config, with launches and device time per call (torch.profiler)."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from pathlib import Path

import typer
from rich.table import Table

from ..backends import parse_backends
from ..errors import UsageError
from ..kernel_profile import PROFILERS
from ..paths import apply_cache_dir, results_dir
from ..provenance import CPU_GPU_NAME, device_info, git_sha, resolve_gpu
from ..rows import Status
from ..worker import IsolatedSession
from ..workload import Workload
from .app import app, console, err_console
from .run_cmds import build_sweep, default_backends

MODES = ("fwd", "bwd", "train")


def profile_file(out_dir: Path, mode: str, backend: str, wl: Workload) -> Path:
    """<out>/<mode>-<backend>-h<qk>x<v>-<label>.json, the label's characters kept to [A-Za-z0-9+x_-]."""
    label = re.sub(r"[^A-Za-z0-9+x_-]", "_", wl.label)
    return out_dir / f"{mode}-{backend}-h{wl.heads.h_qk}x{wl.heads.h_v}-{label}.json"


def validate_options(mode: str, calls: int, profiler: str = "torch") -> None:
    """Refuse a bad --mode, --calls or --profiler before any backend starts."""
    if mode not in MODES:
        raise UsageError("--mode", f"unknown mode {mode!r}", ", ".join(MODES))
    if calls < 1:
        raise UsageError("--calls", f"must be >= 1, got {calls}")
    if profiler not in PROFILERS:
        raise UsageError("--profiler", f"unknown profiler {profiler!r}", ", ".join(PROFILERS))


def kernel_table(title: str, results: dict[str, dict]) -> Table:
    """One table per config: every backend's kernels, longest first, and its GPU time per call."""
    t = Table(title=title)
    for col, justify in (("backend", "left"), ("kernel", "left"), ("launches", "right"), ("us/call", "right"),
                         ("share", "right")):  # fmt: skip
        t.add_column(col, justify=justify)
    for backend, res in results.items():
        if res["status"] != Status.PASSED.value:
            t.add_row(backend, f"[red]{res['status']}[/]: {res['reason']}", "", "", "")
            continue
        for k in res["kernels"]:
            t.add_row(backend, k["name"][:90], f"{k['launches_per_call']:g}", f"{k['us_per_call']:.1f}",
                      f"{100 * k['share']:.1f} %")  # fmt: skip
        t.add_row(backend, "[bold]all kernels[/]", "", f"[bold]{res['gpu_us_per_call']:.1f}[/]", "", end_section=True)
    return t


@app.command("kernels")
def kernels_cmd(
    heads: str = typer.Option(..., "--heads", help="Head configs: '16/64' or '16/64,2/8'."),
    seqlens: str = typer.Option(..., "--seqlens", help="Sequence mixes: '8192x4' or '8192x4,1x8192'."),
    gpu: str = typer.Option(None, "--gpu", help="GPU profile name, e.g. H200; must match the device."),
    backends: str = typer.Option(None, "--backends", "-b", help="Comma list (default: every GPU backend here)."),
    mode: str = typer.Option("fwd", "--mode", help="fwd, bwd or train (what the sweep of that mode times)."),
    calls: int = typer.Option(20, "--calls", help="Profiled calls per backend and config (after 3 warm-up calls)."),
    warm_l2: bool = typer.Option(False, "--warm-l2", help="Skip the L2 flush between calls (default: cold L2)."),
    out: Path = typer.Option(None, "--out", "-o", help="Folder for the JSON files (default results/<GPU>/kernels)."),
    timeout: float = typer.Option(600.0, "--timeout", help="Seconds a backend may take for one request."),
    cache_dir: Path = typer.Option(None, "--cache-dir", help="Root of the TileLang/Triton/FlashInfer caches."),
    profiler: str = typer.Option(
        "torch",
        "--profiler",
        help="torch (torch.profiler: the kernel table) or ncu-range (the calls inside a CUDA profiler range, for "
        "`ncu --profile-from-start off ... qla-bench kernels --profiler ncu-range` to record; no table).",
    ),
) -> None:
    """Per backend and config: numerics against float64 first, then every kernel one call launches, with its
    launches and device time per call (torch.profiler), or the calls inside a profiler range for Nsight Compute
    (--profiler ncu-range). A development reading: the sweeps' timers give the numbers results/ holds."""
    validate_options(mode, calls, profiler)
    name = resolve_gpu(gpu)
    if name == CPU_GPU_NAME:
        raise UsageError("--gpu", "kernel profiles need a CUDA GPU (torch.profiler's CUDA activities); none is "
                         "visible here", "run on the GPU host")  # fmt: skip
    apply_cache_dir(cache_dir)
    sweep = build_sweep(mode, None, heads, seqlens, on_gpu=True)
    names = parse_backends(backends) if backends else default_backends(mode, on_gpu=True, import_check=False)
    out_dir = Path(out) if out else results_dir(name) / "kernels"
    out_dir.mkdir(parents=True, exist_ok=True)
    device, sha = device_info(), git_sha()
    by_config: dict[str, dict[str, dict]] = {}
    started = time.perf_counter()
    for backend in names:
        session = IsolatedSession(backend, "cuda", "bf16", cold_l2=not warm_l2, timeout_s=timeout)
        try:
            for point in sweep.points:
                wl = point.workload
                err_console.print(f"[dim]{backend} h{wl.heads.h_qk}/{wl.heads.h_v} {wl.label}: check, then "
                                  f"{calls} profiled calls[/]")  # fmt: skip
                res = profile_one(session, wl, mode, calls, profiler)
                res.update(backend=backend, mode=mode, workload=wl.as_dict(), calls=calls, cold_l2=not warm_l2,
                           profiler=profiler,
                           gpu=name, device=device, git_sha=sha,
                           timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"))  # fmt: skip
                path = profile_file(out_dir, mode, backend, wl)
                path.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
                by_config.setdefault(f"{mode} h{wl.heads.h_qk}/{wl.heads.h_v} {wl.label}", {})[backend] = res
        finally:
            session.close()
    if profiler == "ncu-range":
        err_console.print("[dim]--profiler ncu-range: the kernels are in Nsight Compute's report, not here[/]")
    else:
        for title, results in by_config.items():
            console.print(kernel_table(title, results))
    err_console.print(f"[dim]wrote {out_dir}/; {time.perf_counter() - started:.1f} s[/]")


def profile_one(session, wl: Workload, mode: str, calls: int, profiler: str = "torch") -> dict:
    """setup() (the numerics check) on the workload's seed, then the kernel profile if it passed."""
    setup = session.setup(wl, mode, wl.seed())
    res = {"status": setup.status, "reason": setup.reason, "rel_l2": setup.rel_l2, "versions": setup.versions,
           "env_flags": setup.env_flags, "kernels": [], "gpu_us_per_call": None}  # fmt: skip
    if setup.status == Status.PASSED.value:
        try:
            kernels = session.kernels(calls, profiler)
        except Exception as exc:  # a profile that fails is a row with its reason, not the end of the run
            res.update(status=Status.ERROR.value, reason=f"profile: {type(exc).__name__}: {exc}"[:300])
        else:
            res["kernels"] = kernels
            res["gpu_us_per_call"] = round(sum(k["us_per_call"] for k in kernels), 3) if kernels else None
    session.teardown()
    return res
