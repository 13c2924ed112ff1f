"""Which tokens a trimmed draft LM head keeps: the most frequent ones in text available offline.

The 0.5B draft's LM head is a 151,936 × 896 matrix, about a quarter of its weights and of the work of
a draft step. Most of those rows are tokens a code assistant almost never emits (other scripts, rare
words). Keeping only the N most frequent tokens makes each draft step cheaper and stays lossless:
the target still verifies every token, and the draft's q is a proper distribution over the kept
tokens (greedy: its argmax among them). A token outside the head can still be emitted, by the
target, as a correction.

Frequencies come from Python's own standard-library sources (code, comments and docstrings in
English) and specdemo's example instructions: text every machine has, counted once and cached under
SPECDEMO_HOME/vocab by tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from collections import Counter
from pathlib import Path

import numpy as np

from specdemo import strict_json

CORPUS_BYTES = 6_000_000  # of standard-library sources: enough for a stable ranking, a few seconds to count
EXAMPLES = Path(__file__).resolve().parents[2] / "assets" / "examples.json"


def corpus_texts(limit: int = CORPUS_BYTES) -> list[str]:
    """The counting corpus: the example instructions, then standard-library modules in a fixed order."""
    texts = [e["instruction"] for e in json.loads(EXAMPLES.read_text(encoding="utf-8"))] if EXAMPLES.is_file() else []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(stdlib.glob("*.py")) + sorted(stdlib.glob("*/*.py")):
        if path.parent.name in ("test", "tests", "idle_test") or path.name.startswith("test_"):
            continue  # test suites repeat odd strings; the library itself reads like ordinary code
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(text)
        if total >= limit:
            break
    return texts


def token_ranking(tokenizer, texts: list[str]) -> np.ndarray:
    """Token ids (int64) ordered from most to least frequent in `texts`; ties broken by id."""
    counts: Counter[int] = Counter()
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        counts.update(ids)
    ranked = sorted(counts, key=lambda i: (-counts[i], i))
    return np.asarray(ranked, dtype=np.int64)


def head_for(tokenizer, head_tokens: int, config: dict, cache_dir: Path | None = None) -> np.ndarray | None:
    """The ids a model's trimmed head keeps for ModelSettings.head_tokens (None: the whole head, for 0 or less), with
    the vocabulary size from the model's config.json."""
    if head_tokens <= 0:
        return None
    return head_ids(tokenizer, head_tokens, int(config.get("vocab_size", len(tokenizer))), cache_dir)


def head_ids(tokenizer, n: int, vocab_size: int, cache_dir: Path | None = None) -> np.ndarray:
    """The sorted ids (int64) a trimmed head of about n rows keeps.

    The n most frequent tokens, plus every special and added token (the end of a turn must always
    be draftable) and the 256 single-byte tokens (so any text stays reachable byte by byte).
    """
    ranking = _cached_ranking(tokenizer, cache_dir)
    keep = set(ranking[:n].tolist())
    if len(keep) < n:
        # Tokens the corpus never used, in id order: byte-level BPE numbers its merges by how often
        # they occurred in the tokenizer's own training text, so lower ids are the more common ones.
        unseen = np.setdiff1d(np.arange(vocab_size), ranking, assume_unique=False)
        keep |= set(unseen[: n - len(keep)].tolist())
    keep |= set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    keep |= _byte_tokens(tokenizer)
    ids = np.asarray(sorted(i for i in keep if 0 <= i < vocab_size), dtype=np.int64)
    return ids


def _byte_tokens(tokenizer) -> set[int]:
    # Byte-level BPE vocabularies spell each byte as one printable character; those are the 256 base tokens.
    vocab = tokenizer.get_vocab()
    return {vocab[ch] for ch in _bytes_to_unicode() if ch in vocab}


def _bytes_to_unicode() -> list[str]:
    """The 256 characters byte-level BPE uses for the bytes 0..255 (GPT-2's reversible mapping)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def _cached_ranking(tokenizer, cache_dir: Path | None) -> np.ndarray:
    digest = hashlib.sha256(strict_json.dumps(sorted(tokenizer.get_vocab().items())).encode()).hexdigest()[:16]
    path = cache_dir / f"ranking-{digest}.npy" if cache_dir is not None else None
    if path is not None and path.is_file():
        return np.load(path)
    ranking = token_ranking(tokenizer, corpus_texts())
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(path.stem + ".tmp.npy")
        np.save(scratch, ranking)
        scratch.replace(path)
    return ranking
