"""The page's values: what a visitor (or a client of the page's API) sends, checked and turned into settings.

Every check here runs on the server, because a visitor can call the API directly with values the
widgets would never send (None, NaN, a model path for a device). Errors are sentences for the page.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from specdemo import errors
from specdemo.decoding import drafters
from specdemo.settings import CONFIGURATIONS, K_MAX, MAX_PROMPT_TOKENS, GenerationSettings, KPolicy

ONE_AFTER_ANOTHER, RACE = "one after another", "race"
MODES = (ONE_AFTER_ANOTHER, RACE)

# Server-side caps: the page's sliders say the same, but a visitor can call the API directly and
# must not hold the models for longer than this.
MAX_NEW_TOKENS_CAP = 1024
MAX_INSTRUCTION_CHARS = 20_000  # bounds the tokenizer's work, before the prompt is counted in tokens
MAX_K = K_MAX  # draft length offered in the page (the one ceiling, settings.K_MAX)

ASSETS = Path(__file__).resolve().parent.parent.parent / "assets"
EXAMPLES_PATH = ASSETS / "examples.json"


@dataclass(frozen=True)
class PageValues:
    """One press of Generate: the page's inputs, in the order the page (and its API) sends them."""

    instruction: str = ""
    max_new_tokens: float = GenerationSettings.max_new_tokens
    k: float = KPolicy.k  # drafts per round when K is not automatic
    k_auto: bool = True  # the planner picks K for this machine
    adaptive: bool = False  # K grows after a fully accepted round and shrinks after a rejection
    drafter: str = GenerationSettings.drafter  # a strategy's name (specdemo/decoding/drafters)
    decoding: str = "greedy"  # "greedy" or "sampling"
    temperature: float = 0.7  # sampling only, like top_p, top_k and seed
    top_p: float = 0.95
    top_k: float = 50
    seed: float | None = None  # None or "": a random seed
    target_device: str = "CPU"
    draft_device: str = "CPU"
    mode: str = ONE_AFTER_ANOTHER  # ONE_AFTER_ANOTHER or RACE
    genai: bool = False  # also run OpenVINO GenAI's speculative pipeline as a third lane
    configuration: str = "faithful"  # "faithful" (the GGUF's fidelity: settings.FAITHFUL) or "fastest" (INT4 target)

    def generation(self) -> GenerationSettings:
        """GenerationSettings from these values. Raises ValueError with a sentence for a user."""
        max_new_tokens = _whole(self.max_new_tokens)
        if isinstance(max_new_tokens, int) and max_new_tokens > MAX_NEW_TOKENS_CAP:
            raise ValueError(f"max new tokens is capped at {MAX_NEW_TOKENS_CAP:,} on this page, got {max_new_tokens:,}")
        sampling = self.decoding == "sampling"
        return drafters.checked(GenerationSettings(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature if sampling else 0.0,
            top_k=_whole(self.top_k) if sampling else 0,
            top_p=self.top_p if sampling else 1.0,
            seed=None if self.seed is None or self.seed == "" else _whole(self.seed),
            k_policy=self.k_policy(),
            drafter=self.drafter,
        ))

    def k_policy(self) -> KPolicy:
        """The page's K controls as one KPolicy: Adaptive wins over Auto K, and both start from the slider's K."""
        k = _whole(self.k)
        if self.adaptive:
            return KPolicy.adaptive(k)
        return KPolicy.auto(k=k) if self.k_auto else KPolicy.fixed(k)

    def check(self) -> GenerationSettings:
        """Every check that needs no model: the settings, the instruction's length, the mode and the devices."""
        settings = self.generation()
        check_instruction(self.instruction)
        check_choices(self.mode, self.target_device, self.draft_device)
        if self.configuration not in CONFIGURATIONS:
            raise ValueError(f"the configuration must be one of {', '.join(CONFIGURATIONS)}, got {self.configuration!r}")
        return settings


def _whole(value):
    """Sliders and number boxes send 48.0 for 48; anything else passes on for the settings to refuse."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def check_instruction(instruction: str) -> None:
    """Refuse an empty instruction, or one over the server-side cap, before it takes a place in the line (one too long
    for the context: the engine)."""
    if instruction is None or not instruction.strip():
        raise ValueError("the instruction is empty")  # as text.clean_instruction says it
    if len(instruction or "") > MAX_INSTRUCTION_CHARS:
        raise ValueError(
            f"the instruction is {len(instruction):,} characters; this page accepts at most {MAX_INSTRUCTION_CHARS:,}"
        )


def check_prompt(ids: list[int]) -> None:
    """Refuse a prompt over the server-side token cap (the chat template's own tokens count too)."""
    if len(ids) > MAX_PROMPT_TOKENS:
        raise ValueError(f"the prompt is {len(ids):,} tokens; this page accepts at most {MAX_PROMPT_TOKENS:,}")


@functools.cache
def offered_devices() -> tuple[str, ...]:
    """The OpenVINO devices the page offers for each model."""
    import openvino as ov

    return tuple(ov.Core().available_devices)


def check_choices(mode, target_device: str, draft_device: str) -> None:
    """Refuse a run mode or device the page does not offer. The page's API passes None, or anything
    for a mode, through to the handler, and a new device would make every visitor wait while the
    models load again."""
    if mode not in MODES:
        raise ValueError(f"the run mode must be {ONE_AFTER_ANOTHER!r} or {RACE!r}, got {mode!r}")
    for role, device in (("target", target_device), ("draft", draft_device)):
        if device not in offered_devices():
            raise ValueError(f"the {role} device must be one of {', '.join(offered_devices())}, got {device!r}")


def as_sentence(error: Exception) -> str:
    """Errors inside specdemo are lower-case clauses; the page shows them as sentences."""
    text = errors.describe(error)
    return text[0].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")


def load_examples(path: Path = EXAMPLES_PATH) -> list[dict]:
    """The example instructions: [{"label", "instruction", "drafter"}]."""
    return json.loads(path.read_text(encoding="utf-8"))
