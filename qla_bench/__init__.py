"""qla-bench: GDN chunked-prefill benchmark and regression harness."""

__version__ = "0.1.0"
