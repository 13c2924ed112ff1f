"""Shared fixtures: tiny random-weight models exported with optimum-intel (made inside the tests), an
engine over them, an engine over the real default pair, the real app on a free port; the markers that
sort tests by cost.

Markers (the marked tests live in tests/integration/, which tests/test_layout.py holds, so the fast loop is
`python -m pytest -q tests --ignore=tests/integration`):
    real_models  uses the embedded Qwen2.5-Coder pair (converted once, minutes, on a fresh machine)
    browser      drives chromium against the running app
    slow         takes more than about 20 s on a 2-core machine
"""

import base64
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from specdemo.host import compat
from specdemo.models import kernels
from specdemo.models.loading import LoadedModel, load_model
from specdemo.run.engine import Engine
from specdemo.settings import ModelSettings, RunSettings

if TYPE_CHECKING:  # imported where it is used: the page's modules load only for the tests that serve it
    from specdemo.serve.server import Server

TINY_VOCAB = 512
ROOT = Path(__file__).resolve().parent.parent

compat.hide_broken_torchvision()  # before anything here imports transformers or optimum


def link_converted_models(source_home: Path, home: Path) -> None:
    """Link `source_home`'s finished conversions of this cache version into `home` (read only: tests load them, never
    write into them), so a home of the tests' own does not convert the real pair again."""
    from specdemo.models import sources

    source, target = source_home / "models" / sources.CACHE_VERSION, home / "models" / sources.CACHE_VERSION
    for link in target.iterdir() if target.is_dir() else []:
        if link.is_symlink() and not (link / sources.COMPLETE_MARKER).is_file():
            link.unlink()  # its conversion was removed or redone since: convert here, or link the new one
    if source.resolve() == target.resolve() or not source.is_dir():
        return
    target.mkdir(parents=True, exist_ok=True)
    for folder in source.iterdir():
        if (folder / sources.COMPLETE_MARKER).is_file() and not (target / folder.name).exists():
            (target / folder.name).symlink_to(folder.resolve(), target_is_directory=True)


# The tests' own SPECDEMO_HOME: what they write (conversions, compiled blobs, costs, a tune) never lands in the user's,
# and what the user's machine has learnt (its tune above all: a bf16 choice changes every compile) never changes what
# they run. It is kept between test runs (the real pair is converted once) and starts from the user's finished
# conversions, linked. SPECDEMO_TEST_HOME moves it; subprocesses inherit it.
USER_HOME = Path(os.environ.get("SPECDEMO_HOME") or Path.home() / ".cache" / "specdemo")
TEST_HOME = Path(os.environ.get("SPECDEMO_TEST_HOME") or Path.home() / ".cache" / "specdemo-tests")
link_converted_models(USER_HOME, TEST_HOME)
os.environ["SPECDEMO_HOME"] = str(TEST_HOME)

# Test runs (tiny random models, short answers, odd instructions, a loaded machine) must not teach the planner
# or correct the cost model of the user's machine; subprocesses inherit this too.
os.environ["SPECDEMO_LEARN"] = "0"
# A measurement of the tiny models (sub-millisecond calls, far apart on any host) or one taken while other tests load
# the machine would be judged busy and measured again: the tests' measurements are taken as they come
# (tests/host/test_host_load.py and tests/decoding/test_costs.py judge synthetic ones).
os.environ["SPECDEMO_HOST_LOAD"] = "ignore"
os.environ["SPECDEMO_TUNE_AT_START"] = "0"  # no background tune in the servers tests start (tests/serve/test_background_tune.py and the plan made again, tests/decoding/test_busy_host.py, turn it on)
# The memory bound counts the app's process tree; here that tree is pytest, which holds every fixture's engines (5 GiB
# by the real-model tests, what no app process holds), so the app's 8 GiB bound would make the bench's sections that
# run in this process wait 10 min each and skip. The tests take a bound of their own (the machine's and the cgroup's
# room still apply); tests/integration/test_memory_bound.py runs a step under a bound it sets, in a child.
os.environ.setdefault("SPECDEMO_MEMORY_BUDGET", "64G")


