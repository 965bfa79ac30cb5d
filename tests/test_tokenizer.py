"""Unit tests of lib.tokenizer (chapter 1): characters, pre-tokenization, BPE training and I/O."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from itertools import pairwise

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lib.datasets import load_tiny_shakespeare
from lib.tokenizer import (
    GPT2_SPLIT_PATTERN,
    BPETokenizer,
    CharTokenizer,
    chars_per_token,
    count_adjacent_pairs,
    gpt2_pretokenize,
    merge_adjacent_pair,
    train_bpe_merges,
)

CORPUS = load_tiny_shakespeare()[:30_000]  # enough pairs for 400 tokens


@pytest.fixture(scope="module")
def trained() -> BPETokenizer:
    return BPETokenizer().train(
        CORPUS, vocab_size=400, special_tokens=["<|endoftext|>", "<pad>"]
    )


# -- CharTokenizer ------------------------------------------------------------------------------
def test_char_tokenizer_alphabet_is_sorted_and_round_trips():
    tok = CharTokenizer("hello world")
    assert tok.chars == [" ", "d", "e", "h", "l", "o", "r", "w"]
    assert tok.vocab_size == 8
    assert tok.encode("hello") == [3, 2, 4, 4, 5]
    assert tok.decode(tok.encode("world hello")) == "world hello"


def test_char_tokenizer_on_tiny_shakespeare_has_65_characters():
    assert CharTokenizer(load_tiny_shakespeare()).vocab_size == 65


def test_char_tokenizer_decodes_tensors_and_arrays():
    tok = CharTokenizer("abc")
    assert tok.decode(torch.tensor([2, 0, 1])) == "cab"
    assert tok.decode(np.array([1, 1])) == "bb"
    assert tok.decode([]) == ""


def test_char_tokenizer_unknown_character_is_a_clear_error():
    with pytest.raises(
        ValueError, match=r"'z' \(U\+007A\) at position 2 is not in .* 3 characters"
    ):
        CharTokenizer("abc").encode("abz")


@pytest.mark.parametrize("bad", [[3], [-1], [0, 1, 7]])
def test_char_tokenizer_id_out_of_range(bad):
    with pytest.raises(ValueError, match=r"out of range for a vocabulary of 3 tokens"):
        CharTokenizer("abc").decode(bad)


def test_char_tokenizer_bad_types():
    with pytest.raises(
        TypeError, match=r"CharTokenizer: text must be a str, got list \['a', 'b'\]"
    ):
        CharTokenizer(["a", "b"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="text must be a non-empty str"):
        CharTokenizer("")
    with pytest.raises(TypeError, match=r"encode\(\): text must be a str, got bytes"):
        CharTokenizer("abc").encode(b"abc")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence of integer ids"):
        CharTokenizer("abc").decode("abc")  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"decode\(\): ids\[1\] must be an int, got float 1.5"
    ):
        CharTokenizer("abc").decode([0, 1.5])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="1-D sequence"):
        CharTokenizer("abc").decode(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match=r"ids\[0\] must be an int, got bool True"):
        CharTokenizer("abc").decode([True])
    with pytest.raises(TypeError, match="sequence of integer ids, got int"):
        CharTokenizer("abc").decode(
            torch.tensor(1)
        )  # a 0-d tensor is one id, not a sequence


def test_char_tokenizer_decodes_numpy_integers():
    assert CharTokenizer("abc").decode([np.int64(2), np.int32(0)]) == "ca"


# -- pre-tokenization ---------------------------------------------------------------------------
def test_gpt2_pretokenize_examples():
    assert gpt2_pretokenize("Hello world's 123 ok!!") == [
        "Hello",
        " world",
        "'s",
        " 123",
        " ok",
        "!!",
    ]
    assert gpt2_pretokenize("a  b\n\nc ") == ["a", " ", " b", "\n", "\n", "c", " "]
    with pytest.raises(TypeError, match="text must be a str, got int 42"):
        gpt2_pretokenize(42)  # type: ignore[arg-type]


@given(st.text())
@settings(max_examples=200, deadline=None)
def test_gpt2_pretokenize_covers_the_text(s):
    pieces = gpt2_pretokenize(s)
    assert "".join(pieces) == s
    assert all(pieces)


# -- the two BPE primitives ---------------------------------------------------------------------
def test_count_adjacent_pairs_counts_overlaps():
    assert count_adjacent_pairs([7, 7, 7]) == Counter({(7, 7): 2})
    assert count_adjacent_pairs([1, 2, 1, 2]) == Counter({(1, 2): 2, (2, 1): 1})
    assert count_adjacent_pairs([5]) == Counter()
    with pytest.raises(TypeError, match="sequence of ids"):
        count_adjacent_pairs("abc")  # type: ignore[arg-type]


def test_merge_adjacent_pair_left_to_right_without_overlap():
    ids = [7, 7, 7]
    assert merge_adjacent_pair(ids, (7, 7), 300) == [300, 7]
    assert ids == [7, 7, 7]  # not modified
    assert merge_adjacent_pair([7, 7, 7, 7], (7, 7), 300) == [300, 300]
    assert merge_adjacent_pair([1, 2, 3, 1, 2], (1, 2), 9) == [9, 3, 9]
    assert merge_adjacent_pair([1, 3], (1, 2), 9) == [1, 3]
    with pytest.raises(ValueError, match="tuple of two int ids"):
        merge_adjacent_pair([1, 2], (1, 2, 3), 9)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="new_id must be an int"):
        merge_adjacent_pair([1, 2], (1, 2), "9")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pair", "new_id", "error", "match"),
    [
        ((True, 2), 9, TypeError, r"pair\[0\] must be an int, got bool True"),
        ((1, 2.0), 9, TypeError, r"pair\[1\] must be an int, got float 2.0"),
        ((1, 2), -3, ValueError, "new_id must be an int >= 0, got -3"),
        ((1, 2), False, TypeError, "new_id must be an int, got bool False"),
    ],
)
def test_merge_adjacent_pair_rejects_bools_floats_and_negative_ids(
    pair, new_id, error, match
):
    with pytest.raises(error, match=match):
        merge_adjacent_pair([1, 2], pair, new_id)


# -- the trainer --------------------------------------------------------------------------------
def _recount_train(word_counts, n_merges, first_id=256):
    """Reference: recount every pair (weighted) before each merge; same tie rule."""
    words = dict(word_counts)
    merges = []
    for step in range(n_merges):
        counts = Counter()
        for word, freq in words.items():
            for pair in pairwise(word):
                counts[pair] += freq
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        merges.append((pair, counts[pair]))
        merged = Counter()
        for word, freq in words.items():
            merged[tuple(merge_adjacent_pair(word, pair, first_id + step))] += freq
        words = merged
    return merges


def test_ties_go_to_the_smallest_pair_of_ids():
    # (1, 2) and (3, 4) both occur once: the smaller pair (1, 2) is merged first.
    assert train_bpe_merges({(3, 4): 1, (1, 2): 1}, 2) == [((1, 2), 1), ((3, 4), 1)]
    # Equal first ids: the second id decides.
    assert train_bpe_merges({(5, 9): 2, (5, 8): 2}, 1) == [((5, 8), 2)]
    # A higher count beats a smaller pair.
    assert train_bpe_merges({(1, 2): 1, (8, 9): 3}, 1) == [((8, 9), 3)]


def test_trainer_weights_pairs_by_word_counts_and_stops_when_out_of_pairs():
    merges = train_bpe_merges({(1, 2, 3): 5, (2, 3): 4}, 10)
    assert merges[0] == ((2, 3), 9)
    assert merges == [
        ((2, 3), 9),
        ((1, 256), 5),
    ]  # then every word is one token: stop early


word_counts_strategy = st.dictionaries(
    st.lists(st.integers(0, 4), min_size=1, max_size=8).map(tuple),
    st.integers(1, 6),
    max_size=12,
)


@given(word_counts_strategy, st.integers(0, 25))
@settings(max_examples=200, deadline=None)
def test_incremental_trainer_equals_recounting(word_counts, n_merges):
    assert train_bpe_merges(word_counts, n_merges, first_id=10) == _recount_train(
        word_counts, n_merges, first_id=10
    )


def _digest(merges) -> str:
    return hashlib.sha256(json.dumps(merges).encode()).hexdigest()


def test_trainer_keeps_the_merges_of_the_first_implementation():
    """The fast trainer (issue 42) learns exactly the merges, counts included, that the
    first implementation (tuples of ids, whole words redone, a fresh heap entry at every
    change) learned on all of Tiny Shakespeare, to the end of its pairs; and the
    tokenizer's merges with a special token cut out of the text."""
    text = load_tiny_shakespeare()
    words = Counter(gpt2_pretokenize(text))
    merges = train_bpe_merges({tuple(w.encode()): c for w, c in words.items()}, 40_000)
    assert len(merges) == 21_272
    assert merges[:3] == [((32, 116), 23837), ((104, 101), 18203), ((32, 97), 13541)]
    assert merges[-1] == ((20933, 109), 1)
    expected = "7d26fdea8a236c300474c70bbcc78ed52b7f1ba22b7f364d771fdc53ea7e1b5f"
    assert _digest(merges) == expected
    marked = text[:300_000].replace("\n\n", "\n<|endoftext|>\n")
    tok = BPETokenizer().train(marked, 3000, ["<|endoftext|>"])
    expected = "20c07ac511e40e632ca9c427fda7e916659fe6106f64407a62d03875af6c150b"
    assert _digest(tok.merges) == expected


