"""A run's record does not change when the code is moved: `generate --json` on the tiny pair, greedy with a fixed K and
a fixed length, gives the record kept in tests/integration/golden_records.json, once what is measured is taken out (times, rates,
costs, the machine, the paths of the tiny models). The golden file was made by the code before the layout of issue 42
(main at 7b8eef8); SPECDEMO_WRITE_GOLDEN=1 writes it again."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

GOLDEN = Path(__file__).with_name("golden_records.json")
PROMPT = "w5 w17 w99 w3 w250 w42 w7 w5 w17 w99"
CASES = {  # name → the flags that vary; every case is greedy, with a fixed K and a fixed length
    "draft model, K = 3": ["--drafter", "model", "--k", "3", "--max-new-tokens", "24"],
    "prompt lookup, K = 4": ["--drafter", "prompt-lookup", "--k", "4", "--max-new-tokens", "24"],
}
# Keys whose values are measured on this machine, this time: dropped wherever they appear.
# The gate of gated rounds is priced on this machine's costs, and what it turns back (gated) follows from it.
MEASURED = {"machine", "warm_up_s", "costs", "plan", "batching_noise", "measured_speedup", "noise",
            "size_on_disk_bytes", "gate", "gated"}


def stripped(value, paths: dict[str, str]):
    """`value` with every MEASURED key removed, every float replaced by its type (a time, a rate or a figure derived
    from them; the ints and strings left are what the decoding decided) and the tiny models' paths by their role."""
    if isinstance(value, dict):
        return {key: stripped(item, paths) for key, item in value.items() if key not in MEASURED}
    if isinstance(value, list):
        return [stripped(item, paths) for item in value]
    if isinstance(value, float):
        return "<float>"
    if isinstance(value, str):
        for path, role in paths.items():
            value = value.replace(path, role)
    return value


def record(flags: list[str], target: Path, draft: Path) -> dict:
    cmd = [sys.executable, "-m", "specdemo", "generate", PROMPT, "--target", str(target), "--target-precision", "fp16",
           "--draft", str(draft), "--draft-precision", "fp16", "--kv-cache-precision", "f32", "--json", *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return stripped(json.loads(done.stdout), {str(target): "<target>", str(draft): "<draft>"})


@pytest.mark.slow
def test_generate_json_gives_the_golden_record_where_nothing_is_measured(tiny_target, tiny_draft, home):
    # `home`: an empty SPECDEMO_HOME of its own, so no tune or profile another test left in the tests' home can change
    # the compile settings the record names
    records = {name: record(flags, tiny_target, tiny_draft) for name, flags in CASES.items()}
    if os.environ.get("SPECDEMO_WRITE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(records, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    for name in CASES:
        assert records[name] == golden[name], name
