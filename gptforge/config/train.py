"""The training sections: `train.*` (`TrainConfig`, optimisation, data, schedule, logging) and
`FinetuneConfig` (`gptforge finetune`'s method, adapters and data layout)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from gptforge.ranges import bounded, out_of_range

# Choices shared by a config field and the code that computes its value.
Precision = Literal["auto", "fp32", "bf16", "fp16", "fp8"]
OptimizerName = Literal["adamw", "sgd", "muon", "adamw8bit", "adafactor"]
Checkpointing = Literal["none", "selective", "full"]


@dataclass
class TrainConfig:
    """Optimisation, schedule, precision, evaluation and checkpointing."""

    max_steps: int = bounded(1000, low=1)
    """Number of optimizer steps."""
    micro_batch_size: int = bounded(8, low=1)
    """Sequences per forward/backward pass (per data-parallel rank)."""
    gradient_accumulation_steps: int = bounded(1, low=1)
    """Micro-batches per optimizer step. global_batch_size = micro_batch_size *
    gradient_accumulation_steps * dp."""
    global_batch_size: Optional[int] = bounded(None, low=1)
    """Sequences per optimizer step over all data-parallel ranks. Set: gradient_accumulation_steps
    becomes global_batch_size / (micro_batch_size * dp), so the same run keeps its batches on any
    number of processes. Unset: micro_batch_size * gradient_accumulation_steps * dp, recorded in
    config.yaml (a resume on another number of processes then keeps it)."""
    lr: Optional[float] = bounded(None, low=0.0)
    """Peak learning rate (AdamW's; with muon, that of the embeddings, head, norms and biases).
    Unset: derived from model.d_model when the run is resolved (gptforge.train.resolve; 0.0016 *
    (128 / d_model)^0.6, fitted on CPU runs, gptforge.train.optim.default_lr); on resume, the
    checkpoint's value."""
    min_lr: Optional[float] = bounded(None, low=0.0)
    """Learning rate at the end of decay. Unset: lr / 10."""
    warmup_steps: Optional[int] = bounded(None, low=0)
    """Linear warmup steps from 0 to lr. Unset: 5% of max_steps (after a time budget has set
    it), at least 10 and at most 1000 (and at most a quarter of the run)."""
    lr_schedule: Literal["cosine", "linear", "constant", "wsd"] = "cosine"
    """After warmup: cosine or linear decay to min_lr, constant, or warmup-stable-decay."""
    schedule_start: int = bounded(0, low=0)
    """Step at which the schedule (warmup, then decay) starts: lr_at(step) is the schedule of a
    run of max_steps - schedule_start steps evaluated at step - schedule_start (steps before it
    get the schedule's first value). Set it to the resume step to continue a run with a fresh
    schedule, e.g. a WSD cooldown from any checkpoint (`--train.lr_schedule wsd
    --train.decay_fraction 1 --train.warmup_steps 0 --train.schedule_start S`). 0: from step 0."""
    decay_fraction: float = bounded(0.2, low=0.0, high=1.0)
    """wsd only: fraction of max_steps spent in the final linear decay."""
    weight_decay: float = bounded(0.1, low=0.0)
    """AdamW weight decay, applied to matrices only (not biases, norm weights)."""
    beta1: float = bounded(0.9, low=0.0, high=1.0)
    """AdamW beta1."""
    beta2: float = bounded(0.95, low=0.0, high=1.0)
    """AdamW beta2."""
    eps: float = bounded(1e-8, low=0.0)
    """AdamW epsilon."""
    grad_clip: float = bounded(1.0, low=0.0)
    """Clip the global gradient norm to this value; 0 disables clipping."""
    optimizer: OptimizerName = "adamw"
    """Optimizer. adamw (fused where the device supports it) and sgd run everywhere; muon:
    torch.optim.Muon (Newton-Schulz orthogonalised momentum, Jordan et al. 2024) for the 2-D
    matrices inside the blocks and AdamW (train.lr, betas, weight_decay) for embeddings, head,
    norms and biases; single process, DDP and pipeline parallel (not FSDP2, TP or ZeRO-1).
    adamw8bit and adafactor are planner-only here."""
    muon_lr: Optional[float] = bounded(None, low=0)
    """muon: peak learning rate of the Muon matrices (scaled by the schedule like lr, so the
    ratio muon_lr / lr stays fixed); torch.optim.Muon also multiplies it by sqrt(max(1,
    rows/cols)) per matrix (Jordan et al. 2024, the "original" adjustment). Default 0.02 (the
    reference Muon implementation's)."""
    muon_momentum: float = bounded(0.95, low=0.0, high=1.0)
    """muon: Nesterov momentum of the Muon matrices (reference value 0.95)."""
    muon_weight_decay: float = bounded(0.0, low=0.0)
    """muon: decoupled weight decay of the Muon matrices (the matrices shrink by
    lr_muon * muon_weight_decay per step); the AdamW parameters keep weight_decay."""
    data_weights: Optional[dict[str, float]] = None
    """Mixture weights over the data's sources (several --data folders, or a folder prepared with
    several --source): name=weight, normalized to sum to 1, 0 leaves a source out (shortcut
    `--data-weights en=0.7,zh=0.3`). Unset: proportional to each source's train tokens (resolved
    once; on --resume the run's own). Every optimizer step draws each source's share of its
    global batch from a seeded stratified sampler (gptforge.data.mixture). One source: unused."""
    stages: Optional[list[dict[str, Any]]] = None
    """Mixture stages, in order: each {until_step: N or until_fraction: F (of max_steps),
    data_weights: {name: weight}}; steps before a stage's end (and after the previous stage's)
    draw with its weights, later steps with train.data_weights. The lr schedule stays one schedule
    (a WSD decay can lie inside the last stage). Resolved once to until_step values."""
    document_mask: bool | None = None
    """None (default): off, resolved once (gptforge.train.resolve; on --resume the run's own value;
    bench/RESULTS.md: it did not win at the quickstart size). True - token shards only: attention stays inside each document of a packed training window (a
    block-diagonal causal mask from the EOS positions, an EOS opening the document after it) and
    positions restart at 0 at each EOS, so a document is modelled as if it were alone; validation
    uses the same mask (gptforge.model.gpt.document_mask), as does `gptforge evaluate` of the run.
    Not under pipeline parallelism. (Packed instruction data always masks per example.)"""
    precision: Precision = "auto"
    """Autocast precision: auto (what is fast on the device: bf16 on GPUs that have it and on CPUs
    whose measured bf16 matmuls beat fp32, else fp32; the choice is frozen in config.yaml), fp32,
    bf16 or fp16 (with a gradient scaler). fp8 is planner-only."""
    eval_interval: int = bounded(100, low=0)
    """Evaluate on the val split every N steps (and at the last step); 0 disables."""
    eval_steps: int = bounded(20, low=1)
    """Number of fixed val batches per evaluation."""
    patience: int = bounded(0, low=0)
    """Early stopping: stop after this many evaluations without improvement; 0 disables."""
    eval_tasks: Optional[list[str]] = None
    """Task files (gptforge evaluate --tasks formats) scored every eval_interval steps, logged as
    eval/<task>/<metric> to metrics.jsonl and TensorBoard."""
    eval_tasks_limit: Optional[int] = None
    """Score only the first N examples of each train.eval_tasks task (None: all)."""
    eval_chat: bool = False
    """Score train.eval_tasks through the run's chat template (as `gptforge evaluate --chat`: lettered
    options, extracted answers), adding eval/chatcore/centered_acc over several tasks; for runs whose
    directory holds the chat template (finetune, and rl, which writes it the same way)."""
    best_metric: str = "val_loss"
    """What picks the best checkpoint and drives early stopping: val_loss (of a mixture: the
    token-weighted mean over the sources' val splits), val/<source>/loss (one source of a
    mixture), a task metric such as eval/<task>/acc (higher is better for accuracies and F1,
    lower for perplexities), or for `gptforge rl` with rl.eval_prompts eval/pass@1 or
    eval/reward/NAME (the held-out reward; higher is better)."""
    checkpoint_interval: int = bounded(500, low=0)
    """Write a checkpoint every N steps (and at the end); 0 writes only at the end."""
    keep_checkpoints: int = bounded(2, low=1)
    """Number of recent step checkpoints kept (the best one is always kept)."""
    stop_at_step: int = bounded(0, low=0)
    """End the run at this step as if interrupted (checkpoint written); 0 disables."""
    max_minutes: float = bounded(0.0, low=0.0)
    """Time budget in minutes: max_steps is set from a step time measured at start (so the schedule
    completes in time; frozen in config.yaml for an exact resume) and the run stops with a
    checkpoint when the budget is used up (counted over resumes). When set, it replaces
    max_steps, an explicit --train.max_steps included (at least 20 steps; the start says so in
    one line); keep it 0 to train exactly max_steps. 0 disables."""
    max_minutes_steps: int = bounded(0, low=0)
    """Set when the run is resolved (gptforge.train.resolve): the max_steps that max_minutes resolved to
    (0: not resolved yet)."""
    max_bad_steps: int = bounded(5, low=1)
    """Stop after this many consecutive optimizer steps with a non-finite loss or gradient."""
    seed: int = bounded(1337, low=-2**63, high=2**64 - 1)
    """Seed for initialisation, data sampling and dropout."""
    device: str = "auto"
    """auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N or mps."""
    activation_checkpointing: Checkpointing = "none"
    """Recompute activations in backward: none, selective (attention and MLP inner activations
    of every other block) or full (every block)."""
    compile: Union[bool, Literal["auto"]] = False
    """torch.compile the model (the whole model in a single process, each block under a parallel
    layout or DeepSpeed): true, false, or auto (CUDA: true; CPU: whichever of compiled and eager
    steps runs faster for this shape, measured at start; frozen in config.yaml as true/false)."""
    onednn_linear: bool = True
    """fp32 steps on a CPU without compile: linear layers' forward and input gradient through oneDNN
    rather than the BLAS (gptforge.runtime.onednn_linear; faster where MKL does not use the CPU's
    vector extensions). false: the BLAS, as torch does by default."""
    log_interval: int = bounded(1, low=1)
    """Write metrics every N steps."""
    num_threads: int = bounded(0, low=0)
    """CPU threads for torch (0: leave torch's default)."""
    tensorboard: bool = True
    """Write TensorBoard event files to RUN_DIR/tb."""
    report: bool = True
    """Write RUN_DIR/report.html (gptforge report) when the run ends, however it ends."""
    spike_alarms: bool = True
    """Watch train loss and gradient norm for spikes and divergence (rolling median / MAD); alarms
    go on the progress line, into metrics.jsonl (`events`) and the report."""
    spike_action: Literal["warn", "rollback"] = "warn"
    """What a loss spike (or a streak of train.max_bad_steps non-finite steps) does: warn (an
    alarm only; the non-finite streak stops the run), or rollback: reload the last good checkpoint
    (model, optimizer, schedule, RNG), skip the batches read since it and continue, logged as a
    `rollback` event (gptforge.train.rollback). Needs train.spike_alarms; single process or plain
    DDP (parallel.dp_replicate) only."""
    max_rollbacks: int = bounded(3, low=1)
    """spike_action rollback: rollbacks allowed in the run (counted over resumes); the next spike
    after them stops the run."""
    wandb_project: Optional[str] = None
    """Weights & Biases project: log the config, every metrics row and the report (needs `pip
    install wandb`). Unset: no W&B."""
    wandb_entity: Optional[str] = None
    """W&B entity (team or user); default the account's."""
    wandb_run_name: Optional[str] = None
    """W&B run name; default the run directory's name."""
    wandb_mode: Literal["online", "offline", "disabled"] = "online"
    """W&B mode: offline writes the run under RUN_DIR/wandb for a later `wandb sync`."""

    PLANNER_ONLY = {"optimizer": ("adamw8bit", "adafactor"), "precision": ("fp8",)}
    """Values `gptforge plan` models but the trainer does not run."""


    def check_values(self) -> None:
        """Refuse, before anything starts, values no job can have: a number outside its range (its
        `bounded` field) or keys that contradict each other (min_lr above lr, warmup longer than
        the run, ...). The checks `pretrain` (through `check_trainable`) and `plan` share.

        Raises:
            OptionError: naming the key and the allowed range or values.
        """
        from gptforge.errors import OptionError

        bad = out_of_range(self)  # unset (None) fields are filled when the run is resolved
        if bad is not None:
            name, v, allowed = bad
            raise OptionError(f"train.{name}={v!r}: must be {allowed}")
        if self.schedule_start >= self.max_steps:
            raise OptionError(f"train.schedule_start={self.schedule_start}: must be below train.max_steps "
                             f"({self.max_steps}); raise max_steps to extend the run")
        if self.lr is not None and self.min_lr is not None and self.min_lr > self.lr:
            raise OptionError(f"train.min_lr={self.min_lr:g} is above train.lr={self.lr:g}: the schedule decays from "
                             "lr to min_lr; set min_lr <= lr")
        if self.warmup_steps is not None and self.warmup_steps > self.max_steps > 1:
            raise OptionError(f"train.warmup_steps={self.warmup_steps} > train.max_steps={self.max_steps}: the "
                             "learning rate would never reach its peak; use fewer warmup steps")
        if self.spike_action not in ("warn", "rollback"):
            raise OptionError(f"train.spike_action={self.spike_action!r}: must be warn or rollback")
        if self.spike_action == "rollback" and not self.spike_alarms:
            raise OptionError("train.spike_action=rollback acts on the spike detector's alarms, and "
                             "train.spike_alarms is false; set train.spike_alarms true, or spike_action warn")
        if self.spike_action == "rollback" and self.checkpoint_interval == 0 and self.eval_interval == 0:
            raise OptionError("train.spike_action=rollback needs checkpoints to roll back to, and "
                             "train.checkpoint_interval 0 with train.eval_interval 0 writes one only at the end; "
                             "set train.checkpoint_interval (e.g. 100)")

    def check_trainable(self) -> None:
        """`check_values`, and refuse a planner-only optimizer or precision (PLANNER_ONLY): the
        values the trainer cannot run.

        Raises:
            OptionError: naming the key and the allowed range or values.
        """
        from gptforge.errors import OptionError

        self.check_values()
        for name, values in self.PLANNER_ONLY.items():
            if getattr(self, name) in values:
                raise OptionError(f"train.{name}={getattr(self, name)!r} is modelled by `gptforge plan` only and "
                                 "cannot be trained here; use " + ("adamw, sgd or muon" if name == "optimizer"
                                                                   else "fp32, bf16 or fp16"))


@dataclass
class FinetuneConfig:
    """Fine-tuning a pretrained model (`gptforge finetune`): method, adapters, data layout."""

    method: Literal["full", "lora", "qlora"] = "lora"
    """full: train every weight; lora: train low-rank adapters on frozen base weights (Hu et al.
    2021); qlora: the same adapters on a base whose block linears are stored in 4 bits by
    bitsandbytes (Dettmers et al. 2023; pip install 'gptforge[qlora]'; CPU or CUDA, single process)."""
    lora_rank: int = 8
    """LoRA adapter rank r."""
    lora_alpha: float = 16.0
    """LoRA scale numerator: the adapter's output is multiplied by lora_alpha / lora_rank."""
    lora_dropout: float = 0.0
    """Dropout on each adapter's input (training only)."""
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Linear layers that get adapters: any of q_proj, k_proj, v_proj, o_proj, gate_proj (llama),
    up_proj, down_proj, or [all]."""
    qlora_quant_type: Literal["nf4", "fp4"] = "nf4"
    """qlora: 4-bit data type of the base weights: nf4 (NormalFloat, the QLoRA paper's) or fp4."""
    qlora_double_quant: bool = True
    """qlora: also quantize the per-block scales to 8 bits (saves about 0.37 bits per weight)."""
    qlora_compute_dtype: Literal["auto", "bf16", "fp32"] = "auto"
    """qlora: dtype the 4-bit weights are dequantized to for each matmul; auto: bf16 when
    train.precision is bf16, else fp32."""
    packing: Literal["packed", "padded"] = "packed"
    """Instruction data: packed (several sequences per row, attention kept inside each, position
    ids restarting per sequence) or padded (one sequence per row, right-padded)."""
    chat_template: str = "auto"
    """Instruction data with `messages`: auto (the tokenizer's chat template when it has one, else
    gptforge's default template), default (always the default template), or the path of a Jinja
    file (used, and copied into the run directory as chat_template.jinja)."""
    block_size: Optional[int] = None
    """Training sequence length in tokens (longer examples are truncated). Default: the model's
    context length, at most 2048. The model keeps its own context length for export."""
    val_fraction: float = 0.05
    """Instruction data: fraction of examples held out for validation (0: none). Token shards use
    their val split."""
    cache: bool = True
    """Cache the tokenized instruction data beside the .jsonl (keyed on data, tokenizer, template)."""
    objective: Literal["sft", "dpo"] = "sft"
    """sft: next-token loss on the completions of instruction data (or every token of shards);
    dpo: preference tuning on a .jsonl of prompt/chosen/rejected pairs (TRL's formats), with the
    loss chosen by dpo_loss. train.micro_batch_size then counts pairs."""
    dpo_loss: Literal["sigmoid", "ipo", "simpo", "orpo"] = "sigmoid"
    """objective dpo: sigmoid (DPO), ipo (length-normalised, as TRL), or the reference-free simpo
    and orpo (as TRL's experimental CPO/ORPO trainers)."""
    dpo_beta: float = 0.1
    """objective dpo: beta, the strength of the pull toward the reference (DPO, IPO), SimPO's
    reward scale, ORPO's weight of the odds-ratio term (lambda). TRL's default 0.1."""
    rpo_alpha: float = 0.0
    """objective dpo: weight of an added next-token loss on the chosen completions (RPO; 0: off)."""
    simpo_gamma: float = 0.5
    """dpo_loss simpo: the target reward margin gamma (TRL's default 0.5)."""
    precompute_ref: bool = False
    """objective dpo, full fine-tuning: compute the reference log-probs of every pair once before
    training (kept in the run folder and checkpoint) instead of holding a frozen copy of the
    model. LoRA/QLoRA use the base with adapters off and need neither."""
