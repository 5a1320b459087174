"""Moondream 2 benchmarks (DESIGN §5: what users run), on unique synthetic 800x600 images (tiling
2x4: 9 crops each), made before the clock starts; decoding and tiling them is the client's work
and is timed, as a user pays it.

- md2-query: closed-loop clients (one per --streams entry), each asking a ~20-token question about a
  new image, exactly 8 output tokens (EOS ignored: random weights would stop anywhere), greedy:
  requests/s and latency p50/p99.
- md2-caption: normal captions of --max-tokens tokens (EOS ignored) by that many clients: tok/s.
- md2-point, md2-detect: requests/s of point / detect (at most 4 objects; the model's EOS ends a
  request earlier, so `outputs` counts the objects found) by that many clients.
- md2-reuse: a caption plus 4 queries on one image, sent together: 5 separate requests with no
  reuse, the same finding the image's prefix in the prefix cache, and through one encoded image
  (encoder and prefix prefill once); ms per group.
- md2-encoder: the vision encoder's forward over 1, 5, 13 and 64 crops as one CUDA graph: ms beside
  its compute floor (2 x encoder parameters x patches / the dense bf16 peak measured here; GPU only),
  and md2-query's floors on this GPU: one image's prefill at the dense peak (the encoder over the
  workload's crops, the projection, the 730-position prefix), so the req/s no engine passes, and a
  lone request's latency with its 7 decode steps at the weight-read floor (copy bandwidth measured
  here)."""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ..engine import LLM
from .decode import (copy_bandwidth, floor_ms, format_profile, median_cuda_ms, new_profiler, run_threads,
                     take_profile, write_report)
from ..models.moondream.config import IMAGE_TOKENS, PREFIX_LEN
from ..models.moondream.image import image_tiling
from ..models.moondream.skills import Skill, caption_prompt, query_prompt
from ..sampling import SamplingParams

QUESTION = "What is the main object in this picture, what color is it, and where is it? Answer briefly."
IMAGE_SIZE = (800, 600)  # every workload's images (tiling 2x4: 9 crops)
ANSWER_TOKENS = 8  # md2-query's answers
SKILL_WORKLOADS = ("md2-query", "md2-caption", "md2-point", "md2-detect", "md2-reuse", "md2-encoder")


@dataclass
class SkillResult:
    workload: str
    mode: str
    clients: int
    requests: int
    outputs: int  # output tokens (query, caption) or objects found (point, detect)
    wall_s: float
    requests_s: float
    outputs_s: float
    latency_ms_p50: float
    latency_ms_p99: float
    latency_ms_quantiles: list[float]  # at 0, 1, ..., 100 %: the CDF the plot draws


