"""Checkers for the exercises of chapter 1 (tokenization).

Each checker runs the reader's function on hand-picked cases that expose the typical mistakes
(per-document ratios averaged, code points taken for bytes, the ``##`` prefix forgotten, a
greedy segmentation taken for the most probable one) and then on random cases against a
reference written here.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lib.exercises._common import ExerciseError, checker
from lib.tokenizer import BPETokenizer

__all__ = [
    "check_corpus_chars_per_token",
    "check_byte_fallback",
    "check_wordpiece_encode",
    "check_viterbi_segment",
]


# -- Exercise 1 -------------------------------------------------------------------------------
_CORPUS_SAMPLE = (
    "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer "
    "the slings and arrows of outrageous fortune, or to take arms against a sea of troubles. "
)


@checker("Exercise 1: compression of a corpus")
def check_corpus_chars_per_token(
    corpus_chars_per_token: Callable[[list[str], Callable], float],
) -> None:
    encode = BPETokenizer().train(_CORPUS_SAMPLE * 4, vocab_size=300).encode
    corpora = [
        ["To be, or not to be"],
        [
            "the question",
            "Καλημέρα κόσμε, café",
            "a",
            "whether 'tis nobler in the mind to suffer",
        ],
        ["sea of troubles " * 20, "ü"],
    ]
    for texts in corpora:
        got = corpus_chars_per_token(list(texts), encode)
        n_chars = sum(len(t) for t in texts)
        n_tokens = sum(len(encode(t)) for t in texts)
        want = n_chars / n_tokens
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            raise ExerciseError(
                f"the result should be a float, got {type(got).__name__}"
            )
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


# -- Exercise 2 -------------------------------------------------------------------------------
def _byte_fallback(text: str, char_to_id: Mapping[str, int]) -> list[int]:
    offset = len(char_to_id)
    ids: list[int] = []
    for char in text:
        if char in char_to_id:
            ids.append(char_to_id[char])
        else:
            ids.extend(offset + byte for byte in char.encode("utf-8"))
    return ids


def _as_id_list(got: Any, what: str) -> list[int]:
    if isinstance(got, (str, bytes)) or not isinstance(got, Sequence):
        raise ExerciseError(
            f"{what} should be a list of int ids, got {type(got).__name__}"
        )
    ids = list(got)
    for token_id in ids:
        if type(token_id) is not int:
            raise ExerciseError(
                f"{what} should hold ints, got {type(token_id).__name__} {token_id!r}"
            )
    return ids


@checker("Exercise 2: byte fallback")
def check_byte_fallback(encode: Callable[[str, dict[str, int]], Sequence[int]]) -> None:
    """``encode(text, char_to_id) -> ids``: known characters by id, others by UTF-8 bytes."""
    alphabet = "\n !',.:;?abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    char_to_id = {c: i for i, c in enumerate(sorted(alphabet))}
    offset = len(char_to_id)
    cases = [
        "",
        "hello, world",
        "café",
        "naïve déjà vu",
        "Καλημέρα",
        "I 🙂 it!",
        "x\u0301",
    ]
    rng = random.Random(2)
    pool = alphabet + "éü€Ωπ🙂中"
    cases += [
        "".join(rng.choice(pool) for _ in range(rng.randrange(1, 20)))
        for _ in range(30)
    ]
    for text in cases:
        saved = dict(char_to_id)
        try:
            result = encode(text, char_to_id)
        except KeyError as err:
            raise ExerciseError(
                f"encoding {text!r} raised KeyError {err}: a character that is not in "
                "char_to_id must not be looked up there; spell it with its UTF-8 bytes"
            ) from None
        if char_to_id != saved:
            raise ExerciseError("your function modified char_to_id; leave it as it is")
        got = _as_id_list(result, f"encoding {text!r}")
        want = _byte_fallback(text, char_to_id)
        if got == want:
            continue
        call = f"encoding {text!r}"
        unknown = next((c for c in text if c not in char_to_id), None)
        if unknown is not None:
            code_point = [
                char_to_id[c] if c in char_to_id else offset + ord(c) for c in text
            ]
            no_offset = []
            for c in text:
                if c in char_to_id:
                    no_offset.append(char_to_id[c])
                else:
                    no_offset.extend(c.encode("utf-8"))
            all_bytes = [offset + b for b in text.encode("utf-8")]
            if got == code_point:
                raise ExerciseError(
                    f"{call} gave {got}, expected {want}: you used the code point "
                    f"ord({unknown!r}) = {ord(unknown)}; use its UTF-8 bytes, "
                    f"{list(unknown.encode('utf-8'))}, one id each"
                )
            if got == no_offset:
                raise ExerciseError(
                    f"{call} gave {got}, expected {want}: byte b must get the id "
                    f"len(char_to_id) + b = {offset} + b, or it collides with the "
                    "characters' ids 0..len(char_to_id) - 1"
                )
            if got == all_bytes:
                raise ExerciseError(
                    f"{call} gave {got}, expected {want}: only the unknown characters "
                    "fall back to bytes; the known ones keep their own ids"
                )
        raise ExerciseError(f"{call} gave {got}, expected {want}")


# -- Exercise 3 -------------------------------------------------------------------------------
def _wordpiece(word: str, vocab: set[str], unk: str = "[UNK]") -> list[str]:
    pieces: list[str] = []
    start = 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                pieces.append(piece)
                start = end
                break
        else:
            return [unk]  # no piece fits: the whole word is unknown
    return pieces


def _wordpiece_variant(
    word: str,
    vocab: set[str],
    *,
    shortest: bool = False,
    prefix: str = "##",
    first_prefix: bool = False,
    partial_unk: bool = False,
) -> list[str]:
    pieces: list[str] = []
    start = 0
    while start < len(word):
        ends = (
            range(start + 1, len(word) + 1) if shortest else range(len(word), start, -1)
        )
        for end in ends:
            mark = prefix if (start > 0 or first_prefix) else ""
            if mark + word[start:end] in vocab:
                pieces.append(mark + word[start:end])
                start = end
                break
        else:
            if not partial_unk:
                return ["[UNK]"]
            pieces.append("[UNK]")
            start += 1
    return pieces


_WORDPIECE_VOCAB = {
    "[UNK]", "un", "una", "##a", "##aff", "##able", "##ff", "##ord", "##or", "##d",
    "afford", "a", "##b", "##l", "##e", "play", "##ing", "##in", "##g", "##s", "p",
    "##p", "##y", "the", "t", "##h",
}  # fmt: skip


@checker("Exercise 3: WordPiece, longest match first")
def check_wordpiece_encode(encode: Callable[[str, set[str]], Sequence[str]]) -> None:
    """``encode(word, vocab) -> pieces``: BERT's greedy longest-match-first encoding."""
    vocab = set(_WORDPIECE_VOCAB)
    cases = [
        "unaffordable",
        "playing",
        "plays",
        "the",
        "a",
        "afford",
        "pla",
        "xylophone",
    ]
    cases += ["playx", "unaff", "ordain"]
    rng = random.Random(3)
    letters = "abcdefg"
    random_vocab = {"[UNK]"} | set(letters[:5]) | {"##" + c for c in letters[:5]}
    for _ in range(60):
        piece = "".join(rng.choice(letters) for _ in range(rng.randrange(2, 5)))
        random_vocab.add(piece if rng.random() < 0.5 else "##" + piece)
    random_words = [
        "".join(rng.choice(letters) for _ in range(rng.randrange(1, 10)))
        for _ in range(80)
    ]
    for word_vocab, words in ((vocab, cases), (random_vocab, random_words)):
        for word in words:
            saved = set(word_vocab)
            result = encode(word, word_vocab)
            if word_vocab != saved:
                raise ExerciseError(
                    "your function modified the vocabulary; leave it as it is"
                )
            if isinstance(result, str) or not isinstance(result, Sequence):
                raise ExerciseError(
                    f"encode({word!r}) should return a list of str pieces, "
                    f"got {type(result).__name__}"
                )
            got, want = list(result), _wordpiece(word, word_vocab)
            if got == want:
                continue
            _diagnose_wordpiece(word, word_vocab, got, want)


