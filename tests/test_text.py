"""Committed tokens become text that streams without broken characters, cuts stop strings even
across token boundaries, holds back what may still be a stop string, and concatenates to the
final text — in the TextStream alone and through the engine."""
from __future__ import annotations

import pytest

from conftest import settled_stats
from constraints import ForceSequence
from slipstream import LLM, SamplingParams
from slipstream.models.random_checkpoint import build_tokenizer
from slipstream.text import TextStream
from slipstream.tokenizer import Tokenizer

TEXT = "the kernel 日本語 and 🙂 emoji, then: red green blue"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(build_tokenizer(600))


def stream_all(tok: Tokenizer, ids: list[int], stop: list[str]) -> tuple[list[str], TextStream]:
    ts = TextStream(tok, stop)
    pieces = []
    for t in ids:
        pieces.append(ts.push(t))
        if ts.stopped:
            break
    pieces.append(ts.finish())
    return pieces, ts


def test_no_broken_utf8_and_pieces_concatenate(tok):
    ids = tok.encode(TEXT)
    assert len(ids) > len(TEXT.split())  # multi-byte characters span several byte tokens
    pieces, ts = stream_all(tok, ids, [])
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == ts.text == TEXT


@pytest.mark.parametrize("stop,expect", [
    (["日本"], "the kernel "), (["nel 日"], "the ker"), (["🙂"], "the kernel 日本語 and "),
    (["then:", "kernel"], "the "), (["absent"], TEXT), (["blue"], "the kernel 日本語 and 🙂 emoji, then: red green "),
])
def test_stop_strings_cut_the_text(tok, stop, expect):
    pieces, ts = stream_all(tok, tok.encode(TEXT), stop)
    assert "".join(pieces) == ts.text == expect
    assert ts.stopped == (expect != TEXT)


def test_possible_stop_prefix_is_held_back(tok):
    ts = TextStream(tok, ["red green blue!"])
    released = "".join(ts.push(t) for t in tok.encode("then: red green"))
    assert released == "then: "  # "red green" could still become the stop string
    assert ts.finish() == "red green"


def test_incomplete_character_is_flushed_at_the_end(tok):
    ids = tok.encode("ok 🙂")
    pieces, ts = stream_all(tok, ids[:-1], [])  # the last byte of the emoji never arrives
    assert pieces[-1].endswith("\ufffd") and "".join(pieces) == ts.text


# ---- through the engine ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def llm(tiny_llama):
    with LLM(str(tiny_llama.path), device="cpu", max_num_seqs=4, num_pages=96, page_size=4) as engine:
        yield engine


def forced(llm: LLM, text: str, **kw) -> SamplingParams:
    ids = llm.tokenizer.encode(text)
    return SamplingParams(max_tokens=len(ids), constraint=lambda: ForceSequence(ids), **kw)


def test_engine_stream_equals_final_text_with_emoji_and_cjk(llm):
    text = "日本 語 🙂 the 🙂"
    params = forced(llm, text)
    pieces = list(llm.stream([1, 2], params))
    final = llm.generate([[1, 2]], params)[0]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == final.text == text


def test_engine_stop_string_across_tokens(llm):
    text = "the pipeline commit slot"
    ids = llm.tokenizer.encode(text)
    out = llm.generate([[3]], forced(llm, text, stop=["line com"]))[0]
    assert out.finish_reason == "stop" and out.text == "the pipe"
    cut = next(i for i in range(1, len(ids) + 1) if "line com" in llm.tokenizer.decode(ids[:i]))
    assert out.token_ids == ids[:cut]  # ends with the token that completed the stop string
    streamed = "".join(llm.stream([3], forced(llm, text, stop=["line com"])))
    assert streamed == out.text


def test_chat_applies_the_template(tmp_path):
    from slipstream.models.random_checkpoint import write_checkpoint

    write_checkpoint("tiny-llama", tmp_path)
    with LLM(str(tmp_path), device="cpu", num_pages=64) as engine:
        messages = [{"role": "user", "content": "the kernel"}]
        want = engine.tokenizer.encode("<|im_start|>user\nthe kernel<|im_end|>\n<|im_start|>assistant\n",
                                       add_special_tokens=False)
        out = engine.chat(messages, SamplingParams(max_tokens=4))[0]
        assert out.prompt_token_ids == want
        assert len(engine.chat([messages, messages], SamplingParams(max_tokens=2))) == 2
        with pytest.raises(ValueError, match="role"):
            engine.chat([{"content": "no role"}])


def test_chat_without_template_is_a_clear_error(llm):
    with pytest.raises(ValueError, match="no chat template"):
        llm.chat([{"role": "user", "content": "hi"}])


def test_closing_a_stream_early_aborts_the_request(llm):
    gen = llm.stream([4], SamplingParams(max_tokens=200, ignore_eos=True))
    next(gen)
    gen.close()
    stats = settled_stats(llm)
    assert stats["running"] == stats["waiting"] == 0
    assert stats["kv_pages_free"] == stats["kv_pages_total"]


@pytest.mark.parametrize("build", ["random", "trained"])
def test_fast_detokenizer_equals_decode(build, tiny_tokenizer):
    """The byte-table path streams exactly what tokenizers' own decode gives, for byte-level BPE."""
    from slipstream.tokenizer import IncrementalDetokenizer

    tok = Tokenizer(build_tokenizer(600) if build == "random" else tiny_tokenizer)
    assert tok.token_bytes is not None
    for text in (TEXT, "naïve café — ¡hola! ¿qué? 日本語の🙂🙂 <|im_end|> tail", " \\n\\t spaced  out "):
        ids = tok.encode(text)
        detok = IncrementalDetokenizer(tok)
        pieces = [detok.push(t) for t in ids] + [detok.flush()]
        assert all("\ufffd" not in p for p in pieces)
        assert "".join(pieces) == tok.decode(ids)


def test_other_decoders_take_the_window_path():
    from tokenizers import Tokenizer as Fast
    from tokenizers import decoders, models

    from slipstream.tokenizer import IncrementalDetokenizer

    fast = Fast(models.WordLevel({"▁hello": 0, "▁world": 1, "[UNK]": 2}, unk_token="[UNK]"))
    fast.decoder = decoders.Metaspace()
    tok = Tokenizer(fast)
    assert tok.token_bytes is None
    detok = IncrementalDetokenizer(tok)
    assert "".join(detok.push(t) for t in (0, 1)) + detok.flush() == tok.decode([0, 1]) == "hello world"


@pytest.mark.parametrize("build", ["random", "trained"])
def test_no_text_encodes_to_fewer_tokens_than_its_bytes_over_max_token_bytes(build, tiny_tokenizer):
    """The server refuses a prompt on its size alone by this bound, before tokenizing it."""
    tok = Tokenizer(build_tokenizer(600) if build == "random" else tiny_tokenizer)
    longest = max(tok.token_bytes, key=len)
    for text in (TEXT, longest.decode("utf-8", "replace") * 50, "<|im_end|>" * 20, " " * 500):
        assert len(tok.encode(text, add_special_tokens=False)) >= len(text.encode()) / tok.max_token_bytes
