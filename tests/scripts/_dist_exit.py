"""Shut a torchrun rank down cleanly.

Without an explicit ``destroy_process_group`` a CPU (gloo) rank occasionally aborts at interpreter exit with
"terminate called without an active exception" after all its work succeeded, which fails the launch.
"""

import sys


def run_and_shutdown(main) -> int:
    code = main()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    return code
