"""Session 28 smoke: the whole backward with QLA_BWD_FUSED in (0, ws, ws2) on small ragged inputs; prints each
gradient's relative difference to the staged backward (0), then times the backward alone (cuda events, median of
N calls, L2 flushed) per mode on the given configs. Dev script: claims come from the harness rows."""
import json, os, sys, time
import torch
import torch.nn.functional as F
from qla_kernels import chunk_gated_delta_rule

out_path = sys.argv[1]
modes = sys.argv[2].split(",")
res = {"device": torch.cuda.get_device_name(), "checks": {}, "timing_ms": {}}

def inputs(h_qk, h_v, lens, seed=0):
    t = sum(lens)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen)
    q = F.normalize(r(1, t, h_qk, 128), dim=-1).bfloat16()
    k = F.normalize(r(1, t, h_qk, 128), dim=-1).bfloat16()
    v = r(1, t, h_v, 128).bfloat16()
    g = F.logsigmoid(r(1, t, h_v)) / 16
    g[..., 0] = 0.0
    beta = torch.sigmoid(r(1, t, h_v))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    do = r(1, t, h_v, 128).bfloat16()
    dht = r(len(lens), h_v, 128, 128)
    return q, k, v, g, beta, cu, do, dht

def grads(mode, args):
    os.environ["QLA_BWD_FUSED"] = mode
    q, k, v, g, beta, cu, do, dht = args
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, g, beta)]
    o, ht = chunk_gated_delta_rule(*leaves, output_final_state=True, cu_seqlens=cu)
    ((o.float() * do.float()).sum() + (ht * dht).sum()).backward()
    torch.cuda.synchronize()
    return {n: x.grad.float() for n, x in zip(("dq", "dk", "dv", "dg", "dbeta"), leaves)}

args = inputs(2, 4, [150, 1000, 64, 1])
ref = grads("0", args)
for m in modes:
    if m == "0":
        continue
    t0 = time.time()
    got = grads(m, args)
    res["checks"][m] = {n: ((got[n] - ref[n]).norm() / ref[n].norm()).item() for n in ref}
    res["checks"][m]["wall_s"] = round(time.time() - t0, 1)
    print(m, res["checks"][m], flush=True)
json.dump(res, open(out_path, "w"), indent=1)

from qla_kernels.gdn import bwd_api
from qla_kernels.gdn.api import chunk_gated_delta_rule_fwd
flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
for name, (hq, hv, lens) in {"16/32 8192x4": (16, 32, [8192] * 4), "16/32 1x32768": (16, 32, [32768]),
                             "2/4 1x8192": (2, 4, [8192]), "8/16 2048x8": (8, 16, [2048] * 8)}.items():
    q, k, v, g, beta, cu, do, dht = inputs(hq, hv, lens)
    fwd = chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu_seqlens=cu)
    for m in modes:
        os.environ["QLA_BWD_FUSED"] = m
        call = lambda: bwd_api.chunk_gated_delta_rule_bwd(q, k, v, fwd.g_cumsum, beta, fwd.a0, do, dht,
                                                          cu_seqlens=cu)
        try:
            call(); call(); torch.cuda.synchronize()
            ts = []
            for _ in range(15):
                flush.zero_()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); call(); b.record(); torch.cuda.synchronize()
                ts.append(a.elapsed_time(b))
            ts.sort()
            res["timing_ms"].setdefault(name, {})[m] = round(ts[len(ts) // 2], 3)
        except Exception as e:  # noqa: BLE001
            res["timing_ms"].setdefault(name, {})[m] = f"error: {e!r}"[:300]
        print(name, m, res["timing_ms"][name][m], flush=True)
        json.dump(res, open(out_path, "w"), indent=1)
