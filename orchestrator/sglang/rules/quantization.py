"""Rule on the checkpoint's quantization format and the installed compressed-tensors."""

from __future__ import annotations

from collections.abc import Iterator

from orchestrator.sglang.hfconfig import quant_formats
from orchestrator.sglang.rules import Launch, rule

NVFP4_FORMAT = "nvfp4-pack-quantized"


@rule("quantization.nvfp4-needs-compressed-tensors-0.10", "sched-init")
def nvfp4(launch: Launch) -> Iterator[str]:
    """A `nvfp4-pack-quantized` checkpoint needs compressed-tensors >= 0.10.0.

    SGLang reads `CompressionFormat.nvfp4_pack_quantized` when it classifies the checkpoint's
    formats (layers/quantization/compressed_tensors/utils.py:17 (0.5.9), :18 (0.5.23),
    `is_activation_quantization_format`): AttributeError where the enum lacks the member. It
    exists from compressed-tensors 0.10.0 (compressed_tensors/config/base.py:35) and is absent in
    0.9.4 (the same enum, base.py:26) and earlier.
    """
    if NVFP4_FORMAT not in quant_formats(launch.target):
        return
    ct = launch.compressed_tensors_version
    fix = "install compressed-tensors>=0.10.0 (the pip stage)"
    if ct is None:
        yield (f"the checkpoint's quantization format is {NVFP4_FORMAT} but compressed-tensors "
               f"is not installed in {launch.python}; {fix}")
    elif launch.nvfp4_known is False:
        yield f"compressed-tensors {ct} does not know nvfp4_pack_quantized; {fix}"
    elif launch.nvfp4_known is None:
        why = launch.nvfp4_error or "not checked"
        yield (f"could not check whether compressed-tensors {ct} knows nvfp4_pack_quantized "
               f"(importing it failed: {why}); repair the venv (the pip stage)")
