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

from trl import ModelConfig, TrlParser, get_peft_config

from trl_ext import ExtGRPOConfig
from trl_ext.scripts_support import (
    ExtScriptArguments,
    load_datasets,
    resolve_model_name,
    resolve_reward_funcs,
    set_model_init_kwargs,
)


def main(script_args: ExtScriptArguments, training_args: ExtGRPOConfig, model_args: ModelConfig, callbacks=None):
    """Train, save the model (the adapter with ``--use_peft``) to ``output_dir`` and push it when asked; returns the
    trainer. ``callbacks`` (TrainerCallback list) is for programmatic callers; the command line has none."""
    from trl_ext import GRPOTrainer

    reward_funcs = resolve_reward_funcs(script_args.reward_funcs, script_args.dataset_name)
    with training_args.main_process_first(desc="model and dataset"):  # rank 0 fills the caches first
        model = resolve_model_name(model_args.model_name_or_path, dataset_name=script_args.dataset_name,
                                   cache_dir=script_args.cache_dir)
        train_dataset, eval_dataset = load_datasets(script_args, training_args)
    set_model_init_kwargs(model_args, training_args)

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=get_peft_config(model_args),
        callbacks=callbacks,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_state()  # trainer_state.json (log history) next to the model
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"Model saved to {training_args.output_dir}.")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
        trainer.accelerator.print(f"Model pushed to https://huggingface.co/{trainer.hub_model_id}.")
    return trainer


def make_parser() -> TrlParser:
    return TrlParser((ExtScriptArguments, ExtGRPOConfig, ModelConfig))


if __name__ == "__main__":
    script_args, training_args, model_args = make_parser().parse_args_and_config()
    main(script_args, training_args, model_args).end()  # end(): finish trackers, destroy the process group
