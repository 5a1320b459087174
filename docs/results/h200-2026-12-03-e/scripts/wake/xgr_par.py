"""Constrained rows' XGrammar work per tick, serial against split over Python threads (each thread one
GIL-free call for its rows' accepts, then one for their fill): 64 matchers of the bench schema walked
by random allowed tokens. Usage: python xgr_par.py [rows] [steps]"""
import json, sys, time, threading
from concurrent.futures import ThreadPoolExecutor
import numpy as np
from slipstream.models.random_checkpoint import cached_checkpoint
from slipstream.tokenizer import Tokenizer
from slipstream.constrain.grammar import GrammarBackend, GrammarConstraint
from slipstream.bench.decode import JSON_BENCH_SCHEMA
import xgrammar as xgr
from xgrammar.tvm_ffi_binding import _ffi_api

R = int(sys.argv[1]) if len(sys.argv) > 1 else 64
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 300
d = cached_checkpoint("qwen2.5-0.5b")
tok = Tokenizer.from_dir(d)
V = json.load(open(d / "config.json"))["vocab_size"]
be = GrammarBackend(tok, V, [tok.token_id("<|im_end|>") or 0])
accept_many = _ffi_api.BatchGrammarMatcher.batch_accept_token
W = (V + 31) // 32


def walk(scheme, threads):
    rng = np.random.default_rng(0)
    cs = [be.constraint("json_schema", JSON_BENCH_SCHEMA) for _ in range(R)]
    words = np.zeros((R, W), np.int32)
    big = xgr.BatchGrammarMatcher(4)
    singles = [xgr.BatchGrammarMatcher(1) for _ in range(threads)]
    pool = ThreadPoolExecutor(max(1, threads - 1))
    big.batch_fill_next_token_bitmask([c.matcher for c in cs], words, list(range(R)))
    times = []
    stops = sorted(cs[0].stop_ids)
    chunks = np.array_split(np.arange(R), threads)

    def part(k, toks):
        idx = chunks[k]
        hs = [cs[i].matcher._handle for i in idx]
        accept_many(hs, [toks[i] for i in idx], False)
        if scheme == "split":
            singles[k].batch_fill_next_token_bitmask([cs[i].matcher for i in idx], words, [int(i) for i in idx])

    for step in range(STEPS):
        bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :V]
        bits[:, stops] = 0
        toks = []
        for r in range(R):
            allowed = np.flatnonzero(bits[r])
            if not len(allowed):  # (only the stop token left: the row starts a new object, untimed)
                cs[r] = be.constraint("json_schema", JSON_BENCH_SCHEMA)
                words[r] = 0
                big.batch_fill_next_token_bitmask([cs[r].matcher], words, [r])
                allowed = np.flatnonzero(np.unpackbits(words[r].view(np.uint8), bitorder="little")[:V])
            toks.append(int(rng.choice(allowed)))
        t = time.perf_counter()
        if scheme == "serial":
            for c, tk in zip(cs, toks):
                c.matcher.accept_token(tk)
            big.batch_fill_next_token_bitmask([c.matcher for c in cs], words, list(range(R)))
        else:
            futs = [pool.submit(part, k, toks) for k in range(1, threads)]
            part(0, toks)
            for f in futs:
                f.result()
            if scheme == "accepts":
                big.batch_fill_next_token_bitmask([c.matcher for c in cs], words, list(range(R)))
        times.append(time.perf_counter() - t)
    pool.shutdown()
    v = np.array(times[20:]) * 1e6
    return np.median(v), np.percentile(v, 90)


for scheme, threads in (("serial", 1), ("split", 2), ("split", 4), ("split", 6), ("split", 8)):
    med, p90 = walk(scheme, threads)
    print(f"{scheme:8s} threads {threads}: accepts + fill of {R} rows median {med:7.0f} p90 {p90:7.0f} µs", flush=True)
