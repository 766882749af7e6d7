"""Where the host's time goes in one forward call: the floor a small config cannot go below.

On the H200 the harness measured qla at ~0.22 ms (cuda-events) on configs whose two kernels run for
a few microseconds, while FlashInfer took 0.016 ms: the GPU waits for the host. This times each host
step of chunk_gated_delta_rule_fwd on its own (argument checks, plan lookup, kernel lookup, launches)
and runs cProfile over whole calls. A development tool: run it on the GPU host with
`python -m qla_kernels.gdn.profile_host OUT.json`; its numbers go to NOTES.md, never into results.
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import sys
import time
from collections.abc import Callable

import torch

from . import api
from .checks import HEAD_DIM, check_fwd_args


def _per_call_us(fn: Callable[[], object], calls: int) -> float:
    """Host wall time per call, in microseconds, after a warm-up; the GPU is drained before and after
    (the steps timed here launch little or nothing, so the host is what is measured)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return round(host / calls * 1e6, 2)


def _events_us_per_call(fn: Callable[[], object], calls: int) -> float:
    """CUDA-events time per call, in microseconds, of `calls` calls issued back to back (the GPU drained first)."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) / calls * 1e3, 2)


def _cprofile_top(fn: Callable[[], object], calls: int, lines: int) -> str:
    """cProfile's table of `calls` calls of fn, by own time, its first `lines` functions."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(lines)
    return text.getvalue()


def _inputs(h_qk: int, h_v: int, seqlens: list[int], dtype: torch.dtype = torch.bfloat16):
    t = sum(seqlens)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(1, t, h_qk, HEAD_DIM, device="cuda", generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(1, t, h_qk, HEAD_DIM, device="cuda", generator=gen), dim=-1)
    v = torch.randn(1, t, h_v, HEAD_DIM, device="cuda", generator=gen)
    g = -torch.rand(1, t, h_v, device="cuda", generator=gen) * 0.1
    beta = torch.rand(1, t, h_v, device="cuda", generator=gen)
    h0 = torch.randn(len(seqlens), h_v, HEAD_DIM, HEAD_DIM, device="cuda", generator=gen) * 0.1
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int64, device="cuda")
    return q.to(dtype), k.to(dtype), v.to(dtype), g, beta, h0, cu


def host_breakdown(h_qk: int, h_v: int, seqlens: list[int], calls: int = 300) -> dict:
    """Microseconds per call of each host step of the forward, and of the whole call."""
    q, k, v, g, beta, h0, cu = _inputs(h_qk, h_v, seqlens)
    plan = api._plan(q, cu)
    impl = api.resolve_kkt_impl(None)
    scale = HEAD_DIM**-0.5
    dt = api._TL_DTYPE[q.dtype]
    nsm = api._num_sms(q.device)
    fname, bv = api.choose_fused(plan.num_seqs, h_v, nsm)
    packed = [api.pack_tokens(x) for x in (q, k, v, g, beta)]
    qf, kf, vf, gf, bf = packed
    g_cumsum, a0 = api._launch_kkt(impl, kf, gf, bf, plan)
    o = torch.empty_like(vf)
    ht = torch.empty(plan.num_seqs, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device="cuda")
    kkt = api._kkt_kernel(impl, dt)
    fused = api._fused_kernel(fname, scale, dt, True, False, bv)

    steps: dict[str, Callable[[], object]] = {
        "whole call (chunk_gated_delta_rule_fwd)": lambda: api.chunk_gated_delta_rule_fwd(
            q, k, v, g, beta, initial_state=h0, cu_seqlens=cu
        ),
        "check_fwd_args": lambda: check_fwd_args(q, k, v, g, beta, h0, cu, False),
        "plan lookup": lambda: api._plan(q, cu),
        "pack_tokens x5": lambda: [api.pack_tokens(x) for x in (q, k, v, g, beta)],
        "kkt kernel lookup": lambda: api._kkt_kernel(impl, dt),
        "fused kernel lookup": lambda: api._fused_kernel(fname, scale, dt, True, False, bv),
        "output allocations (4 torch.empty)": lambda: (
            torch.empty_like(gf),
            torch.empty(*gf.shape, 64, dtype=kf.dtype, device=kf.device),
            torch.empty_like(vf),
            torch.empty(plan.num_seqs, h_v, HEAD_DIM, HEAD_DIM, dtype=torch.float32, device="cuda"),
        ),
        "kkt launch (compiled kernel call)": lambda: kkt(kf, gf, bf, plan.cu_seqlens, plan.chunk_indices, g_cumsum, a0),
        "fused launch (compiled kernel call)": lambda: fused(qf, kf, vf, g_cumsum, bf, a0, h0, plan.cu_seqlens, o, ht,
                                                             *((plan.seq_order,) if fname in api.WS_REVS else ())),
        "empty torch op (x.add_(0)), for scale": lambda: o.add_(0),
    }
    out = {name: _per_call_us(fn, calls) for name, fn in steps.items()}

    def whole():
        return api.chunk_gated_delta_rule_fwd(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu)

    out["back-to-back calls, cuda-events per call"] = _events_us_per_call(whole, calls)
    return {
        "config": {"h_qk": h_qk, "h_v": h_v, "seqlens": seqlens, "fused": fname, "block_v": bv, "kkt": impl},
        "us_per_call": out,
        "cprofile_tottime_top30": _cprofile_top(whole, calls, 30),
    }


