"""All TRL-version-specific glue of :mod:`trl_ext.trainers` in one place.

``trl_ext`` subclasses :class:`trl.GRPOTrainer` and relies on private attributes and on the exact data flow of
TRL 1.16 (``trl/trainer/grpo_trainer.py`` and ``trl/trainer/grpo_config.py``). Everything that touches a TRL
private name or a TRL-internal invariant goes through this module, so a TRL upgrade means auditing one file:

* :class:`TRLGlue` is the only class that overrides TRL's private methods; each override forwards to a public
  ``ext_*`` hook that :class:`trl_ext.GRPOTrainer` implements, and ``ext_*`` hooks it does not override fall back
  to TRL's own method;
* the functions below are the only readers/writers of TRL private attributes (``_metrics``, ``_logs``,
  ``_tokenizer``, ``_dist``, ``vllm_generation.llm``, ``generation_config.max_new_tokens``, ...);
* :data:`RELIED_ON` lists every TRL method (with the parameters we pass) and attribute this module relies on;
  ``tests/test_trl_compat.py`` checks it against the installed TRL, so a release that breaks one fails one clear
  test.

TRL 1.16 invariants relied on (re-check them on any upgrade):

* ``GRPOTrainer._calculate_rewards`` returns the **gathered** ``(N_global, F)`` reward tensor in rank order.
* ``GRPOTrainer._generate`` returns ``(prompt_ids, completion_ids, tool_mask, completions, logprobs,
  extra_fields, images, tool_images)``; every completion it produces comes from ``_generate_single_turn`` (tool
  loops re-enter it), which is therefore where generated tokens are counted.
* ``_generate_and_score_completions`` slices advantages with ``process_slice = rank * len(prompts)`` and reads
  ``self.num_generations`` in ``view(-1, G)``.
* ``_prepare_inputs`` shuffles per rank then ``split_tensor_dict(batch, steps_per_generation)``
  (``trl/trainer/utils.py``), which drops remainder rows silently: every value must be an ``(N, ...)`` tensor, a
  list of length N, a 0-dim tensor or ``None``.
* Loss normalizers in ``_compute_loss``: ``grpo``/``sapo``/``luspo`` average the per-row token means over the
  ``B`` local rows, ``dr_grpo`` divides the token sum by ``B * max_completion_length``, ``bnpo`` by the local
  token count (all then divided by ``current_gradient_accumulation_steps``); ``dapo``/``cispo``/``vespo`` by
  ``num_items_in_batch / P * GA / steps_per_generation``.
* ``GRPOConfig.__post_init__`` rejects ``num_generations < 2`` and a ``generation_batch_size`` that
  ``num_generations`` does not divide.
* ``self._metrics[mode]`` is a ``defaultdict(list)`` averaged in ``log``; ``self._logs`` holds deques sized to the
  generation batch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import torch

SUPPORTED_TRL = ("1.16",)
"""TRL major.minor versions whose internals this module was audited against."""

SEQUENCE_LEVEL_LOSSES = ("grpo", "sapo", "luspo", "dr_grpo")
"""Loss types whose policy term is averaged over sequences (rows) of the micro-batch."""

GLOBAL_TOKEN_LEVEL_LOSSES = ("dapo", "cispo", "vespo")
"""Loss types normalized by the global token count ``num_items_in_batch``."""

LOCAL_TOKEN_LEVEL_LOSSES = ("bnpo",)
"""Loss types normalized by the local micro-batch token count."""

SIGNAL_ONLY_LOSSES = SEQUENCE_LEVEL_LOSSES + GLOBAL_TOKEN_LEVEL_LOSSES + LOCAL_TOKEN_LEVEL_LOSSES
"""Every TRL 1.16 loss type: the per-token policy loss is positively homogeneous in the advantage for all of them
(the loss is a sum of ``A_i`` times terms that do not depend on ``A``), so signal-only denominators can be implemented by rescaling advantages."""

ROW_IDX_COLUMN = "trl_ext_row_idx"
"""Dataset column the base trainer adds (the dataset row index) to key groups by row, not by prompt text."""


def trl_version() -> str:
    """Return the installed TRL version string."""
    import trl

    return trl.__version__


def check_trl_version() -> None:
    """Raise a clear error unless the installed TRL is a version whose internals were audited.

    Set the environment variable ``TRL_EXT_SKIP_VERSION_CHECK=1`` to bypass (at your own risk: the overrides in
    :mod:`trl_ext.trainers.base` depend on private TRL internals that change between releases).

    Raises
    ------
    ImportError
        If TRL's ``major.minor`` is not in :data:`SUPPORTED_TRL`.
    """
    if os.environ.get("TRL_EXT_SKIP_VERSION_CHECK") == "1":
        return
    version = trl_version()
    if ".".join(version.split(".")[:2]) not in SUPPORTED_TRL:
        raise ImportError(
            f"trl_ext.trainers supports TRL {', '.join(v + '.x' for v in SUPPORTED_TRL)} but found trl=={version}. "
            "Install a supported version (pip install 'trl>=1.16,<1.17') or set TRL_EXT_SKIP_VERSION_CHECK=1 to try "
            "anyway."
        )


def nanstd(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """TRL's Bessel-corrected NaN-ignoring std (``trl.trainer.utils.nanstd``), re-exported for bitwise parity."""
    from trl.trainer.utils import nanstd as _nanstd

    return _nanstd(x, dim=dim, keepdim=keepdim)


