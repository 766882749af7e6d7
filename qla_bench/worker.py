"""Isolated backend sessions: each backend library runs in its own subprocess.

A segfault, illegal memory access, OOM or hang in one library becomes a status on its row (ERROR, OOM,
TIMEOUT) and the sweep goes on; the dead worker is replaced at the next request.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import traceback
from dataclasses import asdict
from multiprocessing.connection import Connection
from typing import Any

from .rows import Status
from .session import BackendSession, SetupResult
from .workload import Workload


class WorkerFailure(Exception):
    """The worker died or timed out; carries the row status to record."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _worker_main(conn: Connection, backend: str, device: str, tolerance: str, cold_l2: bool) -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    session = BackendSession(backend, device, tolerance, cold_l2)
    while True:
        try:
            cmd, args = conn.recv()
        except EOFError:
            return
        try:
            if cmd == "close":
                conn.send(("ok", None))
                return
            if cmd == "availability":
                result: Any = session.availability()
            elif cmd == "warm":
                result = session.warm()
            elif cmd == "setup":
                result = asdict(session.setup(*args))
            elif cmd == "sample":
                result = session.sample(*args)
            elif cmd == "kernels":
                result = session.kernels(*args)
            elif cmd == "teardown":
                result = session.teardown()
            else:
                raise ValueError(f"unknown command {cmd!r}")
            conn.send(("ok", result))
        except Exception as exc:
            conn.send(("err", f"{type(exc).__name__}: {exc} | {traceback.format_exc().strip().splitlines()[-1]}"))


class IsolatedSession:
    """Same interface as BackendSession, proxied to a subprocess with a per-request timeout."""

    def __init__(
        self,
        backend: str,
        device: str = "auto",
        tolerance: str = "bf16",
        cold_l2: bool = True,
        timeout_s: float = 600.0,
    ) -> None:
        self.args = (backend, device, tolerance, cold_l2)
        self.backend_name = backend
        self.timeout_s = timeout_s
        self._ctx = mp.get_context("spawn")
        self._proc: mp.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._pending: str | None = None  # a command sent by warm_up() whose answer is still unread
        self._begun: tuple | None = None  # the arguments of a begin_setup() whose answer is still unread
        self._closing = False  # begin_close() asked the worker to exit

    def warm_up(self) -> None:
        """Start the worker and have it import its library and create its CUDA context now, without
        waiting for the answer.

        Called for every backend before the first config, so the workers load in parallel: one after
        another, six libraries took ~55 s of a 77 s smoke sweep on the H200.
        """
        if self._proc is None or not self._proc.is_alive():
            self._start()
        assert self._conn is not None
        try:
            self._conn.send(("warm", ()))
            self._pending = "warm"
        except (BrokenPipeError, ConnectionResetError, EOFError):
            self._kill()

    def _start(self) -> None:
        self._pending = None  # a new worker has been asked nothing yet
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(
            target=_worker_main, args=(child, *self.args), daemon=True, name=f"qla-worker-{self.backend_name}"
        )
        self._proc.start()
        child.close()
        self._conn = parent

    def _kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._proc, self._conn, self._pending = None, None, None

    def begin_close(self) -> None:
        """Ask the worker to exit without waiting (close() then reaps it): workers shut down together."""
        if self._proc is not None and self._proc.is_alive() and self._conn is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError, OSError):
                self._conn.send(("close", ()))
                self._closing = True

    def _request(self, cmd: str, *args: Any, timeout_s: float | None = None) -> Any:
        self._send(cmd, args)
        return self._receive(cmd, args, timeout_s)

    def _send(self, cmd: str, args: tuple) -> None:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        assert self._conn is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, EOFError):  # _answer says how it died
            self._conn.send((cmd, args))

    def _receive(self, cmd: str, args: tuple, timeout_s: float | None) -> Any:
        """The answer to `cmd`, already sent. The warm-up's answer, if unread, comes first: a worker
        that hung while warming up fails this request (its import would hang again); one that died
        took `cmd` with it, so a new worker is asked again."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if self._pending is not None:
            pending, self._pending = self._pending, None
            try:
                self._answer(pending, timeout)
            except WorkerFailure as exc:
                if exc.status == Status.TIMEOUT:
                    raise
                self._send(cmd, args)
            except RuntimeError:
                pass
        return self._answer(cmd, timeout)

    def _answer(self, cmd: str, timeout: float) -> Any:
        """Wait for the worker's answer to `cmd`; a death or a timeout becomes a WorkerFailure."""
        assert self._conn is not None and self._proc is not None
        try:
            ready = self._conn.poll(timeout)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            ready = False
        if not ready:
            alive = self._proc.is_alive()
            code = self._proc.exitcode
            self._kill()
            if alive:
                raise WorkerFailure(Status.TIMEOUT, f"{self.backend_name}: no answer to {cmd} within {timeout:g} s")
            raise WorkerFailure(Status.ERROR, f"{self.backend_name} worker died ({_describe_exit(code)}) during {cmd}")
        try:
            kind, payload = self._conn.recv()
        except (EOFError, ConnectionResetError):
            self._proc.join(5)  # reap it, so the exit code (or signal) is known
            code = self._proc.exitcode
            self._kill()
            raise WorkerFailure(
                Status.ERROR, f"{self.backend_name} worker died ({_describe_exit(code)}) during {cmd}"
            ) from None
        if kind == "err":
            raise RuntimeError(payload)
        return payload

    def availability(self) -> str | None:
        try:
            return self._request("availability", timeout_s=min(self.timeout_s, 300))
        except WorkerFailure as exc:
            return exc.reason

    def begin_setup(self, wl: Workload, mode: str, seed: int, check_seeds: int = 1) -> None:
        """Send the setup request without waiting for it: the runner starts every worker's setup of a
        config at once (first calls, loads and float64 references overlap), then collects them with
        setup() in backend order."""
        args = (wl, mode, seed, check_seeds)
        self._send("setup", args)
        self._begun = args

    def setup(self, wl: Workload, mode: str, seed: int, check_seeds: int = 1) -> SetupResult:
        args = (wl, mode, seed, check_seeds)
        begun, self._begun = self._begun, None
        try:
            if begun is not None and begun == args:
                return SetupResult(**self._receive("setup", args, None))
            if begun is not None:
                raise RuntimeError(f"{self.backend_name}: setup() for another workload than begin_setup()")
            return SetupResult(**self._request("setup", *args))
        except WorkerFailure as exc:
            return SetupResult(exc.status.value, exc.reason)

    def sample(self, timer: str, reps: int) -> tuple[list[float], list[float]]:
        return self._request("sample", timer, reps)

    def kernels(self, calls: int, profiler: str = "torch") -> list[dict]:
        return self._request("kernels", calls, 3, profiler)

    def teardown(self) -> None:
        with contextlib.suppress(WorkerFailure, RuntimeError):
            self._request("teardown", timeout_s=60)

    def close(self, wait_s: float = 10.0) -> None:
        """Ask the worker to exit (unless begin_close() did) and reap it; kill it after wait_s."""
        if self._proc is not None and self._proc.is_alive():
            if not self._closing:
                self.begin_close()
            self._proc.join(wait_s)
        self._closing = False
        self._kill()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
