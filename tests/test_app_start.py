"""Starting the app where it cannot serve: one line that says what to do, before any model loads."""

import os
import socket
import subprocess
import sys

from conftest import ROOT, free_port


def test_a_busy_port_gets_one_line_naming_another_port_and_no_traceback():
    port = free_port()
    with socket.socket() as other:  # another server already listening there
        other.bind(("127.0.0.1", port))
        other.listen()
        done = subprocess.run([sys.executable, "app.py", "--port", str(port)], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines == [f"error: port {port} on 127.0.0.1 is already in use; serve on another port with --port "
                     f"(e.g. python app.py --port {port + 1})"]
    assert "ready" not in done.stdout and "Traceback" not in done.stderr


def test_a_named_proxy_that_is_no_address_gets_one_line_and_no_traceback():
    done = subprocess.run([sys.executable, "app.py", "--port", str(free_port())], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "SPECDEMO_PROXIES": "10.0.0.0/8, hf-proxy"})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == ["error: SPECDEMO_PROXIES names proxies by address or network "
                                                "(10.0.0.0/8), separated by commas; 'hf-proxy' is neither"]
