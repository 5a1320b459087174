"""Moondream 2's parts as the spec states them: the tiling table (§3), the configuration and its
overrides (§1), the checkpoint checks (§2), the region values (§6) and the host's point/detect
state machine (§7.4)."""
from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from moondream_reference import pil_crops
from slipstream.kernels.attention import block_attention
from slipstream.models.loader import load_checkpoint
from slipstream.models.moondream.config import MoondreamConfig, VisionConfig
from slipstream.models.moondream import image as image_module
from slipstream.models.moondream.image import load_image, make_crops, prepare_image, select_tiling
from slipstream.models.moondream.region import coord_value, size_value
from slipstream.models.moondream.skills import SpatialSkill, query_prompt, settings_dict
from slipstream.models.random_checkpoint import write_checkpoint


@pytest.mark.parametrize("size, tiling", [((378, 378), (1, 1)), ((500, 375), (1, 1)), ((300, 2000), (1, 1)),
                                          ((640, 480), (2, 4)), ((1920, 1080), (2, 4)), ((1024, 768), (3, 4)),
                                          ((1024, 1024), (3, 3)), ((3000, 4000), (4, 2)), ((4000, 500), (1, 9))])
def test_tiling_follows_the_spec_table(size, tiling):
    w, h = size
    assert select_tiling(h - 112, w - 112, 266, 12) == tiling


def test_crops_are_the_global_crop_then_local_tiles_row_major():
    img = Image.new("RGB", (800, 600))
    img.paste((255, 0, 0), (0, 0, 400, 300))  # red top-left quarter
    prepared = prepare_image(img, VisionConfig())
    crops = make_crops(prepared, VisionConfig())
    assert prepared.tiling == (2, 4) and crops.shape == (9, 3, 378, 378) and crops.dtype == torch.uint8
    assert crops[1, 0, 10, 10] == 255 and crops[1, 1, 10, 10] == 0  # tile (0, 0): red
    assert crops[8, 0, -10, -10] == 0  # tile (1, 3): black


@pytest.mark.parametrize("shape", [(60, 80, 3), (600, 800, 3)])
def test_prepared_pixels_are_the_images_and_its_digest_tells_images_apart(shape):
    """The prefix cache's key: equal for equal pixels, different for one pixel changed (in the first
    or the last of the chunks an image's pixels are hashed in) or for the same bytes in another
    shape. An RGB image is read where it is (the caller's, never written), others converted."""
    pixels = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    img = Image.fromarray(pixels)
    assert load_image(img) is img and load_image(img.convert("L")).mode == "RGB"
    prepared = prepare_image(img, VisionConfig())
    assert prepared.pixels.dtype == torch.uint8 and np.array_equal(prepared.pixels.numpy(), pixels)
    assert prepare_image(Image.fromarray(pixels.copy()), VisionConfig()).digest == prepared.digest
    first, last = pixels.copy(), pixels.copy()
    first[0, 0, 0] ^= 1
    last[-1, -1, -1] ^= 1
    reshaped = pixels.reshape(shape[1], shape[0], 3)
    digests = {prepare_image(Image.fromarray(p), VisionConfig()).digest for p in (pixels, first, last, reshaped)}
    assert len(digests) == 4 and np.array_equal(np.asarray(img), pixels)


@pytest.mark.parametrize("size", [(378, 378), (500, 375), (50, 40), (640, 480), (800, 600), (1280, 720),
                                  (1024, 768), (1024, 1024), (4000, 500), (2000, 300)])
def test_crops_are_pillows_lanczos_bit_for_bit(size):
    """Pillow's two passes, horizontal first (Pillow before 13, and 13 unless the height shrinks much
    more than the width: then 13 goes vertical first, docs/moondream.md), as matrix products."""
    w, h = size
    img = Image.fromarray(np.random.default_rng(w * h).integers(0, 256, (h, w, 3), dtype=np.uint8))
    prepared = prepare_image(img, VisionConfig())
    assert np.array_equal(make_crops(prepared, VisionConfig()).numpy(), pil_crops(img, prepared.tiling))


