"""Wake-up cost of an idle thread on this host: a ZMQ (ipc) ping-pong between two processes and a
Condition hand-off between two threads, the waiter blocking, waiting in short timed slices, or polling.
Each round the pinger idles IDLE ms first (the cores go to sleep), then measures the round trip.
Usage: python wake.py [rounds]"""
import os, sys, time, threading, select, multiprocessing as mp
import numpy as np, zmq

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 300
IDLE = 0.003


def wait_recv(sock, how):
    if how == "block":
        return sock.recv()
    fd = sock.getsockopt(zmq.FD)
    while True:
        try:
            return sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            if how == "slice":
                select.select([fd], [], [], 0.0002)


def pong(how, a, b):
    ctx = zmq.Context()
    rx = ctx.socket(zmq.PULL); rx.bind(a)
    tx = ctx.socket(zmq.PUSH); tx.connect(b)
    while True:
        m = wait_recv(rx, how)
        if m == b"q":
            return
        tx.send(m)


def zmq_case(how):
    a, b = f"ipc:///tmp/wake-a-{how}", f"ipc:///tmp/wake-b-{how}"
    p = mp.Process(target=pong, args=(how, a, b)); p.start()
    ctx = zmq.Context()
    tx = ctx.socket(zmq.PUSH); tx.connect(a)
    rx = ctx.socket(zmq.PULL); rx.bind(b)
    out = []
    for i in range(ROUNDS + 20):
        time.sleep(IDLE)
        t = time.perf_counter()
        tx.send(b"x")
        wait_recv(rx, how)
        if i >= 20:
            out.append(time.perf_counter() - t)
    tx.send(b"q"); p.join()
    return np.array(out) * 1e6


def cv_case(how):
    cv = threading.Condition(); box = []; back = threading.Event(); stop = [False]
    def waiter():
        while True:
            with cv:
                while not box and not stop[0]:
                    cv.wait() if how == "block" else cv.wait(0.0002)
                if stop[0]:
                    return
                box.clear()
            back.set()
    th = threading.Thread(target=waiter); th.start()
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
    return np.array(out) * 1e6


if __name__ == "__main__":
    for name in ("governor", "driver"):
        try:
            print(name, open(f"/sys/devices/system/cpu/cpuidle/current_{name}").read().strip())
        except OSError as e:
            print(name, e)
    base = "/sys/devices/system/cpu/cpu0/cpuidle"
    for s in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        f = lambda k: open(f"{base}/{s}/{k}").read().strip()
        print(s, f("name"), "latency", f("latency"), "residency", f("residency"), "disable", f("disable"))
    for case in (zmq_case, cv_case):
        for how in ("block", "slice", "poll") if case is zmq_case else ("block", "slice"):
            v = case(how)
            print(f"{case.__name__:8s} {how:6s} round trip p50 {np.median(v):7.1f} p90 {np.percentile(v, 90):7.1f} mean {v.mean():7.1f} µs")
