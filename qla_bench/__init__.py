"""qla-bench: GDN chunked-prefill benchmark and regression harness."""

import time as _time

__version__ = "0.1.0"

# When this process first imported qla_bench: the run commands print their wall time from here too, so
# the number includes the interpreter's imports (torch alone takes seconds), as a user timing the command sees.
STARTED = _time.perf_counter()
