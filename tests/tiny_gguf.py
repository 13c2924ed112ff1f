"""Tiny GGUF files written with gguf-py: a 2-layer Qwen2 or Llama decoder with random weights in Q8_0 and Q5_0 blocks
(norms and biases in F32), its metadata, and a byte-level BPE tokenizer; laid out as llama.cpp's converter lays a model
out, a Llama file's attn_q / attn_k rows permuted."""

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS = 64, 4, 2, 16, 128, 2
SPECIAL = ["<|endoftext|>", "<|im_end|>", "<unk>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("d", "e"), ("Ġ", "de"), ("Ġde", "f")]
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins byte-level BPE uses for bytes (printable bytes stand for themselves, the rest are
    shifted past 255 in order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


def vocabulary() -> tuple[list[str], list[int]]:
    """(tokens, token types): the bytes, the merges' results, the special tokens (type 3, control)."""
    tokens = byte_symbols() + [a + b for a, b in MERGES] + SPECIAL
    return tokens, [1] * (len(tokens) - len(SPECIAL)) + [3] * len(SPECIAL)


def permute_like_llama_cpp(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf's permutation of a Llama (heads·head_dim, …) projection: (h, half, i) → (h, i, half)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write(path: Path, architecture: str = "qwen2", seed: int = 0, tied: bool | None = None,
          up: str = "Q5_0", recode=None) -> Path:
    """A tiny GGUF at `path`: Qwen2 (q/k/v biases, the LM head tied to the embedding unless `tied` is False) or Llama
    (no biases, an LM head of its own unless `tied`); ffn_up of block type `up` (Q8_0: the gate's, so the two fuse);
    given `recode` ((raw blocks, type name) → (raw, type name)), every matrix but the embedding written as it says."""
    rng = np.random.default_rng(seed)
    tokens, types = vocabulary()
    tied = architecture == "qwen2" if tied is None else tied
    writer = gguf.GGUFWriter(str(path), architecture)
    for key, value in {"block_count": LAYERS, "context_length": 256, "embedding_length": HIDDEN,
                       "feed_forward_length": FFN, "attention.head_count": HEADS,
                       "attention.head_count_kv": KV_HEADS}.items():
        writer.add_uint32(f"{architecture}.{key}", value)
    writer.add_float32(f"{architecture}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{architecture}.rope.freq_base", 10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
    writer.add_bos_token_id(tokens.index(SPECIAL[0]))
    writer.add_eos_token_id(tokens.index(SPECIAL[1]))
    writer.add_pad_token_id(tokens.index(SPECIAL[0]))
    writer.add_unk_token_id(tokens.index(SPECIAL[2]))
    writer.add_chat_template(CHAT_TEMPLATE)

    def matrix(name: str, rows: int, columns: int, kind: T = T.Q8_0, permute_heads: int = 0):
        w = rng.normal(scale=0.3, size=(rows, columns)).astype(np.float32)
        if permute_heads:
            w = permute_like_llama_cpp(w, permute_heads)
        raw = gguf.quants.quantize(w, kind)
        if recode is not None and name != "token_embd.weight":
            raw, recoded = recode(raw, kind.name)
            kind = T[recoded]
        writer.add_tensor(name, raw, raw_dtype=kind)

    def vector(name: str, size: int, mean: float = 0.0):
        writer.add_tensor(name, (mean + rng.normal(scale=0.1, size=size)).astype(np.float32))

    llama = architecture == "llama"
    matrix("token_embd.weight", len(tokens), HIDDEN)
    for i in range(LAYERS):
        vector(f"blk.{i}.attn_norm.weight", HIDDEN, 1.0)
        matrix(f"blk.{i}.attn_q.weight", HEADS * HEAD_DIM, HIDDEN, permute_heads=HEADS if llama else 0)
        matrix(f"blk.{i}.attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN, T.Q5_0, permute_heads=KV_HEADS if llama else 0)
        matrix(f"blk.{i}.attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        if not llama:
            for name, size in (("attn_q", HEADS * HEAD_DIM), ("attn_k", KV_HEADS * HEAD_DIM), ("attn_v", KV_HEADS * HEAD_DIM)):
                vector(f"blk.{i}.{name}.bias", size)
        matrix(f"blk.{i}.attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
        vector(f"blk.{i}.ffn_norm.weight", HIDDEN, 1.0)
        matrix(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        matrix(f"blk.{i}.ffn_up.weight", FFN, HIDDEN, getattr(T, up))
        matrix(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    vector("output_norm.weight", HIDDEN, 1.0)
    if not tied:
        matrix("output.weight", len(tokens), HIDDEN)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    return path
