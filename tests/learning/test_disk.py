"""`python -m specdemo clean`: what is on disk, and removing only what it lists."""

from dataclasses import replace

from specdemo.cli import commands as cli
from specdemo.learning import disk
from specdemo.models import sources
from specdemo.settings import DEFAULT_DRAFT, DEFAULT_TARGET, DRAFT_PRECISION


def _file(path, n_bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * n_bytes)


def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEMO_HOME", str(tmp_path))
    _file(sources.cached_folder(replace(DEFAULT_TARGET, precision="int8")) / "openvino_model.bin", 300)
    _file(sources.cached_folder(replace(DEFAULT_DRAFT, precision=DRAFT_PRECISION)) / "openvino_model.bin", 100)
    _file(tmp_path / "models" / sources.CACHE_VERSION / "qwen2.5-coder-0.5b-fp16" / "openvino_model.bin", 50)
    _file(tmp_path / "models" / "v1" / "qwen2.5-coder-1.5b-int8" / "openvino_model.bin", 40)
    _file(tmp_path / "models" / sources.CACHE_VERSION / ".qwen2.5-coder-1.5b-int8-abc" / "model.gguf", 30)
    _file(tmp_path / "ov_cache" / "blob.blob", 20)
    _file(tmp_path / "bench" / "hf" / "qwen" / "model.safetensors", 10)
    _file(tmp_path / "profile" / "abc.json", 5)
    return tmp_path


def test_the_inventory_sorts_everything_into_kinds(tmp_path, monkeypatch):
    home = _home(tmp_path, monkeypatch)
    kinds = {item.path.relative_to(home).as_posix(): (item.kind, item.bytes) for item in disk.inventory()}
    assert kinds[f"models/{sources.CACHE_VERSION}/qwen2.5-coder-1.5b-int8"] == ("default-models", 300)
    assert kinds[f"models/{sources.CACHE_VERSION}/qwen2.5-coder-0.5b-fp16"] == ("other-models", 50)
    assert kinds["models/v1/qwen2.5-coder-1.5b-int8"] == ("old-versions", 40)
    assert kinds[f"models/{sources.CACHE_VERSION}/.qwen2.5-coder-1.5b-int8-abc"] == ("scratch", 30)
    assert kinds["ov_cache"] == ("compiled", 20) and kinds["bench"] == ("bench", 10)
    assert kinds["profile"] == ("measurements", 5)


def test_clean_lists_without_removing_anything(tmp_path, monkeypatch, capsys):
    home = _home(tmp_path, monkeypatch)
    before = sorted(p for p in home.rglob("*"))
    assert cli.main(["clean"]) == 0
    out = capsys.readouterr().out
    assert "ov_cache" in out and "clean --remove" in out
    assert sorted(p for p in home.rglob("*")) == before


def test_clean_removes_only_the_kinds_asked_for(tmp_path, monkeypatch, capsys):
    home = _home(tmp_path, monkeypatch)
    assert cli.main(["clean", "--remove", "compiled,bench,scratch"]) == 0
    assert not (home / "ov_cache").exists() and not (home / "bench").exists()
    assert not (home / "models" / sources.CACHE_VERSION / ".qwen2.5-coder-1.5b-int8-abc").exists()
    assert (sources.cached_folder(replace(DEFAULT_TARGET, precision="int8")) / "openvino_model.bin").is_file()
    assert (home / "models" / "v1").exists() and (home / "profile" / "abc.json").is_file()
    assert "freed 60 bytes" in capsys.readouterr().out


def test_clean_refuses_an_unknown_kind_in_one_line(tmp_path, monkeypatch, capsys):
    _home(tmp_path, monkeypatch)
    assert cli.main(["clean", "--remove", "everything"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: unknown kind everything")


def test_the_page_says_how_much_is_on_disk(tmp_path, monkeypatch):
    from specdemo.ui import render

    _home(tmp_path, monkeypatch)
    line = render.render_disk(disk.inventory())
    assert "On disk: 555 bytes" in line and "default models 400 bytes" in line and "specdemo clean" in line


def _profile_of_this_cpu(home, openvino_build, draft_precision):
    """A profile file as an older OpenVINO's specdemo wrote it on this CPU, whose draft plan chose `draft_precision`."""
    import json

    from specdemo.host import machine
    from specdemo.learning.profile import store

    option = {"precision": draft_precision, "head_tokens": 0, "predicted_speedup": 2.0, "chosen": True}
    facts = {**machine.cpu_facts(), "openvino": openvino_build}
    data = {"schema": store.SCHEMA, "machine": facts,
            "tune": {"drafts": {f"{DEFAULT_DRAFT.source}/{DEFAULT_DRAFT.device}": {"options": [option]}}}}
    path = store.path_for(home, facts)
    path.write_text(json.dumps(data))


def test_the_draft_a_tune_of_this_cpu_chose_is_a_default_model_whatever_openvino_chose_it(tmp_path, monkeypatch):
    home = _home(tmp_path, monkeypatch)
    chosen = sources.cached_folder(replace(DEFAULT_DRAFT, precision="int8"))
    _file(chosen / "openvino_model.bin", 70)
    _file(chosen / sources.COMPLETE_MARKER, 1)
    _profile_of_this_cpu(home, "2099.1.0-older-build", "int8")
    kinds = {item.path.relative_to(home).as_posix(): item.kind for item in disk.inventory()}
    assert kinds[chosen.relative_to(home).as_posix()] == "default-models"


def test_clean_never_loads_openvino(tmp_path):
    """`clean` lists files: it learns the default draft from the profiles' JSON, so it loads no OpenVINO (1 s, not 5)."""
    import subprocess
    import sys

    code = ("import sys; from specdemo.cli.commands import main; status = main(['clean']); "
            "print(status, 'openvino' in sys.modules, file=sys.stderr)")
    env = {**__import__("os").environ, "SPECDEMO_HOME": str(tmp_path)}
    (tmp_path / "ov_cache").mkdir()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.stderr.strip().splitlines()[-1] == "0 False", done.stderr[-2000:]
    assert "ov_cache" in done.stdout
