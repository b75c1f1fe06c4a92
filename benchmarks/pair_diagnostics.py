"""PAIR vs GRPO on long completions: advantage scale, inverse pair weights, gradient norm and design variance.

``OMP_NUM_THREADS=1 python benchmarks/pair_diagnostics.py [--quick] [--out benchmarks/results/pair_diagnostics.json]``

Frozen-population measurement (no optimizer step; every gradient is taken at the same parameters):

* model: the cached warm addition model (``trl_ext.testbed.get_warm_model("addition")``, ``--model warm``) or the
  untrained tiny model (``--model tiny``);
* completions of 7-32 tokens (``max_completion_length`` ``L = 32``, ``tau = L // 8 = 4``): the policy is sampled at
  temperature 1 with EOS masked until a per-candidate minimum length drawn uniformly from ``[6, L - 1]`` (the warm
  model would otherwise answer in 2-4 tokens); reward 1 iff the completion starts with the sum (``--model tiny``:
  iff its first character is in a prompt-dependent digit set, so difficulty is mixed there too). Mixed difficulty:
  the ``K`` prompts' group accuracies are logged;
* ``K = 4`` prompts x ``G = 16`` candidates per generation batch (64 candidates, as in the reported runs of
  ``docs/pair.md``, "Long completions: what was measured"), the same
  prompts resampled ``--populations`` times (population noise);
* prefix heads fitted on ``--history`` other batches (all candidates observed), then frozen (regime ``heads``); or
  the synthetic predictor :class:`SpreadPredictor` with the reported runs' head quality (regimes ``spread``,
  ``costblind``);
* for every population: the GRPO gradient (``trl_ext.GRPOTrainer``, TRL's defaults: ``loss_type="dapo"``,
  ``scale_rewards="group"``; also with ``G / 2`` completions), PAIR's complete-pair gradient (``PAIRTrainer`` with ``pair_budget_ratio=1``: every
  candidate continued, weights 1 -- ``tests/test_pair_gradient.py`` shows PAIR's expected gradient equals it), and
  ``--draws`` fresh PAIR design draws per variant (default design; the biased ``pair_w_max`` clip; raised
  ``pair_pi_min`` floors), each through the whole trainer path (probe, design, continuation, ``replay_rollouts``,
  Eq. 13, the fixed normalizer, TRL's loss, ``backward``). Generation is replayed from the frozen population by a
  stand-in backend below the base trainer, and every row that reaches the loss is checked to carry exactly the
  sampled tokens (probe + continuation, mask = tokens up to and including EOS).

Per-row "coefficient" = the factor on ``sum_t grad log p`` in the dapo loss: ``A_i / (K L)`` for PAIR (fixed
normalizer), ``A_i / (tokens in the batch)`` for GRPO. Noise-to-signal ratios (NSR) are ``tr(Cov) / ||mean||^2`` of
the gradient over populations (and design draws), with the squared mean bias-corrected by ``tr(Cov)/n``. Exact
design variances (all ``2^G`` draws, per-candidate score Gram matrices) check the Monte Carlo and evaluate what-if
designs. Writes JSON (``--out``); 324 s on one CPU thread with the defaults (``--quick``: ~25 s). Results and reading:
``docs/pair.md``, "Long completions: what was measured".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

import numpy as np  # noqa: E402
import torch  # noqa: E402


# ------------------------------------------------------------------------------------------------ setup
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=("warm", "tiny"), default="warm")
    p.add_argument("--max_completion_length", type=int, default=32)
    p.add_argument("--num_generations", type=int, default=16)
    p.add_argument("--prompts", type=int, default=4, help="K prompts per generation batch")
    p.add_argument("--populations", type=int, default=5, help="resampled populations of the same K prompts")
    p.add_argument("--draws", type=int, default=50, help="PAIR design draws per population and variant")
    p.add_argument("--history", type=int, default=16, help="batches of labels the heads are fitted on")
    p.add_argument("--noise_populations", type=int, default=16,
                   help="populations for the GRPO / complete-pair population noise (the first --populations also "
                        "get the design draws)")
    p.add_argument("--variants", default="heads/default,spread/default,costblind/default,spread/w_max=10,"
                                         "spread/w_max=5,spread/pi_min=0.35",
                   help="comma list of REGIME/OPTION: REGIME heads (the trainer's learned heads), spread (a "
                        "predictor with the head quality of the reported runs in docs/pair.md, see SpreadPredictor) "
                        "or costblind (the same without cost information); OPTION default | w_max=X | pi_min=X")
    p.add_argument("--learning_rate", type=float, default=1e-4, help="recorded; the gradient does not depend on it")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="2 populations x 10 draws, 2 variants (smoke run)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                 "pair_diagnostics.json"))
    a = p.parse_args(argv)
    if a.quick:
        a.populations, a.draws, a.noise_populations, a.history = 2, 10, 4, 4
        a.variants = "heads/default,spread/default,costblind/default,spread/w_max=5"
    return a


def load_model(kind: str):
    from trl_ext.testbed import build_tiny_model, build_tokenizer

    if kind == "tiny":
        tok = build_tokenizer()
        return build_tiny_model(tok, seed=0), tok, "build_tiny_model(build_tokenizer(), seed=0)"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.testbed import get_warm_model

    path = get_warm_model("addition", seed=0)
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), path


class ReplaySampler:
    """Mixin (put first) that replays ``self.population`` (prompt token tuple -> list of G completions) in place of
    the trainer's sampler (``generate_unkeyed``, which every generation call of the trainer and its strategy reaches):
    a prompt-only call returns the candidates in order of occurrence (first ``max_new`` tokens, cut after EOS);
    PAIR's continuation call (``prompt + probe``) returns the rest of the candidates its design log selected, in
    the strategy's order."""

    population: dict = {}

    def generate_unkeyed(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        max_new = int(self.generation_config.max_new_tokens)
        eos = self.processing_class.eos_token_id
        out, seen = [], {}
        cont = None
        for n_row, ids in enumerate(prompt_ids):
            ids = tuple(ids)
            if ids in self.population:  # prompt-only call (probe, or GRPO's full generation)
                occ = seen.get(ids, 0)
                seen[ids] = occ + 1
                comp, m = self.population[ids][occ], 0
            else:  # PAIR's continuation from prompt + probe
                if cont is None:
                    log = self.rollout_strategy.design_log
                    prompts = self.batch_prompt_keys
                    cont = [(prompts[k], i) for k, d in enumerate(log) for i in range(len(d["selected"]))
                            if d["selected"][i] and not d["finished"][i]]
                p, i = cont[n_row]
                comp = self.population[p][i]
                m = len(ids) - len(p)
                if ids != p + tuple(comp[:m]):
                    raise AssertionError("continuation input is not prompt + the candidate's probe")
            new = list(comp[m:m + max_new])
            if eos in new:
                new = new[:new.index(eos) + 1]
            out.append(new)
        return out, None


def build_trainers(model_kind, tok, args, options):
    from trl_ext.testbed import make_dataset
    from trl_ext.trainers.base import ExtGRPOConfig, GRPOTrainer
    from trl_ext.trainers.pair import PAIRConfig, PAIRTrainer

    class ReplayGRPO(ReplaySampler, GRPOTrainer):
        pass

    class ReplayPAIR(ReplaySampler, PAIRTrainer):
        pass

    G, K, L = args.num_generations, args.prompts, args.max_completion_length
    common = dict(per_device_train_batch_size=G * K, num_generations=G, max_completion_length=L, max_steps=1,
                  learning_rate=args.learning_rate, use_cpu=True, bf16=False, report_to="none", logging_steps=1,
                  save_strategy="no", seed=args.seed, temperature=1.0, dataloader_num_workers=0, disable_tqdm=True)
    ds = make_dataset("addition", K, seed=args.seed)  # the benchmark prompts; the trainers add their row index
    reward = [reward_fn(model_kind)]
    tmp = tempfile.mkdtemp(prefix="pair_diag_")

    def fresh_model():
        m, _, _ = load_model(model_kind)
        return m

    half = {**common, "num_generations": G // 2, "per_device_train_batch_size": K * (G // 2)}
    trainers = {"grpo": ReplayGRPO(model=fresh_model(), reward_funcs=reward,
                                   args=ExtGRPOConfig(output_dir=os.path.join(tmp, "grpo"), **common),
                                   train_dataset=ds, processing_class=tok),
                "grpo_half": ReplayGRPO(model=fresh_model(), reward_funcs=reward,
                                        args=ExtGRPOConfig(output_dir=os.path.join(tmp, "grpo_half"), **half),
                                        train_dataset=ds, processing_class=tok)}
    cfgs = {"complete": {"pair_budget_ratio": 1.0}}
    for v in options:
        if v == "default":
            cfgs[v] = {}
        elif v.startswith("w_max="):
            cfgs[v] = {"pair_w_max": float(v.split("=")[1])}
        elif v.startswith("pi_min="):
            cfgs[v] = {"pair_pi_min": float(v.split("=")[1])}
        else:
            raise SystemExit(f"unknown variant {v!r}")
    for name, over in cfgs.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainers[name] = ReplayPAIR(model=fresh_model(), reward_funcs=reward,
                                        args=PAIRConfig(output_dir=os.path.join(tmp, name), **common, **over),
                                        train_dataset=ds, processing_class=tok)
    for tr in trainers.values():
        tr.model.train()
        tr.current_gradient_accumulation_steps = 1
    return trainers


def reward_fn(kind: str):
    from trl_ext.testbed import completion_text

    def starts_with_sum(prompts, completions, answer=None, **kw):
        return [float(completion_text(c).startswith(str(a))) for c, a in zip(completions, answer)]

    def digit_set(prompts, completions, answer=None, **kw):
        out = []
        for c, a in zip(completions, answer):
            k = 1 + int(a) % 9  # prompt-dependent difficulty: k of 10 digits are right
            t = completion_text(c)
            out.append(float(bool(t) and t[0].isdigit() and (int(t[0]) - int(a)) % 10 < k))
        return out

    f = starts_with_sum if kind == "warm" else digit_set
    f.__name__ = "reward"
    return f


@torch.no_grad()
def sample_population(model, tok, prompt_ids, G, L, gen: torch.Generator):
    """G completions per prompt (token ids as TRL tokenizes them) at temperature 1, EOS masked until a
    per-candidate minimum length in [6, L-1]."""
    from transformers import LogitsProcessor, LogitsProcessorList

    eos = tok.eos_token_id
    enc = [list(p) for p in prompt_ids for _ in range(G)]
    rows = enc
    width = max(len(e) for e in enc)
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    att = torch.zeros_like(ids)
    for r, e in enumerate(enc):
        ids[r, width - len(e):] = torch.tensor(e)
        att[r, width - len(e):] = 1
    min_len = torch.randint(6, L, (len(rows),), generator=gen)

    class MinLen(LogitsProcessor):
        def __call__(self, input_ids, scores):
            cur = input_ids.shape[1] - width
            scores = scores.clone()
            scores[cur < min_len, eos] = -float("inf")
            return scores

    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    torch.manual_seed(seed)
    was = model.training
    model.eval()
    out = model.generate(input_ids=ids, attention_mask=att, do_sample=True, temperature=1.0, top_k=None, top_p=None,
                         max_new_tokens=L, logits_processor=LogitsProcessorList([MinLen()]), eos_token_id=eos,
                         pad_token_id=tok.pad_token_id)
    model.train(was)
    comps = []
    for r in range(len(rows)):
        c = out[r, width:].tolist()
        if eos in c:
            c = c[:c.index(eos) + 1]
        else:
            c = [t for t in c if t != tok.pad_token_id]
        comps.append(c)
    return [comps[k * G:(k + 1) * G] for k in range(len(prompt_ids))]


# ------------------------------------------------------------------------------------------------ one call
def flat_grad(model) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().reshape(-1)
                      for p in model.parameters()])


