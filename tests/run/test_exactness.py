"""tune's exactness check (specdemo/run/exactness.py): a compile whose greedy speculative output parts from the
autoregressive output is caught, unless the lanes part at a near-tie, judged as every run's parting is."""

from specdemo.decoding.events import End, TokenEvent
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.run.exactness import check_exact


class PartingEngine:
    """An engine, as a side-by-side run uses it, whose lanes part at token 3, the target `margin` logits sure there."""

    noise = None  # not measured: the parting is judged by the constant near-tie band

    def __init__(self, margin: float):
        self.margin = margin

    def prompt_ids(self, instruction, settings):
        return [1, 2, 3]

    def knows_costs(self, settings):
        return True

    def plan_lane(self, instruction, settings):
        return "the plan"

    def lane(self, mode, ids):
        for i in ids:
            yield TokenEvent(i, "x", "target", 0, 0.1, margin=self.margin)
        yield End(mode, "eos", 1.0, 5)

    def autoregressive_ids(self, prompt, settings, cancel=None):
        return self.lane(AUTOREGRESSIVE, (1, 2, 3, 4))

    def speculative_ids(self, prompt, settings, plan, cancel=None, memories=None):
        return self.lane(SPECULATIVE, (1, 2, 9, 4))


def test_a_parting_where_the_target_was_sure_is_caught_and_says_where():
    problem = check_exact(PartingEngine(margin=4.0), ["Write a function."])
    assert problem == "speculative output parts from autoregressive output at token 3 of 'Write a function.'"


def test_a_parting_at_a_near_tie_is_allowed():
    assert check_exact(PartingEngine(margin=0.1), ["Write a function."]) == ""


def test_a_compile_whose_lanes_stay_identical_passes(tiny_engine):
    tiny_engine.warm_up(4, quick=True)
    assert check_exact(tiny_engine, ["w5 w17 w99 w3", "w250 w42 w7"]) == ""
