# This file is generated from chapters/01-tokenizer.md by tools/tangle.py. Do not edit it by hand:
# edit the chapter's cells tagged "export", then run `python tools/tangle.py`.
# From chapters/01-tokenizer.md, section "Characters: the simplest tokenizer".
"""Tokenizers (chapter 1): characters, bytes, and byte-level BPE trained
from scratch.

* :class:`CharTokenizer` numbers the characters of a text (what the first
  GPT uses).
* :func:`gpt2_pretokenize` cuts text into words with GPT-2's regular
  expression.
* :func:`count_adjacent_pairs`, :func:`merge_adjacent_pair` and
  :func:`train_bpe_merges` are the pieces of byte pair encoding;
  :class:`BPETokenizer` puts them together with special tokens, a cached
  encoder, exact decoding, streaming encoding of a file too large for memory
  (``encode_iterable``) and JSON save/load.
* :func:`chars_per_token` measures compression.
"""

from __future__ import annotations

import heapq
import json
import operator
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain, pairwise
from operator import add
from pathlib import Path
from typing import Any

import regex

from lib import _checks as check

# The public names: every top-level name the export cells define (tools/tangle.py).
__all__ = [
    "CharTokenizer",
    "count_adjacent_pairs",
    "merge_adjacent_pair",
    "GPT2_SPLIT_PATTERN",
    "gpt2_pretokenize",
    "train_bpe_merges",
    "BPETokenizer",
    "chars_per_token",
]


