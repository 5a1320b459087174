"""Sampling: greedy is argmax, seeded sampling is a pure function of (seed, token index) that
follows softmax(logits / T), masks remove tokens, and impossible parameters are rejected."""
import numpy as np
import pytest
import torch

from slipstream.sampling import SamplingParams, apply_bitmask, gumbel_noise, sample


def test_greedy_is_argmax():
    logits = torch.randn(5, 50)
    z = torch.zeros(5, dtype=torch.int64)
    out = sample(logits, torch.zeros(5, dtype=torch.float64), z, z, None, any_random=False)
    assert out.tolist() == logits.argmax(-1).tolist()


def test_noise_depends_only_on_seed_and_token_index():
    seeds = torch.tensor([7, 7, 8])
    idx = torch.tensor([3, 3, 3])
    g = gumbel_noise(seeds, idx, 100)
    assert torch.equal(g[0], g[1]) and not torch.equal(g[0], g[2])
    alone = gumbel_noise(seeds[2:], idx[2:], 100)  # same row in another batch: same noise
    assert torch.equal(alone[0], g[2])
    assert not torch.equal(gumbel_noise(seeds[:1], torch.tensor([4]), 100)[0], g[0])


def test_seeded_sampling_follows_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    n = 20000
    rows = logits.expand(n, 4)
    out = sample(rows, torch.full((n,), 0.7, dtype=torch.float64), torch.full((n,), 123), torch.arange(n), None,
                 any_random=True)
    freq = np.bincount(out.numpy(), minlength=4) / n
    np.testing.assert_allclose(freq, torch.softmax(logits / 0.7, 0).numpy(), atol=0.015)


def test_bitmask_removes_tokens():
    logits = torch.zeros(2, 40)
    words = torch.zeros(2, 2, dtype=torch.int32)
    words[0, 1] = 1 << 3  # only token 35
    words[1, 0] = int(np.array([(1 << 2) | (1 << 31)], dtype=np.uint32).view(np.int32)[0])  # tokens 2 and 31
    out = apply_bitmask(logits, words)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [35]
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [2, 31]


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_tokens=0), "max_tokens"), (dict(temperature=-0.5), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(seed=-1), "seed"), (dict(stop_token_ids=[-3]), "stop"),
])
def test_impossible_parameters_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)
