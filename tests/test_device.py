"""The CPU stand-in of the device layer exposes ordering bugs: a copy lands only when waited on,
and a released landing buffer is poisoned."""
import torch

from slipstream.device import POISON, DeviceLayer


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
