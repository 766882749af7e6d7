"""Gated DeltaNet (GDN) chunked prefill."""

from .api import FwdOutput, chunk_gated_delta_rule, chunk_gated_delta_rule_fwd
from .bwd_chunked import BwdOutput, chunk_gated_delta_rule_bwd

__all__ = [
    "BwdOutput",
    "FwdOutput",
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_bwd",
    "chunk_gated_delta_rule_fwd",
]
