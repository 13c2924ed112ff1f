"""Where the drafts fail: each token's kind, and a run's rejections grouped by what the target wanted."""

from specdemo.decoding.events import TokenEvent
from specdemo.results.failures import token_kind, where_drafts_fail


def test_token_kinds_tell_code_from_prose():
    kinds = {text: token_kind(text)
             for text in ("    ", "\n", " 42", " (", "):", " return", " merge_lists", "Count", "ing", " sorted", " the")}
    assert kinds == {"    ": "indentation / whitespace", "\n": "indentation / whitespace", " 42": "number", " (": "punctuation",
                     "):": "punctuation", " return": "keyword", " merge_lists": "identifier", "Count": "identifier",
                     "ing": "identifier", " sorted": "word", " the": "word"}


def test_rejections_are_grouped_by_what_the_target_wanted_with_examples():
    vocab = {1: "    ", 2: "  ", 3: " def", 4: " class", 5: "<|im_end|>", 6: " x", 7: " total_sum", 8: " sum", 9: "        "}
    decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
    tokens = [TokenEvent(1, "", "corrected", 1, 0.1, rejected=[2]), TokenEvent(9, "", "corrected", 2, 0.2, rejected=[1, 3]),
              TokenEvent(7, "", "corrected", 3, 0.3, rejected=[8]), TokenEvent(5, "", "corrected", 4, 0.4, rejected=[6]),
              TokenEvent(3, "", "accepted", 4, 0.4), TokenEvent(4, "", "corrected", 5, 0.5, rejected=[3])]
    failures = where_drafts_fail(tokens, decode, special_ids={5})
    assert [(f.kind, f.count) for f in failures][:1] == [("indentation / whitespace", 2)]
    by_kind = {f.kind: f for f in failures}
    assert by_kind["indentation / whitespace"].examples == [("  ", "    "), ("    ", "        ")]
    assert by_kind["identifier"].examples == [(" sum", " total_sum")]
    assert by_kind["special token"].count == 1 and by_kind["keyword"].examples == [(" def", " class")]
