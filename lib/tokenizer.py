# This file is generated from chapters/01-tokenizer.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
"""Tokenizers (chapter 1): characters, bytes, and byte-level BPE trained from scratch.

* :class:`CharTokenizer` numbers the characters of a text (what the first GPT uses).
* :func:`gpt2_pretokenize` cuts text into words with GPT-2's regular expression.
* :func:`count_adjacent_pairs`, :func:`merge_adjacent_pair` and :func:`train_bpe_merges`
  are the pieces of byte pair encoding; :class:`BPETokenizer` puts them together with
  special tokens, a cached encoder, exact decoding and JSON save/load.
* :func:`chars_per_token` measures compression.
"""

from __future__ import annotations

import heapq
import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import regex

__all__ = [
    "GPT2_SPLIT_PATTERN",
    "BPETokenizer",
    "CharTokenizer",
    "chars_per_token",
    "count_adjacent_pairs",
    "gpt2_pretokenize",
    "merge_adjacent_pair",
    "train_bpe_merges",
]


def _as_id_list(ids: Any, vocab_size: int, owner: str) -> list[int]:
    """``ids`` (a sequence, array or 1-D tensor of ints) as a list, each checked to be in range."""
    if isinstance(ids, (str, bytes)):
        raise TypeError(
            f"{owner}.decode() takes a sequence of integer ids, got {type(ids).__name__}"
        )
    if hasattr(ids, "tolist"):  # torch tensors and NumPy arrays
        ids = ids.tolist()
    if not isinstance(ids, Iterable):
        raise TypeError(
            f"{owner}.decode() takes a sequence of integer ids, got {type(ids).__name__}"
        )
    ids = list(ids)
    for position, token_id in enumerate(ids):
        if not isinstance(token_id, int) or isinstance(token_id, bool):
            raise TypeError(
                f"{owner}.decode(): element {position} is {token_id!r} "
                f"({type(token_id).__name__}); ids must be ints in a 1-D sequence"
            )
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        position, bad = next((p, i) for p, i in enumerate(ids) if not 0 <= i < vocab_size)
        raise ValueError(
            f"{owner}.decode(): id {bad} at position {position} is out of range for a "
            f"vocabulary of {vocab_size} tokens (valid ids are 0..{vocab_size - 1})"
        )
    return ids


class CharTokenizer:
    """One token per distinct character of a text; ids follow code-point order.

    >>> tok = CharTokenizer("hello")
    >>> tok.chars, tok.encode("hole"), tok.decode([1, 2, 3])
    (['e', 'h', 'l', 'o'], [1, 3, 2, 0], 'hlo')
    """

    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise TypeError(f"CharTokenizer is built from a str, got {type(text).__name__}")
        if not text:
            raise ValueError("CharTokenizer needs a non-empty text to take its alphabet from")
        self.chars: list[str] = sorted(set(text))
        self.char_to_id: dict[str, int] = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """The ids of the characters of ``text``, one per character."""
        if not isinstance(text, str):
            raise TypeError(f"CharTokenizer.encode() takes a str, got {type(text).__name__}")
        try:
            return [self.char_to_id[c] for c in text]
        except KeyError:
            position, char = next((p, c) for p, c in enumerate(text) if c not in self.char_to_id)
            raise ValueError(
                f"character {char!r} (U+{ord(char):04X}) at position {position} is not in this "
                f"tokenizer's alphabet of {self.vocab_size} characters; build the CharTokenizer "
                "from a text that contains it"
            ) from None

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``: a list, array or tensor of shape ``(seq,)``, one id a character."""
        ids = _as_id_list(ids, self.vocab_size, "CharTokenizer")
        return "".join([self.chars[i] for i in ids])

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


def count_adjacent_pairs(ids: Sequence[int]) -> Counter[tuple[int, int]]:
    """How often each adjacent pair ``(ids[i], ids[i + 1])`` occurs in ``ids``.

    Overlapping pairs all count: ``(7, 7, 7)`` contains the pair ``(7, 7)`` twice.
    """
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TypeError(f"count_adjacent_pairs() takes a sequence of ids, got {type(ids).__name__}")
    return Counter(pairwise(ids))


def _merge_ids(ids: Sequence[int], left: int, right: int, new_id: int) -> list[int]:
    """``ids`` with each ``(left, right)`` replaced by ``new_id``, left to right (no checks)."""
    merged = []
    i, n = 0, len(ids)
    while i < n:
        if ids[i] == left and i + 1 < n and ids[i + 1] == right:
            merged.append(new_id)
            i += 2
        else:
            merged.append(ids[i])
            i += 1
    return merged


def merge_adjacent_pair(ids: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """A new list: ``ids`` with every occurrence of ``pair`` replaced by ``new_id``.

    Occurrences are taken left to right without overlap, so merging ``(7, 7)`` into 300
    turns ``[7, 7, 7]`` into ``[300, 7]``. The input is not modified.
    """
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TypeError(f"merge_adjacent_pair() takes a sequence of ids, got {type(ids).__name__}")
    if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(i, int) for i in pair)):
        raise ValueError(f"pair must be a tuple of two int ids, got {pair!r}")
    if not isinstance(new_id, int):
        raise TypeError(f"new_id must be an int, got {type(new_id).__name__}")
    return _merge_ids(ids, pair[0], pair[1], new_id)


GPT2_SPLIT_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)
_GPT2_SPLIT = regex.compile(GPT2_SPLIT_PATTERN)


def gpt2_pretokenize(text: str) -> list[str]:
    """Cut ``text`` into GPT-2's pre-tokens; ``"".join(gpt2_pretokenize(t)) == t``."""
    if not isinstance(text, str):
        raise TypeError(f"gpt2_pretokenize() takes a str, got {type(text).__name__}")
    return _GPT2_SPLIT.findall(text)


