"""Short supervised warm-up of the tiny model, cached on disk.

RL needs room to improve: an untrained model never gets a reward and a converged one has nothing left to
learn. :func:`get_warm_model` runs a plain torch SFT loop (AdamW, lr 2e-3, batch 128, loss on the answer
tokens and ``<eos>`` only) and stops as soon as greedy accuracy on a validation set reaches ``target_accuracy``
(addition: 0.45, inside the 30-60 % band), checked every ``eval_every`` steps (addition: every 5 steps since recipe
v2; v1 checked every 25, and accuracy rises by up to 0.2 in 25 steps near the target, so where the run stopped --
and the documented 0.435 -- depended on tiny floating-point differences between machines: a fresh machine landed
at 0.615). The warm-up runs with one torch thread whatever the caller's setting (restored afterwards), so the
result does not depend on the core count; the remaining machine dependence (CPU kernels) is bounded by the
frequent checks and covered by a band test.

``"scratchpad"`` (recipe v1): the SFT target is the whole reference completion (the column scratchpad and the
answer), and the run stops when greedy validation accuracy reaches ``SCRATCHPAD_TARGET``; the per-digit split
of the resulting pass rates is in ``docs/testbed.md``.

For ``"substitution"`` the loss is additionally masked at hidden-mapping slots, so the warm-up teaches only the
revealed channel and never shows the model a hidden mapping (the paper's setup: hidden mappings are what RL
must learn, "Measurement Discipline for RLVR", "Setup"). Trained on the 70 train strings alone the model
memorises them (measured: 0.53 on train strings, 0.07 held-out). Recipe v2 (``SUBSTITUTION_EXTRA_FRACTION``,
``SUBSTITUTION_WEIGHT_DECAY``): half of every batch are one-digit strings of the revealed mappings
(``"...|7="`` -> ``"1"``; no length-2 test item and no hidden mapping is shown) and AdamW weight decay is 1.0,
which makes the revealed channel generalise to unseen pairs. The accuracy ceiling without hidden mappings is
the share of strings without a hidden digit (47/70 train, 17/30 held-out = 0.567 for the defaults, inside the
band); the warm-up stops one evaluation after the training strings reach 95 % of that ceiling. Measured held-out
greedy accuracies are in ``docs/testbed.md``; outside the 30-60 % band a warning is issued.

Cache layout: ``<root>/<task>-seed<seed>-v<V>`` with ``V = CACHE_VERSIONS[task]`` (addition 2, substitution 2,
scratchpad 1;
``-steps<N>`` is inserted before ``-v<V>`` when ``max_steps`` is given),
``root = cache_dir or $TRL_EXT_CACHE or ~/.cache/trl_ext/testbed``. The directory is built under a temporary
name and renamed into place; it holds the model, the tokenizer, ``warmup_meta.json`` (task, seed, version, steps,
accuracies, sha256 of every file) and the marker ``WARMUP_COMPLETE``. A directory without the marker, with
unreadable metadata, mismatching metadata (including an older recipe version) or a changed file hash is
reported with a ``UserWarning`` and rebuilt -- never used.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
import warnings

from .._io import read_cache_meta
from .._io import sha256_file as _sha256

__all__ = ["CACHE_VERSION", "CACHE_VERSIONS", "EVAL_EVERY", "MAX_STEPS", "SCRATCHPAD_TARGET", "TEST_QUESTIONS",
           "FINE_EVAL_EVERY",
           "SUBSTITUTION_EXTRA_FRACTION", "SUBSTITUTION_WEIGHT_DECAY",
           "SUBSTITUTION_CEILING_SHARE", "MARKER",
           "META", "default_cache_root", "warm_model_dir", "get_warm_model", "validate_cache", "run_warmup"]

#: Cache version of tasks without an entry in :data:`CACHE_VERSIONS` (kept for backward compatibility).
CACHE_VERSION = 1
#: Cache version per task, part of the cache directory name and checked against ``warmup_meta.json``; bumped
#: for a task whenever its warm-up recipe changes (substitution: 2 = one-digit half-batches, weight decay 1.0).
CACHE_VERSIONS: dict[str, int] = {"addition": 2, "substitution": 2, "scratchpad": 1}
#: Steps between validation checks per task (addition v2: 5, see the module docstring).
EVAL_EVERY: dict[str, int] = {"addition": 5, "substitution": 25, "scratchpad": 25}
#: Steps between validation checks once accuracy is past half the target (scratchpad: accuracy climbs ~0.1 per
#: 25 steps there). Tasks without an entry keep ``EVAL_EVERY`` throughout.
FINE_EVAL_EVERY: dict[str, int] = {"scratchpad": 5}
#: Greedy validation accuracy at which the scratchpad warm-up stops.
SCRATCHPAD_TARGET = 0.4
#: Default cap on SFT steps per task (the early stop usually comes first).
MAX_STEPS: dict[str, int] = {"addition": 1500, "substitution": 1500, "scratchpad": 4000}
#: Substitution warm-up: share of each batch made of one-digit strings of revealed mappings, and AdamW
#: weight decay (recipe v2; v1 used 0.25 and 0.1 and reached 0.23 held-out for seed 0).
SUBSTITUTION_EXTRA_FRACTION = 0.5
SUBSTITUTION_WEIGHT_DECAY = 1.0
#: Substitution warm-up stops one evaluation after the training strings reach this share of their revealed-only
#: ceiling (with weight decay 1.0 the last string or two can flicker for hundreds of steps).
SUBSTITUTION_CEILING_SHARE = 0.95
MARKER = "WARMUP_COMPLETE"
META = "warmup_meta.json"
DEFAULT_MAX_STEPS = 1500
#: Held-out (test split) questions whose greedy accuracy is recorded in ``warmup_meta.json``.
TEST_QUESTIONS: dict[str, int] = {"addition": 200, "substitution": 30, "scratchpad": 600}


def default_cache_root() -> str:
    """``$TRL_EXT_CACHE`` if set, else ``~/.cache/trl_ext/testbed``."""
    return os.environ.get("TRL_EXT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trl_ext", "testbed")


def warm_model_dir(task: str, seed: int = 0, cache_dir: str | None = None, max_steps: int | None = None) -> str:
    """Path of the cache directory :func:`get_warm_model` uses (it may not exist yet)."""
    steps = "" if max_steps is None else f"-steps{max_steps}"
    name = f"{task}-seed{seed}{steps}-v{_version(task)}"
    return os.path.join(os.fspath(cache_dir) if cache_dir else default_cache_root(), name)


def _version(task: str) -> int:
    return CACHE_VERSIONS.get(task, CACHE_VERSION)


def validate_cache(path: str, task: str, seed: int) -> str | None:
    """Return ``None`` if ``path`` is a complete, intact warm-model directory for (task, seed), else the reason."""
    meta, reason = read_cache_meta(path, MARKER, META)
    if reason is not None:
        return reason
    for key, want in (("task", task), ("seed", seed), ("version", _version(task))):
        if meta.get(key) != want:
            return f"metadata {key}={meta.get(key)!r}, expected {want!r}"
    files = meta.get("sha256")
    if not isinstance(files, dict) or not files:
        return "metadata has no file hashes"
    for name, digest in files.items():
        fp = os.path.join(path, name)
        if not os.path.isfile(fp):
            return f"file {name} missing"
        if _sha256(fp) != digest:
            return f"file {name} changed (sha256 mismatch)"
    return None


def _batches(tokenizer, rows, task, hidden_mask: bool):
    """Right-padded (input_ids, attention_mask, labels) for prompt+answer+eos; labels only on answer+eos."""
    import torch

    enc_p = tokenizer([r["prompt"] for r in rows], add_special_tokens=False)["input_ids"]
    # the SFT target is the full reference completion: the scratchpad task's "solution", else the answer
    enc_a = tokenizer([r.get("solution") or r["answer"] for r in rows], add_special_tokens=False)["input_ids"]
    seqs, labs = [], []
    for r, p, a in zip(rows, enc_p, enc_a):
        ans_labels = list(a)
        if hidden_mask:
            ans_labels = [-100 if s in r["hidden_digits"] else t for s, t in zip(r["source"], a)]
        seqs.append(p + a + [tokenizer.eos_token_id])
        labs.append([-100] * len(p) + ans_labels + [tokenizer.eos_token_id])
    L = max(map(len, seqs))
    ids = torch.full((len(seqs), L), tokenizer.pad_token_id, dtype=torch.long)
    att = torch.zeros((len(seqs), L), dtype=torch.long)
    lab = torch.full((len(seqs), L), -100, dtype=torch.long)
    for i, (s, lb) in enumerate(zip(seqs, labs)):
        ids[i, : len(s)] = torch.tensor(s)
        att[i, : len(s)] = 1
        lab[i, : len(lb)] = torch.tensor(lb)
    return ids, att, lab


def _substitution_extra_rows() -> list[dict]:
    """One-digit substitution strings of the revealed mappings (default task parameters), mixed into warm-up batches.

    Length-1 strings are a different universe from the length-2 task, so no two-digit test item is shown; rows
    whose source digit is hidden are excluded, so no hidden mapping is shown either (8 rows for the defaults).
    """
    from .tasks import make_dataset, split_size

    ones = [dict(r) for split in ("train", "test")
            for r in make_dataset("substitution", split_size("substitution", split, length=1), split=split, length=1)]
    return [r for r in ones if r["source"] not in r["hidden_digits"]]


def run_warmup(
    model,
    tokenizer,
    task: str,
    seed: int = 0,
    max_steps: int = DEFAULT_MAX_STEPS,
    target_accuracy: float | None = None,
    eval_every: int | None = None,
    lr: float = 2e-3,
    batch_size: int = 128,
    n_val: int = 256,
    log=None,
) -> dict:
    """Supervised warm-up of ``model`` in place; returns a history dict.

    Trains on the task's train split (minus ``n_val`` validation questions when the split is larger than
    ``2 * n_val``; otherwise validates on the training questions themselves) until greedy validation accuracy
    >= ``target_accuracy`` or ``max_steps`` steps. ``max_steps=0`` returns the model untouched.
    ``target_accuracy=None`` means 0.45 for addition; for substitution it means ``SUBSTITUTION_CEILING_SHARE``
    (0.95) of the revealed-only ceiling (share of validation strings without a hidden digit), followed by one
    more ``eval_every`` interval; for scratchpad ``SCRATCHPAD_TARGET``. ``eval_every=None`` means
    ``EVAL_EVERY[task]``.
    """
    import torch

    from .evaluation import evaluate_model
    from .tasks import TASKS, make_dataset, split_size

    if not isinstance(max_steps, int) or max_steps < 0:
        raise ValueError(f"max_steps must be a non-negative int, got {max_steps!r}")
    spec = TASKS[task]
    if eval_every is None:
        eval_every = EVAL_EVERY.get(task, 25)
    pool_n = split_size(task, "train")
    full = make_dataset(task, pool_n, seed=seed, split="train")
    if pool_n > 2 * n_val:
        val, train = full.select(range(n_val)), full.select(range(n_val, pool_n))
    else:
        val, train = full, full
    rows = [dict(r) for r in train]
    max_new = spec.max_answer_chars() + 1
    hidden_mask = task == "substitution"
    extra_rows: list[dict] = []
    patience = 0
    if task == "substitution":
        extra_rows = _substitution_extra_rows()
        if target_accuracy is None:
            ceiling = sum(r["n_hidden_slots"] == 0 for r in val) / len(val)
            target_accuracy = SUBSTITUTION_CEILING_SHARE * ceiling - 1e-9
            patience = 1
    elif target_accuracy is None:
        target_accuracy = SCRATCHPAD_TARGET if task == "scratchpad" else 0.45
    n_extra = int(batch_size * SUBSTITUTION_EXTRA_FRACTION) if extra_rows else 0
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=SUBSTITUTION_WEIGHT_DECAY if extra_rows else 0.0)
    history = {"step": [], "val_accuracy": []}
    step, acc = 0, None
    t0 = time.time()
    model.train()
    while step < max_steps:
        idx = torch.randint(len(rows), (batch_size - n_extra,), generator=gen).tolist()
        batch = [rows[i] for i in idx]
        if n_extra:
            batch += [extra_rows[i] for i in torch.randint(len(extra_rows), (n_extra,), generator=gen).tolist()]
        ids, att, lab = _batches(tokenizer, batch, task, hidden_mask)
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        # checks every eval_every steps, every FINE_EVAL_EVERY once past half the target (accuracy climbs fast there)
        fine = acc is not None and acc >= 0.5 * target_accuracy and task in FINE_EVAL_EVERY
        every = FINE_EVAL_EVERY[task] if fine else eval_every
        if step % every == 0 or step == max_steps:
            acc = evaluate_model(model, tokenizer, val, task, max_new_tokens=max_new, batch_size=256).accuracy
            history["step"].append(step)
            history["val_accuracy"].append(acc)
            model.train()
            if log:
                log(f"warm-up step {step}: loss {loss.item():.3f}, val greedy accuracy {acc:.3f}")
            if acc >= target_accuracy:
                if patience == 0:
                    break
                patience -= 1
    model.eval()
    history.update(steps=step, final_val_accuracy=acc, wall_time_s=time.time() - t0)
    return history


def get_warm_model(task: str = "addition", seed: int = 0, cache_dir: str | None = None,
                   max_steps: int | None = None, verbose: bool = False) -> str:
    """Path of a warmed-up tiny model + tokenizer directory for ``task``, building it once.

    Parameters
    ----------
    task : {"addition", "substitution"}
    seed : int, default 0
        Model initialisation and SFT data order.
    cache_dir : str, optional
        Cache root (default ``$TRL_EXT_CACHE`` or ``~/.cache/trl_ext/testbed``).
    max_steps : int, optional
        Cap on SFT steps (default 1500; the early stop -- 0.45 validation accuracy for addition, 95 % of the
        revealed-only ceiling plus 25 steps for substitution -- usually comes after 200-550 steps, 1-4 min on 2
        shared cores). When given, it is part of the cache directory name.
    verbose : bool
        Print warm-up progress.

    Returns
    -------
    str
        Directory loadable with ``AutoModelForCausalLM`` / ``AutoTokenizer``. ``warmup_meta.json`` in it holds
        the validation and held-out (test split, greedy) accuracy reached.

    Raises
    ------
    ValueError
        Unknown task, negative seed or max_steps.

    Warns
    -----
    UserWarning
        If the cache directory exists but is partial or corrupt (it is deleted and rebuilt), or if the warm-up
        ended outside the 30-60 % accuracy band.
    """
    from .tasks import TASKS

    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {sorted(TASKS)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 0):
        raise ValueError(f"max_steps must be a non-negative int or None, got {max_steps!r}")
    path = warm_model_dir(task, seed, cache_dir, max_steps)
    reason = validate_cache(path, task, seed)
    if reason is None:
        return path
    if reason != "missing":
        warnings.warn(f"warm-model cache {path} is corrupt or partial: {reason}; deleting and rebuilding it",
                      UserWarning, stacklevel=2)
        shutil.rmtree(path, ignore_errors=True)
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        _build(tmp, task, seed, MAX_STEPS.get(task, DEFAULT_MAX_STEPS) if max_steps is None else max_steps, verbose)
        try:
            os.rename(tmp, path)
        except OSError:
            # another process finished first: keep theirs if it is intact, else replace it
            if validate_cache(path, task, seed) is None:
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                shutil.rmtree(path, ignore_errors=True)
                os.rename(tmp, path)
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def _build(out: str, task: str, seed: int, max_steps: int, verbose: bool) -> None:
    import torch

    from .evaluation import evaluate_model
    from .model import build_tiny_model
    from .tasks import TASKS, make_dataset
    from .tokenizer import build_tokenizer

    os.makedirs(out, exist_ok=True)
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the result must not depend on the core count (see the module docstring)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            hist = run_warmup(model, tok, task, seed=seed, max_steps=max_steps, log=print if verbose else None)
    finally:
        torch.set_num_threads(threads)
    spec = TASKS[task]
    test = make_dataset(task, TEST_QUESTIONS[task], seed=0, split="test")
    test_acc = evaluate_model(model, tok, test, task, max_new_tokens=spec.max_answer_chars() + 1).accuracy
    if max_steps >= 250 and not 0.3 <= test_acc <= 0.6:
        warnings.warn(f"warm-up of {task!r} seed {seed} ended at held-out greedy accuracy {test_acc:.2f}, outside "
                      "the intended 30-60 % band", UserWarning, stacklevel=3)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    files = sorted(f for f in os.listdir(out) if os.path.isfile(os.path.join(out, f)))
    meta = {
        "task": task,
        "seed": seed,
        "version": _version(task),
        "max_steps": max_steps,
        "steps": hist["steps"],
        "val_accuracy": hist["final_val_accuracy"],
        "test_accuracy_greedy": test_acc,
        "history": {"step": hist["step"], "val_accuracy": hist["val_accuracy"]},
        "wall_time_s": hist["wall_time_s"],
        "sha256": {f: _sha256(os.path.join(out, f)) for f in files},
    }
    with open(os.path.join(out, META), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
    with open(os.path.join(out, MARKER), "w", encoding="utf-8") as f:
        f.write("ok\n")
