"""Tasks as conversations: each example rendered through the model's chat template.

A model tuned to answer inside a chat template is scored on prompts it was trained on
(`gptforge evaluate --tasks ... --chat`; nanochat's ChatCORE, lm-eval's chat-template variants):

- multiple choice (`mc`, ARC, MMLU, HellaSwag, PIQA, WinoGrande, CMMLU, C-Eval): one user turn
  with the question, the options lettered `A. ...`, `B. ...` on their own lines and the line
  "Answer with the letter of the correct option."; the model is scored by the log-likelihood
  of each letter as the first token(s) of the assistant turn (after the template's assistant
  header), the letter encoded exactly as a trained assistant message "B" is.
- classification: the text and "Answer with one of: w1, w2, ..."; each label word scored as the
  assistant's reply.
- generation (`{"prompt", "answer"}`, GSM8K): the prompt (GSM8K: the bare question) as the user
  turn; the model's reply is generated until the template's end-of-turn token, its final answer
  extracted (`gptforge.eval.answers`) and compared with the reference's.
- cloze: "Continue the text with its next word." and the text; the word scored as the reply.
- perplexity tasks are documents, scored plain.

Few-shot demonstrations are earlier user/assistant turns (each solved: the letter, the label
word, the reference answer), drawn as the plain path draws them; the task's description opens
the first user turn.

The template is the model's (`load_chat_format`): a run directory's chat_template.jinja (what
`gptforge finetune` trained with and every export carries), a Hugging Face folder's
tokenizer_config.json / chat_template.jinja, or what `--chat-template` names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gptforge.errors import InputError

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MC_INSTRUCTION = "Answer with the letter of the correct option."
CLOZE_INSTRUCTION = "Continue the text with its next word."
TEMPLATE_OPTION = "--chat-template"


@dataclass
class ChatFormat:
    """A `gptforge.data.chat.ChatTokenizer` and how to render with it.

    template: None renders the tokenizer's Jinja chat template; `DEFAULT_TEMPLATE` ("default")
        gptforge's built-in instruction format (`gptforge.data.chat.render_default`).
    """

    tok: object
    template: str | None = None

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """Ids of `messages` followed by the assistant header (the generation prompt)."""
        from gptforge.data.chat import prompt_ids

        return prompt_ids(self.tok, messages, self.template)  # type: ignore[arg-type]

    def reply_ids(self, text: str) -> list[int]:
        """Ids of the start of an assistant reply `text`, as training encodes message content."""
        return self.tok.encode_text(text)  # type: ignore[attr-defined]

    def end_of_turn_id(self) -> int:
        """The token that closes an assistant turn: the first special token the template writes
        after an assistant message (e.g. <|im_end|>, <|eot_id|>), else the end-of-text token."""
        from gptforge.data.chat import render_chat_template

        tok = self.tok
        if self.template is None and tok.chat_template:  # type: ignore[attr-defined]
            probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
            ex = render_chat_template(tok, probe)  # type: ignore[arg-type]
            trained = [t for t, flag in zip(ex.ids, ex.target, strict=True) if flag]
            if trained and tok.is_special(trained[-1]):  # type: ignore[attr-defined]
                return trained[-1]
        return tok.eos_id  # type: ignore[attr-defined]

    def decode(self, ids: list[int]) -> str:
        """Text of generated ids, special tokens left out."""
        return self.tok.tokenizer.decode(list(ids), skip_special_tokens=True)  # type: ignore[attr-defined]


def _no_template(model: str) -> InputError:
    return InputError(f"--chat: {model} has no chat template (no chat_template.jinja and no chat_template in "
                      f"tokenizer_config.json); give {TEMPLATE_OPTION} default (gptforge's built-in instruction "
                      f"format, what finetune uses without a template) or {TEMPLATE_OPTION} FILE.jinja")


def load_chat_format(model: str, tokenizer_json: Path, config: dict | None = None,
                     chat_template: str = "auto") -> ChatFormat:
    """The chat format of an evaluated model.

    Args:
        model: the model path as given (for messages); a run directory, checkpoint or HF folder.
        tokenizer_json: the model's tokenizer.json (`gptforge.eval.model_source.load_eval_model`).
        config: the checkpoint's config dict; `finetune.chat_template: default` picks the built-in
            format, as `gptforge serve` does.
        chat_template: "auto" (the model's own: chat_template.jinja / tokenizer_config.json beside
            tokenizer.json, else in the run directory), "default" (the built-in format), or the path
            of a Jinja template file.

    Raises:
        InputError: auto and the model has no template (names --chat-template); a tokenizer without
            an end-of-sequence token.
        MissingInputError: a template file that does not exist.
    """
    from gptforge.data.chat import DEFAULT_TEMPLATE, ChatTokenizer
    from gptforge.errors import MissingInputError

    try:
        tok = ChatTokenizer.from_dir(tokenizer_json.parent)
    except ValueError as e:
        raise InputError(f"--chat: {tokenizer_json}: {e}") from None
    if chat_template == "default":
        return ChatFormat(tok, DEFAULT_TEMPLATE)
    if chat_template != "auto":
        path = Path(chat_template)
        if not path.is_file():
            raise MissingInputError(f"{TEMPLATE_OPTION} {chat_template}: no such file (or use auto / default)")
        tok.chat_template = path.read_text(encoding="utf-8")
        return ChatFormat(tok)
    if ((config or {}).get("finetune") or {}).get("chat_template") == "default":
        return ChatFormat(tok, DEFAULT_TEMPLATE)
    if not tok.chat_template:
        here = Path(model)
        run = [here.parent.parent] if here.parent.name == "checkpoints" else []  # a checkpoint folder's run
        for folder in [here, *run]:
            if (folder / "chat_template.jinja").is_file():
                tok.chat_template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
                break
    if not tok.chat_template:
        raise _no_template(model)
    return ChatFormat(tok)


def chat_format_of_run(run_dir: Path) -> ChatFormat:
    """The chat format a training run's in-loop evaluation renders with (`train.eval_chat`): the
    chat_template.jinja / tokenizer_config.json beside the run's tokenizer.json, as `gptforge
    finetune` writes them.

    Raises:
        InputError: the run has no chat template (names finetune.chat_template).
    """
    from gptforge.data.chat import ChatTokenizer

    try:
        tok = ChatTokenizer.from_dir(Path(run_dir))
    except ValueError as e:
        raise InputError(f"train.eval_chat: {run_dir}: {e}") from None
    if not tok.chat_template:
        raise InputError(f"train.eval_chat: the run {run_dir} has no chat template; fine-tune chat data "
                         "(`gptforge finetune`, finetune.chat_template auto/default/FILE.jinja) or drop train.eval_chat")
    return ChatFormat(tok)


def user_turn(task, example) -> str:
    """The user message that asks `example` of `task` (see the module docstring)."""
    question = example.question or (example.contexts[0] if example.contexts else "")
    if task.type == "multiple_choice":
        if len(example.choices) > len(LETTERS):
            raise InputError(f"{task.path}, line {example.line}: {len(example.choices)} options; --chat letters "
                             f"at most {len(LETTERS)}")
        options = "".join(f"{LETTERS[i]}. {c.strip()}\n" for i, c in enumerate(example.choices))
        return f"{question.strip()}\n\n{options}\n{MC_INSTRUCTION}"
    if task.type == "classification":
        return f"{question.strip()}\n\nAnswer with one of: {', '.join(example.choices)}."
    if task.type == "cloze":
        return f"{CLOZE_INSTRUCTION}\n\n{question.strip()}"
    return question.strip()


def replies(task, example) -> list[str]:
    """The candidate assistant replies scored for `example`: letters (multiple choice), label
    words (classification), the word (cloze); [] for generation."""
    if task.type == "multiple_choice":
        return list(LETTERS[:len(example.choices)])
    if task.type == "classification":
        return list(example.choices)
    if task.type == "cloze":
        return [example.answers[0]]
    return []


def gold_reply(task, example) -> str:
    """The assistant turn of `example` solved (a few-shot demonstration)."""
    if task.type == "generation":
        return example.answers[0]
    options = replies(task, example)
    return options[example.label or 0]


def chat_messages(task, index: int, num_fewshot: int = 0, seed: int = 1234) -> list[dict]:
    """The conversation asking `task.examples[index]`: few-shot user/assistant pairs, then the
    user turn; the task's description opens the first user turn.

    Raises:
        InputError: too few few-shot candidates (`gptforge.eval.task_result.fewshot_picks`).
    """
    from gptforge.eval.task_result import fewshot_picks

    messages: list[dict] = []
    for demo in fewshot_picks(task, index, num_fewshot, seed):
        messages.append({"role": "user", "content": user_turn(task, demo)})
        messages.append({"role": "assistant", "content": gold_reply(task, demo)})
    messages.append({"role": "user", "content": user_turn(task, task.examples[index])})
    if task.description:
        messages[0] = dict(messages[0], content=task.description + messages[0]["content"])
    return messages
