"""A minimal repro, for PyTorch upstream, of the DDP teardown deadlock (plain torch).

    python tools/gloo_teardown_deadlock.py reducer-last   # hangs within ~10 cycles (torch 2.13.0+cpu)
    python tools/gloo_teardown_deadlock.py group-last     # 40 cycles, exits 0

Two gloo processes on localhost; each cycle makes a process group, a
DistributedDataParallel model, runs one backward and tears both down.

`reducer-last` (`destroy_process_group()` first, then the DDP wrapper goes):
the wrapper's C++ Reducer holds the last reference to the group, and
`~ProcessGroupGloo` runs with the GIL held and joins its worker threads. One of
them is dropping a finished allreduce whose saved `at::ThreadLocalState` holds
the `contextvars.Context` that `torch.autograd.graph._engine_run_backward`
stashes in TLS (`_stash_obj_in_tls("context", ...)`, pytorch/pytorch#173568),
and `~SafePyObject` waits for the GIL: a deadlock (gdb: main thread in
`c10d::ProcessGroupGloo::~ProcessGroupGloo` <- `c10d::Reducer::~Reducer`,
`pt_gloo_runloop` in `take_gil` <- `at::ThreadLocalState::~ThreadLocalState`).
At interpreter exit the same state aborts with "terminate called without an
active exception".

`group-last` (the wrapper first, then `destroy_process_group()`): the group's
Python holder (IntrusivePtrNoGilDestructor) destroys it without the GIL.
keras_attn tears down in that order (keras_attn/demo/data_parallel.py).
"""

import gc
import sys

import torch
import torch.distributed as dist

CYCLES = 40


def cycles(rank, world_size, order, base_port):
    rows = torch.randn(8, 16)[rank::world_size]
    for cycle in range(CYCLES):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{base_port + cycle}",
                                world_size=world_size, rank=rank)
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
        ddp(rows).square().mean().backward()
        if order == "reducer-last":
            dist.destroy_process_group()
            del ddp
        else:
            del ddp
            gc.collect()
            dist.destroy_process_group()
        if rank == 0:
            print(f"cycle {cycle + 1}/{CYCLES}", flush=True)


if __name__ == "__main__":
    order = sys.argv[1] if len(sys.argv) > 1 else "reducer-last"
    if order not in ("reducer-last", "group-last"):
        sys.exit("usage: gloo_teardown_deadlock.py [reducer-last | group-last]")
    base_port = int(sys.argv[2]) if len(sys.argv) > 2 else 29600
    torch.multiprocessing.start_processes(cycles, args=(2, order, base_port), nprocs=2,
                                          start_method="spawn")
