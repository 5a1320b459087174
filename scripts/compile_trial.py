"""torch.compile (inductor) on the decode step against slipstream's Triton step (H200).

The model's decode forward at N rows, every row 128 tokens into the paged cache, each form captured
in one CUDA graph and replayed (ms per step, median of 200 replays):
  triton            slipstream's kernels, as served;
  inductor          the same forward with slipstream's Triton dispatch off (the torch reference
                    path: cuBLAS GEMMs, torch norms, rotary and paged attention), compiled by
                    torch.compile (default mode; the graph capture is ours). The KV write stays
                    eager (a graph break per layer): compiled, the in-place write into the cache
                    is functionalized into a copy of the whole cache;
  inductor+triton   compiled with slipstream's kernels left in (dynamo sees user Triton kernels).
A form that fails to compile is reported with its error. Usage:
  python scripts/compile_trial.py random:qwen2.5-0.5b 32 [forms, comma-separated]"""
import sys
import time

import torch

import slipstream.kernels as kernels
import slipstream.kernels.attention as attention
from slipstream.engine import EngineConfig, EngineCore

model = sys.argv[1] if len(sys.argv) > 1 else "random:qwen2.5-0.5b"
rows = int(sys.argv[2]) if len(sys.argv) > 2 else 32
forms = sys.argv[3].split(",") if len(sys.argv) > 3 else ["triton", "inductor", "inductor+triton"]
ctx = 128

core = EngineCore(EngineConfig(model=model, max_num_seqs=rows, cuda_graphs=False, num_pages=rows * ctx // 16 + 2),
                  lambda seq: None)
runner = core.runner
slot, ps = runner.slots[0], runner.page_size
width = ctx // ps
h = slot.host
for i in range(rows):
    pages = [1 + i * width + j for j in range(width)]
    h["positions"][i] = ctx - 1
    h["slot_mapping"][i] = pages[-1] * ps + (ctx - 1) % ps
    h["context_lens"][i] = ctx
    h["page_table"][i, :width] = pages
    h["rows"][i] = i
runner.layer.upload(slot.meta_dev, slot.meta_host)
torch.cuda.synchronize()


eager_write_kv = attention.write_kv


def set_triton(on: bool) -> None:
    kernels.HAS_TRITON = attention.HAS_TRITON = on
    attention.write_kv = eager_write_kv if on else torch._dynamo.disable(eager_write_kv)


def time_graph(fn) -> float:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(200):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def step():
    return runner.decode_forward(slot, rows, width)


print(f"{model}, {rows} rows, context {ctx}")
for form in forms:
    set_triton(form != "inductor")
    t0 = time.perf_counter()
    try:
        fn = step if form == "triton" else torch.compile(step, dynamic=False)
        with torch.cuda.stream(torch.cuda.Stream()):
            fn()
        torch.cuda.synchronize()
        built = time.perf_counter() - t0
        print(f"{form:>16}: {time_graph(fn):.3f} ms/step (first call {built:.1f} s)", flush=True)
    except Exception as e:  # a failed form is a result too
        print(f"{form:>16}: failed after {time.perf_counter() - t0:.1f} s: {type(e).__name__}: {str(e)[:300]}",
              flush=True)
    torch._dynamo.reset()
set_triton(True)
