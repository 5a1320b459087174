"""The command line: make-random writes a loadable checkpoint, generate streams its text, bench
writes its JSON, and bad input is an error message with exit code 2, not a traceback."""
import json

from slipstream.cli import main


def test_make_random_generate_and_bench(tmp_path, capsys):
    ckpt = tmp_path / "tiny"
    assert main(["make-random", "--preset", "tiny-phi", "--out", str(ckpt)]) == 0
    assert (ckpt / "model.safetensors").exists() and (ckpt / "tokenizer.json").exists()
    assert main(["generate", "the kernel", "--model", str(ckpt), "--device", "cpu", "--max-tokens", "5"]) == 0
    assert "finish_reason=" in capsys.readouterr().err
    assert main(["generate", "hi", "--chat", "--model", str(ckpt), "--device", "cpu", "--max-tokens", "3"]) == 0
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", str(ckpt), "--device", "cpu", "--streams", "1,2", "--max-tokens", "4",
                 "--prompt-tokens", "4", "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert {(r["mode"], r["streams"]) for r in results} == {(m, s) for m in ("pipelined", "blocking") for s in (1, 2)}
    assert all(r["output_tokens"] == 4 * r["streams"] for r in results)
    assert "pipelined/blocking" in capsys.readouterr().out
    assert main(["bench", "--model", str(ckpt), "--device", "cpu", "--streams", "2", "--mode", "pipelined",
                 "--max-tokens", "4", "--prompt-tokens", "4", "--temperature", "0.8", "--out", str(out)]) == 0
    assert [(r["workload"], r["output_tokens"]) for r in json.loads(out.read_text())["results"]] == [("sampled0.8", 8)]
    assert main(["bench", "--model", str(ckpt), "--device", "cpu", "--streams", "2", "--mode", "pipelined",
                 "--max-tokens", "4", "--prompt-tokens", "4", "--temperature", "0.8", "--top-p", "0.9",
                 "--out", str(out)]) == 0
    assert [r["workload"] for r in json.loads(out.read_text())["results"]] == ["sampled0.8p0.9"]


