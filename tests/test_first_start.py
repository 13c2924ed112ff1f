"""A first start converts the draft beside the target (two conversion children, one a core) where memory allows both,
and one after the other where it does not. The conversions are stand-ins that record when they run; the real ones
are tests/test_gguf_graph.py's, the first start's figures the README's."""

import threading

import pytest

from specdemo import engine, memory, sources
from specdemo.settings import RunSettings


class Conversions:
    """sources.prepare replaced: the target's conversion waits (up to `wait_s`) to see the draft's begin."""

    def __init__(self, monkeypatch, wait_s: float):
        self.draft_began, self.order, self.wait_s = threading.Event(), [], wait_s
        monkeypatch.setattr(sources, "is_prepared", lambda settings: False)
        monkeypatch.setattr(sources, "prepare", self.prepare)

    def prepare(self, settings, progress=None):
        if "0.5b" in settings.source:
            self.order.append("draft")
            self.draft_began.set()
        else:
            self.order.append("target" if self.draft_began.wait(self.wait_s) else "target alone")
        raise RuntimeError("stand-in: no model")  # the load stops here; only the order matters


def test_the_draft_converts_beside_the_target_when_memory_allows_both(home, monkeypatch):
    conversions = Conversions(monkeypatch, wait_s=10)
    monkeypatch.setattr(memory, "room", lambda: memory.Room(64 << 30, 0, None, 64 << 30))
    with pytest.raises(RuntimeError):
        engine.Engine.load(RunSettings())
    assert conversions.order[:2] == ["draft", "target"]


def test_the_draft_waits_for_the_target_when_memory_allows_one_conversion(home, monkeypatch):
    conversions = Conversions(monkeypatch, wait_s=0.5)
    need = memory.conversion_need(sources.source_bytes("qwen2.5-coder-1.5b"))
    monkeypatch.setattr(memory, "room", lambda: memory.Room(need + (1 << 20), 0, None, 64 << 30))
    with pytest.raises(RuntimeError):
        engine.Engine.load(RunSettings())
    assert conversions.order == ["target alone"]  # the target's load failed first; no draft converted beside it