@given(
    st.dictionaries(
        st.lists(st.integers(0, 40), min_size=1, max_size=30).map(tuple),
        st.integers(1, 50),
        max_size=30,
    ),
    st.integers(0, 80),
)
@settings(max_examples=100, deadline=None)
def test_incremental_trainer_equals_recounting_on_longer_words(word_counts, n_merges):
    """Longer words over a larger alphabet: words that hold a pair once (updated
    around it) and several times (redone whole), many ties."""
    assert train_bpe_merges(word_counts, n_merges, first_id=41) == _recount_train(
        word_counts, n_merges, first_id=41
    )


def test_trainer_numbers_ids_up_to_the_last_code_point():
    """Ids are characters inside the trainer: the last merge may create 0x10FFFF, and
    one past it is a clear error, counting only the merges the words' pairs allow."""
    top = 0x110000
    assert train_bpe_merges({(1, 2, 3): 1}, 2, first_id=top - 2) == [
        ((1, 2), 1),
        ((top - 2, 3), 1),
    ]
    assert train_bpe_merges({(1, 2, 3): 1}, 10**9, first_id=top - 2)[-1][1] == 1
    with pytest.raises(ValueError, match="up to 2 merges need ids up to 1,114,112;"):
        train_bpe_merges({(1, 2, 3): 1}, 5, first_id=top - 1)
    with pytest.raises(ValueError, match="this trainer numbers 1,114,112"):
        train_bpe_merges({(7,): 1}, 5, first_id=top + 1)


