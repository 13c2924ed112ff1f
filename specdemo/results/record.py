"""A finished side-by-side run, all it says, typed: the one thing the terminal (cli/terminal.py), the page
(ui/render.py) and `show` (runfile.compare) render, and what a run file holds (to_json gives runfile.py's schema,
from_json reads it back). SideBySide.finish makes it once the lanes let go of the engines; nothing here needs one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from specdemo.decoding.costs import CostModel
from specdemo.decoding.events import Round, TokenEvent
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results.failures import Failure
from specdemo.results.fidelity import BatchingNoise
from specdemo.results.lane import Result, finished
from specdemo.results.metrics import Summary, measured_speedup
from specdemo.results.parting import Parting
from specdemo.results.would import Counterfactual
from specdemo.settings import GenerationSettings, KPolicy, ModelSettings, RunSettings

SCHEMA = 1  # runfile.py's: a file of another schema is not read


@dataclass
class Record:
    """One run, finished or stopped: its lanes and everything judged of them once."""

    instruction: str  # as the model saw it (text.clean_instruction: lone surrogates made U+FFFD)
    configuration: str  # "faithful", "fastest" or "custom": RunSettings.configuration when the run was made
    settings: RunSettings | None  # as the engines were loaded and ran; None: a saved run whose settings this version cannot read
    lanes: dict[str, Result | None]  # by lane (autoregressive, speculative); None: the lane failed
    stopped: bool = False  # Stop was pressed (a lane may have ended before it)
    planned: dict | None = None  # what the speculative lane planned, as the file keeps it (Plan.to_dict; the live Plan
    #                              is its lane's Result.plan)
    costs: CostModel | None = None  # this machine's call costs the run was planned and predicted by; None: unpriced
    would: Counterfactual | None = None  # what each K would have given (a finished greedy pair), else None
    parting: Parting | None = None  # where greedy lanes part, judged once; None: identical, or not both greedy and finished
    failures: list[Failure] = field(default_factory=list)  # where the drafts failed (a finished run), most frequent first
    provisional: str = ""  # what the engine had not learnt of this machine yet (Engine.provisional): the prediction says so
    machine: dict = field(default_factory=dict)  # host.machine.describe()
    models: dict[str, dict] = field(default_factory=dict)  # per role: the model panel's facts and compile_properties
    batching_noise: BatchingNoise | None = None  # how far the target's batched calls moved a top-2 gap from single steps
    warm_up_s: float | None = None  # seconds of warm-up before the run (part of no lane)

    @property
    def autoregressive(self) -> Result | None:
        return self.lanes.get(AUTOREGRESSIVE)

    @property
    def speculative(self) -> Result | None:
        return self.lanes.get(SPECULATIVE)

    @property
    def lanes_finished(self) -> bool:
        """Both lanes ended by themselves (lane.finished, the one rule): their figures compare."""
        return finished(self.autoregressive) and finished(self.speculative)

    @property
    def finished(self) -> bool:
        """Both lanes ended by themselves and Stop was not pressed (not even after they ended): a run to walk the
        counterfactual of and to keep as a file."""
        return self.lanes_finished and not self.stopped

    def summaries(self) -> dict[str, Summary]:
        return {lane: result.summary for lane, result in self.lanes.items() if result is not None}

    def to_json(self) -> dict:
        """The run in runfile.py's schema (a finished run: both lanes there)."""
        ar, spec = self.autoregressive, self.speculative
        return {
            "schema": SCHEMA,
            "instruction": self.instruction,
            "configuration": self.configuration,
            "settings": asdict(self.settings) if self.settings is not None else None,
            "machine": self.machine,
            "models": self.models,
            AUTOREGRESSIVE: _lane_json(ar),
            SPECULATIVE: _lane_json(spec),
            "measured_speedup": measured_speedup(ar.summary, spec.summary),
            "parting": asdict(self.parting) if self.parting is not None else None,
            "batching_noise": self.batching_noise.to_dict() if self.batching_noise is not None else None,
            "warm_up_s": self.warm_up_s,
            "costs": self.costs.to_dict() if self.costs is not None else None,
            "plan": self.planned,
            "counterfactual": self.would.to_dict() if self.would is not None else None,
            "failures": [asdict(f) for f in self.failures],
        }

    @classmethod
    def from_json(cls, run: dict) -> "Record":
        """A run read back from its file (to_json's schema). What an older version wrote and this one cannot read
        back (its settings, costs or batching noise) is None; figures it did not keep take their defaults."""
        return cls(
            instruction=run["instruction"],
            configuration=run.get("configuration", "–"),
            settings=_readable(_settings, run.get("settings")),
            lanes={lane: _readable(_lane, run.get(lane)) for lane in (AUTOREGRESSIVE, SPECULATIVE)},
            planned=run.get("plan"),
            costs=_readable(CostModel.from_dict, run.get("costs")),
            would=Counterfactual.from_dict(run["counterfactual"]) if run.get("counterfactual") else None,
            parting=Parting(**run["parting"]) if run.get("parting") else None,
            failures=[Failure(f["kind"], f["count"], [tuple(e) for e in f["examples"]]) for f in run.get("failures", [])],
            machine=run.get("machine", {}),
            models=run.get("models", {}),
            batching_noise=_readable(BatchingNoise.from_dict, run.get("batching_noise")),
            warm_up_s=run.get("warm_up_s"),
        )


def _lane_json(result: Result) -> dict:
    """One lane: its ids and text, its tokens, its round records and its summary."""
    return {"token_ids": result.ids, "text": result.text, "tokens": [_token_json(t) for t in result.tokens],
            "rounds": [r.to_dict() for r in result.rounds], "summary": result.summary.to_dict()}


TOKEN_KEYS = ("id", "text", "source", "step", "t", "rejected")  # what a reader of one run needs of a token


def _token_json(event: TokenEvent) -> dict:
    return {key: round(value, 6) if key == "t" else value for key, value in event.to_dict().items() if key in TOKEN_KEYS}


def _lane(data: dict) -> Result:
    return Result([TokenEvent(**{k: v for k, v in t.items() if k in TOKEN_KEYS}) for t in data.get("tokens", [])],
                  known(Summary, data["summary"]), [known(Round, r) for r in data.get("rounds", [])])


def known(kind, data: dict):
    """A dataclass from a dict a file kept: keys it no longer has left out, fields it has since gained at their defaults."""
    names = {f.name for f in fields(kind)}
    return kind(**{key: value for key, value in data.items() if key in names})


def _settings(data: dict) -> RunSettings:
    generation = dict(data["generation"], k_policy=KPolicy(**data["generation"]["k_policy"]))
    return RunSettings(ModelSettings(**data["target"]), ModelSettings(**data["draft"]), GenerationSettings(**generation))


def _readable(read, data):
    """`read(data)`, or None where there is nothing or a version before this one wrote it otherwise."""
    if data is None:
        return None
    try:
        return read(data)
    except (KeyError, TypeError, ValueError):
        return None