def head_snapshot(heads) -> torch.Tensor:
    """Every parameter of the success and cost heads and the temperature, flattened (float64)."""
    params = [p.detach().double().reshape(-1) for h in (heads.success_head, heads.cost_head) for p in h.parameters()]
    return torch.cat(params + [torch.tensor([float(heads.temperature)], dtype=torch.float64)])


def run_batch(tr, rows, pop_by_key, keys):
    """One generation batch through the trainer (replayed population) + TRL's loss + backward."""
    tr.population = pop_by_key
    tr.batch_prompt_keys = keys
    strategy = tr.rollout_strategy
    heads = getattr(strategy, "heads", None)
    if heads is not None:
        heads.needs_refresh = False  # heads frozen: the labels this batch adds are not fitted
        before = head_snapshot(heads.heads)
    out = tr._generate_and_score_completions(rows)
    if heads is not None and not torch.equal(before, head_snapshot(heads.heads)):
        raise AssertionError("the PAIR heads changed during a diagnostic batch; they must stay frozen")
    tr.model.zero_grad(set_to_none=True)
    loss = tr.compute_loss(tr.model, out)
    loss.backward()
    g = flat_grad(tr.model)
    # alignment: every row that reaches the loss carries exactly one candidate's sampled tokens
    ids, mask = out["completion_ids"], out["completion_mask"]
    p_ids, p_mask = out["prompt_ids"], out["prompt_mask"]
    batch = tr.last_rollout_batch
    eos = tr.processing_class.eos_token_id
    lengths = []
    for row in range(ids.shape[0]):
        if bool(batch.is_pad[row]):
            continue
        n = int(mask[row].sum())
        got = ids[row, :n].tolist()
        assert bool(mask[row, :n].all()) and not bool(mask[row, n:].any())
        p = tuple(p_ids[row][p_mask[row].bool()].tolist())
        assert got in pop_by_key[p], "a row in the loss is not a sampled completion of its prompt"
        assert eos not in got[:-1]
        lengths.append(n)
    adv = tr.last_advantages.double().numpy()
    real = ~batch.is_pad.numpy()
    tokens = float(out["num_items_in_batch"])
    return {"grad": g, "adv": adv[real], "lengths": np.array(lengths), "tokens": tokens,
            "rewards": batch.rewards.double().numpy()[real], "gids": batch.group_ids.numpy()[real],
            "log": [dict(d) for d in getattr(strategy, "design_log", [])],
            "stats": dict(getattr(strategy, "last_stats", None) or {})}


