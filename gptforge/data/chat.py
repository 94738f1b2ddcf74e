"""Instruction formats: one .jsonl row or conversation -> token ids with completion-only target flags.

Rows (one JSON object per line of an instruction .jsonl; `gptforge.data.instruct` reads the file):
- `{"prompt": "...", "completion": "..."}`: ids = [BOS] + text(prompt) + text(completion) + EOS;
  the completion and the EOS are trained. No chat template (as TRL does for plain prompt/completion).
- `{"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}`: rendered with the
  tokenizer's chat template when it has one, else with `DEFAULT_TEMPLATE` below; every assistant
  message's content and the end-of-turn token that closes it are trained. A row may add `tools`
  (OpenAI function objects); assistant messages may carry OpenAI `tool_calls` (content then may be
  null) and `role: "tool"` messages hold results: the default template writes them as
  `gptforge.data.tools` says, and the calls are trained with their assistant turn.

Special tokens come only from the template, as ids; text from the data is encoded with special-
token matching switched off, so a literal "<|im_end|>" or "<|endoftext|>" in a message is plain
text. For a Jinja chat template this is done by rendering the conversation with each message's
content replaced by a sentinel, encoding the template's own text (with special tokens) and the
contents (without) separately, and concatenating. The tokens at a template/content boundary may
then differ from encoding the rendered string in one go when a BPE merge would have crossed the
boundary; chat templates put newlines or special tokens there, where byte-level BPE splits anyway.

Default template (tokenizers without a chat template, e.g. gptforge's own BPE):

    [BOS]### System:\\n{system}\\n\\n### User:\\n{user}\\n\\n### Assistant:\\n{assistant}<EOS>\\n\\n...

`### Role:` headers are plain text; <EOS> is the tokenizer's end-of-text token inserted by id; BOS
only when the tokenizer's config asks for one (`add_bos_token`). At inference, a prompt ends with
"### Assistant:\\n" and generation stops at EOS (`prompt_ids`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from gptforge.data.tools import JINJA_CALLS, JINJA_TOOLS, call_function, calls_text, tools_text

DEFAULT_TEMPLATE = "default"
ROLE_HEADERS = {"system": "### System:\n", "user": "### User:\n", "assistant": "### Assistant:\n",
                "tool": "### Tool:\n"}
TURN_SEPARATOR = "\n\n"
_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>")
# Private-use characters around mixed-case letters: a template filter such as upper/lower/title
# that rewrites content also breaks the sentinel, and is then detected.
_SENTINEL = re.compile("\ue000xY(\\d+)Yx\ue001")


def _token_content(value) -> str | None:
    if isinstance(value, dict):  # tokenizer_config.json may store {"content": ..., ...}
        return value.get("content")
    return value


class ChatTokenizer:
    """A Hugging Face `tokenizers.Tokenizer` with its chat template and special tokens.

    encode_text(s): data text; special-token strings in it are plain text.
    encode_template(s): template text; special-token strings become their ids.
    """

    def __init__(self, tokenizer, chat_template: str | None = None, bos_token: str | None = None,
                 eos_token: str | None = None, add_bos: bool = False, extra_tokens: dict | None = None):
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        specials = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
        if eos_token is None:
            eos_token = next((t for t in _EOS_CANDIDATES if t in specials), None)
        if eos_token is None or tokenizer.token_to_id(eos_token) is None:
            raise ValueError(
                f"tokenizer has no end-of-sequence token ({eos_token or ' / '.join(_EOS_CANDIDATES)}); "
                "instruction data needs one to end each completion"
            )
        self.eos_token, self.eos_id = eos_token, tokenizer.token_to_id(eos_token)
        self.bos_token = bos_token
        self.bos_id = tokenizer.token_to_id(bos_token) if bos_token else None
        self.add_bos = bool(add_bos and self.bos_id is not None)
        self.extra_tokens = extra_tokens or {}
        self._special_ids = {tokenizer.token_to_id(t) for t in specials}

    @classmethod
    def from_dir(cls, path: str | Path) -> "ChatTokenizer":
        """Load tokenizer.json and, when present, tokenizer_config.json / chat_template.jinja.

        `path` is a folder or a tokenizer.json file.

        Raises:
            FileNotFoundError: no tokenizer.json. ValueError: no end-of-sequence token.
        """
        from tokenizers import Tokenizer

        path = Path(path)
        folder = path if path.is_dir() else path.parent
        tok_file = path if path.is_file() else folder / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"{tok_file}: no tokenizer.json (gptforge reads Hugging Face fast tokenizers)")
        config: dict = {}
        if (folder / "tokenizer_config.json").is_file():
            config = json.loads((folder / "tokenizer_config.json").read_text())
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        if (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text()
        elif (folder / "chat_template.json").is_file():
            template = json.loads((folder / "chat_template.json").read_text()).get("chat_template", template)
        extra = {k: _token_content(v) for k, v in config.items() if k.endswith("_token") and _token_content(v)}
        return cls(
            Tokenizer.from_file(str(tok_file)), chat_template=template,
            bos_token=_token_content(config.get("bos_token")), eos_token=_token_content(config.get("eos_token")),
            add_bos=bool(config.get("add_bos_token", False)), extra_tokens=extra,
        )

    def encode_text(self, text: str) -> list[int]:
        """Ids of data text; special-token strings in it are encoded as ordinary text."""
        tok = self.tokenizer
        previous = tok.encode_special_tokens
        tok.encode_special_tokens = True
        try:
            return tok.encode(text, add_special_tokens=False).ids
        finally:
            tok.encode_special_tokens = previous

    def encode_template(self, text: str) -> list[int]:
        """Ids of template text; special-token strings in it become their ids."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids


