"""What each K would have given on one greedy answer, as a record and in words: the Walks and the Counterfactual that
results/counterfactual.py walks them into, the sentences every renderer says of them, and their reading back from a
run file (from_dict).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from specdemo.decoding.drafters import strategy
from specdemo.decoding.planner import describe_stops, gating_sentence


@dataclass
class Walk:
    """One way of drafting walked over the answer: what it would have called and paid."""

    k: int  # drafts asked per round (the oracle: 0, its K varies)
    rounds: int  # target calls after the prefill
    target_calls: int  # the prefill included
    draft_calls: int  # draft-model calls (the first feeds the prompt); 0 for prompt lookup
    seconds: float  # predicted seconds of the lane, prefills included
    speedup: float  # predicted autoregressive seconds ÷ these
    accepted: list[int] = field(default_factory=list)  # drafts accepted in each round
    ks: list[int] = field(default_factory=list)  # the oracle's K of each round
    stops: tuple[float, ...] = ()  # the confidence stop the walk drafted with, per draft position (): none
    gate: float = 0.0  # the gate on a round's first draft the walk ran with (pricing.gate_threshold); 0: none
    gated: int = 0  # of its rounds, those the gate turned back (a draft step, then a plain target step)


@dataclass
class Counterfactual:
    """What the speculative lane would have given on one greedy answer, for every K and drafter."""

    tokens: int  # the answer's length N
    matches: list[int]  # m[j] for j = 0 … N-1 (1: the draft's greedy token equals the answer's; m[0] is the prefill's)
    autoregressive_s: float  # predicted seconds of the autoregressive lane on this answer
    fixed: list[Walk]  # the draft model at K = 1 … k_max
    oracle: Walk  # the best K for every round
    replayed: dict[str, list[Walk]]  # each replayable model-free strategy (replay_drafters) at K = 1 … k_max, by name
    greedy_only: bool = True  # a reminder for readers of the JSON: sampled runs have no counterfactual
    observed: int = 0  # positions of the mask the run's own drafting observed (the rest from the teacher-forced pass)
    corrected: int = 0  # of them, where the teacher-forced pass had guessed otherwise
    stopped: list[Walk] = field(default_factory=list)  # the draft model at K = 1 … k_max with this machine's confidence
    #                                                     stop (pricing.confidence_stops); [] without the pass
    gated: list[Walk] = field(default_factory=list)  # the same in gated rounds (pricing.gate_threshold); [] without the
    #                                                   pass or a gate
    # What the answer teaches the acceptance prior, per drafter: (tested, accepted) drafts at positions 1 … k_max
    # (mask_counts, replay_counts); the engine fills it, whoever drained the run hands it to the machine profile.
    evidence: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)

    def best_fixed(self) -> Walk:
        return max(self.fixed, key=lambda w: w.speedup)

    def replay_sentences(self) -> list[str]:
        """"prompt lookup would have given 1.21× at K = 4 (no draft model)", one per model-free strategy."""
        out = []
        for name, walks in self.replayed.items():
            best = max(walks, key=lambda w: w.speedup)
            out.append(f"{strategy(name).label} would have given {best.speedup:.2f}× at K = {best.k} (no draft model)")
        return out

    def stop_sentence(self) -> str:
        """What this machine's confidence stop would have done at the best fixed K, in words ("" without the pass)."""
        if not self.stopped:
            return ""

        best = self.best_fixed()
        stopped = self.stopped[best.k - 1]
        return (f"With the confidence stop (this machine's break-even per draft: {describe_stops(stopped.stops)}), K = "
                f"{best.k} would have made {stopped.draft_calls} draft calls instead of {best.draft_calls}, for "
                f"{stopped.speedup:.2f}× instead of {best.speedup:.2f}×.")

    def gate_sentence(self) -> str:
        """What gated rounds would have done at their best K, in words ("" without them): "In gated rounds (a round's
        first draft verified only at a confidence of 0.43 or more, else a plain target step), K = 4 would have given
        1.05× (gated: 51 of 55 rounds drafted)."."""
        if not self.gated:
            return ""
        best = max(self.gated, key=lambda w: w.speedup)
        return (f"In gated rounds (a round's first draft verified only at a confidence of {best.gate:.2f} or more, else "
                f"a plain target step), K = {best.k} would have given {best.speedup:.2f}× "
                f"({gating_sentence(best.rounds - best.gated, best.gated)}).")

    def to_dict(self) -> dict:
        return {name: value for name, value in asdict(self).items() if name != "evidence"}

    @classmethod
    def from_dict(cls, data: dict) -> "Counterfactual":
        """The counterfactual as a run file keeps it (to_dict; keys a later version added take their defaults)."""
        known = {f.name for f in fields(cls)} - {"evidence"}
        walks = lambda items: [_walk(w) for w in items]  # noqa: E731
        values = {key: data[key] for key in known if key in data}
        values.update(fixed=walks(data["fixed"]), oracle=_walk(data["oracle"]),
                      replayed={name: walks(items) for name, items in data["replayed"].items()},
                      stopped=walks(data.get("stopped", [])), gated=walks(data.get("gated", [])))
        return cls(**values)


def _walk(data: dict) -> Walk:
    known = {f.name for f in fields(Walk)}
    walk = Walk(**{key: value for key, value in data.items() if key in known})
    walk.stops = tuple(walk.stops)  # a JSON list in the file, a tuple as walked
    return walk


def sentences(would: Counterfactual | None, target_calls: int) -> list[str]:
    """What each K would have given on this answer beside what the run did (`target_calls`), in the sentences the page
    and the terminal both say: the best fixed K against the oracle, then the confidence stop's and the gate's."""
    if would is None:
        return ["What each K would have given: greedy decoding only (a sampled answer has no such counterfactual)."]
    if not would.fixed:
        return ["On this answer " + "; ".join(would.replay_sentences()) + " (predicted)."]
    best = would.best_fixed()
    said = (f"On this very answer (predicted from this machine's costs): the best fixed K = {best.k} would have given "
            f"{best.speedup:.2f}× in {best.target_calls} target calls, the best K for every round {would.oracle.speedup:.2f}× "
            f"in {would.oracle.target_calls}; this run took {target_calls}.")
    return [part for part in (said, would.stop_sentence(), would.gate_sentence()) if part]
