"""Requests, batching and the tick: launch (t+1), commit (t), finalize (t+1).

All state here is mutated by the loop thread (a grammar's matcher by the matcher process, from the
jobs this thread posts: invariant 5). A sequence is `finalized` when its result is
decided (EOS, stop token, length cap, abort) and emitted right then; it keeps its row and KV pages
until `inflight_refs` — the in-flight steps that reference it — drops to zero. A commit that meets
a finalized sequence (a zombie: it was planned into the next step before its end was known)
appends nothing and only drops the reference.

Each step is planned under one token budget (`max_step_tokens`): a decode row for every running
sequence, then chunks of prompts, oldest first — the rest of prompts already admitted, then new
admissions as rows and pages allow — of at most `prefill_chunk(decode rows)` tokens in all while
anything decodes: `max_prefill_chunk` scaled by what the rows cost (see there). Planning invariants
(each has a test in tests/test_scheduler.py):
  1. A step carries at most `max_step_tokens` tokens, and at most `prefill_chunk(its decode rows)`
     prompt tokens beside decode rows; every running sequence that still has tokens to produce is a
     decode row of every step: a prompt never pauses decoding for longer than one such step.
  2. A prompt is prefilled in order: each chunk starts where the previous launched chunk ended, and
     only the chunk that ends the prompt samples; a sequence is a decode row only after that.
  3. Admission is first come, first served: a request is admitted only after every earlier one.
     An image's prefix (Moondream: 730 positions, prefilled by the image path) is charged against
     the budget when it is new; it enters a step only first among the prompts or while the budget
     covers it, and its prompt's first chunk (up to `prefill_chunk` tokens) rides with it.
  4. Every sequence of a step holds one in-flight reference from the step's launch to its commit;
     a sequence's row, pages and LoRA slot are released only when it is finalized and holds none.
  5. A step's masks are filled only after the previous step's tokens advanced every constraint
     (masks from committed state): a grammar's in the matcher process, whose channel is in order
     (constrain/matcher_process.py), the others here. The rest of that commit (text, stop checks,
     callbacks, finishing, releases) runs on this thread while the matcher process fills, and is
     done before the tick ends, so the next plan sees it; a request's callbacks run in token
     order, one at a time; it ends by calling `after_rest` (the consumer ships its batch there:
     beside the fill, its thread's turn with the interpreter lock is off the next tick's launch
     and commit).
  6. Prefix caching: a page is registered under its key only once the KV of the tokens the key
     names is written or queued (a prompt's full pages once the step that fills them is launched,
     and before the next plan or that step's commit: the tick registers them after its commit, so
     hashing a large chunk's pages does not hold back the tokens of the step before it;
     an image prefix's at its admission, as the step's image work runs before any prompt of it
     reads them; generated ones at release, up to the tokens both committed and written); a
     sequence holds every page of its table from admission to release, so no page an in-flight
     step reads or writes is ever evicted; a cached run starts a prompt's prefill after it,
     leaving its last token to compute.
"""
from __future__ import annotations

import functools
import hashlib
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .constrain.grammar import GrammarConstraint
from .kv_cache import PagePool, chain_keys
from .pipeline import Pipeline, Step
from .runner import ALL_ALLOWED, ModelRunner
from .sampling import SamplingParams, TokenConstraint
from .text import TextStream


@dataclass
class ImagePrefix:
    """An image's prefix in the KV cache (Moondream: BOS + 729 image positions), shared by every
    sequence on that image. Its pages are allocated, and the step that first carries one of its
    sequences prefills them (the encoder's work), at that sequence's admission; later sequences
    reuse them. Each sequence holds the full pages in its page table and a copy of the last,
    partial one (its own prompt continues in that page). `holders` counts the sequences holding it
    (until their release, so in-flight steps included) and the handle (`LLM.encode_image`) while
    open; at zero its pages are freed."""

    crops: Any  # models.moondream.image.ImageCrops
    length: int
    holders: int = 0
    pages: list[int] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)  # prefix caching: its pages' keys (the partial last one's own)
    lora_slot: int = 0  # the slot of the adapter its prefix is computed under, when it is
    lora_id: bytes | None = None  # that adapter's id, the same for every sequence on it (None: none built yet)