def gather(t: torch.Tensor) -> torch.Tensor:
    """``accelerate.utils.gather``: concatenation over ranks in rank order. All ranks must pass equal shapes."""
    from accelerate.utils import gather as _gather

    return _gather(t)


def gather_object(obj: list) -> list:
    """``accelerate.utils.gather_object``: list concatenation over ranks (unequal lengths allowed)."""
    from accelerate.utils import gather_object as _gather_object

    return _gather_object(obj)


def checkpoint_prefix() -> str:
    """``transformers.trainer_utils.PREFIX_CHECKPOINT_DIR`` (``"checkpoint"``)."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    return PREFIX_CHECKPOINT_DIR


def metrics(trainer: Any, mode: str) -> dict[str, list]:
    """The trainer's per-mode metric lists (``GRPOTrainer._metrics[mode]``, averaged in ``log``)."""
    return trainer._metrics[mode]


def replace_last_metric(trainer: Any, mode: str, name: str, value: float) -> None:
    """Overwrite the value TRL appended for ``name`` during the current generation (append if absent)."""
    store = trainer._metrics[mode][name]
    if store:
        store[-1] = float(value)
    else:
        store.append(float(value))


def rewrite_completion_logs(trainer: Any, n_new: int, keep: Sequence[bool], advantages: Sequence[float]) -> None:
    """Rewrite the last ``n_new`` rows TRL appended to ``trainer._logs`` (the completions table).

    Drops rows whose ``keep`` flag is False (pad rows) from every column (``log_extra`` columns included) and
    replaces the logged advantages with ``advantages`` (length ``n_new``, global order), keeping the columns aligned.
    """
    keep = [bool(k) for k in keep]
    if len(keep) != n_new or len(advantages) != n_new:
        raise ValueError(f"rewrite_completion_logs: got {len(keep)} keep flags / {len(advantages)} advantages, "
                         f"expected {n_new}.")
    logs = trainer._logs

    def _rewrite(dq, replacement=None):
        n = min(n_new, len(dq))
        tail = [dq.pop() for _ in range(n)][::-1]
        if replacement is not None:
            tail = list(replacement)[n_new - n:]
        flags = keep[n_new - n:]
        dq.extend(v for v, k in zip(tail, flags) if k)

    _rewrite(logs["advantages"], [float(a) for a in advantages])
    for key in ("prompt", "completion"):
        _rewrite(logs[key])
    for dq in logs["rewards"].values():
        _rewrite(dq)
    for dq in logs["extra"].values():  # log_extra columns TRL flushed for the same rows (no-op without pad rows)
        _rewrite(dq)


def resize_completion_logs(trainer: Any, maxlen: int, keep_last: int | None = None) -> None:
    """Re-create every deque of ``trainer._logs`` (the completions table) with ``maxlen``.

    TRL sizes them to ``generation_batch_size`` (``GRPOTrainer.__init__``), which assumes every generation batch has exactly that
    many rows; a variable-size batch (a rollout strategy's own rollouts) can hold more. ``keep_last`` keeps only the newest rows
    of each column (the current generation batch, as TRL's fixed ``maxlen`` does for fixed-size batches). Columns
    created later (``rewards``/``extra`` are ``defaultdict`` s) get the new ``maxlen`` too.
    """
    from collections import deque

    maxlen = int(maxlen)
    logs = trainer._logs

    def _fix(dq):
        items = list(dq)
        if keep_last is not None:
            items = items[max(len(items) - int(keep_last), 0):]
        return deque(items, maxlen=maxlen)

    for key in ("images", "prompt", "completion", "advantages"):
        if key in logs:
            logs[key] = _fix(logs[key])
    for key in ("rewards", "extra"):
        if key in logs:
            table = logs[key]
            for name in list(table):
                table[name] = _fix(table[name])
            table.default_factory = lambda: deque(maxlen=maxlen)