def train_bpe_merges(
    word_counts: Mapping[tuple[int, ...], int], n_merges: int, first_id: int = 256
) -> list[tuple[tuple[int, int], int]]:
    """Learn up to ``n_merges`` BPE merges from words (tuples of ids) and their counts.

    Returns ``[((a, b), count), ...]`` in merge order; the k-th merge creates id
    ``first_id + k``. Each step merges the pair with the largest count, ties broken by the
    smallest ``(a, b)``. Training stops early when no pair is left (every word is one token).
    """
    if not isinstance(n_merges, int) or isinstance(n_merges, bool) or n_merges < 0:
        raise ValueError(f"n_merges must be a non-negative int, got {n_merges!r}")
    words: list[tuple[int, ...]] = []
    freqs: list[int] = []
    for word, count in word_counts.items():
        if not isinstance(word, tuple):
            raise TypeError(f"words must be tuples of ids, got {type(word).__name__}: {word!r}")
        if not isinstance(count, int) or count <= 0:
            raise ValueError(f"word {word!r} has count {count!r}; counts must be positive ints")
        words.append(word)
        freqs.append(count)

    pair_counts: defaultdict[tuple[int, int], int] = defaultdict(int)
    where: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
    for index, (word, freq) in enumerate(zip(words, freqs)):
        for pair in pairwise(word):
            pair_counts[pair] += freq
            where[pair].add(index)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    merges: list[tuple[tuple[int, int], int]] = []
    while len(merges) < n_merges and heap:
        neg_count, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -neg_count:
            continue  # stale entry: this pair's count has changed since it was pushed
        new_id = first_id + len(merges)
        merges.append((pair, -neg_count))
        left, right = pair
        delta: defaultdict[tuple[int, int], int] = defaultdict(int)
        for index in where.pop(pair):
            word = words[index]
            merged = _merge_ids(word, left, right, new_id)
            if len(merged) == len(word):
                continue  # stale index entry: the word no longer contains the pair
            freq = freqs[index]
            for old in pairwise(word):
                delta[old] -= freq
            for new in pairwise(merged):
                delta[new] += freq
                where[new].add(index)
            words[index] = tuple(merged)
        for changed, diff in delta.items():
            if diff == 0:
                continue
            count = pair_counts[changed] + diff
            if count > 0:
                pair_counts[changed] = count
                heapq.heappush(heap, (-count, changed))
            else:
                del pair_counts[changed]
    return merges