@pytest.mark.parametrize("size", [(50, 40), (500, 375)])  # (the interpreter: ~10 s a size)
def test_crops_by_the_resample_kernel_are_pillows_lanczos_bit_for_bit(size, monkeypatch):
    """The same crops from the integer taps (kernels.resample, one launch a pass, as on CUDA; here in
    Triton's interpreter), the vertical pass written through a transposed view straight into the
    global crop."""
    pytest.importorskip("triton")
    monkeypatch.setattr(image_module, "_by_taps", lambda x: True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    w, h = size
    img = Image.fromarray(np.random.default_rng(w * h).integers(0, 256, (h, w, 3), dtype=np.uint8))
    prepared = prepare_image(img, VisionConfig())
    there = dataclasses.replace(prepared, pixels=prepared.pixels.to(device),
                                plans=tuple(plan.to(device) for plan in prepared.plans))
    assert np.array_equal(make_crops(there, VisionConfig()).cpu().numpy(), pil_crops(img, prepared.tiling))


def test_config_defaults_are_the_release_and_overrides_use_the_reference_names():
    cfg = MoondreamConfig.from_overrides({}, "c")
    text = cfg.text_model()
    assert (text.hidden_size, text.num_layers, text.num_heads, text.rotary_dim, text.vocab_size) == (2048, 24, 32, 32,
                                                                                                     51200)
    assert cfg.vision.enc_n_layers == 27 and cfg.vision.grid == 27
    small = MoondreamConfig.from_overrides({"text": {"dim": 128, "n_heads": 2}, "vision": {"proj_out_dim": 128},
                                            "region": {"dim": 128}}, "c")
    assert small.text_model().hidden_size == 128
    with pytest.raises(ValueError, match="unknown field config.text.width"):
        MoondreamConfig.from_overrides({"text": {"width": 3}}, "c")
    with pytest.raises(ValueError, match="unknown Moondream config group 'audio'"):
        MoondreamConfig.from_overrides({"audio": {}}, "c")
    with pytest.raises(ValueError, match="must be 64"):
        MoondreamConfig.from_overrides({"text": {"n_heads": 16}}, "c")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_checkpoint("tiny-moondream", tmp_path_factory.mktemp("mdp") / "tiny")


def test_the_loader_names_a_missing_or_misshapen_tensor_and_a_missing_tokenizer(tiny, tmp_path):
    ckpt = load_checkpoint(tiny)
    assert ckpt.moondream is not None and set(ckpt.parts) == {"vision", "region"}
    assert ckpt.tensors["model.layers.0.self_attn.q_proj.weight"].shape == (128, 128)  # (qkv split for Phi)
    for name, change in (("missing", lambda t: t.pop("model.region.size_encoder.bias")),
                         ("misshapen", lambda t: t.__setitem__("model.vision.pos_emb", torch.zeros(1, 730, 64)))):
        bad = tmp_path / name
        shutil.copytree(tiny, bad)
        tensors = load_file(str(bad / "model.safetensors"))
        change(tensors)
        save_file(tensors, str(bad / "model.safetensors"))
        with pytest.raises(ValueError, match="size_encoder.bias' is missing" if name == "missing" else
                           r"pos_emb' has shape \(1, 730, 64\)"):
            load_checkpoint(bad)
    bare = tmp_path / "bare"
    shutil.copytree(tiny, bare)
    (bare / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="ships no tokenizer.*tokenizer=PATH"):
        load_checkpoint(bare)
    assert load_checkpoint(bare, tokenizer=tiny / "tokenizer.json").tokenizer.vocab_size == 1024


def test_compiled_names_lose_their_orig_mod_infix(tiny, tmp_path):
    compiled = tmp_path / "compiled"
    shutil.copytree(tiny, compiled)
    tensors = load_file(str(compiled / "model.safetensors"))
    tensors = {k.replace("model.text.", "model.text._orig_mod."): v for k, v in tensors.items()}
    save_file(tensors, str(compiled / "model.safetensors"))
    assert load_checkpoint(compiled).moondream is not None
    config = json.loads((compiled / "config.json").read_text())
    assert config["model_type"] == "moondream1"


def test_coordinates_are_bins_over_1024_and_sizes_log_scale_over_1023():
    assert coord_value(torch.tensor([0, 512, 1023])).tolist() == [0.0, 0.5, 1023 / 1024]
    assert size_value(torch.tensor([0, 1023])).tolist() == [2 ** -10, 1.0]


def test_block_attention_is_full_attention_within_each_block():
    q, k, v = torch.randn(3, 2 * 5, 4, 8).unbind(0)
    out = block_attention(q, k, v, 5, 0.3)
    for b in range(2):
        s = slice(5 * b, 5 * b + 5)
        want = torch.softmax(torch.einsum("qhd,khd->hqk", q[s], k[s]) * 0.3, dim=-1)
        assert torch.allclose(out[s], torch.einsum("hqk,khd->qhd", want, v[s]), atol=1e-5)


def test_the_host_state_machine_builds_points_and_boxes_and_stops():
    point = SpatialSkill(detect=False, max_objects=2, eos=0)
    for tok, bins in ((5, [256, 0, 0]), (5, [512, 0, 0]), (5, [0, 0, 0]), (5, [1024, 0, 0])):
        point.advance(tok, bins)
    assert point.objects == [{"x": 0.25, "y": 0.5}, {"x": 0.0, "y": 1.0}] and point.done
    box = SpatialSkill(detect=True, max_objects=5, eos=0)
    for tok, bins in ((5, [512, 0, 0]), (5, [512, 0, 0]), (6, [0, 1023, 1023]), (0, [0, 0, 0])):
        box.advance(tok, bins)
    assert box.objects == [{"x_min": 0.0, "y_min": 0.0, "x_max": 1.0, "y_max": 1.0}] and box.done
    assert box.max_steps() == 16 and point.max_steps() == 5


def test_query_doubles_the_answer_id_and_settings_have_the_reference_defaults():
    assert query_prompt(MoondreamConfig().tokenizer, [77, 78]) == [1, 15381, 2, 77, 78, 3, 3]
    assert settings_dict(None) == {"temperature": 0.5, "top_p": 0.3, "max_tokens": 768, "max_objects": 50, "lora": None}