def set_sampler_num_generations(trainer: Any, value: int) -> None:
    """Set ``trainer.num_generations`` after ``__init__`` (bypasses ``GRPOConfig``'s ``num_generations >= 2`` check).

    The train sampler and dataloader are built lazily in ``train()`` from ``self.num_generations``
    (``GRPOTrainer._get_train_sampler``), so setting it to 1 makes every rank receive
    ``per_device * steps_per_generation`` unique prompts. Evaluation keeps ``num_generations_eval``.
    """
    trainer.num_generations = int(value)


@contextlib.contextmanager
def group_size_override(trainer: Any, value: int):
    """Temporarily set ``num_generations`` and ``num_generations_eval`` (TRL's ``view(-1, G)`` must accept any row
    count when variable-size batches are replayed through TRL's tail)."""
    saved = (trainer.num_generations, trainer.num_generations_eval)
    trainer.num_generations, trainer.num_generations_eval = int(value), int(value)
    try:
        yield
    finally:
        trainer.num_generations, trainer.num_generations_eval = saved


def validate_config_with_placeholder_group_size(config: Any, post_init, *, group_size: int) -> None:
    """Run ``GRPOConfig.__post_init__`` (``post_init``) for a config whose train group size is ``group_size``.

    TRL's checks ``num_generations >= 2`` and ``generation_batch_size % num_generations == 0`` assume G-fold
    repeated prompts. Trainers whose sampler yields unique prompts (``group_size == 1``: one rollout per prompt, or
    rollout counts chosen at run time) validate with a placeholder ``num_generations`` that divides the generation
    batch and then restore the user's values (``num_generations_eval`` is validated as ``num_generations``, or 1,
    when unset).

    ``config.num_generations`` must already be the user's value (``1`` allowed).
    """
    g, eval_g = config.num_generations, config.num_generations_eval
    if group_size != 1:
        post_init()
        return
    if config.generation_batch_size is not None:
        known = int(config.generation_batch_size)
    else:
        spg = config.steps_per_generation if config.steps_per_generation is not None \
            else config.gradient_accumulation_steps
        known = int(config.per_device_train_batch_size) * int(spg)  # divides per_device * world * spg
    if known < 2:
        known *= int(os.environ.get("WORLD_SIZE", "1") or 1)
    if known < 2:
        raise ValueError(
            f"{type(config).__name__}: the generation batch holds {known} unique prompt; at least 2 prompts per "
            "generation batch are needed (TRL's checks; leave-one-out and batch baselines). Raise "
            "per_device_train_batch_size, steps_per_generation or generation_batch_size."
        )
    config.num_generations = known
    if eval_g is None:  # TRL validates the eval group size too; None afterwards means "num_generations" again
        config.num_generations_eval = g if isinstance(g, int) and g >= 2 else 1
    try:
        post_init()
    finally:
        config.num_generations, config.num_generations_eval = g, eval_g


def tokenizer(trainer: Any):
    """The text tokenizer of the trainer's processing class (``GRPOTrainer._tokenizer``)."""
    return trainer._tokenizer


def tokenize_prompts(trainer: Any, prompts: list) -> list[list[int]]:
    """Prompt token ids exactly as TRL builds them (``GRPOTrainer._tokenize_prompts``: chat template for
    conversational prompts, plain tokenization otherwise). Text-only prompts."""
    prompt_ids, _images, _mm = trainer._tokenize_prompts(prompts)
    return prompt_ids


def completion_logs(trainer: Any) -> dict:
    """The completions table (``GRPOTrainer._logs``: deques of prompts, completions, rewards, advantages)."""
    return trainer._logs


def summon_full_params(trainer: Any):
    """TRL's context that gathers FSDP parameters for generation (``GRPOTrainer._dist.summon_full_params``)."""
    return trainer._dist.summon_full_params(trainer.model_wrapped, recurse=False)


