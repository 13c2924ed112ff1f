"""Where the drafts fail: a run's rejections grouped by what the target wanted in their place.

Each corrected token of a speculative lane is one rejection; the kind of the target's token (whitespace, identifier,
keyword, punctuation, number, word or special token) says where a draft model and its target disagree on code and
prose. The run file reports the groups with a few examples each.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from specdemo.decoding.events import TokenEvent

FAILURE_KINDS = ("indentation / whitespace", "identifier", "keyword", "punctuation", "number", "word", "special token")


@dataclass
class Failure:
    """Rejected drafts whose correction was of one kind: how many, and a few examples (the draft's token, the target's)."""

    kind: str  # one of FAILURE_KINDS: what the target wanted there
    count: int
    examples: list[tuple[str, str]]  # (what the draft proposed, what the target chose), at most 3


def where_drafts_fail(tokens: Sequence["TokenEvent"], decode, special_ids: set[int]) -> list[Failure]:
    """The rejections of a run, grouped by what the target wanted at the rejected position, most frequent first.

    `decode(ids)` turns token ids into text, special tokens included. Each corrected token is one rejection: its
    first rejected draft is what the draft proposed there."""
    groups: dict[str, Failure] = {}
    for t in tokens:
        if t.source != "corrected" or not t.rejected:
            continue
        wanted, drafted = decode([t.id]), decode([t.rejected[0]])
        kind = "special token" if t.id in special_ids else token_kind(wanted)
        group = groups.setdefault(kind, Failure(kind, 0, []))
        group.count += 1
        if len(group.examples) < 3:
            group.examples.append((drafted, wanted))
    return sorted(groups.values(), key=lambda g: -g.count)


def token_kind(text: str) -> str:
    """What a token's text is, in code and prose: whitespace (indentation, newlines), a number, punctuation, a Python
    keyword, an identifier (snake_case, CamelCase, a piece glued to the previous token) or a word (a letter run after
    a space)."""
    bare = text.strip()
    if not bare:
        return "indentation / whitespace"
    if bare.replace(".", "", 1).isdigit():
        return "number"
    if not any(ch.isalnum() for ch in bare):
        return "punctuation"
    if keyword.iskeyword(bare) or keyword.issoftkeyword(bare):
        return "keyword"
    glued = not text[:1].isspace()
    if bare.isidentifier() and ("_" in bare or any(ch.isupper() for ch in bare[1:]) or any(ch.isdigit() for ch in bare) or glued):
        return "identifier"
    return "word"
