"""The machine profile: one store of what this machine has learnt (tune, costs, noise, acceptance), written
atomically by several processes, read by everyone, and taught by whoever drained a run."""

import json

import pytest

from specdemo.costs import CostModel
from specdemo.events import Round
from specdemo.fidelity import BatchingNoise
from specdemo.profile import Keys, Profile, store
from specdemo.profile.choices import DEFAULT, Setting, model_key
from specdemo.settings import DEFAULT_DRAFT, DEFAULT_TARGET, GenerationSettings
from specdemo.tune import Trial

COSTS = CostModel(target_s=tuple(0.05 + 0.002 * n for n in range(13)), target_prefill_tps=900.0,
                  target_rollback_s=0.0, draft_s=(0.012, 0.013), draft_prefill_tps=4000.0)


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


def test_two_processes_writing_different_sections_keep_each_others_changes(tmp_path):
    page, tune_terminal = Profile(tmp_path), Profile(tmp_path)  # two processes, one home
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


def test_only_a_new_choice_makes_compiled_models_stale_not_a_run_that_corrects_the_costs(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEMO_LEARN", "1")
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
    sampled = GenerationSettings(temperature=0.8, k_max=3)
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


def test_a_damaged_profile_or_one_of_another_schema_only_loses_what_it_held(tmp_path):
    profile = Profile(tmp_path)
    profile.store.path.parent.mkdir(parents=True)
    profile.store.path.write_text("{not json")
    assert Profile(tmp_path).costs("pair") is None and Profile(tmp_path).chosen(DEFAULT_TARGET) is None
    profile.store.path.write_text(json.dumps({"schema": store.SCHEMA + 1, "costs": {"pair": {"costs": {}}}}))
    assert Profile(tmp_path).costs("pair") is None
    tuned(profile)  # and it can be written again
    assert Profile(tmp_path).chosen(DEFAULT_TARGET) is not None


def test_what_an_older_specdemo_kept_in_tune_and_costs_is_imported_once(tmp_path):
    from specdemo.profile.legacy import _tune_path

    tune_file = _tune_path(tmp_path)
    tune_file.parent.mkdir(parents=True)
    setting = {"dynamic_quantization_group_size": 32, "inference_precision": "f32", "kv_cache_precision": "u8",
               "num_threads": 0}
    tune_file.write_text(json.dumps({"version": 1, "models": {model_key(DEFAULT_TARGET): {"setting": setting}}}))
    (tmp_path / "costs").mkdir()
    (tmp_path / "costs" / "abc.json").write_text(json.dumps({"key": {"n_max": 13}, "costs": COSTS.to_dict()}))
    (tmp_path / "costs" / "abc.noise.json").write_text(json.dumps(BatchingNoise(0.2, 96, (2,)).to_dict()))
    (tmp_path / "costs" / "acceptance-models.json").write_text(
        json.dumps({"model/greedy": {"tested": [10], "accepted": [9]}}))
    profile = Profile(tmp_path)
    assert profile.chosen(DEFAULT_TARGET) == Setting(32, "f32", "u8") and profile.costs("abc") == COSTS
    assert profile.noise("abc").max_gap_change == 0.2 and profile.acceptance("models").has_evidence("model", True)
    profile.keep_costs("other", COSTS)  # the first write keeps what was imported, in the profile's own file
    data = json.loads(profile.store.path.read_text())
    assert set(data["costs"]) == {"abc", "other"} and data["tune"]["models"] and data["acceptance"]["models"]


def test_forgetting_the_tune_compiles_the_defaults_again_and_keeps_the_costs(tmp_path, monkeypatch, capsys):
    from specdemo import cli

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
