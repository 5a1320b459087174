"""The Moondream benchmark's floors (bench/moondream.py): what md2-query's per-image compute floor and
a lone request's floor count, from the loaded model's own parameters."""
import pytest

from slipstream import LLM
from slipstream.bench.moondream import query_floors
from slipstream.models.moondream.config import IMAGE_TOKENS, PREFIX_LEN


@pytest.fixture(scope="module")
def md():
    llm = LLM("random:tiny-moondream", device="cpu")
    llm._moondream()
    yield llm
    llm.shutdown()


def test_md2_query_floor_counts_the_encoder_over_the_images_crops_the_projection_and_the_prefix(md):
    peak, bandwidth = 1e9, 1e9  # FLOP per ms, bytes per second
    vision, text = md.core.runner.heads.vision, md.core.runner.model
    encoder = sum(p.numel() for n, p in vision.named_parameters() if not n.startswith("proj_mlp"))
    projection = sum(p.numel() for p in vision.proj_mlp.parameters())
    layers = sum(p.numel() for layer in text.model.layers for p in layer.parameters())
    layers += sum(p.numel() for p in text.model.final_layernorm.parameters())
    floors = query_floors(md, peak, bandwidth)
    assert floors["crops"] == 9  # 800x600: the spec's 2x4 tiling and the global crop
    assert floors["encoder_ms"] == pytest.approx(2 * encoder * IMAGE_TOKENS * 9 / peak)
    assert floors["projection_ms"] == pytest.approx(2 * projection * IMAGE_TOKENS / peak)
    assert floors["prefix_ms"] == pytest.approx(2 * layers * PREFIX_LEN / peak)
    assert floors["image_ms"] == pytest.approx(floors["encoder_ms"] + floors["projection_ms"] + floors["prefix_ms"])
    assert floors["req_s_ceiling"] == pytest.approx(1000 / floors["image_ms"])
    weights = sum(p.numel() * p.element_size() for p in text.parameters())
    assert floors["decode_step_ms"] == pytest.approx(weights / bandwidth * 1e3)
    assert floors["lone_request_ms"] == pytest.approx(floors["image_ms"] + 7 * floors["decode_step_ms"])
    assert query_floors(md, peak, bandwidth, image_size=(378, 378))["crops"] == 2
