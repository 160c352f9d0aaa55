"""CIDEr-D reward: vectorised, and equal to pycocoevalcap's ``Cider`` on the same input.

Training scores every anchor and counterfactual caption against its clip's references, thousands
of times per epoch; pycocoevalcap's scorer is pure Python and rebuilds every reference vector per
candidate. :class:`CiderD` computes the same numbers (to ~1e-15) from integer n-gram ids with
numpy, and can fix the document frequencies from a training corpus, as self-critical training does.

What "the same numbers" means, as pycocoevalcap's ``CiderScorer`` computes them:

* a caption is ``str.split()`` into words (tokenise first: :mod:`avex.ptb_tokenizer`);
* n-grams of order 1..n (n=4), term frequency = raw count in the caption;
* a "document" is one reference list; with D documents,
  ``idf(g) = log(D) - log(max(1, df(g)))`` (an n-gram no document has weighs ``log(D)``);
* per order, with ``c_g = tf * idf`` for the candidate and ``r_g`` for a reference,
  ``sum_g min(c_g, r_g) * r_g / (|c| |r|)`` (0 where a norm is 0), times
  ``exp(-delta**2 / (2 sigma**2))`` with ``delta`` the difference in *bigram* counts
  (pycocoevalcap counts a caption's length that way), summed over the references;
* mean over the orders, divided by the number of references, times 10.

(The paper, Vedantam et al. 2015, writes TF normalised by the caption's n-gram count and the
length as a word count; the reference code, and so every reported number, does as above.)

With one document (D=1) every weight is 0 and so is every score: that is pycocoevalcap's
behaviour too.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from avex import _checks, ptb_tokenizer

__all__ = ["CiderD"]


# --------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------

def _check_reference_lists(name: str, value) -> list[tuple[str, ...]]:
    """A list of non-empty lists of str, each returned as a tuple (hashable, for sharing)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list of lists of str, got {type(value).__name__}")
    out = []
    checked: dict[int, tuple[str, ...]] = {}   # one list object shared by many entries: check once
    for i, refs in enumerate(value):
        done = checked.get(id(refs))
        if done is None:
            done = tuple(_checks.str_list(f"{name}[{i}]", refs))
            if not done:
                raise ValueError(f"{name}[{i}] is an empty list; every entry needs at least one "
                                 "reference caption")
            checked[id(refs)] = done
        out.append(done)
    return out


# --------------------------------------------------------------------------------------------
# n-gram ids
# --------------------------------------------------------------------------------------------

class _WordIds(dict):
    """str -> int, giving each unseen word the next id."""

    def __missing__(self, word):
        new_id = self[word] = len(self)
        return new_id


class _NGrams:
    """The n-grams of a batch of sentences as integer ids, with their counts per sentence.

    Ids are local to the batch and dense per order. An order-(k+1) n-gram is identified by
    (id of its order-k prefix, id of its last word), packed into one int64 as
    ``prefix_id * vocab + word``; both factors stay below 2**31, so the packing is exact for
    any vocabulary.

    Attributes:
        sent, gid, tf: one entry per distinct (sentence, n-gram): the sentence index, the n-gram
            id (all orders in one id space; order k's ids start at ``offsets[k-1]``) and its
            count in the sentence.
        keys: per order, the packed key of each local id (sorted), to look n-grams up.
        bigrams: per sentence, its number of bigrams (pycocoevalcap's "length").
    """

    def __init__(self, sentences: list[str], words: _WordIds, n: int):
        flat, lengths = _word_ids(sentences, words)
        total = len(flat)
        sent_of_token = np.repeat(np.arange(len(sentences), dtype=np.int64), lengths)
        # tokens left to the end of each token's sentence, itself included
        ends = np.cumsum(lengths)
        left = ends[sent_of_token] - np.arange(total)
        vocab = max(len(words), 1)
        num_sentences = len(sentences)

        self.vocab = vocab
        self.num_sentences = num_sentences
        self.bigrams = np.maximum(lengths - 1, 0)
        self.keys: list[np.ndarray] = []
        self.offsets = [0]
        sent_parts, gid_parts, tf_parts = [], [], []
        prefix_ids = np.zeros(total, dtype=np.int64)
        for k in range(1, n + 1):
            at = np.flatnonzero(left >= k)          # n-grams of order k start here
            key = flat[at] if k == 1 else prefix_ids[at] * vocab + flat[at + k - 1]
            sent = sent_of_token[at]
            # one sort by (n-gram, sentence) gives the ids and the per-sentence counts;
            # ``at`` ascends, so ``sent`` does too and a stable sort keeps it ascending
            perm = np.argsort(key, kind="stable")
            key, sent = key[perm], sent[perm]
            new_gram = np.empty(len(key), dtype=bool)
            new_gram[:1] = True
            np.not_equal(key[1:], key[:-1], out=new_gram[1:])
            local = np.cumsum(new_gram) - 1
            new_pair = new_gram.copy()
            new_pair[1:] |= sent[1:] != sent[:-1]
            first = np.flatnonzero(new_pair)
            sent_parts.append(sent[first])
            gid_parts.append(local[first] + self.offsets[-1])
            tf_parts.append(np.diff(np.append(first, len(key))))
            self.keys.append(key[new_gram])
            self.offsets.append(self.offsets[-1] + len(self.keys[-1]))
            prefix_ids[at[perm]] = local
        self.num_ngrams = self.offsets[-1]
        self.sent = np.concatenate(sent_parts)
        self.gid = np.concatenate(gid_parts)
        self.tf = np.concatenate(tf_parts).astype(np.float64)
        self.order = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.offsets))


