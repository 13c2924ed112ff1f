"""llama.cpp as a peer: llama-cpp-python's `Llama` on the very GGUF files specdemo ships, fed our prompt token ids, in a
process of its own (peers.PeerProcess: no OpenVINO thread pool beside it), timed as llama.cpp times itself (the prompt
to the first token apart from the decoding after it); where llama.cpp's own tools are built (LLAMACPP_BIN, else PATH),
`llama-bench` and `llama-speculative-simple` too, each in its own process. Greedy, three ways: autoregressive (one
llama_decode a token); prompt lookup (the bindings' `LlamaPromptLookupDecoding` as `draft_model`, up to K a round); the
0.5B GGUF proposing K a round (the bindings ship only the `draft_model` interface, ids so far -> draft ids: DraftLlama
fills it with a second `Llama`). With a drafter, `Llama.generate` verifies a round as our loop does: one llama_decode of
[last token] + drafts with logits everywhere, drafts kept while they equal the target's greedy token, the KV cache cut
at the first mismatch. llama-cpp-python is optional (requirements-llamacpp.txt): `missing()` gives the line printed
instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from specdemo.bench.table import Output
from specdemo.decoding.drafters import STRATEGIES
from specdemo.host import machine
from specdemo.models import export, sources

SKIPPED = "llama.cpp: skipped (pip install -r requirements-llamacpp.txt)"
N_CTX = 4096  # tokens of context per llama.cpp model: the longest prompt the CLI takes (2,048) plus 1,024 new, and more


def missing() -> str | None:
    """None when llama_cpp loads; otherwise the one line saying why the llama.cpp peer is skipped."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return SKIPPED
    except (OSError, RuntimeError) as error:  # installed, but its shared library does not load here
        return (f"llama.cpp: skipped (llama_cpp is installed but does not load: {error}; rebuild it here with "
                "pip install --force-reinstall --no-cache-dir -r requirements-llamacpp.txt)")
    return None


def gguf_path(source: str, progress: sources.Progress | None = None) -> Path | None:
    """The GGUF file of model `source`, or None if it has none (an IR folder, a Hugging Face model): a local .gguf as it
    is; a preset's assembled once into SPECDEMO_HOME/bench/gguf/<preset>.gguf (sha256-checked, renamed in whole)."""
    if source not in sources.PRESETS:
        path = Path(source).expanduser()
        return path if path.is_file() and path.suffix == ".gguf" else None
    path = sources.specdemo_home() / "bench" / "gguf" / f"{source}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            export.assemble_parts(sources.PRESETS[source], scratch, progress or (lambda fraction, message: None))
            os.replace(scratch, path)
        finally:
            scratch.unlink(missing_ok=True)
    return path


class DraftLlama:
    """The bindings' draft-model interface (`LlamaDraftModel`) on a second `Llama`: K greedy drafts a call. Its KV cache
    follows the text (`Llama.generate` evaluates only what the ids add to the prefix it holds), so a round costs the
    target's new tokens plus K draft steps, as in our loop."""

    def __init__(self, llm, k: int):
        self.llm, self.k = llm, k

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        drafts = islice(self.llm.generate(input_ids.tolist(), temp=0.0, repeat_penalty=1.0), self.k)
        return np.array(list(drafts), dtype=np.intc)

    def reset(self) -> None:
        """Forget the cached text, so the next run prefills the draft from its prompt again."""
        self.llm.reset()


class Tally:
    """A drafter that counts what the target kept of its drafts: `Llama.generate` calls it after every round with the
    ids so far, which end with the drafts kept and the target's own token, so a round kept the ids a call brings beyond
    the previous call's, less one. A run's last round is left uncounted."""

    def __init__(self, drafter):
        self.drafter, self.proposed, self.accepted = drafter, 0, 0
        self._last: tuple[int, int] | None = None  # (ids given, drafts returned) of the previous call

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        if self._last is not None:
            given, drafted = self._last
            self.proposed += drafted
            self.accepted += len(input_ids) - given - 1
        drafts = self.drafter(input_ids)
        self._last = (len(input_ids), len(drafts))
        return drafts


