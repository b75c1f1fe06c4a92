"""BASIS on the offline testbed: one rollout per prompt (G = 1) with the batchwise value baseline.

Run with ``python examples/testbed/basis.py`` (CPU, a few minutes, no downloads; several CPU ranks with
``torchrun --standalone --nproc_per_node 2 examples/testbed/basis.py``).

Steps (see ``docs/basis.md``):

1. build (or load from the cache) the warmed-up tiny model of :mod:`trl_ext.testbed` -- the reference policy;
2. build the BASIS value table for the training prompts if ``--table_path`` does not exist yet
   (``trl_ext.priors.value_table.build_value_table``: ``--table_samples`` reference samples per prompt, the paper's
   Appendix 10; resumable, so an interrupted build continues where it stopped);
3. evaluate held-out accuracy (greedy, and sampled at temperature 1);
4. train with :class:`trl_ext.trainers.basis.BASISTrainer` (``--use_peft`` trains LoRA adapters through PEFT;
   ``--push_to_hub``/``--hub_model_id`` are passed through to the config);
5. evaluate again and write ``summary.json`` (accuracy before/after, generated training tokens, the beta
   trajectory) plus ``trainer_state.json``, the model and its model card (``README.md``: BASIS, its paper, and the
   value table's content hash and reference model) to ``--output_dir``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

TASK = "addition"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_common_args(p, output_dir="outputs/basis", max_steps=100)
    p.add_argument("--table_path", default=None,
                   help="value table (JSON Lines); built if missing (default OUTPUT_DIR/value_table.jsonl)")
    p.add_argument("--table_samples", type=int, default=32, help="reference samples per prompt (default 32)")
    p.add_argument("--train_prompts", type=int, default=2048,
                   help="training prompts drawn from the train split (and tabulated; default 2048)")
    p.add_argument("--prompts_per_step", type=int, default=64,
                   help="prompts (= rollouts, G = 1) per optimizer step over all ranks (default 64)")
    p.add_argument("--learning_rate", type=_common.positive_float, default=None,
                   help="default 1e-4 (full fine-tuning) or 1e-3 (--use_peft)")
    p.add_argument("--variant", choices=("unb", "vop", "rvg"), default="unb", help="BASIS refinement (default unb)")
    p.add_argument("--objective", choices=("robust", "paper"), default="robust",
                   help="beta calibration objective (default robust)")
    p.add_argument("--fallback", choices=("zero", "batch_mean", "value"), default="zero",
                   help="baseline of inactive / missing prompts (default zero, as in the paper)")
    p.add_argument("--scale_advantages", action="store_true", help="divide advantages by their batch std")
    p.add_argument("--loss_type", default="dapo", help="TRL loss_type (default dapo; see docs/basis.md)")
    p.add_argument("--importance_sampling_level", choices=("token", "sequence"), default="token",
                   help="'sequence' gives GSPO-style ratios (default token)")
    p.add_argument("--use_peft", action="store_true", help="train LoRA adapters (PEFT) instead of all weights")
    p.add_argument("--lora_r", type=int, default=8, help="LoRA rank (default 8)")
    p.add_argument("--push_to_hub", action="store_true", help="passed to the config (needs network and a token)")
    p.add_argument("--hub_model_id", default=None, help="passed to the config with --push_to_hub")
    p.add_argument("--n_eval", type=int, default=200, help="held-out questions evaluated (default 200)")
    p.add_argument("--eval_samples", type=int, default=4, help="samples per question for sampled accuracy")
    p.add_argument("--warmup_max_steps", type=int, default=None, help="cap on the cached SFT warm-up steps")
    args = p.parse_args(argv)
    for name in ("table_samples", "train_prompts", "n_eval", "eval_samples", "lora_r"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be a positive integer")
    if args.prompts_per_step < 2:
        p.error("--prompts_per_step must be >= 2 (the BASIS baseline is leave-one-out over the batch)")
    if args.learning_rate is None:
        args.learning_rate = 1e-3 if args.use_peft else 1e-4
    if args.table_path is None:
        args.table_path = os.path.join(args.output_dir, "value_table.jsonl")
    return args


def evaluate(model, tok, test_ds, args, max_new_tokens):
    from trl_ext.testbed import evaluate_model

    g = evaluate_model(model, tok, test_ds, TASK, greedy=True, max_new_tokens=max_new_tokens)
    s = evaluate_model(model, tok, test_ds, TASK, greedy=False, num_samples=args.eval_samples,
                       max_new_tokens=max_new_tokens, temperature=1.0, seed=args.seed + 1)
    return g, s


def ensure_table(args, warm_path, tok, train_ds, reward_funcs, max_new: int) -> None:
    """Build (or complete) the value table with the reference policy = the warm model (main process only)."""
    import torch
    from transformers import AutoModelForCausalLM

    from trl_ext.priors.value_table import build_value_table

    ref = AutoModelForCausalLM.from_pretrained(warm_path, dtype=torch.float32)
    t0 = time.time()
    table = build_value_table(ref, tok, train_ds, reward_funcs, args.table_path, num_samples=args.table_samples,
                              max_new_tokens=max_new, temperature=1.0, batch_size=1024, seed=args.seed,
                              model_id=warm_path, device="cpu", progress=True)
    stats = table.metadata.get("build_stats", {})
    _common.log(f"value table {args.table_path}: {len(table)} prompts x {args.table_samples} samples "
                f"({stats.get('n_written', 0)} new, {time.time() - t0:.0f} s)")


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.time()
    _common.setup_torch(args.num_threads)

    import torch
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    from trl_ext.testbed import TASKS, get_reward_funcs, get_warm_model, make_dataset
    from trl_ext.trainers.basis import BASISConfig, BASISTrainer

    state = PartialState(cpu=True)  # without cpu=True a CPU torchrun rank believes it is alone
    is_main, world = state.is_main_process, state.num_processes
    if args.prompts_per_step % world:
        raise SystemExit(f"--prompts_per_step {args.prompts_per_step} must be divisible by the {world} processes")
    os.makedirs(args.output_dir, exist_ok=True)
    reward_funcs = get_reward_funcs(TASK)
    max_new = TASKS[TASK].max_answer_chars() + 2  # answer + <eos> + 1 spare
    with state.main_process_first():
        warm_path = get_warm_model(TASK, seed=args.seed, cache_dir=args.cache_dir, max_steps=args.warmup_max_steps,
                                   verbose=is_main)
    tok = AutoTokenizer.from_pretrained(warm_path)
    train_ds = make_dataset(TASK, args.train_prompts, seed=args.seed, split="train")
    test_ds = make_dataset(TASK, args.n_eval, seed=0, split="test")
    if is_main:
        ensure_table(args, warm_path, tok, train_ds, reward_funcs, max_new)
    state.wait_for_everyone()

    model = AutoModelForCausalLM.from_pretrained(warm_path, dtype=torch.float32)
    before = evaluate(model, tok, test_ds, args, max_new) if is_main else None
    if is_main:
        _common.log(f"before: held-out greedy accuracy {before[0].accuracy:.3f}, sampled {before[1].accuracy:.3f}")

    peft_config = None
    if args.use_peft:
        from peft import LoraConfig

        peft_config = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0, task_type="CAUSAL_LM",
                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    config = BASISConfig(
        output_dir=args.output_dir,
        basis_value_table_path=args.table_path,
        basis_variant=args.variant,
        basis_objective=args.objective,
        basis_fallback=args.fallback,
        basis_scale_advantages=args.scale_advantages,
        loss_type=args.loss_type,
        importance_sampling_level=args.importance_sampling_level,
        max_steps=args.max_steps,
        seed=args.seed,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=args.prompts_per_step // world,
        gradient_accumulation_steps=1,
        max_completion_length=max_new,
        temperature=1.0,
        beta=0.0,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        push_to_hub=args.push_to_hub,
        hub_model_id=args.hub_model_id,
    )
    trainer = BASISTrainer(model=model, reward_funcs=reward_funcs, args=config, train_dataset=train_ds,
                           processing_class=tok, peft_config=peft_config)
    trainer.remove_callback(PrinterCallback)
    t_train = time.time()
    trainer.train()
    train_time = time.time() - t_train
    trainer.save_state()
    trainer.save_model(args.output_dir)
    trainer.create_model_card()  # README.md: "trained with BASIS", the paper, tags, the value table's hash

    if is_main:
        after = evaluate(trainer.model, tok, test_ds, args, max_new)
        hist = trainer.state.log_history
        gen_tokens = sum(h.get("ext/generated_tokens", 0.0) for h in hist)
        rollouts = sum(h.get("ext/rollouts", 0.0) for h in hist)
        active = [h["basis/active_fraction"] for h in hist if "basis/active_fraction" in h]
        summary = _common.write_run_outputs(
            args.output_dir, trainer="basis", task=TASK, before=before, after=after,
            curve=[(0, 0.0, before[0].accuracy, before[1].accuracy),
                   (args.max_steps, gen_tokens, after[0].accuracy, after[1].accuracy)],
            train_tokens=gen_tokens, train_rollouts=rollouts, wall_total=time.time() - t_start,
            wall_train=train_time, world=world, warm_model=warm_path, config=vars(args),
            method={"variant": args.variant, "beta_history": trainer.rollout_strategy.beta_history,
                    "mean_active_fraction": sum(active) / len(active) if active else None,
                    "value_table": os.path.basename(args.table_path)})
        b = trainer.rollout_strategy.beta_history
        print(f"\nheld-out accuracy ({args.n_eval} questions)   before   after")
        print(f"  greedy                              {before[0].accuracy:.3f}    {after[0].accuracy:.3f}")
        print(f"  sampled (T=1, {args.eval_samples}/question)            {before[1].accuracy:.3f}    "
              f"{after[1].accuracy:.3f}")
        print(f"training: {int(rollouts)} rollouts (G = 1), {int(gen_tokens)} completion tokens; beta "
              f"{b[0] if b else float('nan'):.2f} -> {b[-1] if b else float('nan'):.2f}; mean active fraction "
              f"{summary['method']['mean_active_fraction']}")
        print(f"wall time {summary['wall_time_s']['total']:.0f} s (training {train_time:.0f} s); outputs in "
              f"{args.output_dir}")
    state.wait_for_everyone()
    _common.shutdown_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
