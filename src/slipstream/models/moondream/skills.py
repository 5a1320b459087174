"""Moondream 2's skills on the host (spec §1.5, §7): their prompts, their sampling defaults, and the
point/detect state machine followed at commit, which turns the committed tokens and the bins the
device decoded into points and boxes. The device runs the same machine a step ahead (heads.py)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .config import TokenizerConfig
from .region import COORD_BINS, size_value
import torch

STATE_X, STATE_Y, STATE_S = 0, 1, 2  # point/detect: decide (or stop), the y coordinate, the size
CAPTION_LENGTHS = ("short", "normal", "long")
SPATIAL_SKILLS = ("point", "detect")  # (their answers are points or boxes, not text)
SKILLS = ("caption", "query", *SPATIAL_SKILLS)
# the reference's defaults (spec §7.2); point and detect are always greedy
DEFAULT_SETTINGS = {"temperature": 0.5, "top_p": 0.3, "max_tokens": 768, "max_objects": 50}


class Skill(enum.IntEnum):
    """A sequence row's skill code, staged per row for the device rules (heads.py)."""

    NONE = 0  # plain text generation
    TEXT = 1  # caption or query: the answer id is banned after the first token
    POINT = 2
    DETECT = 3


def settings_dict(settings: dict[str, Any] | None) -> dict[str, Any]:
    """The moondream client's `settings` over the reference's defaults, and slipstream's own `lora`
    (a loaded adapter's name); unknown keys are errors."""
    out = {**DEFAULT_SETTINGS, "lora": None}
    for key, value in (settings or {}).items():
        if key not in out:
            raise ValueError(f"unknown setting {key!r}; Moondream skills take {', '.join(out)}")
        out[key] = value
    if not isinstance(out["max_objects"], int) or out["max_objects"] < 1:
        raise ValueError(f"max_objects must be a positive integer, got {out['max_objects']!r}")
    return out


def caption_prompt(tok: TokenizerConfig, length: str) -> list[int]:
    if length not in CAPTION_LENGTHS:
        raise ValueError(f"caption length must be one of {', '.join(CAPTION_LENGTHS)}, got {length!r}")
    return list(tok.templates["caption"][length])


def query_prompt(tok: TokenizerConfig, question_ids: list[int]) -> list[int]:
    """prefix + question + suffix twice: the reference's direct answer doubles the answer id."""
    t = tok.templates["query"]
    return [*t["prefix"], *question_ids, *t["suffix"], *t["suffix"]]


def object_prompt(tok: TokenizerConfig, skill: str, object_ids: list[int]) -> list[int]:
    """detect / point: prefix + enc(" " + object) + suffix."""
    t = tok.templates[skill]
    return [*t["prefix"], *object_ids, *t["suffix"]]


@dataclass
class SpatialSkill:
    """point or detect as the committed tokens drive it: each object is decided at X (EOS stops),
    then its x and y (and for detect its size) come from the bins of the steps that follow."""

    detect: bool
    max_objects: int
    eos: int
    state: int = STATE_X
    objects: list[dict[str, float]] = field(default_factory=list)
    done: bool = False
    _x: float = 0.0
    _y: float = 0.0

    def advance(self, token: int, bins: torch.Tensor | list[int]) -> None:
        coord = int(bins[0]) / COORD_BINS
        if self.state == STATE_X:
            if token == self.eos:
                self.done = True
                return
            self._x, self.state = coord, STATE_Y
        elif self.state == STATE_Y:
            self._y = coord
            if self.detect:
                self.state = STATE_S
            else:
                self.objects.append({"x": self._x, "y": self._y})
                self.state = STATE_X
        else:
            w, h = (float(v) for v in size_value(torch.tensor([int(bins[1]), int(bins[2])])))
            self.objects.append({"x_min": self._x - w / 2, "y_min": self._y - h / 2,
                                 "x_max": self._x + w / 2, "y_max": self._y + h / 2})
            self.state = STATE_X
        if len(self.objects) >= self.max_objects:
            self.done = True

    def max_steps(self) -> int:
        """Steps that decode max_objects objects and the final decision: 2N+1 (point), 3N+1 (detect)."""
        return (3 if self.detect else 2) * self.max_objects + 1
