"""Checkers for the exercises of chapter 1 (tokenization).

Each checker runs the reader's function on hand-picked cases that expose the typical mistakes
(pairs counted across words, word counts ignored, overlapping merges applied twice, per-document
ratios averaged, tokens decoded one by one) and then on random cases against the reference in
:mod:`lib.tokenizer`.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lib.exercises._common import ExerciseError, checker
from lib.tokenizer import BPETokenizer, count_adjacent_pairs, merge_adjacent_pair

__all__ = [
    "check_bpe_pair_counts",
    "check_apply_merge",
    "check_corpus_chars_per_token",
    "check_decode_from_vocab",
]


# -- Exercise 1 -------------------------------------------------------------------------------
def _reference_pair_counts(
    word_counts: Mapping[tuple[int, ...], int],
) -> dict[tuple[int, int], int]:
    total: dict[tuple[int, int], int] = {}
    for word, freq in word_counts.items():
        for pair, n in count_adjacent_pairs(word).items():
            total[pair] = total.get(pair, 0) + n * freq
    return total


def _as_count_dict(got: Any, what: str) -> dict[tuple[int, int], int]:
    if not isinstance(got, Mapping):
        raise ExerciseError(
            f"{what} should be a dict from pairs to counts, got {type(got).__name__}"
        )
    counts = {}
    for pair, count in got.items():
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ExerciseError(f"{what}: the keys should be pairs (a, b) of ids, got {pair!r}")
        if count != 0:
            counts[pair] = count
    return counts


@checker("Exercise 1: count the pairs of one training step")
def check_bpe_pair_counts(bpe_pair_counts: Callable[[dict], Mapping]) -> None:
    rng = random.Random(1)
    cases = [
        {(1, 2, 3): 2, (3, 1): 1},
        {(7, 7, 7): 1},
        {(5,): 4, (5, 6): 3, (6, 5, 6): 2},
        {},
    ]
    for _ in range(20):
        words = {
            tuple(rng.randrange(6) for _ in range(rng.randrange(1, 7))): rng.randrange(1, 9)
            for _ in range(rng.randrange(1, 8))
        }
        cases.append(words)
    for word_counts in cases:
        saved = copy.deepcopy(word_counts)
        got = _as_count_dict(bpe_pair_counts(word_counts), f"bpe_pair_counts({word_counts})")
        if word_counts != saved:
            raise ExerciseError("your function modified word_counts; build a new dict instead")
        want = _reference_pair_counts(word_counts)
        if got == want:
            continue
        inside = set(want)
        extra = [pair for pair in got if pair not in inside]
        if extra:
            raise ExerciseError(
                f"for {word_counts} you return the pair {extra[0]}, which does not occur inside "
                "any word: pairs must not span two words, so count each word on its own"
            )
        unweighted = _reference_pair_counts(dict.fromkeys(word_counts, 1))
        if got == unweighted:
            raise ExerciseError(
                f"for {word_counts} you counted each distinct word once; weight every pair "
                "by its word's count (a word seen 3 times contributes its pairs 3 times)"
            )
        for pair, n in want.items():
            if got.get(pair, 0) != n:
                hint = ""
                if pair[0] == pair[1] and got.get(pair, 0) < n:
                    hint = (
                        "; overlapping pairs all count: (7, 7, 7) contains (7, 7) twice "
                        "(counting is not merging)"
                    )
                raise ExerciseError(
                    f"for {word_counts} the pair {pair} has count {got.get(pair, 0)}, "
                    f"expected {n}{hint}"
                )


# -- Exercise 2 -------------------------------------------------------------------------------
@checker("Exercise 2: apply one merge")
def check_apply_merge(
    apply_merge: Callable[[list[int], tuple[int, int], int], Sequence[int]],
) -> None:
    rng = random.Random(2)
    cases: list[tuple[list[int], tuple[int, int]]] = [
        ([5, 5, 5], (5, 5)),
        ([5, 5, 5, 5], (5, 5)),
        ([1, 2, 1, 2], (1, 2)),
        ([3, 1, 2], (1, 2)),
        ([1, 2, 3], (1, 2)),
        ([4, 4, 1, 4], (2, 4)),
        ([], (1, 2)),
        ([1], (1, 2)),
    ]
    for _ in range(30):
        ids = [rng.randrange(4) for _ in range(rng.randrange(0, 12))]
        cases.append((ids, (rng.randrange(4), rng.randrange(4))))
    for ids, pair in cases:
        saved = list(ids)
        result = apply_merge(ids, pair, 300)
        if ids != saved:
            raise ExerciseError(
                f"apply_merge({saved}, {pair}, 300) modified its input list; return a new list"
            )
        if not isinstance(result, Sequence) or isinstance(result, (str, bytes)):
            raise ExerciseError(
                f"apply_merge should return a list of ids, got {type(result).__name__}"
            )
        got, want = list(result), merge_adjacent_pair(ids, pair, 300)
        if got == want:
            continue
        call = f"apply_merge({saved}, {pair}, 300)"
        if got.count(300) > want.count(300):
            raise ExerciseError(
                f"{call} returned {got}, expected {want}: you merged overlapping occurrences "
                "(each id can belong to one merged pair only; after a merge, skip past the pair)"
            )
        if len(ids) >= 2 and pair == (ids[-2], ids[-1]) and want[-1] == 300 and got[-1:] != [300]:
            raise ExerciseError(
                f"{call} returned {got}, expected {want}: the pair at the very end was missed "
                "(check the bound of your loop)"
            )
        if got == _merge_right_to_left(ids, pair, 300):
            raise ExerciseError(
                f"{call} returned {got}, expected {want}: scan from left to right, so that in "
                "(5, 5, 5) the first two ids merge"
            )
        raise ExerciseError(f"{call} returned {got}, expected {want}")


def _merge_right_to_left(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    out: list[int] = []
    i = len(ids) - 1
    while i >= 0:
        if i >= 1 and (ids[i - 1], ids[i]) == pair:
            out.append(new_id)
            i -= 2
        else:
            out.append(ids[i])
            i -= 1
    return out[::-1]


# -- Exercise 3 -------------------------------------------------------------------------------
_CORPUS_SAMPLE = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer "
    "the slings and arrows of outrageous fortune, or to take arms against a sea of troubles. "
)


@checker("Exercise 3: compression of a corpus")
def check_corpus_chars_per_token(
    corpus_chars_per_token: Callable[[list[str], Callable], float],
) -> None:
    encode = BPETokenizer().train(_CORPUS_SAMPLE * 4, vocab_size=300).encode
    corpora = [
        ["To be, or not to be"],
        ["the question", "Καλημέρα κόσμε, café", "a", "whether 'tis nobler in the mind to suffer"],
        ["sea of troubles " * 20, "ü"],
    ]
    for texts in corpora:
        got = corpus_chars_per_token(list(texts), encode)
        n_chars = sum(len(t) for t in texts)
        n_tokens = sum(len(encode(t)) for t in texts)
        want = n_chars / n_tokens
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise ExerciseError(f"the result should be a float, got {type(got).__name__}")
        if math.isclose(got, want, rel_tol=1e-9):
            continue
        n_bytes = sum(len(t.encode("utf-8")) for t in texts)
        mean_of_ratios = sum(len(t) / len(encode(t)) for t in texts) / len(texts)
        if math.isclose(got, n_tokens / n_chars, rel_tol=1e-9):
            raise ExerciseError(
                f"for {texts!r} you return {got:.4f}, tokens per character: invert the ratio "
                f"(expected {want:.4f})"
            )
        if math.isclose(got, n_bytes / n_tokens, rel_tol=1e-9):
            raise ExerciseError(
                f"for {texts!r} you return {got:.4f}: that counts UTF-8 bytes; count characters "
                f"with len(text) (expected {want:.4f})"
            )
        if math.isclose(got, mean_of_ratios, rel_tol=1e-9):
            raise ExerciseError(
                f"for {texts!r} you return {got:.4f}, the mean of per-document ratios, which "
                "gives a one-letter document as much weight as a book: divide the total "
                f"characters by the total tokens (expected {want:.4f})"
            )
        raise ExerciseError(f"for {texts!r} you return {got!r}, expected {want:.4f}")


# -- Exercise 4 -------------------------------------------------------------------------------
@checker("Exercise 4: decode from a vocabulary of bytes")
def check_decode_from_vocab(
    decode_from_vocab: Callable[[list[int], dict[int, bytes]], str],
) -> None:
    vocab = {i: bytes([i]) for i in range(256)}
    vocab[300] = b"h\xc3"  # 'é' is C3 A9 in UTF-8: this token ends in the middle of it
    vocab[301] = b"\xa9llo"
    vocab[302] = " 🙂".encode()
    cases: list[tuple[list[int], str, str]] = [
        ([], "", "an empty sequence"),
        ([104, 105], "hi", "plain ASCII bytes"),
        ([300, 301], "héllo", "a character split across two tokens"),
        ([300, 301, 302], "héllo 🙂", "tokens of several bytes"),
        ([104, 0xFF, 105], "h\ufffdi", "an invalid byte"),
        ([302, 300], " 🙂h\ufffd", "a sequence that ends in half a character"),
    ]
    for ids, want, what in cases:
        try:
            got = decode_from_vocab(list(ids), vocab)
        except UnicodeDecodeError:
            raise ExerciseError(
                f"decoding {ids} ({what}) raised UnicodeDecodeError: ids need not form valid "
                "UTF-8 (a model can stop mid-character); decode with errors='replace'"
            ) from None
        if not isinstance(got, str):
            raise ExerciseError(f"the result should be a str, got {type(got).__name__}")
        if got == want:
            continue
        per_token = "".join(vocab[i].decode("utf-8", errors="replace") for i in ids)
        if got == per_token:
            raise ExerciseError(
                f"decoding {ids} ({what}) gave {got!r}, expected {want!r}: you decoded each "
                "token on its own, which breaks characters split across tokens; join all the "
                "bytes first, then decode once"
            )
        if got == want.replace("\ufffd", ""):
            raise ExerciseError(
                f"decoding {ids} ({what}) gave {got!r}, expected {want!r}: invalid bytes "
                "should become U+FFFD (errors='replace'), not disappear"
            )
        raise ExerciseError(f"decoding {ids} ({what}) gave {got!r}, expected {want!r}")
    for bad in (999, -1):
        try:
            decode_from_vocab([104, bad], vocab)
        except ValueError as err:
            if str(bad) not in str(err):
                raise ExerciseError(
                    f"the ValueError for the unknown id {bad} should name it; it says {str(err)!r}"
                ) from None
        except KeyError:
            raise ExerciseError(
                f"the unknown id {bad} raised a bare KeyError; check the ids first and raise a "
                "ValueError that names the bad id"
            ) from None
        else:
            raise ExerciseError(
                f"decoding [104, {bad}] should raise ValueError: {bad} is not in vocab"
            )
