"""A first start converts the draft beside the target (two conversion children, one a core) where memory allows both,
and one after the other where it does not. The conversions are stand-ins that record when they run; the real ones
are tests/models/test_gguf_graph.py's, the first start's figures the README's."""

import threading

import pytest

from specdemo.host import memory
from specdemo.models import sources
from specdemo.run import engine
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


_TWO_THREADS = """
import sys, threading
sys.modules['torch'] = None  # as a first start runs: transformers' lazy modules without torch
from specdemo.models.loading import load_tokenizer
barrier, errors = threading.Barrier(2), []
def load():
    barrier.wait()
    try:
        load_tokenizer(sys.argv[1])
    except Exception as error:
        errors.append(repr(error))
threads = [threading.Thread(target=load) for _ in range(2)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(errors)
"""


def test_the_target_and_the_draft_load_their_tokenizers_at_the_same_moment_in_a_fresh_process(tiny_target):
    """A first start loads the draft on a thread beside the target; where both conversions end together, both threads
    import transformers at once (its lazy modules once left one with "cannot import name 'AutoTokenizer'")."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    result = subprocess.run([sys.executable, "-c", _TWO_THREADS, str(tiny_target)], capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr[-2000:]


def test_a_pair_whose_tokenizer_files_are_identical_loads_its_tokenizer_once(tiny_target, tmp_path):
    """Loading Qwen2.5's tokenizer takes 1.5-3 s on 2 cores: the draft of a pair of one family shares the target's."""
    import json
    import shutil

    from specdemo.models.loading import TOKENIZER_FILES, load_tokenizer

    for name in ("target", "draft", "other"):
        (tmp_path / name).mkdir()
        for file in TOKENIZER_FILES:
            if (tiny_target / file).is_file():
                shutil.copy(tiny_target / file, tmp_path / name / file)
    config = tmp_path / "other" / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_max_length": 77}))
    target = load_tokenizer(tmp_path / "target")
    assert load_tokenizer(tmp_path / "draft") is target
    other = load_tokenizer(tmp_path / "other")
    assert other is not target and other.model_max_length == 77


def test_a_pair_whose_chat_templates_differ_shares_the_parse_and_keeps_each_template(tiny_target, tmp_path):
    """The default pair's GGUFs differ by one escaped brace in the chat template: the same ids, parsed once."""
    import shutil

    from specdemo.models.loading import CHAT_TEMPLATE, TOKENIZER_FILES, load_tokenizer

    templates = {"draft": "{% for m in messages %}draft: {{ m['content'] }}{% endfor %}",
                 "target": "{% for m in messages %}target: {{ m['content'] }}{% endfor %}"}
    for name, template in templates.items():  # the draft first, as its conversion ends first
        (tmp_path / name).mkdir()
        for file in TOKENIZER_FILES:
            if (tiny_target / file).is_file():
                shutil.copy(tiny_target / file, tmp_path / name / file)
        (tmp_path / name / CHAT_TEMPLATE).write_text(template)
    draft, target = (load_tokenizer(tmp_path / name) for name in templates)
    chat = [{"role": "user", "content": "hello"}]
    assert draft.apply_chat_template(chat, tokenize=False) == "draft: hello"
    assert target.apply_chat_template(chat, tokenize=False) == "target: hello"
    assert draft._tokenizer is target._tokenizer  # one parse of tokenizer.json
    assert target.encode("hello world") == draft.encode("hello world")
