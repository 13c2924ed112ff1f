"""The machine profile: the one owner of what this machine has learnt, asked through one object.

    profile = machine_profile()                        # this SPECDEMO_HOME's, for this CPU and OpenVINO
    settings = profile.resolve(settings)               # tune's compile setting, faithful layout and draft plan where left open
    costs = profile.costs(keys.costs)                  # the cost curve, as measured and corrected by runs
    prior = profile.acceptance(keys.pair).prior("model", greedy=True)
    profile.learn(keys, generation, result.rounds)     # by whoever drained a lane, outside the engine's lock

What it holds (one file, one atomic write, a schema version: specdemo/learning/profile/store.py): `tune`, the compile choice
and draft plan (written by `python -m specdemo tune`, specdemo/learning/tune.py); `costs`, per compiled pair, the cost curve
(specdemo/decoding/costs.py) with its corrections; `noise`, per compiled pair, how far batched calls move a top-2 gap
(specdemo/results/fidelity.py); `acceptance`, per model pair, the drafts tested and accepted at each position
(specdemo/learning/profile/acceptance.py).

SPECDEMO_LEARN=0 (the tests set it) freezes what runs teach, and keeps what a warm-up measures (costs, noise) in this
process's memory only; tune's choice, asked for by a command, is still written. A home that refuses a write (a full
disk, a read-only home) turns learning off the same way for the rest of the process (store.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from specdemo.decoding.costs import CostModel, fold
from specdemo.host import machine
from specdemo.learning.profile import choices
from specdemo.learning.profile.acceptance import AcceptanceHistory, folded
from specdemo.learning.profile.store import Store, path_for
from specdemo.models import sources
from specdemo.results import metrics
from specdemo.results.fidelity import BatchingNoise
from specdemo.settings import GenerationSettings, ModelSettings


@dataclass(frozen=True)
class Keys:
    """Where one loaded pair's knowledge lives in the profile."""

    costs: str | None  # measuring.cost_key of the compiled target and draft (None before warm-up): cost curve, noise
    pair: str  # the pair's model folders and draft head: its acceptance history


def learning() -> bool:
    """Whether SPECDEMO_LEARN lets runs teach the planner and correct the cost model (0 freezes both: the tests)."""
    return os.environ.get("SPECDEMO_LEARN", "1") != "0"


