"""build.text_bytes: the machine-code size of a cubin, read from its ELF section table (no binutils)."""

import struct

import pytest

from qla_kernels.gdn.build import text_bytes


def _elf64(sections: list[tuple[str, int]]) -> bytes:
    """A minimal little-endian ELF64 image with these (name, size) sections (contents zero) and a name table."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n, _ in sections) + b".shstrtab\0"
    body = bytearray(64)  # the ELF header, filled below
    offsets = []
    for _, size in sections:
        offsets.append(len(body))
        body += bytes(size)
    strtab_at = len(body)
    body += names
    shoff = len(body)
    entries = [bytes(64)]  # section 0 is the null section
    name_off = 1
    for (name, size), off in zip(sections, offsets):
        entries.append(struct.pack("<IIQQQQIIQQ", name_off, 1, 6, 0, off, size, 0, 0, 16, 0))
        name_off += len(name) + 1
    entries.append(struct.pack("<IIQQQQIIQQ", name_off, 3, 0, 0, strtab_at, len(names), 0, 0, 1, 0))
    body += b"".join(entries)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(entries), len(entries) - 1)
    body[:64] = header
    return bytes(body)


def test_sums_only_text_sections():
    elf = _elf64([(".text.kernel_a", 32), (".nv.shared.kernel_a", 100), (".text.kernel_b", 48), (".data", 7)])
    assert text_bytes(elf) == 80


def test_no_text_is_zero():
    assert text_bytes(_elf64([(".nv.info", 24)])) == 0


def test_rejects_what_is_not_elf64():
    with pytest.raises(ValueError, match="ELF64"):
        text_bytes(b"\x7fELF" + bytes([1]) + bytes(59))
    with pytest.raises(ValueError, match="ELF64"):
        text_bytes(b"not an elf at all" + bytes(60))
