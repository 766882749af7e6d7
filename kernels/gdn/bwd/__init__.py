"""TileLang kernels of the GDN backward (issue 6): stage 1, the reverse dS chain (dstate_chain.py)."""
