"""A drafting strategy is one module: written by someone else and dropped into specdemo/decoding/drafters/ of a copy of the
project, with no other file changed, it runs through `python -m specdemo generate --drafter NAME` (greedy, lossless,
its rounds named by it) and appears among the page's drafting choices."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

# A strategy as a newcomer would write it from specdemo/decoding/drafters/base.py alone: propose the token that followed the
# text's last token the first time it occurred (a one-token lookup), repeated along.
ELSEWHERE = textwrap.dedent('''
    """Echo: what followed the text's last token where it first occurred, walked on (a strategy written elsewhere)."""

    import time

    from specdemo.decoding.drafters.base import Planning, Proposal, Strategy


    class EchoDrafter:
        kind = "echo"

        def kv_cache_bytes(self):
            return {}

        def reset(self):
            pass

        def propose(self, seq, k):
            start, tokens, text = time.perf_counter(), [], list(seq)
            for _ in range(k):
                try:
                    at = text.index(text[-1])
                except ValueError:
                    break
                if at + 1 >= len(text) - 1:
                    break
                tokens.append(text[at + 1])
                text.append(text[at + 1])
            return Proposal(tokens, None, [], time.perf_counter() - start, self.kind)

        def keep(self, length):
            pass


    def make(draft_model, settings, rng, price=None, stops=()):
        return EchoDrafter()


    STRATEGY = Strategy("echo", "echo of the text", make, planning=Planning(default_alpha=0.3))
''')


@pytest.fixture(scope="module")
def copy_with_echo(tmp_path_factory):
    """A copy of the project (its package, assets and app), echo.py dropped into its drafters and nothing else changed."""
    root = tmp_path_factory.mktemp("copy")
    for folder in ("specdemo", "assets"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "app.py", root / "app.py")
    (root / "specdemo" / "decoding" / "drafters" / "echo.py").write_text(ELSEWHERE)
    return root


def run_in(copy, *args, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(copy)}
    return subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_a_dropped_in_strategy_runs_through_generate_losslessly_with_its_rounds_named_by_it(copy_with_echo,
                                                                                           tiny_target, tiny_draft):
    done = run_in(copy_with_echo, "-m", "specdemo", "generate", "--drafter", "echo", "--k", "3",
                  "--target", str(tiny_target), "--target-precision", "fp16", "--draft", str(tiny_draft),
                  "--draft-precision", "fp16", "--max-new-tokens", "40", "--json", "w5 w17 w5 w17 w5 w17 w99")
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads(done.stdout)
    assert run["speculative"]["token_ids"] == run["autoregressive"]["token_ids"]  # greedy: lossless
    drafted = [r["drafter"] for r in run["speculative"]["rounds"] if r["drafted"]]
    assert drafted and set(drafted) == {"echo"}
    assert run["plan"]["drafter"] == "echo" and "echo" in run["counterfactual"]["replayed"]


@pytest.mark.slow
def test_a_dropped_in_strategy_is_among_the_pages_drafting_choices(copy_with_echo):
    script = ("from specdemo.serve.server import Server\n"
              "from specdemo.ui import page\n"
              "demo = page.build(Server())\n"
              "radio = next(b for b in demo.blocks.values() if getattr(b, 'elem_id', None) == 'drafter')\n"
              "print([value for _, value in radio.choices])")
    done = run_in(copy_with_echo, "-c", script)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'echo'" in done.stdout.strip().splitlines()[-1]