def make_tiny_hf_model(folder: Path, seed: int) -> Path:
    """A 2-layer Qwen2 with random weights and a word-level tokenizer, saved as a Hugging Face folder."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.4,  # large weights spread the logits: fewer accidental near-ties
        eos_token_id=1,
    )
    Qwen2ForCausalLM(config).eval().save_pretrained(folder)
    vocab = {"<unk>": 0, "<eos>": 1} | {f"w{i}": i for i in range(2, TINY_VOCAB)}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", eos_token="<eos>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(folder)
    return folder


def export_tiny_model(folder: Path, seed: int) -> Path:
    """The tiny model exported to a stateful OpenVINO IR folder (about 10 s)."""
    from optimum.exporters.openvino import main_export
    from optimum.intel import OVConfig

    hf = make_tiny_hf_model(folder / "hf", seed)
    main_export(str(hf), folder / "ov", task="text-generation-with-past", ov_config=OVConfig())
    return folder / "ov"


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    return export_tiny_model(tmp_path_factory.mktemp("tiny-target"), seed=0)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory) -> Path:
    return export_tiny_model(tmp_path_factory.mktemp("tiny-draft"), seed=1)


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory) -> Path:
    """A tiny model as a Hugging Face folder, for tests of conversion (which only read it)."""
    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny-hf") / "model", seed=3)


@pytest.fixture
def each_isa():
    """Every ISA path this CPU runs, held in turn; the widest again after, and each ISA's own way for many rows."""
    yield kernels.supported_isas()
    kernels.use("")
    kernels.gemm_from(0)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty SPECDEMO_HOME of this test's own (subprocesses inherit it)."""
    monkeypatch.setenv("SPECDEMO_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def exact(folder: Path, **change) -> ModelSettings:
    """Settings that compute exactly: unquantized weights, f32 activations and KV cache."""
    return ModelSettings(str(folder), precision="fp16", kv_cache_precision="f32", inference_precision="f32", **change)


@pytest.fixture(scope="session")
def tiny_pair(tiny_target, tiny_draft) -> tuple[LoadedModel, LoadedModel]:
    """The tiny target and draft, compiled once for the session (the loops reset their caches per run)."""
    return load_model(exact(tiny_target)), load_model(exact(tiny_draft))


@pytest.fixture(scope="module")
def tiny_engine(tiny_pair) -> Engine:
    """An engine over the tiny pair, fresh for each test module: warm-up, costs and eos_ids set by one
    module's tests stay in that module. Two differently seeded random models disagree often, which
    exercises rejection and rollback on almost every round."""
    return Engine(*tiny_pair)


@pytest.fixture(scope="session")
def real_engine() -> Engine:
    """The embedded default pair (Qwen2.5-Coder 1.5B target, 0.5B draft) as the app loads it."""
    return Engine.load(RunSettings())


def serve_on_the_page(settings: RunSettings, **fakes) -> "Server":
    """A Server (serve/server.py) whose every lane runs on one engine of `settings`, loaded and warmed up here instead of
    by the page's loadings, offering that pair as its default configuration; `fakes`: Engines' other loaders
    (load_genai)."""
    from specdemo.serve.engines import Engines
    from specdemo.serve.server import Server

    engine = Engine.load(settings)
    engine.warm_up(settings.generation.k_max)
    return Server(engines=Engines(load_engine=lambda pair, with_draft: lambda report: engine,
                                  configurations={"faithful": (settings.target, settings.draft)}, **fakes))


def downloaded_run(button: str) -> dict:
    """The run a page's download button holds (render.render_download: its JSON in a base64 data: URL)."""
    return json.loads(base64.b64decode(re.search(r'href="data:application/json;base64,([^"]+)"', button).group(1)))


def watch_forward(monkeypatch, model, before_call: Callable[[list[int]], None]) -> None:
    """Call before_call(ids) at the start of every model.forward(ids), until monkeypatch undoes it."""
    forward = model.forward

    def spy(ids, logits_to_keep=1):
        before_call(ids)
        return forward(ids, logits_to_keep)

    # Into the instance's __dict__, so that undoing it removes the spy rather than leaving a bound method behind
    # (the models are shared by the session, and a later test may patch OVModel.forward itself).
    monkeypatch.setitem(vars(model), "forward", spy)


STARTUP_S = 600  # a cold machine builds the models first: well under a minute on 2 cores, minutes beside other work


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    """`python app.py` on a free loopback port: its url, process and log file."""

    def __init__(self, url: str, process: subprocess.Popen, log: Path):
        self.url, self.process, self.log = url, process, log

    def rss(self) -> int:
        import psutil

        return psutil.Process(self.process.pid).memory_info().rss

    def wait_until_up(self) -> None:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the app exited with status {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(self.url, timeout=5)
                return
            except OSError:
                time.sleep(1)
        pytest.fail(f"the app did not answer within {STARTUP_S} s:\n{self.log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def app_server(tmp_path_factory):
    """The real app, one per test module (a module's runs may load more into it, such as GenAI's pipeline). The tests'
    clients stand behind a named proxy on this machine: each says whom it stands for in X-Forwarded-For (one without
    it is this machine, one address of PER_ADDRESS places)."""
    port = free_port()
    log = tmp_path_factory.mktemp("app") / "app.log"
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "SPECDEMO_PROXIES": "127.0.0.1,::1"}
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "app.py", "--host", "127.0.0.1", "--port", str(port)],
                                   cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    server = AppServer(f"http://127.0.0.1:{port}/", process, log)
    try:
        server.wait_until_up()
        yield server
    finally:
        stop(process)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# The page alone, as app.py serves it but with no model loaded: the server's own turn holds the line for good, so no
# visitor's run starts (and none loads a model); what happens before a run (Gradio's routes, refusals, a place in the
# line) is the real page's. Up in seconds, for tests of what strangers can send.
PAGE_WITHOUT_MODELS = """
import sys
from specdemo.serve.server import Server
from specdemo.ui import page
server = Server()
server.line.join(1)
page.launch(page.build(server), "127.0.0.1", int(sys.argv[1]), False)
"""


@pytest.fixture(scope="module")
def page_server(tmp_path_factory):
    """The page without its models (PAGE_WITHOUT_MODELS) on a free port, one per test module; Gradio's files go to a
    folder of its own (GRADIO_TEMP_DIR), `server.gradio_files`, so a test can see what it keeps."""
    port, folder = free_port(), tmp_path_factory.mktemp("page")
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "GRADIO_TEMP_DIR": str(folder / "gradio"),
           "PYTHONPATH": str(ROOT)}
    with open(folder / "page.log", "w") as out:
        process = subprocess.Popen([sys.executable, "-c", PAGE_WITHOUT_MODELS, str(port)], cwd=ROOT, stdout=out,
                                   stderr=subprocess.STDOUT, env=env)
    server = AppServer(f"http://127.0.0.1:{port}/", process, folder / "page.log")
    server.gradio_files = folder / "gradio"
    try:
        server.wait_until_up()
        yield server
    finally:
        stop(process)


def pytest_configure(config):
    config.addinivalue_line("markers", "real_models: uses the real embedded Qwen2.5-Coder pair (converted on first use)")
    config.addinivalue_line("markers", "browser: drives chromium against the running app")
    config.addinivalue_line("markers", "slow: takes more than about 20 s on a 2-core machine")
    # torch.jit tracing during optimum-intel export warns about every traced shape check.
    config.addinivalue_line("filterwarnings", "ignore::torch.jit.TracerWarning")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning")
