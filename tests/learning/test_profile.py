"""The machine profile: one store of what this machine has learnt (tune, costs, noise, acceptance), written
atomically by several processes, read by everyone, and taught by whoever drained a run; nothing it learnt is lost to a
damaged file, a failed read, a full disk or a read-only home, and none of these fails a run."""

import builtins
import errno
import io
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdemo.decoding.costs import CostModel
from specdemo.decoding.events import Round
from specdemo.learning.profile import Keys, Profile, store
from specdemo.learning.profile.choices import DEFAULT, Setting
from specdemo.learning.tune import Trial
from specdemo.results.fidelity import BatchingNoise
from specdemo.settings import KPolicy, DEFAULT_DRAFT, DEFAULT_TARGET, GenerationSettings
from tests.conftest import ROOT

COSTS = CostModel(target_s=tuple(0.05 + 0.002 * n for n in range(13)), target_prefill_tps=900.0,
                  target_rollback_s=0.0, draft_s=(0.012, 0.013), draft_prefill_tps=4000.0)


@pytest.fixture(autouse=True)
def learning(monkeypatch):
    """These tests are about what is kept: runs teach and warm-ups write (the tests elsewhere run with learning off)."""
    monkeypatch.setenv("SPECDEMO_LEARN", "1")


def tuned(profile: Profile, setting: Setting = Setting(128, "f32", "u8")) -> None:
    profile.keep_tune([Trial("target", setting, seconds=0.04, relative=0.8, chosen=True)], {"target": DEFAULT_TARGET})


def test_every_section_lives_in_one_file_with_a_schema_version(tmp_path):
    profile = Profile(tmp_path)
    tuned(profile)
    profile.keep_costs("pair", COSTS)
    profile.keep_noise("pair", BatchingNoise(0.12, 96, (2, 13)))
    profile.record_acceptance("models", "model", True, [10, 9], [9, 7])
    files = [p for p in tmp_path.rglob("*.json")]
    assert files == [profile.store.path] and profile.store.path.parent == tmp_path / "profile"
    data = json.loads(files[0].read_text())
    assert data["schema"] == store.SCHEMA and set(store.SECTIONS) <= data.keys() and data["machine"]["cpu"]


def test_a_writer_that_read_before_another_wrote_keeps_that_writers_changes_and_sees_them(tmp_path):
    page, tune_terminal = Profile(tmp_path), Profile(tmp_path)  # two stores of one home, as two processes hold them
    page.costs("pair")  # the page has read the profile before the tune wrote it
    tuned(tune_terminal)
    page.keep_costs("pair", COSTS)
    again = Profile(tmp_path)
    assert again.chosen(DEFAULT_TARGET) == Setting(128, "f32", "u8") and again.costs("pair") == COSTS
    assert page.chosen(DEFAULT_TARGET) == Setting(128, "f32", "u8")  # and the page sees the tune at once


def test_what_the_tune_chose_applies_where_the_settings_leave_it_open(tmp_path):
    profile = Profile(tmp_path)
    assert profile.resolve(DEFAULT_TARGET).kv_cache_precision == "" and profile.gain(DEFAULT_TARGET) == ""
    tuned(profile)
    resolved = profile.resolve(DEFAULT_TARGET)
    assert (resolved.dynamic_quantization_group_size, resolved.kv_cache_precision) == (128, "u8")
    assert profile.gain(DEFAULT_TARGET).endswith("20% faster than the defaults")
    assert profile.tune_record(DEFAULT_DRAFT)["trials"][0]["setting"]["kv_cache_precision"] == "u8"


def test_only_a_new_choice_makes_compiled_models_stale_not_a_run_that_corrects_the_costs(tmp_path):
    profile = Profile(tmp_path)
    assert profile.stamp() == 0
    tuned(profile)
    stamp = profile.stamp()
    profile.keep_costs("pair", COSTS)
    profile.learn(Keys("pair", "models"), GenerationSettings(), _rounds(5, n=1, seconds=0.06))
    assert profile.stamp() == stamp and profile.costs("pair").runs == 1
    tuned(profile, DEFAULT)
    assert profile.stamp() > stamp