# ---------------------------------------------------------------------------------------------
# Rendering one example


@dataclass
class Example:
    """One tokenized example: ids (L,) and target flags (L,): target[i] = the loss predicts ids[i]."""

    ids: list[int]
    target: list[bool]


def _check_message(m, where: str) -> dict:
    """`m` with content "" where an assistant message has only tool calls.

    Raises:
        ValueError: a role other than system/user/assistant/tool, content that is not a string
            (null only beside tool_calls), or a malformed tool call (naming `where`).
    """
    calls = m.get("tool_calls") if isinstance(m, dict) else None
    if isinstance(m, dict) and m.get("role") == "assistant" and calls and m.get("content") is None:
        m = dict(m, content="")
    if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in ROLE_HEADERS:
        raise ValueError(f"{where} must have role system/user/assistant/tool and string content, got {m!r:.120}")
    if calls is not None:
        if m["role"] != "assistant" or not isinstance(calls, list):
            raise ValueError(f"{where}: tool_calls must be a list, on an assistant message")
        for k, c in enumerate(calls):
            try:
                call_function(c)
            except ValueError as e:
                raise ValueError(f"{where}.tool_calls[{k}]: {e}") from None
    return m


def _check_messages(messages, where: str) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: `messages` must be a non-empty list of {{role, content}} objects")
    messages = [_check_message(m, f"{where}: messages[{j}]") for j, m in enumerate(messages)]
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: no assistant message, so nothing to train on")
    return messages


def render_prompt_completion(tok: ChatTokenizer, prompt: str, completion: str) -> Example:
    """[BOS] prompt completion EOS; completion and EOS are targets."""
    head = ([tok.bos_id] if tok.add_bos else []) + tok.encode_text(prompt)
    tail = tok.encode_text(completion) + [tok.eos_id]
    return Example(head + tail, [False] * len(head) + [True] * len(tail))


def default_chat_template(add_bos: bool = False) -> str:
    """The default template (see the module docstring) as a Jinja chat template.

    Rendered by transformers' `apply_chat_template`, llama.cpp or `render_chat_template`, it gives
    the text `render_default` encodes: `### Role:` headers, each assistant turn closed by
    `eos_token`, turns separated by a blank line, "### Assistant:\\n" with add_generation_prompt;
    `bos_token` first when add_bos (the tokenizer's `add_bos_token`).
    """
    headers = ", ".join(f"'{role}': '{h[:-1]}\\n'" for role, h in ROLE_HEADERS.items())
    sep = TURN_SEPARATOR.replace("\n", "\\n")
    return (("{{ bos_token }}" if add_bos else "") + JINJA_TOOLS + "{% set headers = {" + headers + "} %}"
            "{% for message in messages %}{{ headers[message['role']] + (message['content'] or '') }}"
            "{% if message['role'] == 'assistant' %}" + JINJA_CALLS + "{{ eos_token }}{% endif %}"
            "{{ '" + sep + "' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ headers['assistant'] }}{% endif %}")


def render_default(tok: ChatTokenizer, messages: list[dict], add_generation_prompt: bool = False,
                   tools: list[dict] | None = None) -> Example:
    """`messages` in the default template (see the module docstring; tools and tool calls as
    `gptforge.data.tools` writes them: an assistant turn's calls are trained with its content)."""
    ids: list[int] = [tok.bos_id] if tok.add_bos else []
    if tools:
        ids += tok.encode_template(tools_text(tools) + TURN_SEPARATOR)
    target = [False] * len(ids)
    for m in messages:
        header = tok.encode_template(ROLE_HEADERS[m["role"]])
        content = tok.encode_text(m["content"] or "")
        trained = m["role"] == "assistant"
        if m.get("tool_calls"):
            content += tok.encode_template(calls_text(m["tool_calls"]))
        end = [tok.eos_id] if trained else []
        sep = tok.encode_template(TURN_SEPARATOR)
        ids += header + content + end + sep
        target += [False] * len(header) + [trained] * (len(content) + len(end)) + [False] * len(sep)
    if add_generation_prompt:
        header = tok.encode_template(ROLE_HEADERS["assistant"])
        ids += header
        target += [False] * len(header)
    return Example(ids, target)


