"""One model loaded: a compiled model with its tokenizer and the facts the panel shows.

    model = load_model(profile.resolve(ModelSettings(...)))   # prepares (converts once), then compiles
    model.describe()                                          # name, parameters, precision, size, KV cache, ...

A pair of them, and the loops over it, is the engine's (specdemo/run/engine.py).
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from specdemo.host import compat
from specdemo.models import sources, vocab
from specdemo.models.runtime import OVModel
from specdemo.settings import WEIGHTS, ModelSettings


@dataclass(frozen=True)
class Facts:
    """What the model panel, a run file and a bench report say of one loaded model (LoadedModel.describe)."""

    name: str
    source: str  # its preset's name or its path
    parameters: int  # approximate, from its config
    precision: str  # weights: "int8", "int4", "fp16", "gguf-native", ...
    weights: str  # that precision in words
    precision_from: str  # "the draft plan" or "the settings"
    size_on_disk_bytes: int  # its IR's files
    device: str
    kv_cache_precision: str  # as its runtime reports it
    layers: int | None
    context_length: int  # tokens
    compile_settings: str  # describe_compile's words
    lm_head_rows: int  # fewer than the vocabulary when the head was trimmed
    tuned: str  # what tune's choice bought (LoadedModel.tuned)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class LoadedModel:
    """A compiled model with its tokenizer and facts for display."""

    settings: ModelSettings
    folder: Path
    runtime: OVModel
    tokenizer: object  # a transformers tokenizer
    config: dict  # the model's config.json
    tuned: str = ""  # what tune's choice bought, as it stood when this model was compiled (Profile.gain)
    planned_precision: bool = False  # its weight precision is the draft plan's choice (auto, a plan, its weights prepared)

    @property
    def name(self) -> str:
        source = self.settings.source
        title = sources.PRESETS[source].title if source in sources.PRESETS else Path(source).name or source
        return title

    @property
    def context_length(self) -> int:
        return int(self.config.get("max_position_embeddings", 2048))

    def kv_bytes_per_token(self) -> int:
        """Bytes the KV cache grows by per token: keys and values of every layer, at the cache's precision."""
        c = self.config
        heads = c.get("num_attention_heads", 1) or 1
        head_dim = c.get("head_dim", c.get("hidden_size", 0) // heads)
        kv_heads = c.get("num_key_value_heads", heads)
        return 2 * c.get("num_hidden_layers", 0) * kv_heads * head_dim * self.runtime.kv_cache_element_bytes

    def eos_ids(self) -> set[int]:
        """End-of-sequence ids: the tokenizer's and generation_config's (chat models end turns with another)."""
        ids = {self.tokenizer.eos_token_id} - {None}
        path = self.folder / "generation_config.json"
        if path.is_file():
            eos = json.loads(path.read_text()).get("eos_token_id")
            ids |= set(eos if isinstance(eos, list) else [eos]) - {None}
        return ids

    def describe(self) -> Facts:
        """Facts for the model panel: name, parameters, precision, size on disk, device, KV cache."""
        s = self.settings
        return Facts(
            name=self.name,
            source=s.source,
            parameters=_count_parameters(self.config),
            precision=s.precision,
            weights=WEIGHTS.get(s.precision, s.precision),
            precision_from="the draft plan" if self.planned_precision else "the settings",
            size_on_disk_bytes=sum(f.stat().st_size for f in self.folder.glob("openvino_model.*")),
            device=s.device,
            kv_cache_precision=self.runtime.kv_cache_precision,
            layers=self.config.get("num_hidden_layers"),
            context_length=self.context_length,
            compile_settings=describe_compile(s),
            lm_head_rows=self.runtime.head_tokens,
            tuned=self.tuned,
        )


_IMPORTING = threading.Lock()
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")  # what decides the ids
CHAT_TEMPLATE = "chat_template.jinja"  # what renders a chat: each folder keeps its own
_SHARED: dict[str, object] = {}  # tokenizer files' digest -> the tokenizer loaded from them (never changed once loaded)


def load_tokenizer(folder: Path):
    """The tokenizer in `folder`, loaded by one thread at a time: a first start loads the draft on a thread beside the
    target (Engine.load), and where both conversions end together, two threads importing transformers' lazy modules at
    once left one of them with "cannot import name 'AutoTokenizer' from 'transformers'" (a fresh venv, in CI).

    Folders whose tokenizer files are byte-identical share one parse: loading takes 1.5-3 s on 2 cores (transformers
    parses the 11 MB tokenizer.json of Qwen2.5 in Python), and a pair of one family (the default pair) has the same files.
    A folder whose chat template differs (the default pair's two GGUFs differ by one escaped brace in the tool-call
    text) gets a shallow copy of the shared tokenizer holding its own template: the same ids, its own chats. Nothing
    changes a loaded tokenizer: the engine encodes with the target's, and the draft's is only compared with it and
    ranks its LM head's rows."""
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = Path(folder) / name
        digest.update(name.encode() + (path.read_bytes() if path.is_file() else b"\0"))
    key = digest.hexdigest()
    with _IMPORTING:
        if key not in _SHARED:
            compat.hide_broken_torchvision()
            from transformers import AutoTokenizer

            _SHARED[key] = AutoTokenizer.from_pretrained(folder)
            return _SHARED[key]
        shared = _SHARED[key]
    path = Path(folder) / CHAT_TEMPLATE
    template = path.read_text(encoding="utf-8") if path.is_file() else None  # as transformers reads it (from_pretrained)
    if template is None or shared.chat_template == template:
        return shared
    own = copy.copy(shared)
    own.chat_template = template
    return own


def load_model(settings: ModelSettings, progress: sources.Progress | None = None, tuned: str = "",
               planned: bool = False, fixed_calls: tuple[int, ...] = ()) -> LoadedModel:
    """Prepare (convert once) and compile one model as `settings` say: resolved already (Profile.resolve), so nothing
    is left open but what the plugin decides. `tuned` and `planned` are for display (LoadedModel); `fixed_calls`, the
    token counts whose calls get a compile of their own (OVModel)."""
    fresh = not sources.is_prepared(settings)
    folder = sources.prepare(settings, progress)  # first: a conversion (its own process) need not wait for the import
    if progress is not None:
        progress(None, f"compiling {folder.name} for {settings.device}")
    tokenizer = load_tokenizer(folder)
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").is_file() else {}
    head = vocab.head_for(tokenizer, settings.head_tokens, config, sources.specdemo_home() / "vocab")
    # The compile that follows a conversion writes no blob to OpenVINO's model cache: writing it took 3 s of a first
    # start's 42 (1.1 GB for the 1.5B target at gguf-native; Xeon family 6 model 207), and a Space starts from an empty
    # disk each time, where it is never read. A later start writes it and imports it from then on (1 s quicker, and its
    # weights file-backed rather than anonymous: 0.4 GiB less of the budget). A model with our own attention is never
    # imported (OVModel compiles its graph twice, and the two must share its ops' caches).
    cache = None if fresh else sources.specdemo_home() / "ov_cache"
    runtime = OVModel(folder, settings, cache_dir=cache, head_ids=head, fixed_calls=fixed_calls)
    return LoadedModel(settings, folder, runtime, tokenizer, config, tuned, planned)


def describe_compile(settings: ModelSettings) -> str:
    """The compile settings that decide the kernels, in words ("group 128, f32, KV f32")."""
    group = settings.dynamic_quantization_group_size
    group_text = "dyn. quant. default" if group == -1 else f"group {group}" if group else "no dyn. quant."
    head = f", LM head {settings.head_tokens // 1000}k tokens" if settings.head_tokens > 0 else ""
    return f"{group_text}, {settings.inference_precision or 'f32'}, KV {settings.kv_cache_precision or 'f32'}{head}"


def _count_parameters(config: dict) -> int:
    """Approximate parameter count of a decoder-only transformer from its config."""
    h = config.get("hidden_size", 0)
    layers = config.get("num_hidden_layers", 0)
    vocab = config.get("vocab_size", 0)
    inter = config.get("intermediate_size", 4 * h)
    heads = config.get("num_attention_heads", 1) or 1
    kv = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim", h // heads)
    attention = h * heads * head_dim + 2 * h * kv * head_dim + heads * head_dim * h
    per_layer = attention + 3 * h * inter + 2 * h
    embeddings = vocab * h * (1 if config.get("tie_word_embeddings", False) else 2)
    return int(layers * per_layer + embeddings)