def _diagnose_wordpiece(
    word: str, vocab: set[str], got: list[str], want: list[str]
) -> None:
    call = f"encode({word!r})"
    variants = {
        "shortest": (
            "you took the shortest piece that matches; WordPiece takes the longest one "
            "first (try end = len(word), then shorter)"
        ),
        "no_prefix": (
            "the pieces after the first must be looked up with the '##' prefix "
            "(a piece inside a word is '##' + text)"
        ),
        "first_prefix": "the first piece of a word has no '##' prefix; only later ones do",
        "partial_unk": (
            "when no piece fits at some position, the whole word becomes ['[UNK]'], as in "
            "BERT, not just the character that failed"
        ),
    }
    tries = {
        "shortest": _wordpiece_variant(word, vocab, shortest=True),
        "no_prefix": _wordpiece_variant(word, vocab, prefix=""),
        "first_prefix": _wordpiece_variant(word, vocab, first_prefix=True),
        "partial_unk": _wordpiece_variant(word, vocab, partial_unk=True),
    }
    for name, pieces in tries.items():
        if got == pieces:
            raise ExerciseError(f"{call} gave {got}, expected {want}: {variants[name]}")
    if got and got != ["[UNK]"] and "".join(p.removeprefix("##") for p in got) != word:
        raise ExerciseError(
            f"{call} gave {got}, expected {want}: the pieces, without their '##', "
            "must spell the word"
        )
    raise ExerciseError(f"{call} gave {got}, expected {want}")