def synthetic_images(n: int, seed: int, size: tuple[int, int] = IMAGE_SIZE) -> list[Image.Image]:
    """Unique smooth random pictures (a coarse random grid, upscaled)."""
    rng = np.random.default_rng(seed)
    w, h = size
    return [Image.fromarray(rng.integers(0, 256, (h // 40, w // 40, 3), dtype=np.uint8)).resize(size, Image.BICUBIC)
            for _ in range(n)]


def closed_loop(llm: LLM, workload: str, clients: int, per_client: int, request) -> SkillResult:
    """`clients` threads each sending `per_client` requests one after another; `request(i)` sends the
    i-th and returns its outputs (tokens or objects)."""
    latencies: list[float] = []
    outputs = [0]
    lock = threading.Lock()

    def client(c: int) -> None:
        for k in range(per_client):
            t = time.perf_counter()
            n = request(c * per_client + k)
            with lock:
                latencies.append(time.perf_counter() - t)
                outputs[0] += n

    wall = run_threads(clients, client)
    ms = np.asarray(latencies) * 1e3
    n = clients * per_client
    return SkillResult(workload, llm.core.config.mode, clients, n, outputs[0], wall, n / wall, outputs[0] / wall,
                       float(np.percentile(ms, 50)), float(np.percentile(ms, 99)),
                       [round(float(x), 3) for x in np.percentile(ms, np.arange(101))])


def _text_tokens(llm: LLM, image: Image.Image, prompt: list[int], max_tokens: int) -> int:
    """A caption or answer of exactly max_tokens tokens (EOS ignored), sent as the API sends it."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return len(llm._run(llm.core.make_image_sequence(llm._prefix(image), prompt, params, Skill.TEXT)).token_ids)


_IMAGE_SEEDS = itertools.count(1)  # each workload's images are new: none finds an earlier one's prefix cached


def run_workload(llm: LLM, workload: str, clients: int, max_tokens: int) -> SkillResult:
    per_client = max(2, 64 // clients) if workload == "md2-query" else max(2, 16 // clients)
    images = synthetic_images(clients * per_client, next(_IMAGE_SEEDS))
    tok = llm.core.moondream.tokenizer
    if workload == "md2-query":
        prompt = query_prompt(tok, llm.tokenizer.encode(QUESTION))

        def request(i):
            return _text_tokens(llm, images[i], prompt, ANSWER_TOKENS)
    elif workload == "md2-caption":
        prompt = caption_prompt(tok, "normal")

        def request(i):
            return _text_tokens(llm, images[i], prompt, max_tokens)
    else:
        skill = workload.removeprefix("md2-")

        def request(i):
            found = getattr(llm, skill)(images[i], "object", settings={"max_objects": 4})
            return len(found["objects" if skill == "detect" else "points"])
    return closed_loop(llm, workload, clients, per_client, request)


def run_reuse(llm: LLM, groups: int) -> list[SkillResult]:
    """A caption and 4 queries about one image, sent together: 5 separate requests with no reuse
    (the prefix cache's lookups off), 5 separate requests finding the image's prefix in the cache
    (where the engine caches), or one encoded image."""
    questions = ["What is this?", "What color is it?", "Where is it?", "How many are there?"]
    settings = {"temperature": 0.0, "max_tokens": 8}
    results = []
    caching = llm.core.pool.caching
    variants = [("separate, no reuse", False, False)] + ([("separate, cached", False, True)] if caching else [])
    for name, shared, cache in variants + [("encoded", True, caching)]:
        images = synthetic_images(groups, next(_IMAGE_SEEDS))
        llm.core.pool.caching = cache  # (read by the loop thread at its next admission)

        def group(i: int) -> int:
            image = llm.encode_image(images[i]) if shared else images[i]
            run_threads(1 + len(questions), lambda j: llm.query(image, questions[j - 1], settings=settings) if j
                        else llm.caption(image, settings=settings))
            if shared:
                image.close()
            return 0

        results.append(closed_loop(llm, f"md2-reuse {name}", 1, groups, group))
    llm.core.pool.caching = caching
    return results


def dense_peak(device) -> float:
    """FLOP per ms of a dense bf16 8192^3 product on `device`."""
    import torch

    square = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    return 2 * 8192 ** 3 / median_cuda_ms(lambda: square @ square)


def encoder_parameters(vision) -> int:
    """The vision encoder's parameters, the projection's left out: its floor's count."""
    return sum(p.numel() for name, p in vision.named_parameters() if not name.startswith("proj_mlp"))


def query_floors(llm: LLM, peak: float, bandwidth: float, image_size: tuple[int, int] = IMAGE_SIZE,
                 answer_tokens: int = ANSWER_TOKENS) -> dict[str, float]:
    """md2-query's floors on this GPU, counted from the loaded model: an image's prefill at the dense
    `peak` (FLOP per ms; 2 x parameters x positions for the encoder over the image's crops, the
    projection of 729 positions and the text layers over the 730-position prefix; attention's own
    FLOPs left out, as in the encoder's floor), and a decode step reading every text weight once at
    `bandwidth` (bytes per second, decode.copy_bandwidth's). The first answer token comes from the
    prefill step, the others from decode steps."""
    heads, text = llm.core.runner.heads, llm.core.runner.model
    th, tw = image_tiling(image_size, heads.vision.cfg)
    crops = 1 + th * tw
    projection = sum(p.numel() for p in heads.vision.proj_mlp.parameters())
    layers = sum(p.numel() for name, p in text.named_parameters() if "embed" not in name and "lm_head" not in name)
    parts = {"encoder_ms": 2 * encoder_parameters(heads.vision) * IMAGE_TOKENS * crops / peak,
             "projection_ms": 2 * projection * IMAGE_TOKENS / peak,
             "prefix_ms": 2 * layers * PREFIX_LEN / peak}
    image_ms = sum(parts.values())
    decode_ms = floor_ms(llm, 1, 0, bandwidth)  # (no context: the weights alone)
    return {"crops": crops, "peak_tflops": peak / 1e9, "copy_tb_s": bandwidth / 1e12, **parts,
            "image_ms": image_ms, "req_s_ceiling": 1000 / image_ms, "decode_step_ms": decode_ms,
            "lone_request_ms": image_ms + (answer_tokens - 1) * decode_ms}


def run_encoder(llm: LLM, peak: float, crops: tuple[int, ...] = (1, 5, 13, 64)) -> list[dict[str, float]]:
    """The vision encoder alone over crop batches, a CUDA graph each, ms (CUDA events, median of 10)
    beside its floor at `peak` FLOP per ms."""
    import torch

    vision = llm.core.runner.heads.vision
    cfg = vision.cfg
    a_device = llm.core.layer.device
    params = encoder_parameters(vision)
    rows = []
    for n in crops:
        x = torch.randint(0, 256, (n, 3, cfg.crop_size, cfg.crop_size), dtype=torch.uint8, device=a_device)
        with torch.no_grad():
            vision.encode(vision.normalize(x))  # (warm-up, then one CUDA graph, as the engine runs it)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                vision.encode(vision.normalize(x))
        ms = median_cuda_ms(graph.replay)
        floor = 2 * params * IMAGE_TOKENS * n / peak
        rows.append({"crops": n, "ms": ms, "floor_ms": floor, "x_floor": ms / floor})
    return rows


def format_table(results: list[SkillResult]) -> str:
    lines = ["workload | mode | clients | req | req/s | outputs/req | out/s | latency p50/p99 ms"]
    for r in results:
        lines.append(f"{r.workload} | {r.mode} | {r.clients} | {r.requests} | {r.requests_s:,.1f} | "
                     f"{r.outputs / r.requests:.1f} | {r.outputs_s:,.0f} | "
                     f"{r.latency_ms_p50:.1f}/{r.latency_ms_p99:.1f}")
    return "\n".join(lines)


def plot(results: list[SkillResult], path: Path) -> None:
    """Latency CDFs per (workload, mode, clients)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    grid = np.arange(101) / 100
    for r in results:
        ax.plot(r.latency_ms_quantiles, grid, label=f"{r.workload} {r.mode} x{r.clients}")
    ax.set_xscale("log")
    ax.set_xlabel("request latency (ms)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(model: str | None, workloads: list[str], modes: list[str], clients: list[int], max_tokens: int,
        device: str | None, dtype: str, out: Path | None, engine_options: dict, profile: bool = False) -> list:
    """One engine per mode; print a table, write JSON and a PNG of latency CDFs."""
    for w in workloads:
        if w not in SKILL_WORKLOADS:
            raise ValueError(f"unknown Moondream workload {w!r}; choose from {', '.join(SKILL_WORKLOADS)}")
    results: list[SkillResult] = []
    encoder, floors, profiles = [], {}, {}
    for mode in modes:
        llm = LLM(model, device=device, dtype=dtype, mode=mode, **engine_options)
        try:
            llm._moondream()
            if (profile or "md2-encoder" in workloads) and not llm.core.layer.is_cuda:
                raise ValueError("--profile and md2-encoder time CUDA events: they need a CUDA device")
            run_workload(llm, "md2-query", 2, 8)  # warm-up
            for workload in workloads:
                if workload == "md2-encoder":
                    if not encoder:
                        peak = dense_peak(llm.core.layer.device)
                        encoder = run_encoder(llm, peak)
                        floors = query_floors(llm, peak, copy_bandwidth())
                elif workload == "md2-reuse":
                    results.extend(run_reuse(llm, 8))
                else:
                    for n in clients:
                        if profile:
                            new_profiler(llm, max_steps=8192)
                        results.append(run_workload(llm, workload, n, max_tokens))
                        profiles.update(take_profile(llm, f"{mode} {workload} x{n}"))
        finally:
            llm.shutdown()
    print(format_table(results))
    for row in encoder:
        print(f"encoder {row['crops']} crops: {row['ms']:.2f} ms, floor {row['floor_ms']:.2f} ms, "
              f"{row['x_floor']:.2f}x")
    if floors:
        print(f"md2-query floors ({floors['crops']} crops; dense bf16 peak {floors['peak_tflops']:.0f} TFLOP/s, copy "
              f"{floors['copy_tb_s']:.2f} TB/s): an image's prefill {floors['image_ms']:.2f} ms (encoder "
              f"{floors['encoder_ms']:.2f}, projection {floors['projection_ms']:.2f}, prefix "
              f"{floors['prefix_ms']:.2f}) -> at most {floors['req_s_ceiling']:.0f} req/s; a decode step "
              f"{floors['decode_step_ms']:.2f} ms; a lone request {floors['lone_request_ms']:.1f} ms")
    if profiles:
        print(format_profile(profiles))
    write_report(out, {"results": [asdict(r) for r in results], "encoder": encoder, "floors": floors,
                       "profile": profiles,
                       "engine_options": engine_options}, lambda png: plot(results, png))
    return results
