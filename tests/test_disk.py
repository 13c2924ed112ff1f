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
