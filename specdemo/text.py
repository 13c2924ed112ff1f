"""Text between people and the models: an instruction as the model takes it (clean_instruction), and model output as
it is shown, its invisible controls made visible. Depends on nothing.

Why: a model's answer is untrusted text. Unicode's bidirectional controls (U+202A-U+202E, U+2066-U+2069, and the
marks U+200E, U+200F, U+061C) reorder what a reader sees without changing what the text holds ("Trojan Source",
Boucher and Anderson, 2021): code shown in the page or a terminal could read otherwise than it runs. The page and the
terminal show each as its code point in brackets; the run's JSON keeps the text exactly as generated. A terminal also
obeys the C0 controls (ESC starts a sequence that can recolour, move the cursor or rewrite a line): there, each but the
tab and the newline is shown as its Unicode control picture (ESC as ␛).
"""

from __future__ import annotations

BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
_VISIBLE = {ord(c): f"[U+{ord(c):04X}]" for c in BIDI_CONTROLS}
_IN_A_TERMINAL = {**_VISIBLE, **{code: chr(0x2400 + code) for code in range(32) if chr(code) not in "\t\n"}, 0x7F: "\u2421"}


def shown(text: str, terminal: bool = False) -> str:
    """`text` with every bidirectional control replaced by its code point in brackets ("[U+202E]"); for a `terminal`,
    the C0 controls and DEL as their control pictures too ("\x1b" as "␛")."""
    return text.translate(_IN_A_TERMINAL if terminal else _VISIBLE)


def clean_instruction(instruction: str | None) -> str:
    """The instruction as the model will see it, or ValueError("the instruction is empty").

    Lone UTF-16 surrogates (from invalid UTF-8 on a command line, or a "\\ud800" escape sent to the
    page's API) cannot be encoded, so each becomes U+FFFD, the replacement character; properly
    paired surrogates become the character they encode. Everything else, control characters
    included, is kept as typed.
    """
    if instruction is None or not instruction.strip():
        raise ValueError("the instruction is empty")
    return instruction.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
