"""The harness on a real GPU: timers, cold-L2 flush, the torch backend and each library adapter vs float64.

Marked `gpu`: skipped (and reported as skipped) on machines without CUDA; run on the H200 host with
`python -m pytest -m gpu tests/gpu`.
"""

from __future__ import annotations

import os

import pytest
import torch

from qla_bench.backends import get_backend
from qla_bench.calibrate import measure_ceilings
from qla_bench.inputs import make_inputs
from qla_bench.numerics import compare_outputs, get_tolerance
from qla_bench.session import reference_outputs
from qla_bench.timing import L2Flusher, time_callable
from qla_bench.workload import HeadConfig, InputRecipe, Workload

pytestmark = pytest.mark.gpu

EDGE_CASES = [
    Workload(HeadConfig(2, 8), (1000, 3096), recipe=InputRecipe("flashqla", 0.25)),  # ragged, GVA 4
    Workload(HeadConfig(16, 48), (65,), recipe=InputRecipe("strong", 0.25)),  # GVA 3, strong decay
    Workload(HeadConfig(4, 4), (1,), recipe=InputRecipe("zero", 0.0)),  # T = 1, g = 0
    Workload(HeadConfig(4, 8), (4096, 64, 1), recipe=InputRecipe("flashqla", 0.5)),
]


def test_timers_measure_real_work():
    dev = torch.device("cuda")
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    flusher = L2Flusher(dev)
    assert flusher.buffer.numel() * 4 >= max(256 << 20, 2 * torch.cuda.get_device_properties(dev).L2_cache_size)
    small = time_callable(lambda: a @ a, "cuda-events", 20, dev, flusher).samples_ms
    big_a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    big = time_callable(lambda: big_a @ big_a, "cuda-events", 20, dev, flusher).samples_ms
    graph = time_callable(lambda: big_a @ big_a, "cuda-graph", 20, dev, flusher).samples_ms
    med = sorted(big)[10]
    assert 0 < sorted(small)[10] < med
    assert abs(sorted(graph)[len(graph) // 2] - med) / med < 0.25


def test_kernel_profile_sees_the_work_and_not_the_flush():
    from qla_bench.kernel_profile import cuda_activities, profile_calls, short_name

    dev = torch.device("cuda")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    flusher = L2Flusher(dev)
    rows = profile_calls(lambda: a @ a, 10, flusher)
    flush_names = {short_name(n) for n, _ in cuda_activities(flusher, 2)}
    assert flush_names and not flush_names & {r.name for r in rows}, (flush_names, rows)
    assert rows[0].launches_per_call == 1 and rows[0].share > 0.9, rows
    med = sorted(time_callable(lambda: a @ a, "cuda-events", 20, dev, flusher).samples_ms)[10]
    assert 0.5 < sum(r.us_per_call for r in rows) / (med * 1e3) < 1.2  # device time within the event time


def test_kernel_profile_of_the_qla_forward_names_its_two_stages():
    from qla_bench.session import BackendSession

    wl = Workload(HeadConfig(2, 8), (1000, 3096))
    session = BackendSession("qla", "cuda")
    if session.availability():
        pytest.skip(f"qla unavailable: {session.availability()}")
    assert session.setup(wl, "fwd", wl.seed()).status == "PASSED"
    names = [k["name"] for k in session.kernels(5)]
    assert any("kkt_solve" in n for n in names) and any("fused_fwd_ws" in n for n in names), names


def test_calibration_is_plausible():
    c = measure_ceilings("test", copy_bytes=1 << 30, n=4096, reps=5)
    assert 50 < c.matmul_tflops < 2000 and 500 < c.copy_gbps < 10000


# FlashInfer 0.6.9 JIT-builds its GDN module on first use (~13 min): only with QLA_TEST_FLASHINFER=1
_BACKENDS = ["torch", "fla", "flashqla"] + (["flashinfer"] if os.environ.get("QLA_TEST_FLASHINFER") else [])


@pytest.mark.parametrize("wl", EDGE_CASES, ids=lambda w: f"{w.heads.h_qk}/{w.heads.h_v}-{w.label}-{w.recipe.gate}")
@pytest.mark.parametrize("backend", _BACKENDS)
def test_backend_forward_matches_float64(backend, wl):
    b = get_backend(backend)
    why = b.available() or b.supports(wl, "fwd", torch.device("cuda"))
    if why:
        pytest.skip(f"{backend}: {why}")
    x = make_inputs(wl, "cuda")
    p = b.prepare(x, "fwd")
    out = p.outputs(p.run())
    torch.cuda.synchronize()
    cmp = compare_outputs(out, reference_outputs(x, "fwd"), get_tolerance("bf16"))
    assert cmp.status.value == "PASSED", f"{backend}: {cmp.reason} {cmp.rel_l2}"