class LlamaCppPeer:
    """llama.cpp on a target GGUF, and optionally a draft GGUF, each model loaded on first use. Two copies of the
    target: a step needs the last position's logits only, verifying needs every position's (`logits_all`, which costs a
    prefill a logits row per prompt token), so each mode runs the way it is fastest."""

    def __init__(self, target: Path, draft: Path | None = None):
        import llama_cpp

        self.target, self.draft, self.threads = target, draft, machine.usable_cores()
        self.version = llama_cpp.__version__
        self.system_info = llama_cpp.llama_print_system_info().decode().strip()
        self._models: dict[str, object] = {}

    def _model(self, role: str):
        """A model by role: the target as "plain" (last logits only) or "verifier" (logits everywhere), or the "draft"."""
        if role not in self._models:
            from llama_cpp import Llama

            path = self.draft if role == "draft" else self.target
            self._models[role] = Llama(str(path), n_ctx=N_CTX, n_threads=self.threads, n_threads_batch=self.threads,
                                       logits_all=role == "verifier", verbose=False)
        return self._models[role]

    def generate(self, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int], drafter: str | None = None,
                 k: int = 4, ngram: int = 3) -> Output:
        """Greedy; `drafter` None (autoregressive) or the strategy of ours whose drafting llama.cpp's mirrors: the draft
        GGUF where it needs a model, else prompt lookup (n-grams of up to `ngram` tokens), with up to `k` drafts a
        round. Timed from the prompt ids in hand to the last token, prefill included."""
        if len(prompt_ids) + max_new_tokens + k + 1 > N_CTX:
            raise ValueError(f"llama.cpp's context is {N_CTX:,} tokens: a {len(prompt_ids):,}-token prompt and "
                             f"{max_new_tokens:,} new tokens do not fit")
        drafts = self._drafter(drafter, k, ngram) if drafter else None
        llm = self._model("plain" if drafts is None else "verifier")
        llm.draft_model = tally = None if drafts is None else Tally(drafts)  # the plain copy never drafts
        ids: list[int] = []
        start = time.perf_counter()
        if isinstance(drafts, DraftLlama):
            drafts.reset()
        llm.reset()  # no prefix cache: every run prefills its whole prompt, as ours do
        first = None
        for token in llm.generate(prompt_ids, temp=0.0, repeat_penalty=1.0):
            first = first or time.perf_counter() - start
            ids.append(token)
            if token in eos_ids or len(ids) == max_new_tokens:
                break
        wall = time.perf_counter() - start
        return Output(ids, wall, first or wall, proposed=tally.proposed if tally else 0,
                      accepted=tally.accepted if tally else 0)

    def _drafter(self, drafter: str, k: int, ngram: int):
        if not STRATEGIES[drafter].needs_model:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            return LlamaPromptLookupDecoding(max_ngram_size=ngram, num_pred_tokens=k)
        if self.draft is not None:
            return DraftLlama(self._model("draft"), k)
        raise ValueError(f"llama.cpp drafts like {drafter!r} with a draft model, and the draft is no GGUF file")


# ---- llama.cpp's own tools


def tool(name: str) -> Path | None:
    """llama.cpp's program `name` ("llama-bench"): in LLAMACPP_BIN where set, else on PATH; None where not built."""
    folder = os.environ.get("LLAMACPP_BIN")
    found = shutil.which(name, path=folder) if folder else shutil.which(name)
    return Path(found) if found else None


def llama_bench(model: Path, prompt_tokens: int, new_tokens: int, threads: int, repetitions: int = 5) -> tuple[float, float]:
    """(pp, tg): llama-bench's prompt processing of `prompt_tokens` and generation of `new_tokens`, tokens/s, each the
    mean of its `repetitions` (its default) after its own warm-up."""
    out = subprocess.run([str(tool("llama-bench")), "-m", str(model), "-p", str(prompt_tokens), "-n", str(new_tokens),
                          "-t", str(threads), "-r", str(repetitions), "-o", "json"], capture_output=True, text=True,
                         check=True).stdout
    return bench_rates(out)


def bench_output(prompt_ids: list[int], max_new_tokens: int, model: Path, threads: int) -> Output:
    """llama-bench as one lane's generation, run beside the other lanes on each instruction (the host's speed drifts
    over minutes): pp at this prompt's length, then tg `max_new_tokens`, one repetition after its own warm-up. Its row
    holds the prefill at pp's rate and the decoding at tg's; its tokens are its own and unseen (it prints none)."""
    p = len(prompt_ids)
    pp, tg = llama_bench(model, p, max_new_tokens, threads, repetitions=1)
    return Output([], p / pp + max_new_tokens / tg, p / pp, produced=max_new_tokens + 1)


def bench_rates(output: str) -> tuple[float, float]:
    """(pp, tg) tokens/s from llama-bench's `-o json` output: a list of tests, a pp one (n_gen 0) and a tg one."""
    tests = json.loads(output)
    pp = next(t["avg_ts"] for t in tests if t["n_gen"] == 0)
    tg = next(t["avg_ts"] for t in tests if t["n_prompt"] == 0)
    return pp, tg


@dataclass(frozen=True)
class Printed:
    """What llama-speculative-simple prints of one run, as it counts: the prompt's encoding, then the decoding (its first
    token's step counted there)."""

    prompt_tokens: int
    prefill_s: float  # seconds encoding the prompt
    tokens: int  # tokens decoded
    decode_s: float  # their seconds
    proposed: int  # n_drafted
    accepted: int  # n_accept


def speculative_simple(target: Path, draft: Path, prompt: str, new_tokens: int, k: int, threads: int) -> Printed:
    """llama-speculative-simple on `prompt` (text, its chat template applied), greedy, up to `k` drafts a round, else its
    defaults."""
    done = subprocess.run([str(tool("llama-speculative-simple")), "-m", str(target), "-md", str(draft), "-p", prompt,
                           "-n", str(new_tokens), "-t", str(threads), "-c", str(N_CTX), "--spec-type", "draft-simple",
                           "--spec-draft-n-max", str(k), "--temp", "0", "--top-k", "1", "--seed", "0"],
                          capture_output=True, text=True, check=True)
    return printed(done.stderr + done.stdout)


def printed(log: str) -> Printed:
    """Printed from llama-speculative-simple's closing lines ("encoded  N tokens in  S seconds", ..., "n_accept  = N")."""
    number = lambda name: int(re.search(rf"{name}\s*=\s*(\d+)", log).group(1))  # noqa: E731
    (p, p_s), (n, n_s) = (re.search(rf"{what}\s+(\d+) tokens in\s+([\d.]+) seconds", log).groups()
                          for what in ("encoded", "decoded"))
    return Printed(int(p), float(p_s), int(n), float(n_s), number("n_drafted"), number("n_accept"))
