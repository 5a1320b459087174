"""How many of a JSON answer's tokens a grammar forces (its mask allows exactly one token), for the
bench's schema and three realistic ones, on the embedded SmolLM2 tokenizer: what jump-forward
decoding could skip. Each instance is tokenized as the model would write it (compact separators, as
slipstream compiles schemas) and stepped through an XGrammar matcher."""
import json, sys
import numpy as np
import torch
import xgrammar as xgr

sys.path.insert(0, "src")
from slipstream.engine import LLM
from slipstream.constrain.grammar import vocabulary, tokenizer_info, compile_grammar

llm = LLM()
tok = llm.tokenizer
vs = llm.core.model_config.vocab_size
stops = [tok.eos_token_id] if getattr(tok, "eos_token_id", None) is not None else []
info = tokenizer_info(vocabulary(tok, vs), vs, stops)
compiler = xgr.GrammarCompiler(info)

CASES = {
    "bench {text}": ({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
                     {"text": "The quick brown fox jumps over the lazy dog, then runs off into the forest to find its friends."}),
    "person": ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                "email": {"type": "string"}, "is_member": {"type": "boolean"}},
                "required": ["name", "age", "email", "is_member"]},
               {"name": "Ada Lovelace", "age": 36, "email": "ada@example.com", "is_member": True}),
    "order (nested, enum)": ({"type": "object", "properties": {
        "order_id": {"type": "string"}, "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "quantity": {"type": "integer"}, "price": {"type": "number"}},
            "required": ["sku", "quantity", "price"]}},
        "shipping": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                     "postal_code": {"type": "string"}, "country": {"type": "string"}},
                     "required": ["street", "city", "postal_code", "country"]}},
        "required": ["order_id", "status", "items", "shipping"]},
        {"order_id": "A-10293", "status": "shipped",
         "items": [{"sku": "KB-01", "quantity": 2, "price": 19.99}, {"sku": "MS-7", "quantity": 1, "price": 9.5}],
         "shipping": {"street": "1 Main St", "city": "Springfield", "postal_code": "12345", "country": "US"}}),
    "classification": ({"type": "object", "properties": {
        "label": {"enum": ["positive", "negative", "neutral"]}, "confidence": {"type": "number"}},
        "required": ["label", "confidence"]}, {"label": "positive", "confidence": 0.93}),
}

res = {}
mask = xgr.allocate_token_bitmask(1, vs)
for name, (schema, inst) in CASES.items():
    g = compile_grammar(compiler, "json_schema", json.dumps(schema))
    m = xgr.GrammarMatcher(g)
    text = json.dumps(inst, separators=(",", ":"))
    ids = tok.encode(text, add_special_tokens=False) if "add_special_tokens" in tok.encode.__code__.co_varnames else tok.encode(text)
    forced = runs = 0
    in_run = False
    jump_chars = 0
    ends = np.cumsum([len(tok.decode([t])) for t in ids])  # each token's end offset in the text
    covered, until = 0, 0  # tokens inside a jump-forward string (from the state before them)
    run_lengths, run = [], 0  # the forced strings' lengths in tokens
    for i, t in enumerate(ids):
        start = ends[i - 1] if i else 0
        if start >= until:
            if run:
                run_lengths.append(run)
            run = 0
            until = start + len(m.find_jump_forward_string())
        inside = bool(ends[i] <= until)
        covered += int(inside)
        run += int(inside)
        m.fill_next_token_bitmask(mask)
        allowed = int(xgr.bitmask_to_bool(mask[0]).sum()) if hasattr(xgr, "bitmask_to_bool") else \
            int(sum(bin(int(w) & 0xffffffff).count("1") for w in mask[0].tolist()))
        if allowed == 1:
            forced += 1
            runs += not in_run
            in_run = True
        else:
            in_run = False
        jump_chars += len(m.find_jump_forward_string()) > 0
        assert m.accept_token(t), (name, text, t)
    if run:
        run_lengths.append(run)
    # a pipeline of depth 2 samples the next two tokens before a jump found after a token can land, so a
    # forced string of L tokens saves at most L - 2 steps (and turns the row's step into a packed one)
    saved_depth2 = sum(max(0, n - 2) for n in run_lengths)
    res[name] = dict(tokens=len(ids), forced=forced, forced_share=forced / len(ids), runs=runs,
                     positions_with_jump_string=jump_chars,
                     tokens_in_jump_strings=int(covered), forced_string_tokens=run_lengths,
                     steps_saved_at_depth_2=saved_depth2)
    print(f"{name:22s}: {len(ids):3d} tokens, {forced:3d} forced ({100 * forced / len(ids):4.1f}%) in {runs} runs; "
          f"a jump-forward string at {jump_chars} positions; {covered} tokens ({100 * covered / len(ids):.0f}%) "
          f"lie inside one, in strings of {run_lengths} tokens: at depth 2 at most {saved_depth2} steps saved", flush=True)
json.dump(res, open("/tmp/jf/forced_tokens.json", "w"), indent=1)
