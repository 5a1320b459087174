"""Host facts for a lone request's wakes: ping-pong round trips between two processes, the
initiator idle 3 ms before each round (as a lone request finds the server), the responder blocking
or spinning (non-blocking receives in a loop); ZMQ ipc with its I/O threads placed by the kernel or
pinned beside the app thread; a Unix socket pair; and a fixed piece of Python timed cold (after
3 ms asleep) and warm (back to back). Usage: python wake3.py [rounds]"""
import os, socket, sys, time, json, multiprocessing as mp
import numpy as np, zmq

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 200
IDLE = 0.003
CPUS = sorted(os.sched_getaffinity(0))
A, B = CPUS[len(CPUS) // 4], CPUS[3 * len(CPUS) // 4]


def pin(cpu):
    os.sched_setaffinity(0, {cpu} if cpu is not None else CPUS)


def zctx(cpu, io_pin):
    ctx = zmq.Context()
    if io_pin and cpu is not None:
        ctx.set(zmq.THREAD_AFFINITY_CPU_ADD, cpu)
    return ctx


def zrecv(sock, spin):
    if not spin:
        return sock.recv()
    while True:
        try:
            return sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            pass


def zpong(cpu, spin, io_pin, a, b):
    pin(cpu)
    ctx = zctx(cpu, io_pin)
    rx = ctx.socket(zmq.PULL); rx.bind(a)
    tx = ctx.socket(zmq.PUSH); tx.connect(b)
    while (m := zrecv(rx, spin)) != b"q":
        tx.send(m)


def zmq_case(cpu_a, cpu_b, spin_b, spin_a, io_pin, tag):
    a, b = f"ipc:///tmp/w3-a-{tag}", f"ipc:///tmp/w3-b-{tag}"
    p = mp.get_context("spawn").Process(target=zpong, args=(cpu_b, spin_b, io_pin, a, b)); p.start()
    pin(cpu_a)
    ctx = zctx(cpu_a, io_pin)
    tx = ctx.socket(zmq.PUSH); tx.connect(a)
    rx = ctx.socket(zmq.PULL); rx.bind(b)
    out = []
    for i in range(ROUNDS + 20):
        time.sleep(IDLE)
        t = time.perf_counter()
        tx.send(b"x")
        zrecv(rx, spin_a)
        if i >= 20:
            out.append(time.perf_counter() - t)
    tx.send(b"q"); p.join()
    ctx.destroy(linger=0)
    pin(None)
    return np.array(out) * 1e6


def urecv(s, spin):
    if not spin:
        return s.recv(16)
    while True:
        try:
            return s.recv(16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            pass


def upong(cpu, spin, s):
    pin(cpu)
    while (m := urecv(s, spin)) != b"q":
        s.send(m)


def uds_case(cpu_a, cpu_b, spin_b, spin_a, io_pin, tag):
    x, y = socket.socketpair()
    p = mp.get_context("fork").Process(target=upong, args=(cpu_b, spin_b, y)); p.start()
    pin(cpu_a)
    out = []
    for i in range(ROUNDS + 20):
        time.sleep(IDLE)
        t = time.perf_counter()
        x.send(b"x"); urecv(x, spin_a)
        if i >= 20:
            out.append(time.perf_counter() - t)
    x.send(b"q"); p.join()
    pin(None)
    return np.array(out) * 1e6


BODY = json.dumps({"model": "m", "prompt": list(range(128)), "max_tokens": 16, "stream": True,
                   "stream_options": {"include_usage": True}, "temperature": 0.0}).encode()


def work():
    d = json.loads(BODY)
    s = 0
    for k, v in d.items():
        s += len(str(v))
    import msgspec
    return msgspec.msgpack.encode(d), s


def cold_case():
    out = {"warm": [], "after 3 ms asleep": [], "after 3 ms spinning": []}
    for i in range(ROUNDS + 20):
        for name in out:
            if name == "after 3 ms asleep":
                time.sleep(IDLE)
            elif name == "after 3 ms spinning":
                end = time.perf_counter() + IDLE
                while time.perf_counter() < end:
                    pass
            t = time.perf_counter(); work(); dt = time.perf_counter() - t
            if i >= 20:
                out[name].append(dt)
    return {k: np.array(v) * 1e6 for k, v in out.items()}


def show(name, v):
    print(f"{name:62s} p50 {np.median(v):7.1f} p90 {np.percentile(v, 90):7.1f} µs", flush=True)


if __name__ == "__main__":
    print("cpus", len(CPUS), "pinning to", A, B)
    for name, v in cold_case().items():
        show(f"python work, {name}", v)
    for case in (uds_case, zmq_case):
        for label, ca, cb, sb, sa, io in (
                ("unpinned, both block", None, None, False, False, False),
                ("unpinned, responder spins", None, None, True, False, False),
                ("unpinned, both spin", None, None, True, True, False),
                ("own cpus, both block", A, B, False, False, False),
                ("own cpus, both spin", A, B, True, True, False),
                ("own cpus + io threads pinned, both block", A, B, False, False, True),
                ("own cpus + io threads pinned, both spin", A, B, True, True, True)):
            if case is uds_case and io:
                continue
            show(f"{case.__name__} {label}", case(ca, cb, sb, sa, io, label.replace(" ", "").replace(",", "").replace("+", "")))
