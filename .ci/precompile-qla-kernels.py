"""Build the bundled TileLang kernels for sm_90a into a TileLang cache on a machine without a GPU.

Why: every H200 session starts bare and device time is scarce; a TileLang compile costs 10-60 s of it
per variant. TileLang keys its disk cache on the kernel's TIR, the target and the pass configs, not on
the machine, so a cache filled here with the H200's target string is hit there (checked: the same key
and byte-identical sources as a host-built entry). Needs nvcc and an empty libcuda.so stub on
LIBRARY_PATH (.ci/run shows how); pack the result with `tar -C CACHE -czf ... tilelang`.

    TILELANG_CACHE_DIR=/tmp/tlc python .ci/precompile-qla-kernels.py [--shard I/N] [--only SUBSTR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# The target string TileLang resolves on an H200 (auto-detection there gives exactly this object).
os.environ.setdefault("TILELANG_DEFAULT_TARGET", '{"kind":"cuda","arch":"sm_90a"}')

HEAD_DIM = 128
SCALE = HEAD_DIM**-0.5


def variants() -> list[tuple[str, str, tuple]]:
    """(label, factory, args) for what the forward and backward APIs and the GPU tests launch in bf16."""
    from qla_kernels.gdn.api import KKT_IMPLS, agb_kkt_args
    from qla_kernels.gdn.bwd_api import CLUSTER_SUM_REVS, GRADS_FLAGS, LEAN_GRADS_REVS

    out: list[tuple[str, str, tuple]] = []
    for impl, (version, extra) in KKT_IMPLS.items():  # every stage-1 variant (the kkt GPU test times them all)
        both = impl in ("v2", "v3", "v3h", "v4", "v5", "v7", "v8", "v8r", "v9", "v9b")
        for dt in ("bfloat16", "float16") if both else ("bfloat16",):
            fname = {"v2": "kkt_solve_kernel", "v3m": "kkt_solve_v3_merged_kernel", "v7": "kkt_solve_v7_kernel",
                     "v8": "kkt_solve_v8_kernel", "v9": "kkt_solve_v9_kernel"}.get(
                version, "kkt_solve_v3_kernel"
            )
            out.append((f"kkt {impl} {dt}", fname, (HEAD_DIM, dt, *extra)))
    for impl in ("v3h", "v4", "v5"):  # profile builds (profile_fwd.profile_kkt)
        args = list(KKT_IMPLS[impl][1]) + [False] * (8 - len(KKT_IMPLS[impl][1]))
        args[4] = True
        out.append((f"kkt {impl} profile bfloat16", "kkt_solve_v3_kernel", (HEAD_DIM, "bfloat16", *args)))
    for dt in ("bfloat16", "float16"):  # stage 1 for ws10-ws12 (api._kkt_kernel with emit_agb)
        out.append((f"kkt v4 agb {dt}", "kkt_solve_v3_kernel", (HEAD_DIM, dt, *agb_kkt_args("v4"))))
    out.append(("kkt v4t agb bfloat16", "kkt_solve_v3_kernel", (HEAD_DIM, "bfloat16", *agb_kkt_args("v4t"))))
    for dt in ("bfloat16", "float16"):  # api.AGB_ONLY_KKT_IMPLS (session 26)
        out.append((f"kkt v10 agb {dt}", "kkt_solve_v10_kernel", (HEAD_DIM, dt)))
    out.append(("kkt v10 profile bfloat16", "kkt_solve_v10_kernel", (HEAD_DIM, "bfloat16", 4, False, True)))
    for rev in (4, 5, 6, 7, 8, 9):
        for bv in (128, 64, 32):
            for use_h0 in (True, False):
                args = (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", use_h0, False, bv, False, rev)
                out.append((f"ws rev{rev} bv{bv} h0={use_h0}", "fused_fwd_ws_kernel", args))
    for rev in (7, 8, 9):
        for use_h0 in (True, False):  # the fp16 forward tests run ws10 to ws12 at 128
            out.append((f"ws rev{rev} float16 bv128 h0={use_h0}", "fused_fwd_ws_kernel",
                        (HEAD_DIM, HEAD_DIM, SCALE, "float16", use_h0, False, 128, False, rev)))  # fmt: skip
    for dt, use_h0, v_first in (("bfloat16", True, False), ("bfloat16", False, False), ("bfloat16", True, True),
                                ("float16", True, False)):  # rev 7 as the forward tests and sweeps launch it
        for rev in (7, 8, 9):
            out.append((f"ws rev{rev} {dt} h0={use_h0} v_first={v_first}", "fused_fwd_ws7_kernel",
                        (HEAD_DIM, HEAD_DIM, SCALE, dt, use_h0, v_first, rev >= 8, False, rev >= 9)))  # fmt: skip
    for dt in ("bfloat16", "float16"):
        for use_h0 in (True, False):  # vs1 (fused_fwd_vs.py), as the forward tests and sweeps launch it
            out.append((f"vs1 {dt} h0={use_h0}", "fused_fwd_vs_kernel", (HEAD_DIM, HEAD_DIM, SCALE, dt, use_h0)))
            for name, precise in (("vs2", False), ("vs2p", True)):  # vs1 with stage 1 inside (api's vs2, vs2p)
                out.append((f"{name} {dt} h0={use_h0}", "fused_fwd_vs_kernel",
                            (HEAD_DIM, HEAD_DIM, SCALE, dt, use_h0, True, precise)))
            out.append((f"vs3 {dt} h0={use_h0}", "fused_fwd_vs_kernel",  # api's vs3: fast_gates, a keyword there
                        (HEAD_DIM, HEAD_DIM, SCALE, dt, use_h0, True, False, False, True)))
            out.append((f"vs4 {dt} h0={use_h0}", "fused_fwd_vs_kernel",  # api's vs4: fast_gates, fp16_inverse
                        (HEAD_DIM, HEAD_DIM, SCALE, dt, use_h0, True, False, False, True, True)))
    for name, fast, fp16 in (("vs2", False, False), ("vs3", True, False), ("vs4", True, True)):  # profile builds
        out.append((f"{name} profile", "fused_fwd_vs_kernel",
                    (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", True, True, False, True, fast, fp16)))  # fmt: skip
    for lean in (False, True):  # profile builds (profile_fwd.profile_fused_ws7)
        out.append((f"ws rev{9 if lean else 8} profile", "fused_fwd_ws7_kernel",
                    (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", True, False, True, True, lean)))  # fmt: skip
    # CP's one-kernel combine (api._combine_kernel; the default, then the A/B set)
    for rev, bv, th in ((2, 32, 128), (2, 32, 256), (2, 64, 128), (3, 32, 128), (3, 64, 128), (1, 64, 128)):
        for use_h0 in (True, False):
            out.append((f"cp combine rev{rev} bv{bv} t{th} h0={use_h0}", "cp_combine_kernel",
                        (HEAD_DIM, HEAD_DIM, bv, use_h0, False, rev, th)))  # fmt: skip
    for rev in (5, 7, 8, 9):
        for bv in (128, 64, 32):
            out.append((f"ws rev{rev} state pass bv{bv}", "fused_fwd_ws_kernel",
                        (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", False, False, bv, False, rev, True)))  # fmt: skip
    for rev in (5, 9):
        for bv in (128, 64, 32):
            for use_h0 in (True, False):  # bwd_api.chunk_states with $QLA_BWD_STATES=ws5 (rev 5) or ws12 (rev 9)
                args = (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", use_h0, False, bv, False, rev, False, True)
                out.append((f"ws rev{rev} state store bv{bv} h0={use_h0}", "fused_fwd_ws_kernel", args))
    out.append(("bwd agb bfloat16", "agb_from_a0_kernel", ("bfloat16",)))  # ws12's Agb from A0 (bwd/agb.py)
    for rev, bv in ((r, b) for r in (4, 5, 7, 8, 9) for b in (128, 32)):  # test_profile_phases's builds
        out.append((f"ws rev{rev} profile bv{bv}", "fused_fwd_ws_kernel",
                    (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", True, False, bv, True, rev)))  # fmt: skip
    for bv in (128, 64, 32):
        for use_h0 in (True, False):
            out.append((f"v2 bv{bv} h0={use_h0}", "fused_fwd_kernel",
                        (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", use_h0, False, bv)))  # fmt: skip
    for bv in (128, 64, 32):
        for use_dht in (True, False):
            for rev2 in (False, True) if bv <= 64 else (False,):  # bwd_api runs rev1 at 128 (rev2 spills)
                out.append((f"bwd dstate chain {'rev2' if rev2 else 'rev1'} bv{bv} dht={use_dht}", "bwd_dstate_kernel",
                            (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", use_dht, bv, 256, False, rev2)))  # fmt: skip
    for rev in ("rev3", "rev4", "rev5"):  # stage 1 rev3-rev5 (bwd_api runs them at 32 and 64), their parallel part
        for bv in (64, 32):
            for use_dht in (True, False):
                out.append((f"bwd dstate chain {rev} bv{bv} dht={use_dht}", "bwd_dstate_kernel",
                            (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", use_dht, bv, 256, False, True, 2, True,
                             rev != "rev3", rev == "rev5")))  # fmt: skip
    for bv in (64, 32):  # the fused backward's pass A (bwd_api._bwd_fused: rev4, from zero, no dS' stored)
        out.append((f"bwd dstate chain rev4 bv{bv} pass A", "bwd_dstate_kernel",
                    (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", False, bv, 256, False, True, 2, True, True, False,
                     False)))  # fmt: skip
    out.append(("bwd dvl wk", "bwd_dvl_wk_kernel", (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16")))
    for rev in ("rev4", "rev6", "rev7", "rev8"):  # what bwd_api runs with stage 1 rev3 (dv written by stage 2)
        threads, *flags = GRADS_FLAGS[rev]
        out.append((f"bwd chunk grads {rev} store dv", "bwd_chunk_grads_kernel",
                    (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", threads, False, False, *flags, True)))  # fmt: skip
    for dt, ratio in (("bfloat16", 2), ("bfloat16", 1), ("float16", 2)):  # rev9: the group's sums from stage 2
        threads, *flags = GRADS_FLAGS["rev9"]
        label = f"{'fp16 ' if dt == 'float16' else ''}bwd chunk grads rev9 store dv r{ratio}"
        args = (HEAD_DIM, HEAD_DIM, SCALE, dt, threads, False, False, *flags, True, True, ratio)
        out.append((label, "bwd_chunk_grads_kernel", args))
        if ratio == 2:  # rev10 (pair_early); at ratio 1 it is rev9's build
            label = label.replace("rev9", "rev10")
            out.append((label, "bwd_chunk_grads_kernel", (*args, False, True)))
    for rev, (base, extra) in LEAN_GRADS_REVS.items():  # stage 2 rev 12, rev 13: rev 8's flags and lean
        threads, *flags = GRADS_FLAGS[base]
        for dt in ("bfloat16", "float16"):
            out.append((f"{'fp16 ' if dt == 'float16' else ''}bwd chunk grads {rev} store dv", "bwd_chunk_grads_kernel",
                        (HEAD_DIM, HEAD_DIM, SCALE, dt, threads, False, False, *flags, True, False, 2, False, False,
                         extra["lean"], extra.get("dg_i2", False))))  # fmt: skip
    threads, tile, hoist, tma, dw_beta, gamma_frag, _ds_tma, scan = GRADS_FLAGS["rev8"]
    for dt in ("bfloat16", "float16"):  # the fused backward (bwd_api._fused_walk: rev 12's math, dS' not by TMA)
        out.append((f"{'fp16 ' if dt == 'float16' else ''}bwd fused walk", "bwd_chunk_grads_kernel",
                    (HEAD_DIM, HEAD_DIM, SCALE, dt, threads, False, False, tile, hoist, tma, dw_beta, gamma_frag, False,
                     scan, True, False, 2, False, False, True, False, True)))  # fmt: skip
    out.append(("bwd fused walk prefetch", "bwd_chunk_grads_kernel",
                (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", threads, False, False, tile, hoist, tma, dw_beta, gamma_frag,
                 False, scan, True, False, 2, False, False, True, False, True, True)))  # fmt: skip
    out.append(("bwd fused walk profile", "bwd_chunk_grads_kernel",  # profile_bwd --fused
                (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", threads, False, True, tile, hoist, tma, dw_beta, gamma_frag,
                 False, scan, True, False, 2, False, False, True, False, True)))  # fmt: skip
    for dt in ("bfloat16", "float16"):  # the warp-specialised fused backward ($QLA_BWD_FUSED=ws, bwd_api._fused_walk)
        out.append((f"{'fp16 ' if dt == 'float16' else ''}bwd fused ws", "bwd_fused_ws_kernel",
                    (HEAD_DIM, HEAD_DIM, SCALE, dt)))  # fmt: skip
    out.append(("bwd fused ws2", "bwd_fused_ws_kernel", (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", False, False, True)))
    for aside in (False, True):
        out.append((f"bwd fused ws{'2' if aside else ''} profile", "bwd_fused_ws_kernel",
                    (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", False, True, aside)))  # fmt: skip
    for dt in ("bfloat16", "float16"):  # $QLA_BWD_FUSED=ws3: the early-release schedule
        out.append((f"{'fp16 ' if dt == 'float16' else ''}bwd fused ws3", "bwd_fused_ws_kernel",
                    (HEAD_DIM, HEAD_DIM, SCALE, dt, False, False, False, True)))  # fmt: skip
    out.append(("bwd fused ws3 profile", "bwd_fused_ws_kernel",
                (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", False, True, False, True)))  # fmt: skip
    for dt in ("bfloat16", "float16"):  # stage 2 rev 11 (bwd_api.WS_GRADS_REVS: its own program)
        out.append((f"{'fp16 ' if dt == 'float16' else ''}bwd chunk grads rev11 ws", "bwd_chunk_grads_ws_kernel",
                    (HEAD_DIM, HEAD_DIM, SCALE, dt)))  # fmt: skip
    threads, *flags = GRADS_FLAGS["rev8"]  # tests/gpu/test_qla_bwd.py's timing of the cluster launch alone
    args = (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", threads, False, False, *flags, True, False, 2, True)
    out.append(("bwd chunk grads rev8 store dv cluster probe", "bwd_chunk_grads_kernel", args))
    for rev, (threads, *flags) in GRADS_FLAGS.items():
        if rev in CLUSTER_SUM_REVS:  # per value head it is the revision before it (rev8), built above
            continue
        for prof in (False, True):
            out.append((f"bwd chunk grads {rev}{' profile' if prof else ''}", "bwd_chunk_grads_kernel",
                        (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", threads, False, prof, *flags)))  # fmt: skip
    # the GPU tests' one fp16 case (gva2_many_short_fp16: h0, V-slice 32) through the newer backward kernels
    out.append(("fp16 ws rev5 state store bv32 h0=True", "fused_fwd_ws_kernel",
                (HEAD_DIM, HEAD_DIM, SCALE, "float16", True, False, 32, False, 5, False, True)))  # fmt: skip
    for rev in ("rev4", "rev5"):
        threads, *flags = GRADS_FLAGS[rev]
        out.append((f"fp16 bwd chunk grads {rev}", "bwd_chunk_grads_kernel",
                    (HEAD_DIM, HEAD_DIM, SCALE, "float16", threads, False, False, *flags)))  # fmt: skip
    for rev in ("rev4", "rev6", "rev7", "rev8"):
        threads, *flags = GRADS_FLAGS[rev]
        out.append((f"fp16 bwd chunk grads {rev} store dv", "bwd_chunk_grads_kernel",
                    (HEAD_DIM, HEAD_DIM, SCALE, "float16", threads, False, False, *flags, True)))  # fmt: skip
    out.append(("fp16 bwd dvl wk", "bwd_dvl_wk_kernel", (HEAD_DIM, HEAD_DIM, SCALE, "float16")))
    for dt in ("bfloat16", "float16"):  # bwd_api._group_sums with $QLA_BWD_GROUP_SUM=kernel
        out.append((f"bwd group sum {dt}", "gva_group_sum_kernel", (HEAD_DIM, dt)))
    for rev in ("rev3", "rev4", "rev5"):
        args = (HEAD_DIM, HEAD_DIM, SCALE, "float16", True, 32, 256, False, True, 2, True, rev != "rev3", rev == "rev5")
        out.append((f"fp16 bwd dstate chain {rev} bv32 dht=True", "bwd_dstate_kernel", args))
    for use_h0 in (True, False):  # bwd_api.chunk_states: the v2 forward storing every chunk's start state
        out.append((f"v2 state store bv32 h0={use_h0}", "fused_fwd_kernel",
                    (HEAD_DIM, HEAD_DIM, SCALE, "bfloat16", use_h0, False, 32, 256, 2, True)))  # fmt: skip
    return out


def factory(name: str):
    from qla_kernels.gdn.bwd import agb, chunk_grads, chunk_grads_ws, dstate_chain, dvl_wk, fused_ws, group_sum
    from qla_kernels.gdn.fwd import (
        cp_combine,
        fused_fwd,
        fused_fwd_vs,
        fused_fwd_ws,
        fused_fwd_ws7,
        kkt_solve,
        kkt_solve_v3,
        kkt_solve_v7,
        kkt_solve_v8,
        kkt_solve_v9,
        kkt_solve_v10,
    )

    modules = (kkt_solve, kkt_solve_v3, kkt_solve_v7, kkt_solve_v8, kkt_solve_v9, kkt_solve_v10, fused_fwd_ws,
               fused_fwd_ws7, fused_fwd_vs, fused_fwd, cp_combine, dstate_chain, chunk_grads, chunk_grads_ws, dvl_wk,
               group_sum, agb, fused_ws)  # fmt: skip
    for mod in modules:
        if hasattr(mod, name):
            return getattr(mod, name)
    raise KeyError(name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shard", default="0/1", help="I/N: build every N-th variant starting at I")
    ap.add_argument("--only", default="", help="build only variants whose label contains this")
    opts = ap.parse_args()
    i, n = (int(x) for x in opts.shard.split("/"))
    if "TILELANG_CACHE_DIR" not in os.environ:
        print("set TILELANG_CACHE_DIR to the cache to fill", file=sys.stderr)
        return 2
    todo = [v for j, v in enumerate(variants()) if j % n == i and opts.only in v[0]]
    failed = 0
    for label, fname, args in todo:
        t0 = time.time()
        try:
            factory(fname)(*args)
            print(f"built {label} in {time.time() - t0:.1f} s", flush=True)
        except Exception as e:  # report and go on: one bad variant must not stop the rest
            failed += 1
            print(f"FAILED {label}: {type(e).__name__}: {str(e)[:500]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
