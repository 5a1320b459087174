"""Structured output inside the pipelined loop: every output that ends with "stop" is valid
(jsonschema checks JSON), every "length" output is a valid prefix of its grammar, pipelined
equals blocking with constraints on, stops and aborts free matchers (here and in the matcher
process) and pages, and bad grammars are rejected at submit."""
from __future__ import annotations

import functools
import gc
import json
import re
import time
import weakref

import jsonschema
import pytest

from conftest import settled_stats
from slipstream import LLM, SamplingParams
from slipstream.constrain.grammar import GrammarBackend, canonical, compile_grammar, tokenizer_info, vocabulary
from slipstream.models.loader import embedded_default_path
from slipstream.models.random_checkpoint import write_checkpoint

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                               "maxItems": 3},
                                      "score": {"type": "number"}, "ok": {"type": "boolean"}},
     "required": ["tags", "ok"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": {"type": "string", "pattern": "^[a-z]{2}[0-9]{2}$"}, "email": {"type": "string", "maxLength": 20}},
        "required": ["id"]}, "note": {"type": "string", "maxLength": 8}}, "required": ["user"]},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 4},
]
REGEXES = [r"[0-9]{3}-[0-9]{4}", r"(yes|no), because [a-z]{1,8}"]
CHOICES = [["pipeline", "kernel", "zombie"], ["red", "green"]]


def grammar_requests(max_tokens: int, seeded: bool) -> list[SamplingParams]:
    extra = dict(temperature=0.8, seed=11) if seeded else {}
    reqs = [SamplingParams(max_tokens=max_tokens, json_schema=s, **extra) for s in SCHEMAS]
    reqs += [SamplingParams(max_tokens=max_tokens, regex=r, **extra) for r in REGEXES]
    reqs += [SamplingParams(max_tokens=max_tokens, choice=c, **extra) for c in CHOICES]
    reqs.append(SamplingParams(max_tokens=max_tokens, json_object=True, **extra))
    reqs.append(SamplingParams(max_tokens=max_tokens, grammar='root ::= "a" ("b" | "c")* "d"', **extra))
    return reqs


@functools.lru_cache(maxsize=4)
def local_compiler(llm: LLM):
    """XGrammar in this process, for checking outputs (the engine's matchers are in its matcher process)."""
    import xgrammar as xgr

    vocab_size = llm.core.model_config.vocab_size
    info = tokenizer_info(vocabulary(llm.tokenizer, vocab_size), vocab_size, llm.core.model_config.eos_token_ids)
    return xgr.GrammarCompiler(info)


def local_matcher(llm: LLM, option: str, value):
    import xgrammar as xgr

    return xgr.GrammarMatcher(compile_grammar(local_compiler(llm), option, canonical(option, value)))


def check_output(params: SamplingParams, out, llm: LLM) -> None:
    if out.finish_reason == "stop":
        if params.json_schema is not None:
            jsonschema.validate(json.loads(out.text), params.json_schema)
        elif params.json_object:
            assert isinstance(json.loads(out.text), dict)
        elif params.regex is not None:
            assert re.fullmatch(params.regex, out.text), out.text
        elif params.choice is not None:
            assert out.text in params.choice
        else:
            assert re.fullmatch("a[bc]*d", out.text)
    else:
        assert out.finish_reason == "length"
        matcher = local_matcher(llm, *params.grammar_option)
        assert all(matcher.accept_token(tok) for tok in out.token_ids)  # a valid prefix


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    write_checkpoint("tiny-llama", path)
    return path


def settled_matchers(backend: GrammarBackend) -> dict:
    """The matcher process's live matchers once the frees posted so far are taken."""
    for _ in range(200):
        stats = backend.process.stats()
        if not stats["bound"] and not stats["pending"]:
            break
        time.sleep(0.01)
    return stats


def run(model, mode, params, prompts, **kw):
    with LLM(str(model), device="cpu", mode=mode, num_pages=256, page_size=4, max_num_seqs=6, **kw) as llm:
        outs = llm.generate(prompts, params)
        stats = settled_stats(llm)
        assert stats["kv_pages_free"] == stats["kv_pages_total"]
        gc.collect()
        matchers = settled_matchers(llm.core._grammar)
        assert not matchers["bound"] and not matchers["pending"]
        return outs, llm


@pytest.mark.parametrize("seeded", [False, True])
def test_outputs_are_valid_and_pipelined_equals_blocking(random_model, seeded):
    params = grammar_requests(40, seeded)
    free = [SamplingParams(max_tokens=20, temperature=0.7 if seeded else 0.0, seed=3)] * 3
    params = [p for pair in zip(params, free * 4) for p in pair] + params[len(free * 4):]  # mixed batches
    prompts = [[3 + i, 40 + i] for i in range(len(params))]
    outs = {mode: run(random_model, mode, params, prompts) for mode in ("blocking", "pipelined")}
    llm = outs["pipelined"][1]
    for p, a, b in zip(params, outs["pipelined"][0], outs["blocking"][0]):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        if p.grammar_option is not None:
            check_output(p, a, llm)
    assert any(o.finish_reason == "stop" for p, o in zip(params, outs["pipelined"][0]) if p.grammar_option)


