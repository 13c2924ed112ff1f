"""The engine: a loaded model pair and the two ways to run it on one instruction.

    engine = Engine.load(RunSettings())           # prepares (converts once) and compiles both models
    for event in engine.speculative("Write a function ...", GenerationSettings()):
        ...                                       # TokenEvents, then one Summary

The engine yields plain events and knows nothing of how they are shown (CLI, app, benchmark). Loading one model is
specdemo/models/loading.py's; what a pair learns of the machine at warm-up, specdemo/learning/warmup.py's.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import replace
from functools import cached_property
from typing import Callable, Iterator

import numpy as np

from specdemo.decoding import loops, planner, pricing
from specdemo.decoding.costs import CostModel
from specdemo.decoding.drafters import STRATEGIES, Strategy, make_drafter, strategy
from specdemo.decoding.planner import Plan, make_plan
from specdemo.learning import builtin, measuring, warmup
from specdemo.learning.profile import Keys, Profile, machine_profile
from specdemo.models import sources
from specdemo.models.chat import encode_chat, encode_example
from specdemo.models.loading import LoadedModel, load_model
from specdemo.results.counterfactual import Counterfactual, counterfactual, draft_pass
from specdemo.settings import K_MAX, GenerationSettings, KPolicy, ModelSettings, RunSettings

# Calls that get a compile of their own with every shape fixed (OVModel._compile_fixed): the target's verifications of 3
# to 6 drafts (the planner's K on every class measured), the draft's two tokens after a round whose drafts were all
# accepted (its last draft, which it did not feed, and the target's bonus). On the 2-core Zen 4 (EPYC family 25 model
# 17), both lanes of 12 code answers in one process alternating with and without them: verifications of 4, 5 and 6
# tokens took 1.7-2.2 ms less (0.95×), the draft's two tokens 1.4 ms less (0.89×); each compile holds 31-45 MiB.
TARGET_FIXED_CALLS = (4, 5, 6, 7)
DRAFT_FIXED_CALLS = (2,)
_NO_LIMIT = GenerationSettings(max_new_tokens=1)  # a built-in prompt is checked against the context, not an answer

# Encodings compared when checking that a draft tokenizer matches the target's.
_PROBE_TEXTS = ["def fibonacci(n):\n    return n", "Hello, world! Ünïcödé 你好 🙂", "<|im_start|>user\nhi<|im_end|>"]


def no_draft_model() -> str:
    """What a lane that needs the draft model says when none is loaded."""
    return (f"no draft model is loaded; choose a drafter that needs none "
            f"({', '.join(s.name for s in STRATEGIES.values() if not s.needs_model)})")


class IncompatibleModelsError(ValueError):
    """The draft cannot draft for the target (different tokenizers)."""


def check_same_tokenizer(target, draft) -> None:
    """Raise IncompatibleModelsError unless both tokenizers map text to the same ids."""
    if len(target) != len(draft):
        raise IncompatibleModelsError(
            f"the draft model's tokenizer has {len(draft):,} tokens and the target's {len(target):,}: "
            "draft tokens would not be target tokens; pick a draft from the same model family"
        )
    for text in _PROBE_TEXTS:
        if target.encode(text) != draft.encode(text):
            raise IncompatibleModelsError(
                f"the draft model's tokenizer encodes {text!r} differently from the target's; "
                "pick a draft from the same model family"
            )


class Engine:
    """A target model, optionally a draft model, and the decoding loops over them."""

    def __init__(self, target: LoadedModel, draft: LoadedModel | None, profile: Profile | None = None):
        if draft is not None:
            check_same_tokenizer(target.tokenizer, draft.tokenizer)
        self.target = target
        self.draft = draft
        self.tokenizer = target.tokenizer
        self.eos_ids = target.eos_ids()
        self.lock = threading.Lock()  # one generation at a time: the KV caches are shared state
        self.profile = profile or machine_profile()  # what this machine has learnt; the engine only reads it in a run
        self.keys = Keys(None, self._pair_key())  # where this pair's costs (after warm_up) and history live there
        self.noise = None  # fidelity.BatchingNoise of the target's compile, after warm_up(): what partings are judged by
        self.warm_up_s = 0.0  # seconds the last warm_up() took (compilation, first calls, measuring)
        self.planned: dict[tuple[str, KPolicy], Plan] = {}  # the last plan() by drafter and K policy (plan_change)

    @property
    def costs(self) -> CostModel | None:
        """This machine's call costs for this pair, after warm_up(), as the runs since have corrected them."""
        return self.profile.costs(self.keys.costs)

    def _pair_key(self) -> str:
        names = [str(self.target.folder), str(self.draft.folder) if self.draft else "", str(self.draft.settings.head_tokens) if self.draft else ""]
        return hashlib.sha256("|".join(names).encode()).hexdigest()[:12]

    def warm_up(self, k_max: int = K_MAX, fresh: bool = False, log=lambda message: None, quick: bool = False) -> float:
        """Pay every first-call cost before anything is timed, and know this machine's call costs.

        Runs each shape a generation uses (the prompt's prefill, one token, and up to k_max + 1 tokens)
        on both models; the first time for these models on this machine it also times them (about a
        minute; `quick`: a few seconds, provisional, the rest left for `learn`) and keeps the cost model
        in the machine profile; `fresh` re-measures. Returns the seconds it took, also kept in
        `warm_up_s`; no lane's figures include them.
        """
        start = time.perf_counter()
        with self.lock:
            self.keys, self.noise = warmup.know_machine(self._learning(), k_max, fresh, log, quick)
        self.warm_up_s = time.perf_counter() - start
        return self.warm_up_s

    def to_learn(self, k_max: int = K_MAX, log=lambda message: None, interrupted=lambda: False,
                 pair_only: bool = False) -> list[tuple[str, Callable[[], None]]]:
        """What a quick warm-up left to learn (warmup.remaining; `interrupted()` may stop the longest step part-way;
        `pair_only`, what outlives this compile), each step taking the engine's lock as it runs: the caller runs them
        one at a time, between runs. The engine holds the batching noise a step returns."""
        def locked(step: Callable[[], object]) -> Callable[[], None]:
            def run() -> None:
                with self.lock:
                    noise = step()
                    if noise is not None:
                        self.noise = noise
            return run
        steps = warmup.remaining(self._learning(), self.noise, k_max, log, interrupted, pair_only)
        return [(what, locked(step)) for what, step in steps]

    def _learning(self) -> warmup.Pair:
        """What a warm-up is handed of this engine: values, never the engine (it assigns what comes back)."""
        return warmup.Pair(self.target.runtime, self.draft.runtime if self.draft else None, self.profile, self.keys,
                           self._builtin_examples)

    @cached_property
    def _builtin_examples(self) -> list[tuple[list[int], list[int]]]:
        """The built-in code answers as (prompt ids, answer ids) in this pair's chat template, each prompt checked
        against the context: what the warm-up measures the batching noise and the draft's agreement on."""
        examples = [encode_example(self.tokenizer, e, self.target.name) for e in builtin.code_answers()]
        for prompt, _ in examples:
            self.check_room(prompt, _NO_LIMIT)
        return examples

    @property
    def provisional(self) -> str:
        """What this pair has not learnt yet, in words ("" once it knows it all): its predictions rest on less until
        then."""
        missing = []
        costs = self.costs
        if costs is not None and costs.provisional:
            missing.append("a quick first measurement of its call costs")
        if costs is not None and costs.busy:
            missing.append("call costs measured while the host was busy, until runs correct them")
        if self.draft is not None and any(o.chosen and o.provisional
                                          for o in self.profile.planned_options(self.draft.settings)):
            missing.append("a draft plan measured while the host was busy (the page plans again once the host is "
                           "quiet; `python -m specdemo tune --draft-plan` does it now)")
        if self.noise is None:
            missing.append("no batching noise measured yet")
        if warmup.needs_calibration(self.profile, self.keys.pair, self.draft is not None):
            missing.append("the strategies' prior acceptance, not yet this machine's")
        return "; ".join(missing)

    def plan(self, instruction: str, settings: GenerationSettings) -> Plan:
        """How the speculative lane will run this instruction: which drafter, which K, and why. Needs this machine's
        costs for these models (warm_up first).

        Under auto K, where the instruction quotes text for the answer to copy, the settings' strategy may hand over to
        another (Planning.when_quoting: the draft model to the hybrid, which drafts by lookup where the text repeats);
        a fixed K keeps the drafter the settings name.
        """
        if not self.knows_costs(settings):
            raise RuntimeError("plan() needs this machine's call costs for these models up to K + 1 tokens: warm_up() first")
        asked = strategy(settings.drafter)
        if asked.needs_model and self.draft is None:
            raise ValueError(no_draft_model())
        drafter = planner.drafter_for(asked, settings.k_policy, instruction)
        plan = make_plan(self.costs, drafter, self._prior(drafter, settings.greedy), settings.k_policy)
        changed = planner.plan_change(self.planned.get((drafter.name, settings.k_policy)), plan)
        self.planned[(drafter.name, settings.k_policy)] = plan
        if changed:
            plan = replace(plan, reason=f"{plan.reason} {changed}")
        if drafter is not asked:
            plan = replace(plan, reason=plan.reason + " (The instruction quotes text for the answer to copy.)")
        return plan

    def acceptance(self):
        """This pair's acceptance history, as the machine profile holds it now."""
        return self.profile.acceptance(self.keys.pair)

    def knows_costs(self, settings: GenerationSettings) -> bool:
        """Whether this machine's costs for this pair span every verify call a plan under `settings` may price."""
        return self.costs is not None and self.costs.n_max >= planner.calls_needed(settings.k_policy)

    def _prior(self, drafter: Strategy, greedy: bool) -> pricing.Acceptance:
        """The acceptance a drafter's plan assumes: a hybrid's K is the draft model's."""
        return self.acceptance().prior(drafter.planning.prior, greedy)

    def _price(self, greedy: bool):
        """price(drafter, k): this machine's predicted speedup of one round, for the hybrid drafter's choice each round
        (it names its parts)."""
        history, costs_now = self.acceptance(), self.costs
        priced = {s.name: (s, history.prior(s.planning.prior, greedy)) for s in STRATEGIES.values()}
        return lambda name, k: pricing.predicted_speedup(costs_now, priced[name][1], k, priced[name][0])

    @classmethod
    def load(cls, settings: RunSettings, progress: sources.Progress | None = None, with_draft: bool = True,
             profile: Profile | None = None) -> "Engine":
        """Both models compiled as this machine's profile resolves `settings` (tune's choice where they leave it open)."""
        profile = profile or machine_profile()

        def load(model: ModelSettings, resolved: ModelSettings, fixed_calls: tuple[int, ...]) -> LoadedModel:
            return load_model(resolved, progress, profile.gain(resolved), planned=profile.from_plan(model),
                              fixed_calls=fixed_calls)

        target = profile.resolve(settings.target)
        draft = profile.resolve(settings.draft) if with_draft else None
        if draft is None or not sources.fits_beside(draft, target):
            return cls(load(settings.target, target, TARGET_FIXED_CALLS),
                       load(settings.draft, draft, DRAFT_FIXED_CALLS) if draft is not None else None, profile)
        # A first start: the draft converted, compiled and its first call made (where the plugin lays out its weights) on a
        # thread of its own while the target converts (two conversion children, one a core), so the shorter of the two
        # is hidden in the longer.
        drafted: dict = {}

        def load_draft() -> None:
            try:
                drafted["model"] = load(settings.draft, draft, DRAFT_FIXED_CALLS)
                measuring.first_call(drafted["model"].runtime)
            except BaseException as error:  # noqa: BLE001 - raised again below, in the loading thread
                drafted["error"] = error

        beside = threading.Thread(target=load_draft, name="draft-beside", daemon=True)
        beside.start()
        loaded = load(settings.target, target, TARGET_FIXED_CALLS)
        beside.join()
        if "error" in drafted:
            raise drafted["error"]
        return cls(loaded, drafted["model"], profile)

    def prompt_ids(self, instruction: str, settings: GenerationSettings) -> list[int]:
        """The instruction wrapped in the target's chat template, as token ids.

        The instruction is cleaned first (see clean_instruction). Raises ValueError for an empty
        instruction or one that leaves no room in the context for max_new_tokens.
        """
        ids = self._encode_chat(instruction, settings.system_prompt)
        self.check_room(ids, settings)
        return ids

    def check_room(self, ids: list[int], settings: GenerationSettings) -> None:
        """ValueError unless `ids` and settings.max_new_tokens fit in both models' context."""
        limit = self.target.context_length
        if self.draft is not None:
            limit = min(limit, self.draft.context_length)
        if len(ids) + settings.max_new_tokens > limit:
            raise ValueError(
                f"the prompt is {len(ids):,} tokens; with max_new_tokens={settings.max_new_tokens:,} that "
                f"exceeds the model's context of {limit:,} tokens"
            )

    def _encode_chat(self, instruction: str, system_prompt: str) -> list[int]:
        return encode_chat(self.tokenizer, instruction, system_prompt, self.target.name)

    # ---- the lanes. A side-by-side run (specdemo/run/sidebyside.py) tokenizes and plans once and calls the *_ids forms;
    # the instruction forms run one lane by itself (a library call, the tests).

    def autoregressive(self, instruction: str, settings: GenerationSettings,
                       cancel: threading.Event | None = None) -> Iterator[loops.Event]:
        yield from self.autoregressive_ids(self.prompt_ids(instruction, settings), settings, cancel)

    def autoregressive_ids(self, ids: list[int], settings: GenerationSettings,
                           cancel: threading.Event | None = None) -> Iterator[loops.Event]:
        with self.lock:
            yield from loops.autoregressive(self.target.runtime, self.tokenizer, ids, settings, self.eos_ids, cancel)

    def speculative(self, instruction: str, settings: GenerationSettings,
                    cancel: threading.Event | None = None) -> Iterator:
        """One speculative lane by itself: its Plan first (when there are costs to plan by; a plan that chooses K by
        them warms up for them first), then the loop's events."""
        ids = self.prompt_ids(instruction, settings)
        if planner.needs_costs(settings.k_policy) and not self.knows_costs(settings):
            self.warm_up(settings.k_max)
        yield from self.speculative_ids(ids, settings, self.plan_lane(instruction, settings), cancel)

    def plan_lane(self, instruction: str, settings: GenerationSettings) -> Plan:
        """The plan a speculative lane drafts by: plan() with its confidence stop; without this machine's costs (no
        warm-up), the settings' drafter and K, unpriced."""
        plan = self.plan(instruction, settings) if self.costs is not None else \
            planner.unpriced(settings.k_policy, strategy(settings.drafter))
        return planner.with_confidence_stop(plan, settings.draft_p_min)

    def speculative_ids(self, ids: list[int], settings: GenerationSettings, plan: Plan,
                        cancel: threading.Event | None = None, memories: dict[str, object] | None = None) -> Iterator:
        """The speculative lane on prompt `ids`: the plan first (when priced), then the loop's events; the plan's rule
        chooses each round's K. `memories`: what the run's owner's earlier runs left a drafter that keeps something
        across runs (drafters.memories(); None: nothing)."""
        if plan.drafter.needs_model and self.draft is None:
            raise ValueError(no_draft_model())
        rng = np.random.default_rng(settings.seed)
        price = self._price(settings.greedy) if self.costs is not None else None
        drafter = make_drafter(plan.drafter, self.draft.runtime if self.draft else None, settings, rng, price,
                               plan.stops, memories, plan.gate)
        if plan.priced:
            yield plan
        with self.lock:
            yield from loops.speculative(self.target.runtime, drafter, self.tokenizer, ids, settings, self.eos_ids,
                                         cancel, rng, plan)

    def would_have_given(self, prompt_ids: list[int], settings: GenerationSettings, answer_ids: list[int],
                         rounds=None) -> Counterfactual | None:
        """What every K, the per-round oracle and every model-free strategy would have given on this greedy answer
        (None when sampling: a sampled answer has no such counterfactual). One teacher-forced draft pass, corrected by
        the `rounds` of the speculative run that wrote the answer where they observed the draft (counterfactual.py); it
        carries what it teaches the planner (`evidence`: each walked strategy's acceptance at every position, even after
        a run that drafted nothing; the caller hands it to Profile.learn_from_answer). Needs this machine's costs."""
        if not settings.greedy or not answer_ids:
            return None
        if self.costs is None:
            raise RuntimeError("would_have_given() prices by this machine's costs: warm_up() first")
        with self.lock:
            mask, confidence = draft_pass(self.draft.runtime, prompt_ids, answer_ids) if self.draft is not None \
                else (None, None)
        return counterfactual(mask, prompt_ids, answer_ids, self.costs, settings, rounds, confidence)
