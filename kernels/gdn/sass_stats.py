"""Static SASS instruction counts per chunk loop of a TileLang kernel, read on a machine without a GPU.

Why: the warp-specialised kernels are bound by latency or by issue, not by bytes (NOTES.md: vs2's auxiliary
warpgroup, stage 2, the fused backward walk), and how many instructions of which kind each warpgroup's loop
carries per chunk (integer index arithmetic, shared-memory traffic, tensor-core, barriers, spills) is the first
thing to read before spending device time on a profile build. nvcc -lineinfo ties every instruction to a line of
TileLang's generated CUDA, and the loops over chunks are found in that source: one per warpgroup role. The
counts are static (one pass through each loop body); TileLang unrolls the per-chunk work, so they are close to
the instructions a warp issues per chunk.

    python -m qla_kernels.gdn.sass_stats [NAME ...]      (NAMES lists the builds; nvcc and nvdisasm needed)

nvdisasm comes with the CUDA toolkit or the nvidia-cuda-nvdisasm wheel (the `compile` extra installs it).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

# opcode (before the first '.') -> class; anything else counts under "other"
OPCODE_CLASSES = {
    "int": ("IMAD", "IADD3", "IADD", "VIADD", "LOP3", "SHF", "LEA", "ISETP", "SEL", "PLOP3", "MOV", "IABS", "SGXT",
            "PRMT", "IMNMX", "VIMNMX", "BMSK", "FLO", "POPC", "I2F", "F2I", "I2FP", "F2IP", "P2R", "R2P", "R2UR",
            "S2R", "S2UR", "CS2R", "LDC", "ULDC", "UIADD3", "UMOV", "ULOP3", "USHF", "ULEA", "UIMAD", "UISETP",
            "USEL", "UPRMT", "UPLOP3", "VIADDMNMX"),
    "fp": ("FFMA", "FMUL", "FADD", "FSEL", "FSETP", "FMNMX", "F2FP", "F2F", "MUFU", "FCHK", "HADD2", "HFMA2",
           "HMUL2", "FSWZADD"),
    "shared_load": ("LDS", "LDSM"),
    "shared_store": ("STS", "STSM"),
    "global": ("LDG", "STG", "RED", "REDG", "ATOM", "ATOMG", "UTMALDG", "UTMASTG", "UBLKCP", "UTMAPF"),
    "spill": ("LDL", "STL"),
    "tensor": ("HGMMA", "HMMA", "WARPGROUP"),
    "sync": ("BAR", "SYNCS", "MEMBAR", "FENCE", "DEPBAR", "ERRBAR", "CCTL", "UTMACMDFLUSH"),
    "control": ("BRA", "BSSY", "BSYNC", "EXIT", "CALL", "RET", "NOP", "YIELD", "WARPSYNC", "BREAK", "ELECT", "VOTE",
                "VOTEU", "SHFL", "NANOSLEEP", "ACQBULK", "PREEXIT"),
}  # fmt: skip
_CLASS_OF = {op: cls for cls, ops in OPCODE_CLASSES.items() for op in ops}
CLASSES = (*OPCODE_CLASSES, "other")

_LINE_MARK = re.compile(r'//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?')
_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
_CHUNK_LOOP = re.compile(r"for \(int (\w+) = 0; \1 < (n_chunks|n_iter)\w*;")


def opcode_class(opcode: str) -> str:
    """The class of a SASS opcode ("IMAD.WIDE" -> "int"); "other" for anything not listed."""
    return _CLASS_OF.get(opcode.split(".")[0], "other")


@dataclass(frozen=True)
class LoopStats:
    """Instruction counts of one chunk loop (lines first..last of the generated CUDA, 1-based)."""

    first: int
    last: int
    counts: Counter

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def line(self) -> str:
        parts = ", ".join(f"{c} {self.counts[c]}" for c in CLASSES if self.counts[c])
        return f"lines {self.first}-{self.last}: {self.total} instructions ({parts})"


def chunk_loops(source: str) -> list[tuple[int, int]]:
    """(first, last) 1-based lines of every loop over chunks (`for (int c = 0; c < n_chunks...`) in TileLang's
    generated CUDA, found by brace depth from the `for` line."""
    lines = source.splitlines()
    out = []
    for i, text in enumerate(lines):
        if not _CHUNK_LOOP.search(text):
            continue
        depth, opened = 0, False
        for j in range(i, len(lines)):
            depth += lines[j].count("{") - lines[j].count("}")
            opened = opened or lines[j].count("{") > 0
            if opened and depth <= 0:
                out.append((i + 1, j + 1))
                break
        else:
            raise ValueError(f"unbalanced braces after line {i + 1}")
    return out


def line_counts(sass: str, source_name: str) -> dict[int, Counter]:
    """Per line of the source named source_name (a basename), the classes of the instructions nvdisasm -gi
    attributes to it. An instruction of a header inlined straight into the source goes to its call site (the
    marker's "inlined at" line); one inlined more deeply goes to the last source line seen before it, in code
    order. Everything after the last unpredicated EXIT goes to line 0: nvcc places out-of-line code there (the
    mbarrier waits' slow retry paths), which runs only while a wait spins, not once a chunk."""
    lines = sass.splitlines()
    exits = [i for i, text in enumerate(lines)
             if (ins := _INSTRUCTION.match(text)) and ins.group(2) == "EXIT" and not ins.group(1)]
    tail = max(exits, default=len(lines))
    counts: dict[int, Counter] = {}
    line = 0
    for i, text in enumerate(lines):
        mark = _LINE_MARK.search(text)
        if mark:
            if os.path.basename(mark.group(1)) == source_name:
                line = int(mark.group(2))
            elif mark.group(3) and os.path.basename(mark.group(3)) == source_name:
                line = int(mark.group(4))
            continue
        ins = _INSTRUCTION.match(text)
        if ins:
            counts.setdefault(line if i <= tail else 0, Counter())[opcode_class(ins.group(2))] += 1
    return counts


def loop_stats(source: str, sass: str, source_name: str) -> list[LoopStats]:
    """LoopStats of every chunk loop of source (inner chunk loops are counted in their outer loop too)."""
    per_line = line_counts(sass, source_name)
    out = []
    for first, last in chunk_loops(source):
        total: Counter = Counter()
        for ln in range(first, last + 1):
            total.update(per_line.get(ln, {}))
        out.append(LoopStats(first, last, total))
    return out


def find_nvdisasm() -> str | None:
    """nvdisasm on PATH, next to nvcc, or from the nvidia-cuda-nvdisasm wheel (nvidia/cu*/bin)."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    nvcc = shutil.which("nvcc")
    if nvcc and os.access(os.path.join(os.path.dirname(nvcc), "nvdisasm"), os.X_OK):
        return os.path.join(os.path.dirname(nvcc), "nvdisasm")
    try:
        import nvidia  # namespace package of NVIDIA's CUDA wheels
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for cand in sorted(glob.glob(os.path.join(root, "cu*", "bin", "nvdisasm"))):
            if os.access(cand, os.X_OK):
                return cand
    return None


def disassemble(cubin: bytes, nvdisasm: str | None = None) -> str:
    """nvdisasm -gi -c of a cubin (line info, with inlined call sites, as `//## File ...` comments)."""
    tool = nvdisasm or find_nvdisasm()
    if tool is None:
        raise RuntimeError("nvdisasm not found: install the CUDA toolkit or `pip install nvidia-cuda-nvdisasm`")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        res = subprocess.run([tool, "-gi", "-c", fh.name], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"nvdisasm failed ({res.returncode}): {res.stderr[-2000:]}")
    return res.stdout


def build_stats(prim_func, pass_configs: dict | None = None) -> tuple[object, list[LoopStats]]:
    """(build report, per-chunk-loop stats) of a TileLang program built for sm_90a with line info."""
    from .build import build_sm90a

    rep = build_sm90a(prim_func, pass_configs, lineinfo=True)
    return rep, loop_stats(rep.source, disassemble(rep.cubin), "k.cu")


def _vs(solve: bool, fast_gates: bool = False, fp16_inverse: bool = False) -> tuple[object, dict]:
    from .fwd.fused_fwd_vs import PASS_CONFIGS, fused_fwd_vs_program

    extra = {"fp16_inverse": True} if fp16_inverse else {}
    return (fused_fwd_vs_program(128, 128, 128**-0.5, "bfloat16", True, solve, fast_gates=fast_gates, **extra),
            PASS_CONFIGS)  # fmt: skip


def _ws12() -> tuple[object, dict]:
    from .fwd.fused_fwd_ws import PASS_CONFIGS, fused_fwd_ws_program

    return fused_fwd_ws_program(128, 128, 128**-0.5, "bfloat16", True, block_v=128, rev=9), PASS_CONFIGS


def _fused_walk() -> tuple[object, dict]:
    from .bwd.chunk_grads import MERGED_PASS_CONFIGS, bwd_chunk_grads_program
    from .bwd_api import fused_walk_program_args

    args, kwargs = fused_walk_program_args(128**-0.5, "bfloat16")
    return bwd_chunk_grads_program(*args, **kwargs), MERGED_PASS_CONFIGS


def _fused_ws(early_release: bool = False) -> tuple[object, dict]:
    from .bwd.fused_ws import PASS_CONFIGS, bwd_fused_ws_program

    return bwd_fused_ws_program(128, 128, 128**-0.5, "bfloat16", early_release=early_release), PASS_CONFIGS


# name -> (what it is, program factory)
NAMES: dict[str, tuple[str, Callable[[], tuple[object, dict]]]] = {
    "vs1": ("forward, state split over two warpgroups, Agb from stage 1", lambda: _vs(False)),
    "vs2": ("vs1 with the inverse in the auxiliary warpgroup", lambda: _vs(True)),
    "vs3": ("vs2 with the gate scan by warp shuffles under Q K^T", lambda: _vs(True, True)),
    "vs4": ("vs3 with kkt v10's inverse (gate inside L', fp16 whole-tile doublings)", lambda: _vs(True, True, True)),
    "ws12": ("forward's default fused kernel (rev 9, BV = 128)", _ws12),
    "fused-walk": ("the fused backward walk ($QLA_BWD_FUSED=1)", _fused_walk),
    "fused-ws": ("the warp-specialised fused backward ($QLA_BWD_FUSED=ws)", _fused_ws),
    "fused-ws3": ("the same on the early-release schedule ($QLA_BWD_FUSED=ws3)", lambda: _fused_ws(True)),
}


def main(argv: list[str]) -> None:
    names = argv or list(NAMES)
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise SystemExit(f"unknown build(s) {unknown}; accepted: {list(NAMES)}")
    for name in names:
        what, factory = NAMES[name]
        rep, loops = build_stats(*factory())
        print(f"{name} ({what}): {rep.line()}")
        for loop in loops:
            print(f"  {loop.line()}")


if __name__ == "__main__":
    main(sys.argv[1:])
