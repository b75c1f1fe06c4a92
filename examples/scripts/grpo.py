"""Train with ``trl_ext.GRPOTrainer``: TRL's GRPO, plus DAPO dynamic sampling and the registered advantage estimators.

Everything is a command-line option of ``ExtGRPOConfig`` (TRL's ``GRPOConfig`` and ``TrainingArguments`` plus
trl_ext's fields), ``ModelConfig`` (model loading, LoRA) or ``ExtScriptArguments`` (dataset and rewards by name);
``python examples/scripts/grpo.py --help`` lists them. See docs/examples.md.

    # CPU, the real SmolLM2-135M-Instruct on the two-shot sum3 task, LoRA
    python examples/scripts/grpo.py --model_name_or_path smollm2 --dataset_name sum3 --reward_funcs accuracy format \\
        --use_cpu --bf16 false --gradient_checkpointing false --use_peft --lora_target_modules all-linear \\
        --per_device_train_batch_size 8 --num_generations 4 --max_completion_length 64 --max_steps 10 \\
        --output_dir outputs/grpo-sum3

    # DAPO dynamic sampling / another estimator: add --dynamic_sampling / --advantage_estimator rloo
    # one GPU: drop --use_cpu --bf16 false; several: accelerate launch --config_file
    #   examples/accelerate_configs/multi_gpu.yaml examples/scripts/grpo.py ...; vLLM: --use_vllm --vllm_mode colocate
"""

from __future__ import annotations

from trl import ModelConfig, TrlParser

from trl_ext import ExtGRPOConfig
from trl_ext.scripts_support import (
    ExtScriptArguments,
    finish,
    run_training,
)


def main(script_args: ExtScriptArguments, training_args: ExtGRPOConfig, model_args: ModelConfig, callbacks=None):
    """Train, save the model (the adapter with ``--use_peft``) to ``output_dir`` and push it when asked; returns the
    trainer. ``callbacks`` (TrainerCallback list) is for programmatic callers; the command line has none."""
    from trl_ext import GRPOTrainer

    return run_training(GRPOTrainer, script_args, training_args, model_args, callbacks=callbacks)


def make_parser() -> TrlParser:
    return TrlParser((ExtScriptArguments, ExtGRPOConfig, ModelConfig))


if __name__ == "__main__":
    script_args, training_args, model_args = make_parser().parse_args_and_config()
    finish(main(script_args, training_args, model_args))  # finish trackers, destroy the process group
