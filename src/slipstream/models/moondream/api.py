"""Moondream 2's skills on `LLM`, as the moondream Python client names them:
`caption`, `query`, `point`, `detect` (and `encode_image`), each taking a PIL image, a path, bytes
or an encoded image. Images are decoded and their tiling chosen here, on the caller's thread; the
request then runs in the engine's pipelined loop beside text requests, its crops made on the
device in its prefix's step (image.py)."""
from __future__ import annotations

import weakref
from typing import Any, Callable, Iterator

from ...sampling import SamplingParams
from ...scheduler import ImagePrefix, Sequence
from .config import PREFIX_LEN
from .image import load_image, prepare_image
from .skills import (SPATIAL_SKILLS, Skill, SpatialSkill, caption_prompt, object_prompt, query_prompt,
                     settings_dict)


class EncodedImage:
    """An image decoded once (`LLM.encode_image`), whose prefix in the KV cache (BOS + 729
    image positions, encoded by the first request on it) later requests reuse without running the
    encoder or the prefix's prefill again. Its pages are held until `close()` (or the `with` block's
    end, or garbage collection) and every request on it has ended."""

    def __init__(self, prefix: ImagePrefix, release: Callable[[ImagePrefix], None] | None) -> None:
        self.prefix = prefix
        self._finalizer = weakref.finalize(self, release, prefix) if release is not None else None

    @property
    def size(self) -> tuple[int, int]:
        return self.prefix.crops.size

    def close(self) -> None:
        """Release the handle's hold on its prefix's KV pages (requests on it keep theirs)."""
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> "EncodedImage":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class MoondreamAPI:
    """Mixed into `LLM`; every method raises ValueError on a model that is not Moondream 2."""

    def _moondream(self):
        if self.core.moondream is None:
            raise ValueError("this model is not Moondream 2: caption, query, point and detect need a Moondream 2 "
                             "checkpoint (config.json model_type 'moondream1'), e.g. random:tiny-moondream")
        return self.core.moondream

    def encode_image(self, image: Any) -> EncodedImage:
        """Decode an image once; requests on the handle share its prefix's KV pages."""
        return EncodedImage(self._prefix(image, holders=1), self._release_prefix)

    def _prefix(self, image: Any, holders: int = 0) -> ImagePrefix:
        """The image prefix of a request: the handle's, or a new one for this request alone."""
        cfg = self._moondream()
        if isinstance(image, EncodedImage):
            if image._finalizer is None or not image._finalizer.alive:
                raise ValueError("this encoded image was closed; encode the image again")
            return image.prefix
        prepared = prepare_image(load_image(image), cfg.vision, pin=self.core.layer.is_cuda)
        return ImagePrefix(prepared, PREFIX_LEN, holders)

    def _release_prefix(self, prefix: ImagePrefix) -> None:
        if self._error is None and not self._stopping:
            self._post("release", prefix)

    def caption(self, image: Any, length: str = "normal", stream: bool = False,
                settings: dict[str, Any] | None = None) -> dict[str, str | Iterator[str]]:
        return {"caption": self._text_skill(image, "caption", length, settings, stream)}

    def query(self, image: Any, question: str, stream: bool = False,
              settings: dict[str, Any] | None = None) -> dict[str, str | Iterator[str]]:
        return {"answer": self._text_skill(image, "query", question, settings, stream)}

    def point(self, image: Any, object: str, settings: dict[str, Any] | None = None) -> dict[str, list]:
        return {"points": self._run(self.skill_sequence(image, "point", object, settings)).objects}

    def detect(self, image: Any, object: str, settings: dict[str, Any] | None = None) -> dict[str, list]:
        return {"objects": self._run(self.skill_sequence(image, "detect", object, settings)).objects}

    def skill_sequence(self, image: Any, skill: str, argument: str, settings: dict[str, Any] | None = None,
                       on_token: Callable[[int, int, str], None] | None = None) -> Sequence:
        """A validated request of one skill, ready for `enqueue`: `argument` is caption's length,
        query's question, or point's and detect's object. Its output's `objects` are the points or
        boxes of point and detect."""
        cfg = self._moondream()
        s = settings_dict(settings)
        if skill in ("caption", "query"):
            if skill == "caption":
                prompt = caption_prompt(cfg.tokenizer, argument)
            elif isinstance(argument, str) and argument.strip():
                prompt = query_prompt(cfg.tokenizer, self.tokenizer.encode(argument))
            else:
                raise ValueError("question must be a non-empty string")
            params = SamplingParams(temperature=s["temperature"], top_p=s["top_p"], max_tokens=s["max_tokens"],
                                    lora=s["lora"])
            return self.core.make_image_sequence(self._prefix(image), prompt, params, Skill.TEXT, on_token=on_token)
        if skill not in SPATIAL_SKILLS:
            raise ValueError(f"unknown skill {skill!r}; Moondream 2's are caption, query, point and detect")
        if not isinstance(argument, str) or not argument.strip():
            raise ValueError("object must be a non-empty string")
        detect = skill == "detect"
        prompt = object_prompt(cfg.tokenizer, skill, self.tokenizer.encode(" " + argument))
        spatial = SpatialSkill(detect, s["max_objects"], cfg.tokenizer.eos_id)
        params = SamplingParams(temperature=0.0, max_tokens=min(s["max_tokens"], spatial.max_steps()), lora=s["lora"])
        return self.core.make_image_sequence(self._prefix(image), prompt, params,
                                             Skill.DETECT if detect else Skill.POINT, spatial, on_token)

    def _text_skill(self, image: Any, skill: str, argument: str, settings: dict[str, Any] | None,
                    stream: bool) -> str | Iterator[str]:
        if stream:
            return self._stream(lambda on_token: self.skill_sequence(image, skill, argument, settings, on_token))
        return self._run(self.skill_sequence(image, skill, argument, settings)).text