def edge_weights(log):
    w = []
    for d in log:
        pi = np.asarray(d["pi"], dtype=np.float64)
        sel = np.asarray(d["selected"], dtype=bool)
        idx = np.flatnonzero(sel)
        for a in range(len(idx)):
            for b in range(a + 1, len(idx)):
                w.append(1.0 / (pi[idx[a]] * pi[idx[b]]))
    return w


def pct(x, qs=(50, 90, 99, 100)):
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return {}
    return {f"p{q}": float(np.percentile(x, q)) for q in qs} | {"mean": float(x.mean())}


def cos(a, b):
    na, nb = float(a.norm()), float(b.norm())
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else float("nan")


def score_grams(model, prompt_keys, pop, A_full):
    """Per prompt, the Gram matrix of the dapo score vectors ``s_i = grad sum_t log p(o_it)`` of its G candidates
    (float64), and ``sum_k sum_i A_full_ki s_ki`` (to check against the trainer's complete-pair gradient)."""
    grams, combo = [], None
    for k, p in enumerate(prompt_keys):
        S = []
        for i, comp in enumerate(pop[k]):
            ids = torch.tensor([list(p) + list(comp)])
            model.zero_grad(set_to_none=True)
            logits = model(input_ids=ids).logits[0, len(p) - 1:-1]
            lp = torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(comp)[:, None]).sum()
            lp.backward()
            g = flat_grad(model)
            S.append(g.float())
            combo = A_full[k][i] * g if combo is None else combo + A_full[k][i] * g
        X = torch.stack(S).double()
        grams.append((X @ X.T).numpy())
    model.zero_grad(set_to_none=True)
    return grams, combo


