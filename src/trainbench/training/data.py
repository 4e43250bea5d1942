"""Synthetic batches of the study's shape, made once on the device so data costs no step time.

A small pool of batches is cycled: the model can memorise it, so a falling loss shows that the
optimizer really updates the weights under every strategy, at no cost to throughput measurement.
"""

from __future__ import annotations

import torch

POOL_SIZE = 4


class SyntheticBatches:
    def __init__(self, *, vocab_size: int, seq_len: int, micro_batch: int, head: str, num_classes: int,
                 seed: int, rank: int, device: torch.device):
        generator = torch.Generator().manual_seed(seed * 7919 + rank)  # each rank its own shard
        self.batches = []
        for _ in range(POOL_SIZE):
            tokens = torch.randint(vocab_size, (micro_batch, seq_len + 1), generator=generator)
            if head == "classifier":
                targets = torch.randint(num_classes, (micro_batch,), generator=generator)
                inputs = tokens[:, :seq_len]
            else:
                inputs, targets = tokens[:, :seq_len], tokens[:, 1:]
            self.batches.append((inputs.contiguous().to(device), targets.contiguous().to(device)))
        self.position = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.batches[self.position % POOL_SIZE]
        self.position += 1
        return batch
