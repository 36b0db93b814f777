"""`raytrain data prepare --chat`: fine-tuning examples into tokens and the spans of them
whose loss is taken.

An example is a JSONL record with `messages` (a list of {role, content}) or `prompt` and
`response` strings. Its loss is taken on the assistant's turns (the response) only:

- with a chat template beside the `tokenizer.json` (where transformers reads it:
  `chat_template.jinja` and `additional_chat_templates/`, else `chat_template` in
  `tokenizer_config.json`; `--chat-template NAME` picks a named one), the conversation is
  rendered by that template
  (Jinja in a sandbox, as transformers renders it: its `{% generation %}` tag, loop
  controls, `tojson`, `raise_exception`; not `strftime_now`, so that the same input gives the
  same bytes on any day: templates that ask whether it is defined use their own date). A
  template that marks the trained text with `{% generation %}` ... `{% endgeneration %}` (as
  transformers' `return_assistant_tokens_mask` and TRL's assistant-only loss read it) trains
  exactly what it marks. Otherwise an assistant turn is the text the template adds between
  the conversation before it with the generation prompt and the conversation up to it: the
  turn's content and its closing tokens, which the model must learn to write. A prompt /
  response record is the messages user, assistant.
- without one, the tokens of each message follow each other, the assistant's trained, and
  the end-of-document token after the example is trained too (so the model learns to stop).

A token is trained when it overlaps text a template marks (as transformers' masks take it: a
token that begins before the mark but ends in it too), or, for turns found by rendering, when
the character it starts at lies in the turn. Hand-written here:
transformers' `apply_chat_template(return_assistant_tokens_mask=True)` needs the template to
mark turns with `{% generation %}`, which few shipped templates do, and transformers is not a
dependency of the data path; where a template marks them, the masks are transformers' own
(tests/pure/test_data_prepare.py compares them).

    encoder = ChatEncoder(tokenizer, Path("tokenizer.json"), eod_id)
    [(ids, trained)] = encoder.encode([(messages_of(record, "line 1"), "line 1")])
"""

from __future__ import annotations

import json
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable

import numpy as np

GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
Spans = list[tuple[int, int]]


class ChatError(ValueError):
    """An example or template that cannot be made into tokens and spans, with the fix."""


def load_template(tokenizer_path: Path, name: str | None = None
                  ) -> tuple[str | None, dict[str, str]]:
    """The chat template beside `tokenizer_path`, found where transformers finds it:
    `chat_template.jinja` (what transformers 5 writes, as 'default') and
    `additional_chat_templates/NAME.jinja`, which take priority over tokenizer_config.json's
    `chat_template` (a string, or a list of {name, template}). `name` picks one; else the
    'default'. None if the folder has none; ChatError for a template that cannot be used
    (unreadable, not text, a name it lacks, several with no default). Also the special
    tokens a template may name (special_tokens)."""
    folder = tokenizer_path.parent
    config = _tokenizer_config(folder)
    templates = _template_files(folder) or _config_templates(
        config.get("chat_template"), folder / "tokenizer_config.json")
    if name is not None:
        if name not in templates:
            raise ChatError(f"the tokenizer in {folder} has no chat template named {name!r} "
                            f"(it has: {', '.join(sorted(templates)) or 'none'}). To fix: "
                            "name one of those, or leave --chat-template out")
        return templates[name], _specials(config)
    if templates and "default" not in templates:
        raise ChatError(f"the tokenizer in {folder} has several chat templates and no default "
                        f"({', '.join(sorted(templates))}). To fix: pick one with "
                        "--chat-template NAME")
    return templates.get("default"), _specials(config)


def special_tokens(tokenizer_path: Path) -> dict[str, str]:
    """The special tokens (bos_token, eos_token, pad_token, unk_token) that the
    tokenizer_config.json beside `tokenizer_path` names; {} if there is none."""
    return _specials(_tokenizer_config(tokenizer_path.parent))


_FIX = "To fix: give the tokenizer's folder as save_pretrained wrote it"


def _tokenizer_config(folder: Path) -> dict[str, Any]:
    config_path = folder / "tokenizer_config.json"
    if not config_path.is_file():
        return {}
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ChatError(f"{config_path} is not a JSON object ({exc}). {_FIX}") from None
    if not isinstance(config, dict):
        raise ChatError(f"{config_path} is not a JSON object. {_FIX}")
    return config


