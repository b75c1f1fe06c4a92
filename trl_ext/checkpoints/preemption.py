"""A clean stop on SIGTERM / SIGINT: finish the optimizer step, write a complete checkpoint, exit with a distinct code.

SLURM and Kubernetes send SIGTERM before preempting a job; Python's default handler ends the process at once and the
work since the last checkpoint is lost. With ``save_on_preemption=True`` (the default) the trainer installs
:class:`PreemptionHandler` for the duration of ``train()``: the first signal only sets a flag; at the end of the
current optimizer step every rank learns whether *any* rank was signalled (one max-reduce of one integer per step
when several processes run, so no rank is left waiting in a collective), all of them save ``checkpoint-N`` and stop,
and ``train()`` raises ``SystemExit(preemption_exit_code)`` (75, ``EX_TEMPFAIL``: "try again"; ``None`` makes
``train()`` return instead, with ``trainer.preempted`` set). A second signal restores the previous handler and
re-delivers itself (the usual immediate stop). Resuming from that checkpoint is bit-identical to an uninterrupted
run (it is an ordinary checkpoint).
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

__all__ = ["PREEMPTION_SIGNALS", "PreemptionHandler", "train_with_preemption"]

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class PreemptionHandler(TrainerCallback):
    """Turns SIGTERM / SIGINT into "finish this step, save, stop" (see the module docstring).

    Attributes
    ----------
    signalled : int or None
        The signal number this process received, if any.
    stopped_at : int or None
        The global step after which training stopped for a signal (on every rank, whichever rank got it).
    """

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.signalled: int | None = None
        self.stopped_at: int | None = None
        self._previous: dict[int, object] = {}

    # ---------------------------------------------------------------------------------------------- signal handlers
    def install(self) -> bool:
        """Install the handlers (main thread only: Python delivers signals there). Returns whether it did."""
        if threading.current_thread() is not threading.main_thread():
            logger.warning("save_on_preemption: train() runs outside the main thread, where Python cannot install "
                           "signal handlers; SIGTERM will stop this run without a checkpoint.")
            return False
        for sig in PREEMPTION_SIGNALS:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._on_signal)
        return True

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _on_signal(self, signum, frame) -> None:
        if self.signalled is not None:  # a second signal: the usual immediate stop
            self.uninstall()
            os.kill(os.getpid(), signum)
            return
        self.signalled = signum
        # logging from a signal handler can deadlock on the handler's lock; write the line directly
        os.write(2, (f"trl_ext: received {signal.Signals(signum).name}; finishing the current optimizer step, then "
                     "saving a checkpoint and stopping (send it again to stop at once).\n").encode())

    # ---------------------------------------------------------------------------------------------- callback
    def any_rank_signalled(self) -> bool:
        """Whether any process received a signal (a max-reduce over ranks when several run)."""
        flag = self.signalled is not None
        if self.accelerator.num_processes > 1:
            import torch

            t = torch.tensor([1 if flag else 0], device=self.accelerator.device)
            flag = bool(self.accelerator.gather(t).max().item())
        return flag

    def on_step_end(self, args, state, control, **kwargs):
        if self.stopped_at is None and self.any_rank_signalled():
            self.stopped_at = int(state.global_step)
            control.should_save = True
            control.should_training_stop = True
        return control


def train_with_preemption(trainer, train, resume_from_checkpoint, *args, **kwargs):
    """Run ``train(resume_from_checkpoint, *args, **kwargs)`` (transformers' ``Trainer.train``) with a
    :class:`PreemptionHandler` installed when ``trainer.args.save_on_preemption``; sets ``trainer.preempted``.

    After a preemption stop it logs the step and checkpoint and raises ``SystemExit(preemption_exit_code)`` (or
    returns when that is ``None``); a signal that arrived after the last step is re-delivered to the previous handler.
    """
    trainer.preempted = False
    handler = None
    if trainer.args.save_on_preemption:
        handler = PreemptionHandler(trainer.accelerator)
        if handler.install():
            trainer.add_callback(handler)
        else:
            handler = None
    try:
        out = train(resume_from_checkpoint, *args, **kwargs)
    finally:
        if handler is not None:
            handler.uninstall()
            trainer.remove_callback(handler)
    if handler is not None and handler.stopped_at is not None:
        trainer.preempted = True
        folder = os.path.join(trainer.args.output_dir, f"checkpoint-{handler.stopped_at}")
        got = "this process received a signal" if handler.signalled else "another process received a signal"
        logger.warning("trl_ext: stopped after step %d because %s (preemption); checkpoint written to %s. Resume with "
                       "train(resume_from_checkpoint=True).", handler.stopped_at, got, folder)
        if trainer.args.preemption_exit_code is not None:
            raise SystemExit(trainer.args.preemption_exit_code)
    elif handler is not None and handler.signalled is not None:
        os.kill(os.getpid(), handler.signalled)  # arrived after the last step: deliver it as if we were not here
    return out

