"""`CompressionFormat`: the checkpoint compression formats this release knows.

As in the real package, `nvfp4_pack_quantized` is absent up to 0.9.x (0.9.4:
compressed_tensors/config/base.py:26, the enum without it) and present from 0.10.0
(compressed_tensors/config/base.py:35).
Looking up a missing member raises `AttributeError: <name>`, the message Python <= 3.11 gives
for enums (kept the same on newer Pythons so the simulated failure reads the same everywhere).
"""

from __future__ import annotations

from enum import Enum, EnumMeta

from compressed_tensors.version import __version__

__all__ = ["CompressionFormat", "SparsityStructure"]


def _version_tuple(text: str) -> tuple:
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        parts.append(int(digits or 0))
    return tuple(parts)


_MEMBERS = [
    ("dense", "dense"),
    ("sparse_bitmask", "sparse-bitmask"),
    ("sparse_24_bitmask", "sparse-24-bitmask"),
    ("int_quantized", "int-quantized"),
    ("float_quantized", "float-quantized"),
    ("naive_quantized", "naive-quantized"),
    ("pack_quantized", "pack-quantized"),
    ("marlin_24", "marlin-24"),
]
if _version_tuple(__version__) >= (0, 10, 0):
    _MEMBERS.append(("nvfp4_pack_quantized", "nvfp4-pack-quantized"))


class _FormatMeta(EnumMeta):
    """Enum metaclass whose missing-member error is `AttributeError: <name>`."""

    def __getattr__(cls, name):
        raise AttributeError(name)


class _FormatBase(str, Enum, metaclass=_FormatMeta):
    """Base of the functional enum below (str mix-in, like the real one's values)."""


CompressionFormat = _FormatBase("CompressionFormat", _MEMBERS, module=__name__)
CompressionFormat.__doc__ = "Compression formats of a compressed-tensors checkpoint."


class SparsityStructure(Enum):
    """Sparsity structures (unchanged across the simulated releases)."""

    TWO_FOUR = "2:4"
    UNSTRUCTURED = "unstructured"
