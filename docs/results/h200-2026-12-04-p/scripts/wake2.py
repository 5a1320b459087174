"""Round trips on this host, the waiter idle 3 ms before each: ZMQ ipc PUSH/PULL between two
processes and a Condition between two threads, unpinned, each process on a CPU of its own (its
I/O thread beside its app thread), both on one CPU; a raw Unix socket pair for the floor.
Usage: python wake2.py [rounds]"""
import os, socket, sys, threading, time, multiprocessing as mp
import numpy as np, zmq

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 300
IDLE = 0.003
CPUS = sorted(os.sched_getaffinity(0))


def pin(cpu):
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def pong(cpu, a, b):
    pin(cpu)
    ctx = zmq.Context()
    rx = ctx.socket(zmq.PULL); rx.bind(a)
    tx = ctx.socket(zmq.PUSH); tx.connect(b)
    while (m := rx.recv()) != b"q":
        tx.send(m)


def zmq_case(cpu_a, cpu_b, tag):
    a, b = f"ipc:///tmp/w2-a-{tag}", f"ipc:///tmp/w2-b-{tag}"
    p = mp.get_context("spawn").Process(target=pong, args=(cpu_b, a, b)); p.start()
    pin(cpu_a)
    ctx = zmq.Context()
    tx = ctx.socket(zmq.PUSH); tx.connect(a)
    rx = ctx.socket(zmq.PULL); rx.bind(b)
    out = []
    for i in range(ROUNDS + 20):
        time.sleep(IDLE)
        t = time.perf_counter()
        tx.send(b"x")
        rx.recv()
        if i >= 20:
            out.append(time.perf_counter() - t)
    tx.send(b"q"); p.join()
    ctx.destroy(linger=0)
    os.sched_setaffinity(0, CPUS)
    return np.array(out) * 1e6


def uds_pong(cpu, s):
    pin(cpu)
    while (m := s.recv(16)) != b"q":
        s.send(m)


def uds_case(cpu_a, cpu_b, tag):
    x, y = socket.socketpair()
    p = mp.get_context("fork").Process(target=uds_pong, args=(cpu_b, y)); p.start()
    pin(cpu_a)
    out = []
    for i in range(ROUNDS + 20):
        time.sleep(IDLE)
        t = time.perf_counter()
        x.send(b"x"); x.recv(16)
        if i >= 20:
            out.append(time.perf_counter() - t)
    x.send(b"q"); p.join()
    os.sched_setaffinity(0, CPUS)
    return np.array(out) * 1e6


def cv_case(cpu_a, cpu_b, tag):
    cv = threading.Condition(); box = []; back = threading.Event(); stop = [False]
    def waiter():
        pin(cpu_b)
        while True:
            with cv:
                while not box and not stop[0]:
                    cv.wait()
                if stop[0]:
                    return
                box.clear()
            back.set()
    th = threading.Thread(target=waiter); th.start()
    pin(cpu_a)
    out = []
    for i in range(ROUNDS + 20):
        time.sleep(IDLE)
        back.clear()
        t = time.perf_counter()
        with cv:
            box.append(1); cv.notify()
        back.wait()
        if i >= 20:
            out.append(time.perf_counter() - t)
    with cv:
        stop[0] = True; cv.notify()
    th.join()
    os.sched_setaffinity(0, CPUS)
    return np.array(out) * 1e6


if __name__ == "__main__":
    c1, c2 = CPUS[len(CPUS) // 4], CPUS[3 * len(CPUS) // 4]
    print("cpus", len(CPUS), "pinning to", c1, c2)
    for case in (zmq_case, uds_case, cv_case):
        for name, a, b in (("unpinned", None, None), ("own cpus", c1, c2), ("one cpu", c1, c1)):
            v = case(a, b, name.replace(" ", ""))
            print(f"{case.__name__:9s} {name:9s} round trip p50 {np.median(v):7.1f} p90 {np.percentile(v, 90):7.1f} "
                  f"mean {v.mean():7.1f} µs", flush=True)
