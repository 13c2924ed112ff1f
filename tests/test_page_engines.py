"""The page's engines: preparation shows itself in the server's terminal as in the page."""

import re

from specdemo.ui.engines import _also_in_the_terminal


def test_preparing_reports_to_the_page_and_prints_one_terminal_line_per_stage(capsys):
    page = []
    report = _also_in_the_terminal(lambda fraction, message: page.append((fraction, message)))
    steps = [(0.0, "Big: assembling and checking 3 parts (0/3)"), (0.05, "Big: assembling and checking 3 parts (1/3)"),
             (0.35, "big: exporting to OpenVINO IR"), (None, "compiling"), (1.0, "big: ready"),
             (0.0, "Small: assembling and checking 1 parts (0/1)"), (1.0, "small: ready")]
    for fraction, message in steps:
        report(fraction, message)
    assert page == steps  # the page sees everything, compiling (no fraction) included
    lines = capsys.readouterr().err.splitlines()
    stages = [re.sub(r", about .* left\)$", ")", line.split("] ", 1)[1]) for line in lines]  # without the estimate
    assert stages == [
        "Big: assembling and checking 3 parts (0%)", "big: exporting to OpenVINO IR (35%)", "compiling", "big: ready (100%)",
        "Small: assembling and checking 1 parts (0%)", "small: ready (100%)"]