def _jinja_env():
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ValueError(f"chat template: {message}")

    def strftime_now(fmt):
        import datetime

        return datetime.datetime.now().strftime(fmt)

    # The settings transformers renders chat templates with (trim/lstrip blocks, loop controls).
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False, **_: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    return env


def render_chat_template(tok: ChatTokenizer, messages: list[dict], add_generation_prompt: bool = False,
                         where: str = "messages", tools: list[dict] | None = None) -> Example:
    """`messages` in the tokenizer's Jinja chat template, special tokens as ids (see module doc).

    Targets: each assistant message's content, plus the template text that follows it up to and
    including its first special token (the end-of-turn token, e.g. <|im_end|>, <|eot_id|>, </s>).

    Raises:
        ValueError: the template fails, or does not reproduce each message's content exactly once
            (a template that rewrites content cannot keep user text apart from special tokens).
    """
    env = getattr(tok, "_jinja_env", None) or _jinja_env()
    tok._jinja_env = env  # type: ignore[attr-defined]  # a cache on the tokenizer, made here on first use
    template = env.from_string(tok.chat_template)
    placeholders = [dict(m, content=f"\ue000xY{j}Yx\ue001") for j, m in enumerate(messages)]
    specials = {k: v for k, v in tok.extra_tokens.items()}
    specials.update(bos_token=tok.bos_token or "", eos_token=tok.eos_token)
    try:
        rendered = template.render(messages=placeholders, add_generation_prompt=add_generation_prompt,
                                   **({"tools": tools} if tools else {}), **specials)
    except Exception as e:  # noqa: BLE001 - a template error is the user's data/config problem
        raise ValueError(f"{where}: the chat template failed: {e}") from None
    pieces = _SENTINEL.split(rendered)  # [text, j, text, j, ..., text]
    seen = [int(j) for j in pieces[1::2]]
    if sorted(seen) != list(range(len(messages))):
        raise ValueError(
            f"{where}: the chat template did not render each message's content verbatim exactly once "
            f"(saw message indices {seen}); use the default template instead"
        )
    ids: list[int] = []
    target: list[bool] = []
    after_assistant = False
    for k, piece in enumerate(pieces):
        if k % 2 == 1:
            m = messages[int(piece)]
            content = tok.encode_text(m["content"] or "")
            after_assistant = m["role"] == "assistant"
            ids += content
            target += [after_assistant] * len(content)
            continue
        part = tok.encode_template(piece)
        flags = [False] * len(part)
        if after_assistant:
            for i, t in enumerate(part):
                flags[i] = True
                if tok.is_special(t):
                    break
            else:
                flags = [False] * len(part)  # no end-of-turn token: train only the content
            after_assistant = False
        ids += part
        target += flags
    return Example(ids, target)


def render_example(tok: ChatTokenizer, row: dict, template: str | None = None, where: str = "row") -> Example:
    """Tokenize one .jsonl row (prompt/completion or messages).

    template: None uses the tokenizer's chat template when it has one, else the default;
    `DEFAULT_TEMPLATE` forces the default.

    Raises:
        ValueError: a row with neither shape, or bad fields (naming `where`).
    """
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if "messages" in row:
        messages = _check_messages(row["messages"], where)
        tools = row.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise ValueError(f"{where}: `tools` must be a list of function objects")
        if tok.chat_template and template != DEFAULT_TEMPLATE:
            return render_chat_template(tok, messages, where=where, tools=tools)
        return render_default(tok, messages, tools=tools)
    if "prompt" in row and "completion" in row:
        if not isinstance(row["prompt"], str) or not isinstance(row["completion"], str):
            raise ValueError(f"{where}: `prompt` and `completion` must be strings")
        return render_prompt_completion(tok, row["prompt"], row["completion"])
    hint = ("; it is a preference pair: train on pairs with --finetune.objective dpo"
            if "chosen" in row and "rejected" in row else "")
    raise ValueError(f"{where}: a row needs `messages` (chat) or `prompt` and `completion`; it has {sorted(row)}{hint}")


def prompt_ids(tok: ChatTokenizer, messages: list[dict], template: str | None = None,
               tools: list[dict] | None = None) -> list[int]:
    """Ids of a conversation ending with the assistant's header, ready for generation.

    Rendered exactly as during training (same template, same special-token handling); generation
    should stop at `tok.eos_id` (default template) or the template's end-of-turn token.
    """
    messages = [_check_message(m, f"messages[{j}]") for j, m in enumerate(messages)]
    if tok.chat_template and template != DEFAULT_TEMPLATE:
        return render_chat_template(tok, messages, add_generation_prompt=True, tools=tools).ids
    return render_default(tok, messages, add_generation_prompt=True, tools=tools).ids
