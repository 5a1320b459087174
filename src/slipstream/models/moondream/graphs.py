"""CUDA graphs of one image's prefix prefill (heads.prefill_images: the vision encoder over its
crops, the stitch and pooling, the projection, then BOS + 729 embeddings through the text layers
into the KV pages), one graph per tiling (th x tw with th * tw <= max_crops: 35 for the release's
12), captured at start-up. Eager, an image prefill is about a thousand launches, many of them
Triton's, and the host sets its pace, not the GPU (docs/benchmarks.md, run o).

The inputs live at fixed addresses: a crop buffer for the largest tiling, which the image's crops
are made into on the device, and the prefix's 730 KV slots. The graphs share one memory pool: they
run one at a time on that stream and none has an output of its own."""
from __future__ import annotations

import torch
from tqdm import tqdm

from .config import PREFIX_LEN


def all_tilings(max_crops: int) -> list[tuple[int, int]]:
    """Every (th, tw) that select_tiling can return: th * tw <= max_crops."""
    return [(th, tw) for th in range(1, max_crops + 1) for tw in range(1, max_crops // th + 1)]


class ImageGraphs:
    def __init__(self, heads, kv, stream: torch.cuda.Stream, lora=None) -> None:
        """`lora`: the engine's LoraBank (the prefix's adapter slot is then a graph input too)."""
        vision = heads.cfg.vision
        device = heads.spatial_state.device
        c = vision.crop_size
        self.crops = torch.zeros(1 + vision.max_crops, 3, c, c, dtype=torch.uint8, device=device)
        self.slots = torch.zeros(PREFIX_LEN, dtype=torch.int64, device=device)  # (slot 0: the scratch page)
        self.lora_slots = torch.zeros(PREFIX_LEN, dtype=torch.int64, device=device)  # (0: no adapter)
        rows = None if lora is None else lora.rows(self.lora_slots)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        tilings = all_tilings(vision.max_crops)

        def prefill(tiling: tuple[int, int]) -> None:
            heads.prefill_images(self.crops[:1 + tiling[0] * tiling[1]], [tiling], self.slots, kv, rows)

        torch.cuda.synchronize()
        with torch.cuda.stream(stream):  # warm-up: kernels compiled, cuBLAS workspaces made
            for n in sorted({th * tw for th, tw in tilings}):
                prefill(next(t for t in tilings if t[0] * t[1] == n))
        torch.cuda.synchronize()
        pool = torch.cuda.graph_pool_handle()
        for tiling in tqdm(tilings, desc="capturing image graphs", unit="graph", leave=False):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                prefill(tiling)
            self.graphs[tiling] = graph
        with torch.cuda.stream(stream):  # (the first replay uploads a graph: now, into the scratch page)
            for graph in self.graphs.values():
                graph.replay()
        torch.cuda.synchronize()

    def prefill(self, tiling: tuple[int, int], slots: torch.Tensor, lora_slot: int = 0) -> None:
        """One image's prefix, its crops already in `crops` (image.make_crops writes them there), its
        KV slots given (on the device) and its adapter's slot, on the current (compute) stream."""
        self.slots.copy_(slots)
        self.lora_slots.fill_(lora_slot)
        self.graphs[tiling].replay()
