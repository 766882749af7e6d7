"""Run qla-bench from a checkout without installing: `python cli.py fwd ...`."""

from qla_bench.cli import main

if __name__ == "__main__":
    main()
