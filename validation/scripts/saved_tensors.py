"""What a compiled GPT saves for backward, by dtype: bf16 against float8, on CPU, no GPU needed.

    python bench/saved_tensors.py [--d-model 256] [--layers 2] [--recipes bf16 tensorwise rowwise]

trainbench's GPT (gpt2-tiny's layout at the width given) under bf16 autocast, compiled through
AOTAutograd with inductor's decompositions and its min-cut partitioner, the partitioner that decides
what a compiled graph keeps for backward and what it recomputes there. The tensors the forward graph
hands to the backward are read off the partitioned graph: each one's dtype and shape, in bytes per
token, per layer and per hidden unit (the unit of the memory model's block activations,
predict/memory_model.py), split into activations (a token dimension) and weights (the bf16 copies
autocast makes, or float8's fp32 masters). A float8 cell's blocks go through torchao's float8
training as its runner converts them (training/runners/torch_native.to_float8).

What it shows is the partition inductor makes on CPU; a GPU's may differ where the partitioner
weighs recomputation by the device's costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings

import torch


def saved_for_backward(recipe: str, d_model: int, layers: int, tokens: int = 128, batch: int = 4) -> list:
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    from trainbench.registry.models import get_model
    from trainbench.training.gpt import GPT
    from trainbench.training.runners.torch_native import to_float8

    spec = dataclasses.replace(get_model("gpt2-tiny"), d_model=d_model, n_head=max(1, d_model // 64),
                               n_layer=layers, max_seq=tokens)
    torch.manual_seed(0)
    model = GPT(spec)
    model.init_weights(0)
    if recipe != "bf16":
        to_float8(model, recipe)
    saved: list[tuple[str, torch.dtype, tuple[int, ...], int]] = []

    def forward_compiler(graph, _inputs):
        output = next(node for node in graph.graph.nodes if node.op == "output")
        for node in output.args[0]:
            value = getattr(node, "meta", {}).get("val")
            if isinstance(value, torch.Tensor):
                size = value.numel() * value.element_size()
                saved.append((node.name, value.dtype, tuple(value.shape), size))
        return graph

    def backend(graph, inputs):
        return aot_module_simplified(graph, inputs, fw_compiler=forward_compiler, bw_compiler=lambda g, _: g,
                                     partition_fn=min_cut_rematerialization_partition,
                                     decompositions=select_decomp_table())

    data = torch.randint(spec.vocab_size, (batch, tokens + 1))
    inputs, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.compile(model, backend=backend)(inputs, targets)
    loss.backward()
    return saved


def split(saved: list, batch: int, tokens: int) -> tuple[list, list]:
    """(activations, weights): activations have a token dimension (batch x sequence first, or batch)."""
    activations = [s for s in saved if s[2] and s[2][0] in (batch, batch * tokens)]
    return activations, [s for s in saved if s not in activations]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--recipes", nargs="+", default=["bf16", "tensorwise", "rowwise"])
    args = parser.parse_args(argv)
    tokens, batch = 128, 4
    warnings.filterwarnings("ignore")
    print(f"torch {torch.__version__}, GPT of width {args.d_model}, {args.layers} layers, {batch} x {tokens} "
          "tokens, bf16 autocast, compiled (AOTAutograd, inductor's decompositions, min-cut partitioner)")
    print("bytes saved for backward per token, per layer and per hidden unit:")
    for recipe in args.recipes:
        saved = saved_for_backward(recipe, args.d_model, args.layers, tokens, batch)
        unit = batch * tokens * args.layers * args.d_model
        activations, weights = split(saved, batch, tokens)
        by_dtype: dict[str, float] = {}
        for _name, dtype, _shape, size in activations:
            key = str(dtype).removeprefix("torch.")
            by_dtype[key] = by_dtype.get(key, 0.0) + size / unit
        print(f"  {recipe:<11} activations {sum(s[3] for s in activations) / unit:5.1f} "
              f"({', '.join(f'{k} {v:.1f}' for k, v in sorted(by_dtype.items()))}); "
              f"weights kept: {', '.join(sorted({str(s[1]).removeprefix('torch.') for s in weights}))}, "
              f"{sum(s[3] for s in weights) / unit:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
