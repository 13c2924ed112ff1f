"""OpenVINO GenAI's own pipeline as a lane beside ours.

`openvino_genai.LLMPipeline` on the very IR folders our engine loaded: plain, with `draft_model=`
(its C++ speculative decoding) or with `prompt_lookup=True`. `stream()` feeds it the same prompt
token ids, K and decoding settings as our lanes and turns what its streamer receives into our
TokenEvents and its performance metrics into our Summary, so the page shows it like our lanes.
GenAI does not say which of its tokens were drafted, so every token is marked as the target's; the
streamer call it arrived in is its step (one call per verify round).
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from specdemo import errors
from specdemo.decoding.drafters import DEFAULT, strategy
from specdemo.decoding.events import TARGET, Detokenizer, TokenEvent
from specdemo.host import compat
from specdemo.learning.profile import machine_profile
from specdemo.models import sources
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results import metrics
from specdemo.results.metrics import Summary
from specdemo.settings import GenerationSettings, ModelSettings

_DONE = object()  # the generate thread's last word


def make_pipeline(target: Path, device: str, properties: dict, draft: Path | None = None, draft_device: str = "",
                  prompt_lookup: bool = False, draft_properties: dict | None = None):
    """An LLMPipeline on specdemo's IR folders. `properties` (and `draft_properties`, else the same) are OpenVINO compile
    properties (ours, from compile_properties, so both sides run the same kernels, tuned ones included);
    GenAI's continuous-batching backend (its default on CPU) schedules its own streams. Raises errors.GenAIError, one
    sentence, when OpenVINO refuses to compile it."""
    import openvino_genai as genai

    for folder in (target, draft):
        if folder is not None and _on_specdemo_kernels(Path(folder)):
            raise errors.GenAIError(f"OpenVINO GenAI cannot run {Path(folder).name}: its weights are laid out for "
                                    "specdemo's own kernels (gguf-native or gguf-q4), which GenAI's pipelines do not "
                                    "load; run GenAI's lane on a gguf-mixed or int8 model")
    kwargs = dict(properties)
    # Prefix caching (on by default) keeps a prompt's KV blocks for the next request with the same prompt,
    # so repeating a prompt would time GenAI without a prefill. Off; no limit on tokens per batch.
    scheduler = genai.SchedulerConfig()
    scheduler.enable_prefix_caching = False
    scheduler.max_num_batched_tokens = 1 << 32
    kwargs["scheduler_config"] = scheduler
    try:
        if draft is not None:
            kwargs["draft_model"] = genai.draft_model(str(draft), draft_device or device,
                                                      **(draft_properties or properties))
        if prompt_lookup:
            kwargs["prompt_lookup"] = True
        return genai.LLMPipeline(str(target), device, **kwargs)
    except RuntimeError as error:
        raise errors.GenAIError(errors.openvino_sentence(error, "compile OpenVINO GenAI's pipeline")) from error


def _on_specdemo_kernels(folder: Path) -> bool:
    """Whether the IR in `folder` holds specdemo's BlockMatMul (its XML names every op's type)."""
    xml = folder / "openvino_model.xml"
    return xml.is_file() and 'type="BlockMatMul"' in xml.read_text(errors="ignore")


def fit(properties: dict) -> tuple[dict, str]:
    """`properties` as GenAI's paged attention on CPU accepts them, and what changed, in words ("" if nothing).

    Its CPU kernel keeps an f32 KV cache only beside f32 inference and a bf16 one only beside bf16 (found by compiling
    every pair: tests/learning/test_tuned_machine.py compiles each pair tune can choose on the machine); f16 and u8 caches go with
    either. Where tune chose another pair for our lanes (bf16 inference with an f32 cache), GenAI gets the nearest pair
    it takes: the same inference precision (the kernels' speed), the KV cache in that precision.
    """
    inference, kv = properties.get("INFERENCE_PRECISION_HINT", ""), properties.get("KV_CACHE_PRECISION", "")
    if not inference or kv not in ("f32", "bf16") or kv == inference:
        return properties, ""
    return ({**properties, "KV_CACHE_PRECISION": inference},
            f"KV cache {inference} instead of our {kv} (its paged attention takes an {kv} cache only with {kv} inference)")


def compile_properties(settings: ModelSettings) -> dict:
    """Our compile properties for GenAI's pipeline too, so both sides run the same kernels (precision hint, KV cache
    precision, dynamic quantization, as tuned for this machine), fitted to what GenAI accepts (`fit`); GenAI's
    continuous-batching backend schedules its own streams, so only these pass."""
    return fit(_our_properties(settings))[0]


def fitted(target: ModelSettings, draft: ModelSettings | None = None) -> str:
    """What GenAI's compile of these models runs differently from ours, in words ("" when nothing)."""
    notes = [f"{role}: {note}" for role, model in (("target", target), ("draft", draft)) if model is not None
             if (note := fit(_our_properties(model))[1])]
    return "; ".join(notes)