def _rounds(count: int, n: int, seconds: float, drafter: str = "", drafted: int = 0, accepted: int = 0) -> list[Round]:
    """A prefill, then `count` rounds scoring n tokens each in `seconds`."""
    prefill = Round(0, 0, 0, "", [], 0.0, 20, 0.1, 0, 0, 1, 0.0, 0.1)
    return [prefill] + [Round(i, 20 + i * n, drafted, drafter, [(1, 0.01)] * drafted, 0.01 * drafted, n, seconds,
                              drafted, accepted, accepted + 1, 0.0, 0.1 + i * (seconds + 0.01 * drafted))
                        for i in range(1, count + 1)]


def test_a_sampled_run_teaches_the_prior_and_a_frozen_profile_learns_nothing(tmp_path, monkeypatch):
    profile, keys = Profile(tmp_path), Keys("pair", "models")
    profile.keep_costs("pair", COSTS)
    rounds = _rounds(10, 4, 0.06, "model", 3, 1)
    sampled = GenerationSettings(temperature=0.8, k_policy=KPolicy("fixed", k_max=3))
    monkeypatch.setenv("SPECDEMO_LEARN", "0")
    profile.learn(keys, sampled, rounds)
    assert profile.costs("pair").runs == 0 and not profile.acceptance("models").has_evidence("model", greedy=False)
    monkeypatch.setenv("SPECDEMO_LEARN", "1")
    profile.learn(keys, sampled, rounds, finished=False)  # a stopped run corrects the costs, but teaches no prior
    assert profile.costs("pair").runs == 1 and not profile.acceptance("models").has_evidence("model", greedy=False)
    profile.learn(keys, sampled, rounds)
    prior = profile.acceptance("models").prior("model", greedy=False)
    assert prior.rate(1) < 0.8 and prior.rate(2) < 0.5  # the first draft kept a third of the time, never the second
    assert not profile.acceptance("models").has_evidence("model", greedy=True)  # greedy is kept apart


def test_a_sampled_run_with_gated_rounds_teaches_no_prior(tmp_path, monkeypatch):
    """The rounds a gate let through are the ones the draft was sure of: their acceptance is above the draft's own."""
    monkeypatch.setenv("SPECDEMO_LEARN", "1")
    profile, keys = Profile(tmp_path), Keys("pair", "models")
    profile.keep_costs("pair", COSTS)
    turned_back = Round(11, 40, 3, "", [(1, 0.01)], 0.01, 1, 0.05, 0, 0, 1, 0.0, 1.0)
    sampled = GenerationSettings(temperature=0.8, k_policy=KPolicy("fixed", k_max=3))
    profile.learn(keys, sampled, _rounds(10, 4, 0.06, "model", 3, 3) + [turned_back])
    assert profile.costs("pair").runs == 1 and not profile.acceptance("models").has_evidence("model", greedy=False)


def test_the_acceptance_history_remembers_by_position_and_fades(tmp_path):
    profile = Profile(tmp_path)
    assert profile.acceptance("models").prior("model", greedy=True).rate(1) == pytest.approx(0.8)  # the default
    profile.record_acceptance("models", "model", True, tested=[100, 95, 90], accepted=[95, 90, 45])
    prior = Profile(tmp_path).acceptance("models").prior("model", greedy=True)
    assert prior.rate(1) > 0.9 and prior.rate(3) < 0.6  # the third draft is the weak one, and the prior says so
    profile.record_acceptance("models", "model", True, tested=[100, 0, 0], accepted=[0, 0, 0])
    counts = Profile(tmp_path).acceptance("models").counts["model/greedy"]
    assert counts["tested"] == pytest.approx([190, 85.5, 81]) and counts["accepted"][0] == pytest.approx(85.5)


def test_the_noise_of_a_compile_is_kept_and_read_back(tmp_path):
    profile = Profile(tmp_path)
    assert profile.noise("pair") is None
    profile.keep_noise("pair", BatchingNoise(0.12, 96, (2, 13), flips=1))
    assert Profile(tmp_path).noise("pair") == BatchingNoise(0.12, 96, (2, 13), flips=1)