def test_trainer_accepts_numpy_counts():
    assert train_bpe_merges({(1, 2): np.int64(3)}, 1) == [((1, 2), 3)]


def test_trainer_bad_input():
    with pytest.raises(ValueError, match="n_merges must be an int >= 0, got -1"):
        train_bpe_merges({(1, 2): 1}, -1)
    with pytest.raises(TypeError, match="n_merges must be an int, got float 2.0"):
        train_bpe_merges({(1, 2): 1}, 2.0)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"the count of word \(1, 2\) must be an int >= 1, got 0"
    ):
        train_bpe_merges({(1, 2): 0}, 1)
    with pytest.raises(
        TypeError, match=r"the count of word \(1, 2\) must be an int, got bool"
    ):
        train_bpe_merges({(1, 2): True}, 1)
    with pytest.raises(TypeError, match="tuples of ids"):
        train_bpe_merges({"ab": 1}, 1)  # type: ignore[dict-item]
    with pytest.raises(
        TypeError, match="word_counts must map words to counts, got list"
    ):
        train_bpe_merges([((1, 2), 1)], 1)  # type: ignore[arg-type]


def test_trainer_refuses_ids_that_collide_with_the_new_ones():
    # Before: id 300 in a word and first_id=256 let merge 44 create a second, different id 300.
    with pytest.raises(
        ValueError, match=r"word \(1, 300\) holds an id outside 0\.\.255"
    ):
        train_bpe_merges({(1, 300): 2}, 1)
    with pytest.raises(ValueError, match="holds an id outside"):
        train_bpe_merges({(1, -2): 2}, 1)
    with pytest.raises(ValueError, match="holds an id outside"):
        train_bpe_merges({(1, "a"): 2}, 1)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="first_id must be an int >= 0"):
        train_bpe_merges({(1, 2): 2}, 1, first_id=-1)


