"""Seed the simulated model hub's repositories on disk.

Layout under ``data_dir`` (read by :class:`orchestrator_sim.hub.ModelHub`)::

    <org>/<name>/commits/<sha>/<files...>   one folder per commit, files as the repo holds them
    <org>/<name>/refs/<branch>              a text file holding the 40-hex commit sha

Commit shas are derived from content only (sha1 over the sorted ``path -> blob id`` list plus the
parent commit), so seeding twice, anywhere, gives the same shas. Weight files are SMALL stand-ins:
valid safetensors files holding one ``U8`` tensor of deterministic pseudo-random bytes, big enough
(over :data:`LFS_THRESHOLD`) to be served as LFS files, small enough to download in milliseconds.

:func:`add_repo` writes any other repo (tests use it for e.g. a large file).

Repositories seeded by :func:`seed_repos`:
  * ``moonshotai/Kimi-K2.6``: target model (config with the real shape, tokenizer, 4 weight shards).
  * ``lightseekorg/kimi-k2.6-eagle3``: EAGLE-3 drafter, 6 files, two commits; ``main`` points at
    the newer one, branch ``v1`` at the older one (they differ in ``model.safetensors``).
  * ``sim/eagle3-hidden4096``, ``sim/eagle3-2layers``, ``sim/eagle3-wrong-arch``,
    ``sim/eagle3-vocab-mismatch``: drafters with one thing wrong each, for tests.
  * ``sim/kimi-k2.6-eagle3-mla``: a sound MLA EAGLE-3 drafter (Eagle3DeepseekV2ForCausalLM,
    SGLang 0.5.12+), which FlashInfer MLA cannot run with eagle_topk > 1.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

KIMI_REPO = "moonshotai/Kimi-K2.6"
KIMI_K26_WEIGHT_BYTES = 548_000_000_000  # FACTS.md: ~548 GB of quantized weights
EAGLE3_REPO = "lightseekorg/kimi-k2.6-eagle3"
EAGLE3_OLD_BRANCH = "v1"
EAGLE3_MLA_REPO = "sim/kimi-k2.6-eagle3-mla"
FAULTY_DRAFTERS: dict[str, str] = {
    "sim/eagle3-hidden4096": "hidden_size is 4096 (target has 7168)",
    "sim/eagle3-2layers": "num_hidden_layers is 2 (SGLang 0.5.9 accepts only 1)",
    "sim/eagle3-wrong-arch": "architectures is LlamaForCausalLM (not an Eagle3 class)",
    "sim/eagle3-vocab-mismatch": "vocab_size is 129280 (target has 163840)",
    "sim/eagle3-no-vocab-map": "no d2t tensor for its 32000-token draft vocabulary",
}
# Files of at least this size are "LFS" files: ETag = sha256, tree entries carry an `lfs` block.
LFS_THRESHOLD = 1024 * 1024

_KIB = 1024


def git_blob_sha1(content: bytes) -> str:
    """The git blob id of ``content`` (what the hub uses as ETag of a small file)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def lfs_pointer(content: bytes) -> bytes:
    """The git-lfs pointer file that stands for ``content`` in git."""
    digest = hashlib.sha256(content).hexdigest()
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{digest}\nsize {len(content)}\n"
    ).encode()


def blob_id(content: bytes) -> str:
    """The git object id of a file as stored in git (the pointer's id for an LFS file)."""
    if len(content) >= LFS_THRESHOLD:
        return git_blob_sha1(lfs_pointer(content))
    return git_blob_sha1(content)


def commit_sha(files: dict[str, bytes], parent: str | None = None) -> str:
    """A 40-hex commit id derived from the files' content and the parent commit."""
    h = hashlib.sha1(f"parent {parent or '-'}\n".encode())
    for path in sorted(files):
        h.update(f"{path}\0{blob_id(files[path])}\n".encode())
    return h.hexdigest()


def _pseudo_random(seed: str, n: int) -> bytes:
    return hashlib.shake_256(seed.encode()).digest(n)


def safetensors_blob(tensor_name: str, n: int, seed: str, small: tuple[str, ...] = ()) -> bytes:
    """A valid safetensors file with one U8 tensor of ``n`` pseudo-random bytes, and one U8
    byte for each name in ``small`` (names that readers look for, e.g. a drafter's d2t)."""
    header: dict = {
        "__metadata__": {"format": "pt"},
        tensor_name: {"dtype": "U8", "shape": [n], "data_offsets": [0, n]},
    }
    for i, name in enumerate(small):
        header[name] = {"dtype": "U8", "shape": [1], "data_offsets": [n + i, n + i + 1]}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + _pseudo_random(seed, n) + b"\0" * len(small)


def _json(obj: object) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def _tiktoken_stub() -> bytes:
    # tiktoken format: "<base64 token> <rank>" per line; a tiny stand-in vocabulary.
    import base64

    lines = [f"{base64.b64encode(bytes([i])).decode()} {i}" for i in range(256)]
    return ("\n".join(lines) + "\n").encode()