def _specials(config: dict[str, Any]) -> dict[str, str]:
    specials = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            specials[key] = value
    return specials


def _template_files(folder: Path) -> dict[str, str]:
    """chat_template.jinja as 'default' and additional_chat_templates/*.jinja by name."""
    files = [(folder / "chat_template.jinja", "default")]
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        files += [(path, path.stem) for path in sorted(extra.glob("*.jinja"))]
    templates = {}
    for path, name in files:
        if path.is_file():
            try:
                templates[name] = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ChatError(f"{path} cannot be read as a chat template ({exc}). "
                                f"{_FIX}") from None
    return templates


def _config_templates(entry: Any, config_path: Path) -> dict[str, str]:
    """tokenizer_config.json's `chat_template`: a string, or [{name, template}, ...]."""
    if entry is None:
        return {}
    if isinstance(entry, str):
        return {"default": entry}
    if isinstance(entry, list) and all(
            isinstance(e, dict) and isinstance(e.get("name"), str)
            and isinstance(e.get("template"), str) for e in entry):
        return {e["name"]: e["template"] for e in entry}
    raise ChatError(f"{config_path}'s chat_template is neither a template nor a list of "
                    f"{{name, template}} ({type(entry).__name__}). {_FIX}")


def _environment() -> Any:
    """A sandboxed Jinja environment as transformers makes one for chat templates (module
    doc), with its `{% generation %}` tag recording the character ranges it renders."""
    from jinja2 import nodes
    from jinja2.exceptions import TemplateError
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_marked"), [], [], body).set_lineno(lineno)

        def _marked(self, caller: Callable[[], str]) -> str:
            text = caller()
            tracking = GENERATION_SPANS.get()
            if tracking is not None:  # (the blocks rendered so far, the spans)
                start = sum(len(block) for block in tracking[0])
                tracking[1].append((start, start + len(text)))
            return text

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


GENERATION_SPANS: ContextVar[tuple[list[str], Spans] | None] = ContextVar(
    "raytrain_generation_spans", default=None)


def _renderer(template: str, specials: dict[str, str]
              ) -> Callable[[list[Any], bool], tuple[str, Spans]]:
    """render(messages, generation prompt) -> (text, the ranges `{% generation %}` marked)."""
    from jinja2.exceptions import TemplateError

    try:
        compiled = _environment().from_string(template)
    except TemplateError as exc:
        raise ChatError(f"the tokenizer's chat template does not compile: {exc}. To fix: give "
                        "a tokenizer_config.json whose chat_template transformers renders") \
            from None

    def render(messages: list[Any], generation_prompt: bool) -> tuple[str, Spans]:
        blocks: list[str] = []
        spans: Spans = []
        token = GENERATION_SPANS.set((blocks, spans))
        try:
            for block in compiled.generate(messages=messages,
                                           add_generation_prompt=generation_prompt, **specials):
                blocks.append(block)
        except TemplateError as exc:
            raise ChatError(f"the chat template refused the example: {exc}") from None
        finally:
            GENERATION_SPANS.reset(token)
        return "".join(blocks), spans
    return render


# Roles the common templates know; one a letter or two from them is a misspelling, refused
# (another role passes: a template may have its own).
ROLES = ("system", "user", "assistant", "tool", "developer", "ipython", "function")


def messages_of(record: Any, where: str) -> list[dict[str, str]]:
    """The conversation of one record (`where`: its file and line): its `messages`, or
    `prompt` and `response`; ChatError naming the field that is wrong, with the fix."""
    import difflib

    shape = ("To fix: each line holds `messages` (a list of {role, content}) or `prompt` and "
             "`response` strings")
    if isinstance(record, dict) and "messages" in record:
        messages = record["messages"]
        if not isinstance(messages, list) or not messages:
            raise ChatError(f"{where}: messages is not a list of turns. {shape}")
        for n, message in enumerate(messages):
            for key in ("role", "content"):
                if not isinstance(message, dict) or not isinstance(message.get(key), str):
                    raise ChatError(f"{where}: messages[{n}].{key} is not a string. {shape}")
            role = message["role"]
            close = difflib.get_close_matches(role, ROLES, n=1, cutoff=0.75)
            if role not in ROLES and close:
                raise ChatError(f"{where}: messages[{n}].role is {role!r}; did you mean "
                                f"{close[0]!r}? To fix: spell the role as the template "
                                f"names it ({', '.join(ROLES[:4])})")
        return [{"role": m["role"], "content": m["content"]} for m in messages]
    if isinstance(record, dict) and ("prompt" in record or "response" in record):
        for key in ("prompt", "response"):
            if not isinstance(record.get(key), str):
                raise ChatError(f"{where}: {key} is not a string. {shape}")
        return [{"role": "user", "content": record["prompt"]},
                {"role": "assistant", "content": record["response"]}]
    raise ChatError(f"{where} is not an example: with --chat each line holds `messages` (a "
                    "list of {role, content}) or `prompt` and `response` strings")


