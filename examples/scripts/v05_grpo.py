"""Train with ``V05GRPOTrainer``: a value prior fused with observed rewards, and Sequential OSLA rollout rounds.

Every option of ``V05GRPOConfig`` (TRL's ``GRPOConfig`` plus the ``--v05_*`` fields: ``--v05_k_init``,
``--v05_value_prior embedding|constant|table``, ``--v05_value_prior_kwargs '{...}'``, ``--v05_extra_rollout_budget``,
...), ``ModelConfig`` and ``ExtScriptArguments`` is a command-line option; ``--help`` lists them. Round 1 samples
``v05_k_init`` (4) rollouts per prompt, so ``--per_device_train_batch_size`` must be a multiple of it. See
docs/examples.md and docs/v05.md.

    python examples/scripts/v05_grpo.py --model_name_or_path smollm2 --dataset_name sum3 \\
        --reward_funcs accuracy format --reward_weights 0.75 0.25 --use_cpu --bf16 false \\
        --gradient_checkpointing false --use_peft --per_device_train_batch_size 8 --max_completion_length 64 \\
        --max_steps 10 --output_dir outputs/v05-sum3
"""

from __future__ import annotations

from trl import ModelConfig, TrlParser

from trl_ext import V05GRPOConfig
from trl_ext.scripts_support import (
    ExtScriptArguments,
    finish,
    run_training,
)


def main(script_args: ExtScriptArguments, training_args: V05GRPOConfig, model_args: ModelConfig, callbacks=None):
    """Train, save the model (the adapter with ``--use_peft``) to ``output_dir`` and push it when asked; returns the
    trainer. The value prior comes from ``--v05_value_prior`` (the default embedding prior embeds prompts with the
    frozen starting policy: the LoRA base weights with ``--use_peft``, no copy)."""
    from trl_ext import V05GRPOTrainer

    return run_training(V05GRPOTrainer, script_args, training_args, model_args, callbacks=callbacks)


def make_parser() -> TrlParser:
    return TrlParser((ExtScriptArguments, V05GRPOConfig, ModelConfig))


if __name__ == "__main__":
    script_args, training_args, model_args = make_parser().parse_args_and_config()
    finish(main(script_args, training_args, model_args))  # finish trackers, destroy the process group