def whole_call(h_qk: int, h_v: int, seqlens: list[int], calls: int = 200) -> dict:
    """The inference forward as the harness's qla backend runs it (need_a0=False: kkt + ws12, CP where planned):
    host time per call, back-to-back CUDA-events time per call, and a CUDA graph's replay time per call (the
    GPU's own time, no host). host > graph means the GPU waits for the host at this size."""
    q, k, v, g, beta, h0, cu = _inputs(h_qk, h_v, seqlens)

    def call():
        return api.chunk_gated_delta_rule_fwd(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu, need_a0=False)

    plan = api._plan(q, cu)
    cpp = api._cp_plan(plan, h_v, api._num_sms(q.device), None, None)
    out = {"host us per call": _per_call_us(call, calls),
           "back-to-back cuda-events us per call": _events_us_per_call(call, calls)}  # fmt: skip
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # a warm call off the default stream, as graph capture wants
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    graph.replay()
    out["graph replay us per call"] = _events_us_per_call(graph.replay, calls)
    return {
        "config": {"h_qk": h_qk, "h_v": h_v, "seqlens": seqlens, "need_a0": False,
                   "cp_pieces": cpp.num_pieces if cpp is not None else 0},
        "us_per_call": out,
        "cprofile_tottime_top25": _cprofile_top(call, calls, 25),
    }


def parse_configs(text: str) -> list[tuple[int, int, list[int]]]:
    """"16/16:2048,2/8:1024x8,8/24:1000+3096" -> [(h_qk, h_v, seqlens), ...]."""
    configs = []
    for item in text.split(","):
        heads, _, mix = item.strip().partition(":")
        h_qk, _, h_v = heads.partition("/")
        if "x" in mix:
            length, _, count = mix.partition("x")
            seqlens = [int(length)] * int(count)
        else:
            seqlens = [int(x) for x in mix.split("+")]
        configs.append((int(h_qk), int(h_v), seqlens))
    return configs


def _provenance() -> dict:
    """What a reading of host time depends on: the device, the host's Python and the libraries on the path."""
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return {"device": torch.cuda.get_device_name(), "python": sys.version.split()[0], "torch": torch.__version__,
            "tilelang": ver("tilelang"), "apache-tvm-ffi": ver("apache-tvm-ffi"),
            "timers": "host: perf_counter over N calls after 5 warm-up calls; cuda-events: N calls back to back; "
                      "graph: N replays of one captured call"}  # fmt: skip


def main(argv: list[str]) -> None:
    """OUT.json [CONFIGS]: with CONFIGS (parse_configs' form), whole_call on each; without, session 5's
    step-by-step host_breakdown on its two configs."""
    path = argv[0] if argv else "host_overhead.json"
    if len(argv) > 1:
        results = [whole_call(h_qk, h_v, s) for h_qk, h_v, s in parse_configs(argv[1])]
    else:
        results = [host_breakdown(h_qk, h_v, s) for h_qk, h_v, s in ((16, 64, [65]), (2, 8, [1024] * 8))]
    provenance = _provenance()
    for r in results:
        r["provenance"] = provenance
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    for r in results:
        print(r["config"])
        for name, us in r["us_per_call"].items():
            print(f"  {us:9.2f} us  {name}")


if __name__ == "__main__":
    main(sys.argv[1:])
