"""A conversion that does not finish, interrupted in this process or killed from outside, leaves
nothing half-made in the cache, and the next start converts again. Figures: docs/reliability.md."""

import fcntl
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from specdemo.models import export, sources
from specdemo.models.runtime import OVModel
from specdemo.settings import ModelSettings

pytestmark = pytest.mark.slow  # each test converts a model with optimum-intel (about 20 s)

ROOT = Path(__file__).resolve().parents[2]


def _quiet(fraction, message):
    pass


def test_an_interrupted_conversion_leaves_nothing_half_made(home, tiny_hf, monkeypatch):
    settings = ModelSettings(str(tiny_hf), precision="int4")

    def interrupt(folder, precision):
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "_compress", interrupt)
    monkeypatch.setattr(sources, "_convert_in_child", export.convert)  # in this process, where the patch applies
    with pytest.raises(KeyboardInterrupt):
        sources.prepare(settings, _quiet)
    parent = sources.cached_folder(settings).parent
    assert not sources.cached_folder(settings).exists()
    assert [p.name for p in parent.iterdir() if p.suffix != ".lock"] == []  # no scratch folder left either

    monkeypatch.undo()
    monkeypatch.setenv("SPECDEMO_HOME", str(home))
    assert (sources.prepare(settings, _quiet) / sources.COMPLETE_MARKER).is_file()  # the next start redoes it


# Runs sources.prepare in a child process that stops for good just before weight compression: the
# export is on disk in the scratch folder, the cache folder and its marker are not.
_CONVERT_AND_HANG = """
import sys, time
from specdemo.models import export, sources
from specdemo.settings import ModelSettings

def hang(folder, precision):
    print("compressing", flush=True)
    time.sleep(600)

export._compress = hang
sources._convert_in_child = export.convert  # convert in this process, so killing it kills the conversion
sources.prepare(ModelSettings(sys.argv[1], precision="int4"), lambda fraction, message: None)
"""


def test_a_conversion_killed_half_way_is_redone_on_the_next_start(home, tiny_hf):
    settings = ModelSettings(str(tiny_hf), precision="int4")
    folder = sources.cached_folder(settings)
    child = subprocess.Popen([sys.executable, "-c", _CONVERT_AND_HANG, str(tiny_hf)], stdout=subprocess.PIPE, text=True,
                             cwd=ROOT)  # SPECDEMO_HOME comes from the `home` fixture
    watchdog = threading.Timer(300, child.kill)  # never wait forever on a stuck child
    watchdog.start()
    try:
        assert "compressing\n" in iter(child.stdout.readline, "")  # reads until the export is done (or the child died)
        assert list(folder.parent.glob(f".{folder.name}-*/export/openvino_model.xml"))  # half-made, in scratch
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        watchdog.cancel()

    assert not folder.exists()
    with open(folder.parent / f".{folder.name}.lock") as lock:  # the dead process's lock is released
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(lock, fcntl.LOCK_UN)
    assert sources.prepare(settings, _quiet) == folder
    assert (folder / sources.COMPLETE_MARKER).is_file()
    assert not list(folder.parent.glob(f".{folder.name}-*"))  # the dead conversion's scratch is cleaned up
    model = OVModel(folder, settings)
    assert model.forward([5, 17, 99]).shape == (1, 512)
