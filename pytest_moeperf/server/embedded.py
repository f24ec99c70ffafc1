"""The embedded default model: a tiny Qwen3-MoE with random weights and a locally trained tokenizer.

Why: a newcomer's ``pytest perf_tests`` on a laptop must exercise the real vLLM server with a real
MoE architecture, with no model hub and no network. Generation is seeded and deterministic, so the
same plugin version yields byte-identical weights on every machine (and therefore a stable model
hash in baseline keys). It is built once and cached; a ``.complete`` marker makes a half-written
cache (Ctrl-C during generation) be rebuilt rather than served.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

EMBEDDED_NAME = "embedded"
GENERATOR_VERSION = 1


@dataclass(frozen=True)
class TinyMoeShape:
    """Dimensions of the embedded model (the shape seen serving well on 2 CPU cores)."""

    hidden_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    num_experts: int = 16
    num_experts_per_tok: int = 4
    moe_intermediate_size: int = 128
    intermediate_size: int = 512
    vocab_size: int = 1024  # upper bound for BPE training; the model uses the trained size
    max_position_embeddings: int = 8192
    seed: int = 0

    def digest(self) -> str:
        blob = json.dumps({"v": GENERATOR_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# Training text for the byte-level BPE: varied English with digits and arithmetic so that
# gsm8k-style prompts tokenize to sensible lengths. The content does not matter for performance.
_CORPUS = [
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many "
    "clips in May. How many clips did Natalia sell altogether in April and May?",
    "Answer: Natalia sold 48/2 = 24 clips in May. Natalia sold 48+24 = 72 clips altogether. "
    "#### 72",
    "The quick brown fox jumps over the lazy dog while the server streams tokens to the client.",
    "Mixture-of-experts layers route every token to a few experts; kernel tiling decides speed.",
    "Throughput, latency, time to first token and time per output token are measured per request.",
    "She has 3 apples and buys 5 more, then gives 2 away: 3 + 5 - 2 = 6 apples remain.",
    "A train travels 120 miles in 2 hours, so its speed is 120 / 2 = 60 miles per hour.",
    "In 1990 the price was $1,250.75; by 2020 it had risen by 40 percent to $1,751.05.",
    "Every night the benchmark runs, compares against the baseline and writes a report.",
]


def default_cache_root() -> Path:
    """Where generated models live: ``$MOEPERF_CACHE_DIR`` or the user's cache directory."""
    env = os.environ.get("MOEPERF_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "pytest-moeperf"


def embedded_model_dir(cache_root: Path | None = None, shape: TinyMoeShape | None = None) -> Path:
    shape = shape or TinyMoeShape()
    root = cache_root or default_cache_root()
    return root / "models" / f"tiny-qwen3-moe-{shape.digest()}"


def ensure_embedded_model(
    cache_root: Path | None = None, shape: TinyMoeShape | None = None
) -> Path:
    """Return the model folder, generating it first if it is missing or incomplete."""
    shape = shape or TinyMoeShape()
    dest = embedded_model_dir(cache_root, shape)
    if (dest / ".complete").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp-", dir=dest.parent))
    try:
        _write_tokenizer(tmp, shape)
        _write_model(tmp, shape)
        (tmp / ".complete").write_text(shape.digest() + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _write_tokenizer(dest: Path, shape: TinyMoeShape) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_lines(), trainer=trainer)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "backend": "tokenizers",
                "bos_token": None,
                "eos_token": "<|endoftext|>",
                "pad_token": "<|endoftext|>",
                "model_max_length": shape.max_position_embeddings,
                "tokenizer_class": "PreTrainedTokenizerFast",
            },
            indent=2,
        )
    )
    (dest / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{m['role']}}\n{{m['content']}}<|im_end|>\n"
        "{% endfor %}<|im_start|>assistant\n"
    )


def _training_lines() -> list[str]:
    """The fixed corpus plus deterministic arithmetic lines, enough for a ~1k-token vocabulary."""
    words = " ".join(_CORPUS).replace(".", " ").replace(",", " ").split()
    lines = list(_CORPUS)
    for i in range(400):
        a, b = 7 * i + 3, 13 * i % 97 + 1
        w1, w2 = words[i % len(words)], words[(5 * i + 1) % len(words)]
        lines.append(f"{w1} has {a} {w2}s and gets {b} more, so {a} + {b} = {a + b}. #### {a + b}")
    return lines


def _write_model(dest: Path, shape: TinyMoeShape) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(dest / "tokenizer.json")).get_vocab_size()
    hf: Any = transformers  # untyped use: the config classes take **kwargs
    config = hf.Qwen3MoeConfig(
        vocab_size=vocab,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        num_experts=shape.num_experts,
        num_experts_per_tok=shape.num_experts_per_tok,
        moe_intermediate_size=shape.moe_intermediate_size,
        max_position_embeddings=shape.max_position_embeddings,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(shape.seed)
    model = hf.Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(dest), safe_serialization=True)


def model_fingerprint(model_dir: Path) -> str:
    """A short stable hash of config.json + weights file names and sizes, for baseline keys."""
    h = hashlib.sha256()
    for p in sorted(model_dir.iterdir()):
        if p.name.startswith(".") or p.is_dir():
            continue
        h.update(p.name.encode())
        if p.suffix == ".json":
            h.update(p.read_bytes())
        else:
            h.update(str(p.stat().st_size).encode())
    return h.hexdigest()[:12]