def exact_design_moments(r, pi, S, w_max=None):
    """Exact moments over every draw J ~ prod Bernoulli(pi) of Eq. 13's advantages (weights ``1/(pi_i pi_j)``,
    clipped at ``w_max``), in the metric of the score Gram ``S``: returns (variance, squared bias), both
    ``E||sum_i (A_i - .) s_i||^2``, relative to the complete-pair advantages ``(r_i - mean r) / (G - 1)``."""
    r, pi = np.asarray(r, np.float64), np.asarray(pi, np.float64)
    G = r.size
    M = G * (G - 1) / 2.0
    n = np.arange(2 ** G)
    J = ((n[:, None] >> np.arange(G)[None, :]) & 1).astype(np.float64)
    logp = J @ np.log(np.maximum(pi, 1e-300)) + (1 - J) @ np.log(np.maximum(1 - pi, 1e-300))
    P = np.exp(logp) * np.all((pi < 1) | (J == 1), axis=1)
    w = 1.0 / np.outer(pi, pi)
    if w_max is not None:
        w = np.minimum(w, w_max)
    np.fill_diagonal(w, 0.0)
    Wr = w * (r[:, None] - r[None, :]) / (2 * M)  # A_i = J_i sum_j J_j Wr_ij
    A = J * (J @ Wr.T)
    A_full = (r - r.mean()) / (G - 1)
    mean_A = P @ A
    D = A - mean_A
    var = float(P @ np.einsum("ni,ij,nj->n", D, S, D))
    b = mean_A - A_full
    return var, float(b @ S @ b)


