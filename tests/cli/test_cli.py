"""The command line at its edge: bad input is refused in one line (no traceback, no model loaded), and
any instruction a shell can pass runs. Figures: docs/reliability.md."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specdemo.cli import commands as cli
from specdemo.run.engine import Engine

ROOT = Path(__file__).resolve().parents[2]


def test_cli_refuses_an_empty_instruction_before_loading_any_model(monkeypatch, capsys):
    def must_not_load(*args, **kwargs):
        raise AssertionError("the models were loaded")

    monkeypatch.setattr(Engine, "load", must_not_load)
    assert cli.main(["generate", " \n "]) == 2
    assert capsys.readouterr().err == "error: the instruction is empty\n"


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "nan"], "error: temperature must be in [0.0, 100.0], got nan"),
    (["--top-p", "inf"], "error: top_p must be in (0.0, 1.0], got inf"),
    (["--max-new-tokens", "-5"], "error: max_new_tokens must be between 1 and 100000, got -5"),
    (["--k", "65"], "error: k must be between 1 and 64, got 65"),
    (["--seed", "-1"], "error: seed must be between 0 and 9223372036854775807, got -1"),
])
def test_cli_refuses_impossible_settings_in_one_line(flags, message, capsys):
    assert cli.main(["generate", "hi", *flags]) == 2
    assert capsys.readouterr().err == message + "\n"


def test_cli_refuses_a_setting_that_is_not_a_number_with_its_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["generate", "hi", "--k", "four"])
    assert exit_.value.code == 2
    assert "argument --k: K must be a whole number or auto, got 'four'" in capsys.readouterr().err


def test_cli_bad_arguments_give_one_line_not_a_traceback():
    cmd = [sys.executable, "-m", "specdemo", "generate", "hi", "--k", "0"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: k must be between 1 and 64, got 0"


def test_cli_runs_an_instruction_of_invalid_utf8_emoji_cjk_control_characters_and_markup(tiny_target, tiny_draft):
    # Bytes as a shell passes them: invalid UTF-8, then UTF-8 for é, 🙂 and 你好, an escape sequence and markup.
    instruction = b"w5 \xff\xfe invalid, caf\xc3\xa9 \xf0\x9f\x99\x82 \xe4\xbd\xa0\xe5\xa5\xbd \x1b[31m <|im_start|>system w7"
    cmd = [sys.executable, "-m", "specdemo", "generate", instruction, "--target", str(tiny_target),
           "--draft", str(tiny_draft), "--max-new-tokens", "8", "--k", "64", "--json"]
    result = subprocess.run(cmd, capture_output=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    assert b"PyTorch was not found" not in result.stderr  # generate keeps torch out on purpose, and says nothing of it
    lanes = json.loads(result.stdout)
    assert all(0 < len(lanes[lane]["token_ids"]) <= 8 for lane in ("autoregressive", "speculative"))


def test_a_full_disk_is_one_sentence_with_what_to_do_not_a_traceback(monkeypatch, capsys):
    """A bench that fills the disk while it assembles a GGUF ends with exit 1 and one line naming the file and `clean`."""
    import errno

    from specdemo.cli import commands as cli

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "/home/u/.cache/specdemo/bench/model.gguf")

    monkeypatch.setattr(cli, "_bench", full)
    assert cli.main(["bench", "--quick"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith("error: a file could not be read or written (/home/u/.cache/specdemo/bench/model.gguf)")
    assert "specdemo clean" in err


def test_a_conversion_that_fills_the_disk_tells_the_page_what_to_do(tmp_path):
    """The conversion child's last word when the disk fills (seen on a full disk: the page said only "OSError: [Errno
    28] No space left on device"): which file, and that `clean` frees what specdemo keeps."""
    import errno

    from specdemo.models import convert
    from specdemo.models.sources import ModelSourceError
    from specdemo.settings import ModelSettings
    from specdemo.serve.values import as_sentence

    error = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "model.gguf"))
    said = as_sentence(ModelSourceError(convert.failure(ModelSettings("qwen2.5-coder-1.5b"), error, tmp_path / "x.log")))
    assert said.startswith(f"Could not convert qwen2.5-coder-1.5b: a file could not be read or written ({tmp_path}")
    assert "No space left on device; free space on that disk (`python -m specdemo clean`" in said
    assert said.endswith(f"(details in {tmp_path / 'x.log'}).") and "\n" not in said
