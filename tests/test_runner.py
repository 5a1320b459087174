"""The runner's CUDA-graph buckets: what a step is padded to."""
from slipstream.runner import decode_bucket, token_buckets


def test_decode_batches_pad_to_powers_of_two_then_multiples_of_eight():
    assert [decode_bucket(n, 256) for n in (1, 2, 3, 5, 8, 9, 17, 250)] == [1, 2, 4, 8, 8, 16, 24, 256]
    assert decode_bucket(30, 20) == 20


def test_a_step_beside_decode_rows_pads_by_less_than_32_tokens():
    """Up to 1,024 tokens (decode rows and a prompt chunk) a step pads by at most 31 tokens; above,
    by less than a third; the budget itself is a bucket."""
    buckets = token_buckets(8192)
    assert buckets == sorted(set(buckets)) and buckets[0] == 16 and buckets[-1] == 8192
    for tokens in range(1, 8193):
        padded = next(b for b in buckets if b >= tokens)
        assert padded - tokens < (32 if tokens <= 1024 else tokens // 3)
    assert token_buckets(24) == [16, 24]