# -- BPETokenizer -------------------------------------------------------------------------------
def test_untrained_tokenizer_is_plain_utf8_bytes():
    tok = BPETokenizer()
    assert tok.vocab_size == 256
    assert tok.encode("é!") == [0xC3, 0xA9, 0x21]
    assert tok.decode([0xC3, 0xA9]) == "é"


def test_training_reaches_the_vocab_size_with_fixed_special_ids(trained):
    assert trained.vocab_size == 400
    assert trained.special_tokens == {"<|endoftext|>": 256, "<pad>": 257}
    assert trained.vocab[256] == b"<|endoftext|>"
    assert len(trained.merges) == 400 - 258
    # every merged token is the concatenation of its two parts
    for rank, (left, right) in enumerate(trained.merges):
        assert trained.vocab[258 + rank] == trained.vocab[left] + trained.vocab[right]


def test_training_is_deterministic_and_smaller_vocabularies_are_prefixes(trained):
    again = BPETokenizer().train(CORPUS, 400, special_tokens=["<|endoftext|>", "<pad>"])
    assert again.merges == trained.merges
    smaller = BPETokenizer().train(
        CORPUS, 300, special_tokens=["<|endoftext|>", "<pad>"]
    )
    assert smaller.merges == trained.merges[: 300 - 258]


def test_first_merge_is_the_most_frequent_pair_of_the_words():
    words = Counter(gpt2_pretokenize(CORPUS))
    counts = Counter()
    for word, freq in words.items():
        for pair in pairwise(word.encode()):
            counts[pair] += freq
    best = min(counts, key=lambda p: (-counts[p], p))
    assert BPETokenizer().train(CORPUS, 257).merges == [best]


def test_special_tokens_are_never_split_and_never_merged(trained):
    ids = trained.encode("speak<|endoftext|>speak<pad><pad>")
    assert ids.count(256) == 1 and ids[-2:] == [257, 257]
    assert trained.encode("<|endoftext|>") == [256]
    assert all(256 not in pair and 257 not in pair for pair in trained.merges)
    # no merged token contains a piece of a special token that spans its boundary
    text = "x<|endoftext|>y"
    assert trained.decode(trained.encode(text)) == text


def test_longest_special_token_wins():
    tok = BPETokenizer().train("ab ab", 260, special_tokens=["<a>", "<a><b>"])
    assert tok.encode("<a><b><a>") == [257, 256]


def test_encode_equals_applying_every_merge_in_order(trained):
    for word in [
        "First",
        " Citizen",
        " resolved",
        " famish",
        " unseen",
        "!!",
        " Marcius",
    ]:
        ids = list(word.encode())
        for rank, pair in enumerate(trained.merges):
            ids = merge_adjacent_pair(ids, pair, 258 + rank)
        assert trained.encode(word) == ids