@contextlib.contextmanager
def max_new_tokens(trainer: Any, n: int):
    """Temporarily cap generation at ``n`` new tokens.

    transformers generation reads ``trainer.generation_config.max_new_tokens`` (and ``generation_kwargs``); vLLM
    generation reads ``trainer.vllm_generation.max_completion_length``. Restored on exit, also on error.
    """
    saved = []
    if getattr(trainer, "use_vllm", False):
        vg = trainer.vllm_generation
        saved.append((vg, "max_completion_length", vg.max_completion_length))
        vg.max_completion_length = int(n)
    else:
        gc = trainer.generation_config
        saved.append((gc, "max_new_tokens", gc.max_new_tokens))
        gc.max_new_tokens = int(n)
        gk = getattr(trainer, "generation_kwargs", None)
        if isinstance(gk, dict) and "max_new_tokens" in gk:
            saved.append((gk, "__item__", gk["max_new_tokens"]))
            gk["max_new_tokens"] = int(n)
    try:
        yield
    finally:
        for obj, attr, value in reversed(saved):
            if attr == "__item__":
                obj["max_new_tokens"] = value
            else:
                setattr(obj, attr, value)


@contextlib.contextmanager
def generation_model(trainer: Any):
    """The unwrapped model ready for generation, as TRL's transformers path prepares it
    (``trl.models.unwrap_model_for_generation``, no grad, FSDP parameters summoned)."""
    import torch
    from trl.models import unwrap_model_for_generation

    with (
        unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator,
            gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
            # TRL sets generation_kwargs only for transformers generation (absent with use_vllm=True)
            generation_kwargs=getattr(trainer, "generation_kwargs", None),
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model,
        torch.no_grad(),
        summon_full_params(trainer),
    ):
        yield model


@contextlib.contextmanager
def swap_vllm_engine(trainer: Any, engine: Any):
    """Temporarily replace TRL's colocated vLLM engine (``trainer.vllm_generation.llm``) by ``engine``."""
    vg = trainer.vllm_generation
    real = vg.llm
    vg.llm = engine
    try:
        yield real
    finally:
        vg.llm = real


def generation_is_collective(trainer: Any) -> bool:
    """Whether one generation call is a collective every rank must join with an equal-length list: vLLM server
    mode, vLLM colocate with tensor parallelism, ZeRO-3 or FSDP (parameters gathered for generation)."""
    if trainer.accelerator.num_processes <= 1:
        return False
    if getattr(trainer, "use_vllm", False):
        vg = trainer.vllm_generation
        return getattr(vg, "mode", "server") == "server" or getattr(vg, "tensor_parallel_size", 1) > 1
    return bool(getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled", False))


# ------------------------------------------------------------------------------------------------- the glue class
def _make_glue_class():
    import trl

    class TRLGlue(trl.GRPOTrainer):
        """The one subclass of :class:`trl.GRPOTrainer` that overrides TRL private methods.

        Each override forwards to a public hook; the hooks' defaults here call TRL's own implementation, so a
        subclass extends TRL by overriding ``ext_*`` methods and calling ``super()`` for TRL's behaviour.
        """

        # -- TRL private overrides (the only ones in trl_ext) ---------------------------------------------------
        def _generate_and_score_completions(self, inputs):
            return self.ext_generate_and_score(inputs)

        def _generate(self, prompts: list):
            return self.ext_generate(prompts)

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                                  has_tool_images=False):
            completion_ids, logprobs = self.ext_generate_single_turn(prompt_ids, images, multimodal_fields,
                                                                     num_generations, has_tool_images)
            self.ext_on_generated(completion_ids)
            return completion_ids, logprobs

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            return self.ext_calculate_rewards(inputs, prompts, completions, completion_ids_list)

        def _compute_loss(self, model, inputs):
            return self.ext_compute_loss(model, inputs)

        def _save_checkpoint(self, model, trial):
            # hook runs *before* Trainer's save: Trainer._save_checkpoint pushes the folder to the Hub
            # (push_to_hub) and rotates old checkpoints from inside, so a file added afterwards would be missing.
            folder = os.path.join(self._get_output_dir(trial=trial), f"{checkpoint_prefix()}-{self.state.global_step}")
            if self.args.should_save:
                self.ext_before_save_checkpoint(folder)
            try:
                super()._save_checkpoint(model, trial)
            except Exception as e:  # noqa: BLE001 - disk full reads "unexpected pos ..." (torch), SafetensorError
                self.ext_save_failed(folder, e)
                raise

        def _load_optimizer_and_scheduler(self, checkpoint):
            super()._load_optimizer_and_scheduler(checkpoint)
            if checkpoint is not None:
                self.ext_after_load_checkpoint(checkpoint)

        # -- default hooks: TRL's behaviour -------------------------------------------------------------------
        def ext_generate_and_score(self, inputs):
            """TRL's ``_generate_and_score_completions``."""
            return super()._generate_and_score_completions(inputs)

        def ext_generate(self, prompts: list):
            """TRL's ``_generate``."""
            return super()._generate(prompts)

        def ext_generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                                     has_tool_images=False):
            """TRL's ``_generate_single_turn``: ``(completion_ids, logprobs)`` for token-id prompts."""
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)

        def ext_on_generated(self, completion_ids) -> None:
            """Called with the completion ids of every generation call (the generated-token counter)."""

        def ext_calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            """TRL's ``_calculate_rewards`` (gathered ``(N_global, F)`` rewards)."""
            return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

        def ext_compute_loss(self, model, inputs):
            """TRL's ``_compute_loss``."""
            return super()._compute_loss(model, inputs)

        def ext_before_save_checkpoint(self, checkpoint_dir: str) -> None:
            """Called on the saving process before ``checkpoint_dir`` is written (and pushed)."""

        def ext_save_failed(self, checkpoint_dir: str, exc: BaseException) -> None:
            """Called when the checkpoint save raised ``exc`` (may raise a clearer error; else ``exc`` propagates)."""

        def ext_after_load_checkpoint(self, checkpoint_dir: str) -> None:
            """Called on every process after the optimizer and scheduler were restored from ``checkpoint_dir``."""

    return TRLGlue


