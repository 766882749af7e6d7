"""Gated DeltaNet (GDN) chunked prefill."""

from .api import FwdOutput, chunk_gated_delta_rule, chunk_gated_delta_rule_fwd

__all__ = ["FwdOutput", "chunk_gated_delta_rule", "chunk_gated_delta_rule_fwd"]