def test_stop_and_abort_mid_grammar_free_matchers_and_pages(random_model):
    with LLM(str(random_model), device="cpu", num_pages=256, page_size=4, max_num_seqs=4) as llm:
        schema = SCHEMAS[0]
        llm.generate([[1]], SamplingParams(max_tokens=1, json_schema=schema))  # builds the backend
        backend, matchers = llm.core._grammar, []
        make = backend.constraint
        backend.constraint = lambda *a: matchers.append(weakref.ref(c := make(*a))) or c
        long_free = llm.submit([5, 6], SamplingParams(max_tokens=30))
        stopped = llm.submit([7], SamplingParams(max_tokens=3, json_schema=schema))  # cut mid-grammar
        aborted = llm.submit([8], SamplingParams(max_tokens=30, json_schema=schema),
                             on_token=lambda rid, n, d: n == 2 and llm.abort(rid))
        outs = [llm.result(r) for r in (long_free, stopped, aborted)]
        assert outs[1].finish_reason == "length" and len(outs[1].token_ids) == 3
        assert outs[2].finish_reason == "abort" and len(outs[2].token_ids) == 2
        assert outs[0].finish_reason in ("stop", "length")
        stats = settled_stats(llm)
        assert stats["kv_pages_free"] == stats["kv_pages_total"]
        gc.collect()
        assert len(matchers) == 2 and all(ref() is None for ref in matchers)  # both matchers released
        remote = settled_matchers(backend)
        assert not remote["bound"] and not remote["pending"]  # and in the matcher process
        alone = llm.generate([[5, 6]], SamplingParams(max_tokens=30))[0]
        assert alone.token_ids == outs[0].token_ids  # the constrained neighbours changed nothing


@pytest.mark.parametrize("params,match", [
    (dict(json_schema={"type": "nope"}), "invalid json_schema: Unsupported type"),
    (dict(json_schema="{not json"), "invalid json_schema: not valid JSON"),
    (dict(regex="(abc"), "invalid regex"), (dict(grammar="root ::= missing"), "invalid grammar"),
    (dict(choice=[]), "choice must be"), (dict(regex="a", choice=["a"]), "at most one"),
])
def test_bad_grammars_are_rejected_at_submit(random_model, params, match):
    with LLM(str(random_model), device="cpu", num_pages=64) as llm:
        with pytest.raises(ValueError, match=match):
            llm.submit([1], SamplingParams(**params))
        assert llm.stats()["steps"] == 0 and llm.stats()["waiting"] == 0


def test_compiled_grammars_are_cached_with_a_bound(random_model):
    with LLM(str(random_model), device="cpu", num_pages=64) as llm:
        core = llm.core
        backend = GrammarBackend(llm.tokenizer, core.model_config.vocab_size, core.model_config.eos_token_ids,
                                 core.runner, cache_size=2)
        try:
            backend.constraint("regex", "[ab]+")
            backend.constraint("regex", "[ab]+")
            assert backend.process.stats()["compiled"] == 1
            backend.constraint("regex", "c+")
            backend.constraint("regex", "d+")
            stats = backend.process.stats()
            assert stats["cache"] == [("regex", "c+"), ("regex", "d+")] and stats["compiled"] == 3
        finally:
            backend.close()


def test_a_constraint_has_terminated_exactly_when_xgrammar_says_so(random_model):
    """The engine keeps whether a grammar has ended (a stop token accepted) instead of asking the
    matcher process; it agrees with XGrammar's own answer."""
    with LLM(str(random_model), device="cpu", num_pages=64) as llm:
        llm.submit([1], SamplingParams(max_tokens=1, choice=["ab"]))
        backend, tok = llm.core._grammar, llm.tokenizer
        rows = [backend.constraint("choice", ["ab"]) for _ in range(2)]
        local = [local_matcher(llm, "choice", ["ab"]) for _ in range(2)]
        assert rows[0].stop_ids == frozenset(local[0].stop_token_ids)
        first, *rest = tok.encode("ab", add_special_tokens=False)
        assert rest, "the choice must take more than one token for the second row to stay incomplete"
        for t in [first, *rest]:
            for r, m in zip(rows, local):
                r.advance(t), m.accept_token(t)
        stop = min(rows[0].stop_ids)
        rows[0].advance(stop), local[0].accept_token(stop)
        assert [r.is_terminated() for r in rows] == [m.is_terminated() for m in local] == [True, False]


def test_embedded_smollm2_answers_with_valid_json():
    try:
        embedded_default_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    with LLM(device="cpu", num_pages=256) as llm:
        schema = {"type": "object", "properties": {
            "country": {"type": "string", "maxLength": 30}, "capital": {"type": "string", "maxLength": 30},
            "continent": {"enum": ["Africa", "Asia", "Europe", "North America", "South America", "Oceania"]}},
            "required": ["country", "capital", "continent"]}
        question = [{"role": "user", "content": "Give the country, capital and continent of France as JSON."}]
        out = llm.chat(question, SamplingParams(max_tokens=60, json_schema=schema))[0]
        assert out.finish_reason == "stop"
        answer = json.loads(out.text)
        jsonschema.validate(answer, schema)
        assert answer["capital"] == "Paris" and answer["continent"] == "Europe"
        prompts = [llm.core.render_chat([{"role": "user", "content": q}]) for q in
                   ("Describe a cat as JSON.", "List three colors as JSON.", "Is water wet? Answer yes or no.",
                    "Give a phone number.")]
        params = [SamplingParams(max_tokens=60, json_schema=SCHEMAS[0]),
                  SamplingParams(max_tokens=60, json_schema=SCHEMAS[3]),
                  SamplingParams(max_tokens=10, choice=["yes", "no"]),
                  SamplingParams(max_tokens=20, regex=REGEXES[0])]
        for p, o in zip(params, llm.generate(prompts, params)):
            assert o.finish_reason == "stop", o
            check_output(p, o, llm)
