"""The public engine: `LLM` loads a model, runs the scheduler loop on its own thread, and offers a
thread-safe submit / abort / result interface with `generate` on top.

The loop blocks on a condition variable when there is no work (no spinning). If it dies, every
pending request fails with the loop's error and later calls raise it: nothing hangs."""
from __future__ import annotations

import functools
import gc
import importlib.util
import itertools
import numbers
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence as Seq

import numpy as np
import torch

from .config import EngineConfig
from .device import DeviceLayer
from .kv_cache import KVCache, PagePool
from .models.loader import build_model, load_checkpoint
from .models.moondream.api import MoondreamAPI
from .profiler import StepClock
from .runner import ModelRunner
from .sampling import SamplingParams, TokenConstraint
from .scheduler import ImagePrefix, Scheduler, Sequence
from .text import TextStream
from .tokenizer import render_chat_template

DEFAULT_MAX_MODEL_LEN = 4096


@dataclass
class RequestMetrics:
    ttft: float | None  # seconds from submit to the first committed token
    decode_seconds: float  # seconds from the first committed token to the final result


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated tokens, including the EOS / stop token that ended the request
    text: str  # generated text, without the EOS token or the stop string
    finish_reason: str  # "stop" | "length" | "abort"
    metrics: RequestMetrics
    logprobs: list[dict[int, float]] | None = None  # per token: {id: logprob} for the top n and the sampled one
    objects: list[dict[str, float]] | None = None  # Moondream point/detect: the points or boxes decoded
    cached_tokens: int = 0  # prompt tokens whose KV was reused (prefix cache, or an encoded image's prefix)


class _Pending:
    def __init__(self, deltas: queue.SimpleQueue | None = None,
                 on_finish: Callable[[RequestOutput | None, BaseException | None], None] | None = None) -> None:
        self.done = threading.Event()
        self.output: RequestOutput | None = None
        self.error: BaseException | None = None
        self.deltas = deltas  # for stream(): text deltas, then None when the request has ended
        self.on_finish = on_finish  # for submit(on_finish=...): called instead of keeping the result


