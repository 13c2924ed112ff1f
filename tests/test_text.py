"""Model output as people see it (specdemo/text.py): bidirectional controls and terminal escapes are shown, never
obeyed, on the page and in the terminal."""

from specdemo.cli.terminal import _render
from specdemo.decoding.events import TARGET, TokenEvent
from specdemo.text import BIDI_CONTROLS, shown
from specdemo.ui.render import escape, render_tokens

TROJAN = 'access = "user\u202e \u2066// admin\u2069 \u2066"'  # reads otherwise than it runs (Trojan Source)


def test_every_bidirectional_control_is_shown_as_its_code_point():
    assert shown(TROJAN) == 'access = "user[U+202E] [U+2066]// admin[U+2069] [U+2066]"'
    assert not set(shown("".join(BIDI_CONTROLS))) & BIDI_CONTROLS


def test_the_page_shows_bidi_controls_in_tokens_and_rejected_drafts():
    event = TokenEvent(1, TROJAN, TARGET, 1, 0.0, rejected_text="\u202eevil")
    html = render_tokens([event])
    assert not set(html) & BIDI_CONTROLS and "[U+202E]" in html and "[U+202E]evil" in html
    assert escape("\u2067x") == "[U+2067]x"


def test_the_terminal_shows_escapes_and_controls_but_keeps_lines_and_tabs():
    event = TokenEvent(1, "ok\x1b[2K\r\x07\tnext\n\u202e", TARGET, 1, 0.0)
    assert _render(event, colour=False) == "ok␛[2K␍␇\tnext\n[U+202E]"
    assert "\x1b[2K" not in _render(event, colour=True)
