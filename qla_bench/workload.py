"""What one benchmark row measures: head config, sequence mix, dims and input recipe.

Kept free of torch so sweeps, reports and the gate can use it on any machine.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import asdict, dataclass, field

from .errors import UsageError

MODES = ("fwd", "bwd", "train")
GATE_RECIPES = ("flashqla", "strong", "zero")
DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True)
class HeadConfig:
    """Heads of one GPU's shard: h_qk query/key heads, h_v value heads (h_v = r * h_qk, GVA)."""

    h_qk: int
    h_v: int
    name: str = ""

    def __post_init__(self) -> None:
        if self.h_qk < 1 or self.h_v < 1:
            raise UsageError("heads", f"head counts must be >= 1, got {self.h_qk}/{self.h_v}")
        if self.h_v % self.h_qk:
            raise UsageError(
                "heads",
                f"h_v={self.h_v} is not a multiple of h_qk={self.h_qk}",
                "h_qk/h_v with h_v = r * h_qk, e.g. 16/64, 2/8, 32/32",
            )

    @property
    def ratio(self) -> int:
        return self.h_v // self.h_qk

    @property
    def label(self) -> str:
        return self.name or f"h{self.h_qk}/{self.h_v}"


def parse_heads(text: str) -> HeadConfig:
    """Parse 'H_QK/H_V' (e.g. '16/64') into a HeadConfig."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m:
        raise UsageError("--heads", f"cannot parse {text!r}", "H_QK/H_V, e.g. 16/64 or 2/8")
    return HeadConfig(int(m.group(1)), int(m.group(2)))


def parse_seqlens(text: str) -> tuple[int, ...]:
    """Parse a sequence-mix label.

    '32768' or '1x32768' is one sequence of 32768 tokens (FlashQLA's label), 'LxN' is N sequences of
    L tokens ('8192x4'), 'A+B+C' lists the lengths.
    """
    s = text.strip().lower().replace(" ", "")
    try:
        if "+" in s:
            lens = tuple(int(p) for p in s.split("+"))
        elif "x" in s:
            a, b = (int(p) for p in s.split("x"))
            lens = (b,) if a == 1 else (a,) * b
        else:
            lens = (int(s),)
    except ValueError:
        raise UsageError("--seqlens", f"cannot parse {text!r}", "L, 1xL, LxN (N sequences of L) or L1+L2+...") from None
    return validate_seqlens(lens, "--seqlens")


def validate_seqlens(lens: tuple[int, ...] | list[int], argument: str = "seqlens") -> tuple[int, ...]:
    lens = tuple(int(x) for x in lens)
    if not lens:
        raise UsageError(argument, "no sequences given", "at least one length >= 1")
    if any(x < 1 for x in lens):
        raise UsageError(argument, f"every length must be >= 1, got {list(lens)}")
    return lens


def seqlens_label(lens: tuple[int, ...]) -> str:
    """Inverse of parse_seqlens in FlashQLA's style: '1x32768', '8192x4', '16384+16384', '28672+4096'."""
    if len(lens) == 1:
        return f"1x{lens[0]}"
    if len(lens) > 2 and len(set(lens)) == 1 and lens[0] != 1:
        return f"{lens[0]}x{len(lens)}"
    return "+".join(str(x) for x in lens)


def cu_seqlens_of(lens: tuple[int, ...]) -> list[int]:
    out = [0]
    for x in lens:
        out.append(out[-1] + x)
    return out


def validate_cu_seqlens(cu: list[int]) -> list[int]:
    """cu_seqlens must start at 0 and increase strictly (every sequence has >= 1 token)."""
    if len(cu) < 2 or cu[0] != 0:
        raise UsageError("cu_seqlens", f"must start at 0 and have >= 2 entries, got {cu}")
    for a, b in itertools.pairwise(cu):
        if b <= a:
            raise UsageError("cu_seqlens", f"must be strictly increasing, got {cu}")
    return cu


@dataclass(frozen=True)
class InputRecipe:
    """How inputs are drawn. gate: 'flashqla' = logsigmoid(randn)/16 with a fraction of g = 0 heads,
    'strong' = an A_log-style recipe reaching g ~ -20 per token, 'zero' = every head g = 0."""

    gate: str = "flashqla"
    zero_gate_frac: float = 0.25
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.gate not in GATE_RECIPES:
            raise UsageError("gate", f"unknown gate recipe {self.gate!r}", ", ".join(GATE_RECIPES))
        if not 0.0 <= self.zero_gate_frac <= 1.0:
            raise UsageError("zero_gate_frac", f"must be in [0, 1], got {self.zero_gate_frac}")
        if self.dtype not in DTYPES:
            raise UsageError("dtype", f"unknown dtype {self.dtype!r}", ", ".join(DTYPES))


@dataclass(frozen=True)
class Workload:
    """One benchmark point: heads x sequence mix x dims x input recipe (x mode in the row)."""

    heads: HeadConfig
    seqlens: tuple[int, ...]
    k: int = 128
    v: int = 128
    recipe: InputRecipe = field(default_factory=InputRecipe)
    model: str = ""  # e.g. '397B/122B TP8' (FlashQLA's 'Model Config' column)
    label: str = ""  # sequence-mix label; derived from seqlens when empty

    def __post_init__(self) -> None:
        object.__setattr__(self, "seqlens", validate_seqlens(self.seqlens))
        if self.k < 1 or self.v < 1:
            raise UsageError("k/v", f"head dims must be >= 1, got K={self.k} V={self.v}")
        if not self.label:
            object.__setattr__(self, "label", seqlens_label(self.seqlens))

    @property
    def total_tokens(self) -> int:
        return sum(self.seqlens)

    @property
    def n_seqs(self) -> int:
        return len(self.seqlens)

    @property
    def n_chunks(self) -> int:
        """64-token chunks over all sequences (chunks restart at every sequence start)."""
        return sum((t + 63) // 64 for t in self.seqlens)

    def key(self) -> str:
        """Stable identity of the workload, used for seeds, resume and gating."""
        r = self.recipe
        return (
            f"h{self.heads.h_qk}/{self.heads.h_v}|k{self.k}|v{self.v}|"
            f"{'+'.join(map(str, self.seqlens))}|{r.dtype}|{r.gate}|{r.zero_gate_frac:g}"
        )

    def seed(self, base: int = 0) -> int:
        """Seed derived from the config, so every backend and every rerun sees the same inputs."""
        digest = hashlib.sha256(f"{base}|{self.key()}".encode()).digest()
        return int.from_bytes(digest[:4], "little")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["seqlens"] = list(self.seqlens)
        return d
