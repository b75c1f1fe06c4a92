"""Quickstart: watch RLVR improve a tiny model on CPU in a few minutes, with no downloads.

Run with ``python examples/testbed/quickstart.py`` or ``accelerate launch examples/testbed/quickstart.py`` (several
CPU ranks: ``accelerate launch --multi_gpu --num_processes 2 examples/testbed/quickstart.py``; note that
``accelerate launch --cpu --num_processes 2`` silently starts one process). This is an in-house demo harness on the
offline testbed; the TRL-style training scripts (any model and dataset, CPU or GPU) are in ``examples/scripts/``
(``docs/examples.md``).

Steps: build (or load from the cache) the warmed-up tiny model of :mod:`trl_ext.testbed`; evaluate held-out
accuracy (greedy, and sampled at temperature 1); train with a TRL-style GRPO trainer on the addition task;
evaluate again at a few checkpoints and at the end; write to ``--output_dir``

- ``summary.json``: accuracy before/after (greedy and sampled), generated tokens, wall time, config;
- ``accuracy_vs_tokens.png``: held-out accuracy against training completion tokens generated;
- ``trainer_state.json`` (with ``log_history``), ``outcomes_{before,after}_{greedy,sampled}.jsonl`` (per-question
  outcomes, see docs/testbed.md) and the trained model.

Adding a GRPO-shaped trainer is one entry in :data:`TRAINERS`: ``name -> (config class, trainer class, extra
config kwargs)``. The trl_ext method trainers need method-specific set-up (BASIS builds a value table and uses
``G = 1``; V0.5 needs a value prior; PAIR probes prefixes), so ``--trainer basis|v05|pair`` runs the
matching example script (``examples/testbed/basis.py``, ``examples/testbed/v05_grpo.py``,
``examples/testbed/pair.py``) with the remaining arguments (``--output_dir``, ``--max_steps``, ``--seed``, and any
option that script accepts); each writes the same ``summary.json`` / ``trainer_state.json`` outputs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

#: name -> ("module:ConfigClass", "module:TrainerClass", extra config kwargs). Later trainers add entries here.
TRAINERS: dict[str, tuple[str, str, dict]] = {
    "grpo": ("trl:GRPOConfig", "trl:GRPOTrainer", {}),
}

#: name -> example script (in this directory) that runs that trl_ext trainer end to end on the testbed.
METHOD_EXAMPLES: dict[str, str] = {"basis": "basis", "v05": "v05_grpo", "pair": "pair"}

TASK = "addition"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_common_args(p, output_dir="outputs/quickstart", max_steps=300)
    p.add_argument("--trainer", choices=sorted({*TRAINERS, *METHOD_EXAMPLES}), default="grpo",
                   help="trainer to use (default grpo; basis, v05 and pair run examples/testbed/<name>.py)")
    p.add_argument("--learning_rate", type=_common.positive_float, default=1e-4,
                   help="GRPO learning rate (default 1e-4; 3e-4 destabilises this model)")
    p.add_argument("--num_generations", type=int, default=8, help="completions per prompt (default 8)")
    p.add_argument("--prompts_per_step", type=int, default=8, help="distinct prompts per step, all ranks (default 8)")
    p.add_argument("--n_eval", type=int, default=200, help="held-out questions evaluated (default 200)")
    p.add_argument("--eval_samples", type=int, default=4, help="samples per question for sampled accuracy (default 4)")
    p.add_argument("--eval_points", type=int, default=4,
                   help="evaluations during training, evenly spaced (default 4, the last at the end)")
    p.add_argument("--warmup_max_steps", type=int, default=None, help="cap on the cached SFT warm-up steps")
    args = p.parse_args(argv)
    if args.num_generations < 2:
        p.error("--num_generations must be >= 2 (GRPO needs a group)")
    if args.prompts_per_step < 1 or args.n_eval < 1 or args.eval_samples < 1 or args.eval_points < 1:
        p.error("--prompts_per_step, --n_eval, --eval_samples and --eval_points must be positive")
    return args


def evaluate(model, tok, test_ds, args, max_new_tokens):
    from trl_ext.testbed import evaluate_model

    g = evaluate_model(model, tok, test_ds, TASK, greedy=True, max_new_tokens=max_new_tokens)
    s = evaluate_model(model, tok, test_ds, TASK, greedy=False, num_samples=args.eval_samples,
                       max_new_tokens=max_new_tokens, temperature=1.0, seed=args.seed + 1)
    return g, s


def _delegate_to_method_example(argv) -> int | None:
    """``--trainer basis|v05|pair``: run the matching example script with the other arguments; None for GRPO trainers."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--trainer", default="grpo")
    known, rest = pre.parse_known_args(sys.argv[1:] if argv is None else argv)
    if known.trainer not in METHOD_EXAMPLES:
        return None
    import importlib

    return int(importlib.import_module(METHOD_EXAMPLES[known.trainer]).main(rest) or 0)


