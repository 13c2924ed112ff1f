"""What a visitor's choice loads lives inside the memory bound beside the background work: a visitor who turns on
OpenVINO GenAI's lane during a first start's background tune gets our two lanes and a sentence for the third, the tune
runs to its end and is applied, and once the work is done the same choice loads."""

import sys
import time

import pytest

from specdemo.host import memory
from specdemo.settings import GenerationSettings, KPolicy, RunSettings
from specdemo.serve import tuning
from specdemo.ui import handlers
from specdemo.serve.engines import Admission
from specdemo.serve.values import PageValues
from specdemo.serve.visitors import Visitor
from tests.conftest import exact, serve_on_the_page

pytestmark = pytest.mark.slow

HOLD_S = 8  # the stand-in tune holds its memory this long
TUNE_BYTES = 384 << 20  # and this much of it


@pytest.fixture
def page(tiny_target, tiny_draft):
    """A server on the tiny pair; its GenAI pipeline's loadings, counted (`loaded`)."""
    settings = RunSettings(exact(tiny_target), exact(tiny_draft),
                           GenerationSettings(max_new_tokens=12, k_policy=KPolicy.fixed(3)))
    loaded = []
    # GenAI's pipeline itself is not what is tested: its loading counts, and fails the lane once let in.
    server = serve_on_the_page(settings, load_genai=lambda s, lookup: lambda report: loaded.append(s) or "no pipeline")
    return server, settings, loaded


def test_genai_turned_on_during_the_first_starts_tune_waits_for_it_and_the_tune_is_applied(page, monkeypatch):
    server, settings, loaded = page
    applied = []
    hold = f"import time; x = bytearray({TUNE_BYTES}); x[::4096] = b'1' * len(x[::4096]); time.sleep({HOLD_S})"
    work = server.background.start([(tuning.TUNING, [sys.executable, "-c", hold])],
                                   on_step=lambda w, label: applied.append(label))
    time.sleep(1.5)  # the tune has its memory
    assert server.background.reserve() > 0
    # The bound leaves room for what the app holds, what the tune may still take, and half of GenAI's pipeline.
    genai_need = Admission("GenAI", [settings.target, settings.draft]).need
    monkeypatch.setenv(memory.BUDGET_VARIABLE, str(memory.room().used + server.background.reserve() + genai_need // 2))

    values = PageValues(instruction="w5 w17 w99 w3", max_new_tokens=12, k=3, k_auto=False, genai=True)
    final = list(handlers.generate(server, values, Visitor("visitor")))[-1]
    assert "OpenVINO GenAI's pipeline needs about" in final.status and "background work" in final.status
    assert "⚠️" in final.status and final.download  # our two lanes ran and finished all the same
    assert loaded == []  # nothing of GenAI's came in beside the tune

    for _ in range(200):
        if work.state != "running":
            break
        time.sleep(0.1)
    assert work.state == "done" and work.skipped == [] and applied == [tuning.TUNING]  # the tune ran to its end
    assert server.background.reserve() == 0
    monkeypatch.setenv(memory.BUDGET_VARIABLE, str(memory.room().used + genai_need + (64 << 20)))
    list(handlers.generate(server, values, Visitor("visitor")))
    assert len(loaded) == 1  # with the work done, the same choice loads
