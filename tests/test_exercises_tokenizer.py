"""The checkers of chapter 1 accept right answers and diagnose the typical wrong ones."""

from __future__ import annotations

from itertools import pairwise

import pytest

from lib.exercises._common import ExerciseError
from lib.exercises.tokenizer import (
    check_apply_merge,
    check_bpe_pair_counts,
    check_corpus_chars_per_token,
    check_decode_from_vocab,
)
from lib.tokenizer import merge_adjacent_pair


# -- Exercise 1 ---------------------------------------------------------------------------------
def pair_counts_right(word_counts):
    counts = {}
    for word, freq in word_counts.items():
        for pair in pairwise(word):
            counts[pair] = counts.get(pair, 0) + freq
    return counts


def pair_counts_across_words(word_counts):
    stream = [i for word in word_counts for i in word]  # concatenates the words
    freqs = [f for word, f in word_counts.items() for _ in word]
    counts = {}
    for k, pair in enumerate(pairwise(stream)):
        counts[pair] = counts.get(pair, 0) + freqs[k]
    return counts


def pair_counts_unweighted(word_counts):
    return pair_counts_right(dict.fromkeys(word_counts, 1))


def pair_counts_no_overlap(word_counts):
    counts = {}
    for word, freq in word_counts.items():
        i = 0
        while i + 1 < len(word):
            pair = (word[i], word[i + 1])
            counts[pair] = counts.get(pair, 0) + freq
            i += 2 if word[i] == word[i + 1] else 1  # skips the overlapping occurrence
    return counts


def test_pair_counts_accepts_the_reference(capsys):
    assert check_bpe_pair_counts(pair_counts_right) is True
    assert "all checks passed" in capsys.readouterr().out


def test_pair_counts_not_attempted_returns_false():
    def stub(word_counts):
        raise NotImplementedError

    assert check_bpe_pair_counts(stub) is False


def test_pair_counts_diagnoses_counting_across_words():
    with pytest.raises(ExerciseError, match="must not span two words"):
        check_bpe_pair_counts(pair_counts_across_words)


def test_pair_counts_diagnoses_ignoring_word_counts():
    with pytest.raises(ExerciseError, match="counted each distinct word once"):
        check_bpe_pair_counts(pair_counts_unweighted)


def test_pair_counts_diagnoses_skipped_overlaps():
    with pytest.raises(ExerciseError, match=r"overlapping pairs all count"):
        check_bpe_pair_counts(pair_counts_no_overlap)


def test_pair_counts_rejects_a_list():
    with pytest.raises(ExerciseError, match="should be a dict"):
        check_bpe_pair_counts(lambda wc: list(pair_counts_right(wc).items()))


def test_pair_counts_rejects_keys_that_are_not_pairs():
    def keyed_by_string(word_counts):
        return {f"{a},{b}": n for (a, b), n in pair_counts_right(word_counts).items()}

    with pytest.raises(ExerciseError, match=r"keys should be pairs \(a, b\)"):
        check_bpe_pair_counts(keyed_by_string)


# -- Exercise 2 ---------------------------------------------------------------------------------
def merge_right(ids, pair, new_id):
    return merge_adjacent_pair(ids, pair, new_id)


def merge_overlapping_twice(ids, pair, new_id):
    out = []
    for i in range(len(ids)):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)  # forgets to skip the second id of the pair
        elif not (i > 0 and (ids[i - 1], ids[i]) == pair):
            out.append(ids[i])
    return out


def merge_missing_the_end(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids) - 2:  # off by one: never looks at the last pair
        if (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out + list(ids[i:])


def merge_right_to_left(ids, pair, new_id):
    return merge_adjacent_pair(ids[::-1], pair[::-1], new_id)[::-1]


def merge_in_place(ids, pair, new_id):
    merged = merge_adjacent_pair(ids, pair, new_id)
    ids[:] = merged
    return ids


def test_apply_merge_accepts_the_reference():
    assert check_apply_merge(merge_right) is True


def test_apply_merge_diagnoses_overlaps_merged_twice():
    with pytest.raises(ExerciseError, match="merged overlapping occurrences"):
        check_apply_merge(merge_overlapping_twice)


def test_apply_merge_diagnoses_the_missed_last_pair():
    with pytest.raises(ExerciseError, match="pair at the very end was missed"):
        check_apply_merge(merge_missing_the_end)


def test_apply_merge_diagnoses_right_to_left():
    with pytest.raises(ExerciseError, match="scan from left to right"):
        check_apply_merge(merge_right_to_left)


def test_apply_merge_diagnoses_mutation():
    with pytest.raises(ExerciseError, match="modified its input list"):
        check_apply_merge(merge_in_place)


# -- Exercise 3 ---------------------------------------------------------------------------------
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


# -- Exercise 4 ---------------------------------------------------------------------------------
def decode_right(ids, vocab):
    for i in ids:
        if i not in vocab:
            raise ValueError(f"unknown id {i}")
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")


def decode_per_token(ids, vocab):
    for i in ids:
        if i not in vocab:
            raise ValueError(f"unknown id {i}")
    return "".join(vocab[i].decode("utf-8", errors="replace") for i in ids)


def decode_strict(ids, vocab):
    return b"".join(vocab[i] for i in ids).decode("utf-8")


def decode_ignore(ids, vocab):
    for i in ids:
        if i not in vocab:
            raise ValueError(f"unknown id {i}")
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="ignore")


def decode_key_error(ids, vocab):
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")


def decode_vague_error(ids, vocab):
    if any(i not in vocab for i in ids):
        raise ValueError("bad input")
    return decode_right(ids, vocab)


def test_decode_accepts_the_reference():
    assert check_decode_from_vocab(decode_right) is True


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (decode_per_token, "decoded each token on its own"),
        (decode_strict, "errors='replace'"),
        (decode_ignore, "not disappear"),
        (decode_key_error, "bare KeyError"),
        (decode_vague_error, "should name it"),
    ],
)
def test_decode_diagnoses(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check_decode_from_vocab(wrong)


def test_checkers_reject_non_callables():
    with pytest.raises(TypeError, match="pass your function itself"):
        check_apply_merge([1, 2, 3])