def main(argv=None) -> int:
    delegated = _delegate_to_method_example(argv)
    if delegated is not None:
        return delegated
    args = parse_args(argv)
    from trl_ext._plots import PLOTS_INSTALL_HINT, matplotlib_available

    if not matplotlib_available():  # it writes accuracy_vs_tokens.png: fail before training, not after
        raise SystemExit(f"quickstart.py plots accuracy_vs_tokens.png with matplotlib, which is not installed: "
                         f"{PLOTS_INSTALL_HINT}.")
    t_start = time.time()
    _common.setup_torch(args.num_threads)

    import torch
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback

    from trl_ext.testbed import TASKS, get_warm_model, make_dataset, split_size

    state = PartialState(cpu=True)  # without cpu=True a CPU torchrun rank believes it is alone (rank 0 of 1)
    is_main = state.is_main_process
    world = state.num_processes
    global_batch = args.prompts_per_step * args.num_generations
    if global_batch % world:
        raise SystemExit(f"prompts_per_step * num_generations = {global_batch} must be divisible by the "
                         f"{world} processes; change --prompts_per_step")
    os.makedirs(args.output_dir, exist_ok=True)

    with state.main_process_first():  # rank 0 builds the cache once, the others then load it
        warm_path = get_warm_model(TASK, seed=args.seed, cache_dir=args.cache_dir, max_steps=args.warmup_max_steps,
                                   verbose=is_main)
    _common.log(f"warm model: {warm_path}")
    tok = AutoTokenizer.from_pretrained(warm_path)
    model = AutoModelForCausalLM.from_pretrained(warm_path, dtype=torch.float32)
    max_new = TASKS[TASK].max_answer_chars() + 2  # answer + <eos> + 1 spare: mirrors max_completion_length
    test_ds = make_dataset(TASK, args.n_eval, seed=0, split="test")
    train_ds = make_dataset(TASK, split_size(TASK, "train"), seed=args.seed, split="train")

    points = []  # (step, generated tokens, greedy acc, sampled acc)
    before = None
    if is_main:
        before = evaluate(model, tok, test_ds, args, max_new)
        points.append((0, 0, before[0].accuracy, before[1].accuracy))
        _common.log(f"before: held-out greedy accuracy {before[0].accuracy:.3f}, sampled {before[1].accuracy:.3f}")

    eval_steps = sorted({max(1, round(args.max_steps * k / args.eval_points)) for k in range(1, args.eval_points)})

    class EvalCallback(TrainerCallback):
        """Count training completion tokens from TRL's logs; evaluate held-out accuracy at ``eval_steps``."""

        def __init__(self):
            self.tokens = 0.0

        def on_log(self, a, st, control, logs=None, model=None, **kw):
            if not logs or "completions/mean_length" not in logs:
                return
            # logging_steps=1 and steps_per_generation=1: each train log is one generation batch (all ranks)
            self.tokens += logs["completions/mean_length"] * a.generation_batch_size
            if st.is_world_process_zero and st.global_step % 25 == 0:
                print(f"step {st.global_step}/{a.max_steps}: train reward {logs.get('reward', float('nan')):.3f}, "
                      f"completion tokens so far {self.tokens:.0f}", flush=True)
            if st.is_world_process_zero and st.global_step in eval_steps:
                g, s = evaluate(model, tok, test_ds, args, max_new)
                points.append((st.global_step, self.tokens, g.accuracy, s.accuracy))
                print(f"step {st.global_step}: generated {self.tokens:.0f} tokens, held-out greedy "
                      f"{g.accuracy:.3f}, sampled {s.accuracy:.3f}", flush=True)

    config_cls, trainer_cls, extra = TRAINERS[args.trainer]
    config_cls, trainer_cls = _common.load_object(config_cls), _common.load_object(trainer_cls)
    config = config_cls(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        seed=args.seed,
        learning_rate=args.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        per_device_train_batch_size=global_batch // world,
        gradient_accumulation_steps=1,
        num_generations=args.num_generations,
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
        **extra,
    )
    callback = EvalCallback()
    trainer = trainer_cls(model=model, reward_funcs=list(TASKS[TASK].reward_funcs), args=config,
                          train_dataset=train_ds, processing_class=tok, callbacks=[callback])
    trainer.remove_callback(PrinterCallback)  # one dict per step is too noisy; EvalCallback prints progress
    t_train = time.time()
    trainer.train()
    train_time = time.time() - t_train
    trainer.save_state()
    trainer.save_model(args.output_dir)

    if is_main:
        after = evaluate(trainer.model, tok, test_ds, args, max_new)
        points.append((args.max_steps, callback.tokens, after[0].accuracy, after[1].accuracy))
        num_tokens = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]
        summary = _common.write_run_outputs(
            args.output_dir, trainer=args.trainer, task=TASK, before=before, after=after, curve=points,
            train_tokens=callback.tokens, train_rollouts=None, wall_total=time.time() - t_start,
            wall_train=train_time, world=world, warm_model=warm_path, config=vars(args),
            method={"train_prompt_plus_completion_tokens": int(num_tokens[-1]) if num_tokens else None,
                    "sampled_improved": after[1].accuracy > before[1].accuracy})
        print(f"\nheld-out accuracy ({args.n_eval} questions)   before   after")
        print(f"  greedy                              {before[0].accuracy:.3f}    {after[0].accuracy:.3f}")
        print(f"  sampled (T=1, {args.eval_samples}/question)            {before[1].accuracy:.3f}    "
              f"{after[1].accuracy:.3f}")
        print(f"generated tokens: training completions {callback.tokens:.0f}; evaluation "
              f"{summary['generated_tokens']['eval_tokens_before']} before, "
              f"{summary['generated_tokens']['eval_tokens_after']} after")
        print(f"wall time {summary['wall_time_s']['total']:.0f} s (training {train_time:.0f} s); "
              f"outputs in {args.output_dir}")
    state.wait_for_everyone()
    _common.shutdown_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