@pytest.mark.parametrize("damage", [lambda raw: raw[: len(raw) // 2], lambda raw: b"\0\xff" * len(raw),
                                    lambda raw: raw.replace(b'"schema": %d' % store.SCHEMA,
                                                            b'"schema": %d' % (store.SCHEMA + 1))],
                         ids=["truncated", "garbage", "another-schema"])
def test_a_damaged_profile_is_kept_aside_and_never_overwritten(tmp_path, damage, caplog):
    profile = Profile(tmp_path)
    tuned(profile)
    profile.keep_costs("pair", COSTS)
    damaged = damage(profile.store.path.read_bytes())
    profile.store.path.write_bytes(damaged)  # by hand, or by a crash
    assert Profile(tmp_path).costs("pair") is None and Profile(tmp_path).chosen(DEFAULT_TARGET) is None
    with caplog.at_level(logging.WARNING):
        Profile(tmp_path).keep_costs("other", COSTS)  # a new profile is started beside the damaged one
        Profile(tmp_path).keep_costs("more", COSTS)  # and a later write leaves the damaged one alone
    aside = list(profile.store.path.parent.glob(f"{profile.store.path.stem}.damaged-*.json"))
    assert len(aside) == 1 and aside[0].read_bytes() == damaged
    assert set(json.loads(profile.store.path.read_text())["costs"]) == {"other", "more"}
    assert len(caplog.records) == 1 and f"kept aside as {aside[0].name}" in caplog.records[0].getMessage()


def failing_reads(monkeypatch, path: Path, times: int) -> None:
    """The next `times` reads of `path` fail with EMFILE (too many open files), as a busy process sees them."""
    real, left = io.open, [times]

    def opened(file, mode="r", *args, **kwargs):
        if str(file) == str(path) and mode.startswith("r") and left[0] > 0:
            left[0] -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), str(file))
        return real(file, mode, *args, **kwargs)

    monkeypatch.setattr(io, "open", opened)


def test_a_read_that_fails_for_a_moment_is_tried_again(tmp_path, monkeypatch):
    profile = Profile(tmp_path)
    tuned(profile)
    profile.keep_costs("pair", COSTS)
    failing_reads(monkeypatch, profile.store.path, times=store.READ_TRIES - 1)
    profile.keep_costs("other", COSTS)
    data = json.loads(profile.store.path.read_text())
    assert set(data["costs"]) == {"pair", "other"} and data["tune"]["models"]


def test_a_read_that_keeps_failing_gives_the_write_up_and_wipes_nothing(tmp_path, monkeypatch, caplog):
    profile = Profile(tmp_path)
    tuned(profile)
    profile.keep_costs("pair", COSTS)
    before = profile.store.path.read_bytes()
    with monkeypatch.context() as patch, caplog.at_level(logging.WARNING):
        failing_reads(patch, profile.store.path, times=100)
        profile.keep_costs("other", COSTS)
    assert profile.store.path.read_bytes() == before  # not a file made from an empty read
    assert profile.costs("other") == COSTS and profile.learns()  # kept for this process; learning goes on
    assert len(caplog.records) == 1 and "Too many open files" in caplog.records[0].getMessage()


class FillingUp:
    """A file on a disk that fills up while it is written: half of a write lands, then ENOSPC."""

    def __init__(self, handle):
        self.handle = handle

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()

    def write(self, text):
        self.handle.write(text[: len(text) // 2])
        self.handle.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def refuse_writes(monkeypatch, home: Path, code: int) -> None:
    """Make `home` refuse writes as the system would (root ignores permissions, so chmod cannot): ENOSPC half way
    through a write (a full disk), else `code` (EROFS: a read-only home) when a file is opened for writing."""
    real = io.open

    def opened(file, mode="r", *args, **kwargs):
        if mode.startswith("r") or not str(file).startswith(str(home)):
            return real(file, mode, *args, **kwargs)
        if code == errno.ENOSPC:
            return FillingUp(real(file, mode, *args, **kwargs))
        raise OSError(code, os.strerror(code), str(file))

    monkeypatch.setattr(io, "open", opened)
    monkeypatch.setattr(builtins, "open", opened)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS], ids=["full-disk", "read-only-home"])
def test_a_home_that_refuses_a_write_keeps_its_profile_and_turns_learning_off(tmp_path, monkeypatch, code, caplog):
    profile = Profile(tmp_path)
    tuned(profile)
    profile.keep_costs("pair", COSTS)
    before, files = profile.store.path.read_bytes(), sorted(profile.store.path.parent.iterdir())
    refuse_writes(monkeypatch, tmp_path, code)
    with caplog.at_level(logging.WARNING):
        profile.keep_costs("other", COSTS)  # what a warm-up measured
        profile.learn(Keys("pair", "models"), GenerationSettings(), _rounds(5, n=1, seconds=0.06))  # a run after it
    assert profile.store.path.read_bytes() == before and sorted(profile.store.path.parent.iterdir()) == files
    assert profile.costs("other") == COSTS and not profile.learns() and profile.costs("pair").runs == 0
    assert len(caplog.records) == 1 and os.strerror(code) in caplog.records[0].getMessage()


