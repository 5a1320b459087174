"""Moondream 2's request fields: images as base64 data URLs, the skill endpoints' bodies (Moondream's
own API: `image_url` plus `length`, `question` or `object`, `stream`, `settings`), and chat messages
that carry an image, answered as a query (one question about one image: Moondream 2 has no chat
turns; system messages are ignored).

Only the base64 is decoded here; the image itself is decoded and tiled in the engine process, on
its main thread, where a bad one is refused with a 400 like any invalid request."""
from __future__ import annotations

import base64
import binascii
from typing import Any

from ..models.moondream.skills import SPATIAL_SKILLS
from .openai_fields import FieldError
from .protocol import Skill

SKILL_ARGUMENT = {"caption": ("length", "normal"), "query": ("question", None), "point": ("object", None),
                  "detect": ("object", None)}
# fields an image chat cannot honour (Moondream's query takes temperature, top_p and max_tokens)
NOT_FOR_IMAGES = ("logprobs", "top_logprobs", "response_format", "guided_json", "guided_regex", "guided_choice",
                  "guided_grammar", "stop", "stop_token_ids", "seed", "top_k", "min_p", "presence_penalty",
                  "frequency_penalty", "repetition_penalty", "ignore_eos")


def decode_image_url(value: Any, param: str = "image_url") -> bytes:
    """A `data:image/...;base64,...` URL (or bare base64) to the image's bytes."""
    if isinstance(value, dict):  # (OpenAI's {"url": ...} form)
        value = value.get("url")
    if not isinstance(value, str) or not value:
        raise FieldError(param, f"{param} must be a base64 data URL (data:image/jpeg;base64,...)")
    if value.startswith(("http://", "https://")):
        raise FieldError(param, f"{param}: this server fetches no URLs; send the image inline as a base64 data URL")
    if value.startswith("data:"):
        head, sep, value = value.partition(",")
        if not sep or not head.endswith(";base64"):
            raise FieldError(param, f"{param} must be a base64 data URL (data:image/jpeg;base64,...)")
    try:
        image = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise FieldError(param, f"{param} is not valid base64: {e}") from None
    if not image:
        raise FieldError(param, f"{param} holds no image")
    return image


def skill_request(skill: str, body: dict[str, Any], request_id: str) -> Skill:
    """POST /v1/{caption,query,point,detect} as Moondream's API takes them."""
    name, default = SKILL_ARGUMENT[skill]
    argument = body.get(name, default)
    if not isinstance(argument, str) or not argument.strip():
        raise FieldError(name, f"{name} must be a non-empty string")
    settings = body.get("settings") or {}
    if not isinstance(settings, dict):
        raise FieldError("settings", "settings must be an object (temperature, top_p, max_tokens, max_objects)")
    if skill in SPATIAL_SKILLS and body.get("stream"):
        raise FieldError("stream", f"{skill} does not stream; its points or boxes come whole")
    return Skill(request_id, skill, decode_image_url(body.get("image_url")), argument, settings)


def chat_image_request(body: dict[str, Any], request_id: str) -> Skill | None:
    """A chat whose messages carry an image, as a Moondream query; None when none does."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not any(_parts(m, "image_url") for m in messages if isinstance(m, dict)):
        return None
    turns = [m for m in messages if not (isinstance(m, dict) and m.get("role") == "system")]
    if len(turns) != 1 or not isinstance(turns[0], dict) or turns[0].get("role") != "user":
        raise FieldError("messages", "with an image, send one user message (an image_url part and a text part): "
                                     "Moondream 2 answers one question about one image")
    images = _parts(turns[0], "image_url")
    if len(images) != 1:
        raise FieldError("messages", f"one image per request, got {len(images)}")
    question = "".join(str(p.get("text", "")) for p in _parts(turns[0], "text"))
    if not question.strip():
        raise FieldError("messages", "the message with the image needs a text part: the question")
    for name in NOT_FOR_IMAGES:
        if body.get(name) not in (None, False):
            raise FieldError(name, f"{name} is not supported with an image (Moondream's query takes temperature, "
                                   f"top_p and max_tokens)")
    if body.get("n", 1) != 1:
        raise FieldError("n", "n must be 1 with an image")
    settings = {}
    for field, setting in (("temperature", "temperature"), ("top_p", "top_p"),
                           ("max_completion_tokens", "max_tokens"), ("max_tokens", "max_tokens")):
        if body.get(field) is not None and setting not in settings:
            settings[setting] = body[field]
    return Skill(request_id, "query", decode_image_url(images[0].get("image_url"), "messages"), question, settings)


def _parts(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    content = message.get("content")
    return [p for p in content if isinstance(p, dict) and p.get("type") == kind] if isinstance(content, list) else []
