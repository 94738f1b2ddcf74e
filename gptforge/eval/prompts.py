"""Prompt rows for sampling and scoring: `{"prompt", "answer"}` or `{"messages", "answer"}` .jsonl.

Each row becomes the token ids a model continues, rendered as fine-tuning renders them
(`gptforge.data.chat`): a `prompt` row is [BOS] + the prompt's text (no chat template, as a
prompt/completion row of `finetune` is); a `messages` row is the conversation in the tokenizer's
chat template (or gptforge's default one) ending with the assistant's header (`prompt_ids`), so a
model fine-tuned on chat rows is asked the same way it was trained. Every other column (`answer`,
`id`, test cases, ...) stays in the row, which reaches the rewards (`gptforge.eval.rewards`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gptforge.data.chat import ChatTokenizer, prompt_ids
from gptforge.data.instruct import read_jsonl
from gptforge.errors import InputError
from gptforge.eval.rewards import Reward, check_row


@dataclass
class PromptRow:
    """One prompt: its ids (L,), its text (the `prompt`, or the last user message of `messages`),
    the whole JSON row and where it came from ("file:line")."""

    ids: list[int]
    prompt: str
    row: dict
    where: str


def render_prompt(tok: ChatTokenizer, row: dict, where: str, template: str | None = None) -> PromptRow:
    """One row's prompt ids and text (see the module docstring).

    Raises:
        InputError: not an object, neither a string `prompt` nor a `messages` list, a conversation
            that ends with an assistant message, or an empty prompt.
    """
    if not isinstance(row, dict):
        raise InputError(f"{where}: expected a JSON object with `prompt` or `messages`, got {type(row).__name__}")
    if isinstance(row.get("messages"), list):
        messages = row["messages"]
        if not messages or not isinstance(messages[-1], dict) or messages[-1].get("role") == "assistant":
            raise InputError(f"{where}: `messages` must be a non-empty conversation that ends before the "
                             "assistant's answer (the model writes that turn)")
        try:
            ids = prompt_ids(tok, messages, template)
        except ValueError as e:
            raise InputError(f"{where}: {e}") from None
        users = [m["content"] for m in messages if m.get("role") == "user"]
        text = users[-1] if users else messages[-1]["content"]
    elif isinstance(row.get("prompt"), str):
        text = row["prompt"]
        ids = ([tok.bos_id] if tok.add_bos and tok.bos_id is not None else []) + tok.encode_text(text)
    else:
        raise InputError(f"{where}: a prompt row needs a string `prompt` or a `messages` list; it has {sorted(row)}")
    if not ids:
        raise InputError(f"{where}: the prompt is empty; give it some text")
    return PromptRow(ids, text, row, where)


def read_prompts(path: str | Path, tok: ChatTokenizer, rewards: Sequence[Reward] = (),
                 template: str | None = None, max_prompt_tokens: int | None = None) -> list[PromptRow]:
    """Every row of a prompt .jsonl, rendered (`render_prompt`) and checked against `rewards`.

    max_prompt_tokens: refuse a longer prompt (the model's block_size less the completion budget).

    Raises:
        FileNotFoundError / InputError: no file, a line that is not JSON, a bad row, a row without a
            field a reward needs, a prompt over max_prompt_tokens (each naming file:line), no rows.
    """
    out: list[PromptRow] = []
    try:
        for where, row in read_jsonl(path):
            p = render_prompt(tok, row, where, template)
            check_row(rewards, row, where)
            if max_prompt_tokens is not None and len(p.ids) > max_prompt_tokens:
                raise InputError(f"{where}: the prompt has {len(p.ids)} tokens, more than the {max_prompt_tokens} "
                                 "that leave room for the completion in the model's context; shorten it or lower "
                                 "--rl.max_new_tokens")
            out.append(p)
    except InputError:
        raise
    except ValueError as e:  # read_jsonl's "file:line: not valid JSON"
        raise InputError(str(e)) from None
    if not out:
        raise InputError(f"{path}: no prompt rows; give one JSON object per line with `prompt` or `messages`")
    return out
