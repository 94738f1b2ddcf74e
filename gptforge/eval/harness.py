"""lm-evaluation-harness 0.4 on a gptforge model, without conversion: a `TemplateLM` adapter.

`make_lm(model, tokenizer, ...)` returns an `lm_eval.api.model.TemplateLM` whose three request
types run on gptforge's scorer: `loglikelihood` (lm-eval encodes the pairs with its own
`_encode_pair`; `_loglikelihood_tokens` packs each shared context once, see
`gptforge.eval.scoring`), `loglikelihood_rolling` (lm-eval's own disjoint rolling windows of
block_size tokens, EOS as the first context token) and `generate_until` (greedy decoding whatever
the request's sampling settings; cut at its `until` strings and the end-of-text token; the prompt
left-truncated to block_size - max_gen_toks). `run_harness(...)` runs lm-eval's
own task definitions offline (the Hugging Face hub-offline variables set) from `include_path`.

Needs `pip install 'gptforge[eval]'` (lm_eval).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gptforge.errors import InputError, MissingInputError
from gptforge.eval.scoring import make_units, score_units

if TYPE_CHECKING:
    from gptforge.model.gpt import GPT

OFFLINE_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _require_lm_eval():
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise MissingInputError("--harness needs lm-evaluation-harness: pip install 'gptforge[eval]'") from None


def make_lm(model: GPT, tokenizer, device: torch.device | str = "cpu", precision: str = "fp32",
            batch_size: int = 32):
    """An lm-eval `TemplateLM` over `model` (a gptforge GPT) and `tokenizer` (gptforge Tokenizer)."""
    _require_lm_eval()
    from lm_eval import utils
    from lm_eval.api.model import TemplateLM

    from gptforge.eval.runner import _generate

    dev = torch.device(device)
    block = model.config.block_size

    class GptforgeLM(TemplateLM):
        def __init__(self):
            super().__init__()
            self.model, self.tokenizer = model, tokenizer

        @property
        def eot_token_id(self) -> int:
            return tokenizer.eos_id

        def tok_encode(self, string: str, **kwargs) -> list[int]:
            return tokenizer.encode(string)

        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
            pairs = [(list(ctx), list(cont)) for _, ctx, cont in requests]
            units, _truncated = make_units(pairs, block)
            ll, greedy = score_units(model, units, len(pairs), batch_size, dev, precision)
            out = list(zip(ll, greedy, strict=True))
            for (key, _, _), res in zip(requests, out, strict=True):
                self.cache_hook.add_partial("loglikelihood", key, res)
            return out

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            windows, owner = [], []
            for i, (string,) in enumerate(r.args for r in requests):
                for w in map(utils.make_disjoint_window, utils.get_rolling_token_windows(
                        token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                        max_seq_len=block, context_len=1)):
                    windows.append((None, w[0], w[1]))
                    owner.append(i)
            scores = self._loglikelihood_tokens(windows) if windows else []
            totals = [0.0] * len(requests)
            for i, (ll, _) in zip(owner, scores, strict=True):
                totals[i] += ll
            return totals

        def generate_until(self, requests, disable_tqdm: bool = False):
            outs = []
            was_training = model.training
            model.eval()
            try:
                for r in requests:
                    context, kw = r.args
                    kw = dict(kw or {})
                    until = kw.get("until") or []
                    until = [until] if isinstance(until, str) else list(until)
                    max_new = int(kw.get("max_gen_toks", 256))
                    if max_new >= block:
                        max_new = block // 2
                    ids = (tokenizer.encode(context) or [tokenizer.eos_id])[-(block - max_new):]
                    outs.append(_generate(model, tokenizer, [ids], max_new, until, 1, dev, precision)[0])
            finally:
                model.train(was_training)
            return outs

    return GptforgeLM()


def run_harness(model: GPT, tokenizer, tasks: list[str], include_path: str | None = None,
                num_fewshot: int | None = None, limit: int | None = None, device: torch.device | str = "cpu",
                precision: str = "fp32", batch_size: int = 32, seed: int = 1234,
                include_defaults: bool | None = None) -> dict:
    """lm-eval's `simple_evaluate` on `tasks` (names of its task definitions) with the adapter.

    include_defaults: also index lm-eval's built-in task definitions (slow to start). None: only
    when include_path does not define every task.

    Returns: lm-eval's results dict (`results`, `n-shot`, `configs`, ...).

    Raises:
        InputError: a task name lm-eval does not know (after reading include_path).
        MissingInputError: lm_eval not installed, include_path missing, or a task's dataset that
            cannot be loaded offline (the message names the task and --include-path).
    """
    _require_lm_eval()
    os.environ.update(OFFLINE_ENV)
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager, get_task_dict

    if include_path is not None and not Path(include_path).is_dir():
        raise MissingInputError(f"--include-path {include_path}: no such folder")
    tm = None
    if include_defaults is None and include_path is not None:
        tm = TaskManager(include_path=include_path, include_defaults=False)
        if any(t not in tm.all_tasks for t in tasks):
            tm = None
    if tm is None:
        tm = TaskManager(include_path=include_path, include_defaults=include_defaults is not False)
    unknown = [t for t in tasks if t not in tm.all_tasks]
    if unknown:
        raise InputError(f"--harness: lm-eval knows no task {unknown[0]!r}; put its YAML definition in a folder "
                         "and pass --include-path DIR")
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # lm-eval 0.4.10+ prefers TaskManager.load()
            task_dict = get_task_dict(tasks, tm)
    except OSError as e:
        # datasets' DatasetNotFoundError is a FileNotFoundError; offline hub access a ConnectionError.
        raise MissingInputError(
            f"--harness {' '.join(tasks)}: a task's dataset cannot be loaded offline ({type(e).__name__}: {e}); "
            "give the data as local files (dataset_path: json, dataset_kwargs.data_files) in a task YAML under "
            "--include-path DIR") from None
    lm = make_lm(model, tokenizer, device, precision, batch_size)
    del task_dict  # loaded only to turn a missing dataset into a clear error; simple_evaluate reloads it
    return simple_evaluate(model=lm, tasks=tasks, num_fewshot=num_fewshot, limit=limit,
                           task_manager=tm, random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                           fewshot_random_seed=seed)
