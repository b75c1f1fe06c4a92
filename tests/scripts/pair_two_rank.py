"""PAIRTrainer steps with a deterministic stand-in generator and a loss recorder, for the 1-vs-2-process tests.

Run as ``torchrun --standalone --nproc_per_node 2 tests/scripts/pair_two_rank.py OUT_DIR STEPS PER_DEVICE`` (with
``ACCELERATE_DEBUG_MODE=1``) or as ``python tests/scripts/pair_two_rank.py OUT_DIR STEPS PER_DEVICE`` (one process,
twice the per-device rows). Generation is replaced by a deterministic function of the token sequence (and of the
candidate's position among identical sequences), so both layouts see the same global candidate groups; the design
randomness is keyed by (seed, generation, dataset row). Two scenarios run one after the other:

* ``agree`` (``loss_type="grpo"``, ``steps_per_generation=1``, ``STEPS`` steps): rank 0 writes
  ``OUT_DIR/result.json`` with, per step, the global design log (row, pi, selected), rewards and advantages of the
  completed vertices, and at the end checksums of the heads and of the policy weights;
* ``spg2`` (``loss_type="grpo"``, ``steps_per_generation=2``, three generation batches): every rank writes
  ``OUT_DIR/spg2_rank{r}.json`` with what reached TRL's loss (see :func:`coefficient_report`).

The helpers here are also imported by ``tests/test_pair_trainer.py`` (one implementation of the stand-in generator
and of the loss recorder, below the base trainer's generated-token counter and policy-scale hook).
"""

import json
import os
import sys
import zlib

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

SEQUENCE_LEVEL = ("grpo", "sapo", "luspo")


def scripted_tokens(tok, ids, occurrence: int, max_new: int) -> list[int]:
    """Deterministic stand-in completion of ``ids`` (digits, EOS with probability ~1/7 per token after the first)."""
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
    h = zlib.crc32(repr((tuple(ids), occurrence)).encode())
    toks = []
    for t in range(max_new):
        h = zlib.crc32(h.to_bytes(4, "little"))
        if h % 7 == 0 and t > 0:
            toks.append(tok.eos_token_id)
            break
        toks.append(digits[h % 10])
    return toks


def recording_class(base_cls):
    """``base_cls`` (a trl_ext trainer) with the stand-in generator and the loss recorder.

    The ``Backend`` mixin sits *below* :class:`trl_ext.GRPOTrainer` in the MRO (between it and the TRL glue), so the
    base's generated-token counter and policy-scale hook run unchanged: it replaces TRL's sampler and records the
    inputs exactly as TRL's loss receives them. ``scripted = False`` keeps the real sampler; an instance attribute
    ``script(max_new) -> tokens`` gives every row the same completion. ``generation_calls`` records
    ``(rows, max_new_tokens)`` of every generation call.
    """
    import torch
    from accelerate.utils import gather_object

    from trl_ext.trainers._trl_compat import TRLGlue

    class Backend(TRLGlue):
        scripted = True

        def ext_generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                                     has_tool_images=False):
            if not self.scripted:
                return super().ext_generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                        has_tool_images)
            max_new = int(self.generation_config.max_new_tokens)
            calls = self.__dict__.setdefault("generation_calls", [])
            calls.append((len(prompt_ids), max_new))
            script = self.__dict__.get("script")
            if script is not None:  # a test's fixed completion for every row
                return [list(script(max_new)) for _ in prompt_ids], None
            seen: dict = {}
            out = []
            for ids in prompt_ids:
                key = tuple(ids)
                occ = seen.get(key, 0)
                seen[key] = occ + 1
                out.append(scripted_tokens(self.processing_class, ids, occ, max_new))
            return out, None

        def ext_compute_loss(self, model, inputs):
            if self.model.training and "test_row" in inputs:
                mask = inputs["completion_mask"]
                self.__dict__.setdefault("loss_records", []).append({
                    "generation": len(self.generations) - 1,
                    "rows": inputs["test_row"].tolist(),
                    "advantages": inputs["advantages"].double().tolist(),
                    "mask_tokens": mask.sum(dim=1).tolist(),
                    "num_items_in_batch": float(inputs["num_items_in_batch"]),
                    "B": int(inputs["advantages"].shape[0]),
                })
            return super().ext_compute_loss(model, inputs)

    class Recording(base_cls, Backend):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.generations = []

        def ext_generate_and_score(self, inputs):
            out = super().ext_generate_and_score(inputs)
            if self.model.training:
                n = int(out["advantages"].shape[0])
                out["test_row"] = torch.arange(n) + self.accelerator.process_index * n
                b = self.last_rollout_batch
                design = gather_object([{k: d[k] for k in ("row_idx", "pi", "selected", "finished", "warm_started")}
                                        for d in self.rollout_strategy.design_log])
                self.generations.append({
                    "K": len(design), "design": design, "rewards": b.rewards.tolist(),
                    "group_ids": b.group_ids.tolist(), "is_pad": b.is_pad.tolist(),
                    "advantages": self.last_advantages.double().tolist(), "stats": dict(self.rollout_strategy.last_stats),
                })
            return out

    return Recording


