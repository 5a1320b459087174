"""Images in: decoding (PIL image, path or bytes) and the choice of the overlap-crop tiling on the
submitting thread; the tiling itself (a global crop and up to 12 local crops, spec §3) on the
engine's device, inside the image's prefill step.

The resizes are Pillow's 8-bit Lanczos, bit for bit, as matrix products: Pillow resamples in two
passes (horizontal, then vertical, each rounded to 8 bits) with fixed-point weights (22 fraction
bits) it derives from the sizes alone. `resize_plan` derives the same integer weights on the host
(they are cached per pair of sizes); on CUDA each pass is one Triton launch summing the taps in
int32 (kernels.resample), elsewhere one float64 product by the dense weights, exact since every
partial sum is an integer below 2^31. An 800x600 image costs ~20 ms of host time through PIL and
a fraction of a millisecond on the H200, and only its pixels (4x less than its crops) travel."""
from __future__ import annotations

import functools
import hashlib
import io
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, UnidentifiedImageError

from ...kernels import HAS_TRITON
from .config import VisionConfig

MAX_PIXELS = 64_000_000  # larger images are refused at submit (PIL's own bomb guard is ~179M)
PRECISION_BITS = 22  # Pillow's fixed-point weights in its 8-bit resampling (32 - 8 - 2)
LANCZOS_SUPPORT = 3.0
HASH_CHUNK = 1 << 18  # bytes of pixels a hashing thread digests at a time; the image's key hashes their digests


@dataclass
class ImageCrops:
    """An image ready for the vision encoder: its pixels (uint8 [H, W, 3]), the tiling (th, tw) and
    the resize plans of its global crop and of its tiled image (`resize_plans`), from which the
    device makes its 1 + th*tw crops (`make_crops`)."""

    pixels: torch.Tensor
    tiling: tuple[int, int]
    size: tuple[int, int]  # the original (width, height)
    plans: tuple[torch.Tensor, ...]
    digest: bytes = b""  # a hash of the pixels: the prefix cache's key for this image's prefix

    @property
    def count(self) -> int:
        return 1 + self.tiling[0] * self.tiling[1]


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
    if opened.mode == "RGB":  # (read, never written: no copy)
        return opened
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


def image_tiling(size: tuple[int, int], cfg: VisionConfig) -> tuple[int, int]:
    """The local tiles (rows, columns) of an image of `size` (width, height): spec §3.2's select_tiling
    of its size less the overlap margins, by the stride of a crop less them."""
    margin = cfg.overlap_margin * cfg.enc_patch_size
    return select_tiling(size[1] - 2 * margin, size[0] - 2 * margin, cfg.crop_size - 2 * margin, cfg.max_crops)


def prepare_image(image: Image.Image, cfg: VisionConfig, pin: bool = False) -> ImageCrops:
    """The host's part: the tiling and the resize plans of an RGB image, its pixels copied once (into
    page-locked memory where `pin`, so their upload to the device is asynchronous) and hashed. On
    the submitting thread, inside a request's latency: np.asarray and SHA-256 take an 800x600
    image's pixels in 0.6 + 1.3 ms on the CPU machine (np.array and BLAKE2b took 3.2 + 3.2), so the
    pixels are hashed in chunks on the hashing threads (hashlib lets go of the interpreter lock)
    while this thread copies them."""
    c, margin = cfg.crop_size, cfg.overlap_margin * cfg.enc_patch_size
    window = c - 2 * margin
    w, h = image.size
    th, tw = image_tiling(image.size, cfg)
    tiled_w, tiled_h = tw * window + 2 * margin, th * window + 2 * margin
    plans = tuple(torch.from_numpy(resize_plan(n, out)) for n, out in ((w, c), (h, c), (w, tiled_w), (h, tiled_h)))
    if pin:
        plans = tuple(plan.pin_memory() for plan in plans)
    source = np.asarray(image)  # (read-only, PIL's own bytes)
    data = source.reshape(-1).data
    chunks = [_hashing_threads().submit(_sha256, data[i:i + HASH_CHUNK]) for i in range(0, len(data), HASH_CHUNK)]
    pixels = torch.empty(source.shape, dtype=torch.uint8, pin_memory=pin)
    pixels.numpy()[...] = source
    digest = hashlib.sha256(f"{w}x{h}:".encode())
    for chunk in chunks:
        digest.update(chunk.result())
    return ImageCrops(pixels, (th, tw), (w, h), plans, digest.digest()[:16])


def _sha256(chunk: memoryview) -> bytes:
    return hashlib.sha256(chunk).digest()


@functools.cache
def _hashing_threads() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="slipstream-image-hash")