def test_merges_without_overlapping_runs_save_exactly_their_count_of_tokens():
    word_counts = {
        tuple(w.encode()): c for w, c in Counter(gpt2_pretokenize(CORPUS)).items()
    }
    merges = train_bpe_merges(word_counts, 150)
    tok = BPETokenizer.from_merges([pair for pair, _ in merges])
    ids = tok.encode(CORPUS)
    assert len(ids) == len(CORPUS.encode()) - sum(count for _, count in merges)
    assert tok.decode(ids) == CORPUS


def test_an_overlapping_run_counts_more_than_it_saves():
    # Counted with overlaps, (97, 97) occurs twice in "aaa" and once in "aa": three times.
    # But only one merge fits in "aaa" (left to right, no overlap), and one in "aa".
    merges = train_bpe_merges({tuple(b"aaa"): 1, tuple(b"aa"): 1}, 1)
    assert merges == [((97, 97), 3)]
    tok = BPETokenizer.from_merges([(97, 97)])
    assert tok.encode("aaa") == [256, 97] and tok.encode("aa") == [256]
    assert len(tok.encode("aaa")) + len(tok.encode("aa")) == 5 - 2  # saves 2, not 3


round_trip_text = st.text() | st.lists(
    st.sampled_from(["<|endoftext|>", "<pad>", "speak", " ", "\n", "é", "🙂", "<pad"])
).map("".join)


@given(round_trip_text)
@settings(max_examples=300, deadline=None)
def test_round_trip_any_unicode_string(trained, s):
    assert trained.decode(trained.encode(s)) == s


def test_decode_replaces_invalid_utf8(trained):
    assert trained.decode([0xFF]) == "\ufffd"
    assert trained.decode(list("🙂".encode())[:3]) == "\ufffd"
    assert trained.decode(torch.tensor([104, 105])) == "hi"


def test_save_and_load_round_trip(trained, tmp_path):
    path = tmp_path / "tok.json"
    trained.save(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["special_tokens"] == ["<|endoftext|>", "<pad>"]
    assert data["pattern"] == GPT2_SPLIT_PATTERN
    loaded = BPETokenizer.load(path)
    assert (
        loaded.merges == trained.merges
        and loaded.special_tokens == trained.special_tokens
    )
    assert loaded.vocab == trained.vocab
    assert loaded.encode(CORPUS + "<pad>") == trained.encode(CORPUS + "<pad>")


# -- bad input ----------------------------------------------------------------------------------
def test_encode_and_train_reject_non_strings():
    with pytest.raises(TypeError, match=r"encode\(\): text must be a str, got bytes"):
        BPETokenizer().encode(b"abc")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"train\(\): text must be a str, got list"):
        BPETokenizer().train(["abc"], 300)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="vocab_size must be an int, got float 300.0"):
        BPETokenizer().train("abc", 300.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="vocab_size must be an int, got bool"):
        BPETokenizer().train("abc", True)  # type: ignore[arg-type]


def test_decode_ids_out_of_range(trained):
    with pytest.raises(
        ValueError, match=r"id 400 at position 1 is out of range .* 0\.\.399"
    ):
        trained.decode([1, 400])
    with pytest.raises(ValueError, match=r"id -1 at position 0"):
        trained.decode([-1])
    with pytest.raises(TypeError, match=r"ids\[0\] must be an int, got NoneType None"):
        trained.decode([None])  # type: ignore[list-item]


def test_vocab_size_smaller_than_the_alphabet():
    with pytest.raises(ValueError, match=r"256 \+ 1 = 257"):
        BPETokenizer().train("abc", 256, special_tokens=["<eos>"])
    with pytest.raises(ValueError, match=r"vocab_size=100"):
        BPETokenizer().train("abc", 100)


