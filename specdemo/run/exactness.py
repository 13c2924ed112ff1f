"""Whether greedy speculative output still equals autoregressive output under a compile of tune's own choosing
(cli/tune_command.py asks it of a target setting other than the defaults): each built-in instruction run side by side
(sidebyside.py, as any run) and its parting judged as every run's is (results/parting.py).
"""

from __future__ import annotations

from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results.lane import drain
from specdemo.results.parting import parting
from specdemo.run.engine import Engine
from specdemo.run.sidebyside import SideBySide
from specdemo.settings import GenerationSettings, KPolicy, RunSettings

CHECKED = RunSettings(generation=GenerationSettings(max_new_tokens=48, k_policy=KPolicy.fixed(4)))  # greedy, fixed K


def check_exact(engine: Engine, instructions: list[str], settings: RunSettings = CHECKED) -> str:
    """"" when greedy speculative output equals autoregressive output on each of `instructions` on `engine` (warmed up:
    nothing here is measured), a parting allowed only at a near-tie; else a sentence saying where they part."""
    for instruction in instructions:
        run = SideBySide({AUTOREGRESSIVE: engine, SPECULATIVE: engine}, instruction, settings)
        run.prepare()
        ar, spec = drain(run.lane(AUTOREGRESSIVE)), drain(run.lane(SPECULATIVE))
        parted = parting(ar.tokens, spec.tokens, engine.noise)
        if parted is not None and parted.verdict != "near-tie":
            return f"speculative output parts from autoregressive output at token {parted.index + 1} of {instruction!r}"
    return ""
