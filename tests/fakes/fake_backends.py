"""Backends that misbehave on purpose, for the harness's own tests (loaded via QLA_BENCH_BACKENDS)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import torch

from qla_bench.backends import register
from qla_bench.backends.base import Backend, GDNInputs, Prepared
from qla_bench.backends.torch_chunked import chunk_gdn_fp32


def _right_answer(inputs: GDNInputs) -> Prepared:
    """What a correct forward backend prepares: the fp32 chunked PyTorch path."""
    x = inputs

    def run():
        return chunk_gdn_fp32(x.q, x.k, x.v, x.g, x.beta, x.scale, x.h0, x.cu_seqlens)

    return Prepared(run=run, outputs=lambda r: {"o": r[0], "final_state": r[1]}, graph_safe=False)


class _Fake(Backend):
    modes = ("fwd",)

    def available(self) -> str | None:
        return None


@register
class WrongBackend(_Fake):
    """Right shapes, wrong numbers: must be INCORRECT and never timed."""

    name = "fake-wrong"

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:
        x = inputs

        def run():
            o, ht = chunk_gdn_fp32(x.q, x.k, x.v, x.g, x.beta, x.scale, x.h0, x.cu_seqlens)
            return o * 1.1, ht

        return Prepared(run=run, outputs=lambda r: {"o": r[0], "final_state": r[1]}, graph_safe=False)


@register
class NanBackend(_Fake):
    name = "fake-nan"

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:
        x = inputs

        def run():
            o, ht = chunk_gdn_fp32(x.q, x.k, x.v, x.g, x.beta, x.scale, x.h0, x.cu_seqlens)
            o = o.clone()
            o.view(-1)[0] = float("nan")
            return o, ht

        return Prepared(run=run, outputs=lambda r: {"o": r[0], "final_state": r[1]}, graph_safe=False)


@register
class RaisingBackend(_Fake):
    name = "fake-raise"

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:
        def run():
            raise RuntimeError("illegal memory access (simulated)")

        return Prepared(run=run, outputs=lambda r: {}, graph_safe=False)


@register
class OomBackend(_Fake):
    name = "fake-oom"

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:
        def run():
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

        return Prepared(run=run, outputs=lambda r: {}, graph_safe=False)


@register
class CrashingBackend(_Fake):
    """Kills its own process with SIGSEGV: only survivable with --isolate."""

    name = "fake-segv"

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:
        def run():
            os.kill(os.getpid(), signal.SIGSEGV)

        return Prepared(run=run, outputs=lambda r: {}, graph_safe=False)


@register
class HangingBackend(_Fake):
    name = "fake-hang"

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:
        def run():
            time.sleep(3600)

        return Prepared(run=run, outputs=lambda r: {}, graph_safe=False)


@register
class UnavailableBackend(_Fake):
    name = "fake-missing"

    def available(self) -> str | None:
        return "library not installed (simulated)"

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:  # pragma: no cover - never reached
        raise AssertionError("prepare() called on an unavailable backend")


class _SlowImport(_Fake):
    """A library whose import takes seconds: the first available() stamps when it started, then sleeps."""

    imported = False  # like sys.modules: only the first call pays for the import

    def available(self) -> str | None:
        if not type(self).imported:
            stamp_dir = os.environ.get("QLA_TEST_STAMP_DIR")
            if stamp_dir:
                with open(os.path.join(stamp_dir, self.name), "w") as f:
                    f.write(repr(time.time()))
            time.sleep(4)
            type(self).imported = True
        return None

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:
        return _right_answer(inputs)


@register
class SlowImportA(_SlowImport):
    name = "fake-slow-a"


@register
class SlowImportB(_SlowImport):
    name = "fake-slow-b"


@register
class DiesOnImport(_Fake):
    """The process exits while importing its library (a broken extension module)."""

    name = "fake-dies-on-import"

    def available(self) -> str | None:
        if multiprocessing.current_process().name.startswith("qla-worker"):
            os._exit(3)
        return "dies on import (simulated; only inside an isolated worker)"

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:  # pragma: no cover - never reached
        raise AssertionError("prepare() called after a failed import")


class _SlowSetup(_Fake):
    """prepare() takes 2 s and stamps when it started and ended (QLA_TEST_STAMP_DIR/<name>.setup)."""

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:
        stamp_dir = os.environ.get("QLA_TEST_STAMP_DIR")
        began = time.time()
        time.sleep(2)
        if stamp_dir:
            with open(os.path.join(stamp_dir, f"{self.name}.setup"), "w") as f:
                f.write(f"{began!r} {time.time()!r}")
        return _right_answer(inputs)


@register
class SlowSetupA(_SlowSetup):
    name = "fake-slow-setup-a"


@register
class SlowSetupB(_SlowSetup):
    name = "fake-slow-setup-b"


@register
class SlowSetupTuner(_SlowSetup):
    """Autotunes on the GPU (like FLA): its setup must run while no other backend sets up."""

    name = "fake-slow-setup-tuner"
    tunes_on_device = True


@register
class ImportFailsButInstalled(_Fake):
    """Installed (find_spec says so) but its import fails: only an import check can tell."""

    name = "fake-import-fails"

    def available(self) -> str | None:
        return "cannot import fake (simulated)"

    def installed(self) -> str | None:
        return None

    def prepare(self, inputs: GDNInputs, mode: str) -> Prepared:  # pragma: no cover - never reached
        raise AssertionError("prepare() called after a failed import")