def _word_ids(sentences: list[str], words: _WordIds) -> tuple[np.ndarray, np.ndarray]:
    """Word ids of all sentences, concatenated, and each sentence's length in words."""
    # one split of all sentences, joined by a marker word, beats one split per sentence; a
    # sentence that contains the marker itself would miscount, so then split one by one
    joined = f" {_MARKER} ".join(sentences).split()
    ids = np.fromiter(map(words.__getitem__, joined), dtype=np.int64, count=len(joined))
    is_marker = ids == words[_MARKER]
    bounds = np.flatnonzero(is_marker)
    if len(bounds) == len(sentences) - 1:
        lengths = np.diff(np.concatenate(([-1], bounds, [len(ids)]))) - 1
        return ids[~is_marker], lengths
    split = [s.split() for s in sentences]
    ids = np.fromiter(map(words.__getitem__, itertools.chain.from_iterable(split)),
                      dtype=np.int64)
    return ids, np.fromiter(map(len, split), dtype=np.int64, count=len(split))


_MARKER = "\x00<sentence-break>\x00"


def _sorted(keys: np.ndarray) -> np.ndarray:
    """``keys`` sorted; free when they already are, as the n-gram tables build them."""
    if len(keys) and (keys[1:] < keys[:-1]).any():
        return np.sort(keys)
    return keys


