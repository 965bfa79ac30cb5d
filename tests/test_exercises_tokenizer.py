"""The checkers of chapter 1 accept right answers and diagnose the typical wrong ones."""

from __future__ import annotations

import math

import pytest

from lib.exercises._common import ExerciseError
from lib.exercises.tokenizer import (
    check_byte_fallback,
    check_corpus_chars_per_token,
    check_viterbi_segment,
    check_wordpiece_encode,
)


# -- Exercise 1 ---------------------------------------------------------------------------------
def cpt_right(texts, encode):
    return sum(len(t) for t in texts) / sum(len(encode(t)) for t in texts)


def cpt_mean_of_ratios(texts, encode):
    return sum(len(t) / len(encode(t)) for t in texts) / len(texts)


def cpt_bytes(texts, encode):
    return sum(len(t.encode()) for t in texts) / sum(len(encode(t)) for t in texts)


def cpt_inverted(texts, encode):
    return 1 / cpt_right(texts, encode)


def test_corpus_cpt_accepts_the_reference():
    assert check_corpus_chars_per_token(cpt_right) is True


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (cpt_mean_of_ratios, "mean of per-document ratios"),
        (cpt_bytes, "counts UTF-8 bytes"),
        (cpt_inverted, "tokens per character"),
        (lambda texts, encode: "2.0", "should be a float"),
    ],
)
def test_corpus_cpt_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_corpus_chars_per_token(wrong)


# -- Exercise 2 ---------------------------------------------------------------------------------
def fallback_right(text, char_to_id):
    ids = []
    for char in text:
        if char in char_to_id:
            ids.append(char_to_id[char])
        else:
            ids.extend(len(char_to_id) + b for b in char.encode("utf-8"))
    return ids


def fallback_code_point(text, char_to_id):
    return [char_to_id.get(c, len(char_to_id) + ord(c)) for c in text]


def fallback_no_offset(text, char_to_id):
    ids = []
    for char in text:
        ids.extend([char_to_id[char]] if char in char_to_id else char.encode("utf-8"))
    return ids


def fallback_all_bytes(text, char_to_id):
    if all(c in char_to_id for c in text):
        return [char_to_id[c] for c in text]
    return [len(char_to_id) + b for b in text.encode("utf-8")]


def fallback_key_error(text, char_to_id):
    return [char_to_id[c] for c in text]


def test_byte_fallback_accepts_the_reference(capsys):
    assert check_byte_fallback(fallback_right) is True
    assert "all checks passed" in capsys.readouterr().out


def test_byte_fallback_not_attempted_returns_none(capsys):
    def stub(text, char_to_id):
        raise NotImplementedError

    assert check_byte_fallback(stub) is None
    assert "Exercise 2 not attempted yet" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (fallback_code_point, r"code point ord\('é'\) = 233"),
        (fallback_no_offset, "collides with the characters' ids"),
        (fallback_all_bytes, "known ones keep their own ids"),
        (fallback_key_error, "raised KeyError"),
        (lambda text, char_to_id: "".join(text), "should be a list of int ids"),
    ],
)
def test_byte_fallback_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_byte_fallback(wrong)


# -- Exercise 3 ---------------------------------------------------------------------------------
def wordpiece_right(word, vocab):
    pieces, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = ("##" if start else "") + word[start:end]
            if piece in vocab:
                pieces.append(piece)
                start = end
                break
        else:
            return ["[UNK]"]
    return pieces


def wordpiece_shortest(word, vocab):
    pieces, start = [], 0
    while start < len(word):
        for end in range(start + 1, len(word) + 1):
            piece = ("##" if start else "") + word[start:end]
            if piece in vocab:
                pieces.append(piece)
                start = end
                break
        else:
            return ["[UNK]"]
    return pieces


def wordpiece_without_prefix(word, vocab):
    pieces, start = [], 0
    while start < len(word):
        end = next(
            (e for e in range(len(word), start, -1) if word[start:e] in vocab), None
        )
        if end is None:
            return ["[UNK]"]
        pieces.append(word[start:end])
        start = end
    return pieces


def wordpiece_partial_unk(word, vocab):
    pieces, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = ("##" if start else "") + word[start:end]
            if piece in vocab:
                pieces.append(piece)
                start = end
                break
        else:
            pieces.append("[UNK]")
            start += 1
    return pieces


def test_wordpiece_accepts_the_reference():
    assert check_wordpiece_encode(wordpiece_right) is True


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (wordpiece_shortest, "shortest piece"),
        (wordpiece_without_prefix, "with the '##' prefix"),
        (wordpiece_partial_unk, "the whole word becomes"),
        (
            lambda word, vocab: " ".join(wordpiece_right(word, vocab)),
            "list of str pieces",
        ),
    ],
)
def test_wordpiece_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_wordpiece_encode(wrong)


# -- Exercise 4 ---------------------------------------------------------------------------------
def viterbi_right(word, log_probs):
    best = [0.0] + [-math.inf] * len(word)
    start_of = [0] * (len(word) + 1)
    for end in range(1, len(word) + 1):
        for start in range(end):
            piece = word[start:end]
            if piece in log_probs and best[start] + log_probs[piece] > best[end]:
                best[end], start_of[end] = best[start] + log_probs[piece], start
    pieces, end = [], len(word)
    while end:
        pieces.append(word[start_of[end] : end])
        end = start_of[end]
    return pieces[::-1]


def viterbi_reversed(word, log_probs):
    return viterbi_right(word, log_probs)[::-1]


def viterbi_greedy(word, log_probs):
    pieces, start = [], 0
    while start < len(word):
        end = next(e for e in range(len(word), start, -1) if word[start:e] in log_probs)
        pieces.append(word[start:end])
        start = end
    return pieces


def viterbi_sum_of_probs(word, log_probs):
    probs = {piece: math.exp(v) for piece, v in log_probs.items()}
    return viterbi_right(word, probs)  # maximises the sum of probabilities


def test_viterbi_accepts_the_reference():
    assert check_viterbi_segment(viterbi_right) is True


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (viterbi_reversed, "reverse order"),
        (viterbi_greedy, "greedy longest match"),
        (viterbi_sum_of_probs, "sum of the pieces' probabilities"),
        (lambda word, log_probs: list(word), "expected"),
    ],
)
def test_viterbi_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_viterbi_segment(wrong)


def test_checkers_reject_non_callables():
    with pytest.raises(TypeError, match="pass your function itself"):
        check_wordpiece_encode(["un", "##able"])
