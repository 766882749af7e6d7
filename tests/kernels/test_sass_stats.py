"""sass_stats: chunk loops found in generated CUDA, instructions attributed to them, opcode classes; and (compile
marker) one real build read end to end."""

import importlib.util
import re

import pytest

from qla_kernels.gdn.sass_stats import (
    CLASSES,
    chunk_loops,
    line_counts,
    loop_stats,
    opcode_class,
)

SOURCE = """\
extern "C" __global__ void k(int n_chunks) {
  if (threadIdx.x < 128) {
    for (int c = 0; c < n_chunks; ++c) {
      x = 1;
      if (y) {
        z = 2;
      }
    }
  } else {
    for (int c_1 = 0; c_1 < n_chunks; ++c_1) {
      w = 3;
    }
  }
  for (int i = 0; i < 4; ++i) {
    v = 4;
  }
}
"""

SASS = """\
\t//## File "/tmp/x/k.cu", line 1
        /*0000*/                   S2R R0, SR_TID.X ;
\t//## File "/tmp/x/k.cu", line 4
        /*0010*/                   IMAD.WIDE R2, R0, 0x4, R2 ;
        /*0020*/              @!P0 LDS R4, [R2] ;
\t//## File "/usr/include/cute/arch/mma_sm90.hpp", line 99
        /*0030*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
\t//## File "/tmp/x/k.cu", line 6
        /*0040*/                   FFMA R5, R4, R4, R5 ;
\t//## File "/tmp/x/k.cu", line 11
        /*0050*/                   STL [R1], R5 ;
        /*0060*/                   BAR.SYNC.DEFER_BLOCKING 0x1, 0x80 ;
\t//## File "/tmp/x/k.cu", line 15
        /*0070*/                   FOOBAR R1 ;
\t//## File "/usr/include/tl/gemm.h", line 7 inlined at "/tmp/x/k.cu", line 5
        /*0080*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
\t//## File "/usr/include/tl/barrier.h", line 9 inlined at "/usr/include/tl/intrin.h", line 3
        /*0090*/                   SYNCS.ARRIVE.TRANS64 RZ, [UR4], RZ ;
\t//## File "/tmp/x/k.cu", line 16
        /*00a0*/               @P0 EXIT ;
        /*00b0*/                   EXIT ;
\t//## File "/usr/include/tl/barrier.h", line 12 inlined at "/usr/include/tl/intrin.h", line 3
        /*00c0*/                   NANOSLEEP 0x20 ;
        /*00d0*/                   BRA `(.L_x_1) ;
"""


def test_chunk_loops_by_brace_depth():
    assert chunk_loops(SOURCE) == [(3, 8), (10, 12)]


def test_chunk_loops_take_the_fused_walk_loop_name():
    src = "void f() {\n  for (int it = 0; it < n_iter; ++it) {\n    a = 1;\n  }\n}\n"
    assert chunk_loops(src) == [(2, 4)]


def test_chunk_loops_reject_unbalanced_source():
    with pytest.raises(ValueError, match="unbalanced"):
        chunk_loops("for (int c = 0; c < n_chunks; ++c) {\n  x = 1;\n")


def test_opcode_classes():
    assert opcode_class("IMAD.WIDE") == "int"
    assert opcode_class("LDSM") == "shared_load"
    assert opcode_class("STL") == "spill"
    assert opcode_class("HGMMA") == "tensor"
    assert opcode_class("MUFU") == "fp"
    assert opcode_class("FOOBAR") == "other"
    assert "other" in CLASSES


def test_instructions_go_to_the_last_line_of_the_source_seen():
    per_line = line_counts(SASS, "k.cu")
    assert per_line[1] == {"int": 1}
    # the header's HGMMA is inlined at line 4's call site; a predicated LDS still counts
    assert per_line[4] == {"int": 1, "shared_load": 1, "tensor": 1}
    assert per_line[6] == {"fp": 1}
    assert per_line[11] == {"spill": 1, "sync": 1}
    assert per_line[15] == {"other": 1}
    # a header inlined straight into the source goes to its call site; one inlined deeper, to the last line seen
    assert per_line[5] == {"tensor": 1, "sync": 1} and per_line[16] == {"control": 2}


def test_code_after_an_unpredicated_exit_goes_to_no_line():
    """nvcc puts the mbarrier waits' slow paths after the kernel's last EXIT; in code order they would land in
    whatever loop came last (the producer's, in vs2)."""
    per_line = line_counts(SASS, "k.cu")
    assert per_line[0] == {"control": 2}  # NANOSLEEP, BRA: after the last unpredicated EXIT
    assert sum(c.total() for c in per_line.values()) == 14


def test_loop_stats_sum_their_lines():
    first, second = loop_stats(SOURCE, SASS, "k.cu")
    assert (first.first, first.last, first.total) == (3, 8, 6)
    assert first.counts["tensor"] == 2 and first.counts["fp"] == 1
    assert (second.total, second.counts["spill"]) == (2, 1)
    assert "2 instructions" in second.line()


@pytest.mark.compile
def test_vs2_loops_read_from_a_real_build():
    """vs2's four warpgroups each have a chunk loop; only the two state warpgroups' and the auxiliary's carry
    wgmma, and the counts are a part of the whole kernel's instructions."""
    from qla_kernels.gdn.build import nvcc_available
    from qla_kernels.gdn.sass_stats import NAMES, build_stats, disassemble, find_nvdisasm, loop_stats

    if importlib.util.find_spec("tilelang") is None or nvcc_available() is None or find_nvdisasm() is None:
        pytest.skip("needs nvcc and nvdisasm (the compile extra's nvidia-cuda-nvdisasm)")
    rep, loops = build_stats(*NAMES["vs2"][1]())
    assert len(loops) == 4
    loader, state0, state1, aux = loops
    assert loader.counts["tensor"] == 0
    assert state0.counts["tensor"] > 0 and state1.counts["tensor"] > 0 and aux.counts["tensor"] > 0
    # the two state warpgroups run the same code on their halves of V
    assert abs(state0.total - state1.total) <= 0.02 * state0.total
    # nothing after the kernel's last unpredicated EXIT (out-of-line slow paths) is counted in a loop
    sass = disassemble(rep.cubin)
    lines = sass.splitlines()
    last_exit = max(i for i, ln in enumerate(lines) if re.search(r"\*/\s+EXIT\b", ln))
    assert any(re.match(r"\s+/\*[0-9a-f]+\*/", ln) for ln in lines[last_exit + 1 :]), "vs2 has tail code"
    head = loop_stats(rep.source, "\n".join(lines[: last_exit + 1]), "k.cu")
    assert [loop.counts for loop in head] == [loop.counts for loop in loops]
