"""A stand-in engine for one request at a time: FIRST_S after a request arrives its first token, then
one every ITL_S, 16 in all; the engine's stamps as the real one sends them."""
import os, time
import msgspec, zmq
from slipstream.server.protocol import Abort, Delta, Generate, Ready, ToEngine

FIRST_S = float(os.environ.get("FIRST_S", "0.002"))
ITL_S = float(os.environ.get("ITL_S", "0.0007"))
SPIN = os.environ.get("SPIN") == "1"


def wait(seconds):
    end = time.monotonic() + seconds
    if SPIN:
        while time.monotonic() < end:
            pass
    else:
        time.sleep(seconds)


def run_light(model, options, loras, requests_addr, outputs_addr):
    ctx = zmq.Context()
    out = ctx.socket(zmq.PUSH); out.connect(outputs_addr)
    req = ctx.socket(zmq.PULL); req.connect(requests_addr)
    enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(ToEngine)
    out.send(enc.encode(Ready(model="fake", max_model_len=4096, vocab_size=49152, max_prompt_bytes=1 << 20)))
    while True:
        m = dec.decode(req.recv())
        if not isinstance(m, Generate):
            continue
        received = time.monotonic()
        n = m.params.get("max_tokens", 16)
        wait(FIRST_S)
        for i in range(1, n + 1):
            now = time.monotonic()
            d = Delta(m.id, text="x", completion_tokens=i, stamps=(received, now) if i == 1 else None,
                      finish_reason="length" if i == n else None, prompt_tokens=len(m.prompt or []) if i == n else 0)
            out.send(enc.encode([d]))
            if i < n:
                wait(ITL_S)
