r"""Draw the rollout pool at a checkpoint and sketch every rollout's score-function gradient.

Model side of the instrument (torch and transformers; no TRL). The pool is the advise sample
(:func:`trl_ext.advise.draw_sample`: keyed sampling, so a prompt's completions depend only on the seed and the
prompt, never on the process that drew them), scored by the user's reward functions; then, for each rollout, one
forward and one backward pass give

.. math:: z_{ij} = S\, \nabla_\theta \sum_{t} \log \mathrm{softmax}\big(\ell_\theta(x_i, y_{ij,<t}) / T\big)_{y_{ij,t}}

over the trained parameters (every parameter with ``requires_grad``: a LoRA adapter's, or the whole model's), at the
sampling temperature ``T`` as TRL computes its log-probabilities, sketched by :class:`~.sketch.CountSketch`.

On several processes (``torchrun`` / ``accelerate launch``) each rank draws and differentiates a contiguous block of
the prompts and the pool is gathered on every rank (``torch.distributed.all_gather_object``), so the pool, and
everything measured on it, is the same on 1 and 2 processes.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from .pool import GradientPool
from .sketch import CountSketch

__all__ = ["trainable_parameters", "row_gradient_sketches", "build_pool", "world"]


def world() -> tuple[int, int]:
    """``(rank, world size)`` of an initialised ``torch.distributed`` group, else ``(0, 1)``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _gather(obj):
    import torch.distributed as dist

    rank, size = world()
    if size == 1:
        return [obj]
    out = [None] * size
    dist.all_gather_object(out, obj)
    return out


def trainable_parameters(model) -> list:
    """``(name, parameter)`` of every parameter with ``requires_grad``, in ``named_parameters`` order."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameter (requires_grad): nothing to differentiate.")
    return params


def _progress(desc: str, total: int, enabled: bool):
    try:
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, disable=not enabled, file=sys.stderr)
    except ImportError:  # pragma: no cover - tqdm comes with transformers
        return None


def _linear_owners(model, params) -> list | None:
    """``[(module, "weight" | "bias")]`` per trainable parameter when every one is an ``nn.Linear``'s (a LoRA
    adapter's ``lora_A`` / ``lora_B``, or linear layers alone), else ``None``."""
    import torch

    where = {}
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            where[id(mod.weight)] = (mod, "weight")
            if mod.bias is not None:
                where[id(mod.bias)] = (mod, "bias")
    owners = [where.get(id(p)) for p in params]
    return None if any(o is None for o in owners) else owners


def _row_logps(model, rows, device, temperature: float, pad_id: int):
    """Sum of completion-token log-probs of each (prompt ids, completion ids) row, one right-padded forward pass."""
    import torch

    seqs = [list(p) + list(c) for p, c in rows]
    width = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), width), int(pad_id), dtype=torch.long)
    att = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, x in enumerate(seqs):
        ids[b, :len(x)] = torch.tensor(x)
        att[b, :len(x)] = 1
    logits = model(input_ids=ids.to(device), attention_mask=att.to(device)).logits.float() / float(temperature)
    out = []
    for b, (p, c) in enumerate(rows):
        lp = torch.log_softmax(logits[b, len(p) - 1:len(p) + len(c) - 1], dim=-1)
        out.append(lp.gather(1, torch.tensor(list(c), device=device)[:, None]).sum())
    return out


def _linear_per_sample(model, rows, params, owners, device, temperature, pad_id):
    """Per-row gradients of every trainable ``nn.Linear`` parameter from one batched forward and backward pass.

    A linear layer's weight gradient is ``sum_t delta_t x_t^T`` (``delta`` the gradient at its output, ``x`` its
    input), a sum over positions, so keeping ``x`` and ``delta`` per row gives each row's own gradient (the per-sample
    gradient trick of Opacus, "Opacus: User-Friendly Differential Privacy Library in PyTorch", arXiv:2109.12298). A
    causal LM's rows do not interact, and padded positions get ``delta = 0``.
    """
    import torch

    mods = {id(m): m for m, _ in owners}
    acts, grads, handles = {}, {}, []

    def fwd(mod, inputs, output):
        acts[id(mod)] = inputs[0].detach()
        if output.requires_grad:
            output.register_hook(lambda g, key=id(mod): grads.__setitem__(key, g.detach()))

    for m in mods.values():
        handles.append(m.register_forward_hook(fwd))
    try:
        logps = _row_logps(model, rows, device, temperature, pad_id)
        torch.autograd.backward(torch.stack(logps).sum())
    finally:
        for h in handles:
            h.remove()
    per_row = []
    for b in range(len(rows)):
        out = []
        for (m, kind), q in zip(owners, params):
            g = grads.get(id(m))
            if g is None:
                out.append(torch.zeros_like(q))
            elif kind == "weight":
                out.append(torch.einsum("to,ti->oi", g[b].double(), acts[id(m)][b].double()))
            else:
                out.append(g[b].double().sum(0))
        per_row.append(out)
    for q in params:
        q.grad = None
    return per_row


