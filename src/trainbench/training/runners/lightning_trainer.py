"""Lightning's Trainer with its own strategies (ddp, fsdp, deepspeed_stage_2[_offload], ...).

The model is a Hugging Face DistilBERT sequence classifier built from its config (random weights),
or loaded from `pretrained_path`. Lightning owns the training loop; a callback hands each batch to
the worker's StepRecorder, so steps are timed like every other runner's. After the last measured step
the model is evaluated on held-out data, inside `fit` through the training engine (a separate
`trainer.test()` builds a new DeepSpeed inference engine, which fails under ZeRO-3 with parameter
offload), and the accuracy reported.

The process group is already up (the worker made it, torchrun started the ranks): Lightning detects
torchrun's environment and uses it rather than launching processes of its own.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trainbench.study.params import CellParams
from trainbench.training import sentiment
from trainbench.study.cell_view import CellView, as_view
from trainbench.training.runners import LoopRunner, RunContext
from trainbench.training.runners.deepspeed_engine import load_ops

# a cell's settings, as the keyword each Lightning strategy takes them by: DDPStrategy passes its extra
# keywords to DistributedDataParallel; DeepSpeedStrategy takes ZeRO's own
DDP_OPTIONS = {"ddp_bucket_cap_mb": "bucket_cap_mb", "ddp_bucket_view": "gradient_as_bucket_view",
               "ddp_static_graph": "static_graph"}
ZERO_OPTIONS = {key: key for key in ("overlap_comm", "contiguous_gradients", "reduce_bucket_size",
                                     "allgather_bucket_size")}


def lightning_strategy(cell: CellParams | CellView):
    """The Trainer's strategy for a cell of several ranks: Lightning's registered name where the cell
    sets none of its settings (Lightning's defaults), else that strategy built with them."""
    from lightning.pytorch.strategies import StrategyRegistry

    cell = as_view(cell)
    params = cell.params
    entry = StrategyRegistry[params.strategy]
    options = {"replicated": DDP_OPTIONS, "zero": ZERO_OPTIONS}.get(cell.strategy.layout, {})
    # set: a value where unset is null (overlap_comm: false says something), a switch turned on
    chosen = {option: value for key, option in options.items()
              if (value := getattr(params, key)) is not None and (value is not False or key in ZERO_OPTIONS)}
    if not chosen:
        return params.strategy
    return entry["strategy"](**{**entry["init_params"], **chosen})

PRECISION = {"fp32": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed"}
TEST_SAMPLES = 2048  # synthetic; real IMDB tests on up to 10,000 reviews like the study's origin
IMDB_TEST_SAMPLES = 10_000


def build_classifier(spec, num_classes: int, pretrained_path: str | None, deterministic: bool,
                     attention: str = "sdpa"):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    # SDPA's fused attention kernels have no deterministic backward; eager attention does
    attention = "eager" if deterministic or attention == "eager" else "sdpa"
    if pretrained_path:
        return DistilBertForSequenceClassification.from_pretrained(pretrained_path, num_labels=num_classes,
                                                                   attn_implementation=attention)
    config = DistilBertConfig(vocab_size=spec.vocab_size, dim=spec.d_model, n_layers=spec.n_layer,
                              n_heads=spec.n_head, hidden_dim=spec.ffn, max_position_embeddings=spec.max_seq,
                              num_labels=num_classes, attn_implementation=attention)
    return DistilBertForSequenceClassification(config)


def _module_class():
    import lightning as L

    class SequenceClassifier(L.LightningModule):
        def __init__(self, model, view: CellView):
            super().__init__()
            self.model = model
            self.params = view.params
            self.offload_optimizer = view.offload_optimizer
            self.correct = torch.zeros(())
            self.seen = torch.zeros(())
            self.accuracy: float | None = None

        def training_step(self, batch, batch_idx):
            tokens, mask, labels = batch
            return self.model(input_ids=tokens, attention_mask=mask, labels=labels).loss

        def validation_step(self, batch, batch_idx):
            tokens, mask, labels = batch
            logits = self.model(input_ids=tokens, attention_mask=mask).logits
            self.correct = self.correct.to(labels.device) + (logits.argmax(-1) == labels).sum()
            self.seen = self.seen.to(labels.device) + labels.numel()

        def on_validation_epoch_end(self):
            correct = self.trainer.strategy.reduce(self.correct.float(), reduce_op="sum")
            seen = self.trainer.strategy.reduce(self.seen.float(), reduce_op="sum")
            self.accuracy = (correct / seen).item()

        def configure_optimizers(self):
            p = self.params
            if self.offload_optimizer and p.device == "cuda":
                # ZeRO-Offload refuses a client optimizer that is not DeepSpeed's CPU Adam
                from deepspeed.ops.adam import DeepSpeedCPUAdam

                return DeepSpeedCPUAdam(self.parameters(), lr=p.lr, weight_decay=p.weight_decay,
                                        adamw_mode=False)
            return torch.optim.Adam(self.parameters(), lr=p.lr, weight_decay=p.weight_decay)

    return SequenceClassifier


def _emulated_gpu():
    """Lightning's CUDA accelerator for an emulated rank: Lightning checks `devices` against the GPUs it
    can see, but an emulated rank stands for one of its node's ranks on the one GPU it has (a real
    rank's check, 2 GPUs asked where 1 is visible, would stop it at build). Its node's devices stay
    numbered 0 to n-1, as DeepSpeed's strategy asks; the rank's LOCAL_RANK, 0, picks the one it uses."""
    from lightning.pytorch.accelerators import CUDAAccelerator

    class OneGPUForTheNode(CUDAAccelerator):
        @staticmethod
        def parse_devices(devices) -> list[int]:
            return list(range(devices if isinstance(devices, int) else len(devices)))

    return OneGPUForTheNode()


def _step_callback(recorder, accumulation: int):
    import lightning as L

    class StepTiming(L.Callback):
        """One optimizer step = `accumulation` batches: begin at the first, end after the last."""

        def __init__(self):
            self.batches = 0
            self.loss_sum = None  # on the device: read by the recorder at the end of its window

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if self.batches % accumulation == 0:
                recorder.begin()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.batches += 1
            loss = outputs["loss"].detach()
            self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
            if self.batches % accumulation == 0:
                recorder.end(self.loss_sum / accumulation)
                self.loss_sum = None

    return StepTiming()


def _tensors_at_train_end(runner):
    import lightning as L

    class TensorsAtTrainEnd(L.Callback):
        """This rank's parameters, gradients and optimizer states as training ends: Lightning's teardown
        then moves the module to the CPU, before the end-of-run memory snapshot sorts the blocks live
        at the peak by the tensors they held (detached views keep those storages' addresses)."""

        def on_train_end(self, trainer, pl_module):
            runner.tensors_at_train_end = {category: [t.detach() for t in found]
                                           for category, found in LoopRunner.memory_tensors(runner).items()}

    return TensorsAtTrainEnd()


def _wrapping_recorder():
    import lightning as L

    class Wrapping(L.Callback):
        """How the strategy wrapped the model, read when training starts (Lightning unwraps it at the
        end): DistributedDataParallel's bucket size and modes."""

        def __init__(self):
            self.seen: dict = {}

        def on_train_start(self, trainer, pl_module):
            wrapped = trainer.strategy.model
            if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
                self.seen["DistributedDataParallel"] = {
                    "bucket_cap_mb": wrapped.bucket_bytes_cap / (1 << 20),
                    "gradient_as_bucket_view": wrapped.gradient_as_bucket_view,
                    "static_graph": wrapped.static_graph}

    return Wrapping()


class LightningRunner(LoopRunner):
    def __init__(self, context: RunContext):
        super().__init__(context)

    @classmethod
    def prepare_process(cls, params: CellParams) -> None:
        load_ops(params)  # its DeepSpeed strategies' ops

    def setup(self) -> None:
        p = self.p
        # exactly the samples the measured steps consume, spread over the ranks by Lightning's sampler
        n_train = self.ctx.fixed_steps * p.global_batch
        n_test = IMDB_TEST_SAMPLES if p.dataset_path else TEST_SAMPLES
        self.train_split, self.test_split = sentiment.load(p, self.ctx.spec, n_train, n_test)
        model = build_classifier(self.ctx.spec, p.num_classes, p.pretrained_path, p.deterministic,
                                 p.attention)
        self.module = _module_class()(model, self.view)

    def _loader(self, split: sentiment.Split, batch: int, shuffle: bool):
        dataset = torch.utils.data.TensorDataset(split.tokens, split.mask, split.labels)
        return torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=shuffle, drop_last=shuffle,
                                           generator=torch.Generator().manual_seed(self.p.seed))

    def _trainer(self, recorder):
        import lightning as L
        from lightning.pytorch.callbacks import ModelCheckpoint
        from lightning.pytorch.loggers import CSVLogger

        p = self.p
        scratch = Path(self.ctx.work_dir)
        # its strategies are Lightning's names, built with the cell's settings where it sets any
        strategy = "auto" if self.strategy.single_rank else lightning_strategy(self.view)
        accelerator = "cpu" if not self.ctx.is_cuda else _emulated_gpu() if p.emulate else "gpu"
        callbacks = [_step_callback(recorder, p.grad_accum), self.wrapping]
        if self.ctx.timing.memory_snapshot:
            callbacks.append(_tensors_at_train_end(self))
        # the study's callbacks: a checkpoint at the end of training and a logger. An emulated rank
        # writes none: gathering FSDP's full state needs every rank's shard, and with the fake process
        # group this rank would gather only its own (the run fails after its last step)
        if not p.emulate:
            callbacks.append(ModelCheckpoint(dirpath=scratch / "checkpoints", save_last=False))
        return L.Trainer(
            accelerator=accelerator, devices=p.gpus_per_node,
            num_nodes=p.nodes,
            strategy=strategy, precision=PRECISION[p.precision], deterministic=p.deterministic,
            max_steps=recorder.total, accumulate_grad_batches=p.grad_accum, log_every_n_steps=10,
            callbacks=callbacks,
            enable_checkpointing=not p.emulate,  # else Lightning adds a checkpoint of its own
            logger=CSVLogger(scratch / "logs"), enable_progress_bar=False, enable_model_summary=False,
            # one pass over the held-out set after the last step, outside the timed steps
            num_sanity_val_steps=0, val_check_interval=recorder.total, check_val_every_n_epoch=None)

    CONFIG_FILE = "lightning_config.json"

    def train(self, recorder) -> None:
        self.wrapping = _wrapping_recorder()
        self.trainer = self._trainer(recorder)
        self.trainer.fit(self.module,
                         train_dataloaders=self._loader(self.train_split, self.p.micro_batch, True),
                         val_dataloaders=self._loader(self.test_split, self.p.micro_batch, False))

    def framework_config(self) -> dict | None:
        """The strategy as the run used it: its class, DDP's settings as the wrapped model had them,
        DeepSpeed's config as Lightning built it."""
        if self.strategy.single_rank:
            return None
        strategy = self.trainer.strategy
        config = {"strategy": type(strategy).__name__, "registered_as": self.p.strategy, **self.wrapping.seen}
        if hasattr(strategy, "config") and isinstance(strategy.config, dict):  # DeepSpeedStrategy's
            config["deepspeed"] = strategy.config
        return config

    def results(self) -> dict:
        return {"test_accuracy": self.module.accuracy, "dataset": self.train_split.source,
                "test_samples": len(self.test_split.labels)}

    def model(self) -> torch.nn.Module:
        return self.module.model

    def memory_tensors(self) -> dict[str, list[torch.Tensor]]:
        return getattr(self, "tensors_at_train_end", None) or super().memory_tensors()

    def optimizer_object(self):
        trainer = getattr(self, "trainer", None)
        return trainer.optimizers if trainer is not None else None

    def params_total(self) -> int:
        return sum(getattr(p, "ds_numel", p.numel()) for p in self.module.model.parameters())