class _CorpusTable:
    """Document frequencies of a fixed corpus, keyed so that a batch can look its n-grams up.

    An order-1 key is the word id; an order-(k+1) key is ``rank_k(prefix) * vocab + word`` where
    ``rank_k`` is the prefix's index in the sorted order-k keys and ``vocab`` is the vocabulary
    size once the corpus is read. ``_NGrams`` over the corpus builds exactly these keys.
    """

    def __init__(self, corpus: list[tuple[str, ...]], words: _WordIds, n: int):
        sentences = [s for refs in corpus for s in refs]
        doc_of_sentence = np.repeat(np.arange(len(corpus), dtype=np.int64),
                                    [len(refs) for refs in corpus])
        grams = _NGrams(sentences, words, n)
        self.num_documents = len(corpus)
        self.vocab = grams.vocab
        self.keys = grams.keys
        # a document counts an n-gram once, however many of its references contain it
        doc_gram = np.unique(doc_of_sentence[grams.sent] * grams.num_ngrams + grams.gid)
        df = np.bincount(doc_gram % grams.num_ngrams, minlength=grams.num_ngrams)
        self.df = [df[grams.offsets[k]:grams.offsets[k + 1]].astype(np.float64)
                   for k in range(n)]

    def lookup(self, grams: _NGrams) -> np.ndarray:
        """Corpus document frequency of each n-gram id of ``grams`` (0 where absent)."""
        out = np.zeros(grams.num_ngrams, dtype=np.float64)
        rank = None                   # per local id of the previous order: corpus rank or -1
        for k, local_keys in enumerate(grams.keys):
            if k == 0:
                word, prefix_rank = local_keys, np.zeros_like(local_keys)
            else:
                word = local_keys % grams.vocab
                prefix_rank = rank[local_keys // grams.vocab]
            # a word first seen after the corpus was read, or a prefix the corpus lacks
            known = (word < self.vocab) & (prefix_rank >= 0)
            key = prefix_rank * self.vocab + word if k else word
            table = self.keys[k]
            if len(table) == 0:
                rank = np.full(len(local_keys), -1, dtype=np.int64)
                continue
            pos = np.minimum(np.searchsorted(table, key), len(table) - 1)
            found = known & (table[pos] == key)
            rank = np.where(found, pos, -1)
            start = grams.offsets[k]
            out[start:start + len(local_keys)] = np.where(found, self.df[k][pos], 0.0)
        return out


# --------------------------------------------------------------------------------------------
# CIDEr-D
# --------------------------------------------------------------------------------------------

class CiderD:
    """CIDEr-D of candidate captions against their references, one score per candidate.

    Args:
        corpus_references: ``None``: the document frequencies come from the ``references`` of
            each :meth:`score` call, one document per entry (so a reference list shared by five
            candidates counts five times), as pycocoevalcap's ``Cider`` does. Otherwise a list
            of reference lists (one per clip of a training corpus) that fixes the document
            frequencies; the document count is ``len(corpus_references)``.
        n: largest n-gram order (pycocoevalcap: 4).
        sigma: width of the Gaussian length penalty (pycocoevalcap: 6).
        tokenize: apply :func:`avex.ptb_tokenizer.tokenize` to every caption (candidates,
            references, corpus) first. With ``False`` (the default) captions are split on
            whitespace as given, which is what pycocoevalcap's ``Cider`` does with its (already
            tokenised) input.
    """

    def __init__(self, corpus_references=None, *, n: int = 4, sigma: float = 6.0,
                 tokenize: bool = False):
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"n must be an int, got {type(n).__name__}")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if isinstance(sigma, bool) or not isinstance(sigma, (int, float)):
            raise TypeError(f"sigma must be a number, got {type(sigma).__name__}")
        if not (sigma > 0 and math.isfinite(sigma)):
            raise ValueError(f"sigma must be a finite number > 0, got {sigma}")
        if not isinstance(tokenize, bool):
            raise TypeError(f"tokenize must be a bool, got {type(tokenize).__name__}")
        self.n = n
        self.sigma = float(sigma)
        self.tokenize = tokenize
        self._words = _WordIds()
        self._corpus = None
        if corpus_references is not None:
            corpus = _check_reference_lists("corpus_references", corpus_references)
            if not corpus:
                raise ValueError("corpus_references is an empty list; pass None to take the "
                                 "document frequencies from each call's references")
            if tokenize:
                corpus = [tuple(map(ptb_tokenizer.tokenize, refs)) for refs in corpus]
            self._corpus = _CorpusTable(corpus, self._words, n)

    @property
    def document_count(self) -> int | None:
        """Documents behind the fixed frequencies; ``None`` when each call brings its own."""
        return None if self._corpus is None else self._corpus.num_documents

    def __call__(self, candidates, references) -> np.ndarray:
        return self.score(candidates, references)

    def score(self, candidates, references) -> np.ndarray:
        """CIDEr-D of ``candidates[i]`` against ``references[i]``, as a float64 array.

        Candidates that share one reference list (same strings, same order) share its
        vectors: each distinct list is processed once.
        """
        candidates = _checks.str_list("candidates", candidates)
        ref_lists = _check_reference_lists("references", references)
        if len(ref_lists) != len(candidates):
            raise ValueError(f"references has {len(ref_lists)} entries but candidates has "
                             f"{len(candidates)}; pass one reference list per candidate")
        if not candidates:
            return np.zeros(0, dtype=np.float64)

        # distinct reference lists: group[c] is the list candidate c is scored against
        index_of: dict[tuple[str, ...], int] = {}
        group = np.fromiter((index_of.setdefault(refs, len(index_of)) for refs in ref_lists),
                            dtype=np.int64, count=len(ref_lists))
        distinct = list(index_of)
        if self.tokenize:
            candidates = [ptb_tokenizer.tokenize(c) for c in candidates]
            distinct = [tuple(map(ptb_tokenizer.tokenize, refs)) for refs in distinct]
        return self._score_grouped(candidates, group, distinct)

    # ---- internals -------------------------------------------------------------------------

    def _score_grouped(self, candidates, group, distinct) -> np.ndarray:
        n, num_cand = self.n, len(candidates)
        list_sizes = np.array([len(refs) for refs in distinct], dtype=np.int64)
        ref_sentences = [s for refs in distinct for s in refs]
        grams = _NGrams(candidates + ref_sentences, self._words, n)
        # reference sentence r (numbered after the candidates): its list and place in the list
        ref_list = np.repeat(np.arange(len(distinct), dtype=np.int64), list_sizes)
        ref_place = np.arange(len(ref_sentences)) - np.repeat(np.cumsum(list_sizes) - list_sizes,
                                                              list_sizes)

        idf = self._idf(grams, group, ref_list, num_cand, len(distinct))
        sent, gid, tf = grams.sent, grams.gid, grams.tf
        weight = tf * idf[gid]
        order = grams.order[gid]
        norms = np.sqrt(np.bincount(sent * n + order, weights=weight * weight,
                                    minlength=grams.num_sentences * n)).reshape(-1, n)

        # one "pair" per (candidate, reference of its list), candidate-major
        pairs_per_cand = list_sizes[group]
        pair_start = np.cumsum(pairs_per_cand) - pairs_per_cand
        num_pairs = int(pairs_per_cand.sum())
        dots = self._clipped_dots(sent, gid, weight, order, group, ref_list, ref_place,
                                  len(distinct), num_cand, pair_start, num_pairs)

        pair_cand = np.repeat(np.arange(num_cand), pairs_per_cand)
        list_start = num_cand + np.cumsum(list_sizes) - list_sizes   # first sentence of a list
        pair_ref = list_start[group[pair_cand]] + np.arange(num_pairs) - pair_start[pair_cand]
        denom = norms[pair_cand] * norms[pair_ref]
        cos = np.divide(dots, denom, out=np.zeros_like(dots), where=denom != 0)
        delta = (grams.bigrams[pair_cand] - grams.bigrams[pair_ref]).astype(np.float64)
        penalty = np.exp(-(delta ** 2) / (2 * self.sigma ** 2))
        per_pair = (cos * penalty[:, None]).sum(axis=1)
        total = np.bincount(pair_cand, weights=per_pair, minlength=num_cand)
        return total / n / pairs_per_cand * 10.0

    def _idf(self, grams, group, ref_list, num_cand, num_lists) -> np.ndarray:
        """log(D) - log(max(1, df)) for every n-gram id of the batch."""
        if self._corpus is not None:
            df = self._corpus.lookup(grams)
            documents = self._corpus.num_documents
        else:
            # each distinct list is one document per candidate that uses it
            uses = np.bincount(group, minlength=num_lists).astype(np.float64)
            is_ref = grams.sent >= num_cand
            gid = grams.gid[is_ref]
            list_of = ref_list[grams.sent[is_ref] - num_cand]
            # entries come sorted by (n-gram, list): count each pair once
            key = _sorted(gid * num_lists + list_of)
            once = np.ones(len(key), dtype=bool)
            np.not_equal(key[1:], key[:-1], out=once[1:])
            df = np.bincount(key[once] // num_lists, weights=uses[key[once] % num_lists],
                             minlength=grams.num_ngrams)
            documents = num_cand
        return np.log(float(documents)) - np.log(np.maximum(1.0, df))

    def _clipped_dots(self, sent, gid, weight, order, group, ref_list, ref_place, num_lists,
                      num_cand, pair_start, num_pairs) -> np.ndarray:
        """sum_g min(c_g, r_g) * r_g per (candidate, reference) pair and order."""
        n = self.n
        is_ref = sent >= num_cand
        # reference entries keyed by (n-gram, list); candidate entries look theirs up. Entries
        # come sorted by (n-gram, sentence), so the reference keys are sorted already, and the
        # candidate keys too when a clip's candidates sit together: binary search is then cheap
        r_idx = np.flatnonzero(is_ref)
        r_key = gid[r_idx] * num_lists + ref_list[sent[r_idx] - num_cand]
        if len(r_key) and (r_key[1:] < r_key[:-1]).any():
            by_key = np.argsort(r_key, kind="stable")
            r_idx, r_key = r_idx[by_key], r_key[by_key]
        c_idx = np.flatnonzero(~is_ref)
        c_key = gid[c_idx] * num_lists + group[sent[c_idx]]
        lo = np.searchsorted(r_key, c_key, side="left")
        hits = np.searchsorted(r_key, c_key, side="right") - lo
        # expand every (candidate entry, matching reference entry) pair
        c_rep = np.repeat(c_idx, hits)
        first = np.repeat(lo - (np.cumsum(hits) - hits), hits)
        r_rep = r_idx[first + np.arange(len(c_rep))]
        c_w, r_w = weight[c_rep], weight[r_rep]
        pair = pair_start[sent[c_rep]] + ref_place[sent[r_rep] - num_cand]
        dots = np.bincount(pair * n + order[c_rep], weights=np.minimum(c_w, r_w) * r_w,
                           minlength=num_pairs * n)
        # (bincount of nothing comes back as int64, whatever the weights)
        return dots.astype(np.float64, copy=False).reshape(num_pairs, n)
