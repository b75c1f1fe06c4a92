"""Preemption by a real signal, then resume: used by ``tests/test_resume_faults.py``.

Launch (one process, or two CPU ranks with ``torchrun --standalone --nproc_per_node 2``)::

    python tests/scripts/preemption_run.py OUT TRAINER full STEPS
    python tests/scripts/preemption_run.py OUT TRAINER signal STEPS [--self_signal_step K] [--slow]
    python tests/scripts/preemption_run.py OUT TRAINER resume STEPS

``full`` trains ``STEPS`` steps in ``OUT/full``; ``signal`` trains towards ``STEPS`` in ``OUT/part`` and is stopped by
SIGTERM: either rank 0 sends it to itself at the start of step ``K`` (``--self_signal_step``; the other rank gets no
signal and must stop at the same step), or the test sends it from outside once ``OUT/part/step2.marker`` exists
(``--slow`` makes each step take ~0.3 s so the signal lands mid-run). ``resume`` continues ``OUT/part`` from its
newest checkpoint to ``STEPS``. Each rank writes ``OUT/{mode}_rank{r}.pt`` (final parameters, trl_ext counters,
global step, preemption record).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import resume_check  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("trainer")
    p.add_argument("mode", choices=["full", "signal", "resume"])
    p.add_argument("steps", type=int)
    p.add_argument("--self_signal_step", type=int, default=None)
    p.add_argument("--slow", action="store_true")
    a = p.parse_args()

    import torch
    from accelerate import PartialState
    from transformers import TrainerCallback

    state = PartialState(cpu=True)
    world, rank = state.num_processes, state.process_index
    folder = os.path.join(a.out, "full" if a.mode == "full" else "part")
    if a.slow:
        base_reward = resume_check.spread_reward

        def spread_reward(prompts, completions, **kwargs):
            time.sleep(0.3)  # slow steps, same rewards: the signal from outside lands mid-run
            return base_reward(prompts, completions, **kwargs)

        resume_check.spread_reward = spread_reward
    tr = resume_check.build(a.trainer, folder, world, a.steps)

    class Marker(TrainerCallback):
        def on_step_begin(self, args, st, control, **kwargs):
            if a.self_signal_step is not None and rank == 0 and st.global_step == a.self_signal_step - 1:
                os.kill(os.getpid(), signal.SIGTERM)  # a real signal, in the middle of step K

        def on_step_end(self, args, st, control, **kwargs):
            if rank == 0 and st.global_step == 2:
                open(os.path.join(folder, "step2.marker"), "w").close()

    if a.mode == "signal":
        tr.add_callback(Marker())
    record = {"rank": rank, "world": world, "exit_code": None}
    try:
        tr.train(resume_from_checkpoint=True if a.mode == "resume" else None)
    except SystemExit as e:
        record["exit_code"] = e.code
    record.update(params=[q.detach().clone() for q in tr.model.parameters()], ext_state=tr.ext_state_dict(),
                  global_step=tr.state.global_step, preempted=getattr(tr, "preempted", False))
    torch.save(record, os.path.join(a.out, f"{a.mode}_rank{rank}.pt"))
    return record["exit_code"] or 0


if __name__ == "__main__":
    from _dist_exit import run_and_shutdown

    sys.exit(run_and_shutdown(main))
