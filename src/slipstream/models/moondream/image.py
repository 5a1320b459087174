"""Images in: decoding (PIL image, path or bytes), and the overlap-crop tiling into a global crop
and up to 12 local crops (spec §3), done on the submitting thread, never the loop's.

Crops stay uint8 until the device normalises them (4x less to copy than floats)."""
from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, UnidentifiedImageError

from .config import VisionConfig

MAX_PIXELS = 64_000_000  # larger images are refused at submit (PIL's own bomb guard is ~179M)


@dataclass
class ImageCrops:
    """An image tiled for the vision encoder: crops [1 + th*tw, 3, C, C] uint8 (crop 0 the global
    one, then local tiles row-major) and the tiling (th, tw)."""

    crops: torch.Tensor
    tiling: tuple[int, int]
    size: tuple[int, int]  # the original (width, height)


def load_image(image: Image.Image | str | Path | bytes) -> Image.Image:
    """A PIL image in 8-bit RGB from a PIL image, a path or encoded bytes; anything unreadable,
    empty or absurdly large is a ValueError naming the problem."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        if not len(image):
            raise ValueError("image bytes are empty")
        source, opened = "image bytes", _open(io.BytesIO(bytes(image)), "image bytes")
    elif isinstance(image, (str, Path)):
        path = Path(image).expanduser()
        if not path.is_file():
            raise ValueError(f"image file {str(path)!r} does not exist")
        source, opened = str(path), _open(path, str(path))
    elif isinstance(image, Image.Image):
        source, opened = "the PIL image", image
    else:
        raise TypeError(f"an image is a PIL image, a path or bytes, got {type(image).__name__}")
    w, h = opened.size
    if w < 1 or h < 1:
        raise ValueError(f"{source} is empty ({w}x{h} pixels)")
    if w * h > MAX_PIXELS:
        raise ValueError(f"{source} has {w}x{h} pixels, more than the {MAX_PIXELS:,} accepted; downscale it first")
    try:
        # (CMYK, palette, greyscale, 16-bit: converted; an alpha channel is dropped, as the reference does)
        return opened.convert("RGB")
    except (OSError, ValueError) as e:
        raise ValueError(f"{source} cannot be decoded: {e}") from None


def _open(fp, source: str) -> Image.Image:
    try:
        img = Image.open(fp)
        img.load()
        return img
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise ValueError(f"{source} is not a readable image ({e})") from None


def select_tiling(height: int, width: int, crop: int, max_crops: int) -> tuple[int, int]:
    """Local tiles (rows, columns) for an image of this size minus its margins (spec §3.2)."""
    if height <= crop or width <= crop:
        return 1, 1
    min_h, min_w = math.ceil(height / crop), math.ceil(width / crop)
    if min_h * min_w > max_crops:
        ratio = math.sqrt(max_crops / (min_h * min_w))
        return max(1, math.floor(min_h * ratio)), max(1, math.floor(min_w * ratio))
    h_tiles = max(math.floor(math.sqrt(max_crops * height / width)), min_h)
    w_tiles = max(math.floor(math.sqrt(max_crops * width / height)), min_w)
    if h_tiles * w_tiles > max_crops:
        if w_tiles > h_tiles:
            w_tiles = math.floor(max_crops / h_tiles)
        else:
            h_tiles = math.floor(max_crops / w_tiles)
    return max(1, h_tiles), max(1, w_tiles)


def make_crops(image: Image.Image, cfg: VisionConfig) -> ImageCrops:
    """The global crop (the whole image resized to C x C, aspect ignored) and the local tiles of the
    image resized to th*W + 2m by tw*W + 2m, W the usable window (Lanczos, as the reference's PIL path)."""
    c, margin = cfg.crop_size, cfg.overlap_margin * cfg.enc_patch_size
    window = c - 2 * margin
    w, h = image.size
    th, tw = select_tiling(h - 2 * margin, w - 2 * margin, window, cfg.max_crops)
    crops = np.empty((1 + th * tw, c, c, 3), np.uint8)
    crops[0] = np.asarray(image.resize((c, c), Image.LANCZOS))
    tiled = np.asarray(image.resize((tw * window + 2 * margin, th * window + 2 * margin), Image.LANCZOS))
    for i in range(th):
        for j in range(tw):
            crops[1 + i * tw + j] = tiled[i * window:i * window + c, j * window:j * window + c]
    return ImageCrops(torch.from_numpy(crops).permute(0, 3, 1, 2).contiguous(), (th, tw), (w, h))


def draw_marks(image: Image.Image | str | Path | bytes, marks: list[dict[str, float]], out: Path) -> None:
    """Write the image with point/detect results drawn on it (coordinates are fractions of its size)."""
    img = load_image(image)
    draw = ImageDraw.Draw(img)
    w, h = img.size
    r = max(3, min(w, h) // 100)
    for m in marks:
        if "x" in m:
            x, y = m["x"] * w, m["y"] * h
            draw.ellipse((x - r, y - r, x + r, y + r), outline=(255, 0, 0), width=max(1, r // 2))
        else:
            draw.rectangle((m["x_min"] * w, m["y_min"] * h, m["x_max"] * w, m["y_max"] * h), outline=(255, 0, 0),
                           width=max(1, r // 2))
    img.save(out)