def row_gradient_sketches(model, prompt_ids, completions, sketch: CountSketch | None, *, temperature: float = 1.0,
                          return_full: bool = False, progress: bool = False, per_sample: str = "auto",
                          batch_rows: int = 8, pad_token_id: int = 0):
    """Sketched gradients of ``sum_t log pi(y_t | x, y_<t)`` of every (prompt, completion) row.

    Parameters
    ----------
    model : torch.nn.Module
        A causal LM returning ``.logits``; its trainable parameters are differentiated.
    prompt_ids : list of list of int
        One per prompt.
    completions : list of list of list of int
        ``completions[i][j]``: sample ``j`` of prompt ``i`` (end token included when it ended).
    sketch : CountSketch or None
        Built for :func:`trainable_parameters` (``None`` with ``return_full=True``: exact gradients only).
    temperature : float
        Logits are divided by it (TRL's log-probabilities at the sampling temperature).
    return_full : bool
        Also return the exact flattened gradients (tests; memory ``rows x D``).
    per_sample : {"auto", "linear", "loop"}
        ``"linear"``: ``batch_rows`` rows per forward/backward pass with per-row linear-layer gradients (every
        trainable parameter must be an ``nn.Linear``'s: LoRA adapters); ``"loop"``: one forward/backward per row (any
        parameters); ``"auto"``: ``"linear"`` when it applies. Both give the same gradients (a test checks).
    batch_rows : int
    pad_token_id : int
        Right-padding token of the batched path (masked out).

    Returns
    -------
    ndarray (rows, d) [, ndarray (rows, D)]
        Row ``i * k + j`` is sample ``j`` of prompt ``i`` (a completion of 0 tokens gives a zero row).
    """
    import torch

    params = [p for _, p in trainable_parameters(model)]
    owners = _linear_owners(model, params)
    if per_sample == "linear" and owners is None:
        raise ValueError("per_sample='linear' needs every trainable parameter to belong to an nn.Linear.")
    if per_sample not in ("auto", "linear", "loop"):
        raise ValueError(f"per_sample must be 'auto', 'linear' or 'loop', got {per_sample!r}.")
    device = next(model.parameters()).device
    # "auto": batched only on an accelerator; on a CPU a forward/backward pass is compute-bound, and batching 8 rows
    # of SmolLM2 + LoRA measured 4.2 s a row against 2.0 s for the loop (the per-row outer products cost extra)
    fast = owners is not None and (per_sample == "linear" or (per_sample == "auto" and device.type != "cpu"))
    was_training = model.training
    model.eval()  # no dropout: the gradient of the sampled law
    rows = [(p, c) for p, comps in zip(prompt_ids, completions) for c in comps]
    sk, full = [None] * len(rows), [None] * len(rows)
    bar = _progress("gradients", len(rows), progress)
    live = [i for i, (_, c) in enumerate(rows) if len(c) > 0]
    step = max(1, int(batch_rows)) if fast else 1
    try:
        for s in range(0, len(live), step):
            idx = live[s:s + step]
            if fast:
                per_row = _linear_per_sample(model, [rows[i] for i in idx], params, owners, device, temperature,
                                             pad_token_id)
            else:
                logp = _row_logps(model, [rows[idx[0]]], device, temperature, pad_token_id)[0]
                per_row = [list(torch.autograd.grad(logp, params, allow_unused=True))]
            for i, grads in zip(idx, per_row):
                grads = [g if g is not None else torch.zeros_like(q) for g, q in zip(grads, params)]
                if sketch is not None:
                    sk[i] = sketch.project(grads).numpy()
                if return_full:
                    full[i] = torch.cat([g.reshape(-1).double().cpu() for g in grads]).numpy()
            if bar is not None:
                bar.update(len(idx))
    finally:
        if bar is not None:
            bar.close()
        model.train(was_training)
    n_full = sum(q.numel() for q in params)
    out = np.asarray([x if x is not None else np.zeros(sketch.dim) for x in sk]) if sketch is not None else None
    if return_full:
        return out, np.asarray([x if x is not None else np.zeros(n_full) for x in full])
    return out


