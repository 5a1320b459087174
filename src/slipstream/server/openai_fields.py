"""OpenAI request fields -> the engine's SamplingParams fields, with an error naming the field.

Defaults are OpenAI's (temperature 1, completions' max_tokens 16, chat's up to the context);
vLLM's extras are accepted under their names: top_k, min_p, repetition_penalty, ignore_eos,
stop_token_ids, guided_json / guided_regex / guided_choice / guided_grammar."""
from __future__ import annotations

from typing import Any


class FieldError(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


NUMBERS = {"temperature": float, "top_p": float, "min_p": float, "presence_penalty": float,
           "frequency_penalty": float, "repetition_penalty": float, "top_k": int, "seed": int}
UNSUPPORTED = ("logprobs", "top_logprobs", "logit_bias", "tools", "functions", "suffix", "echo", "best_of")


def sampling_fields(body: dict[str, Any], chat: bool, max_model_len: int) -> dict[str, Any]:
    """The SamplingParams keyword arguments a request body asks for."""
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False, 0):
            raise FieldError(name, f"{name} is not supported by this server yet")
    if body.get("n", 1) != 1:
        raise FieldError("n", "n must be 1 (several choices per request are not supported yet)")
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
    return out


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