class ChatEncoder:
    """Examples into (token ids, trained flags), by the template when there is one."""

    def __init__(self, tokenizer: Any, tokenizer_path: Path, eod_id: int,
                 template_name: str | None = None) -> None:
        self.tokenizer, self.eod_id = tokenizer, eod_id
        template, specials = load_template(tokenizer_path, template_name)
        self.render = _renderer(template, specials) if template else None
        self.marked = bool(template and GENERATION_TAG.search(template))

    @property
    def templated(self) -> bool:
        return self.render is not None

    def encode(self, examples: list[tuple[list[dict[str, str]], str]]
               ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each (messages, where) example's token ids (its end-of-document token last) and
        whether each id's loss is taken; the templated texts encoded in one batch."""
        for messages, where in examples:
            if not any(m["role"] == "assistant" for m in messages):
                raise ChatError(f"{where} has no assistant turn to train on (roles: "
                                f"{', '.join(m['role'] for m in messages)}). To fix: give each "
                                "example an assistant turn, or pass --skip-bad")
        if self.render is None:
            return [self._plain(messages) for messages, _ in examples]
        rendered = [self._rendered(messages, where) for messages, where in examples]
        encodings = self.tokenizer.encode_batch([text for text, _ in rendered],
                                                add_special_tokens=False)
        out = []
        for encoding, (_, spans) in zip(encodings, rendered):
            offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
            starts, ends = offsets[:, 0], offsets[:, 1]
            trained = np.zeros(len(starts), dtype=bool)
            for first, end in spans:
                # Marked text: every token that overlaps it, one that begins before the
                # mark included (transformers' assistant masks); a turn found by rendering:
                # the tokens that begin in it.
                trained |= (starts < end) & ((ends > first) if self.marked else
                                             (starts >= first))
            ids = np.asarray(encoding.ids + [self.eod_id], dtype=np.int64)
            out.append((ids, np.append(trained, False)))  # the template closed the turn
        return out

    def _rendered(self, messages: list[dict[str, str]], where: str
                  ) -> tuple[str, list[tuple[int, int]]]:
        """The conversation's text and the character spans of its assistant turns."""
        assert self.render is not None
        text, marked = self.render(messages, False)
        if self.marked:  # the template says what is trained
            if not marked:
                raise ChatError(f"{where}: the chat template marks no text of it with "
                                "{% generation %}, so nothing would be trained. To fix: mark "
                                "the assistant's turns in the template, or give examples "
                                "with an assistant turn it marks")
            return text, marked
        spans = []
        for turn, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self.render(messages[:turn], True)[0]
            upto = self.render(messages[:turn + 1], False)[0]
            if not (upto.startswith(before) and text.startswith(upto)):
                raise ChatError(f"{where}: the chat template does not render a conversation "
                                "as the conversation before it plus the new turn, so the "
                                "assistant's tokens cannot be told apart. To fix: give a "
                                "tokenizer_config.json whose template does, or none (the "
                                "messages' tokens one after the other)")
            spans.append((len(before), len(upto)))
        return text, spans

    def _plain(self, messages: list[dict[str, str]]) -> tuple[np.ndarray, np.ndarray]:
        encoded = self.tokenizer.encode_batch([m["content"] for m in messages],
                                              add_special_tokens=False)
        ids = [np.asarray(e.ids, dtype=np.int64) for e in encoded]
        trained = [np.full(len(i), m["role"] == "assistant") for i, m in zip(ids, messages)]
        return (np.concatenate([*ids, [self.eod_id]]),
                np.concatenate([*trained, [messages[-1]["role"] == "assistant"]]))


def spans_of(trained: np.ndarray) -> np.ndarray:
    """The runs of True in `trained`, as [start, end) rows (int64 [n, 2])."""
    padded = np.concatenate([[False], trained, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return edges.reshape(-1, 2)