# From chapters/01-tokenizer.md, section "Characters: the simplest tokenizer".
class CharTokenizer:
    """One token per distinct character of a text; ids follow code-point
    order.

    >>> tok = CharTokenizer("hello")
    >>> tok.chars, tok.encode("hole"), tok.decode([1, 2, 3])
    (['e', 'h', 'l', 'o'], [1, 3, 2, 0], 'hlo')
    """

    def __init__(self, text: str) -> None:
        check.string("text", text, nonempty=True, owner="CharTokenizer")
        self.chars: list[str] = sorted(set(text))
        self.char_to_id: dict[str, int] = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """The ids of the characters of ``text``, one per character."""
        check.string("text", text, owner="CharTokenizer.encode()")
        try:
            return [self.char_to_id[c] for c in text]
        except KeyError:
            position = next(p for p, c in enumerate(text) if c not in self.char_to_id)
            char = text[position]
            raise ValueError(
                f"character {char!r} (U+{ord(char):04X}) at position "
                f"{position} is not in this tokenizer's alphabet of "
                f"{self.vocab_size} characters; build the CharTokenizer "
                "from a text that contains it"
            ) from None

    def encode_iterable(self, lines: Iterable[str]) -> Iterator[int]:
        """The ids of ``"".join(lines)``, lazily, one line at a time."""
        owner, hint = ("CharTokenizer.encode_iterable()", "encode() takes one str")
        lines = check.text_lines("lines", lines, owner=owner, hint=hint)
        return chain.from_iterable(map(self.encode, lines))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (a list, array or tensor of shape
        ``(seq,)``)."""
        owner = "CharTokenizer.decode()"
        ids = check.token_ids("ids", ids, self.vocab_size, owner=owner)
        return "".join([self.chars[i] for i in ids])

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


# From chapters/01-tokenizer.md, section "Byte pair encoding".
def count_adjacent_pairs(ids: Sequence[int]) -> Counter[tuple[int, int]]:
    """How often each adjacent pair ``(ids[i], ids[i + 1])`` occurs in
    ``ids``.

    Overlapping pairs all count: ``(7, 7, 7)`` contains the pair ``(7, 7)``
    twice.
    """
    ids = check.token_ids("ids", ids, owner="count_adjacent_pairs()")
    return Counter(pairwise(ids))


# From chapters/01-tokenizer.md, section "Byte pair encoding".
def _check_merge_pair(ids, pair, new_id) -> tuple:
    """The checked ``ids`` (a list), ``pair`` and ``new_id``."""
    ids = check.token_ids("ids", ids, owner="merge_adjacent_pair()")
    if not (isinstance(pair, tuple) and len(pair) == 2):
        raise ValueError(f"pair must be a tuple of two int ids, got {pair!r}")
    left, right = (check.int_at_least(f"pair[{i}]", pair[i], 0) for i in (0, 1))
    new_id = check.int_at_least("new_id", new_id, 0)
    return ids, (left, right), new_id


# From chapters/01-tokenizer.md, section "Byte pair encoding".
def merge_adjacent_pair(
    ids: Sequence[int], pair: tuple[int, int], new_id: int
) -> list[int]:
    """A new list: ``ids`` with every occurrence of ``pair`` replaced by
    ``new_id``.

    Occurrences are taken left to right without overlap, so merging
    ``(7, 7)`` into 300 turns ``[7, 7, 7]`` into ``[300, 7]``. The input is
    not modified.
    """
    if not check.trusted():  # (trusted: BPETokenizer's encoder)
        ids, pair, new_id = _check_merge_pair(ids, pair, new_id)
    left, right = pair
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


# From chapters/01-tokenizer.md, section "Pre-tokenization: where merges may not cross".
GPT2_SPLIT_PATTERN = (
    r"'s|'t|'re|'ve|'m|'ll|'d"  # the English contractions
    r"| ?\p{L}+"  # a run of letters, with the space before it
    r"| ?\p{N}+"  # a run of digits, likewise
    r"| ?[^\s\p{L}\p{N}]+"  # other symbols: punctuation and the like
    r"|\s+(?!\S)"  # whitespace, less the space before the next word
    r"|\s+"  # whatever whitespace is left
)
_GPT2_SPLIT = regex.compile(GPT2_SPLIT_PATTERN)


def gpt2_pretokenize(text: str) -> list[str]:
    """Cut ``text`` into GPT-2's pre-tokens.

    ``"".join(gpt2_pretokenize(t)) == t`` for every string ``t``.
    """
    check.string("text", text, owner="gpt2_pretokenize()")
    return _GPT2_SPLIT.findall(text)


# From chapters/01-tokenizer.md, section "Training fast: count once, then update".
# Unicode's code points: the trainer writes id i as chr(i)
_MAX_IDS = 0x110000


def _check_word_counts(
    word_counts: Mapping[tuple[int, ...], int], n_merges: int, first_id: int
) -> tuple[int, int]:
    """The checked ``n_merges`` and ``first_id``."""
    n_merges, first_id = check.nonnegative_ints(n_merges=n_merges, first_id=first_id)
    if not isinstance(word_counts, Mapping):
        got = type(word_counts).__name__
        raise TypeError(f"word_counts must map words to counts, got {got}")
    for word in word_counts:
        if not isinstance(word, tuple):
            got = f"{type(word).__name__}: {word!r}"
            raise TypeError(f"words must be tuples of ids, got {got}")
    ids = list(chain.from_iterable(word_counts))
    # the ids: ints (no bools) below first_id; the quick test first, then
    # the word to name
    if not (
        set(map(type, ids)) <= {int}
        and 0 <= min(ids, default=0)
        and max(ids, default=0) < first_id
    ):
        for word in word_counts:
            if not all(type(i) is int and 0 <= i < first_id for i in word):
                raise ValueError(
                    f"word {word!r} holds an id outside 0..{first_id - 1}:"
                    f" the ids from first_id={first_id} on are the new ids"
                    " that the merges create"
                )
    counts = word_counts.values()
    if not (set(map(type, counts)) <= {int} and min(counts, default=1) > 0):
        for word, count in word_counts.items():
            check.positive_int(f"the count of word {word!r}", count)
    # ids are characters in the trainer: up to the last one a merge makes
    # (a merge joins two ids of one word: at most len(word) - 1 a word)
    most = min(n_merges, sum(len(w) - 1 for w in word_counts if w))
    if first_id + most > _MAX_IDS:
        raise ValueError(
            f"first_id={first_id} and up to {most} merges need ids up to "
            f"{first_id + most - 1:,}; this trainer numbers {_MAX_IDS:,}"
        )
    return n_merges, first_id


# From chapters/01-tokenizer.md, section "Training fast: count once, then update".
# a heap entry is -count * 2**42 + a * 2**21 + b: ids take 21 bits
_ID_BITS = 21
_ID_MASK = (1 << _ID_BITS) - 1


def _heap_entry(count: int, pair: str) -> int:
    """The int that sorts as ``(-count, a, b)`` for the pair ``a + b``."""
    a, b = pair
    return (-count << 2 * _ID_BITS) + (ord(a) << _ID_BITS) + ord(b)


def train_bpe_merges(
    word_counts: Mapping[tuple[int, ...], int], n_merges: int, first_id: int = 256
) -> list[tuple[tuple[int, int], int]]:
    """Learn up to ``n_merges`` BPE merges from words (tuples of ids) and
    their counts.

    Returns ``[((a, b), count), ...]`` in merge order; the k-th merge
    creates id ``first_id + k``, so the words' ids must lie in
    ``0 .. first_id - 1``. Each step merges the pair with the largest count,
    ties broken by the smallest ``(a, b)``. Training stops early when no
    pair is left (every word is one token).
    """
    n_merges, first_id = _check_word_counts(word_counts, n_merges, first_id)
    # the counts as Python ints (NumPy's too)
    freqs = list(map(operator.index, word_counts.values()))
    # a word as a str of one character per id; a pair as two characters
    words = ["".join(map(chr, word)) for word in word_counts]
    pair_counts: defaultdict[str, int] = defaultdict(int)
    # the words of the pairs made now, gathered in lists, and kept in the
    # index as tuples (a pair is made once: its words are known then)
    found: defaultdict[str, list[int]] = defaultdict(list)
    for index, (word, freq) in enumerate(zip(words, freqs)):
        word_pairs = list(map(add, word, word[1:]))
        for pair in word_pairs:
            pair_counts[pair] += freq
        for pair in dict.fromkeys(word_pairs):  # each word once a pair
            found[pair].append(index)
    where = {pair: tuple(indices) for pair, indices in found.items()}
    found.clear()
    heap = [_heap_entry(count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    merged_pairs: list[str] = []
    merged_counts: list[int] = []
    # the neighbours' counts (x before a merged pair, y after it) and the
    # net change of each pair, gathered over one merge's words
    before: defaultdict[str, int] = defaultdict(int)
    after: defaultdict[str, int] = defaultdict(int)
    delta: defaultdict[str, int] = defaultdict(int)
    while len(merged_pairs) < n_merges and heap:
        entry = heapq.heappop(heap)
        pair = chr(entry >> _ID_BITS & _ID_MASK) + chr(entry & _ID_MASK)
        count = pair_counts.get(pair, 0)
        entry_count = -(entry >> 2 * _ID_BITS)
        if count != entry_count:
            # out of date: an entry above the count goes back with the
            # count; one below it has a larger twin still in the heap
            if 0 < count < entry_count:
                heapq.heappush(heap, _heap_entry(count, pair))
            continue
        new = chr(first_id + len(merged_pairs))
        merged_pairs.append(pair)
        merged_counts.append(count)
        del pair_counts[pair]  # every occurrence is merged
        for index in where.pop(pair):
            word = words[index]
            merged = word.replace(pair, new)
            n_found = len(word) - len(merged)
            if n_found == 0:
                continue  # stale index entry: the pair has left the word
            freq = freqs[index]
            if n_found == 1:  # x a b y -> x new y
                at = word.find(pair)
                if at > 0:
                    before[word[at - 1]] += freq
                    found[word[at - 1] + new].append(index)
                if at + 2 < len(word):
                    after[word[at + 2]] += freq
                    found[new + word[at + 2]].append(index)
            else:  # several occurrences: redo the whole word
                for old_pair in map(add, word, word[1:]):
                    delta[old_pair] -= freq
                new_pairs = list(map(add, merged, merged[1:]))
                for new_pair in new_pairs:
                    delta[new_pair] += freq
                for new_pair in dict.fromkeys(new_pairs):
                    if new in new_pair:
                        found[new_pair].append(index)
            words[index] = merged
        left, right = pair
        for x, freq in before.items():
            delta[x + left] -= freq
            delta[x + new] += freq
        for y, freq in after.items():
            delta[right + y] -= freq
            delta[new + y] += freq
        delta.pop(pair, None)
        for changed, diff in delta.items():
            count = pair_counts[changed] + diff
            if count == 0:
                del pair_counts[changed]
                continue
            pair_counts[changed] = count
            if diff > 0:
                heapq.heappush(heap, _heap_entry(count, changed))
        for new_pair, indices in found.items():
            where[new_pair] = tuple(indices)
        before.clear()
        after.clear()
        delta.clear()
        found.clear()
    return [
        ((ord(a), ord(b)), count) for (a, b), count in zip(merged_pairs, merged_counts)
    ]


# From chapters/01-tokenizer.md, section "The tokenizer: special tokens, encoding, decoding, saving".
# Where encode_iterable may cut a stream without changing any pre-token: (1)
# after a lone whitespace character other than a space, between two
# non-space characters; (2) inside a run of whitespace, before its last
# character, when a non-space character that cannot start a special token
# ({starts}) follows.
_SAFE_CUT = r"(?<=\S[^\S ])(?=\S)|(?<=\s)(?=\s[^\s{starts}])"
# Special tokens: distinct non-empty str that UTF-8 can encode (their bytes
# are tokens).
_SPECIALS = dict(nonempty=True, distinct=True, utf8=True)


# From chapters/01-tokenizer.md, section "The tokenizer: special tokens, encoding, decoding, saving".
def _check_from_merges(merges, special_tokens) -> tuple:
    """The checked special tokens (a list) and merges (tuples, in order)."""
    specials = check.strings("special_tokens", special_tokens, **_SPECIALS)
    next_id = 256 + len(specials)
    special_ids = range(256, next_id)
    checked: dict[tuple[int, int], int] = {}  # pair -> rank
    for rank, pair in enumerate(merges):
        # a list or tuple of two ints (bools and floats refused)
        is_pair = isinstance(pair, (tuple, list)) and len(pair) == 2
        if not is_pair or not all(type(i) is int for i in pair):
            raise ValueError(f"merge {rank} must be a pair of int ids, got {pair!r}")
        (left, right), merge = pair, f"merge {rank} {tuple(pair)}"
        if not (0 <= left < next_id and 0 <= right < next_id):
            raise ValueError(
                f"{merge} uses an id that does not exist yet (ids "
                f"before this merge are 0..{next_id - 1})"
            )
        if left in special_ids or right in special_ids:
            raise ValueError(f"{merge} uses a special token's id")
        # A repeated pair: its second id could never be produced by encode.
        if (left, right) in checked:
            first = checked[left, right]
            raise ValueError(f"{merge} repeats merge {first}; a pair is merged once")
        checked[left, right] = rank
        next_id += 1
    return specials, list(checked)


def _check_train(text, vocab_size, special_tokens) -> tuple[int, list[str]]:
    """The checked ``vocab_size`` and special tokens of ``train``."""
    owner = "BPETokenizer.train()"
    check.string("text", text, utf8=True, owner=owner)
    vocab_size = check.integer("vocab_size", vocab_size, owner=owner)
    specials = check.strings("special_tokens", special_tokens, **_SPECIALS)
    if vocab_size < (base := 256 + len(specials)):
        raise ValueError(
            f"vocab_size={vocab_size} is smaller than the byte "
            f"alphabet plus the special tokens (256 + {len(specials)} "
            f"= {base})"
        )
    return vocab_size, specials


def _check_encode(tokenizer, text) -> None:
    check.string("text", text, owner="BPETokenizer.encode()")


def _check_stream(tokenizer, lines) -> Iterator[str]:
    """The lines, each checked as it is read; no special token with
    whitespace (a stream is cut at whitespace)."""
    owner, hint = "BPETokenizer.encode_iterable()", "encode() takes one str"
    lines = check.text_lines("lines", lines, owner=owner, hint=hint)
    spaced = [token for token in tokenizer.special_tokens if regex.search(r"\s", token)]
    if spaced:
        bad = spaced[0]
        token = f"the special token {bad!r}, which contains whitespace"
        cut = "cuts the text at whitespace, so it cannot stream with"
        raise ValueError(f"{owner} {cut} {token}; use encode()")
    return lines


# From chapters/01-tokenizer.md, section "The tokenizer: special tokens, encoding, decoding, saving".
class BPETokenizer:
    """Byte-level BPE with GPT-2's pre-tokenization, trained from scratch.

    Ids ``0..255`` are the bytes, then come the special tokens
    (``256, 257, ...`` in the order given), then one id per merge. An
    untrained tokenizer encodes text as its UTF-8 bytes.

    >>> tok = BPETokenizer().train("low lower lowest", 260, ["<eos>"])
    >>> tok.decode(tok.encode("lowest<eos>"))
    'lowest<eos>'
    """

    _FORMAT = "lib.tokenizer.BPETokenizer"
    _VERSION = 1
    # cached word encodings; the cache is cleared when it fills up
    _CACHE_LIMIT = 200_000

    def __init__(self) -> None:
        self.merges: list[tuple[int, int]] = []
        self.special_tokens: dict[str, int] = {}
        self._rebuild()

    # -- state -------------------------------------------------------------
    def _rebuild(self) -> None:
        """Derive vocabulary, merge ranks, special-token regex, cache."""
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
        # Where encode_iterable may cut a stream (see _SAFE_CUT): inside a
        # run of whitespace, never just before a character that may start a
        # special token.
        first_chars = {regex.escape(t[0], special_only=True) for t in longest_first}
        starts = "".join(sorted(first_chars))
        self._safe_cut = regex.compile(_SAFE_CUT.format(starts=starts))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @classmethod
    def from_merges(
        cls, merges: Iterable[tuple[int, int]], special_tokens: Iterable[str] = ()
    ) -> BPETokenizer:
        """A tokenizer from its merges (pairs of ids, in order) and special
        tokens."""
        specials, pairs = _check_from_merges(merges, special_tokens)
        tokenizer = cls()
        tokenizer.special_tokens = {token: 256 + i for i, token in enumerate(specials)}
        tokenizer.merges = pairs
        tokenizer._rebuild()
        return tokenizer

    # -- training ----------------------------------------------------------
    def train(
        self, text: str, vocab_size: int, special_tokens: Iterable[str] = ()
    ) -> BPETokenizer:
        """Learn ``vocab_size - 256 - len(special_tokens)`` merges; return
        self.

        Ties between equally frequent pairs go to the smallest pair of ids.
        If the text runs out of pairs first, the vocabulary is smaller than
        ``vocab_size``.
        """
        checked = _check_train(text, vocab_size, special_tokens)
        vocab_size, specials = checked
        base = 256 + len(specials)
        chunks = [text]
        # special tokens are cut out: no merge may involve them
        if specials:
            longest_first = sorted(specials, key=len, reverse=True)
            splitter = regex.compile("|".join(regex.escape(t) for t in longest_first))
            chunks = splitter.split(text)
        counts: Counter[str] = Counter()
        for chunk in chunks:
            counts.update(_GPT2_SPLIT.findall(chunk))
        word_counts = {tuple(w.encode("utf-8")): count for w, count in counts.items()}
        merges = train_bpe_merges(word_counts, vocab_size - base, first_id=base)
        self.special_tokens = {token: 256 + i for i, token in enumerate(specials)}
        self.merges = [pair for pair, _ in merges]
        self._rebuild()
        return self

    # -- encoding and decoding ---------------------------------------------
    def _encode_word(self, word: str) -> list[int]:
        ids = list(word.encode("utf-8"))
        merge_ids = self._merge_ids
        while len(ids) > 1:
            # the pair whose merge was learned first (smallest new id), if
            # any
            ranked = ((merge_ids.get(pair, 1 << 62), pair) for pair in pairwise(ids))
            best_id, best_pair = min(ranked)
            if best_id == 1 << 62:
                break
            ids = merge_adjacent_pair(ids, best_pair, best_id)
        return ids

    @check.front_door(_check_encode)
    def encode(self, text: str) -> list[int]:
        """The ids of ``text``: special tokens first, then each pre-token's
        merges."""
        chunks = self._special_split.split(text) if self._special_split else [text]
        cache = self._cache
        ids: list[int] = []
        try:
            for position, chunk in enumerate(chunks):
                # odd chunks are the splitter's captured group: specials
                if position % 2:
                    ids.append(self.special_tokens[chunk])
                    continue
                for word in _GPT2_SPLIT.findall(chunk):
                    word_ids = cache.get(word)
                    if word_ids is None:
                        if len(cache) >= self._CACHE_LIMIT:
                            cache.clear()
                        word_ids = cache[word] = self._encode_word(word)
                    ids.extend(word_ids)
        except UnicodeEncodeError:  # a lone surrogate: say where it is
            check.string("text", text, utf8=True)
            raise
        return ids

    def encode_iterable(self, lines: Iterable[str]) -> Iterator[int]:
        """The ids of ``"".join(lines)``, equal to ``encode`` of it,
        produced lazily.

        ``lines`` is any iterable of str, such as a file opened in text
        mode. Text is held only back to the last place where cutting it
        cannot change the ids (see :data:`_SAFE_CUT`): in ordinary text, the
        last line or two.
        """
        lines = _check_stream(self, lines)
        return self._encode_stream(lines)

    def _encode_stream(self, lines: Iterator[str]) -> Iterator[int]:
        # text not yet encoded, from position `start` to `end`
        pending: list[str] = []
        start = end = 0
        # the last three characters seen, for the lookbehind of a cut
        tail = ""
        for line in lines:
            window, window_start = tail + line, end - len(tail)
            pending.append(line)
            end += len(line)
            tail = window[-3:]
            # New cut positions begin one character before the line (a cut
            # needs the character after it); keep the last one.
            cut, search_from = None, max(len(window) - len(line) - 1, 0)
            for match in self._safe_cut.finditer(window, search_from):
                cut = window_start + match.start()
            if cut is not None and cut > start:
                text = "".join(pending)
                yield from self.encode(text[: cut - start])
                pending, start = [text[cut - start :]], cut
        if end > start:
            yield from self.encode("".join(pending))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (a list, array or tensor of shape
        ``(seq,)``).

        The tokens' bytes are joined, then decoded once; bytes that are not
        valid UTF-8 (a character cut between tokens, say) become U+FFFD.
        """
        owner = "BPETokenizer.decode()"
        ids = check.token_ids("ids", ids, self.vocab_size, owner=owner)
        vocab = self.vocab
        joined = b"".join([vocab[i] for i in ids])
        return joined.decode("utf-8", errors="replace")

    # -- saving and loading ------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """What :meth:`save` writes: pattern, special tokens and merges
        (JSON-ready)."""
        return {
            "format": self._FORMAT,
            "version": self._VERSION,
            "pattern": GPT2_SPLIT_PATTERN,
            "special_tokens": list(self.special_tokens),
            "merges": [list(pair) for pair in self.merges],
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the tokenizer as JSON (UTF-8)."""
        Path(path).write_text(
            json.dumps(self.to_dict(), ensure_ascii=False), encoding="utf-8"
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> BPETokenizer:
        """Read a tokenizer written by :meth:`save` (a clear error if it is
        not one)."""
        raw = Path(path).read_text(encoding="utf-8")
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path} is not a tokenizer file: invalid JSON ({err})"
            ) from None
        data = data if isinstance(data, dict) else {}
        # each field the file must hold: what it must be, and what it says
        # if it is not
        version = data.get("version")
        fields = {
            "format": (
                cls._FORMAT,
                f"is not a {cls._FORMAT} file (no matching 'format')",
            ),
            "version": (
                cls._VERSION,
                f"has version {version!r}; expected {cls._VERSION}",
            ),
            "pattern": (
                GPT2_SPLIT_PATTERN,
                "uses a different pre-tokenization pattern",
            ),
        }
        for key, (expected, problem) in fields.items():
            if data.get(key) != expected:
                raise ValueError(f"{path} {problem}")
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
            f"BPETokenizer(vocab_size={self.vocab_size}, "
            f"merges={len(self.merges)}, "
            f"special_tokens={list(self.special_tokens)})"
        )


# From chapters/01-tokenizer.md, section "The tokenizer: special tokens, encoding, decoding, saving".
def _check_chars_per_token(text, ids) -> None:
    check.string("text", text, owner="chars_per_token()")
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
        got = type(ids).__name__
        raise TypeError(f"chars_per_token() takes ids as a sequence, got {got}")
    if len(ids) == 0:
        raise ValueError("chars_per_token() needs at least one token")


# From chapters/01-tokenizer.md, section "The tokenizer: special tokens, encoding, decoding, saving".
@check.front_door(_check_chars_per_token)
def chars_per_token(text: str, ids: Sequence[int]) -> float:
    """Compression: ``len(text) / len(ids)``, characters (not bytes) per
    token."""
    return len(text) / len(ids)
