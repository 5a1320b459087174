"""OpenAI request fields -> the engine's request (prompt or messages, SamplingParams fields, n),
with an error naming the field.

Defaults are OpenAI's (temperature 1, completions' max_tokens 16, chat's up to the context);
vLLM's extras are accepted under their names: top_k, min_p, repetition_penalty, ignore_eos,
stop_token_ids, guided_json / guided_regex / guided_choice / guided_grammar. Logprobs: completions'
`logprobs` (top n), chat's `logprobs` + `top_logprobs`, each up to 20. A prompt is refused before it
is tokenized when its text is longer than the context could hold."""
from __future__ import annotations

from typing import Any


class FieldError(ValueError):
    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


NUMBERS = {"temperature": float, "top_p": float, "min_p": float, "presence_penalty": float,
           "frequency_penalty": float, "repetition_penalty": float, "top_k": int, "seed": int}
UNSUPPORTED = ("logit_bias", "tools", "functions", "suffix", "echo", "best_of")
MAX_N = 128
MAX_LOGPROBS = 20


def sampling_fields(body: dict[str, Any], chat: bool, max_model_len: int) -> dict[str, Any]:
    """The SamplingParams keyword arguments a request body asks for."""
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False, 0):
            raise FieldError(name, f"{name} is not supported by this server yet")
    out: dict[str, Any] = {"temperature": 1.0}
    for name, kind in NUMBERS.items():
        if body.get(name) is not None:
            value = body[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
                raise FieldError(name, f"{name} must be a{'n integer' if kind is int else ' number'}, got {value!r}")
            out[name] = kind(value)
    if out.get("top_k") == -1:  # (vLLM's and the OpenAI clients' "disabled")
        out["top_k"] = 0
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = max_model_len if chat else 16
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise FieldError("max_tokens", f"max_tokens must be an integer >= 1, got {max_tokens!r}")
    out["max_tokens"] = max_tokens
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise FieldError("stop", f"stop must be a non-empty string or a list of them, got {stop!r}")
        out["stop"] = stop
    for name in ("ignore_eos", "stop_token_ids"):
        if body.get(name) is not None:
            out[name] = body[name]
    out.update(_structured(body))
    logprobs = _logprobs(body, chat)
    if logprobs is not None:
        out["logprobs"] = logprobs
    return out


def choices(body: dict[str, Any]) -> int:
    n = body.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise FieldError("n", f"n must be an integer in [1, {MAX_N}], got {n!r}")
    return n


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """Top alternatives per token asked for: completions' `logprobs: k`; chat's `logprobs: true`
    with `top_logprobs: k` (0 without it)."""
    if chat:
        wanted, top = body.get("logprobs"), body.get("top_logprobs")
        if wanted not in (None, True, False):
            raise FieldError("logprobs", f"logprobs must be a boolean for chat, got {wanted!r}")
        if top is not None and not wanted:
            raise FieldError("top_logprobs", "top_logprobs needs logprobs: true")
        if not wanted:
            return None
        name, value = "top_logprobs", 0 if top is None else top
    else:
        name, value = "logprobs", body.get("logprobs")
        if value is None:
            return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS:
        raise FieldError(name, f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {value!r}")
    return value


def completion_prompt(body: dict[str, Any], max_model_len: int, max_prompt_bytes: int) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # (a batch of one, as the openai client sends a single prompt sometimes)
    if isinstance(prompt, str) and prompt:
        _fits(len(prompt.encode()), max_prompt_bytes, "prompt")
        return prompt
    if isinstance(prompt, list) and prompt and set(map(type, prompt)) == {int}:  # (bools and int subclasses refused)
        if len(prompt) >= max_model_len:
            raise FieldError("prompt", f"prompt has {len(prompt)} tokens; the model's context is {max_model_len}, "
                                       f"which leaves no room to generate")
        return prompt
    raise FieldError("prompt", "prompt must be a non-empty string or list of token ids (one prompt a request)")


def chat_messages(body: dict[str, Any], max_prompt_bytes: int) -> list[dict[str, Any]]:
    """The conversation with text content (a list of text parts joined); images are refused here
    (a Moondream server takes them: images.py)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise FieldError("messages", "messages must be a non-empty list of objects")
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise FieldError("messages", "this model reads text only: content parts must be of type text "
                                             "(image_url parts need a Moondream 2 model)")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str) or not isinstance(message.get("role"), str):
            raise FieldError("messages", "each message needs a role and text content")
        out.append({"role": message["role"], "content": content})
    _fits(sum(len(m["content"].encode()) for m in out), max_prompt_bytes, "messages")
    return out


def _fits(size: int, max_prompt_bytes: int, param: str) -> None:
    if size > max_prompt_bytes:
        raise FieldError(param, f"{param} has {size} bytes of text, more than the model's context can hold as "
                                f"tokens ({max_prompt_bytes} bytes at most); shorten it")


def _structured(body: dict[str, Any]) -> dict[str, Any]:
    fmt = body.get("response_format")
    chosen: dict[str, Any] = {}
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_object":
            chosen["json_object"] = True
        elif kind == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema")
            if not isinstance(schema, dict):
                raise FieldError("response_format", "response_format json_schema needs json_schema.schema, an object")
            chosen["json_schema"] = schema
        elif kind != "text":
            raise FieldError("response_format", f"response_format type must be text, json_object or json_schema, "
                                                f"got {kind!r}")
    for extra, name in (("guided_json", "json_schema"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                        ("guided_grammar", "grammar")):
        if body.get(extra) is not None:
            chosen[name] = body[extra]
    if len(chosen) > 1:
        raise FieldError("response_format", f"at most one structured output option, got {', '.join(chosen)}")
    return chosen