@functools.lru_cache(maxsize=256)
def resize_plan(size: int, out: int) -> np.ndarray:
    """Pillow's 8-bit Lanczos weights along one axis from `size` to `out` samples (its
    precompute_coeffs and normalize_coeffs_8bpc): int64 [2, out, taps], the input index of each
    tap and its weight in units of 2^-22 (0 for the taps past an edge)."""
    scale = size / out
    filterscale = max(scale, 1.0)
    support = LANCZOS_SUPPORT * filterscale
    taps = math.ceil(support) * 2 + 1
    center = (np.arange(out) + 0.5) * scale
    first = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
    last = np.minimum(np.trunc(center + support + 0.5), size).astype(np.int64)
    index = first[:, None] + np.arange(taps)[None, :]
    valid = index < last[:, None]
    weight = np.where(valid, _lanczos((index - center[:, None] + 0.5) * (1.0 / filterscale)), 0.0)
    total = weight.sum(axis=1, keepdims=True)
    weight = np.divide(weight, total, out=weight, where=total != 0)
    scaled = weight * (1 << PRECISION_BITS)
    fixed = np.trunc(np.where(scaled < 0, scaled - 0.5, scaled + 0.5)).astype(np.int64)
    return np.stack([np.where(valid, index, 0), np.where(valid, fixed, 0)])


def _lanczos(x: np.ndarray) -> np.ndarray:
    def sinc(v: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(v == 0, 1.0, np.sin(v * np.pi) / (v * np.pi))

    return np.where((-LANCZOS_SUPPORT <= x) & (x < LANCZOS_SUPPORT), sinc(x) * sinc(x / 3), 0.0)


def _weights(plan: torch.Tensor, size: int) -> torch.Tensor:
    """A plan's dense [out, size] float64 weight matrix, on the plan's device."""
    weights = torch.zeros(plan.shape[1], size, dtype=torch.float64, device=plan.device)
    return weights.scatter_add_(1, plan[0], plan[1].to(torch.float64))


def _rounded(summed: torch.Tensor) -> torch.Tensor:
    """Pillow's clip8: the fixed-point sum plus one half, shifted down, clamped to a byte."""
    half = float(1 << (PRECISION_BITS - 1))
    return torch.floor((summed + half) / (1 << PRECISION_BITS)).clamp_(0, 255).to(torch.uint8)


def resize(pixels: torch.Tensor, width_plan: torch.Tensor, height_plan: torch.Tensor,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 [3, H, W] -> [3, H', W'] (into `out` if given) as Pillow's Image.resize(...,
    Image.LANCZOS) computes it: the horizontal pass, then the vertical one, each skipped where the
    size does not change. On CUDA each pass is one Triton launch from the plan's taps
    (kernels.resample); elsewhere a float64 product by the plan's dense weights."""
    x = pixels
    on_device = _by_taps(x)
    if on_device:
        from ...kernels.resample import resample
    if width_plan.shape[1] != x.shape[2]:
        x = resample(x, width_plan) if on_device else _rounded(x.to(torch.float64) @ _weights(width_plan, x.shape[2]).t())
    if height_plan.shape[1] != x.shape[1]:
        if on_device:
            return resample(x.transpose(1, 2), height_plan, None if out is None else out.transpose(1, 2)).transpose(1, 2)
        x = _rounded(_weights(height_plan, x.shape[1]) @ x.to(torch.float64))
    return x if out is None else out.copy_(x)


def _by_taps(x: torch.Tensor) -> bool:
    """Whether `resize` resamples with the Triton kernel (a CUDA tensor) or as float64 products."""
    return HAS_TRITON and x.is_cuda


def make_crops(image: ImageCrops, cfg: VisionConfig, out: torch.Tensor | None = None) -> torch.Tensor:
    """The global crop (the whole image resized to C x C, aspect ignored) and the local tiles of the
    image resized to th*W + 2m by tw*W + 2m, W the usable window: uint8 [1 + th*tw, 3, C, C] on the
    device of image's tensors (into `out` if given)."""
    c, window = cfg.crop_size, cfg.crop_size - 2 * cfg.overlap_margin * cfg.enc_patch_size
    th, tw = image.tiling
    out = torch.empty(image.count, 3, c, c, dtype=torch.uint8, device=image.pixels.device) if out is None else out
    pixels = image.pixels.permute(2, 0, 1)
    resize(pixels, *image.plans[:2], out=out[0])
    tiled = resize(pixels, *image.plans[2:])  # [3, th*W + 2m, tw*W + 2m]: tile (i, j) starts at (i*W, j*W)
    tiles = tiled.unfold(1, c, window).unfold(2, c, window)  # [3, th, tw, C, C]
    out[1:1 + th * tw].view(th, tw, 3, c, c).copy_(tiles.permute(1, 2, 0, 3, 4))
    return out


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