def recorded(trainer) -> dict:
    """What :func:`coefficient_report` needs from a trained recording trainer (JSON-serializable)."""
    a = trainer.args
    return {"loss_type": trainer.loss_type, "world": trainer.accelerator.num_processes,
            "spg": int(a.steps_per_generation), "L": int(a.max_completion_length),
            "generations": trainer.generations, "loss_records": trainer.__dict__.get("loss_records", [])}


def independent_pair_advantages(gen: dict) -> list[float]:
    """Eq. 13 for every global row of one generation batch, recomputed from the design log and the rewards alone
    (:func:`trl_ext.estimators.pair_advantages`; pad rows 0)."""
    import numpy as np

    from trl_ext.estimators import pair_advantages

    gids = np.asarray(gen["group_ids"])
    pad = np.asarray(gen["is_pad"], dtype=bool)
    r = np.asarray(gen["rewards"], dtype=np.float64)
    out = np.zeros(len(gids))
    groups = [d for d in gen["design"] if any(d["selected"])]
    for g, d in enumerate(groups):
        idx = np.flatnonzero((gids == g) & ~pad)
        sel = np.asarray(d["selected"], dtype=bool)
        assert idx.size == sel.sum(), (idx.size, sel.sum())
        r_full = np.full(sel.size, np.nan)
        r_full[sel] = r[idx]
        out[idx] = pair_advantages(r_full, sel, np.asarray(d["pi"])).advantages[sel]
    return out.tolist()


def coefficient_report(rec: dict) -> dict:
    """Effective per-row coefficients of the policy loss against PAIR's fixed normalizer.

    For every row that reached TRL's loss, ``c_i = A'_i / D`` with ``A'_i`` the advantage TRL's loss received and
    ``D`` TRL's own policy denominator of one generation batch: ``B * P * spg`` rows for ``grpo``/``sapo``/``luspo``
    (mean over the ``B`` micro-batch rows, DDP mean over ``P`` ranks, ``spg`` micro-batches), ``B * P * spg * L``
    for ``dr_grpo`` (token sum / (B L)), ``num_items_in_batch`` tokens for ``dapo``/``cispo``/``vespo``. (TRL's
    common factor ``spg / gradient_accumulation_steps`` multiplies every row of every loss type alike.) PAIR's fixed
    normalizer wants ``c_i = A_i / K`` (sequence-level) and ``A_i / (K L)`` (``dr_grpo`` and token-level), with
    ``A_i`` Eq. 13 recomputed independently and ``K`` the prompts of the generation batch.

    Returns the largest absolute and relative deviation, the rows checked, the distinct real-row counts of the
    generation batches and how many generation batches had pad rows.
    """
    lt, P, spg, L = rec["loss_type"], rec["world"], rec["spg"], rec["L"]
    indep = [independent_pair_advantages(g) for g in rec["generations"]]
    max_abs = max_rel = 0.0
    n_rows = n_pad_rows = 0
    nonzero = 0
    unscaled_dev = 0.0
    for g, a_ref in zip(rec["generations"], indep):  # the base's own (unscaled) advantages are Eq. 13 exactly
        unscaled_dev = max(unscaled_dev, max(abs(x - y) for x, y in zip(g["advantages"], a_ref)))
    for lr in rec["loss_records"]:
        gen = rec["generations"][lr["generation"]]
        K = float(gen["K"])
        B = lr["B"]
        for row, a_trl, toks in zip(lr["rows"], lr["advantages"], lr["mask_tokens"]):
            if gen["is_pad"][row]:
                n_pad_rows += 1
                assert toks == 0, "a pad row reached the loss with a nonzero mask"
                continue
            a = indep[lr["generation"]][row]
            if lt in SEQUENCE_LEVEL:
                got, want = a_trl / (B * P * spg), a / K
            elif lt == "dr_grpo":
                got, want = a_trl / (B * P * spg * L), a / (K * L)
            else:
                got, want = a_trl / lr["num_items_in_batch"], a / (K * L)
            dev = abs(got - want)
            max_abs = max(max_abs, dev)
            if want != 0:
                nonzero += 1
                max_rel = max(max_rel, dev / abs(want))
            n_rows += 1
    real_counts = sorted({sum(not p for p in g["is_pad"]) for g in rec["generations"]})
    padded = sum(any(g["is_pad"]) for g in rec["generations"])
    return {"max_abs": max_abs, "max_rel": max_rel, "rows": n_rows, "nonzero_rows": nonzero, "pad_rows": n_pad_rows,
            "real_row_counts": real_counts, "padded_generations": padded, "unscaled_dev": unscaled_dev}


