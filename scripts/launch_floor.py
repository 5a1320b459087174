"""What one dependent stage of a decode step costs on the H200 before it moves a byte. Each stage
is 132 programs that read one value another program of the stage before wrote and write one:
as separate launches in a CUDA graph (PDL on and off); as stages of one launch of 65 × 132
programs handing off through a done-counter (variant 18's mechanism: relaxed polls, then one
acquire), where the programs of later stages take SM slots while they wait; and as one persistent
launch of 132 programs, each looping over the stages with a grid barrier between them (polling
with acquire atomics, or with volatile loads then one acquire) — the hand-off a persistent layer
kernel would pay. µs per stage = (time of 65 stages - time of 1) / 64, CUDA-graph replays.
Usage: python scripts/launch_floor.py"""
import torch
import triton
import triton.language as tl
import triton.testing

PROGRAMS, STAGES = 132, 65


@triton.jit
def _stage(src_ptr, dst_ptr, P, PDL: tl.constexpr):
    i = tl.program_id(0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    x = tl.load(src_ptr + (i * 7 + 1) % P)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(dst_ptr + i, x + 1)


@triton.jit
def _chained(buf_ptr, done_ptr, P):
    pid = tl.program_id(0)
    stage, i = pid // P, pid % P
    if stage > 0:
        while tl.load(done_ptr + stage - 1, volatile=True) < P:
            pass
        while tl.atomic_add(done_ptr + stage - 1, 0, sem="acquire") < P:
            pass
    x = tl.load(buf_ptr + stage * P + (i * 7 + 1) % P)
    tl.store(buf_ptr + (stage + 1) * P + i, x + 1)
    tl.debug_barrier()
    tl.atomic_add(done_ptr + stage, 1, sem="release")


@triton.jit
def _persistent(buf_ptr, done_ptr, P, STAGES, VOLATILE_POLL: tl.constexpr):
    i = tl.program_id(0)
    for stage in range(STAGES):
        if stage > 0:
            if VOLATILE_POLL:
                while tl.load(done_ptr + stage - 1, volatile=True) < P:
                    pass
            while tl.atomic_add(done_ptr + stage - 1, 0, sem="acquire") < P:
                pass
        x = tl.load(buf_ptr + stage * P + (i * 7 + 1) % P, cache_modifier=".cg")
        tl.store(buf_ptr + (stage + 1) * P + i, x + 1)
        tl.debug_barrier()
        tl.atomic_add(done_ptr + stage, 1, sem="release")


buf = torch.zeros((STAGES + 1) * PROGRAMS, dtype=torch.int32, device="cuda")
done = torch.zeros(STAGES, dtype=torch.int32, device="cuda")


def launches(n: int, pdl: bool) -> None:
    for s in range(n):
        _stage[(PROGRAMS,)](buf[s * PROGRAMS:], buf[(s + 1) * PROGRAMS:], PROGRAMS, PDL=pdl,
                            **({"launch_pdl": True} if pdl else {}))


def chained(n: int) -> None:
    done.zero_()
    _chained[(n * PROGRAMS,)](buf, done, PROGRAMS)


def persistent(n: int, volatile_poll: bool) -> None:
    done.zero_()
    _persistent[(PROGRAMS,)](buf, done, PROGRAMS, n, VOLATILE_POLL=volatile_poll)


def per_stage(fn) -> float:
    one = triton.testing.do_bench_cudagraph(lambda: fn(1), return_mode="median")
    many = triton.testing.do_bench_cudagraph(lambda: fn(STAGES), return_mode="median")
    return (many - one) / (STAGES - 1) * 1e3


for run in (chained, lambda n: persistent(n, False), lambda n: persistent(n, True)):
    buf.zero_()
    run(STAGES)
    assert buf[-PROGRAMS:].min().item() == STAGES, "the stages did not all run in order"
print(f"{'stage hand-off (132 programs)':>40} {'us per stage':>12}")
print(f"{'separate launches, PDL':>40} {per_stage(lambda n: launches(n, True)):>12.2f}")
print(f"{'separate launches, no PDL':>40} {per_stage(lambda n: launches(n, False)):>12.2f}")
print(f"{'one launch, done-counter hand-offs':>40} {per_stage(chained):>12.2f}")
print(f"{'persistent, acquire polls':>40} {per_stage(lambda n: persistent(n, False)):>12.2f}")
print(f"{'persistent, volatile polls + acquire':>40} {per_stage(lambda n: persistent(n, True)):>12.2f}")
