"""scripts/torch_timing.py: the CUDA-event timing that the PyTorch benchmark scripts share
(bench_torch_norms.py, bench_torch_fused_norm.py, bench_torch_attention.py), the same method as
examples/bench/bench_timing.h's time_ms."""
import torch


def time_ms(fn, warmup=3, repeats=20, hold=True):
    """Median ms of fn() on the current stream: `repeats` runs queued back to back after `warmup`,
    each between its own pair of CUDA events. With hold, the stream is held by torch.cuda._sleep
    (about 2 ms per run) while the runs are queued, so that each run starts when the one before ends:
    the times are the GPU's even where Python (or torch.compile's guards) takes longer to queue a run
    than the GPU to run it."""
    for _ in range(warmup):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    torch.cuda.synchronize()
    if hold:
        torch.cuda._sleep(4_000_000 * repeats)
    for start, stop in events:
        start.record()
        fn()
        stop.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(stop) for start, stop in events)
    return times[len(times) // 2]