@pytest.mark.parametrize("when", ["at-load", "during-the-run"])
def test_a_home_that_refuses_writes_fails_neither_a_model_load_nor_a_page_run(tiny_pair, tmp_path, monkeypatch, when):
    from specdemo.run.engine import Engine
    from specdemo.results.lane import drain
    from specdemo.settings import RunSettings
    from specdemo.run.sidebyside import SideBySide

    engine = Engine(*tiny_pair, profile=Profile(tmp_path))
    if when == "at-load":
        refuse_writes(monkeypatch, tmp_path, errno.EROFS)  # a read-only home
    engine.warm_up(k_max=3)
    if when == "during-the-run":
        refuse_writes(monkeypatch, tmp_path, errno.ENOSPC)  # the disk filled up since
    before = engine.profile.store.path.read_bytes() if engine.profile.store.path.exists() else None
    settings = GenerationSettings(max_new_tokens=8, k_policy=KPolicy.fixed(3), temperature=0.8, seed=1)  # a sampled run teaches the most
    run = SideBySide({"autoregressive": engine, "speculative": engine}, "w5 w17 w99 w3", RunSettings(generation=settings))
    run.prepare()
    record = run.finish({mode: drain(run.lane(mode)) for mode in run.engines})  # teaches the profile, as a page run does
    assert all(result.summary.tokens == 8 for result in record.lanes.values()) and engine.costs is not None
    assert not engine.profile.learns()
    assert (engine.profile.store.path.read_bytes() if engine.profile.store.path.exists() else None) == before


def test_a_warm_up_with_learning_off_measures_for_this_process_and_writes_nothing(tiny_pair, tmp_path, monkeypatch):
    from specdemo.run.engine import Engine

    monkeypatch.setenv("SPECDEMO_LEARN", "0")
    profile, said = Profile(tmp_path), []
    Engine(*tiny_pair, profile=profile).warm_up(k_max=3)
    assert not (tmp_path / "profile").exists()
    again = Engine(*tiny_pair, profile=profile)  # another page's engine over the same models, in this process
    again.warm_up(k_max=3, log=said.append)
    assert again.costs is not None and again.noise is not None and any("from this machine's profile" in s for s in said)


WRITER = """
import sys, time
from pathlib import Path
from specdemo.learning.profile.store import Store

path, go, name = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
store = Store(path, {"cpu": "test"})
path.with_name(name + ".ready").touch()
while not go.exists():
    time.sleep(0.001)

def adding(key):
    def change(section):
        time.sleep(0.001)  # some work between reading the file and writing it, as a real change does
        return {**section, key: 1}
    return change

for i in range(150):
    store.update("costs", adding(f"{name}-{i}"))
"""


def test_two_processes_writing_at_once_keep_every_entry(tmp_path):
    path, go = tmp_path / "profile" / "machine.json", tmp_path / "go"
    path.parent.mkdir()
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(go), name], cwd=ROOT)
               for name in ("page", "tune")]
    while not all(path.with_name(f"{name}.ready").exists() for name in ("page", "tune")):
        assert all(w.poll() is None for w in writers), "a writer ended before it began"
        time.sleep(0.01)
    go.touch()  # both start writing at once
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    assert len(json.loads(path.read_text())["costs"]) == 300


def test_forgetting_the_tune_compiles_the_defaults_again_and_keeps_the_costs(tmp_path, monkeypatch, capsys):
    from specdemo.cli import commands as cli

    monkeypatch.setenv("SPECDEMO_HOME", str(tmp_path))
    profile = Profile(tmp_path)
    tuned(profile)
    profile.keep_costs("pair", COSTS)
    stamp = profile.stamp()
    assert cli.main(["tune", "--forget"]) == 0 and "forgot this machine's tune" in capsys.readouterr().out
    again = Profile(tmp_path)
    resolved = again.resolve(DEFAULT_TARGET)
    assert again.chosen(DEFAULT_TARGET) is None and (resolved.kv_cache_precision, resolved.dynamic_quantization_group_size) == ("", -1)
    assert again.costs("pair") == COSTS and again.stamp() > stamp  # a running page compiles the defaults again
