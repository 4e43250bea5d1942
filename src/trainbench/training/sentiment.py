"""Sentiment classification data: IMDB reviews when they are on disk, else a learnable synthetic set.

The synthetic set stands in for IMDB's shape (binary labels, long sequences) and has something to
learn: each review is random filler with words from a positive or a negative lexicon sprinkled in,
mostly from its own label's lexicon and a few from the other, so accuracy measures learning (chance
is 50%) without any download.

Real IMDB: `dataset_path` pointing at the aclImdb folder (`train|test/pos|neg/*.txt`), tokenised with
the tokenizer of `pretrained_path` when given, else by hashing words into the model's vocabulary
(fine for a randomly initialised model, which has no vocabulary of its own to honour).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from trainbench.study.params import CellParams

CLS, PAD = 101, 0
LEXICON_SIZE = 20
FIRST_FILLER = 1000  # ids below this are reserved for specials and the two lexicons
SENTIMENT_SHARE = 0.15  # share of positions carrying a sentiment word
NOISE_SHARE = 0.03  # share carrying a word of the other sentiment


@dataclass
class Split:
    tokens: torch.Tensor  # (n, seq_len) int64
    mask: torch.Tensor  # (n, seq_len) int64, 1 where a token is real
    labels: torch.Tensor  # (n,) int64
    source: str


def synthetic(n: int, seq_len: int, vocab_size: int, seed: int, source: str = "synthetic sentiment") -> Split:
    if vocab_size < FIRST_FILLER + 100:
        raise ValueError(f"the synthetic sentiment set needs a vocabulary of at least {FIRST_FILLER + 100}")
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(2, (n,), generator=g)
    tokens = torch.randint(FIRST_FILLER, vocab_size, (n, seq_len), generator=g)
    positive = torch.arange(200, 200 + LEXICON_SIZE)
    negative = torch.arange(300, 300 + LEXICON_SIZE)
    draw = torch.rand(n, seq_len, generator=g)
    words = torch.randint(LEXICON_SIZE, (n, seq_len), generator=g)
    own = torch.where(labels[:, None] == 1, positive[words], negative[words])
    other = torch.where(labels[:, None] == 1, negative[words], positive[words])
    tokens = torch.where(draw < SENTIMENT_SHARE, own, tokens)
    tokens = torch.where((draw >= SENTIMENT_SHARE) & (draw < SENTIMENT_SHARE + NOISE_SHARE), other, tokens)
    tokens[:, 0] = CLS
    return Split(tokens, torch.ones_like(tokens), labels, source)


def hash_tokenize(text: str, seq_len: int, vocab_size: int) -> list[int]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    ids = [FIRST_FILLER + zlib.crc32(w.encode()) % (vocab_size - FIRST_FILLER) for w in words]
    return [CLS] + ids[: seq_len - 1]


def imdb(path: Path, split: str, n: int | None, seq_len: int, vocab_size: int, seed: int,
         tokenizer_path: str | None = None) -> Split:
    """Up to n reviews of aclImdb's split, shuffled with the seed, padded to seq_len."""
    files = [(f, 1) for f in sorted((path / split / "pos").glob("*.txt"))]
    files += [(f, 0) for f in sorted((path / split / "neg").glob("*.txt"))]
    if not files:
        raise FileNotFoundError(f"no reviews under {path / split}/{{pos,neg}}/*.txt "
                                "(expected aclImdb's layout)")
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed)).tolist()
    chosen = [files[i] for i in order[: n or len(files)]]
    texts = [f.read_text(errors="replace") for f, _ in chosen]
    if tokenizer_path:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        encoded = tokenizer(texts, truncation=True, max_length=seq_len, padding="max_length",
                            return_tensors="pt")
        tokens, mask = encoded["input_ids"], encoded["attention_mask"]
    else:
        tokens = torch.full((len(texts), seq_len), PAD, dtype=torch.long)
        for row, text in enumerate(texts):
            ids = hash_tokenize(text, seq_len, vocab_size)
            tokens[row, : len(ids)] = torch.tensor(ids)
        mask = (tokens != PAD).long()
    labels = torch.tensor([label for _, label in chosen])
    return Split(tokens, mask, labels, f"IMDB {split} from {path}")


def load(params: CellParams, spec, n_train: int, n_test: int) -> tuple[Split, Split]:
    """Train and test splits for a cell: IMDB if `dataset_path` is set, else synthetic."""
    seq_len, vocab, seed = params.seq_len, spec.vocab_size, params.seed
    if params.dataset_path:
        path = Path(params.dataset_path)
        return (imdb(path, "train", n_train, seq_len, vocab, seed, params.pretrained_path),
                imdb(path, "test", n_test, seq_len, vocab, seed + 1, params.pretrained_path))
    return synthetic(n_train, seq_len, vocab, seed), synthetic(n_test, seq_len, vocab, seed + 1)