# -- Exercise 4 -------------------------------------------------------------------------------
def _viterbi(word: str, log_probs: Mapping[str, float]) -> tuple[float, list[str]]:
    """The best total log-probability of a segmentation of ``word``, and the pieces."""
    n = len(word)
    best = [0.0] + [-math.inf] * n  # best[end]: the best score of word[:end]
    back = [0] * (n + 1)  # where the last piece of that best segmentation starts
    for end in range(1, n + 1):
        for start in range(end):
            piece = word[start:end]
            if piece in log_probs and best[start] + log_probs[piece] > best[end]:
                best[end] = best[start] + log_probs[piece]
                back[end] = start
    pieces, end = [], n
    while end > 0:
        pieces.append(word[back[end] : end])
        end = back[end]
    return best[n], pieces[::-1]


def _greedy_longest(word: str, log_probs: Mapping[str, float]) -> list[str]:
    pieces, start = [], 0
    while start < len(word):
        end = next(e for e in range(len(word), start, -1) if word[start:e] in log_probs)
        pieces.append(word[start:end])
        start = end
    return pieces


def _fewest_pieces(word: str, log_probs: Mapping[str, float]) -> list[str]:
    return _viterbi(word, dict.fromkeys(log_probs, -1.0))[1]


def _score(pieces: Sequence[str], log_probs: Mapping[str, float]) -> float:
    return sum(log_probs[p] for p in pieces)


_UNIGRAM = {
    "t": -5.0, "h": -5.5, "e": -4.0, "r": -5.2, "s": -4.8, "o": -4.9, "n": -4.7, "a": -4.6,
    "the": -3.0, "th": -6.0, "he": -5.0, "there": -9.5, "here": -6.5, "re": -5.0,
    "as": -5.5, "on": -5.0, "reason": -7.5, "reasons": -12.0, "so": -6.0, "ns": -9.0,
}  # fmt: skip


@checker("Exercise 4: the most probable segmentation")
def check_viterbi_segment(
    segment: Callable[[str, dict[str, float]], Sequence[str]],
) -> None:
    """``segment(word, log_probs) -> pieces`` with the largest sum of log-probabilities."""
    cases: list[tuple[str, dict[str, float]]] = [
        (word, _UNIGRAM) for word in ("there", "reasons", "the", "t", "seas", "treason")
    ]
    rng = random.Random(4)
    letters = "abcd"
    for _ in range(40):
        log_probs = {c: rng.uniform(-8, -4) for c in letters}
        for _ in range(rng.randrange(3, 25)):
            piece = "".join(rng.choice(letters) for _ in range(rng.randrange(2, 5)))
            log_probs[piece] = rng.uniform(-10, -3)
        word = "".join(rng.choice(letters) for _ in range(rng.randrange(1, 12)))
        cases.append((word, log_probs))
    for word, log_probs in cases:
        saved = dict(log_probs)
        result = segment(word, log_probs)
        if log_probs != saved:
            raise ExerciseError("your function modified log_probs; leave it as it is")
        call = f"segment({word!r})"
        if isinstance(result, str) or not isinstance(result, Sequence):
            raise ExerciseError(
                f"{call} should return a list of str pieces, got {type(result).__name__}"
            )
        got = list(result)
        best, want = _viterbi(word, log_probs)
        if "".join(got) != word:
            if "".join(got[::-1]) == word:
                raise ExerciseError(
                    f"{call} gave {got}: the pieces come out in reverse order; following "
                    "the back-pointers from the end gives the last piece first, so reverse "
                    "the list"
                )
            raise ExerciseError(
                f"{call} gave {got}, whose pieces do not spell {word!r}"
            )
        unknown = [p for p in got if p not in log_probs]
        if unknown:
            raise ExerciseError(
                f"{call} gave {got}: {unknown[0]!r} is not in the vocabulary"
            )
        score = _score(got, log_probs)
        if math.isclose(score, best, rel_tol=0, abs_tol=1e-9):
            continue
        where = (
            f"{call} gave {got} (log-prob {score:.2f}), expected {want} ({best:.2f})"
        )
        if got == _greedy_longest(word, log_probs):
            raise ExerciseError(
                f"{where}: that is the greedy longest match, which WordPiece uses; Unigram "
                "looks for the segmentation whose pieces' log-probabilities sum highest, "
                "over all segmentations (dynamic programming over the end positions)"
            )
        probs = {p: math.exp(v) for p, v in log_probs.items()}
        if math.isclose(sum(probs[p] for p in got), _best_sum_of_probs(word, probs)):
            raise ExerciseError(
                f"{where}: you maximised the sum of the pieces' probabilities; the "
                "probability of a segmentation is their product, so add log-probabilities"
            )
        if got == _fewest_pieces(word, log_probs) and len(got) < len(want):
            raise ExerciseError(
                f"{where}: fewer pieces is not the goal; a long piece can be rarer than "
                "two short ones together"
            )
        raise ExerciseError(where)


def _best_sum_of_probs(word: str, probs: Mapping[str, float]) -> float:
    n = len(word)
    best = [0.0] + [-math.inf] * n
    for end in range(1, n + 1):
        for start in range(end):
            piece = word[start:end]
            if piece in probs:
                best[end] = max(best[end], best[start] + probs[piece])
    return best[n]
