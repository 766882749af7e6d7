"""qla_kernels: TileLang GDN (Gated DeltaNet) chunked-prefill kernels for Hopper (sm_90a).

Standalone: imports torch and (lazily, at first launch) tilelang; never qla_bench.
"""

from .gdn import BwdOutput, FwdOutput, chunk_gated_delta_rule, chunk_gated_delta_rule_bwd, chunk_gated_delta_rule_fwd

__version__ = "0.1.0"

# True once a version has passed tests/gpu/test_qla_fwd.py on the H200 (v2, 2026-12-02; see NOTES.md).
KERNELS_READY = True

__all__ = [
    "KERNELS_READY",
    "BwdOutput",
    "FwdOutput",
    "__version__",
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_bwd",
    "chunk_gated_delta_rule_fwd",
]