def test_bad_special_tokens():
    with pytest.raises(
        ValueError, match=r"special_tokens\[0\] must be a non-empty str"
    ):
        BPETokenizer().train("abc", 300, special_tokens=[""])
    with pytest.raises(ValueError, match="distinct"):
        BPETokenizer().train("abc", 300, special_tokens=["<a>", "<a>"])
    with pytest.raises(TypeError, match=r"write \['<eos>'\]"):
        BPETokenizer().train("abc", 300, special_tokens="<eos>")
    with pytest.raises(
        TypeError, match=r"special_tokens\[1\] must be a str, got int 1"
    ):
        BPETokenizer().train("abc", 300, special_tokens=["<a>", 1])  # type: ignore[list-item]
    # before: an unhelpful UnicodeEncodeError from deep inside the vocabulary's construction
    with pytest.raises(ValueError, match="lone surrogate"):
        BPETokenizer.from_merges([], ["<\ud800>"])


def test_lone_surrogates_are_a_clear_error(trained):
    with pytest.raises(ValueError, match="lone surrogate"):
        trained.encode("ok \ud800")
    with pytest.raises(ValueError, match="position 1"):
        BPETokenizer().train("a\udc80", 300)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "no matching 'format'"),
        ('{"format": "something.else"}', "no matching 'format'"),
        ('{"format": "lib.tokenizer.BPETokenizer", "version": 99}', "version 99"),
    ],
)
def test_load_rejects_malformed_files(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        BPETokenizer.load(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pattern": r"\w+"}, "different pre-tokenization pattern"),
        ({"merges": "nope"}, "'merges' must be a list"),
        ({"merges": [[1, 2], [3]]}, "merge 1 must be a pair"),
        ({"merges": [[1, 999]]}, r"merge 0 \(1, 999\) uses an id that does not exist"),
        ({"merges": [[256, 1]]}, "special token's id"),
        ({"special_tokens": [""]}, "must be a non-empty str"),
        ({"merges": [[1, 2], [3, 4], [1, 2]]}, r"merge 2 \(1, 2\) repeats merge 0"),
    ],
)
def test_load_rejects_invalid_contents(trained, tmp_path, change, message):
    data = {**trained.to_dict(), **change}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        BPETokenizer.load(path)


