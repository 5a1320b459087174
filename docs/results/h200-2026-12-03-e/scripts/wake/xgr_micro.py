"""Per-call cost of XGrammar accepts and fills for the bench schema (CPU machine): 64 matchers walked
by random allowed tokens, timing each phase per step."""
import time, json, numpy as np, torch
from slipstream.models.random_checkpoint import cached_checkpoint
from slipstream.tokenizer import Tokenizer
from slipstream.constrain.grammar import GrammarBackend, GrammarConstraint
from slipstream.bench.decode import JSON_BENCH_SCHEMA
import xgrammar as xgr
d = cached_checkpoint("qwen2.5-0.5b")
tok = Tokenizer.from_dir(d)
V = json.load(open(d / "config.json"))["vocab_size"]
be = GrammarBackend(tok, V, [tok.token_id("<|im_end|>") or 0])
R = 64
cs = [be.constraint("json_schema", JSON_BENCH_SCHEMA) for _ in range(R)]
words = np.zeros((R, (V + 31) // 32), np.int32)
rng = np.random.default_rng(0)
acc, fill, direct = [], [], []
GrammarConstraint.fill_masks(cs, words, list(range(R)))
for step in range(200):
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :V]
    toks = []
    for r in range(R):
        allowed = np.flatnonzero(bits[r])
        # prefer staying in the string: pick a random allowed token
        toks.append(int(rng.choice(allowed)))
    t = time.perf_counter()
    for c, tk in zip(cs, toks):
        if c.terminated:
            continue
        c.advance(tk)
    acc.append(time.perf_counter() - t)
    live = [i for i, c in enumerate(cs) if not c.terminated]
    for i, c in enumerate(cs):
        if c.terminated:
            cs[i] = be.constraint("json_schema", JSON_BENCH_SCHEMA)
    t = time.perf_counter()
    GrammarConstraint.fill_masks(cs, words, list(range(R)))
    fill.append(time.perf_counter() - t)
a, f = np.array(acc) * 1e6, np.array(fill) * 1e6
print(f"accepts of {R}: median {np.median(a):.0f} µs ({np.median(a)/R:.2f} each); fill of {R}: median {np.median(f):.0f} µs")
m = cs[0].matcher
t = time.perf_counter()
for _ in range(10000):
    m.is_terminated()
print(f"is_terminated: {(time.perf_counter()-t)/10000*1e6:.2f} µs")
h = m._handle
t = time.perf_counter()
for _ in range(10000):
    h.is_terminated()
print(f"handle.is_terminated: {(time.perf_counter()-t)/10000*1e6:.2f} µs")
# accept cost by state: rollback-based repeated accept of the same token
bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :V]
allowed = np.flatnonzero(bits[0])
tk = int(allowed[len(allowed)//2])
t = time.perf_counter()
for _ in range(2000):
    m.accept_token(tk); m.rollback(1)
print(f"accept+rollback: {(time.perf_counter()-t)/2000*1e6:.2f} µs  token {tk!r} {tok.fast.id_to_token(tk)!r} allowed {len(allowed)}")