@dataclass
class Sequence:
    request_id: int
    prompt_ids: np.ndarray  # int64 (engine._prompt_ids)
    params: SamplingParams
    max_tokens: int  # params.max_tokens capped by the model length
    seed: int
    eos_ids: frozenset[int]
    text: TextStream
    constraint: TokenConstraint | None = None
    on_token: Callable[["Sequence", str], None] | None = None  # (sequence, text delta) per committed token
    arrival: float = field(default_factory=time.perf_counter)
    row: int = -1
    pages: list[int] = field(default_factory=list)
    kv_len: int = 0  # tokens whose KV is written by steps launched so far (prompt chunks, then decode rows)
    sampled_launched: int = 0  # output tokens that launched steps will produce
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finalized: bool = False
    finish_reason: str | None = None
    inflight_refs: int = 0
    first_token_time: float | None = None
    finish_time: float | None = None
    error: BaseException | None = None  # raised by the request's own callback; the request is aborted
    # Moondream: the image prefix in front of its prompt (prompt positions [0, prefix.length)), the row's
    # skill code (skills.Skill), and point/detect's state machine
    prefix: ImagePrefix | None = None
    skill: int = 0
    spatial: Any = None
    # prefix caching: the keys of its full pages hashed so far (Scheduler._page_keys), how many of
    # the sequence's pages are registered under theirs, and the prompt tokens it found cached
    page_keys: list[bytes] = field(default_factory=list)
    registered: int = 0
    cached_tokens: int = 0
    lora_slot: int = 0  # the LoRA slot it holds from submit (or from when one is granted) to release (0: none)
    lora_id: bytes = b""  # its adapter's id (the prefix cache's salt)

    @property
    def prompt_start(self) -> int:
        """Where the prompt's own tokens start (after an image prefix)."""
        return self.prefix.length if self.prefix is not None else 0

    @property
    def prefilling(self) -> bool:
        """Part of the prompt is still to be launched."""
        return self.kv_len < len(self.prompt_ids)


