"""Starting the app where it cannot serve: one line that says what to do, before any model loads."""

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
