"""A stand-in engine process: Ready, then every STEP_S one one-token Delta per running request
(at most MAX_RUNNING), each request's receipt time logged (time.monotonic) to RECEIPTS."""
import os, time, json
import msgspec, zmq
from slipstream.server.protocol import Abort, Delta, Generate, Ready, ToEngine

STEP_S = float(os.environ.get("FAKE_STEP_S", "0.002"))
MAX_RUNNING = int(os.environ.get("FAKE_RUNNING", "256"))


def run_fake(model, options, loras, requests_addr, outputs_addr):
    ctx = zmq.Context()
    out = ctx.socket(zmq.PUSH); out.connect(outputs_addr)
    req = ctx.socket(zmq.PULL); req.connect(requests_addr)
    enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(ToEngine)
    out.send(enc.encode(Ready(model="fake", max_model_len=4096, vocab_size=49152, max_prompt_bytes=1 << 20)))
    waiting, running, log = [], {}, open(os.environ["RECEIPTS"], "a")
    nxt = time.monotonic()
    while True:
        while req.poll(max(0, int((nxt - time.monotonic()) * 1000))):
            m = dec.decode(req.recv())
            if isinstance(m, Generate):
                log.write(json.dumps([m.id, time.monotonic()]) + "\n"); log.flush()
                waiting.append(m)
            elif isinstance(m, Abort):
                running.pop(m.id, None)
        nxt = time.monotonic() + STEP_S
        while waiting and len(running) < MAX_RUNNING:
            m = waiting.pop(0); running[m.id] = [m.params.get("max_tokens", 16), 0, len(m.prompt or [])]
        batch = []
        for rid, st in list(running.items()):
            st[1] += 1
            if st[1] >= st[0]:
                batch.append(Delta(rid, text="x", completion_tokens=st[1], finish_reason="length", prompt_tokens=st[2]))
                del running[rid]
            else:
                batch.append(Delta(rid, text="x", completion_tokens=st[1],
                                   stamps=(time.monotonic(), time.monotonic()) if st[1] == 1 else None))
        if batch:
            out.send(enc.encode(batch))
