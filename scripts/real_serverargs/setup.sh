#!/bin/sh
# Build what record.py needs, under .cache/real-serverargs/ (network: PyPI):
#   venvs/tf-X  one per transformers pin of the supported releases (run_real.TRANSFORMERS), with
#               the pure-Python packages sglang's server_args imports; torch, triton, sgl_kernel
#               and flashinfer are NOT installed (stubs/ stands in for them)
#   src/V/      each release's wheel unpacked (the wheels `make sync-sglang` downloads)
set -e
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache="$repo/.cache/real-serverargs"
python=${PYTHON:-python3}
mkdir -p "$cache/venvs" "$cache/src"
COMMON="msgspec pydantic numpy psutil orjson requests packaging starlette fastapi pyzmq pillow
pybase64 dill sentencepiece gguf einops partial_json_parser apache-tvm-ffi==0.1.11 ninja"
# transformers, xgrammar and openai of each pin (the releases' Requires-Dist)
for spec in "4.57.1 0.1.27 2.6.1" "5.3.0 0.1.32 2.8.0" "5.6.0 0.2.0 2.8.0" "5.12.1 0.2.1 2.8.0" \
            "5.19.0 0.2.7 2.8.0"; do
  set -- $spec
  venv="$cache/venvs/tf-$1"
  [ -x "$venv/bin/python" ] && continue
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q "transformers==$1" "openai==$3" $COMMON
  # xgrammar's own requirements name torch and triton (the stubs stand in for them)
  "$venv/bin/pip" install -q --no-deps "xgrammar==$2"
done
"$python" - "$repo" "$cache/src" <<'PY'
import sys, zipfile
from pathlib import Path
repo, out = Path(sys.argv[1]), Path(sys.argv[2])
sys.path.insert(0, str(repo / "scripts"))
import sync_sglang
for version in sync_sglang.RELEASES:
    if (out / version / "sglang").is_dir():
        continue
    wheel = sync_sglang.download_wheel(version, sync_sglang.DEFAULT_CACHE)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(out / version, [n for n in zf.namelist() if n.startswith("sglang/")])
PY
