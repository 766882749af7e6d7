"""`python -m qla_bench.cli ...` (used to run sweeps in fresh processes)."""

from . import main

main()
