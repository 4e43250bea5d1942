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


class TokenWindows:
    """Your tokens: windows of seq_len + 1 ids from a flat binary file (nanoGPT's train.bin layout), the
    first seq_len the inputs and the last seq_len their next tokens. The windows tile the file (window i
    starts at token i x seq_len); every rank shuffles them alike, by the seed and the epoch, and data-
    parallel rank r of R takes every R-th, so that the ranks read disjoint windows. The file is mapped,
    not read: each micro batch reads its windows when asked."""

    def __init__(self, *, path: str, dtype: str, seq_len: int, micro_batch: int, seed: int, rank: int,
                 ranks: int, device: torch.device):
        import numpy

        self.tokens = numpy.memmap(path, dtype=numpy.dtype(dtype), mode="r")
        self.windows = (len(self.tokens) - 1) // seq_len
        if self.windows < 1:
            raise ValueError(f"{path}: {len(self.tokens)} tokens hold no window of {seq_len + 1}")
        self.seq_len, self.micro_batch, self.seed = seq_len, micro_batch, seed
        self.rank, self.ranks, self.device = rank, ranks, device
        self.position = 0  # this rank's next window, counted in its own windows
        self.pinned = device.type == "cuda"
        self.epoch, self.order = -1, None

    def _order(self, epoch: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 7919 + epoch)
        return torch.randperm(self.windows, generator=generator)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        import numpy

        rows = []
        for _ in range(self.micro_batch):
            overall = self.position * self.ranks + self.rank  # the window's place in the shuffled epochs
            epoch, place = divmod(overall, self.windows)
            if epoch != self.epoch:
                self.order, self.epoch = self._order(epoch), epoch
            start = int(self.order[place]) * self.seq_len
            rows.append(numpy.asarray(self.tokens[start:start + self.seq_len + 1], dtype=numpy.int64))
            self.position += 1
        batch = torch.from_numpy(numpy.stack(rows))
        if self.pinned:
            batch = batch.pin_memory()
        batch = batch.to(self.device, non_blocking=True)
        return batch[:, :-1], batch[:, 1:]
