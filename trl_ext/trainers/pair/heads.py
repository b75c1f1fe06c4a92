"""PAIR's prefix heads as the rollout strategy uses them (:class:`DesignHeads`) and the two things built from the
trainer at construction: the prefix features (:func:`prefix_features`, a forward of the trainer's model) and the
snap delimiters (:func:`delimiter_ids`). Section and appendix numbers refer to "Pairwise-Aware Inclusion Reweighting
for Adaptive Rollout Allocation in RLVR" (arXiv:2608.11368).
"""

from __future__ import annotations

import torch

from ...estimators.pair_heads import PrefixHeads, model_prefix_summary
from .. import _trl_compat as compat

__all__ = ["DesignHeads", "delimiter_ids", "prefix_features"]


class DesignHeads:
    """PAIR's prefix heads as the rollout strategy uses them (Sec. 4.2, Eq. 5-7, Appendix C).

    Labels of completed candidates go into :attr:`heads` when their rewards arrive (:meth:`add_labels`); the heads
    are **frozen within an RL update** and refit at the start of the next generation batch (:meth:`refresh`), i.e.
    after the optimizer step(s) of the batch whose labels they learn from. With ``pair_lagged_heads`` the design
    uses the copy taken before the latest refresh (:meth:`for_design`).

    Parameters
    ----------
    heads : PrefixHeads
    options : PAIROptions
        Read at call time: ``lagged_heads``, ``head_fit_steps``, ``head_batch_size``.
    num_processes : int
        Processes of the run; with more than one (and ``torch.distributed`` initialized) every refresh broadcasts
        rank 0's heads so they stay bitwise identical.
    device : torch.device or str, optional
        Device of the broadcast buffers (the accelerator's).

    Attributes
    ----------
    heads : PrefixHeads
    lagged : PrefixHeads or None
    needs_refresh : bool
        New labels arrived since the last refresh (checkpointed).
    last_refresh : dict
        Fit losses, temperature and diagnostics of the latest refresh (the ``pair/head_*`` metrics).
    """

    def __init__(self, heads: PrefixHeads, options, *, num_processes: int = 1, device=None):
        self.heads = heads
        self.options = options
        self.num_processes = int(num_processes)
        self.device = device
        self.lagged: PrefixHeads | None = None
        self.needs_refresh = False
        self.last_refresh: dict = {}

    @property
    def ready(self) -> bool:
        """The replay window holds ``pair_head_min_labels`` labels (before that: warm-up, uniform design)."""
        return self.heads.ready

    def for_design(self) -> PrefixHeads:
        """The heads that drive the design: the lagged copy with ``pair_lagged_heads``, else the current ones."""
        return self.lagged if (self.options.lagged_heads and self.lagged is not None) else self.heads

    def add_labels(self, features, rewards, costs, inclusion) -> None:
        """Delayed labels of completed, scorable candidates (:meth:`PrefixHeads.add_labels`); the next
        :meth:`refresh` fits on them."""
        self.heads.add_labels(features, rewards, costs, inclusion)
        self.needs_refresh = True

    def refresh(self) -> None:
        """Refresh after the RL update on the labels gathered so far (Eq. 6-7 fit + temperature, Appendix C).

        A no-op unless new labels arrived since the last refresh (:attr:`needs_refresh`)."""
        if not self.needs_refresh:
            return
        self.needs_refresh = False
        if self.options.lagged_heads:
            self.lagged = self.heads.lagged_copy()
        out = self.heads.refresh(steps=int(self.options.head_fit_steps),
                                 batch_size=int(self.options.head_batch_size))
        self.sync()
        diag = self.heads.diagnostics()
        self.last_refresh = {"loss_p": out.get("loss_p"), "loss_c": out.get("loss_c"),
                             "temperature": out.get("temperature"), **diag}

    def sync(self) -> None:
        """Make the heads bitwise identical on every rank (they are fit on identical gathered labels; this removes
        any floating-point drift between processes)."""
        if self.num_processes <= 1 or not torch.distributed.is_initialized():
            return
        for head in (self.heads.success_head, self.heads.cost_head):
            for p in head.parameters():
                buf = p.data.to(self.device)
                torch.distributed.broadcast(buf, src=0)
                p.data.copy_(buf.cpu())
        t = torch.tensor([self.heads.temperature], dtype=torch.float64, device=self.device)
        torch.distributed.broadcast(t, src=0)
        self.heads.temperature = float(t.item())

    def state_dict(self) -> dict:
        """``{"heads", "lagged_heads", "needs_refresh"}`` (the ``"pair"`` entry of ``trl_ext_state.pt``)."""
        return {"heads": self.heads.state_dict(),
                "lagged_heads": None if self.lagged is None else self.lagged.state_dict(),
                "needs_refresh": bool(self.needs_refresh)}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.heads.load_state_dict(state["heads"])
        if state.get("lagged_heads") is not None:
            self.lagged = self.heads.lagged_copy()
            self.lagged.load_state_dict(state["lagged_heads"])
        self.needs_refresh = bool(state["needs_refresh"])


def delimiter_ids(trainer, delimiters) -> set[int]:
    """Token ids whose text ends with one of ``delimiters`` (the snapped checkpoint, Appendix C)."""
    tok = compat.tokenizer(trainer)
    ends = tuple(delimiters)
    return {i for i in range(len(tok)) if (text := tok.decode([i], skip_special_tokens=False)) and text.endswith(ends)}


def prefix_features(trainer, seqs: list[list[int]], last_k: int) -> torch.Tensor:
    """Stop-gradient prefix summaries of ``prompt + prefix`` token sequences: mean of the last ``last_k``
    final-layer hidden states of the trainer's model (Appendix C), shape ``(B, H)``, on CPU.

    The forward runs inside the context TRL's own generation uses (:func:`._trl_compat.generation_model`: TRL's
    ``unwrap_model_for_generation`` and FSDP's full-parameter context), so ZeRO-3/FSDP shards are gathered and
    gradient checkpointing is restored with the trainer's ``gradient_checkpointing_kwargs``; every rank makes exactly
    one such call per generation batch (equal row counts), which keeps those collectives aligned.
    """
    tok = compat.tokenizer(trainer)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    with compat.generation_model(trainer) as model:
        return model_prefix_summary(model, seqs, pad, last_k=last_k, device=trainer.accelerator.device)
