"""`list` and `env`: what can run here, and where numbers come from."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from ..backends import backend_names, get_backend
from ..paths import device_profile_path
from ..provenance import device_info, env_flags, git_sha, library_versions, resolve_gpu
from ..sweeps import available_sweeps, load_sweep
from .app import app, console


@app.command("list")
def list_cmd(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Backends (with availability and the reason when unavailable) and sweeps."""
    backends = []
    for name in backend_names():
        b = get_backend(name)
        try:
            why = b.available()
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
        backends.append(
            {
                "name": name,
                "available": why is None,
                "reason": why or "",
                "modes": list(b.modes),
                "description": b.description,
            }
        )
    sweeps = []
    for name, path in available_sweeps().items():
        s = load_sweep(str(path))
        sweeps.append({"name": name, "mode": s.mode, "points": len(s.points), "description": s.description})
    if as_json:
        console.print_json(json.dumps({"backends": backends, "sweeps": sweeps}))
        return
    t = Table(title="backends")
    for col in ("name", "modes", "available", "reason / description"):
        t.add_column(col)
    for b in backends:
        t.add_row(
            b["name"],
            ",".join(b["modes"]),
            "[green]yes[/]" if b["available"] else "[red]no[/]",
            b["reason"] or b["description"],
        )
    console.print(t)
    s_t = Table(title="sweeps")
    for col in ("name", "mode", "points", "description"):
        s_t.add_column(col)
    for s in sweeps:
        s_t.add_row(s["name"], s["mode"], str(s["points"]), s["description"])
    console.print(s_t)


@app.command("env")
def env_cmd(
    calibrate: bool = typer.Option(
        False,
        "--calibrate",
        help="Measure copy bandwidth and bf16 matmul rate and "
        "store them as the GPU profile (results/<GPU>/device_profile.json).",
    ),
    gpu: str = typer.Option(None, "--gpu", help="Expected GPU (e.g. H200); must match the device."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Provenance: device, driver, CUDA, library versions, git sha, env flags."""
    name = resolve_gpu(gpu)
    info = {"device": device_info(), "versions": library_versions(), "git_sha": git_sha(), "env_flags": env_flags()}
    if calibrate:
        from ..calibrate import measure_ceilings

        ceilings = measure_ceilings(name)
        path = ceilings.save(device_profile_path(name))
        info["ceilings"] = {
            "matmul_tflops": ceilings.matmul_tflops,
            "copy_gbps": ceilings.copy_gbps,
            "saved_to": str(path),
        }
    if as_json:
        console.print_json(json.dumps(info, default=str))
        return
    t = Table(show_header=False)
    for k, v in info["device"].items():
        t.add_row(k, str(v))
    for k, v in info["versions"].items():
        t.add_row(k, v)
    t.add_row("git", info["git_sha"])
    for k, v in info["env_flags"].items():
        t.add_row(k, v)
    if "ceilings" in info:
        c = info["ceilings"]
        t.add_row("bf16 matmul", f"{c['matmul_tflops']:.0f} TFLOP/s")
        t.add_row("copy bandwidth", f"{c['copy_gbps']:.0f} GB/s")
        t.add_row("profile", c["saved_to"])
    console.print(t)