class Scheduler:
    def __init__(self, runner: ModelRunner, pool: PagePool, depth: int, max_num_seqs: int, max_step_tokens: int,
                 max_prefill_chunk: int, weight_kv_tokens: float, on_finish: Callable[[Sequence], None]) -> None:
        self.runner = runner
        self.pool = pool
        self.pipeline = Pipeline(depth)
        self.max_num_seqs = max_num_seqs
        self.max_step_tokens = max_step_tokens
        self.max_prefill_chunk = max_prefill_chunk
        self.weight_kv_tokens = weight_kv_tokens  # KV tokens as many bytes as a decode step's weights
        self.on_finish = on_finish
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}  # holds a row and pages: live sequences and zombies
        self.free_rows = list(range(max_num_seqs - 1, -1, -1))
        self.steps = {"prefill": 0, "decode": 0}
        self.prompt_tokens = 0  # prompt tokens admitted, and those whose KV was found cached (or an image's
        self.cached_tokens = 0  # prefix already encoded), for the hit rate
        self.commit_log: deque[tuple[str, float]] = deque(maxlen=100_000)  # (kind, commit time), for benchmarks
        self.waited = 0.0  # seconds this tick spent blocked on a copy event
        self._unregistered: Step | None = None  # launched, its prompt pages not yet registered (invariant 6)
        self.after_rest: Callable[[], None] | None = None  # called as each commit's rest ends (LLM.after_callbacks)

    # ---- requests -------------------------------------------------------------------------
    def reserve_tokens(self, seq: Sequence) -> int:
        """KV tokens reserved at admission: prompt + max_tokens + one zombie step."""
        return len(seq.prompt_ids) + seq.max_tokens + 1

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def abort(self, request_id: int) -> None:
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                self._finish(seq, "abort")
                self._drop_lora(seq)
                return
        seq = self.running.get(request_id)
        if seq is not None and not seq.finalized:
            self._finish(seq, "abort")
            self._release_if_done(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.pipeline.inflight)

    # ---- the tick -------------------------------------------------------------------------
    def tick(self) -> None:
        """One scheduler tick. Pipelined (depth 2): launch(t+1), commit(t), finalize(t+1).
        Blocking (depth 1): launch(t+1), finalize(t+1), commit(t+1). Same code, the depth decides.

        A commit is two parts: its tokens in (each constrained row advanced: what the next step's
        masks are built from; a grammar's matcher accepts its token in the matcher process, as it
        lands), then the rest (text, stop checks, callbacks, finishing, releases).
        When a constrained step waits for the matcher process's fill, the rest runs meanwhile, and
        is done before the tick ends (invariant 5)."""
        start = time.perf_counter()
        self.waited = 0.0
        pipe = self.pipeline
        launched = pipe.can_launch() and self._launch_next()
        if pipe.inflight and (len(pipe.inflight) >= pipe.depth or not launched):
            oldest = pipe.oldest()
            if not oldest.finalized:
                self._finalize(oldest)
            if oldest is self._unregistered:  # (blocking: before its commit releases any of its sequences)
                self._register_launched()
            rest = functools.partial(self._commit_rest, oldest, self._commit_tokens(oldest))
            following = pipe.unfinalized()
            if following:
                self._finalize(following[0], beside=rest)
            else:
                rest()
        for step in pipe.unfinalized():
            self._finalize(step)
        if self._unregistered is not None:
            self._register_launched()
        if self.runner.profiler is not None:
            self.runner.profiler.tick(start, time.perf_counter(), self.waited)

    def _launch_next(self) -> bool:
        start = time.perf_counter()
        step = self._plan()
        if step is None:
            return False
        self.pipeline.launch(step)
        self.runner.launch_forward(step)
        if step.constrained:
            self._post_fill(step)
        for s in step.seqs:
            s.inflight_refs += 1
        for s in step.seqs[:step.num_decode]:
            s.kv_len += 1
        for s, (first, n) in zip(step.seqs[step.num_decode:], step.chunks):
            s.kv_len = first + n
        for s in step.sampled:
            s.sampled_launched += 1
        if self.pool.caching:
            self._unregistered = step
        self.steps[step.kind] += 1
        self._timed("launch", start)
        if not step.constrained:
            self._finalize(step)
        return True

    def prefill_chunk(self, decode: list[Sequence]) -> int:
        """The prompt tokens a step may carry beside these decode rows: `max_prefill_chunk`, times
        the rows' KV bytes over the weights' where the KV outweighs them. A decode step costs about
        the same until its rows read more KV than weights (launches and the weights' read set its
        time), then grows with the KV, while a chunk costs its tokens' compute: so the chunk's share
        of the step, and what it adds to the running rows' inter-token latency, stay in proportion
        whether the rows read 1 GB or 30 (Phi-1.5's 256 rows of ~620 tokens read 12x its weights: a
        fixed chunk made every admission a step paying that read for a few hundred prompt tokens)."""
        context = sum(s.kv_len for s in decode)
        return int(self.max_prefill_chunk * max(1.0, context / self.weight_kv_tokens))

    def _plan(self) -> Step | None:
        """The next step: a decode row for every live sequence that still has tokens to produce (one
        whose launched steps already reach max_tokens is known to finish, so it never becomes a
        zombie), then prompt chunks under what is left of the budget (planning invariants 1-3)."""
        decode, prefilling = [], []
        for s in self.running.values():
            if not s.finalized:
                if s.prefilling:
                    prefilling.append(s)
                elif s.sampled_launched < s.max_tokens:
                    decode.append(s)
        budget = self.max_step_tokens - len(decode)
        chunk = self.prefill_chunk(decode) if prefilling or self.waiting else 0  # (no prompt to plan: no sum)
        if decode:
            budget = min(budget, chunk)
        chunked, chunks, images, copies = [], [], [], []
        for s in prefilling:  # admitted earlier (in admission order), part of the prompt still to go
            if budget == 0:
                break
            n = min(budget, len(s.prompt_ids) - s.kv_len)
            chunked.append(s)
            chunks.append((s.kv_len, n))
            budget -= n
        while budget > 0 and self.waiting and self.free_rows:
            seq = self.waiting[0]
            prefix = seq.prefix
            shared = prefix.length // self.pool.page_size if prefix is not None else 0
            cached_prefix = self._cached_prefix(seq) if prefix is not None and not prefix.pages else []
            new_prefix = prefix is not None and not prefix.pages and not cached_prefix
            if new_prefix and prefix.length >= budget and chunks:
                break  # (a new image prefix goes whole into one step, alone among prompts if the budget is smaller)
            hits = self._cached_pages(seq, shared)
            n_pages = self.pool.pages_for(self.reserve_tokens(seq)) - shared - len(hits)
            need = n_pages + (self.pool.pages_for(prefix.length) if new_prefix else 0)
            if need > self.pool.num_free - self.pool.unheld(cached_prefix + hits):
                break
            self.waiting.popleft()
            seq.row = self.free_rows.pop()
            self.pool.hold(cached_prefix + hits)
            seq.pages = hits + self.pool.allocate(n_pages)
            start = len(hits) * self.pool.page_size
            if prefix is not None:
                if cached_prefix:
                    prefix.pages = cached_prefix
                elif new_prefix:
                    prefix.pages = self.pool.allocate(self.pool.pages_for(prefix.length))
                    prefix.lora_slot = seq.lora_slot  # (its adapter's slot now, held by this sequence)
                    images.append(prefix)
                    for page, key in zip(prefix.pages, prefix.keys):  # (the step writes them before any
                        self.pool.register(page, key)  # prompt of it reads them: admissions after this one share them)
                    prompt = len(seq.prompt_ids) - prefix.length
                    budget = max(budget - prefix.length, min(prompt, chunk))
                if hits:  # (its first own page is a cached copy of the prefix's partial page and what follows)
                    start += shared * self.pool.page_size
                else:
                    start = prefix.length
                    if shared < len(prefix.pages):  # (its partial last page: the sequence's own copy)
                        copies.append((prefix.pages[shared], seq.pages[0]))
                seq.pages = prefix.pages[:shared] + seq.pages
                prefix.holders += 1
            seq.kv_len = start  # (what cached pages or an image prefix hold is written, or queued before)
            seq.registered = shared + len(hits)
            seq.cached_tokens = start - (prefix.length if new_prefix else 0)
            self.prompt_tokens += len(seq.prompt_ids)
            self.cached_tokens += seq.cached_tokens
            self.runner.bind_row(seq.row, seq.pages, seq.params, seq.seed, seq.skill, seq.lora_slot)
            if isinstance(seq.constraint, GrammarConstraint):
                seq.constraint.bind(seq.row)
            self.running[seq.request_id] = seq
            n = min(budget, len(seq.prompt_ids) - start)
            chunked.append(seq)
            chunks.append((start, n))
            budget -= n
        if not decode and not chunks:
            return None
        sampled = decode + [s for s, (start, n) in zip(chunked, chunks) if start + n == len(s.prompt_ids)]
        return Step(self.pipeline.launched, "prefill" if chunks else "decode", decode + chunked, chunks, sampled,
                    any(s.constraint for s in sampled), images, copies)

    @staticmethod
    def _grammar_rows(step: Step, ended: bool) -> tuple[Any, list[int], list[int]]:
        """The matcher process and the step's live grammar rows: their indices in the step and their
        rows (`ended`: those whose grammar has ended too)."""
        process, indices, rows = None, [], []
        for i, s in enumerate(step.sampled):
            c = s.constraint
            if isinstance(c, GrammarConstraint) and not s.finalized and (ended or not c.is_terminated()):
                process = c.process
                indices.append(i)
                rows.append(c.row)
        return process, indices, rows

    def _post_fill(self, step: Step) -> None:
        """Ask the matcher process for the masks of the step's grammar rows (at launch: it fills them
        once it has accepted the tokens of the step before, which it does the moment they land)."""
        process, indices, rows = self._grammar_rows(step, ended=False)
        if rows:
            step.grammar_fill = (process, process.post_fill(step.slot, indices, rows), indices)

    def _finalize(self, step: Step, beside: Callable[[], None] | None = None) -> None:
        """Queue the step's sampling. Masks come from committed state: the previous step has
        committed by now whenever this step has a constrained row. `beside` (the rest of that
        commit) runs before the wait for the matcher process's fill (only a constrained step, which
        is masked, is finalized after its launch). Then the matcher process is asked to accept the
        step's grammar rows' tokens as they land."""
        masked = step.constrained
        start = time.perf_counter()
        if masked:
            words = self.runner.mask_rows(step)
            filled = np.zeros(len(words), bool)  # (rows the matcher process fills, then the rest here)
            if step.grammar_fill is not None:
                filled[step.grammar_fill[2]] = True
            local = [(i, s.constraint) for i, s in enumerate(step.sampled)  # (a terminated constraint has no next
                     if s.constraint is not None and not isinstance(s.constraint, GrammarConstraint)  # token: its row
                     and not s.finalized and not s.constraint.is_terminated()]  # is a zombie, anything goes)
            filled[[i for i, _ in local]] = True
            words[~filled] = ALL_ALLOWED
            for i, c in local:
                words[i] = 0
                c.fill_mask(words[i])
            if beside is not None:
                self._timed("mask_fill", start)
                beside()  # (its own phase: "text")
                start = time.perf_counter()
            if step.grammar_fill is not None:
                process, job, _ = step.grammar_fill
                process.wait_filled(job)
            start = self._timed("mask_fill", start)
        self.runner.launch_sampling(step, masked)
        self.pipeline.finalize(step)
        if masked:
            self._post_accept(step)
        self._timed("sampling", start)

    def _post_accept(self, step: Step) -> None:
        """Ask the matcher process to accept the step's tokens of its live grammar rows as they land."""
        process, indices, rows = self._grammar_rows(step, ended=True)
        if rows:
            job = process.post_accept(step.slot, indices, rows)
            self.runner.slots[step.slot].landing.reader = functools.partial(process.wait_read, job)

    def _commit_tokens(self, step: Step) -> list[int]:
        """The first part of a commit: wait for the step's tokens, add them to the live sequences,
        advance their constraints; the step leaves flight and its slot is free again."""
        before = time.perf_counter()
        tokens, logprobs, bins = self.runner.wait_tokens(step)
        now = time.perf_counter()
        self.waited += now - before
        self.commit_log.append((step.kind, now))
        if self.runner.clock is not None:
            self.runner.clock.committed(step)
        for i, (seq, tok) in enumerate(zip(step.sampled, tokens)):
            if not seq.finalized:
                seq.output_ids.append(tok)
                if seq.first_token_time is None:
                    seq.first_token_time = now
                if seq.params.logprobs is not None:
                    seq.logprobs.append(_logprob_entry(tok, logprobs[i], seq.params.logprobs))
                if seq.constraint is not None:
                    seq.constraint.advance(tok)
                if seq.spatial is not None:
                    seq.spatial.advance(tok, bins[i])
        self.runner.release(step)
        self.pipeline.commit_oldest()
        self._timed("commit", now)
        return tokens

    def _commit_rest(self, step: Step, tokens: list[int]) -> None:
        """The rest of a commit: each live row's text and stop checks, then the step's references
        dropped and finished sequences released."""
        start = time.perf_counter()
        for seq, tok in zip(step.sampled, tokens):
            if not seq.finalized:
                self._after_token(seq, tok)
        for seq in step.seqs:
            seq.inflight_refs -= 1
            self._release_if_done(seq)
        if self.after_rest is not None:
            self.after_rest()
        self._timed("text", start)

    def _timed(self, phase: str, since: float) -> float:
        """Charge the CPU time since `since` to a profiler phase (while one measures); returns now."""
        now = time.perf_counter()
        if self.runner.profiler is not None:
            self.runner.profiler.phase(phase, now - since)
        return now

    def _after_token(self, seq: Sequence, tok: int) -> None:
        """A committed token's text, and whether it ends the request."""
        stop_token = ((tok in seq.eos_ids and not seq.params.ignore_eos) or tok in seq.params.stop_token_ids
                      or (seq.constraint is not None and seq.constraint.is_terminated())
                      or (seq.spatial is not None and seq.spatial.done))
        if not stop_token and not self._emit(seq, seq.text.push(tok)):
            self._finish(seq, "abort")
            return
        if stop_token or seq.text.stopped:
            self._finish(seq, "stop")
        elif len(seq.output_ids) >= seq.max_tokens:
            self._finish(seq, "length")

    def _emit(self, seq: Sequence, delta: str) -> bool:
        """Hand a text delta to the request's callback. False if the callback raised: its error is
        kept on the sequence, whose result then raises it (a user callback must not take the engine
        down, nor other requests)."""
        if seq.on_token is None:
            return True
        try:
            seq.on_token(seq, delta)
        except Exception as e:
            seq.error = e
            return False
        return True

    def _finish(self, seq: Sequence, reason: str) -> None:
        """Decide the result and emit it, exactly once; rows and pages wait for inflight_refs."""
        seq.finalized = True
        seq.finish_reason = reason
        seq.finish_time = time.perf_counter()
        tail = seq.text.finish()
        if tail and seq.error is None:
            self._emit(seq, tail)
        self.on_finish(seq)

    def _release_if_done(self, seq: Sequence) -> None:
        if seq.finalized and seq.inflight_refs == 0 and seq.row >= 0:
            prefix = seq.prefix
            if self.pool.caching and seq.spatial is None:  # (a spatial row's next inputs are not its tokens)
                self._register_written(seq)
            self.pool.release(seq.pages[prefix.length // self.pool.page_size if prefix is not None else 0:][::-1])
            if prefix is not None:
                self.release_prefix(prefix)
            self.free_rows.append(seq.row)
            del self.running[seq.request_id]
            seq.pages, seq.row = [], -1
            if isinstance(seq.constraint, GrammarConstraint):
                seq.constraint.free()
            seq.constraint = seq.prefix = None  # frees its matcher, its image
            self._drop_lora(seq)

    def _drop_lora(self, seq: Sequence) -> None:
        """The sequence lets go of its LoRA slot: nothing in flight reads it for this sequence now."""
        if seq.lora_slot:
            self.runner.lora.release(seq.lora_slot)
            seq.lora_slot = 0

    def release_prefix(self, prefix: ImagePrefix) -> None:
        """A holder of the image prefix is done with it (a sequence released, or its handle closed)."""
        prefix.holders -= 1
        if prefix.holders == 0 and prefix.pages:
            self.pool.release(prefix.pages[::-1])
            prefix.pages = []

    # ---- prefix caching -------------------------------------------------------------------
    def _cached_pages(self, seq: Sequence, shared: int) -> list[int]:
        """Cached pages that continue the sequence's prompt from page `shared`, leaving at least its
        last token to compute (it samples). A penalized request finds none: its penalty state marks
        the prompt's tokens as its chunks run."""
        if not self.pool.caching or seq.params.penalized:
            return []
        end, hits, start, batch = (len(seq.prompt_ids) - 1) // self.pool.page_size, [], shared, 1
        while start < end:  # (keys hashed in growing batches, as far as the cache holds the prompt)
            stop = min(end, start + batch)
            found = self.pool.lookup(self._page_keys(seq, stop)[start:stop])
            hits += found
            if start + len(found) < stop:
                break
            start, batch = stop, batch * 4
        return hits

    def _page_keys(self, seq: Sequence, pages: int, tokens: np.ndarray | None = None) -> list[bytes]:
        """The keys (kv_cache.chain_keys) of the sequence's first `pages` full pages of `tokens` (its
        prompt; at release, its prompt and output), hashed when first asked for: at admission as far
        as the cache holds the prompt, the rest as its chunks are launched. Hashing a burst of 64
        prompts (35k tokens) up front took 3 ms on the H200's host before its first step could start
        (run s). An adapter's KV is its own (its id roots the chain); an image prefix's positions are
        placeholders (its digest tells them apart)."""
        if len(seq.page_keys) < pages:
            prefix, tokens = seq.prefix, seq.prompt_ids if tokens is None else tokens
            seq.page_keys = chain_keys(tokens[:pages * self.pool.page_size], self.pool.page_size,
                                       salt=seq.lora_id, extra=prefix.crops.digest if prefix is not None else b"",
                                       extra_until=prefix.length if prefix is not None else 0, keys=seq.page_keys)
        return seq.page_keys[:pages]

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """An image prefix's pages from the cache, all of them (its partial last page included) or
        none: a part could only be recomputed by encoding the image again."""
        prefix = seq.prefix
        if not self.pool.caching:
            return []
        shared = prefix.length // self.pool.page_size
        if not prefix.keys:
            prefix.keys = self._page_keys(seq, shared)
            if prefix.length % self.pool.page_size:  # (the partial page's own key: the image's positions alone)
                parent = prefix.keys[-1] if prefix.keys else b""
                prefix.keys.append(hashlib.blake2b(parent + b"image tail" + prefix.crops.digest,
                                                   digest_size=16).digest())
        pages = self.pool.lookup(prefix.keys)
        return pages if len(pages) == len(prefix.keys) else []

    def _register_launched(self) -> None:
        """Register the full prompt pages the last launched step's chunks fill (not before its launch:
        a chunk of the same step must not read a page that the same forward writes)."""
        start = time.perf_counter()
        step, self._unregistered = self._unregistered, None
        for s in step.seqs[step.num_decode:]:
            full = min(s.kv_len, len(s.prompt_ids)) // self.pool.page_size
            keys = self._page_keys(s, full)
            for i in range(s.registered, full):
                self.pool.register(s.pages[i], keys[i])
            s.registered = max(s.registered, full)
        self._timed("launch", start)  # (the profiler counts it with the launch that owes it)

    def _register_written(self, seq: Sequence) -> None:
        """At release: register the full pages of generated tokens whose KV was written (an aborted
        request's last steps may have written KV for tokens it never committed: not those)."""
        known = np.concatenate((seq.prompt_ids, np.asarray(seq.output_ids, np.int64)))[:seq.kv_len]
        written = len(known) // self.pool.page_size
        keys = self._page_keys(seq, written, known)
        for i in range(seq.registered, written):
            self.pool.register(seq.pages[i], keys[i])


def _logprob_entry(token: int, row, n: int) -> dict[int, float]:
    """{token id: logprob} for the top n and the sampled token, from a packed row [sampled, top-N
    values, top-N ids] where N >= n is the step's largest request."""
    top = (len(row) - 1) // 2
    entry = {int(i): float(v) for v, i in zip(row[1:1 + n], row[1 + top:1 + top + n])}
    entry[token] = float(row[0])
    return entry