def test_chars_per_token():
    assert chars_per_token("héllo", [1, 2]) == 2.5
    with pytest.raises(ValueError, match="at least one token"):
        chars_per_token("abc", [])
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        chars_per_token(b"abc", [1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ids as a sequence, got generator"):
        chars_per_token("abc", (i for i in [1]))  # type: ignore[arg-type]


def test_docstring_examples():
    import doctest

    import lib.tokenizer

    result = doctest.testmod(lib.tokenizer)
    assert result.attempted >= 2 and result.failed == 0


def test_from_merges_rejects_a_duplicate_merge():
    # Before: accepted; the second (104, 105) got an id that encode could never produce.
    with pytest.raises(
        ValueError, match=r"merge 1 \(104, 105\) repeats merge 0; a pair is merged"
    ):
        BPETokenizer.from_merges([(104, 105), (104, 105)])
    with pytest.raises(ValueError, match="merge 0 must be a pair of int ids, got"):
        BPETokenizer.from_merges([(104, True)])


# -- streaming ----------------------------------------------------------------------------------
def test_encode_iterable_equals_encode_on_tiny_shakespeare(trained):
    import io

    text = load_tiny_shakespeare()
    streamed = trained.encode_iterable(
        io.StringIO(text)
    )  # a file object yields its lines
    assert not isinstance(streamed, list)
    assert list(streamed) == trained.encode(text)
    assert list(
        trained.encode_iterable(text.splitlines(keepends=True))
    ) == trained.encode(text)


# Pieces chosen to exercise every rule of the cut: spaces, other whitespace (including one
# that Python's isspace() knows but the regex's \s does not), letters, digits, apostrophes
# for the contractions, punctuation, and pieces of the special tokens.
STREAM_PIECES = [" ", "  ", "\n", "\n\n", "\r\n", "\t", "\x0b", "\xa0", "\u2028", "\x1c", "a",
                 "Zé", "7", "'s", "'", "!", ".", "ab cd", "<pad>", "<|endoftext|>", "<", "<pad", "🙂"]  # fmt: skip


@pytest.fixture(scope="module")
def whitespace_tok() -> BPETokenizer:
    """A tokenizer whose merges join whitespace ("  ", "\n\n", "\r\n", " a"...): a cut that
    changes the pieces then changes the ids (with Shakespeare's merges it often would not)."""
    import random

    rng = random.Random(0)
    corpus = "".join(rng.choice(STREAM_PIECES) for _ in range(20_000))
    return BPETokenizer().train(corpus, 700, special_tokens=["<|endoftext|>", "<pad>"])


@given(
    st.lists(
        st.lists(st.sampled_from(STREAM_PIECES), max_size=6).map("".join), max_size=12
    )
)
@settings(max_examples=300, deadline=None)
def test_encode_iterable_equals_encode_however_the_text_is_chunked(
    whitespace_tok, chunks
):
    # This test fails for a cut after every newline, or anywhere inside a whitespace run.
    assert list(whitespace_tok.encode_iterable(chunks)) == whitespace_tok.encode(
        "".join(chunks)
    )


def test_encode_iterable_cuts_where_the_pieces_do_not_change(whitespace_tok):
    # A cut after the newline of "a  \n" would change the pieces ("  \n" instead of "  ",
    # "\n"); the stream must give the same ids as the whole text.
    lines = ["a  \n", "b\n", "\n", "c\n", "   indented\n", "\n\n", "<pad>\n", "end"]
    whole = whitespace_tok.encode("".join(lines))
    assert list(whitespace_tok.encode_iterable(lines)) == whole
    assert [
        i for line in lines for i in whitespace_tok.encode(line)
    ] != whole  # naive is wrong


def test_encode_iterable_is_lazy_and_holds_little_memory():
    import itertools
    import tracemalloc

    tok = BPETokenizer().train(CORPUS, vocab_size=300)
    line = "First Citizen: we are accounted poor citizens, the patricians good.\n"
    # Lazy: an endless stream still gives its first ids.
    first = list(itertools.islice(tok.encode_iterable(itertools.repeat(line)), 50))
    assert first == tok.encode(line * 3)[:50]
    # Bounded: 60,000 lines (about 4 MB of text) never held at once.
    n_lines = 60_000
    tok.encode(line)  # warm the word cache, which is bounded by the distinct words
    tracemalloc.start()
    try:
        count = sum(1 for _ in tok.encode_iterable(line for _ in range(n_lines)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == n_lines * len(tok.encode(line))
    total = n_lines * len(line)
    assert peak < total / 100, f"peak {peak:,} bytes for {total:,} characters streamed"


def test_encode_iterable_bad_input(trained):
    with pytest.raises(
        TypeError, match=r"iterable of str .* got str; encode\(\) takes one str"
    ):
        trained.encode_iterable("one string")
    with pytest.raises(TypeError, match="got int"):
        trained.encode_iterable(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="line 1 must be a str, got bytes .*text mode"):
        list(trained.encode_iterable(["ok\n", b"bytes\n"]))  # type: ignore[list-item]
    spaced = BPETokenizer.from_merges([], ["<a b>"])
    with pytest.raises(
        ValueError, match="special token '<a b>', which contains whitespace"
    ):
        spaced.encode_iterable(["x"])


def test_char_tokenizer_encode_iterable():
    text = load_tiny_shakespeare()[:5_000]
    tok = CharTokenizer(text)
    assert list(tok.encode_iterable(text.splitlines(keepends=True))) == tok.encode(text)
    with pytest.raises(TypeError, match="iterable of str"):
        tok.encode_iterable(text)
    with pytest.raises(ValueError, match="'é'"):
        list(tok.encode_iterable(["First", "é"]))
