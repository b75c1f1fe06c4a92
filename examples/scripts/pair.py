"""Train with ``PAIRTrainer``: probe every candidate's prefix, continue a designed subset, reweight by pair inclusion.

Every option of ``PAIRConfig`` (TRL's ``GRPOConfig`` plus the ``--pair_*`` fields: ``--pair_prefix_tokens``,
``--pair_budget_ratio``, ``--pair_pi_min``, ...), ``ModelConfig`` and ``ExtScriptArguments`` is a command-line
option; ``--help`` lists them. ``--per_device_train_batch_size`` x ``--steps_per_generation`` must be a multiple of
``--num_generations`` (a candidate group stays on one process). See docs/examples.md and docs/pair.md.

    python examples/scripts/pair.py --model_name_or_path smollm2 --dataset_name sum3 \\
        --reward_funcs accuracy format --reward_weights 0.75 0.25 --use_cpu --bf16 false \\
        --gradient_checkpointing false --use_peft --per_device_train_batch_size 8 --num_generations 4 \\
        --pair_prefix_tokens 8 --max_completion_length 64 --max_steps 10 --output_dir outputs/pair-sum3
"""

from __future__ import annotations

from trl import ModelConfig, TrlParser

from trl_ext import PAIRConfig
from trl_ext.scripts_support import (
    ExtScriptArguments,
    finish,
    run_training,
)


def main(script_args: ExtScriptArguments, training_args: PAIRConfig, model_args: ModelConfig, callbacks=None):
    """Train, save the model (the adapter with ``--use_peft``) and the PAIR model card to ``output_dir``, push them
    when asked; returns the trainer."""
    from trl_ext import PAIRTrainer

    return run_training(PAIRTrainer, script_args, training_args, model_args, callbacks=callbacks)


def make_parser() -> TrlParser:
    return TrlParser((ExtScriptArguments, PAIRConfig, ModelConfig))


if __name__ == "__main__":
    script_args, training_args, model_args = make_parser().parse_args_and_config()
    finish(main(script_args, training_args, model_args))  # finish trackers, destroy the process group
