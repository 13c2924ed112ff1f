"""Where two greedy lanes part, and whether that is a near-tie or a defect.

Greedy speculative decoding writes the autoregressive text token for token, up to the kernels: a verify call scores
K + 1 positions in one batched call, and its logits can differ from single-token calls by rounding. Where the target's
top-2 margin is smaller than that difference, either token is the model's choice (a near-tie); a parting with a wider
margin is a defect. The band comes from the compile's measured batching noise (fidelity.BatchingNoise), capped at
what sound compiles showed, and taken from calls nothing was rolled back in where the compile is suspect, so no
defect of the cache or the kernels widens it into an excuse; or the constant verification.NEAR_TIE_LOGIT_GAP where
it was not measured. The CLI, the page and the run file judge a parting here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from specdemo.decoding.verification import NEAR_TIE_LOGIT_GAP
from specdemo.names import SPECULATIVE
from specdemo.results.fidelity import NOISE_CEILING

if TYPE_CHECKING:
    from specdemo.decoding.events import TokenEvent


@dataclass
class Parting:
    """Where two greedy lanes' texts part, and the target's top-2 margin there in each lane."""

    index: int  # the first differing token, from 0
    tokens: list[str]  # the token each lane wrote there (autoregressive, then the other lane)
    margin: list[float]  # logits: the target's top-2 gap at that token in each lane (nan where a lane did not record
    #                      it; null in a saved run)
    verdict: str  # "near-tie": both margins within the band below; else "defect"
    # logits: the largest change of a top-2 gap this compile showed between single-token and batched calls (measured
    # at warm-up: BatchingNoise.trusted_gap_change); None where it was not measured (then the band is NEAR_TIE_LOGIT_GAP)
    noise: float | None = None
    noise_positions: int = 0  # positions that measurement compared
    # why that measurement is out of line with sound compiles (BatchingNoise.suspect; then `noise` is the change with
    # nothing rolled back); None: it is not
    suspect: str | None = None

    @property
    def band(self) -> float:
        return near_tie_band(self.noise)

    def sentence(self, other: str = SPECULATIVE) -> str:
        """The parting in words, with the measured margins and what they are compared with."""
        where = (f"The texts part at token {self.index + 1} ({self.tokens[0]!r} autoregressive, {self.tokens[1]!r} "
                 f"{other}): the target's top-2 margin there was {_logits(self.margin[0], ' logits')} in the "
                 f"autoregressive lane and {_logits(self.margin[1])} in the {other} one")
        if self.noise is not None:
            calls = "batched calls with nothing rolled back" if self.suspect else "batched calls"
            band = (f"the {self.band:.2f}-logit band of twice the largest gap change this compile showed between "
                    f"single-token and {calls} ({self.noise:.2f} logits over {self.noise_positions} positions, "
                    f"measured at warm-up; at least {TRUE_TIE} logits, a tie whatever the kernels, and at most "
                    f"{BAND_CAP})")
        else:  # a run saved before the noise was measured: say the constant is one
            band = (f"the {NEAR_TIE_LOGIT_GAP}-logit near-tie band (a constant; this compile's own difference between "
                    "single-token and batched calls was not measured)")
        suspect = f" This compile is suspect: {self.suspect}." if self.suspect else ""
        if self.verdict == "near-tie":
            return f"{where}, within {band}: a near-tie, where either token is the model's choice.{suspect}"
        return (f"{where}, beyond {band}: not a near-tie but a defect; please report it with the run's JSON "
                f"(--json).{suspect}")


def _logits(margin: float | None, unit: str = "") -> str:
    return "not recorded" if margin is None or margin != margin else f"{margin:.2f}{unit}"


TRUE_TIE = 0.02  # logits: two candidates closer than this are tied whatever the kernels (f16 rounding of a logit ~10)
BAND_CAP = 2 * NOISE_CEILING  # logits: the widest band, twice the most any sound compile's calls moved a top-2 gap


def near_tie_band(noise: float | None) -> float:
    """Logits within which a top-2 margin is a near-tie for this compile: twice the largest gap change measured between
    single-token and batched calls (the measurement samples a few hundred gaps; a parting is the tail), at least
    TRUE_TIE (a compile whose batched calls matched its single steps bit for bit still has ties) and at most BAND_CAP
    (a compile whose calls move gaps further is suspect, and its noise is no licence), or the constant
    NEAR_TIE_LOGIT_GAP where nothing was measured."""
    return NEAR_TIE_LOGIT_GAP if noise is None else min(max(2 * noise, TRUE_TIE), BAND_CAP)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first position where two token id streams differ; the shorter one's length when it is a prefix of the other."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def parting(first: Sequence["TokenEvent"], second: Sequence["TokenEvent"], noise=None) -> Parting | None:
    """Where two lanes' greedy token streams part (None when one is a prefix of the other), judged against `noise` (the
    compile's fidelity.BatchingNoise; None: not measured)."""
    index = first_difference([e.id for e in first], [e.id for e in second])
    if index == min(len(first), len(second)):
        return None
    margins = [lane[index].margin if lane[index].margin is not None else float("nan") for lane in (first, second)]
    change = noise.trusted_gap_change if noise is not None else None
    near = all(m <= near_tie_band(change) for m in margins)  # nan (not recorded) is no evidence of a near-tie
    return Parting(index, [first[index].text, second[index].text], margins, "near-tie" if near else "defect", change,
                   noise.positions if noise is not None else 0, noise.suspect if noise is not None else None)
