"""Offline build check: lower a TileLang program for sm_90a and compile it with nvcc, no GPU needed.

Used by the CPU compile test and to read registers, spills and shared memory before spending GPU time.
TileLang's own JIT compiles and then loads the library (which needs a driver); this stops after ptxas.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

SM90A = {"kind": "cuda", "arch": "sm_90a"}


@dataclass(frozen=True)
class BuildReport:
    """What ptxas says about one kernel, plus TileLang's dynamic shared memory request."""

    name: str
    registers: int
    spill_stores: int
    spill_loads: int
    dyn_smem_bytes: int
    source: str
    # ptxas C7512: "wgmma.mma_async instructions are serialized due to insufficient register resources"; C7511 and
    # the other C751x codes give other reasons (an accumulator live across a wait: session 28's review)
    # (no spill is reported, but every wgmma waits for the previous one: session 12's first ws10 build)
    wgmma_serialized: bool = False
    # bytes of SASS (the cubin's .text sections): session 21's rev 11 (155 KB against rev 8's 98 KB) lost 24 % of
    # its issue slots to instruction fetch, so warp-specialised builds need this number as much as registers
    code_bytes: int = -1
    # the cubin itself (build_sm90a(..., lineinfo=True) only): sass_stats reads it with nvdisasm
    cubin: bytes | None = None

    def line(self) -> str:
        return (f"{self.name}: {self.registers} regs, spills {self.spill_stores}/{self.spill_loads} B "
                f"(st/ld), dyn smem {self.dyn_smem_bytes / 1024:.1f} KiB, code {self.code_bytes / 1024:.0f} KiB"
                + (", wgmma SERIALIZED (ptxas C7512)" if self.wgmma_serialized else ""))


def text_bytes(elf: bytes) -> int:
    """Total size of the .text.* sections of an ELF64 image (a cubin): the kernels' machine code."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise ValueError("not an ELF64 image")
    shoff = int.from_bytes(elf[0x28:0x30], "little")
    shentsize = int.from_bytes(elf[0x3A:0x3C], "little")
    shnum = int.from_bytes(elf[0x3C:0x3E], "little")
    shstrndx = int.from_bytes(elf[0x3E:0x40], "little")

    def section(i: int) -> tuple[int, int, int]:  # (name offset, file offset, size)
        h = elf[shoff + i * shentsize : shoff + (i + 1) * shentsize]
        return (int.from_bytes(h[0:4], "little"), int.from_bytes(h[24:32], "little"),
                int.from_bytes(h[32:40], "little"))  # fmt: skip

    names_at = section(shstrndx)[1]
    total = 0
    for i in range(shnum):
        name_off, _, size = section(i)
        end = elf.index(b"\0", names_at + name_off)
        if elf[names_at + name_off : end].startswith(b".text."):
            total += size
    return total


def nvcc_available() -> str | None:
    return shutil.which("nvcc")


def lower_sm90a(prim_func, pass_configs: dict | None = None):
    """TileLang lowering for sm_90a under an explicit target context (no device query)."""
    import tilelang
    from tilelang import tvm

    target = tvm.target.Target(SM90A)
    with tvm.transform.PassContext(config=pass_configs or {}), target:
        return tilelang.lower(prim_func, target=target)


def build_sm90a(prim_func, pass_configs: dict | None = None, fast_math: bool = True,
                lineinfo: bool = False) -> BuildReport:
    """Lower and compile to a cubin with ptxas -v; raise RuntimeError with nvcc's output on failure.
    lineinfo: compile with -lineinfo and keep the cubin in the report, so each SASS instruction can be tied to
    a line of the generated CUDA (sass_stats); -lineinfo leaves the code alone (vs2: same registers, spills and
    code size with and without it)."""
    import tilelang.env as tl_env

    art = lower_sm90a(prim_func, pass_configs)
    src = art.kernel_source
    smem = 0
    name = "kernel"
    for gv, f in art.device_mod.functions.items():
        smem = max(smem, int(f.attrs.get("dyn_shared_memory_buf", 0) or 0))
        name = gv.name_hint
    nvcc = nvcc_available()
    if nvcc is None:
        raise RuntimeError("nvcc not found on PATH")
    with tempfile.TemporaryDirectory() as d:
        cu = os.path.join(d, "k.cu")
        with open(cu, "w") as fh:
            fh.write(src)
        cmd = [nvcc, "-std=c++20", "-w", "-Xcudafe", "--diag_suppress=177", "--cubin", "-O3",
               "-gencode", "arch=compute_90a,code=sm_90a", "-Xptxas", "-v",
               f"-I{tl_env.TILELANG_TEMPLATE_PATH}", f"-I{tl_env.CUTLASS_INCLUDE_DIR}",
               cu, "-o", os.path.join(d, "k.cubin")]
        if fast_math:
            cmd.append("--use_fast_math")
        if lineinfo:
            cmd.append("-lineinfo")
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        code, cubin = -1, None
        if res.returncode == 0:
            with open(os.path.join(d, "k.cubin"), "rb") as fh:
                cubin = fh.read()
            code = text_bytes(cubin)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed ({res.returncode}):\n{res.stderr[-4000:]}")
    regs = re.search(r"Used (\d+) registers", res.stderr)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", res.stderr)
    return BuildReport(
        name=name,
        registers=int(regs.group(1)) if regs else -1,
        spill_stores=int(spill.group(1)) if spill else -1,
        spill_loads=int(spill.group(2)) if spill else -1,
        dyn_smem_bytes=smem,
        source=src,
        wgmma_serialized=bool(re.search(r"C751\d|serializ", res.stderr)),
        code_bytes=code,
        cubin=cubin if lineinfo else None,
    )


def main() -> None:
    """Print a build report for the forward kernels on the common head configs."""
    from .fwd.fused_fwd import PASS_CONFIGS as FUSED_PC
    from .fwd.fused_fwd import fused_fwd_program
    from .fwd.kkt_solve import PASS_CONFIGS as KKT_PC
    from .fwd.kkt_solve import kkt_solve_program
    from .fwd.kkt_solve_v3 import PASS_CONFIGS as KKT3_PC
    from .fwd.kkt_solve_v3 import kkt_solve_v3_program

    print(f"{'v2':<8}" + build_sm90a(kkt_solve_program(128, "bfloat16"), KKT_PC).line())
    print(f"{'v2-scan':<8}" + build_sm90a(kkt_solve_program(128, "bfloat16", True), KKT_PC).line())
    for label, precise, min_blocks in (("v3", True, 6), ("v3-mb0", True, 0), ("v3-tf32", False, 6)):
        rep = build_sm90a(kkt_solve_v3_program(128, "bfloat16", precise, min_blocks), KKT3_PC)
        print(f"{label:<8}" + rep.line())
    print(build_sm90a(fused_fwd_program(128, 128, 128**-0.5, "bfloat16", True), FUSED_PC).line())


if __name__ == "__main__":
    main()
