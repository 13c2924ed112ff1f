"""The tune's memory on the real pair: its compiles fit in what it waits for before it starts (memory.tune_need), so
beside the page it never waits for memory it holds itself (issue 41: it did, 10 min per setting, then skipped them)."""

import functools
import os
from dataclasses import replace

import pytest

from conftest import TEST_HOME, link_converted_models
from specdemo.host import memory
from specdemo.learning import candidates, race, tune
from specdemo.learning.profile.choices import DEFAULT, REFERENCE
from specdemo.models import sources
from specdemo.settings import DEFAULT_DRAFT, DEFAULT_TARGET

VNNI = candidates.CPU(frozenset({"avx2", "avx512f", "avx512_vnni"}), 2)  # so that group sizes are raced on any CPU


@pytest.mark.real_models
@pytest.mark.slow
def test_the_tunes_compiles_fit_in_the_peak_it_waited_for(tmp_path, monkeypatch):
    """A home with the converted pair and no compiled blob yet (a first `tune`), and a bound that leaves the tune exactly
    its peak beside what this process holds: the reference's fresh compile, then the draft, the incumbent and a
    challenger held at once, are each admitted at once (no wait), and the process never goes past the bound. Compiled
    as before (no blob cache: a fresh compile of the INT8 target holds 2.3 GiB, an import 1.6), the challenger did not
    fit."""
    draft_settings = DEFAULT.apply(tune.searched(DEFAULT_DRAFT))
    target = replace(DEFAULT_TARGET, precision="int8")  # per-channel weights: a group of 256 is raced on any VNNI CPU
    sources.prepare(target), sources.prepare(draft_settings)  # the tests' home
    link_converted_models(TEST_HOME, tmp_path / "home")
    monkeypatch.setenv("SPECDEMO_HOME", str(tmp_path / "home"))
    need = memory.tune_need(sources.weights_bytes(target), sources.weights_bytes(draft_settings))
    bound = memory.tree_anonymous(os.getpid()) + need
    monkeypatch.setenv(memory.BUDGET_VARIABLE, str(bound))
    monkeypatch.setattr(memory, "wait_for", functools.partial(memory.wait_for, wait_s=1.0, poll_s=0.2))
    log, held = [], []

    def holding() -> None:
        held.append(memory.tree_anonymous(os.getpid()))

    def fidelity(model, probes) -> float:  # one call: the plugin repacks the weights on a compile's first call
        race.prefill(model)
        holding()
        return 1.0

    def tie(incumbent, challenger, other) -> race.Verdict:
        holding()  # both compiles and the draft alive
        return race.verdict([1.0] * race.MIN_PAIRS, [1.0] * race.MIN_PAIRS)

    reference = tune.admitted(REFERENCE.apply(target), "the target's reference compile", log.append, fresh=True)
    fidelity(reference, [])
    del reference
    draft = tune.admitted(draft_settings, "the draft, beside the target", log.append)
    search = tune.Search("target", target, draft, [], log.append, fidelity=fidelity, timer=tie)
    trials, kept = search.run(VNNI, candidates.Layout.of(sources.prepare(target)))
    assert [t.setting.dynamic_quantization_group_size for t in trials] == [-1, 256]  # the challenger was compiled
    assert not [line for line in log if line.startswith("memory:")]  # nothing waited, nothing was skipped
    assert max(held) <= bound, f"held {max(held) / 2**30:.2f} GiB of a {bound / 2**30:.2f} GiB bound"