class Profile:
    """What this machine has learnt under one SPECDEMO_HOME."""

    def __init__(self, home: Path | None = None):
        self.home = home or sources.specdemo_home()
        facts = machine.compile_facts()
        self.store = Store(path_for(self.home, facts), facts)
        self._memo: dict = {}  # CostModels parsed from the data read last (the loop prices rounds with them)
        self._memo_of: dict | None = None

    def learns(self) -> bool:
        """Whether runs teach this profile and what warm-ups measure is written: SPECDEMO_LEARN allows it and the home
        has not refused a write."""
        return learning() and not self.store.refused

    # ---- what tune chose (specdemo/learning/profile/choices.py)

    def tune(self) -> dict:
        return self.store.section("tune")

    def resolve(self, settings: ModelSettings) -> ModelSettings:
        """`settings` with tune's choice where they leave it open: the draft plan's precision and head, the compile
        setting (choices.apply). Explicit settings win."""
        return choices.apply(settings, self.tune())

    def resolve_precision(self, settings: ModelSettings) -> ModelSettings:
        """`settings` with a faithful precision replaced by this machine's faithful layout and an auto one by the draft
        plan's choice (the weights a run will load)."""
        return choices.resolve_precision(settings, self.tune())

    def for_plugin(self, settings: ModelSettings) -> ModelSettings:
        """`settings` as OpenVINO GenAI can load them: a faithful target on specdemo's kernels here gets the plugin's
        fastest faithful layout instead (choices.for_plugin)."""
        return choices.for_plugin(settings, self.tune())

    def faithful_choice(self, target: ModelSettings) -> dict | None:
        """The faithful layout this machine chose for a target left to it ({precision, seconds, chosen_at}), or None."""
        return choices.faithful_choice(target, self.tune())

    def keep_faithful(self, target: ModelSettings, precision: str, seconds: dict[str, float]) -> None:
        """Keep `precision` as the target's faithful layout here (`seconds`: each raced layout's single step)."""
        self.store.update("tune", lambda tune: choices.with_faithful(tune, target, precision, seconds))

    def chosen(self, settings: ModelSettings) -> choices.Setting | None:
        return choices.chosen(settings, self.tune())

    def gain(self, settings: ModelSettings) -> str:
        return choices.gain(settings, self.tune())

    def planned_options(self, draft: ModelSettings) -> list:
        return choices.planned_options(draft, self.tune())

    def from_plan(self, draft: ModelSettings) -> bool:
        return choices.from_plan(draft, self.tune())

    def needs_plan(self, draft: ModelSettings) -> bool:
        return choices.needs_plan(draft, self.tune())

    def provisional_plan(self, draft: ModelSettings) -> bool:
        return choices.provisional_plan(draft, self.tune())

    def stamp(self) -> int:
        """When tune's choice last changed (0: never): what was compiled before it is stale."""
        return choices.stamp(self.tune())

    def tune_record(self, draft: ModelSettings) -> dict:
        record = choices.record(draft, self.tune())
        return {"file": self.store.path.name, **record} if record else {}

    def keep_tune(self, trials: list, settings: dict[str, ModelSettings], drafts: list | None = None) -> None:
        """Keep what a tune (trials) or a draft plan (drafts) chose."""
        self.store.update("tune", lambda tune: choices.with_tune(tune, trials, settings, drafts))

    def forget_tune(self) -> None:
        """Drop tune's choices (the defaults compile again); a new stamp tells a running page to recompile."""
        self.store.update("tune", lambda tune: {"changed_ns": time.time_ns()})

    # ---- the cost curve and the batching noise of one compiled pair

    def costs(self, key: str | None) -> CostModel | None:
        data = self.store.read()
        if data is not self._memo_of:
            self._memo, self._memo_of = {}, data
        if key not in self._memo:
            section = data.get("costs") if isinstance(data.get("costs"), dict) else {}
            entry = section.get(key) if key else None
            try:
                self._memo[key] = CostModel.from_dict(entry["costs"]) if entry else None
            except (KeyError, TypeError, ValueError):
                self._memo[key] = None  # a damaged entry is measured again
        return self._memo[key]

    def keep_costs(self, key: str, costs: CostModel, description: dict | None = None) -> None:
        def change(section: dict) -> dict:
            old = section.get(key) if isinstance(section.get(key), dict) else {}
            return {**section, key: {"key": description or old.get("key"), "costs": costs.to_dict()}}

        self.store.update("costs", change, save=self.learns())

    def noise(self, key: str | None):
        """fidelity.BatchingNoise of this compile, or None before it was measured."""
        entry = self.store.section("noise").get(key) if key else None
        try:
            return BatchingNoise.from_dict(entry) if entry else None
        except (KeyError, TypeError, ValueError):
            return None

    def keep_noise(self, key: str, noise) -> None:
        self.store.update("noise", lambda section: {**section, key: noise.to_dict()}, save=self.learns())

    # ---- the acceptance history of one model pair (specdemo/learning/profile/acceptance.py)

    def acceptance(self, pair: str) -> AcceptanceHistory:
        return AcceptanceHistory(self.store.section("acceptance").get(pair))

    def record_acceptance(self, pair: str, drafter: str, greedy: bool, tested: Sequence[float],
                          accepted: Sequence[float]) -> None:
        self._record(pair, greedy, {drafter: (tested, accepted)})

    def _record(self, pair: str, greedy: bool, evidence: dict) -> None:
        """Fold one run's evidence ({drafter: (tested, accepted) by position}) into the pair's history, in one write."""
        evidence = {drafter: counts for drafter, counts in evidence.items() if sum(counts[0])}
        if not evidence:
            return

        def change(section: dict) -> dict:
            counts = section.get(pair) or {}
            for drafter, (tested, accepted) in evidence.items():
                counts = folded(counts, drafter, greedy, tested, accepted)
            return {**section, pair: counts}

        self.store.update("acceptance", change, save=self.learns())

    # ---- learning from runs: called by whoever drained a lane (CLI, page, bench), never under the engine's lock

    def learn(self, keys: Keys, settings: GenerationSettings, rounds: Sequence, finished: bool = True,
              busy: bool = False) -> None:
        """Correct the cost curve by what a lane's calls cost (`busy`: the host was busy while it ran, so it cannot
        show a busy measurement wrong: costs.CLEAN_RUNS); a finished sampled speculative lane also teaches the
        acceptance prior by its rounds (greedy ones teach by their answer's match mask: learn_from_answer)."""
        if not self.learns() or not rounds or keys.costs is None:
            return
        observation = {**metrics.call_seconds(rounds), "busy": busy}

        def corrected(section: dict) -> dict:
            entry = section.get(keys.costs)
            try:
                costs = CostModel.from_dict(entry["costs"])
            except (KeyError, TypeError, ValueError):
                return section  # measured under another key since (a recompile), or damaged: nothing to correct
            return {**section, keys.costs: {**entry, "costs": fold(costs, observation).to_dict()}}

        self.store.update("costs", corrected)
        # Each part of a hybrid teaches its own history. A run with gated rounds teaches nothing: the rounds the gate
        # let through are those the draft was sure of, and would teach an acceptance above the draft's own.
        if not settings.greedy and finished and not any(r.gated for r in rounds):
            self._record(keys.pair, False, {name: metrics.evidence_by_position([r for r in rounds if r.drafter == name],
                                                                                 settings.k_max)
                                            for name in {r.drafter for r in rounds if r.drafter}})

    def learn_from_answer(self, keys: Keys, evidence: dict[str, tuple[list[int], list[int]]]) -> None:
        """Teach the greedy prior what a counterfactual found: per drafter, drafts tested and accepted by position."""
        if self.learns():
            self._record(keys.pair, True, evidence)


_PROFILES: dict[Path, Profile] = {}


def machine_profile(home: Path | None = None) -> Profile:
    """The profile of `home` (default: SPECDEMO_HOME), one object per home in a process."""
    home = (home or sources.specdemo_home()).resolve()
    if home not in _PROFILES:
        _PROFILES[home] = Profile(home)
    return _PROFILES[home]
