"""Shut a torchrun rank down cleanly.

A CPU (gloo) rank occasionally aborts during interpreter teardown ("terminate called without an active
exception", SIGABRT) after all of its work succeeded and its results were written, which fails the whole launch.
Destroying the process group is not enough on torch 2.13, so after a barrier and ``destroy_process_group`` the rank
flushes its output and leaves with ``os._exit``, skipping the C++ static destructors where the abort happens.
"""

import os
import sys


def run_and_shutdown(main) -> int:
    code = main()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code or 0))