def _our_properties(settings: ModelSettings) -> dict:
    config = compat.compile_config(machine_profile().resolve(settings), sources.specdemo_home() / "ov_cache")
    kept = ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "DYNAMIC_QUANTIZATION_GROUP_SIZE", "CACHE_DIR")
    return {key: value for key, value in config.items() if key in kept}


def generation_config(settings: GenerationSettings, eos_ids: set[int], k: int | None):
    """GenAI's config for our settings; `k` drafts per round when speculative (GenAI keeps K fixed)."""
    import openvino_genai as genai

    # A fresh config: the folder's generation_config.json would add Qwen's sampling defaults.
    config = genai.GenerationConfig(max_new_tokens=settings.max_new_tokens, stop_token_ids=set(eos_ids))
    config.apply_chat_template = False  # the ids already carry our chat template
    config.do_sample = not settings.greedy
    if not settings.greedy:
        config.temperature = settings.temperature
        config.top_p = settings.top_p
        if settings.top_k:  # our 0 keeps every token; GenAI's default (the largest size_t) does, its 0 does not
            config.top_k = settings.top_k
        if settings.seed is not None:
            config.rng_seed = settings.seed
    if k is not None:
        config.num_assistant_tokens = k
        config.max_ngram_size = settings.lookup_ngram
    return config


def stream(pipeline, tokenizer, prompt_ids: list[int], settings: GenerationSettings, eos_ids: set[int], k: int | None,
           cancel: threading.Event | None = None, drafter: str = DEFAULT, compiled_as: str = "") -> Iterator[TokenEvent | Summary]:
    """Run GenAI on `prompt_ids` and yield a TokenEvent per token as its streamer receives them, then a Summary
    (`compiled_as`: how its compile differs from ours, `fitted`, carried into the Summary).

    generate() blocks, so it runs on its own thread; its streamer hands token ids over a queue.
    `cancel` stops it at its next streamer call.
    """
    import openvino as ov
    import openvino_genai as genai

    inbox: queue.SimpleQueue = queue.SimpleQueue()
    cancel = cancel or threading.Event()

    class Streamer(genai.StreamerBase):
        def write(self, token):
            inbox.put((time.perf_counter(), [token] if isinstance(token, int) else list(token)))
            return genai.StreamingStatus.CANCEL if cancel.is_set() else genai.StreamingStatus.RUNNING

        def end(self):
            pass

    def run():
        try:
            prompt = ov.Tensor(np.asarray([prompt_ids], dtype=np.int64))
            result = pipeline.generate(prompt, generation_config(settings, eos_ids, k), Streamer())
            inbox.put((time.perf_counter(), result))
        except Exception as error:  # raised again below, in the caller's thread
            inbox.put((time.perf_counter(), error))
        inbox.put((time.perf_counter(), _DONE))

    detokenizer, events, step = Detokenizer(tokenizer, prompt_ids), [], 0
    start = time.perf_counter()
    threading.Thread(target=run, daemon=True, name="specdemo-genai").start()
    result = None
    while (item := inbox.get())[1] is not _DONE:
        at, payload = item
        if isinstance(payload, Exception):
            if errors.is_openvino(payload):
                raise errors.GenAIError(errors.openvino_sentence(payload, "run OpenVINO GenAI's pipeline")) from payload
            raise payload
        if isinstance(payload, list):
            step += 1
            for token_id in payload:
                events.append(TokenEvent(token_id, detokenizer.add(token_id), TARGET, step, at - start))
                yield events[-1]
        else:
            result, end = payload, at
    ids = [int(t) for t in result.tokens[0]]
    for token_id in ids[len(events):]:  # what the streamer was not given (a stop token)
        events.append(TokenEvent(token_id, detokenizer.add(token_id), TARGET, step, end - start))
        yield events[-1]
    summary = _summary(result, events, end - start, k, drafter, cancel.is_set())
    summary.compiled_as = compiled_as
    yield summary


def _summary(result, events: list[TokenEvent], wall_s: float, k: int | None, drafter: str, cancelled: bool) -> Summary:
    """GenAI's figures, by our names (specdemo/results/metrics.py): it reports totals only, so no per-round figures."""
    summary = Summary(mode=SPECULATIVE if k is not None else AUTOREGRESSIVE, tokens=len(events), wall_s=wall_s,
                      ttft_s=events[0].t if events else 0.0, tokens_per_s=metrics.tokens_per_s(len(events), wall_s),
                      stop_reason="cancelled" if cancelled else "", mean_k=float(k or 0), drafter=drafter if k else "")
    perf = result.extended_perf_metrics
    if k is not None and hasattr(perf, "get_num_draft_tokens"):
        summary.proposed, summary.accepted = perf.get_num_draft_tokens(), perf.get_num_accepted_tokens()
        summary.draft_acceptance_rate = metrics.draft_acceptance_rate(summary.accepted, summary.proposed)
    return summary


def describe(k: int | None, drafter: str) -> str:
    """How GenAI's pipeline drafted, in words: it keeps K fixed."""
    kind = strategy(drafter).label
    return f"{kind}, K = {k} in every round" if k is not None else "no drafting"
