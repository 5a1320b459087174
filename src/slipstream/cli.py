"""The `slipstream` command: generate text, ask Moondream 2 about an image, or benchmark the engine."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


TRAFFIC = ["mixed", "prefill", "ttft", "interference", "shared-prefix"]
SKILL_WORKLOADS = ["md2-query", "md2-caption", "md2-point", "md2-detect", "md2-reuse", "md2-encoder"]


def _csv(kind):
    return lambda s: [kind(x) for x in s.split(",") if x]


def configure_logging() -> None:
    """slipstream's own INFO messages, under its name; other libraries' warnings only, under theirs. (The
    server's engine process calls it too: spawn starts it without the parent's configuration.)"""
    logging.basicConfig(format="%(name)s: %(message)s")
    logging.getLogger("slipstream").setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="slipstream", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="stream a completion of PROMPT (default model: embedded SmolLM2-135M)")
    g.add_argument("prompt")
    g.add_argument("--model", default=None,
                   help="HF model directory, .gguf file or random:PRESET (default: the embedded model)")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--mode", default="pipelined", choices=["pipelined", "blocking"])
    g.add_argument("--device", default=None)
    g.add_argument("--dtype", default="auto")
    g.add_argument("--chat", action="store_true", help="send PROMPT as a user message through the chat template")

    for skill, what, purpose in (("caption", None, "describe an image"),
                                 ("query", "question", "answer a question about an image"),
                                 ("point", "object", "the centre of each OBJECT in an image, as JSON"),
                                 ("detect", "object", "the bounding box of each OBJECT in an image, as JSON")):
        m = sub.add_parser(skill, help=f"Moondream 2: {purpose}")
        m.add_argument("image", help="an image file")
        if what:
            m.add_argument(what, help={"question": "what to ask", "object": "what to find, e.g. 'car'"}[what])
        m.add_argument("--model", required=True, help="a Moondream 2 directory or random:tiny-moondream / "
                                                      "random:moondream2")
        m.add_argument("--tokenizer", default=None, help="moondream/starmie-v1's tokenizer.json, if not beside the "
                                                         "checkpoint")
        m.add_argument("--device", default=None)
        m.add_argument("--dtype", default="auto")
        if skill == "caption":
            m.add_argument("--length", default="normal", choices=["short", "normal", "long"])
        if skill in ("caption", "query"):
            m.add_argument("--max-tokens", type=int, default=768)
            m.add_argument("--temperature", type=float, default=0.5)
            m.add_argument("--top-p", type=float, default=0.3)
        else:
            m.add_argument("--max-objects", type=int, default=50)
            m.add_argument("--draw", type=Path, default=None, help="write the image with the marks drawn here")

    v = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (docs/server.md)")
    v.add_argument("--model", default=None, help="as for generate (default: the embedded model)")
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1/ routes")
    v.add_argument("--mode", default="pipelined", choices=["pipelined", "blocking"])
    v.add_argument("--device", default=None)
    v.add_argument("--dtype", default="auto")
    v.add_argument("--tokenizer", default=None, help="a tokenizer.json (Moondream 2 ships none)")
    v.add_argument("--max-num-seqs", type=int, default=256)
    v.add_argument("--max-model-len", type=int, default=None)
    v.add_argument("--kv-memory-fraction", type=float, default=None,
                   help="share of the GPU memory free after loading that the KV cache takes (default 0.5)")
    v.add_argument("--page-size", type=int, default=None, help="tokens a KV page holds (a power of two; default 16)")
    v.add_argument("--max-prefill-tokens", type=int, default=None, help="the per-step token budget")
    v.add_argument("--max-prefill-chunk", type=int, default=None,
                   help="prompt tokens a step carries beside decode rows")
    v.add_argument("--no-cuda-graphs", action="store_true", help="run every step eagerly")
    v.add_argument("--no-prefix-caching", action="store_true", help="reuse no KV across requests")
    v.add_argument("--no-step-timing", action="store_true",
                   help="leave out the GPU busy/idle counters of /metrics (two CUDA events a step)")
    v.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                   help="a LoRA adapter (PEFT's format) to serve as model NAME; repeatable")
    v.add_argument("--max-loras", type=int, default=None, help="LoRA slots (default: as many as --lora gives)")
    v.add_argument("--max-lora-rank", type=int, default=16)
    v.add_argument("--data-parallel", type=int, default=1,
                   help="engine processes, one per GPU (or all on the CPU), behind one API process")
    v.add_argument("--max-in-flight", type=int, default=4096,
                   help="requests served at once; one more gets 429 with Retry-After")
    v.add_argument("--busy-poll", action="store_true",
                   help="poll instead of sleeping while idle: the API process and each engine process's intake "
                        "keep a CPU busy, and a lone request's first token comes sooner (docs/server.md)")

    s = sub.add_parser("bench-serve", help="traffic through a running server's HTTP API (bench/serve.py)")
    s.add_argument("--url", default="http://127.0.0.1:8000")
    s.add_argument("--api-key", default=None)
    s.add_argument("--workload", default="mixed", help="mixed, short or md2-query")
    s.add_argument("--request-rate", type=_csv(str), default=["inf"],
                   help="Poisson arrivals at these requests/s; inf: all at once; P%%: of the capacity measured all "
                        "at once in the same run, e.g. inf,25%%,50%%,90%%")
    s.add_argument("--requests", type=int, default=384)
    s.add_argument("--max-concurrency", type=int, default=None,
                   help="requests in flight at most (1 with rate inf: one at a time, light load)")
    s.add_argument("--cold-connections", action="store_true",
                   help="rate inf: open each request's connection after the clock starts (by default a burst's "
                        "connections are open before it, as clients that keep connections alive hold them)")
    s.add_argument("--prompt-range", type=_csv(int), default=[16, 1024], help="mixed: prompt lengths, uniform")
    s.add_argument("--output-range", type=_csv(int), default=[16, 384], help="mixed: output lengths, uniform")
    s.add_argument("--slo-ttft-ms", type=float, default=None, help="goodput counts requests with TTFT under this")
    s.add_argument("--slo-tpot-ms", type=float, default=None, help="... and TPOT under this")
    s.add_argument("--label", default="server", help="names the run in the table and plot (e.g. the server's mode)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", type=Path, default=None, help="write the results as JSON (and a PNG) here")

    r = sub.add_parser("make-random", help="write a random-weight checkpoint (config, safetensors, BPE tokenizer)")
    r.add_argument("--preset", required=True,
                   help="tiny-llama, tiny-qwen3, tiny-phi, phi-1.5, qwen2.5-0.5b, tiny-moondream, moondream2")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--seed", type=int, default=0)

    b = sub.add_parser("bench", help="throughput and latency, pipelined vs blocking")
    b.add_argument("--model", default=None)
    b.add_argument("--workload", type=_csv(str), default=None,
                   help="decode (default): tok/s per stream count (or short, zombie, constrained); traffic, one or "
                        "several in one engine, e.g. mixed,prefill: mixed (requests of random prompt and output "
                        "lengths), prefill (prompt tok/s), ttft (one request at a time), interference (decoding "
                        "while prompts arrive every step), shared-prefix (a 1,000-token system prompt, cache on and "
                        "off); Moondream 2: md2-query, md2-caption, md2-point, "
                        "md2-detect, md2-reuse, md2-encoder (see bench/moondream.py)")
    b.add_argument("--streams", type=_csv(int), default=[1, 8])
    b.add_argument("--mode", type=_csv(str), default=["pipelined", "blocking"])
    b.add_argument("--prompt-tokens", type=int, default=64)
    b.add_argument("--max-tokens", type=int, default=128)
    b.add_argument("--device", default=None)
    b.add_argument("--dtype", default="auto")
    b.add_argument("--short", action="store_true", help="closed-loop clients sending requests of 1-4 tokens")
    b.add_argument("--zombie", action="store_true", help="the zombie tax: stop-token ends vs max_tokens ends")
    b.add_argument("--constrained", type=_csv(float), default=None,
                   help="fractions of streams under a JSON schema, e.g. 0,0.5,1 (structured-output cost)")
    b.add_argument("--temperature", type=float, default=0.0,
                   help="decode workload: sample at this temperature (one seed per stream) instead of greedy")
    b.add_argument("--top-p", type=float, default=1.0, help="with --temperature: sample from this nucleus")
    b.add_argument("--lora", type=int, default=0,
                   help="decode workload: also with this many random LoRA adapters over the streams (and none)")
    b.add_argument("--lora-rank", type=int, default=16, help="with --lora: the adapters' rank")
    b.add_argument("--profile", action="store_true",
                   help="GPU: per-step forward/sampling/bookkeeping/idle split and a PNG timeline")
    b.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    b.add_argument("--max-num-seqs", type=int, default=None,
                   help="engine option (default: the largest --streams; for the traffic workloads the engine's)")
    b.add_argument("--max-prefill-tokens", type=int, default=None, help="engine option: the per-step token budget")
    b.add_argument("--max-prefill-chunk", type=int, default=None,
                   help="engine option: prompt tokens a step carries beside decode rows")
    b.add_argument("--no-cuda-graphs", action="store_true",
                   help="engine option: run every step eagerly (to measure what the graphs buy)")
    b.add_argument("--no-prefix-caching", action="store_true", help="engine option: reuse no KV across requests")
    t = b.add_argument_group("traffic workloads (mixed, prefill, ttft, interference)")
    t.add_argument("--requests", type=int, default=384, help="mixed: number of requests")
    t.add_argument("--prompt-range", type=_csv(int), default=[16, 1024], help="mixed: prompt lengths, uniform")
    t.add_argument("--output-range", type=_csv(int), default=[16, 384], help="mixed: output lengths, uniform")
    t.add_argument("--request-rate", type=_csv(str), default=["inf"],
                   help="mixed: Poisson arrivals at these requests/s; inf: all at once; P%%: of the capacity "
                        "measured all at once in the same run, e.g. 50%%,90%%")
    t.add_argument("--ttft-lengths", type=_csv(int), default=[16, 128, 1024, 4000], help="ttft: prompt lengths")
    t.add_argument("--decoding", type=int, default=32, help="interference: requests decoding")
    t.add_argument("--arrival-tokens", type=int, default=1024, help="interference: the prompt arriving every step")

    args = p.parse_args(argv)
    configure_logging()
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command in ("caption", "query", "point", "detect"):
            return _skill(args)
        if args.command == "serve":
            return _serve(args)
        if args.command == "bench-serve":
            from .bench import serve

            _check_ranges(args)
            serve.run(args.url, args.api_key, args.workload, args.request_rate, args.requests,
                      tuple(args.prompt_range), tuple(args.output_range), args.slo_ttft_ms, args.slo_tpot_ms,
                      args.label, args.out, args.seed, args.max_concurrency, not args.cold_connections)
            return 0
        if args.command == "make-random":
            from .models.random_checkpoint import write_checkpoint

            print(write_checkpoint(args.preset, args.out, args.seed))
            return 0
        engine = {k: v for k, v in (("max_num_seqs", args.max_num_seqs), ("max_prefill_tokens", args.max_prefill_tokens),
                                    ("max_prefill_chunk", args.max_prefill_chunk),
                                    ("cuda_graphs", False if args.no_cuda_graphs else None),
                                    ("enable_prefix_caching", False if args.no_prefix_caching else None))
                  if v is not None}
        workloads = args.workload or ["short" if args.short else "zombie" if args.zombie
                                      else "constrained" if args.constrained is not None else "decode"]
        if set(workloads) <= set(SKILL_WORKLOADS):
            from .bench import moondream

            moondream.run(args.model, workloads, args.mode, args.streams, args.max_tokens, args.device, args.dtype,
                          args.out, engine, args.profile)
        elif set(workloads) <= set(TRAFFIC):
            from .bench import traffic

            _check_ranges(args)
            traffic.run(args.model, workloads, args.mode, args.device, args.dtype, args.out, engine, args.profile,
                        args.requests,
                        tuple(args.prompt_range), tuple(args.output_range), traffic.parse_rates(args.request_rate),
                        args.ttft_lengths, args.decoding, args.arrival_tokens)
        elif len(workloads) == 1 and workloads[0] in ("decode", "short", "zombie", "constrained"):
            from .bench.decode import run

            run(args.model, args.streams, args.mode, args.prompt_tokens, args.max_tokens, args.device, args.dtype,
                args.out, workloads[0], args.profile, args.constrained or [1.0], args.temperature, args.top_p, engine,
                args.lora, args.lora_rank)
        else:
            raise ValueError(f"--workload: one of decode, short, zombie, constrained, or traffic workloads from "
                             f"{', '.join(TRAFFIC)}, or Moondream workloads from {', '.join(SKILL_WORKLOADS)}; got "
                             f"{','.join(workloads)}")
        return 0
    except (ValueError, FileNotFoundError, TypeError) as e:
        print(f"slipstream: error: {e}", file=sys.stderr)
        return 2


def _check_ranges(args) -> None:
    for name, pair in (("--prompt-range", args.prompt_range), ("--output-range", args.output_range)):
        if len(pair) != 2 or not 1 <= pair[0] <= pair[1]:
            raise ValueError(f"{name} takes two lengths LOW,HIGH with 1 <= LOW <= HIGH, got {pair}")


def _skill(args) -> int:
    """Run one Moondream skill; text streams to stdout, points and boxes print as JSON."""
    import json

    from . import LLM

    with LLM(args.model, device=args.device, dtype=args.dtype, tokenizer=args.tokenizer, max_num_seqs=1) as llm:
        image = llm.encode_image(args.image)
        if args.command in ("caption", "query"):
            settings = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p}
            if args.command == "caption":
                pieces = llm.caption(image, args.length, stream=True, settings=settings)["caption"]
            else:
                pieces = llm.query(image, args.question, stream=True, settings=settings)["answer"]
            for piece in pieces:
                print(piece, end="", flush=True)
            print()
            return 0
        result = getattr(llm, args.command)(image, args.object, settings={"max_objects": args.max_objects})
    print(json.dumps(result))
    if args.draw is not None:
        from .models.moondream.image import draw_marks

        draw_marks(args.image, next(iter(result.values())), args.draw)
        print(f"slipstream: drew {len(next(iter(result.values())))} marks into {args.draw}", file=sys.stderr)
    return 0


def _generate(args) -> int:
    from . import LLM, SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    with LLM(args.model, device=args.device, dtype=args.dtype, mode=args.mode, max_num_seqs=1) as llm:
        prompt = llm.core.render_chat([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
        rid = llm.submit(prompt, params, on_token=lambda _r, _n, delta: print(delta, end="", flush=True))
        out = llm.result(rid)
    print()
    print(f"[{len(out.token_ids)} tokens, finish_reason={out.finish_reason}, ttft {out.metrics.ttft * 1e3:.0f} ms, "
          f"{len(out.token_ids) / max(out.metrics.decode_seconds, 1e-9):.1f} tok/s]", file=sys.stderr)
    return 0


def _engines(args, options: dict, loras: dict):
    """One engine client, or `--data-parallel` of them, one per GPU (server/router.py)."""
    from .server.client import EngineClient

    n = args.data_parallel
    if n == 1:
        return EngineClient(args.model, options, loras, args.busy_poll)
    if n < 1:
        raise ValueError(f"--data-parallel must be >= 1, got {n}")
    import torch

    from .server.router import Replicas

    if args.device is not None and str(args.device).startswith("cpu"):
        return Replicas(args.model, options, loras, ["cpu"] * n, args.busy_poll)
    gpus = torch.cuda.device_count()
    if n > gpus:
        raise ValueError(f"--data-parallel {n} asks for a GPU each, and {gpus} are present")
    return Replicas(args.model, options, loras, [f"cuda:{i}" for i in range(n)], args.busy_poll)


def _serve(args) -> int:
    """SIGUSR1 prints every thread's stack to stderr, here and in the engine process."""
    import faulthandler
    import signal

    import uvicorn

    from .config import EngineConfig
    from .server.app import build_app

    options = {"mode": args.mode, "device": args.device, "dtype": args.dtype, "max_num_seqs": args.max_num_seqs,
               "step_timing": not args.no_step_timing, "cuda_graphs": not args.no_cuda_graphs,
               "enable_prefix_caching": not args.no_prefix_caching}
    for name in ("tokenizer", "max_model_len", "max_prefill_tokens", "max_prefill_chunk", "kv_memory_fraction",
                 "page_size"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    loras = {}
    for item in args.lora:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora takes NAME=PATH, got {item!r}")
        loras[name] = path
    options["max_loras"] = len(loras) if args.max_loras is None else args.max_loras
    options["max_lora_rank"] = args.max_lora_rank
    EngineConfig(model=args.model, **options)  # (a bad option is an error here, not an engine process's traceback)
    faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    app = build_app(_engines(args, options, loras), args.api_key, args.max_in_flight, args.busy_poll)
    logging.getLogger("slipstream").info("loading %s in %s; serving on http://%s:%d/v1",
                                         args.model or "the embedded model", "the engine process"
                                         if args.data_parallel == 1 else f"{args.data_parallel} engine processes",
                                         args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=30)
    return 0
