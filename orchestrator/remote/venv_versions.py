"""What a venv has: its Python, SGLang and compressed-tensors versions, and NVFP4 support.

Runs ON the host with the venv's python (stdlib only, Python 3.8+):

    VENV_PYTHON -c "$(cat venv_versions.py)" [--nvfp4]

and prints one JSON line: {"python", "sglang", "compressed_tensors"} (None when not installed);
with --nvfp4 also "nvfp4" (compressed_tensors knows nvfp4_pack_quantized; None when the import
failed, "nvfp4_error" says why). Parsed by orchestrator.facts.venv.VenvVersions.
"""

import json
import sys


def version(name: str):
    """The installed version of distribution NAME, or None."""
    import importlib.metadata as md

    try:
        return md.version(name)
    except Exception:  # noqa: BLE001 - absent or broken metadata reads as not installed
        return None


def facts(nvfp4: bool) -> dict:
    """The answer: versions, and NVFP4 support when asked (imports compressed_tensors)."""
    out = {"python": sys.version.split()[0], "sglang": version("sglang"),
           "compressed_tensors": version("compressed-tensors"),
           "cudnn": version("nvidia-cudnn-cu12")}
    if nvfp4:
        try:
            from compressed_tensors import CompressionFormat

            out["nvfp4"] = hasattr(CompressionFormat, "nvfp4_pack_quantized")
        except Exception as exc:  # noqa: BLE001 - reported as data
            out["nvfp4"] = None
            out["nvfp4_error"] = f"{type(exc).__name__}: {exc}"
    return out


if __name__ == "__main__":
    print(json.dumps(facts("--nvfp4" in sys.argv[1:])))
