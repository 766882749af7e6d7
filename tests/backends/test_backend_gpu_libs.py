"""The real libraries on a GPU: each adapter's outputs against a float64 recurrence, and graph capture.

Catches what fakes cannot: a changed return tuple, a wrong gradient order, a gate in the wrong domain.
Skipped without a CUDA GPU or the library. FlashInfer 0.6.9 builds its GDN module with nvcc on first
use (about 13 minutes on 16 cores), so its test runs only with QLA_TEST_FLASHINFER=1.
"""

from __future__ import annotations

import os

import pytest
import torch

from qla_bench.backends.base import Backend, GDNInputs
from qla_bench.backends.fla import FlaBackend, gather_bwd_facts
from qla_bench.backends.flashinfer import FlashInferBackend
from qla_bench.backends.flashqla import FlashQLABackend

pytestmark = pytest.mark.gpu
TOL = {"o": 0.02, "final_state": 0.02, "dq": 0.02, "dk": 0.02, "dv": 0.02, "dh0": 0.02, "dg": 0.03, "dbeta": 0.03}


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.fixture(scope="module")
def case(make_inputs, naive_gdn_grads) -> tuple[GDNInputs, dict[str, torch.Tensor]]:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    # two ragged sequences, neither a multiple of 64, GVA 2/4, K = V = 128 (the common ground)
    cpu = make_inputs(seqlens=(130, 67), h_qk=2, h_v=4, k_dim=128, v_dim=128, seed=1)
    ref = naive_gdn_grads(cpu)
    dev = GDNInputs(**{**cpu.tensors(), "scale": cpu.scale, "workload": cpu.workload})
    for name, t in cpu.tensors().items():
        setattr(dev, name, t.cuda())
    return dev, ref


def _backend(cls: type[Backend]) -> Backend:
    b = cls()
    reason = b.available()
    if reason:
        pytest.skip(reason)
    return b


def _check(b: Backend, mode: str, case) -> None:
    inputs, ref = case
    reason = b.supports(inputs.workload, mode, inputs.device)
    if reason:
        pytest.skip(reason)
    p = b.prepare(inputs, mode)
    first = {k: v.clone() for k, v in p.outputs(p.run()).items()}
    again = p.outputs(p.run())  # run() must be repeatable: nothing consumed or mutated
    torch.cuda.synchronize()
    errors = {name: rel_l2(out, ref[name]) for name, out in first.items() if name in ref}
    print(b.name, mode, {k: f"{v:.2e}" for k, v in errors.items()}, b.env_flags())
    expected = {"fwd": {"o", "final_state"}, "bwd": {"dq", "dk", "dv", "dg", "dbeta", "dh0"}}
    expected["train"] = expected["fwd"] | expected["bwd"]
    assert set(first) == expected[mode]
    for name, out in first.items():
        assert out.shape == ref[name].shape, name
        assert errors[name] <= TOL[name], (name, errors[name])
        assert torch.equal(out, again[name]), name


@pytest.mark.parametrize("mode", ["fwd", "bwd", "train"])
def test_fla(mode: str, case) -> None:
    _check(_backend(FlaBackend), mode, case)


def test_fla_bwd_refusal_is_predicted(monkeypatch: pytest.MonkeyPatch, case) -> None:
    """With FLA's TileLang kernel switched off, supports() must say exactly when FLA's backward raises."""
    inputs, _ = case
    b = _backend(FlaBackend)
    monkeypatch.setenv("FLA_TILELANG", "0")  # FLA reads it on every dispatch
    reason = b.supports(inputs.workload, "bwd", inputs.device)
    print("FLA_TILELANG=0:", gather_bwd_facts(inputs.device), "->", reason)
    p = b.prepare(inputs, "bwd")  # FLA's forward is unaffected
    if reason is None:
        p.run()
        torch.cuda.synchronize()
    else:
        assert "#640" in reason and "FLA_TILELANG=0" in reason
        with pytest.raises(RuntimeError, match="#640"):
            p.run()


@pytest.mark.parametrize("mode", ["fwd", "bwd", "train"])
def test_flashqla(mode: str, case) -> None:
    _check(_backend(FlashQLABackend), mode, case)


@pytest.mark.skipif(os.environ.get("QLA_TEST_FLASHINFER") != "1", reason="set QLA_TEST_FLASHINFER=1")
def test_flashinfer(case) -> None:
    _check(_backend(FlashInferBackend), "fwd", case)


@pytest.mark.parametrize("cls", [FlaBackend, FlashQLABackend])
@pytest.mark.parametrize("mode", ["fwd", "bwd"])
def test_graph_capture_replays_the_same_numbers(cls: type[Backend], mode: str, case) -> None:
    """graph_safe=True is a claim: after a warm-up, run() captures and replays to the eager result."""
    inputs, _ = case
    b = _backend(cls)
    reason = b.supports(inputs.workload, mode, inputs.device)
    if reason:
        pytest.skip(reason)
    p = b.prepare(inputs, mode)
    assert p.graph_safe
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        eager = {k: v.clone() for k, v in p.outputs(p.run()).items()}
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = p.run()
    graph.replay()
    torch.cuda.synchronize()
    for name, out in p.outputs(captured).items():
        assert torch.equal(out, eager[name]), name
