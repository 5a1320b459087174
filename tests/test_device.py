"""The CPU stand-in of the device layer exposes ordering bugs: a copy lands only when waited on,
and a released landing buffer is poisoned."""
import mmap

import numpy as np
import pytest
import torch

from slipstream.device import POISON, DeviceLayer, SharedHost


def test_copy_lands_only_when_waited_on():
    layer = DeviceLayer(torch.device("cpu"))
    landing = layer.landing((4,), torch.int64)
    landing.poison()
    src = torch.tensor([1, 2, 3])
    landing.start(src, layer.event())
    src.fill_(9)  # the copy captured the value at start, as a queued device copy would
    assert landing.host[:3].tolist() == [POISON] * 3
    assert landing.wait().tolist() == [1, 2, 3]


def test_release_poisons_the_landing_buffer():
    layer = DeviceLayer(torch.device("cpu"))
    landing = layer.landing((2,), torch.int64)
    landing.start(torch.tensor([5, 6]), layer.event())
    assert landing.wait().tolist() == [5, 6]
    landing.poison()
    assert landing.host.tolist() == [POISON, POISON]


def test_shared_host_memory_is_seen_by_another_mapping_of_its_descriptor():
    """What the matcher process maps (its descriptor) holds what the engine's tensors hold, at the
    offsets `offset` reports; parts start at 64-byte boundaries and the block refuses to overflow.
    A landing waits for its reader before it is written again."""
    parts = [((3,), torch.int64), ((4, 5), torch.int32)]
    shared = SharedHost(DeviceLayer(torch.device("cpu")), SharedHost.size(parts))
    tokens, mask = (shared.take(shape, dtype) for shape, dtype in parts)
    tokens[:] = torch.tensor([7, 8, 9])
    mask[2, 4] = -5
    assert shared.offset(tokens) == 0 and shared.offset(mask) == 64
    other = mmap.mmap(shared.fd, shared.nbytes)
    assert np.frombuffer(other, np.int64, 3, 0).tolist() == [7, 8, 9]
    assert np.frombuffer(other, np.int32, 20, 64).reshape(4, 5)[2, 4] == -5
    with pytest.raises(ValueError, match="is full"):
        shared.take(shared.nbytes, torch.int8)


def test_a_landing_waits_for_its_reader_before_it_is_written_again():
    layer = DeviceLayer(torch.device("cpu"))
    landing, read = layer.landing((4,), torch.int64), []
    landing.start(torch.tensor([1, 2]), layer.event(), unlanded=True)
    assert landing.host[:2].tolist() == [-1, -1]  # (what another process takes for "not landed yet")
    landing.wait()
    landing.reader = lambda: read.append(landing.host[:2].tolist())
    landing.poison()  # (the CPU stand-in writes at release)
    landing.start(torch.tensor([3]), layer.event())
    assert read == [[1, 2]] and landing.reader is None
