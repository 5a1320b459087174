"""Timeline stamps for one request at a time (a research variant, not in main): stamp(label) records
(label, monotonic ns); each process writes its stamps to $TRACE_DIR/<role>.<pid>.txt at exit."""
import atexit, os, signal, sys, time
_stamps = []
_role = "api"


def stamp(label):
    _stamps.append((label, time.monotonic_ns()))


def dump():
    d = os.environ.get("TRACE_DIR")
    if not d or not _stamps:
        return
    with open(f"{d}/{_role}.{os.getpid()}.txt", "w") as f:
        f.writelines(f"{l} {t}\n" for l, t in _stamps)
    _stamps.clear()


def engine_role():
    global _role
    _role = "engine"


def _on_term(*_):
    dump()
    os._exit(0)


# (uvicorn restores the handler it found and raises the signal again after its shutdown)
signal.signal(signal.SIGTERM, _on_term)
atexit.register(dump)