check_trl_version()
TRLGlue = _make_glue_class()


RELIED_ON: dict[str, tuple[str, ...] | None] = {
    # method name on trl.GRPOTrainer -> the positional parameters (after self) trl_ext passes, in order
    "_generate_and_score_completions": ("inputs",),
    "_generate": ("prompts",),
    "_generate_single_turn": ("prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"),
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
    "_compute_loss": ("model", "inputs"),
    "_tokenize_prompts": ("prompts",),
    "_save_checkpoint": ("model", "trial"),
    "_load_optimizer_and_scheduler": ("checkpoint",),
    "_get_output_dir": ("trial",),
}
"""TRL/transformers private methods trl_ext calls or overrides, with the parameters it uses."""

RELIED_ON_ATTRIBUTES = ("_metrics", "_logs", "_tokenizer", "_dist", "num_generations", "num_generations_eval",
                        "generation_config", "reward_weights", "reward_funcs", "reward_processing_classes",
                        "eos_token_ids", "pad_to_multiple_of", "loss_type", "scale_rewards", "beta",
                        "multi_objective_aggregation", "model_wrapped", "generation_kwargs", "use_vllm")
"""Instance attributes of a constructed :class:`trl.GRPOTrainer` that trl_ext reads or writes."""


# ------------------------------------------------------------------------------------------------- model cards
# TRL 1.16 builds the model card from three class-level private attributes of the trainer
# (``trl/trainer/base_trainer.py``, ``_BaseTrainer.create_model_card``): ``_name`` ("This model was trained with
# <name>"), ``_paper`` (``title``, arXiv ``id``, BibTeX ``citation``) and ``_tag_names`` (card tags; also added to
# the model with ``model.add_model_tags`` in ``GRPOTrainer.__init__``). Only these two functions touch them; the
# card text itself is built in :mod:`trl_ext.trainers.model_card`.

RELIED_ON_CARD_ATTRIBUTES = ("_name", "_paper", "_tag_names")
"""TRL 1.16 class attributes of ``trl.GRPOTrainer`` that build its model card (written only by
:func:`set_card_attributes`); ``create_model_card(model_name, dataset_name, tags)`` is the public method they feed.
``tests/test_model_cards.py`` checks both against the installed TRL."""


def set_card_attributes(cls: type, *, name: str | None = None, tags: Sequence[str] | None = None,
                        paper: dict | None = None) -> None:
    """Write TRL's model-card class attributes of ``cls`` (each only when given)."""
    if name is not None:
        cls._name = str(name)
    if tags is not None:
        cls._tag_names = list(dict.fromkeys(str(t) for t in tags))
    if paper is not None:
        cls._paper = dict(paper)


def card_attributes(cls: type) -> dict:
    """TRL's model-card settings of trainer class ``cls``: ``name``, ``tags``, ``paper``."""
    return {"name": cls._name, "tags": list(cls._tag_names), "paper": dict(cls._paper)}


def trl_grpo_tags() -> list[str]:
    """The model-card tags of ``trl.GRPOTrainer`` (``["trl", "grpo"]`` in TRL 1.16)."""
    import trl

    return list(trl.GRPOTrainer._tag_names)