class EngineCore:
    """Model, cache, runner and scheduler, driven by whoever calls `scheduler.tick()`: the LLM's
    loop thread, or a test that steps it by hand."""

    def __init__(self, config: EngineConfig, on_finish: Callable[[Sequence], None]) -> None:
        self.config = cfg = config
        ckpt = load_checkpoint(cfg.model, cfg.tokenizer)
        self.model_config = mc = ckpt.config
        self.tokenizer = ckpt.tokenizer
        self.max_model_len = min(cfg.max_model_len or DEFAULT_MAX_MODEL_LEN, mc.max_position_embeddings)
        self.layer = DeviceLayer(cfg.device)
        net = build_model(ckpt, cfg.dtype, cfg.device, self.max_model_len)
        self.moondream = ckpt.moondream  # a MoondreamConfig, or None for a text model
        heads = None
        if self.moondream is not None:
            from .models.moondream.heads import MoondreamHeads

            heads = MoondreamHeads(self.moondream, net, ckpt.parts, cfg.max_num_seqs, cfg.dtype, cfg.device)
        self.lora = None  # the LoRA slots (made before the KV cache, which takes the memory left)
        if cfg.max_loras:
            from .lora.bank import LoraBank

            self.lora = LoraBank(net.model.layers, cfg.max_loras, cfg.max_lora_rank, cfg.dtype, cfg.device)
        del ckpt
        self.pool = PagePool(self._num_pages(), cfg.page_size, cfg.enable_prefix_caching)
        kv = KVCache(mc.num_layers, self.pool.num_pages, cfg.page_size, mc.num_kv_heads, mc.head_dim, cfg.dtype,
                     cfg.device)
        pages_per_seq = self.pool.pages_for(self.max_model_len + 1)
        self.runner = ModelRunner(net, kv, self.layer, cfg.max_num_seqs, cfg.step_tokens, pages_per_seq,
                                  cfg.cuda_graphs, heads, self.lora)
        if cfg.step_timing:
            self.runner.clock = StepClock(self.layer)
        kv_token_bytes = KVCache.bytes_per_page(mc.num_layers, 1, mc.num_kv_heads, mc.head_dim, cfg.dtype)
        self.scheduler = Scheduler(self.runner, self.pool, cfg.depth, cfg.max_num_seqs, cfg.step_tokens,
                                   cfg.max_prefill_chunk, net.decode_weight_bytes() / kv_token_bytes, on_finish)
        self._ids = itertools.count()
        self._grammar = None  # the XGrammar backend, built at the first structured-output request
        self._grammar_lock = threading.Lock()
        # the detokenizer's table (one bytes object per token id), built now rather than at the first
        # request, so that the freeze below takes it: young, the Qwen shape's 152k entries made the
        # first gen-1 collection after it 5 ms, on the loop thread (run y)
        _ = self.tokenizer.token_bytes
        gc.collect()
        gc.freeze()  # start-up objects leave the collector's view: no long collections in the loop (undone at shutdown)

    def _num_pages(self) -> int:
        cfg, mc = self.config, self.model_config
        if cfg.num_pages is not None:
            return cfg.num_pages
        per_page = KVCache.bytes_per_page(mc.num_layers, cfg.page_size, mc.num_kv_heads, mc.head_dim, cfg.dtype)
        if cfg.device.type == "cuda":
            torch.cuda.empty_cache()  # blocks cached from earlier engines in this process count as free
            free, _ = torch.cuda.mem_get_info(cfg.device)
            budget = int(free * cfg.kv_memory_fraction)
        else:
            budget = cfg.cpu_kv_bytes
        return max(2, budget // per_page)

    def make_sequence(self, prompt: str | Seq[int] | np.ndarray, params: SamplingParams | None,
                      on_token: Callable[[int, int, str], None] | None) -> Sequence:
        """Validate a request and build its Sequence; every bad input raises ValueError/TypeError here.
        Its TTFT counts from here: the prompt's tokenization and checks are the request's own time."""
        arrival = time.perf_counter()
        params = params or SamplingParams()
        ids = self._prompt_ids(prompt)
        room = self.max_model_len - len(ids)
        if room < 1:
            raise ValueError(f"prompt has {len(ids)} tokens; max_model_len is {self.max_model_len}, which leaves "
                             f"no room to generate")
        seq = Sequence(
            request_id=next(self._ids), prompt_ids=ids, params=params, max_tokens=min(params.max_tokens, room),
            arrival=arrival,
            seed=params.resolved_seed(),
            eos_ids=frozenset(self.model_config.eos_token_ids) | frozenset(params.stop_token_ids),
            text=TextStream(self.tokenizer, params.stop),
            constraint=self._constraint(params),
            on_token=(lambda s, delta: on_token(s.request_id, len(s.output_ids), delta)) if on_token else None,
        )
        pages = self.pool.pages_for(self.scheduler.reserve_tokens(seq))
        if pages > self.pool.total:
            raise ValueError(f"request needs {pages} KV pages (prompt + max_tokens), the cache has "
                             f"{self.pool.total}; lower max_tokens or give the cache more memory")
        if params.lora is not None:  # (last: a request refused above holds no slot)
            if self.lora is None:
                raise ValueError(f"lora={params.lora!r} asked for, but this engine has no LoRA slots; build it with "
                                 f"LLM(..., max_loras=N) and load_lora the adapter")
            seq.lora_slot, seq.lora_id = self.lora.acquire(params.lora, wait=True)  # (slot 0: it waits for one)
        return seq

    def discard(self, seqs: list[Sequence]) -> None:
        """Sequences built but never queued (a request refused part way) let go of their LoRA slots."""
        for seq in seqs:
            if seq.lora_slot:
                self.lora.release(seq.lora_slot)
                seq.lora_slot = 0

    def make_image_sequence(self, prefix: ImagePrefix, prompt_ids: list[int], params: SamplingParams, skill: int,
                            spatial: Any = None, on_token: Callable[[int, int, str], None] | None = None) -> Sequence:
        """A Moondream request: the image prefix (BOS + 729 image positions) then `prompt_ids`, under a
        skill code (and point/detect's state machine)."""
        seq = self.make_sequence([self.moondream.tokenizer.bos_id] * prefix.length + prompt_ids, params, on_token)
        if prefix.lora_id is None:
            prefix.lora_id = seq.lora_id
        elif prefix.lora_id != seq.lora_id:
            if seq.lora_slot:
                self.lora.release(seq.lora_slot)
            raise ValueError("this encoded image's prefix was computed under another LoRA adapter (or none); "
                             "encode the image again for this one")
        seq.prefix, seq.skill, seq.spatial = prefix, skill, spatial
        return seq

    def _constraint(self, params: SamplingParams) -> TokenConstraint | None:
        """The request's constraint, compiled here on the submitting thread (never on the loop's)."""
        option = params.grammar_option
        if option is None:
            return params.constraint() if params.constraint else None
        with self._grammar_lock:
            if self._grammar is None:
                if importlib.util.find_spec("xgrammar") is None:
                    raise ValueError("structured output needs xgrammar; install it with "
                                     "`pip install --no-deps xgrammar==0.2.9 apache-tvm-ffi pydantic`")
                from .constrain.grammar import GrammarBackend

                self._grammar = GrammarBackend(self.tokenizer, self.model_config.vocab_size,
                                               self.model_config.eos_token_ids, self.runner)
        return self._grammar.constraint(*option)

    def close(self) -> None:
        """Stop the matcher process, if one was started (the loop has ended)."""
        with self._grammar_lock:
            if self._grammar is not None:
                self._grammar.close()
                self._grammar = None

    def _prompt_ids(self, prompt: str | Seq[int] | np.ndarray) -> np.ndarray:
        """The prompt's token ids, copied into an int64 array: it holds no Python objects, so the
        cycle collector never walks it (each list of 1,024 ids cost ~10 us of every collection that
        met it, on the loop thread: a periodic bump in inter-token latency under arrivals, run r)."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, np.ndarray) and prompt.ndim == 1 and prompt.dtype.kind in "iu":
            ids = prompt
        elif isinstance(prompt, (list, tuple)):
            if set(map(type, prompt)) <= {int}:  # (plain ints, checked at C speed: 35k ids took 20 ms one by one)
                ids = prompt
            else:
                odd = next((t for t in prompt if not isinstance(t, numbers.Integral) or isinstance(t, bool)), None)
                if odd is not None:
                    raise TypeError(f"a prompt's token ids are integers, got {odd!r} ({type(odd).__name__})")
                ids = [int(t) for t in prompt]  # (numpy's integers too)
        else:
            raise TypeError(f"a prompt is a string or a list of token ids, got {type(prompt).__name__}")
        vocab = self.model_config.vocab_size
        try:
            ids = np.array(ids, dtype=np.int64)
        except OverflowError:
            raise ValueError(f"prompt token ids must be in the vocabulary [0, {vocab})") from None
        if not ids.size:
            raise ValueError("prompt is empty")
        if ids.min() < 0 or ids.max() >= vocab:
            bad = ids[(ids < 0) | (ids >= vocab)]
            raise ValueError(f"prompt token ids {bad[:5].tolist()} are outside the vocabulary [0, {vocab})")
        return ids

    def render_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of a conversation rendered with the model's chat template, ready for the reply."""
        return self.tokenizer.encode(render_chat_template(self.tokenizer, messages), add_special_tokens=False)

    def output(self, seq: Sequence) -> RequestOutput:
        first = seq.first_token_time
        return RequestOutput(
            request_id=seq.request_id, prompt_token_ids=seq.prompt_ids[seq.prompt_start:].tolist(),
            token_ids=list(seq.output_ids),
            text=seq.text.text, finish_reason=seq.finish_reason,
            logprobs=list(seq.logprobs) if seq.params.logprobs is not None else None,
            objects=list(seq.spatial.objects) if seq.spatial is not None else None, cached_tokens=seq.cached_tokens,
            metrics=RequestMetrics(ttft=None if first is None else first - seq.arrival,
                                   decode_seconds=0.0 if first is None else seq.finish_time - first))

    def stats(self) -> dict[str, Any]:
        sched = self.scheduler
        return {"kv_pages_total": self.pool.total, "kv_pages_free": self.pool.num_free,
                "kv_pages_cached": self.pool.num_cached, "prompt_tokens": sched.prompt_tokens,
                "cached_prompt_tokens": sched.cached_tokens,
                "running": len(sched.running), "waiting": len(sched.waiting),
                "steps": sum(sched.steps.values()), "prefill_steps": sched.steps["prefill"],
                "decode_steps": sched.steps["decode"], "cuda_graphs": len(self.runner.graphs or ()),
                "graph_memory_bytes": self.runner.graphs.memory_bytes if self.runner.graphs else 0,
                "loras": self.lora.names() if self.lora else [],
                **self._clock_stats()}

    def _clock_stats(self) -> dict[str, Any]:
        clock = self.runner.clock
        if clock is None:
            return {}
        return {"timed_steps": clock.steps, "gpu_busy_seconds": clock.busy_seconds,
                "gpu_idle_seconds": clock.idle_seconds, "gpu_idle_counts": list(clock.idle_counts)}


class LLM(MoondreamAPI):
    """The offline engine: `generate` for batches, `submit`/`result`/`abort` for anything finer; on a
    Moondream 2 model also its skills (`caption`, `query`, `point`, `detect`, `encode_image`)."""

    def __init__(self, model: str | None = None, device: str | torch.device | None = None,
                 dtype: str | torch.dtype = "auto", mode: str = "pipelined", max_num_seqs: int = 256,
                 **engine_options) -> None:
        config = EngineConfig(model=model, device=device, dtype=dtype, mode=mode, max_num_seqs=max_num_seqs,
                              **engine_options)
        self.core = EngineCore(config, self._on_finish)
        self.tokenizer = self.core.tokenizer
        self._pending: dict[int, _Pending] = {}
        self._lora_waiting: dict[int, Sequence] = {}  # requests waiting for a LoRA slot (not yet in the inbox)
        self._inbox: deque[tuple[str, object]] = deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._parked = False  # the loop thread waits on _cv for work (`idle`)
        self._error: BaseException | None = None
        # Called after each pass of the loop, once the pass's on_token / on_finish callbacks have all
        # run (a commit's rows, or what it aborted or refused; and after shutdown fails what is
        # pending): where a consumer that batches their output ships the batch, with no hop to another
        # thread. Also at the end of each commit's rest, before the loop thread waits for the matcher
        # process's fill of a constrained step's masks (a wait that lets go of the interpreter lock), so
        # the consumer's thread takes the lock then, not in the next tick's launch and commit (run g).
        self.after_callbacks: Callable[[], None] | None = None
        self.core.scheduler.after_rest = self._callbacks_done
        self._thread = threading.Thread(target=self._loop, name="slipstream-loop", daemon=True)
        self._thread.start()

    @property
    def idle(self) -> bool:
        """Whether the loop thread waits for work with nothing queued for it: only a new request or
        abort will wake it (`serve --busy-poll` polls for requests while this holds, when a poller
        holding the interpreter lock delays no other thread; a request waiting for a LoRA slot counts
        as work, since the slot's grant wakes the loop from another thread)."""
        return self._parked and not self._inbox and not self._lora_waiting

    # ---- submit / abort / result --------------------------------------------------------
    def submit(self, prompt: str | list[int], params: SamplingParams | None = None,
               on_token: Callable[[int, int, str], None] | None = None,
               on_finish: Callable[[RequestOutput | None, BaseException | None], None] | None = None) -> int:
        """Validate and queue one request; returns its id. Bad input raises here and never reaches
        the loop. `on_token(request_id, num_tokens, text_delta)` is called on the loop thread after
        each committed token (the delta is "" while a character is still incomplete); if it raises,
        the request is aborted and its result raises that error. With `on_finish(output, error)`
        (called once, on the loop thread, when the request ends or the engine dies) the result is
        handed there and not kept for `result()`."""
        return self.enqueue(self.core.make_sequence(prompt, params, on_token), on_finish)

    def enqueue(self, seq: Sequence,
                on_finish: Callable[[RequestOutput | None, BaseException | None], None] | None = None) -> int:
        """Queue a sequence built by `core.make_sequence` or `skill_sequence` (already validated);
        `on_finish` as in `submit`. Its `on_token` hook, `(sequence, text_delta)`, runs on the loop
        thread after each committed token and may read the sequence's
        `output_ids` and `logprobs` there: the server ships them from it."""
        return self._enqueue([(seq, _Pending(on_finish=on_finish))])[0]

    def enqueue_many(self, seqs: list[Sequence]) -> list[int]:
        """Queue built sequences at once (so they can share one step); results by `result`."""
        return self._enqueue([(seq, _Pending()) for seq in seqs])

    def submit_many(self, prompts: Seq[str | list[int]], params: SamplingParams | Seq[SamplingParams] | None = None,
                    on_token: Callable[[int, int, str], None] | None = None) -> list[int]:
        """Validate every request first, then queue them all at once (so they can share one prefill
        step). One bad request raises before any of them is queued."""
        if isinstance(params, (list, tuple)):
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
            per_prompt = list(params)
        else:
            per_prompt = [params] * len(prompts)
        seqs: list[Sequence] = []
        try:
            for p, sp in zip(prompts, per_prompt):
                seqs.append(self.core.make_sequence(p, sp, on_token))
        except BaseException:
            self.core.discard(seqs)
            raise
        return self._enqueue([(seq, _Pending()) for seq in seqs])

    def _enqueue(self, requests: list[tuple[Sequence, _Pending]]) -> list[int]:
        """Into the loop's inbox; a request whose adapter has no slot yet waits for one in the LoRA
        bank first (`_granted` then queues it), so it is never refused for want of a slot."""
        with self._cv:
            try:
                self._raise_if_dead()
            except RuntimeError:
                self.core.discard([seq for seq, _ in requests])
                raise
            for seq, pending in requests:
                self._pending[seq.request_id] = pending
                if seq.params.lora is not None and not seq.lora_slot:
                    self._lora_waiting[seq.request_id] = seq
                    self.core.lora.wait(seq.request_id, seq.params.lora, functools.partial(self._granted, seq))
                else:
                    self._inbox.append(("add", seq))
            self._cv.notify()
        return [seq.request_id for seq, _ in requests]

    def _granted(self, seq: Sequence, slot: int) -> None:
        """On the LoRA bank's loader thread: the waiting request holds a slot now; queue it (or give
        the slot back if it was aborted meanwhile, or the engine is gone)."""
        with self._cv:
            if self._lora_waiting.pop(seq.request_id, None) is not None and self._error is None \
                    and not self._stopping:
                seq.lora_slot = slot
                self._inbox.append(("add", seq))
                self._cv.notify()
                return
        self.core.lora.release(slot)

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the completion's text as it is committed: never half a UTF-8 character, and text that
        could still become a stop string is held back until decided. Concatenated, the pieces are
        the final text. Closing the generator early aborts the request."""
        yield from self._stream(lambda on_token: self.core.make_sequence(prompt, params, on_token))

    def _stream(self, make: Callable[[Callable[[int, int, str], None]], Sequence]) -> Iterator[str]:
        """Queue the sequence `make(on_token)` builds (validated now), and iterate its text deltas."""
        deltas: queue.SimpleQueue = queue.SimpleQueue()
        seq = make(lambda _rid, _n, delta: delta and deltas.put(delta))
        return self._deltas(self._enqueue([(seq, _Pending(deltas))])[0], deltas)

    def _deltas(self, rid: int, deltas: queue.SimpleQueue) -> Iterator[str]:
        finished = False
        try:
            while (delta := deltas.get()) is not None:
                yield delta
            finished = True
            self.result(rid)
        finally:
            if not finished:
                self.abort(rid)

    def _run(self, seq: Sequence) -> RequestOutput:
        """Queue a built sequence and wait for its result."""
        return self.result(self._enqueue([(seq, _Pending())])[0])

    def chat(self, messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
             params: SamplingParams | Seq[SamplingParams] | None = None) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, rendered with the model's chat
        template (tokenizer_config.json or GGUF metadata)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        return self.generate([self.core.render_chat(c) for c in conversations], params)

    def load_lora(self, name: str, path: str) -> None:
        """Load a LoRA adapter in PEFT's format (adapter_config.json + adapter_model.safetensors) under
        `name`, for `SamplingParams(lora=name)`: read, checked and copied into a free slot here, on
        the caller's thread. Bad adapters (unknown modules, wrong shapes, a rank above max_lora_rank)
        raise ValueError."""
        if self.core.lora is None:
            raise ValueError("this engine has no LoRA slots; build it with LLM(..., max_loras=N)")
        self.core.lora.load(name, path)

    def unload_lora(self, name: str) -> None:
        """Forget an adapter (its slot freed); refused while requests under it run."""
        if self.core.lora is None:
            raise ValueError("this engine has no LoRA slots")
        self.core.lora.unload(name)

    def abort(self, request_id: int) -> None:
        """Abort a request; its result (finish_reason 'abort') is still delivered."""
        with self._cv:
            waiting = self._lora_waiting.pop(request_id, None)
            if waiting is not None:  # (still without a LoRA slot: the loop takes it and aborts it from its queue)
                self.core.lora.cancel(request_id)
                self._inbox.append(("add", waiting))
            self._inbox.append(("abort", request_id))
            self._cv.notify()

    def _post(self, kind: str, item: object) -> None:
        with self._cv:
            self._inbox.append((kind, item))
            self._cv.notify()

    def result(self, request_id: int, timeout: float | None = None) -> RequestOutput:
        with self._cv:
            pending = self._pending.get(request_id)
        if pending is None:
            raise KeyError(f"unknown request id {request_id} (or its result was already taken)")
        if not pending.done.wait(timeout):
            raise TimeoutError(f"request {request_id} did not finish within {timeout} s")
        with self._cv:
            self._pending.pop(request_id, None)
        if pending.error is not None:
            raise RuntimeError(f"request {request_id} failed: {pending.error!r}") from pending.error
        return pending.output

    def generate(self, prompts: str | list[int] | Seq[str | list[int]],
                 params: SamplingParams | Seq[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run a batch of prompts to completion; outputs come back in prompt order."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        return [self.result(rid) for rid in self.submit_many(prompts, params)]

    def stats(self) -> dict[str, Any]:
        with self._cv:
            stats = self.core.stats()
            stats["waiting"] += sum(1 for kind, _ in self._inbox if kind == "add") + len(self._lora_waiting)
            return stats

    def shutdown(self) -> None:
        """Stop the loop; requests still pending get an error result rather than none."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join()
        self._fail_pending(RuntimeError("the engine was shut down before this request finished"))
        self._callbacks_done()
        gc.unfreeze()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ---- the loop thread ----------------------------------------------------------------
    def _on_finish(self, seq: Sequence) -> None:
        out = self.core.output(seq)
        with self._cv:
            pending = self._pending.get(seq.request_id)
            if pending is not None and pending.on_finish is not None:
                del self._pending[seq.request_id]
        if pending is not None and pending.on_finish is not None:
            pending.on_finish(out, seq.error)
        elif pending is not None:
            pending.output, pending.error = out, seq.error
            pending.done.set()
            if pending.deltas is not None:
                pending.deltas.put(None)

    def _loop(self) -> None:
        try:
            self.core.layer.enter_loop_thread()
            sched = self.core.scheduler
            while True:
                with self._cv:
                    if not self._inbox and not sched.has_work() and self.core.runner.clock is not None:
                        self.core.runner.clock.pause()
                    while not self._inbox and not sched.has_work() and not self._stopping:
                        self._parked = True
                        self._cv.wait()
                        self._parked = False
                    if self._stopping:
                        return
                    inbox, self._inbox = self._inbox, deque()
                for kind, item in inbox:
                    if kind == "add":
                        sched.add(item)
                    elif kind == "abort":
                        sched.abort(item)
                    else:
                        sched.release_prefix(item)
                if sched.has_work():
                    sched.tick()
                self._callbacks_done()
        except BaseException as e:  # the loop must never die silently: fail every pending request
            self._error = e
            self._fail_pending(e)
            self._callbacks_done()
        finally:
            self.core.close()
            if self.core.lora is not None:
                self.core.lora.close()

    def _callbacks_done(self) -> None:
        if self.after_callbacks is not None:
            self.after_callbacks()

    def _fail_pending(self, error: BaseException) -> None:
        with self._cv:
            callbacks = [p.on_finish for p in self._pending.values() if p.on_finish is not None]
            self._pending = {rid: p for rid, p in self._pending.items() if p.on_finish is None}
            for pending in self._pending.values():
                if not pending.done.is_set():
                    pending.error = error
                    pending.done.set()
                    if pending.deltas is not None:
                        pending.deltas.put(None)
        for on_finish in callbacks:
            on_finish(None, error)

    def _raise_if_dead(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the engine loop died: {self._error!r}") from self._error
        if self._stopping:
            raise RuntimeError("the engine is shut down")
