"""Train with ``BASISTrainer``: one rollout per prompt (G = 1), an offline value table, a batchwise LOO baseline.

Every option of ``BASISConfig`` (TRL's ``GRPOConfig`` plus the ``--basis_*`` fields), ``ModelConfig`` and
``ExtScriptArguments`` is a command-line option; ``--help`` lists them. The value table is
``--basis_value_table_path`` (built beforehand with ``trl-ext build-value-table``), or, with ``--build_value_table``,
built here first from the starting model, the training prompts and rewards, and the run's sampling settings (into
``--basis_value_table_path``, default ``<output_dir>/value_table.jsonl``; an interrupted build resumes). See
docs/examples.md and docs/basis.md.

    python examples/scripts/basis.py --model_name_or_path smollm2 --dataset_name sum3 --dataset_num_prompts 64 \\
        --reward_funcs accuracy format --reward_weights 0.75 0.25 --build_value_table --value_table_num_samples 8 \\
        --use_cpu --bf16 false --gradient_checkpointing false --use_peft --per_device_train_batch_size 8 \\
        --max_completion_length 64 --max_steps 8 --output_dir outputs/basis-sum3
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from trl import ModelConfig, TrlParser

from trl_ext import BASISConfig
from trl_ext.scripts_support import (
    ExtScriptArguments,
    build_value_table_for_training,
    finish,
    prepare_training_inputs,
    run_training,
)


@dataclass
class BASISScriptArguments(ExtScriptArguments):
    build_value_table: bool = field(
        default=False,
        metadata={"help": "Build the value table before training (transformers generation; for large tables use "
                          "`trl-ext build-value-table`, which can use vLLM). It goes to --basis_value_table_path, "
                          "default <output_dir>/value_table.jsonl; an existing table of the same settings is "
                          "resumed/reused."},
    )
    value_table_num_samples: int = field(
        default=8, metadata={"help": "With --build_value_table: reference samples per training prompt (paper: 32-64)."}
    )
    value_table_batch_size: int = field(
        default=64, metadata={"help": "With --build_value_table: sequences per generate call."}
    )


def main(script_args: BASISScriptArguments, training_args: BASISConfig, model_args: ModelConfig, callbacks=None):
    """Build the value table if asked, train, save the model (the adapter with ``--use_peft``) and the BASIS model
    card to ``output_dir``, push them when asked; returns the trainer."""
    from trl_ext import BASISTrainer

    model, reward_funcs, train_dataset, eval_dataset = prepare_training_inputs(script_args, training_args,
                                                                               model_args)
    if script_args.build_value_table:
        with training_args.main_process_first(desc="value table"):  # rank 0 builds it, the others find it complete
            training_args.basis_value_table_path = build_value_table_for_training(
                model, train_dataset, reward_funcs,
                training_args.basis_value_table_path or os.path.join(training_args.output_dir, "value_table.jsonl"),
                training_args, num_samples=script_args.value_table_num_samples,
                batch_size=script_args.value_table_batch_size)
    if not training_args.basis_value_table_path:
        raise ValueError("BASIS needs a value table: pass --basis_value_table_path TABLE.jsonl (built with "
                         "`trl-ext build-value-table`) or --build_value_table.")

    return run_training(BASISTrainer, script_args, training_args, model_args,
                        inputs=(model, reward_funcs, train_dataset, eval_dataset), callbacks=callbacks)


def make_parser() -> TrlParser:
    return TrlParser((BASISScriptArguments, BASISConfig, ModelConfig))


if __name__ == "__main__":
    script_args, training_args, model_args = make_parser().parse_args_and_config()
    finish(main(script_args, training_args, model_args))  # finish trackers, destroy the process group
