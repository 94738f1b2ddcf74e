"""Logit distillation (`gptforge distill`): a student learns a frozen teacher's next-token distribution.

The loss is the `Distillation` objective (gptforge.train.objectives.distill, with its formula and
sources); this module loads the teacher and runs the trainer with that objective.

The teacher (`load_teacher`) is frozen, in eval mode, run under no_grad, optionally in another
dtype, and must share the student's tokenizer (`check_same_tokenizer`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gptforge.errors import InputError
from gptforge.train.objectives.distill import Distillation

if TYPE_CHECKING:
    from gptforge.model.gpt import GPT


def _tokenizer_sha(doc: dict, tok_path: Path | None) -> str | None:
    sha = (doc.get("data") or {}).get("tokenizer_sha256")
    if sha is None and tok_path is not None:
        from gptforge.data.tokenizer import Tokenizer

        sha = Tokenizer.from_file(tok_path).sha256
    return sha


def check_same_tokenizer(teacher_vocab: int, teacher_sha: str | None, student_vocab: int,
                         student_sha: str | None, teacher_name: str = "--teacher") -> None:
    """Raise InputError unless teacher and student share the vocabulary size and (when both
    are known) the tokenizer (the SHA-256 of its tokenizer.json, as `gptforge prepare` records it)."""
    if teacher_vocab != student_vocab:
        raise InputError(f"{teacher_name}: the teacher's vocabulary has {teacher_vocab} tokens, the student's "
                         f"{student_vocab}; distillation needs the same tokenizer for both")
    if teacher_sha and student_sha and teacher_sha != student_sha:
        raise InputError(f"{teacher_name}: the teacher was trained with another tokenizer (sha256 "
                         f"{teacher_sha[:12]}) than the student's data (sha256 {student_sha[:12]}); prepare the "
                         "data with the teacher's tokenizer.json")


class Teacher:
    """A frozen teacher model: eval mode, no gradients, optionally in another dtype.

    `Teacher.load(run, device, dtype)` loads a run directory or checkpoint
    (`gptforge.runtime.loading.load_for_inference`; a quantized run works too).
    `teacher(x, **extra)`: inputs (B, T) int64 -> logits (B, T, V), computed under no_grad (and
    under autocast when given); no state of its own to checkpoint (it never changes).
    """

    def __init__(self, model: GPT, tokenizer_sha256: str | None = None, name: str = "teacher"):
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tokenizer_sha256 = tokenizer_sha256
        self.name = name
        self.vocab_size = model.config.vocab_size

    @classmethod
    def load(cls, run: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> "Teacher":
        """Raises: FileNotFoundError: no checkpoint at `run`."""
        from gptforge.runtime.loading import load_for_inference

        model, _ckpt, doc, tok = load_for_inference(run, device)
        if dtype is not None:
            model = model.to(dtype)
        return cls(model, _tokenizer_sha(doc, tok), name=str(run))

    def check_student(self, student_vocab: int, student_tokenizer_sha256: str | None) -> None:
        """See `check_same_tokenizer` (errors name --teacher)."""
        check_same_tokenizer(self.vocab_size, self.tokenizer_sha256, student_vocab, student_tokenizer_sha256,
                             f"--teacher {self.name}")

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, **extra) -> torch.Tensor:
        return self.model(x, **extra)


def distill(cfg, teacher_run: str | Path, student: str, data: str | Path, run_dir: str | Path,
            alpha: float = 0.0, temperature: float = 1.0, teacher_dtype: str | None = None, resume: bool = False,
            progress: bool = True, log=None):
    """Train `student` (a preset name, or a run whose weights to start from, e.g. a pruned teacher)
    to match the frozen teacher `teacher_run` on the token shards `data`, with the normal trainer
    (checkpoints, bit-exact resume, metrics, report). Returns the TrainResult.

    config.yaml records a `distill` section (teacher, student, alpha, temperature, teacher dtype)
    so that `--resume` needs none of them again.

    Raises:
        InputError: teacher, student and data do not share a tokenizer / vocabulary, or a bad
            alpha / temperature. MissingInputError / FileNotFoundError: no teacher checkpoint.
    """
    import dataclasses

    from gptforge.config import RunConfig
    from gptforge.data.shards import load_meta
    from gptforge.presets import PRESETS
    from gptforge.runtime.device import pick_device, resolve_precision
    from gptforge.train.run import train

    device = pick_device(cfg.train.device)
    precision = resolve_precision(cfg.train.precision, device, log)  # once: the teacher and the trainer share it
    cfg = RunConfig(model=cfg.model, train=dataclasses.replace(cfg.train, precision=precision), parallel=cfg.parallel)
    dtypes = {None: None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if teacher_dtype not in dtypes:
        raise InputError(f"--teacher-dtype {teacher_dtype!r}: choose fp32, bf16 or fp16")
    teacher = Teacher.load(teacher_run, device, dtypes[teacher_dtype])
    meta = load_meta(data)
    teacher.check_student(int(meta["vocab_size"]), meta.get("tokenizer_sha256"))
    model_factory = None
    if student in PRESETS:
        mc = dataclasses.replace(cfg.model, preset=cfg.model.preset or student)
    elif Path(student).exists():
        from gptforge.runtime.loading import load_model_checkpoint

        start, _ = load_model_checkpoint(Path(student), torch.float32)
        mc = start.config
        model_factory = (lambda _mc: start) if not resume else None
    else:
        raise InputError(f"--student {student!r}: neither a preset ({', '.join(sorted(PRESETS))}) nor a run directory")
    if mc.vocab_size is not None and mc.vocab_size != teacher.vocab_size:
        raise InputError(f"--student vocabulary {mc.vocab_size} differs from the teacher's {teacher.vocab_size}: "
                         "they must share the tokenizer")
    mc = dataclasses.replace(mc, vocab_size=teacher.vocab_size)
    student_block = mc.resolved().block_size
    if student_block > teacher.model.config.block_size:
        raise InputError(f"--student context {student_block} tokens is longer than the teacher's model.block_size "
                         f"{teacher.model.config.block_size}: the teacher cannot score those positions; use "
                         f"--model.block_size {teacher.model.config.block_size} or less")
    objective = Distillation(teacher, alpha, temperature)
    extra = {"distill": {"teacher": str(Path(teacher_run).resolve()), "student": student, "alpha": alpha,
                         "temperature": temperature, "teacher_dtype": teacher_dtype}}
    return train(RunConfig(model=mc, train=cfg.train, parallel=cfg.parallel), data, run_dir, resume=resume,
                 progress=progress, log=log, model_factory=model_factory, config_extra=extra, objective=objective)
