"""V0.5's value prior from the config: the kind and options (``v05_value_prior``, ``v05_value_prior_kwargs``), and for
the default embedding prior the frozen view of the **starting** policy it embeds with (no copy where the trainer
already holds one). Shared by :class:`~trl_ext.trainers.v05.V05GRPOTrainer` and the ``"v05_osla"`` strategy selected
by config (:class:`~trl_ext.trainers.v05.strategy.OSLARounds`)."""

from __future__ import annotations

import logging
import os
from typing import Any

from ...priors import ValuePrior, build_prior
from .. import _trl_compat as compat

logger = logging.getLogger(__name__)

__all__ = ["build_v05_prior", "prior_backbone_choice"]


def prior_backbone_choice(trainer) -> tuple[Any, str, Any, bool]:
    """The model the default embedding prior embeds with: ``(model, source, context, copy)``.

    The prior must see the **starting** policy, frozen, for the whole run:

    * PEFT / LoRA policy: the trainer's own model under ``model.disable_adapter()`` (``context``), i.e. the frozen
      base weights, no copy (for a freshly initialized adapter this is exactly the starting policy; TRL's
      reference model under PEFT is the same thing);
    * full fine-tuning with ``beta > 0``: TRL's reference model (frozen, loaded from the policy's model id), no
      copy -- unless ``sync_ref_model=True``, which moves it towards the policy;
    * otherwise: a frozen deep copy of the policy (``copy=True``), the only way to keep the starting weights.
    """
    from accelerate.utils import is_peft_model

    policy = trainer.accelerator.unwrap_model(trainer.model)
    if is_peft_model(policy) and hasattr(policy, "disable_adapter"):
        return policy, "peft_base_model", policy.disable_adapter, False
    ref = getattr(trainer, "ref_model", None)
    if ref is not None and not trainer.args.sync_ref_model:
        return trainer.accelerator.unwrap_model(ref), "reference_model", None, False
    return policy, "policy_copy", None, True


def build_v05_prior(trainer, options) -> tuple[ValuePrior, dict]:
    """The prior the V0.5 ``options`` (:data:`~trl_ext.trainers.v05.config.V05Options`: ``value_prior``,
    ``value_prior_kwargs``) describe, and what the model card
    records of it: ``{"prior_backbone": {"source", "parameters", "bytes"} or None, "prior_model_name": str or None,
    "table_source": {"source", "file_sha256"} or None}``.

    Raises
    ------
    ValueError
        ``v05_value_prior="callable"`` without ``fn`` (a function cannot go through a config: pass ``prior=``).
    """
    kind = options.value_prior.lower()
    kw = dict(options.value_prior_kwargs)  # a copy: popped below
    info: dict = {"prior_backbone": None, "prior_model_name": None, "table_source": None}
    if kind == "embedding" and "embed_fn" not in kw:
        from ...priors import hf_mean_pool_embedder

        emb_kw = {k: kw.pop(k) for k in ("embed_batch_size", "embed_max_length", "embed_pad_to_multiple_of") if k in kw}
        model, source, context, copy = prior_backbone_choice(trainer)
        embed = hf_mean_pool_embedder(
            model, compat.tokenizer(trainer), batch_size=emb_kw.get("embed_batch_size", 32),
            max_length=emb_kw.get("embed_max_length", 512),
            pad_to_multiple_of=emb_kw.get("embed_pad_to_multiple_of", 32), copy=copy, context=context,
        )
        kw["embed_fn"] = embed
        backbone = embed.backbone
        info["prior_backbone"] = {"source": source, "parameters": backbone["parameters"], "bytes": backbone["bytes"]}
        info["prior_model_name"] = getattr(getattr(model, "config", None), "_name_or_path", None) or None
        if trainer.accelerator.is_main_process:
            if copy:
                logger.warning(
                    "%s: the default embedding prior holds a frozen copy of the starting policy: %d parameters, %.1f "
                    "MiB more memory on every process (full fine-tuning without a reference model). Train LoRA "
                    "adapters (peft_config), use beta > 0 (the prior then shares TRL's reference model) or pass "
                    "prior=... to avoid it.", type(trainer).__name__, backbone["parameters"], backbone["bytes"] / 2**20)
            else:
                logger.info("%s: the default embedding prior shares the trainer's weights (%s): no copy.",
                            type(trainer).__name__, source)
    if kind == "table" and isinstance(kw.get("table"), str | os.PathLike):
        from ..._io import sha256_file

        info["table_source"] = {"source": os.fspath(kw["table"]), "file_sha256": sha256_file(kw["table"])}
    if kind == "callable" and "fn" not in kw:
        raise ValueError("v05_value_prior='callable' needs your function: pass prior=CallablePrior(fn) to "
                         "V05GRPOTrainer (a function cannot go through the config).")
    return build_prior(kind, **kw), info
