from engine_fakes import ByteTokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.engine.detokenizer import IncrementalDetokenizer

tok = ByteTokenizer()


def run(text_ids, stops=(), include=False):
    detok = IncrementalDetokenizer.for_prompt(tok.decode, [], stops, include)
    pieces = []
    for token in text_ids:
        out = detok.add_token(token)
        pieces.append(out.text)
        if out.stop is not None:
            return pieces, out.stop
    out = detok.flush()
    pieces.append(out.text)
    return pieces, out.stop


def test_multibyte_character_is_never_split():
    pieces, _ = run(list("añ€😀".encode()))
    assert "".join(pieces) == "añ€😀"
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_is_cut_and_held_back():
    pieces, stop = run(list(b"hello STOP more"), stops=("STOP",))
    assert stop == "STOP"
    assert "".join(pieces) == "hello "
    # "S", "T", "O" could begin the stop string, so nothing past "hello " was shown early.
    assert pieces[:6] == ["h", "e", "l", "l", "o", " "]
    assert pieces[6:] == ["", "", "", ""]


def test_include_stop_string():
    pieces, stop = run(list(b"ab<end>c"), stops=("<end>",), include=True)
    assert stop == "<end>"
    assert "".join(pieces) == "ab<end>"


def test_held_prefix_released_when_it_does_not_complete():
    pieces, stop = run(list(b"xSTy"), stops=("STOP",))
    assert stop is None
    assert pieces == ["x", "", "", "STy", ""]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30), st.lists(st.text(min_size=1, max_size=4), max_size=3))
def test_deltas_concatenate_to_the_text_before_the_stop(text, stops):
    pieces, stop = run(list(text.encode()), stops=tuple(stops))
    joined = "".join(pieces)
    cut = _first_stop_cut(text, stops)
    if cut is None:
        assert stop is None and joined == text
    else:
        assert stop is not None and joined == text[:cut]


def _first_stop_cut(text, stops):
    """Generation ends at the first stop string to COMPLETE as characters arrive
    (text '0Ë0' with stops 'Ë' and '0Ë0' ends at 'Ë'), cut where it starts."""
    for end in range(1, len(text) + 1):
        found = [text[:end].find(s) for s in stops if s in text[:end]]
        if found:
            return min(found)
    return None


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=30))
def test_broken_utf8_loses_nothing(data):
    pieces, _ = run(list(data))
    assert "".join(pieces) == data.decode("utf-8", errors="replace")