def test_errors_are_messages(tmp_path, capsys):
    assert main(["generate", "x", "--model", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["make-random", "--preset", "nope", "--out", str(tmp_path / "x")]) == 2
    assert main(["generate", "x", "--model", "random:tiny-llama", "--device", "cpu", "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err
    ckpt = tmp_path / "tiny"
    main(["make-random", "--preset", "tiny-llama", "--out", str(ckpt)])
    assert main(["bench", "--model", str(ckpt), "--device", "cpu", "--streams", "1", "--profile"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
    for flag, value, message in (("--page-size", "3", "page_size must be a power of two"),
                                 ("--kv-memory-fraction", "1.5", "kv_memory_fraction must be in (0, 1)"),
                                 ("--max-num-seqs", "0", "max_num_seqs must be >= 1")):
        assert main(["serve", "--model", str(ckpt), "--device", "cpu", flag, value]) == 2  # (before any process starts)
        assert message in capsys.readouterr().err


def test_bench_traffic_workloads_write_json_and_a_plot(tmp_path, capsys):
    ckpt = tmp_path / "tiny"
    main(["make-random", "--preset", "tiny-llama", "--out", str(ckpt)])
    out = tmp_path / "mixed.json"
    base = ["bench", "--model", str(ckpt), "--device", "cpu", "--max-num-seqs", "8", "--max-prefill-tokens", "32"]
    assert main(base + ["--workload", "mixed", "--requests", "12", "--prompt-range", "5,60", "--output-range", "2,6",
                        "--request-rate", "inf,50%", "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [(r["mode"], r["rate"] == float("inf")) for r in results] == [
        ("pipelined", True), ("pipelined", False), ("blocking", True), ("blocking", False)]
    for r in results:
        assert r["requests"] == 12 and 24 <= r["output_tokens"] <= 72 and 60 <= r["prompt_tokens"] <= 720
        assert 0 < r["ttft_ms_p50"] <= r["ttft_ms_p99"] <= r["e2e_ms_p99"] and r["itl_ms_p50"] > 0
    assert results[1]["rate"] == results[0]["requests_s"] / 2  # 50% of the capacity measured all at once
    engines = json.loads(out.read_text())["engine"]
    assert [engines[m]["cached_prompt_tokens"] for m in ("pipelined", "blocking")] == [0, 0]  # (every prompt new)
    assert out.with_suffix(".png").exists() and "TTFT p50/p99" in capsys.readouterr().out
    assert main(base + ["--workload", "ttft,interference", "--ttft-lengths", "8,40", "--decoding", "2",
                        "--arrival-tokens", "30", "--mode", "blocking", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["workload"] for r in report["results"]] == ["ttft 8", "ttft 40", "decode only", "interference"]
    assert report["engine"]["blocking"]["cached_prompt_tokens"] == 0
    assert main(base + ["--workload", "mixed,ttft", "--ttft-lengths", "16,5000"]) == 2  # (before any run)
    assert "--ttft-lengths asks for 5000-token prompts" in capsys.readouterr().err
    assert main(base + ["--workload", "mixed,short"]) == 2
    assert "--workload: one of decode" in capsys.readouterr().err
    assert main(base + ["--workload", "mixed", "--request-rate", "fast"]) == 2
    assert "--request-rate takes numbers" in capsys.readouterr().err
    assert main(base + ["--workload", "mixed", "--prompt-range", "9,3"]) == 2
    assert "--prompt-range takes two lengths" in capsys.readouterr().err


def test_moondream_skills_print_their_result_and_draw_the_marks(tmp_path, capsys):
    from PIL import Image

    ckpt, picture, drawn = tmp_path / "md", tmp_path / "in.png", tmp_path / "out.png"
    assert main(["make-random", "--preset", "tiny-moondream", "--out", str(ckpt)]) == 0
    capsys.readouterr()
    Image.new("RGB", (500, 400), (20, 120, 200)).save(picture)
    model = ["--model", str(ckpt), "--device", "cpu"]
    assert main(["detect", str(picture), "cat", *model, "--max-objects", "2", "--draw", str(drawn)]) == 0
    boxes = json.loads(capsys.readouterr().out)["objects"]
    assert len(boxes) == 2 and set(boxes[0]) == {"x_min", "y_min", "x_max", "y_max"}
    assert Image.open(drawn).size == (500, 400)
    assert main(["point", str(picture), "cat", *model, "--max-objects", "1"]) == 0
    assert len(json.loads(capsys.readouterr().out)["points"]) == 1
    assert main(["caption", str(picture), *model, "--max-tokens", "4", "--length", "short"]) == 0
    assert main(["query", str(picture), "Why?", *model, "--max-tokens", "4"]) == 0
    assert main(["caption", str(tmp_path / "none.png"), *model]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["caption", str(picture), "--model", "random:tiny-llama", "--device", "cpu"]) == 2
    assert "not Moondream 2" in capsys.readouterr().err


def test_the_shared_prefix_workload_runs_with_the_cache_and_without():
    from slipstream import LLM
    from slipstream.bench.traffic import run_shared_prefix

    with LLM("random:tiny-llama", device="cpu", max_num_seqs=8) as llm:
        on, off = run_shared_prefix(llm, requests=8, prefix_tokens=40, suffix_tokens=4, output_tokens=3)
        assert llm.core.pool.caching  # (switched back on)
    with LLM("random:tiny-llama", device="cpu", enable_prefix_caching=False) as llm:
        (alone,) = run_shared_prefix(llm, requests=2, prefix_tokens=20, suffix_tokens=2, output_tokens=2)
    assert (on.workload, off.workload, alone.workload) == ("shared-prefix cache on", "shared-prefix cache off",
                                                           "shared-prefix cache off")
    assert on.requests == off.requests == 8 and on.output_tokens == off.output_tokens == 24


def test_bench_consumer_gets_every_delta_once_a_pass(tiny_llama):
    """The bench hands text to its consumer thread as the server's engine process does: batched,
    one hand-off a pass (fewer than one a token), and nothing lost by the end."""
    from slipstream import LLM, SamplingParams
    from slipstream.bench.decode import Consumer

    with LLM(str(tiny_llama.path), device="cpu", max_num_seqs=4) as llm:
        consumer = Consumer(llm)
        handed = []
        ship = llm.after_callbacks
        llm.after_callbacks = lambda: (handed.append(len(consumer.batch)), ship())
        ids = llm.submit_many([[1, 2], [3], [4, 5, 6]], SamplingParams(max_tokens=8, ignore_eos=True),
                              on_token=consumer.push)
        outs = [llm.result(i) for i in ids]
        consumer.close()
    assert llm.after_callbacks is None
    for rid, out in zip(ids, outs):
        assert "".join(consumer.text[rid]) == out.text
    assert 0 < len([n for n in handed if n]) < sum(len(o.token_ids) for o in outs)
