"""A few PAIRTrainer steps with a deterministic stand-in generator, for the 1-vs-2-process agreement test.

Run as ``torchrun --standalone --nproc_per_node 2 tests/scripts/pair_two_rank.py OUT_DIR STEPS PER_DEVICE`` (with
``ACCELERATE_DEBUG_MODE=1``) or as ``python tests/scripts/pair_two_rank.py OUT_DIR STEPS PER_DEVICE`` (one process,
twice the per-device rows). Generation is replaced by a deterministic function of the token sequence (and of the
candidate's position among identical sequences), so both layouts see the same global candidate groups; the design
randomness is keyed by (seed, generation, dataset row). Rank 0 writes ``OUT_DIR/result.json``: per step the
global design log (row, pi, selected), rewards and advantages of the completed vertices, and at the end checksums
of the heads and of the policy weights.
"""

import json
import os
import sys
import zlib

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")


def main() -> int:
    out_dir, steps, per_device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    import torch

    torch.set_num_threads(1)
    from accelerate import PartialState
    from accelerate.utils import gather_object

    from trl_ext.testbed import build_tiny_model, build_tokenizer, make_dataset
    from trl_ext.trainers.pair import PAIRConfig, PAIRTrainer

    state = PartialState(cpu=True)
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=0)
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]

    def reward(prompts, completions, **kw):
        return [float(zlib.crc32(c.encode()) % 2) for c in completions]

    class StandIn(PAIRTrainer):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                                  has_tool_images=False):
            max_new = int(self.generation_config.max_new_tokens)
            seen: dict = {}
            out = []
            for ids in prompt_ids:
                key = tuple(ids)
                occ = seen.get(key, 0)
                seen[key] = occ + 1
                h = zlib.crc32(repr((key, occ)).encode())
                toks = []
                for t in range(max_new):
                    h = zlib.crc32(h.to_bytes(4, "little"))
                    if h % 7 == 0 and t > 0:
                        toks.append(tok.eos_token_id)
                        break
                    toks.append(digits[h % 10])
                out.append(toks)
            return out, None

        def compute_advantages(self, batch):
            adv = super().compute_advantages(batch)
            logs = gather_object([{k: d[k] for k in ("row_idx", "pi", "selected", "finished")}
                                  for d in self.pair_design_log])
            real = batch.valid
            self.trace.append({"design": logs, "rewards": batch.rewards[real].tolist(),
                               "advantages": adv[real].tolist(), "stats": dict(self.last_pair_stats)})
            return adv

    config = PAIRConfig(
        output_dir=os.path.join(out_dir, "run"), max_steps=steps, per_device_train_batch_size=per_device,
        num_generations=4, max_completion_length=5, pair_prefix_tokens=2, pair_head_min_labels=8,
        pair_head_fit_steps=20, learning_rate=1e-3, beta=0.0, use_cpu=True, bf16=False, logging_steps=1,
        save_strategy="no", report_to="none", disable_tqdm=True, seed=0, temperature=1.0, dataloader_num_workers=0,
    )
    trainer = StandIn(model=model, reward_funcs=[reward], args=config, train_dataset=make_dataset("addition", 64, 0),
                      processing_class=tok)
    trainer.trace = []
    trainer.train()
    if state.is_main_process:
        heads = trainer.pair_heads
        result = {
            "world": state.num_processes,
            "trace": trainer.trace,
            "heads_checksum": float(sum(p.detach().double().abs().sum() for h in (heads.success_head, heads.cost_head)
                                        for p in h.parameters())),
            "n_labels": heads.n_labels,
            "temperature": heads.temperature,
            "model_checksum": float(sum(p.detach().double().abs().sum() for p in trainer.model.parameters())),
        }
        with open(os.path.join(out_dir, "result.json"), "w") as f:
            json.dump(result, f)
    state.wait_for_everyone()
    return 0


if __name__ == "__main__":
    from _dist_exit import run_and_shutdown

    sys.exit(run_and_shutdown(main))