def nsr(grads):
    """tr(Cov)/||mean||^2 over a list of gradients (mean's square norm bias-corrected by tr(Cov)/n)."""
    X = torch.stack(grads)
    n = X.shape[0]
    mu = X.mean(0)
    tr_cov = float(((X - mu) ** 2).sum() / (n - 1))
    m2 = float(mu @ mu) - tr_cov / n
    return {"trace_cov": tr_cov, "mean_sq_norm_unbiased": m2, "nsr": tr_cov / m2 if m2 > 0 else float("inf"),
            "n": n}


# ------------------------------------------------------------------------------------------------ main
class SpreadPredictor:
    """Pre-continuation success/cost predictions of the quality of the reported runs' heads (``docs/pair.md``, "Long
    completions: what was measured"), set per population: ``p_hat = 0.95``
    for a correct candidate and ``0.03`` otherwise (with the warm model and ``L = 32`` correctness is already
    decided by the ``tau = 4``-token prefix: answers have at most 3 characters), each flipped with probability 0.18
    (Brier about 0.17, the reported runs' head Brier); ``c_hat`` = the true remaining tokens times a lognormal error
    (sigma 0.3), or, ``cost_blind``, their mean (the same for every candidate). Fixed before any draw (Theorem 2 holds
    conditionally on the design)."""

    def __init__(self, cost_blind: bool = False):
        self.cost_blind = cost_blind
        self.p_hat = self.cost_hat = None

    def set(self, p_hat, remaining, noise):
        self.p_hat = torch.tensor(p_hat, dtype=torch.float64)
        c = np.maximum(np.asarray(remaining, dtype=np.float64), 1.0) * np.exp(0.3 * noise)
        self.cost_hat = torch.tensor(np.full_like(c, c.mean()) if self.cost_blind else c, dtype=torch.float64)

    def predict(self, feats):
        from trl_ext.estimators.pair_heads import HeadPrediction

        assert feats.shape[0] == self.p_hat.shape[0]
        return HeadPrediction(p_hat=self.p_hat.clone(), cost_hat=self.cost_hat.clone(), n_nonfinite=0)


def _new_acc():
    return {k: [] for k in ("design_var", "design_var_rel", "cos_full", "cos_grpo", "norms", "bias_rel",
                            "bias_se_rel", "weights", "adv_abs_mean", "adv_abs_max", "coef_abs_mean", "coef_abs_max",
                            "completed", "zero_edge", "pi_min", "pi_mean", "ess", "max_weight", "suffix_tokens",
                            "long_inv_pi", "short_inv_pi", "clipped_frac", "design_var_abs", "exact_var_abs",
                            "exact_bias2_abs", "exact_mse_rel")}


def _floor_lowest(pi, n=1, floor=0.08):
    pi = np.asarray(pi, np.float64).copy()
    unf = np.flatnonzero(pi < 1)
    pi[unf[np.argsort(pi[unf])[:n]]] = floor
    return pi


