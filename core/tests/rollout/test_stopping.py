"""finish_response on hand-made rows, with a toy decoder (token t decodes to the character chr(97 + t))."""

import torch
from rlcore.rollout.stopping import StopStrings, finish_response

EOS = 9


def decode(tokens):
    return "".join(chr(97 + t) for t in tokens if t != EOS)  # the eos token is "special": not in the text


def finish(tokens, stop=(), max_len=100):
    lps = [-float(i) for i in range(len(tokens))]
    return finish_response(tokens, lps, eos_ids={EOS}, stop=stop, decode=decode, max_len=max_len)


def test_eos_is_kept_and_padding_after_it_dropped():
    out = finish([0, 1, 2, EOS, 0, 0, 0])
    assert out.token_ids == [0, 1, 2, EOS]
    assert out.log_probs == [0.0, -1.0, -2.0, -3.0]
    assert out.text == "abc"
    assert out.finish_reason == "stop"


def test_length_when_nothing_stops_it():
    out = finish([0, 1, 2, 3, 4], max_len=3)
    assert (out.token_ids, out.text, out.finish_reason) == ([0, 1, 2], "abc", "length")
    assert out.log_probs == [0.0, -1.0, -2.0]


def test_stop_string_cuts_text_and_keeps_the_completing_token():
    # "abcdef": "cd" is complete once token 3 ("d") is out.
    out = finish([0, 1, 2, 3, 4, 5], stop=("cd",))
    assert out.token_ids == [0, 1, 2, 3]
    assert out.log_probs == [0.0, -1.0, -2.0, -3.0]
    assert out.text == "ab"
    assert out.finish_reason == "stop"


def test_earliest_of_several_stop_strings_and_eos():
    assert finish([0, 1, 2, 3, 4, 5], stop=("ef", "bc")).token_ids == [0, 1, 2]
    # eos comes before the stop string would be complete: eos wins.
    out = finish([0, 1, EOS, 2, 3], stop=("cd",))
    assert (out.token_ids, out.text) == ([0, 1, EOS], "ab")
    # a stop string beyond max_len does not count.
    assert finish([0, 1, 2, 3], stop=("cd",), max_len=3).finish_reason == "length"


def test_stop_strings_criterion_marks_rows_once_they_contain_a_stop():
    criterion = StopStrings(("cd",), decode, prompt_width=2)
    ids = torch.tensor([[7, 7, 2, 3], [7, 7, 2, 2], [7, 7, 0, 2]])
    assert criterion(ids, None).tolist() == [True, False, False]
    more = torch.cat([ids, torch.tensor([[0], [3], [1]])], dim=1)
    assert criterion(more, None).tolist() == [True, True, False]
