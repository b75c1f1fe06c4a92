"""PAIR on the offline testbed: prefix probing + convex continuation design + pair-inclusion reweighting.

Trains the warmed-up tiny model of :mod:`trl_ext.testbed` on the addition task with :class:`PAIRTrainer` (or, with
``--trainer grpo``, with full-group GRPO at the same group size, for comparison), evaluates held-out accuracy
before and after, and writes ``summary.json`` (accuracy, generated tokens split into prefix/suffix, PAIR
diagnostics) and ``trainer_state.json`` to ``--output_dir``.

    python examples/testbed/pair.py --max_steps 150 --output_dir outputs/pair
    python examples/testbed/pair.py --trainer grpo --max_steps 150 --output_dir outputs/grpo16
    torchrun --standalone --nproc_per_node 2 examples/testbed/pair.py --max_steps 20     # two CPU ranks

``--use_peft`` trains LoRA adapters (the prefix summary then comes from the adapted model); ``--push_to_hub`` (with
``--hub_model_id``) is passed to the trainer config (needs network access and a token; not available offline).

Generated tokens: both trainers report the base trainer's one counter ``ext/generated_tokens`` (every token any
generation call produced: for PAIR every probed prefix, also the unselected ones, plus every generated suffix; for
GRPO every completion token). PAIR's split into prefix and suffix tokens comes from ``pair/prefix_tokens`` and
``pair/realized_suffix_tokens``.

``PAIRConfig`` keeps TRL's arguments and defaults (``num_generations`` is TRL's 8); this example passes the paper's
``G = 16`` explicitly (``--num_generations``). With the testbed's 3-5-token answers the default probe is 1 token and
``PAIRTrainer`` warns that PAIR should not be used there (``PAIRShortProbeWarning``): this example reproduces that
negative result. ``README.md`` in ``--output_dir`` is the model card (``trainer.create_model_card()``).
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
    _common.add_common_args(p, output_dir="outputs/pair", max_steps=150)
    p.add_argument("--trainer", choices=("pair", "grpo"), default="pair", help="pair (default) or full-group grpo")
    p.add_argument("--model_path", default=None, help="local model dir (default: the warm testbed model)")
    p.add_argument("--warmup_max_steps", type=int, default=None, help="cap on the cached SFT warm-up steps")
    p.add_argument("--learning_rate", type=_common.positive_float, default=None,
                   help="default 2e-4 for pair (its unstandardized Eq. 13 advantages are about half the size of "
                        "standardized GRPO's), 1e-4 for grpo")
    p.add_argument("--num_generations", type=int, default=16,
                   help="candidate group size G (default 16, the paper's G; passed explicitly: PAIRConfig keeps "
                        "TRL's default num_generations=8)")
    p.add_argument("--prompts_per_step", type=int, default=8, help="prompts per step, all ranks (default 8)")
    p.add_argument("--prefix_tokens", type=int, default=None, help="PAIR checkpoint tau (default: config default)")
    p.add_argument("--budget_ratio", type=float, default=0.5, help="PAIR expected suffix budget ratio (0.5)")
    p.add_argument("--pi_min", type=float, default=0.08, help="PAIR probability floor (0.08)")
    p.add_argument("--anchor_pair", action="store_true", help="PAIR: Appendix B anchor pair")
    p.add_argument("--n_eval", type=int, default=200, help="held-out questions (default 200)")
    p.add_argument("--eval_samples", type=int, default=4, help="samples per question for sampled accuracy")
    p.add_argument("--use_peft", action="store_true", help="train LoRA adapters (peft) instead of all weights")
    p.add_argument("--push_to_hub", action="store_true", help="push the result to the Hub (needs network)")
    p.add_argument("--hub_model_id", default=None, help="repository id for --push_to_hub")
    args = p.parse_args(argv)
    if args.num_generations < 2:
        p.error("--num_generations must be >= 2")
    if args.prompts_per_step < 1 or args.n_eval < 1 or args.eval_samples < 1:
        p.error("--prompts_per_step, --n_eval and --eval_samples must be positive")
    if args.learning_rate is None:
        args.learning_rate = 2e-4 if args.trainer == "pair" else 1e-4
    return args


def evaluate(model, tok, test_ds, args, max_new):
    from trl_ext.testbed import evaluate_model

    g = evaluate_model(model, tok, test_ds, TASK, greedy=True, max_new_tokens=max_new)
    s = evaluate_model(model, tok, test_ds, TASK, greedy=False, num_samples=args.eval_samples,
                       max_new_tokens=max_new, temperature=1.0, seed=args.seed + 1)
    return g, s


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.time()
    _common.setup_torch(args.num_threads)

    import torch
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.testbed import TASKS, get_warm_model, make_dataset, split_size
    from trl_ext.trainers.base import ExtGRPOConfig, GRPOTrainer
    from trl_ext.trainers.pair import PAIRConfig, PAIRTrainer

    state = PartialState(cpu=True)
    world = state.num_processes
    rows = args.prompts_per_step * args.num_generations
    if rows % world or (rows // world) % args.num_generations:
        raise SystemExit(f"prompts_per_step ({args.prompts_per_step}) must be a multiple of the {world} processes "
                         "(each prompt's candidate group stays on one rank)")
    if args.model_path is not None:
        warm = args.model_path
    else:
        with state.main_process_first():
            warm = get_warm_model(TASK, seed=0, cache_dir=args.cache_dir, max_steps=args.warmup_max_steps,
                                  verbose=state.is_main_process)
    tok = AutoTokenizer.from_pretrained(warm)
    model = AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32)
    max_new = TASKS[TASK].max_answer_chars() + 2
    test_ds = make_dataset(TASK, args.n_eval, seed=0, split="test")
    train_ds = make_dataset(TASK, split_size(TASK, "train"), seed=args.seed, split="train")
    before = evaluate(model, tok, test_ds, args, max_new) if state.is_main_process else None

    common = dict(
        output_dir=args.output_dir, max_steps=args.max_steps, seed=args.seed, learning_rate=args.learning_rate,
        lr_scheduler_type="constant", warmup_steps=0, per_device_train_batch_size=rows // world,
        gradient_accumulation_steps=1, num_generations=args.num_generations, max_completion_length=max_new,
        temperature=1.0, beta=0.0, use_cpu=True, bf16=False, gradient_checkpointing=False, logging_steps=1,
        save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        push_to_hub=args.push_to_hub, hub_model_id=args.hub_model_id,
    )
    if args.trainer == "pair":
        extra = dict(pair_budget_ratio=args.budget_ratio, pair_pi_min=args.pi_min, pair_anchor_pair=args.anchor_pair)
        if args.prefix_tokens is not None:
            extra["pair_prefix_tokens"] = args.prefix_tokens
        config, cls = PAIRConfig(**common, **extra), PAIRTrainer
    else:
        config, cls = ExtGRPOConfig(**common), GRPOTrainer
    peft_config = None
    if args.use_peft:
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                 lora_dropout=0.0, task_type="CAUSAL_LM")
    trainer = cls(model=model, reward_funcs=list(TASKS[TASK].reward_funcs), args=config, train_dataset=train_ds,
                  processing_class=tok, peft_config=peft_config)
    t_train = time.time()
    trainer.train()
    train_time = time.time() - t_train
    trainer.save_state()
    trainer.save_model(args.output_dir)
    trainer.create_model_card()  # README.md: "trained with PAIR", the paper, tags, the probe/design/head settings
    if args.push_to_hub and state.is_main_process:
        trainer.push_to_hub()

    if state.is_main_process:
        hist = trainer.state.log_history
        model_eval = trainer.accelerator.unwrap_model(trainer.model)
        after = evaluate(model_eval, tok, test_ds, args, max_new)

        def total(key):
            return float(sum(h[key] for h in hist if key in h))

        if args.trainer == "pair":
            tokens = {"generated": total("ext/generated_tokens"), "prefix": total("pair/prefix_tokens"),
                      "suffix": total("pair/realized_suffix_tokens")}
            def mean(key):  # undefined values (e.g. no solver run: NaN) are logged as None; skip them
                vals = [h[key] for h in hist if h.get(key) is not None]
                return float(sum(vals) / len(vals)) if vals else None

            diag = {k: mean(k)
                    for k in ("pair/completed_per_group", "pair/ess_mean", "pair/pi_min", "pair/pi_mean",
                              "pair/zero_edge_groups", "pair/solver_fallbacks", "pair/degenerate_groups",
                              "pair/solver_iterations", "pair/nan_rewards", "pair/head_brier",
                              "pair/head_cost_mape", "pair/warmup")}
        else:
            tokens = {"generated": total("ext/generated_tokens")}
            diag = {}
        rollouts = total("ext/rollouts")
        _common.write_run_outputs(
            args.output_dir, trainer=args.trainer, task=TASK, before=before, after=after,
            curve=[(0, 0.0, before[0].accuracy, before[1].accuracy),
                   (args.max_steps, tokens["generated"], after[0].accuracy, after[1].accuracy)],
            train_tokens=tokens["generated"], train_rollouts=rollouts or None, wall_total=time.time() - t0,
            wall_train=train_time, world=world, warm_model=warm, config=vars(args),
            method={"train_generated_tokens": tokens, "pair_diagnostics_mean": diag, "use_peft": args.use_peft,
                    "num_generations": args.num_generations, "prompts_per_step": args.prompts_per_step,
                    "learning_rate": args.learning_rate})
        print(f"{args.trainer}: held-out greedy {before[0].accuracy:.3f} -> {after[0].accuracy:.3f}, sampled "
              f"{before[1].accuracy:.3f} -> {after[1].accuracy:.3f}; training generated "
              f"{tokens['generated']:.0f} tokens in {train_time:.0f} s", flush=True)
    state.wait_for_everyone()
    _common.shutdown_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
