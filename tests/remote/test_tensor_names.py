"""The `tensor_names` probe: which names a checkpoint's tensors carry, from its safetensors index
or from the header of its single file, without reading any tensor data."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from orchestrator.facts.files import TensorNames
from orchestrator.remote.probes import tensor_names


def _single(folder: Path, names: list[str]) -> None:
    header = {"__metadata__": {"format": "pt"},
              **{n: {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]}
                 for i, n in enumerate(names)}}
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw
                                               + b"\0" * len(names))


def test_index_header_and_nothing(tmp_path: Path) -> None:
    indexed, single, empty = tmp_path / "i", tmp_path / "s", tmp_path / "e"
    for d in (indexed, single, empty):
        d.mkdir()
    (indexed / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"d2t": "a.safetensors", "midlayer.fc.weight": "a.safetensors"}}))
    _single(single, ["midlayer.fc.weight", "t2d"])
    got = {d.name: TensorNames.from_answer(tensor_names(str(d), ["d2t", "fc."]))
           for d in (indexed, single, empty)}
    assert (got["i"].source, got["i"].has("d2t"), got["i"].has("fc.")) == ("index", True, True)
    assert (got["s"].source, got["s"].has("d2t"), got["s"].has("fc.")) == ("header", False, True)
    assert (got["e"].source, got["e"].has("d2t")) == (None, None)
