"""Write a token file trainbench trains on (`tokens:` in a study): a flat binary of uint16 ids, as
nanoGPT's prepare scripts write train.bin. Here a text with structure a model learns quickly: words of a
small vocabulary in repeating phrases, each character a token (its byte value).

    python examples/your_model/make_tokens.py examples/your_model/tokens.bin [--tokens 200000]
"""

from __future__ import annotations

import argparse
import random

import numpy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    words = ["the", "model", "trains", "on", "tokens", "of", "its", "own", "and", "loss", "falls", "fast"]
    phrases = [" ".join(rng.choice(words) for _ in range(6)) + ". " for _ in range(40)]
    text = []
    while sum(map(len, text)) < args.tokens:
        text.append(rng.choice(phrases))
    data = "".join(text)[: args.tokens].encode("ascii")
    ids = numpy.frombuffer(data, dtype=numpy.uint8).astype(numpy.uint16)
    ids.tofile(args.out)
    print(f"wrote {len(ids)} tokens (ids < 128) to {args.out}")


if __name__ == "__main__":
    main()