WHAT_IF = {
    "uniform_0.5": lambda pi: np.where(np.asarray(pi) < 1, 0.5, 1.0),
    "lowest_1_per_group_at_0.08": lambda pi: _floor_lowest(pi, 1),
    "lowest_3_per_group_at_0.08": lambda pi: _floor_lowest(pi, 3),
}
"""Designs evaluated exactly on the spread regime's logged design (not budget-matched: the floored ones cost less)."""


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.time()
    from trl_ext.testbed import make_dataset

    G, K, L = args.num_generations, args.prompts, args.max_completion_length
    model, tok, model_src = load_model(args.model)
    variants = [tuple(v.split("/")) for v in args.variants.split(",") if v]
    options = sorted({o for _, o in variants})
    trainers = build_trainers(args.model, tok, args, options)
    gen = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    score = reward_fn(args.model)

    # ---- learned heads: fitted on other prompts (every candidate observed), then frozen, shared by the trainers
    hist = make_dataset("addition", K * args.history, seed=args.seed + 1000)
    ref = trainers[options[0]]
    tau = int(ref.args.pair_tau)
    for h in range(args.history):
        prompts = [hist[h * K + k]["prompt"] for k in range(K)]
        answers = [hist[h * K + k]["answer"] for k in range(K)]
        pids = ref.rollout_api.tokenize(prompts)
        pop = sample_population(model, tok, pids, G, L, gen)
        seqs, r, c = [], [], []
        for k in range(K):
            texts = tok.batch_decode(pop[k], skip_special_tokens=True)
            for comp, rr in zip(pop[k], score(None, texts, answer=[answers[k]] * G)):
                seqs.append(list(pids[k]) + comp[:tau])
                r.append(rr)
                c.append(float(max(len(comp) - tau, 0)))
        ref.rollout_strategy.heads.heads.add_labels(ref.rollout_strategy.features(seqs), torch.tensor(r), torch.tensor(c), torch.ones(len(r)))
        ref.rollout_strategy.heads.heads.refresh(steps=int(ref.args.pair_head_fit_steps), batch_size=int(ref.args.pair_head_batch_size))
    head_state = ref.rollout_strategy.heads.heads.state_dict()
    predictors = {"spread": SpreadPredictor(), "costblind": SpreadPredictor(cost_blind=True)}
    learned_predict = {}
    for name in ["complete"] + options:
        trainers[name].rollout_strategy.heads.heads.load_state_dict(head_state)
        learned_predict[name] = trainers[name].rollout_strategy.heads.heads.predict

    # ---- the K benchmark prompts, resampled populations
    ds = ref.train_dataset  # make_dataset("addition", K, seed=args.seed) with the trainer's row index
    prompts = [ds[k]["prompt"] for k in range(K)]
    rows = [dict(ds[k]) for k in range(K) for _ in range(G)]
    keys = [tuple(p) for p in ref.rollout_api.tokenize(prompts)]
    acc = {v: _new_acc() for v in variants}
    result = {"populations": [], "variants": {}}
    g_grpo_all, g_full_all, grpo_adv, grpo_coef, full_adv, full_coef = [], [], [], [], [], []
    what_if, g_half_all = {}, []
    n_pop = max(args.populations, args.noise_populations)
    for r_i in range(n_pop):
        pop = sample_population(model, tok, keys, G, L, gen)
        pop_by_key = {keys[k]: pop[k] for k in range(K)}
        lens = np.array([len(c) for k in range(K) for c in pop[k]])
        gr = run_batch(trainers["grpo"], rows, pop_by_key, keys)
        g_grpo = gr["grad"]
        g_grpo_all.append(g_grpo)
        rows_half = [x for k in range(K) for x in rows[k * G:k * G + G // 2]]
        g_half_all.append(run_batch(trainers["grpo_half"], rows_half, {q: c[:G // 2] for q, c in pop_by_key.items()},
                                    keys)["grad"])
        grpo_adv.append(np.abs(gr["adv"]))
        grpo_coef.append(np.abs(gr["adv"]) / gr["tokens"])
        fu = run_batch(trainers["complete"], rows, pop_by_key, keys)
        g_full = fu["grad"]
        g_full_all.append(g_full)
        full_adv.append(np.abs(fu["adv"]))
        full_coef.append(np.abs(fu["adv"]) / (K * L))
        r_full = np.concatenate([gr["rewards"][gr["gids"] == k] for k in range(K)])
        correct = r_full > 0.5  # with --model warm, L = 32 (tau = 4): already decided by the 4-token prefix
        z = np.asarray(correct, dtype=bool) ^ (rng.random(len(correct)) < 0.18)
        noise = rng.standard_normal(len(correct))
        for pr in predictors.values():
            pr.set(np.where(z, 0.95, 0.03), lens - tau, noise)
        p_learned = np.concatenate([np.asarray(d["p_hat"]) for d in fu["log"]])
        entry = {
            "group_accuracy": [float(np.mean(gr["rewards"][gr["gids"] == k])) for k in range(K)],
            "length": pct(lens, (0, 50, 100)), "grad_norm_grpo": float(g_grpo.norm()),
            "grad_norm_complete_pair": float(g_full.norm()), "cos_complete_pair_vs_grpo": cos(g_full, g_grpo),
            "brier_learned_heads": float(np.mean((p_learned - r_full) ** 2)),
            "brier_spread_predictor": float(np.mean((predictors["spread"].p_hat.numpy() - r_full) ** 2)),
            "brier_base_rate": float(np.mean((r_full.mean() - r_full) ** 2)),
        }
        result["populations"].append(entry)
        if r_i >= args.populations:
            print(f"population {r_i + 1}/{n_pop} ({time.time() - t0:.0f}s)", flush=True)
            continue
        A_full = [fu["adv"][fu["gids"] == k] for k in range(K)]
        r_k = [gr["rewards"][gr["gids"] == k] for k in range(K)]
        grams, combo = score_grams(trainers["complete"].model, keys, pop, A_full)
        # the trainer's complete-pair gradient is -(1/(K L)) sum_k sum_i A_full_ki s_ki (token alignment, again)
        entry["complete_pair_vs_scores_rel_err"] = float((g_full + combo / (K * L)).norm() / g_full.norm())
        for v in variants:
            regime, opt = v
            tr = trainers[opt]
            tr.rollout_strategy.heads.heads.predict = predictors[regime].predict if regime in predictors else learned_predict[opt]
            A = acc[v]
            mean_g, sq = torch.zeros_like(g_full), 0.0
            first_log = None
            for _ in range(args.draws):
                res = run_batch(tr, rows, pop_by_key, keys)
                first_log = first_log or res["log"]
                g = res["grad"]
                mean_g += g / args.draws
                sq += float(((g - g_full) ** 2).sum()) / args.draws
                A["norms"].append(float(g.norm()))
                A["clipped_frac"].append(float(g.norm() > tr.args.max_grad_norm))
                A["cos_full"].append(cos(g, g_full))
                A["cos_grpo"].append(cos(g, g_grpo))
                A["weights"].extend(edge_weights(res["log"]))
                a = np.abs(res["adv"])
                A["adv_abs_mean"].append(float(a.mean()) if a.size else 0.0)
                A["adv_abs_max"].append(float(a.max()) if a.size else 0.0)
                A["coef_abs_mean"].append(float(a.mean()) / (K * L) if a.size else 0.0)
                A["coef_abs_max"].append(float(a.max()) / (K * L) if a.size else 0.0)
                st = res["stats"]
                for key, name in (("completed", "completed_vertices"), ("zero_edge", "zero_edge_groups"),
                                  ("pi_min", "pi_min"), ("pi_mean", "pi_mean"), ("ess", "ess_mean"),
                                  ("max_weight", "max_weight"), ("suffix_tokens", "realized_suffix_tokens")):
                    A[key].append(float(st[f"pair/{name}"]))
                for k, dl in enumerate(res["log"]):
                    for i, pi_i in enumerate(dl["pi"]):
                        (A["long_inv_pi"] if len(pop[k][i]) >= 20 else A["short_inv_pi"]).append(1.0 / pi_i)
            A["design_var_abs"].append(sq)
            A["design_var_rel"].append(sq / float(g_full @ g_full))
            A["bias_rel"].append(float((mean_g - g_full).norm() / g_full.norm()))
            A["bias_se_rel"].append(math.sqrt(sq / args.draws) / float(g_full.norm()))
            entry[f"design_var_rel[{regime}/{opt}]"] = A["design_var_rel"][-1]
            # exact design moments at the logged design of the first draw (the warm start moves pi by ~1e-6)
            pis = [np.asarray(d["pi"]) for d in first_log]
            var = bias2 = 0.0
            for k in range(K):
                v_k, b_k = exact_design_moments(r_k[k], pis[k], grams[k], tr.args.pair_w_max)
                var, bias2 = var + v_k, bias2 + b_k
            A["exact_var_abs"].append(var / (K * L) ** 2)
            A["exact_bias2_abs"].append(bias2 / (K * L) ** 2)
            A["exact_mse_rel"].append((var + bias2) / (K * L) ** 2 / float(g_full @ g_full))
            if v == ("spread", "default"):  # what-if designs (exact only)
                for name, fn in WHAT_IF.items():
                    var = bias2 = 0.0
                    for k in range(K):
                        v_k, b_k = exact_design_moments(r_k[k], fn(pis[k]), grams[k])
                        var, bias2 = var + v_k, bias2 + b_k
                    what_if.setdefault(name, []).append(var / (K * L) ** 2)
        print(f"population {r_i + 1}/{n_pop} ({time.time() - t0:.0f}s)", flush=True)

    # ---- summaries
    pop_grpo, pop_full, pop_half = nsr(g_grpo_all), nsr(g_full_all), nsr(g_half_all)
    result["grpo_half_group"] = {"G": G // 2, "grad_norm": pct([float(g.norm()) for g in g_half_all]),
                                 "population_noise": pop_half,
                                 "cos_of_means_vs_grpo": cos(torch.stack(g_half_all).mean(0),
                                                             torch.stack(g_grpo_all).mean(0))}
    grpo_norm = float(np.mean([float(g.norm()) for g in g_grpo_all]))
    result["grpo"] = {"grad_norm": pct([float(g.norm()) for g in g_grpo_all]), "adv_abs": pct(np.concatenate(grpo_adv)),
                      "coef_abs": pct(np.concatenate(grpo_coef)), "population_noise": pop_grpo}
    result["complete_pair"] = {
        "grad_norm": pct([float(g.norm()) for g in g_full_all]), "adv_abs": pct(np.concatenate(full_adv)),
        "coef_abs": pct(np.concatenate(full_coef)), "population_noise": pop_full,
        "cos_of_means_vs_grpo": cos(torch.stack(g_full_all).mean(0), torch.stack(g_grpo_all).mean(0)),
        "grad_norm_ratio_vs_grpo": float(np.mean([float(g.norm()) for g in g_full_all])) / grpo_norm,
    }
    for v in variants:
        A = acc[v]
        design_noise = float(np.mean(A["design_var_abs"]))
        result["variants"]["/".join(v)] = {
            "grad_norm": pct(A["norms"]), "grad_norm_ratio_vs_grpo": float(np.mean(A["norms"])) / grpo_norm,
            "frac_grad_norm_above_max_grad_norm": float(np.mean(A["clipped_frac"])),
            "adv_abs_mean": pct(A["adv_abs_mean"]), "adv_abs_max": pct(A["adv_abs_max"]),
            "coef_abs_mean": pct(A["coef_abs_mean"]), "coef_abs_max": pct(A["coef_abs_max"]),
            "inverse_pair_weight_observed_edges": pct(A["weights"], (10, 50, 90, 99, 100)),
            "logged_max_weight": pct(A["max_weight"], (50, 100)),
            "inverse_pi_len_ge20": pct(A["long_inv_pi"], (50, 90, 100)),
            "inverse_pi_len_lt20": pct(A["short_inv_pi"], (50, 90, 100)),
            "completed_per_step": pct(A["completed"], (0, 50, 100)), "zero_edge_groups": pct(A["zero_edge"], (50,)),
            "pi_min": pct(A["pi_min"], (0, 50)), "pi_mean": pct(A["pi_mean"], (50,)), "ess_mean": pct(A["ess"], (50,)),
            "suffix_tokens_per_step": pct(A["suffix_tokens"], (50,)),
            "design_var_rel_to_complete_pair_sq_norm": pct(A["design_var_rel"], (0, 50, 100)),
            "design_noise_over_population_noise": design_noise / pop_full["trace_cov"],
            "nsr_population_plus_design": (pop_full["trace_cov"] + design_noise) / pop_full["mean_sq_norm_unbiased"],
            "cos_draw_vs_complete_pair": pct(A["cos_full"], (10, 50, 90)),
            "cos_draw_vs_grpo": pct(A["cos_grpo"], (10, 50, 90)),
            "bias_rel_to_complete_pair": pct(A["bias_rel"], (50, 100)),
            "bias_monte_carlo_se_rel": pct(A["bias_se_rel"], (50, 100)),
            "exact_design_variance_over_population_noise": float(np.mean(A["exact_var_abs"])) / pop_full["trace_cov"],
            "exact_bias_sq_over_population_noise": float(np.mean(A["exact_bias2_abs"])) / pop_full["trace_cov"],
            "exact_mse_rel_to_complete_pair_sq_norm": pct(A["exact_mse_rel"], (0, 50, 100)),
        }
    result["what_if_exact_design_variance_over_population_noise"] = {
        name: float(np.mean(v)) / pop_full["trace_cov"] for name, v in what_if.items()}
    pops = result["populations"]
    result["setting"] = {
        "command": "OMP_NUM_THREADS=1 python benchmarks/pair_diagnostics.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "model": model_src, "G": G, "K": K, "max_completion_length": L, "tau": tau,
        "loss_type": trainers["grpo"].loss_type, "scale_rewards": trainers["grpo"].scale_rewards,
        "pair_budget_ratio": float(ref.args.pair_budget_ratio), "populations_with_draws": args.populations,
        "populations_for_noise": n_pop, "draws": args.draws, "history_batches": args.history,
        "brier_learned_heads": pct([p["brier_learned_heads"] for p in pops], (50,)),
        "brier_spread_predictor": pct([p["brier_spread_predictor"] for p in pops], (50,)),
        "brier_base_rate": pct([p["brier_base_rate"] for p in pops], (50,)),
        "group_accuracy": pct([a for p in pops for a in p["group_accuracy"]], (0, 50, 100)),
        "completion_length": pct([p["length"]["mean"] for p in pops], (50,)),
        "learning_rate": args.learning_rate, "max_grad_norm": float(trainers["grpo"].args.max_grad_norm),
        "seed": args.seed, "torch": torch.__version__, "python": platform.python_version(),
        "wall_s": round(time.time() - t0, 1),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("setting", "grpo", "grpo_half_group", "complete_pair", "variants",
                                             "what_if_exact_design_variance_over_population_noise")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