_QUANTIZATION_CONFIG = {
    "quant_method": "compressed-tensors",
    "format": "nvfp4-pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 4,
                "type": "float",
                "strategy": "tensor_group",
                "group_size": 16,
                "symmetric": True,
                "dynamic": False,
                "observer": "minmax",
            },
            "input_activations": None,
            "output_activations": None,
        }
    },
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*vision_tower.*"],
    "kv_cache_scheme": None,
    "version": "0.12.2",
}

_KIMI_TEXT_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "kimi_k2",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 262144,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 64.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "rms_norm_eps": 1e-05,
    "hidden_act": "silu",
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "routed_scaling_factor": 2.827,
    "num_nextn_predict_layers": 0,
    "vocab_size": 163840,
    "bos_token_id": 163584,
    "eos_token_id": 163585,
    "torch_dtype": "bfloat16",
    "quantization_config": _QUANTIZATION_CONFIG,
}


def kimi_files() -> dict[str, bytes]:
    """The files of the simulated ``moonshotai/Kimi-K2.6`` repo."""
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "auto_map": {
            "AutoConfig": "configuration_kimi_k25.KimiK25Config",
            "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
            "AutoModelForCausalLM": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
        },
        "model_type": "kimi_k25",
        "text_config": _KIMI_TEXT_CONFIG,
        "vision_config": {"model_type": "moonvit", "hidden_size": 1152, "num_hidden_layers": 27},
        # No top-level hidden_size/vocab_size: SGLang's KimiK25Config derives them from
        # text_config as read-only properties (configs/kimi_k25.py:163-171 (0.5.23)); a
        # config.json that set them would fail at start. Readers look into text_config.
        "num_hidden_layers": 61,
        "bos_token_id": 163584,
        "eos_token_id": 163585,
        "pad_token_id": 163839,
        "media_placeholder_token_id": 163605,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.1",
        "quantization_config": _QUANTIZATION_CONFIG,
    }
    files: dict[str, bytes] = {
        "config.json": _json(config),
        "generation_config.json": _json(
            {
                "bos_token_id": 163584,
                "eos_token_id": 163585,
                "max_length": 262144,
                "temperature": 1.0,
                "top_p": 0.95,
            }
        ),
        "tokenizer_config.json": _json(
            {
                "tokenizer_class": "TikTokenTokenizer",
                "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
                "bos_token": "[BOS]",
                "eos_token": "[EOS]",
                "pad_token": "[PAD]",
                "model_max_length": 262144,
            }
        ),
        "tiktoken.model": _tiktoken_stub(),
        "tokenization_kimi.py": b'"""Stand-in for the Kimi tiktoken tokenizer."""\n',
        "chat_template.jinja": b"{% for m in messages %}<|im_{{ m.role }}|>{{ m.content }}"
        b"<|im_end|>{% endfor %}\n",
        "README.md": b"# Kimi-K2.6 (simulated)\n\nSmall stand-in weights for tests.\n",
        "docs/deploy_guidance.md": b"# Deploy guidance (simulated)\n\nUse TP=8.\n",
    }
    shards = 4
    weight_map: dict[str, str] = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        tensor = f"language_model.model.layers.{i - 1}.stand_in"
        size = 1536 * _KIB if i < shards else 1280 * _KIB
        files[name] = safetensors_blob(tensor, size, f"{KIMI_REPO}/{name}")
        weight_map[tensor] = name
    # The index declares the real checkpoint's size (about 548 GB), not the stand-in shards':
    # SGLang sizes GPU memory from the weights it loads, and the stand-in and the preflight's
    # memory rule both read this figure, so the simulated box fills its GPUs like the real one.
    files["model.safetensors.index.json"] = _json(
        {"metadata": {"total_size": KIMI_K26_WEIGHT_BYTES}, "weight_map": weight_map}
    )
    return files


def eagle3_config(**overrides: object) -> dict:
    """The drafter config.json of the ``*-eagle3`` family, with ``overrides`` applied."""
    config: dict = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": 7168,
        "num_hidden_layers": 1,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "head_dim": 128,
        "intermediate_size": 18432,
        "vocab_size": 163840,
        "draft_vocab_size": 32000,
        "max_position_embeddings": 262144,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-05,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 163584,
        "eos_token_id": 163585,
        "torch_dtype": "bfloat16",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [2, 30, 58],
            "use_aux_hidden_state": True,
        },
    }
    config.update(overrides)
    return config