class BPETokenizer:
    """Byte-level BPE with GPT-2's pre-tokenization, trained from scratch.

    Ids ``0..255`` are the bytes, then come the special tokens (``256, 257, ...`` in the order
    given), then one id per merge. An untrained tokenizer encodes text as its UTF-8 bytes.

    >>> tok = BPETokenizer().train("low lower lowest", vocab_size=260, special_tokens=["<eos>"])
    >>> tok.decode(tok.encode("lowest<eos>"))
    'lowest<eos>'
    """

    _FORMAT = "lib.tokenizer.BPETokenizer"
    _VERSION = 1
    _CACHE_LIMIT = 200_000  # cached word encodings; the cache is cleared when it fills up

    def __init__(self) -> None:
        self.merges: list[tuple[int, int]] = []
        self.special_tokens: dict[str, int] = {}
        self._rebuild()

    # -- state ---------------------------------------------------------------------------
    def _rebuild(self) -> None:
        """Derive the vocabulary, merge ranks, special-token regex and cache from the state."""
        vocab = [bytes([b]) for b in range(256)]
        vocab += [token.encode("utf-8") for token in self.special_tokens]
        self._merge_ids: dict[tuple[int, int], int] = {}
        for left, right in self.merges:
            self._merge_ids[(left, right)] = len(vocab)
            vocab.append(vocab[left] + vocab[right])
        self.vocab: list[bytes] = vocab
        self._cache: dict[str, list[int]] = {}
        longest_first = sorted(self.special_tokens, key=len, reverse=True)
        self._special_split = (
            regex.compile("(" + "|".join(regex.escape(t) for t in longest_first) + ")")
            if longest_first
            else None
        )

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @staticmethod
    def _check_special_tokens(special_tokens: Iterable[str]) -> list[str]:
        if isinstance(special_tokens, str):
            raise TypeError(
                f"special_tokens must be a list of strings, got the string {special_tokens!r}; "
                f"write [{special_tokens!r}]"
            )
        tokens = list(special_tokens)
        for token in tokens:
            if not isinstance(token, str):
                raise TypeError(f"special tokens must be strings, got {token!r}")
            if not token:
                raise ValueError("a special token cannot be the empty string")
        if len(set(tokens)) != len(tokens):
            raise ValueError(f"special tokens must be distinct, got {tokens}")
        return tokens

    @classmethod
    def from_merges(
        cls, merges: Iterable[tuple[int, int]], special_tokens: Iterable[str] = ()
    ) -> BPETokenizer:
        """A tokenizer from its merges (pairs of ids, in order) and special tokens."""
        specials = cls._check_special_tokens(special_tokens)
        tokenizer = cls()
        next_id = 256 + len(specials)
        checked = []
        for rank, pair in enumerate(merges):
            if (
                not isinstance(pair, (tuple, list))
                or len(pair) != 2
                or not all(isinstance(i, int) and not isinstance(i, bool) for i in pair)
            ):
                raise ValueError(f"merge {rank} must be a pair of int ids, got {pair!r}")
            left, right = pair
            if not (0 <= left < next_id and 0 <= right < next_id):
                raise ValueError(
                    f"merge {rank} ({left}, {right}) uses an id that does not exist yet "
                    f"(ids before this merge are 0..{next_id - 1})"
                )
            if 256 <= left < 256 + len(specials) or 256 <= right < 256 + len(specials):
                raise ValueError(f"merge {rank} ({left}, {right}) uses a special token's id")
            checked.append((left, right))
            next_id += 1
        tokenizer.special_tokens = {token: 256 + i for i, token in enumerate(specials)}
        tokenizer.merges = checked
        tokenizer._rebuild()
        return tokenizer

    # -- training ------------------------------------------------------------------------
    def train(self, text: str, vocab_size: int, special_tokens: Iterable[str] = ()) -> BPETokenizer:
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges from ``text``; return self.

        Ties between equally frequent pairs go to the smallest pair of ids. If the text runs
        out of pairs first, the vocabulary is smaller than ``vocab_size``.
        """
        if not isinstance(text, str):
            raise TypeError(f"BPETokenizer.train() takes a str, got {type(text).__name__}")
        if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
            raise TypeError(f"vocab_size must be an int, got {type(vocab_size).__name__}")
        specials = self._check_special_tokens(special_tokens)
        base = 256 + len(specials)
        if vocab_size < base:
            raise ValueError(
                f"vocab_size={vocab_size} is smaller than the byte alphabet plus the special "
                f"tokens (256 + {len(specials)} = {base})"
            )
        _check_utf8(text)
        chunks = [text]
        if specials:  # special tokens are cut out: no merge may involve them
            longest_first = sorted(specials, key=len, reverse=True)
            splitter = regex.compile("|".join(regex.escape(t) for t in longest_first))
            chunks = splitter.split(text)
        counts: Counter[str] = Counter()
        for chunk in chunks:
            counts.update(_GPT2_SPLIT.findall(chunk))
        word_counts = {tuple(word.encode("utf-8")): count for word, count in counts.items()}
        merges = train_bpe_merges(word_counts, vocab_size - base, first_id=base)
        self.special_tokens = {token: 256 + i for i, token in enumerate(specials)}
        self.merges = [pair for pair, _ in merges]
        self._rebuild()
        return self

    # -- encoding and decoding -----------------------------------------------------------
    def _encode_word(self, word: str) -> list[int]:
        ids = list(word.encode("utf-8"))
        merge_ids = self._merge_ids
        while len(ids) > 1:
            # the pair whose merge was learned first (smallest new id), if any
            best_id, best_pair = min((merge_ids.get(pair, 1 << 62), pair) for pair in pairwise(ids))
            if best_id == 1 << 62:
                break
            ids = _merge_ids(ids, best_pair[0], best_pair[1], best_id)
        return ids

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``: special tokens first, then pre-tokens, each through the merges."""
        if not isinstance(text, str):
            raise TypeError(f"BPETokenizer.encode() takes a str, got {type(text).__name__}")
        chunks = self._special_split.split(text) if self._special_split else [text]
        cache = self._cache
        ids: list[int] = []
        try:
            for position, chunk in enumerate(chunks):
                if position % 2:  # the splitter's captured group: a special token
                    ids.append(self.special_tokens[chunk])
                    continue
                for word in _GPT2_SPLIT.findall(chunk):
                    word_ids = cache.get(word)
                    if word_ids is None:
                        if len(cache) >= self._CACHE_LIMIT:
                            cache.clear()
                        word_ids = cache[word] = self._encode_word(word)
                    ids.extend(word_ids)
        except UnicodeEncodeError:
            _check_utf8(text)
            raise
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (a list, array or tensor of shape ``(seq,)``).

        The tokens' bytes are joined, then decoded once; bytes that are not valid UTF-8
        (a character cut between tokens, say) become U+FFFD.
        """
        ids = _as_id_list(ids, self.vocab_size, "BPETokenizer")
        vocab = self.vocab
        return b"".join([vocab[i] for i in ids]).decode("utf-8", errors="replace")

    # -- saving and loading --------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready state :meth:`save` writes: pattern, special tokens and merges."""
        return {
            "format": self._FORMAT,
            "version": self._VERSION,
            "pattern": GPT2_SPLIT_PATTERN,
            "special_tokens": list(self.special_tokens),
            "merges": [list(pair) for pair in self.merges],
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the tokenizer as JSON (UTF-8)."""
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        """Read a tokenizer written by :meth:`save`, with a clear error if the file is not one."""
        raw = Path(path).read_text(encoding="utf-8")
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not a tokenizer file: invalid JSON ({err})") from None
        if not isinstance(data, dict) or data.get("format") != cls._FORMAT:
            raise ValueError(f"{path} is not a {cls._FORMAT} file (no matching 'format' field)")
        if data.get("version") != cls._VERSION:
            raise ValueError(f"{path} has version {data.get('version')!r}; expected {cls._VERSION}")
        if data.get("pattern") != GPT2_SPLIT_PATTERN:
            raise ValueError(f"{path} was saved with a different pre-tokenization pattern")
        for key in ("special_tokens", "merges"):
            if not isinstance(data.get(key), list):
                raise ValueError(f"{path}: field {key!r} must be a list")
        try:
            return cls.from_merges(
                [tuple(p) if isinstance(p, list) else p for p in data["merges"]],
                data["special_tokens"],
            )
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path} holds an invalid tokenizer: {err}") from None

    def __repr__(self) -> str:
        return (
            f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
            f"special_tokens={list(self.special_tokens)})"
        )


def _check_utf8(text: str) -> None:
    """Raise a clear error for the one kind of str UTF-8 cannot encode: lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"text contains {text[err.start]!r} at position {err.start}, a lone surrogate that "
            "UTF-8 cannot encode; it usually comes from decoding bytes with errors='surrogateescape'"
        ) from None


def chars_per_token(text: str, ids: Sequence[int]) -> float:
    """Compression of an encoding: ``len(text) / len(ids)`` (characters, not bytes, per token)."""
    if not isinstance(text, str):
        raise TypeError(f"chars_per_token() takes the text as a str, got {type(text).__name__}")
    if len(ids) == 0:
        raise ValueError("chars_per_token() needs at least one token")
    return len(text) / len(ids)