def reward(prompts, completions, **kw):
    return [float(zlib.crc32((c if isinstance(c, str) else c[-1]["content"]).encode()) % 2) for c in completions]


def build(out_dir, *, per_device, max_steps, reward_funcs=None, **over):
    from trl_ext.testbed import build_tiny_model, build_tokenizer, make_dataset
    from trl_ext.trainers.pair import PAIRConfig, PAIRTrainer

    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=0)
    kw = dict(
        output_dir=out_dir, max_steps=max_steps, per_device_train_batch_size=per_device,
        num_generations=4, max_completion_length=5, pair_prefix_tokens=2, pair_head_min_labels=8,
        pair_head_fit_steps=20, learning_rate=1e-3, beta=0.0, use_cpu=True, bf16=False, logging_steps=1,
        save_strategy="no", report_to="none", disable_tqdm=True, seed=0, temperature=1.0, dataloader_num_workers=0,
        loss_type="grpo",
    )
    kw.update(over)
    cls = recording_class(PAIRTrainer)
    return cls(model=model, reward_funcs=reward_funcs or [reward], args=PAIRConfig(**kw),
               train_dataset=make_dataset("addition", 64, 0), processing_class=tok)


def main() -> int:
    out_dir, steps, per_device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    import torch

    torch.set_num_threads(1)
    from accelerate import PartialState

    state = PartialState(cpu=True)
    trainer = build(os.path.join(out_dir, "run"), per_device=per_device, max_steps=steps)
    trainer.train()
    rec = recorded(trainer)
    if state.is_main_process:
        heads = trainer.rollout_strategy.heads.heads
        result = {
            "world": state.num_processes,
            "trace": [{"design": g["design"], "rewards": [r for r, p in zip(g["rewards"], g["is_pad"]) if not p],
                       "advantages": [a for a, p in zip(g["advantages"], g["is_pad"]) if not p],
                       "stats": g["stats"]} for g in rec["generations"]],
            "heads_checksum": float(sum(p.detach().double().abs().sum() for h in (heads.success_head, heads.cost_head)
                                        for p in h.parameters())),
            "n_labels": heads.n_labels,
            "temperature": heads.temperature,
            "model_checksum": float(sum(p.detach().double().abs().sum() for p in trainer.model.parameters())),
            "warm_start": trainer.rollout_strategy.warm_start.state_dict(),
        }
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump(result, f)
    with open(os.path.join(out_dir, f"agree_rank{state.process_index}.json"), "w") as f:
        json.dump(rec, f)
    # steps_per_generation = 2: two micro-batches per generation batch, pad rows whenever a rank's completed count is
    # odd or below the other rank's
    spg2 = build(os.path.join(out_dir, "spg2"), per_device=per_device // 2, max_steps=6, steps_per_generation=2)
    spg2.train()
    with open(os.path.join(out_dir, f"spg2_rank{state.process_index}.json"), "w") as f:
        json.dump(recorded(spg2), f)
    state.wait_for_everyone()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _dist_exit import run_and_shutdown

    sys.exit(run_and_shutdown(main))
