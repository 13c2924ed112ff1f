"""The peers the benchmark measures us against, on the same prompt token ids (so no side applies a chat template of its
own) and the same K, each in a process of its own (PeerProcess), timed there as its own tools time it: the new token
ids, the wall time of the whole generate call and the time to its first token.
- OpenVINO GenAI: `openvino_genai.LLMPipeline` on the very IR folders specdemo converted, plain, with `draft_model=`
  (its C++ speculative decoding) or with `prompt_lookup=True`.
- transformers on PyTorch CPU: `generate()` plain and with `assistant_model=`, on the weights our IRs were converted
  from (the GGUF dequantized to float32), before NNCF compression: its text may differ where int8 rounding flips a
  near-tie.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import time
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np

from specdemo.bench.table import Output
from specdemo.host import compat
from specdemo.models import export, sources
from specdemo.run import genai
from specdemo.settings import GenerationSettings


class PeerProcess:
    """A peer, `make(*args)`, in a spawned child process (none of this process's threads nor memory), its generate()
    called over a pipe: alone on the cores while our lanes wait, as its users run it, and timed there. `about` names
    attributes read once it is up (llama.cpp's threads and version). The child ends at close(), or when this object is
    collected (the bench lets GenAI's pipelines go by dropping them)."""

    def __init__(self, make: Callable, *args, about: tuple[str, ...] = ()):
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        process = context.Process(target=_serve, args=(child, make, args, about), daemon=True)
        process.start()
        self.close = weakref.finalize(self, _stop, self._pipe, process)
        for name, value in zip(about, self._answer()):
            setattr(self, name, value)

    def generate(self, *args, **kwargs) -> Output:
        self._pipe.send((args, kwargs))
        return self._answer()

    def _answer(self):
        answer = self._pipe.recv()
        if isinstance(answer, BaseException):
            raise answer
        return answer


def _serve(pipe, make: Callable, args: tuple, about: tuple[str, ...]) -> None:
    """The child's loop: the peer and its `about` attributes, then one generate() per request until None; an error is
    sent back, for the parent to raise where it asked."""
    try:
        peer = make(*args)
        pipe.send(tuple(getattr(peer, name) for name in about))
    except Exception as error:  # noqa: BLE001
        pipe.send(error)
        return
    while (request := pipe.recv()) is not None:
        try:
            pipe.send(peer.generate(*request[0], **request[1]))
        except Exception as error:  # noqa: BLE001
            pipe.send(error)


def _stop(pipe, process) -> None:
    """Ask the child to end and wait for it; one that does not end in 30 s is killed."""
    try:
        pipe.send(None)
    except OSError:  # it is gone already
        pass
    process.join(timeout=30)
    if process.is_alive():
        process.kill()


class GenAIPeer:
    """openvino_genai.LLMPipeline on specdemo's IR folders (specdemo/run/genai.py): plain, with a draft model, or
    prompt lookup, on GenAI's continuous-batching backend (its default on CPU). `properties` (the target's) and
    `draft_properties` (None: the target's) are compile properties, {} for GenAI's defaults: ours, so both sides run the
    same kernels, each model its own tuned group size (a target's 256 would put an INT4 draft on the slow path)."""

    def __init__(self, target: Path, target_device: str, properties: dict, draft: Path | None = None,
                 draft_device: str = "", prompt_lookup: bool = False, draft_properties: dict | None = None):
        self.speculative = draft is not None or prompt_lookup
        self.pipeline = genai.make_pipeline(target, target_device, properties, draft, draft_device, prompt_lookup,
                                            draft_properties=draft_properties)

    def generate(self, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int], k: int = 4, ngram: int = 3) -> Output:
        import openvino as ov

        settings = GenerationSettings(max_new_tokens=max_new_tokens, lookup_ngram=ngram)  # greedy
        config = genai.generation_config(settings, eos_ids, k if self.speculative else None)
        prompt = ov.Tensor(np.asarray([prompt_ids], dtype=np.int64))
        start = time.perf_counter()
        result = self.pipeline.generate(prompt, config)
        wall = time.perf_counter() - start
        # GenAI's own TTFT and generate duration (ms): what it counts after the first token is the decoding
        timed = result.perf_metrics
        first = wall - (timed.get_generate_duration().mean - timed.get_ttft().mean) / 1000
        run = Output(ids=[int(t) for t in result.tokens[0]], wall_s=wall, first_s=first)
        metrics = result.extended_perf_metrics
        if self.speculative and hasattr(metrics, "get_num_draft_tokens"):
            run.proposed, run.accepted = metrics.get_num_draft_tokens(), metrics.get_num_accepted_tokens()
        return run


class TransformersPair:
    """A transformers target, optionally with an assistant, in float32 on the CPU."""

    def __init__(self, target: Path, draft: Path | None):
        compat.hide_broken_torchvision()
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        # Quiet: per-tensor loading bars, and a deprecation notice assisted generation triggers itself.
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        self.torch = torch
        self.target = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
        self.draft = AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float32).eval() if draft else None

    def generate(self, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int], k: int | None = None) -> Output:
        """Greedy; with `k`, assisted generation with exactly k assistant tokens per round."""
        from transformers import GenerationConfig

        torch = self.torch
        config = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=sorted(eos_ids), pad_token_id=min(eos_ids)
        )
        kwargs = {}
        if k is not None:
            # The assistant's own generation config steers drafting: a constant K, and no early stop
            # on low confidence (its default 0.4 would cut rounds short, so K would not be K).
            assistant = self.draft.generation_config
            assistant.num_assistant_tokens = k
            assistant.num_assistant_tokens_schedule = "constant"
            assistant.assistant_confidence_threshold = 0.0
            kwargs["assistant_model"] = self.draft
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        stamps = []  # when each of generate()'s puts came: the prompt, then each step's new tokens
        streamer = SimpleNamespace(put=lambda value: stamps.append(time.perf_counter()), end=lambda: None)
        with torch.inference_mode():
            start = time.perf_counter()
            out = self.target.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                       streamer=streamer, **kwargs)
            wall = time.perf_counter() - start
        first = stamps[1] - start if len(stamps) > 1 else wall
        return Output(ids=out[0, len(prompt_ids) :].tolist(), wall_s=wall, first_s=first)


def hf_weights(source: str, progress: sources.Progress | None = None) -> Path | None:
    """A Hugging Face folder holding the weights `source` is converted from, or None if there is none: a local one as it
    is; a preset's GGUF dequantized once into SPECDEMO_HOME/bench/hf/<preset> (float32 safetensors, for the bench only:
    ~6 GB for the 1.5B, ~2 GB for the 0.5B; ~1 min on first use)."""
    if source not in sources.PRESETS:
        path = Path(source).expanduser()
        return path if (path / "config.json").is_file() else None
    folder = sources.specdemo_home() / "bench" / "hf" / source
    if hf_weights_missing(source):
        _dequantize_preset(source, folder, progress or (lambda fraction, message: None))
    return folder


def hf_weights_missing(source: str) -> bool:
    """Whether hf_weights(source) would first have to dequantize a preset (and write gigabytes)."""
    return source in sources.PRESETS and not (sources.specdemo_home() / "bench" / "hf" / source / "config.json").is_file()


def _dequantize_preset(preset: str, folder: Path, progress: sources.Progress) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        export.assemble_parts(sources.PRESETS[preset], scratch / "model.gguf", progress)
        compat.hide_broken_torchvision()
        export.gguf_to_hf_folder(str(scratch), "model.gguf", str(scratch / "hf"))
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(scratch / "hf", folder)  # atomic: complete or absent
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