def eagle3_files(repo_id: str, config: dict, *, weights_seed: str, readme_note: str = "",
                 vocab_map: bool = True) -> dict:
    """The 6 files of a simulated EAGLE-3 drafter repo; its weights hold the d2t/t2d vocabulary
    map (a drafter with draft_vocab_size < vocab_size needs it) unless ``vocab_map`` is off."""
    return {
        "config.json": _json(config),
        "model.safetensors": safetensors_blob("midlayer.stand_in", 2560 * _KIB, weights_seed,
                                              ("d2t", "t2d") if vocab_map else ()),
        "generation_config.json": _json({"bos_token_id": 163584, "eos_token_id": 163585}),
        "tokenizer_config.json": _json(
            {"tokenizer_class": "TikTokenTokenizer", "model_max_length": 262144}
        ),
        "tiktoken.model": _tiktoken_stub(),
        "README.md": f"# {repo_id} (simulated EAGLE-3 drafter)\n{readme_note}".encode(),
    }


def _write_commit(repo_dir: Path, files: dict[str, bytes], parent: str | None) -> str:
    sha = commit_sha(files, parent)
    commit_dir = repo_dir / "commits" / sha
    if not commit_dir.is_dir():
        tmp = repo_dir / "commits" / f".{sha}.tmp-{os.getpid()}"
        for rel, content in files.items():
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        try:
            tmp.rename(commit_dir)
        except OSError:
            if not commit_dir.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process seeded it first
    return sha


def _write_ref(repo_dir: Path, name: str, sha: str) -> None:
    ref = repo_dir / "refs" / name
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f".{name}.tmp-{os.getpid()}")
    tmp.write_text(sha + "\n")
    tmp.replace(ref)


def add_repo(
    data_dir: Path,
    repo_id: str,
    history: list[dict[str, bytes]],
    branches: dict[str, int] | None = None,
) -> list[str]:
    """Write a repo's commits (oldest first) and refs; return the commit shas, oldest first.

    ``main`` points at the last commit; ``branches`` maps extra branch names to indexes in
    ``history``. Existing commits are kept (their shas are content-derived).
    """
    if not history:
        raise ValueError(f"repo {repo_id!r} needs at least one commit")
    repo_dir = Path(data_dir) / repo_id
    shas: list[str] = []
    for files in history:
        shas.append(_write_commit(repo_dir, files, shas[-1] if shas else None))
    _write_ref(repo_dir, "main", shas[-1])
    for branch, index in (branches or {}).items():
        _write_ref(repo_dir, branch, shas[index])
    return shas


def seed_repos(data_dir: Path) -> dict[str, str]:
    """Create (or refresh) every simulated repo under ``data_dir``; return repo id -> main commit.

    Safe to call again: existing commits are kept, refs are rewritten to the same shas.
    """
    data_dir = Path(data_dir)
    heads: dict[str, str] = {}
    heads[KIMI_REPO] = add_repo(data_dir, KIMI_REPO, [kimi_files()])[-1]
    good = eagle3_config()
    heads[EAGLE3_REPO] = add_repo(
        data_dir,
        EAGLE3_REPO,
        [
            eagle3_files(EAGLE3_REPO, good, weights_seed=f"{EAGLE3_REPO}@1"),
            eagle3_files(
                EAGLE3_REPO,
                good,
                weights_seed=f"{EAGLE3_REPO}@2",
                readme_note="\nRevision 2: retrained drafter weights.\n",
            ),
        ],
        {EAGLE3_OLD_BRANCH: 0},
    )[-1]
    mla = eagle3_config(architectures=["Eagle3DeepseekV2ForCausalLM"], q_lora_rank=1536,
                        kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                        v_head_dim=128)
    heads[EAGLE3_MLA_REPO] = add_repo(data_dir, EAGLE3_MLA_REPO, [eagle3_files(
        EAGLE3_MLA_REPO, mla, weights_seed=EAGLE3_MLA_REPO,
        readme_note="\nAn MLA EAGLE-3 drafter (Eagle3DeepseekV2ForCausalLM).\n")])[-1]
    faulty_overrides: dict[str, dict] = {
        "sim/eagle3-hidden4096": {"hidden_size": 4096},
        "sim/eagle3-2layers": {"num_hidden_layers": 2},
        "sim/eagle3-wrong-arch": {"architectures": ["LlamaForCausalLM"]},
        "sim/eagle3-vocab-mismatch": {"vocab_size": 129280},
    }
    faulty_overrides["sim/eagle3-no-vocab-map"] = {}
    for repo_id, overrides in faulty_overrides.items():
        files = eagle3_files(
            repo_id,
            eagle3_config(**overrides),
            weights_seed=repo_id,
            readme_note=f"\nFaulty on purpose: {FAULTY_DRAFTERS[repo_id]}.\n",
            vocab_map=repo_id != "sim/eagle3-no-vocab-map",
        )
        heads[repo_id] = add_repo(data_dir, repo_id, [files])[-1]
    return heads


def list_refs(data_dir: Path, repo_id: str) -> dict[str, str]:
    """Branch name -> commit sha of a seeded repo (empty if the repo does not exist)."""
    refs_dir = Path(data_dir) / repo_id / "refs"
    if not refs_dir.is_dir():
        return {}
    return {
        p.name: p.read_text().strip()
        for p in sorted(refs_dir.iterdir())
        if p.is_file() and not p.name.startswith(".")
    }