def _shutdown_engine(llm) -> None:
    """Stop a ``vllm.LLM``'s engine process (vLLM 0.31: ``llm.llm_engine.engine_core.shutdown()``); a no-op when the
    engine exposes no such call."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


def build_pool(model, tokenizer, rows: list[dict], reward_funcs, *, num_samples: int = 32, max_new_tokens: int = 256,
               temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, sketch_dim: int = 4096,
               sketch_seed: int = 0, batch_size: int = 64, prompt_column: str = "prompt", reward_weights=None,
               reward_range=None, pair_probes: bool = True, pair_tau: int | None = None, pair_folds: int = 2,
               progress: bool = True, sampler=None, eos_token_ids=None,
               shutdown_sampler: bool = False) -> GradientPool:
    """Draw, score and differentiate the pool (this rank's block of ``rows``, gathered over ranks).

    ``pair_probes``: also compute PAIR's probe quantities (the first ``pair_tau`` tokens of every completion, default
    PAIR's ``tau = min(256, max(1, max_new_tokens // 8))``; the prefix heads' out-of-fold predictions over
    ``pair_folds`` folds of prompts, :func:`trl_ext.advise.prefix.out_of_fold_predictions`). ``sampler``: a
    ``vllm.LLM`` engine that draws the completions instead of ``model`` (keyed per-request seeds,
    :func:`trl_ext.advise.draw_sample`; give ``eos_token_ids``); the gradients are always ``model``'s.
    ``shutdown_sampler``: shut the engine down once the pool is drawn (its worker holds the KV cache, 5 GB on the CPU
    build with ``VLLM_CPU_KVCACHE_SPACE=4``, through the gradient passes otherwise).

    Raises
    ------
    ValueError
        No rows, fewer rows than processes, bad sampling settings (from the sampler), no trainable parameter.
    """
    import torch

    from trl_ext.advise import draw_sample

    rank, size = world()
    if not rows:
        raise ValueError("the pool is empty: no prompts given.")
    if len(rows) < size:
        raise ValueError(f"{len(rows)} prompts for {size} processes: give at least one prompt per process.")
    bounds = np.linspace(0, len(rows), size + 1).round().astype(int)
    mine = rows[bounds[rank]:bounds[rank + 1]]
    params = trainable_parameters(model)
    sketch = CountSketch(sketch_dim, [p.numel() for _, p in params], seed=sketch_seed)
    t0 = time.time()
    smp = draw_sample(model if sampler is None else sampler, tokenizer, mine, reward_funcs, num_samples=num_samples,
                      max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                      batch_size=batch_size, prompt_column=prompt_column, reward_weights=reward_weights,
                      reward_range=reward_range, eos_token_ids=eos_token_ids)
    t_sample = time.time() - t0
    if sampler is not None and shutdown_sampler:
        _shutdown_engine(sampler)
    t0 = time.time()
    z = row_gradient_sketches(model, smp.prompt_ids, smp.completion_ids, sketch, temperature=temperature,
                              progress=progress and rank == 0, pad_token_id=int(tokenizer.pad_token_id))
    t_grad = time.time() - t0
    local = {"rewards": smp.rewards, "lengths": smp.lengths, "z": z.reshape(len(mine), num_samples, -1),
             "prompt_ids": smp.prompt_ids, "completions": smp.completion_ids, "eos": smp.eos_ids,
             "t_sample": t_sample, "t_grad": t_grad}
    parts = _gather(local)
    rewards = np.concatenate([p["rewards"] for p in parts])
    lengths = np.concatenate([p["lengths"] for p in parts])
    sketches = np.concatenate([p["z"] for p in parts])
    info = {"trainable_parameters": int(sum(p.numel() for _, p in params)), "processes": size,
            "backward_passes": int(rewards.size),
            "wall_s": {"sampling_and_scoring": round(max(p["t_sample"] for p in parts), 3),
                       "gradients": round(max(p["t_grad"] for p in parts), 3)},
            "sampler": "vllm" if sampler is not None else "keyed (transformers)",
            "temperature": float(temperature), "top_p": float(top_p), "max_new_tokens": int(max_new_tokens),
            "seed": int(seed), "sketch_seed": int(sketch_seed)}
    pair = None
    if pair_probes:
        from trl_ext.advise.prefix import default_tau, hidden_state_features, out_of_fold_predictions, probe_features

        tau = int(pair_tau) if pair_tau is not None else default_tau(int(max_new_tokens))
        t0 = time.time()
        fn = hidden_state_features(model, tokenizer.pad_token_id)
        with torch.no_grad():
            feats, fin, costs = probe_features(fn, smp.prompt_ids, smp.completion_ids, tau, smp.eos_ids,
                                               batch_size=batch_size)
        got = _gather({"feats": feats, "fin": fin, "costs": costs})
        feats = torch.cat([g["feats"] for g in got])
        fin = np.concatenate([g["fin"] for g in got])
        costs = np.concatenate([g["costs"] for g in got])
        n, k = rewards.shape
        if n >= max(2, int(pair_folds)):
            oof = out_of_fold_predictions(feats, rewards, costs, n_folds=int(pair_folds), seed=int(seed),
                                          valid=np.isfinite(rewards), finished=fin)
            pair = {"p_hat": oof["p_hat"].reshape(n, k), "cost_hat": oof["cost_hat"].reshape(n, k),
                    "finished": fin.reshape(n, k), "probe_tokens": tau}
            info["pair_probe_tokens"] = tau
        info["wall_s"]["pair_heads"] = round(time.time() - t0, 3)
    return GradientPool(rewards=rewards, lengths=lengths, sketches=sketches,
                        max_completion_length=int(max_new_tokens), pair=pair, info=info)
