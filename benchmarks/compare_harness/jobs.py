"""``--jobs``: the invocation's (method, seed) runs as a queue of worker processes that fits the machine's memory.

Each job is one ``compare_trainers.py --methods <m> --seeds <s> --jobs 1 --no_plots`` subprocess; its runs land in the
shared ``runs/`` tree and the aggregating pass that follows reuses them. Three rules decide when a job starts:

* **the jobs that must run alone first, then seed-major order**: a job whose estimate alone exceeds the memory
  budget (below) needs an empty machine, which the queue's start provides; placed later, it would wait for the
  jobs before it to drain, one slot idle meanwhile (up to a whole run for each such job). The other jobs follow in
  seed-major order: every method's seed ``s`` before any method's seed ``s + 1``, so an interrupted invocation
  leaves every method equally far (within a seed, the costliest methods first, :data:`METHOD_COST`);
* **memory**: a job starts only while the estimated memory of the running jobs and its own fits the budget
  (``--memory_gb``, default this machine's total memory less 1 GiB; :func:`_fits`): the sum of their peaks, plus
  what one evaluation engine adds at the worst moment. The engines run one at a time (``compare_harness.vllm_eval``)
  and while a worker's engine runs the worker itself sits at its evaluation memory (``eval_gb``), not its training
  peak, so the engine adds ``max(0, engine + eval_gb - peak_gb)`` of the job it serves, the largest over the jobs
  (the whole engine where a job's evaluation memory is not measured yet). A job that no other job of the queue
  can run beside runs with nothing beside it, on every slot's core. V0.5 + OSLA on SmolLM2 is such a job: its
  training peaked at 19.3 GB resident (killed by the kernel beside a GRPO worker on a 24 GB machine) where a GRPO
  run peaks at about 8 GB;
* **first in, first out**: a job that does not fit yet blocks the jobs behind it (no job is starved), and a
  method's later seeds wait for its first job, which tunes its learning rate when that is still to do.

**Measured estimates.** Every run records its worker's peak resident memory (``worker_peak_rss_gb``, the
kernel's high-water mark, reset when the run starts: :func:`reset_peak_rss`, :func:`peak_rss_gb`), with vLLM
evaluation its memory while its engine ran (``worker_eval_rss_gb``), and a ``memory_key`` (its settings without
seed and learning rate). Where finished runs of a method with the same key exist in the output directory, its
estimates are their largest values times :data:`MEASURED_MARGIN` instead of the table's (:func:`measured_peaks`);
when one of its jobs finishes, the method's pending jobs are re-estimated. So a
configuration the table does not know (V0.5 with gradient checkpointing, a 4x budget) runs under the table's
estimate until its first run has measured it.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .vllm_eval import proc_field_gib

#: Estimated peak resident memory (GB) of one run's worker process by scale and method (training and its
#: evaluations, without the evaluation engine); measured with ``benchmarks/rss_monitor.sh`` on the SmolLM2 runs
#: (``steps_matched_t07/logs/rss*.log``: V0.5 + OSLA 15.7-19.3; GRPO G = 4 / 8, REINFORCE++, DAPO, James-Stein,
#: BASIS and PAIR 4.5-7.8). Methods and scales not listed: :data:`DEFAULT_PEAK_GB` (for a SmolLM2 method not run
#: there yet, e.g. G = 16, an assumption).
PEAK_MEMORY_GB: dict[str, dict[str, float]] = {"smollm2": {"v05_osla": 20.0}}
DEFAULT_PEAK_GB = {"smollm2": 8.0}
#: Any scale not in :data:`DEFAULT_PEAK_GB` (the testbed's ~1M-parameter models).
FALLBACK_PEAK_GB = 2.0
#: Factor on a measured peak or evaluation memory (:func:`measured_peaks`): one run's value understates another
#: seed's where the work per step varies. 1.25 (the ratio of V0.5 + OSLA's seed peaks, 15.7 to 19.5 GB) put 18 of 21
#: SmolLM2 pairs over the 22.5 GB budget (runs measured at 6.5-8.7 GB planned at 8.1-10.9 each, beside a whole
#: 4.5 GB engine) and left a core idle, while such pairs never used more than 17.6 GB together, engine and queue
#: included (30 s samples, ``logs/rss_main12.log``). At 1.05 every such pair fitted until G = 8 seed 7 peaked at
#: 8.8 GB (over the budget beside BASIS while the engine counted whole); the engine now counts only above the
#: evaluating worker's measured evaluation memory (:func:`_fits`), which ends that double count.
MEASURED_MARGIN = 1.05
#: The evaluation engine's child process (``--test_eval_backend vllm``; measured 3.9-4.1 GB on SmolLM2).
ENGINE_PEAK_GB = 4.5


@dataclass(frozen=True)
class Job:
    """One (method, seed) run of the queue with its memory estimates (GB): ``peak_gb`` its worker's peak,
    ``eval_gb`` its worker's resident memory while its own evaluation engine runs (``None``: not measured, taken as
    its peak, so the engine counts whole)."""

    method: str
    seed: int
    peak_gb: float
    eval_gb: float | None = None


def peak_memory_gb(scale: str, method: str, measured: dict[str, float] | None = None) -> float:
    """Estimated peak resident memory of one run of ``method`` at ``scale``: :data:`MEASURED_MARGIN` times its
    measured peak where ``measured`` (:func:`measured_peaks`) has one, else :data:`PEAK_MEMORY_GB`."""
    if measured and measured.get(method) is not None:
        return round(MEASURED_MARGIN * measured[method], 1)
    return PEAK_MEMORY_GB.get(scale, {}).get(method, DEFAULT_PEAK_GB.get(scale, FALLBACK_PEAK_GB))


def eval_memory_gb(method: str, measured_eval: dict[str, float] | None = None) -> float | None:
    """Estimated resident memory of ``method``'s worker while its evaluation engine runs: :data:`MEASURED_MARGIN`
    times the measured ``worker_eval_rss_gb`` (:func:`measured_peaks` with that field), else ``None`` (no table:
    an unmeasured job counts the engine whole)."""
    if measured_eval and measured_eval.get(method) is not None:
        return round(MEASURED_MARGIN * measured_eval[method], 1)
    return None


def job_estimate(scale: str, method: str, seed: int, measured: dict[str, float] | None = None,
                 measured_eval: dict[str, float] | None = None) -> Job:
    """``method``'s run of ``seed`` with its estimates (:func:`peak_memory_gb`, :func:`eval_memory_gb`)."""
    return Job(method, seed, peak_memory_gb(scale, method, measured), eval_memory_gb(method, measured_eval))


def reset_peak_rss() -> bool:
    """Reset this process's resident-memory high-water mark (Linux ``/proc/self/clear_refs``, value 5), so that
    :func:`peak_rss_gb` measures from now; ``False`` where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_gb() -> float | None:
    """This process's peak resident memory in GB (``VmHWM`` in ``/proc/self/status``; child processes such as the
    evaluation engine are not counted), or ``None`` where it cannot be read."""
    return proc_field_gib("/proc/self/status", "VmHWM")


def measured_peaks(out: str, memory_keys: dict[str, str], field: str = "worker_peak_rss_gb") -> dict[str, float]:
    """The largest recorded ``field`` (``worker_peak_rss_gb``, or ``worker_eval_rss_gb``: the worker while its
    engine ran) of each method's finished runs (``<out>/runs/<method>/seed*/result.json``, status ok) whose
    ``memory_key`` is the method's entry in ``memory_keys``; methods with no such run are absent. Runs recorded
    before the harness measured the field carry none and are ignored."""
    peaks: dict[str, float] = {}
    for method, key in memory_keys.items():
        for path in sorted(glob.glob(os.path.join(out, "runs", method, "seed*", "result.json"))):
            try:
                with open(path, encoding="utf-8") as f:
                    rec = json.load(f)
            except (OSError, ValueError):
                continue
            peak = rec.get(field)
            if rec.get("status") == "ok" and rec.get("memory_key") == key and isinstance(peak, (int, float)):
                peaks[method] = max(peaks.get(method, 0.0), float(peak))
    return peaks


def machine_memory_gb() -> float | None:
    """Total memory of this machine less 1 GiB (``/proc/meminfo``), or ``None`` where it cannot be read."""
    total = proc_field_gib("/proc/meminfo", "MemTotal")
    return None if total is None else total - 1.0


def plan_jobs(methods: Sequence[str], seeds: Sequence[int], scale: str,
              cost: dict[str, float] | None = None, *, budget_gb: float | None = None,
              engine_gb: float = 0.0, measured: dict[str, float] | None = None,
              extra_seeds: dict[str, Sequence[int]] | None = None,
              measured_eval: dict[str, float] | None = None) -> list[Job]:
    """The queue: first the jobs that must run alone (:func:`runs_alone` under ``budget_gb`` and ``engine_gb``; in
    increasing seed), then the others seed-major in increasing seed; within a seed, the costliest methods first
    (ties keep the command's order). Each method's jobs stay in increasing seed, so its first job has its smallest
    seed (:func:`startable`). Estimates: :func:`job_estimate` with ``measured`` (peaks) and ``measured_eval``
    (evaluation memory). ``extra_seeds``: seeds of some methods beyond ``seeds`` (``--extra_seeds``), in the same
    seed-major order."""
    cost, extra = cost or {}, extra_seeds or {}
    order = sorted(range(len(methods)), key=lambda i: (-cost.get(methods[i], 1.0), i))
    mine = {m: {int(x) for x in seeds} | {int(x) for x in extra.get(m, ())} for m in methods}
    queue = [job_estimate(scale, methods[i], s, measured, measured_eval)
             for s in sorted(set().union(*mine.values())) for i in order if s in mine[methods[i]]]
    alone = [j for j in queue if runs_alone(j, budget_gb, engine_gb, [k for k in queue if k is not j])]
    return alone + [j for j in queue if j not in alone]


def runs_alone(job: Job, budget_gb: float | None, engine_gb: float = 0.0, others: Sequence[Job] = ()) -> bool:
    """Whether ``job`` can only run on an empty machine: its estimate with one evaluation engine exceeds the budget
    on its own, or none of ``others`` (the queue's other jobs) fits beside it."""
    if not _fits([], job, budget_gb, engine_gb):
        return True
    return bool(others) and not any(_fits([o], job, budget_gb, engine_gb) for o in others)


def startable(pending: Sequence[Job], running: Sequence[Job], finished: set, *, slots: int,
              budget_gb: float | None, engine_gb: float = 0.0) -> list[Job]:
    """Jobs to start now, in queue order (a pure function of the queue's state).

    Parameters
    ----------
    pending : the jobs not started yet, in queue order.
    running : the jobs running now.
    finished : ``(method, seed)`` of the jobs that have ended.
    slots : the number of jobs that may run at once (``--jobs``).
    budget_gb : the memory the running jobs may use together; ``None``: no limit.
    engine_gb : memory of the one evaluation engine that may run beside them (0 without engines).

    Returns
    -------
    The longest prefix of ``pending`` that can start: a job that cannot start blocks every job behind it.
    A job's later seeds cannot start while its method's first job (the one that tunes) has not finished.
    A job whose estimate alone exceeds the budget starts only on an empty machine.
    """
    out: list[Job] = []
    for j in pending:
        now = [*running, *out]
        if len(now) >= slots:
            break
        first = min([r.seed for r in [*running, *pending] if r.method == j.method]
                    + [s for m, s in finished if m == j.method])
        if j.seed != first and (j.method, first) not in finished:
            break
        fits = _fits(now, j, budget_gb, engine_gb)
        if not fits and now:
            break
        out.append(j)
        if not fits:
            break  # over the budget on its own: runs alone
    return out


def _reestimated(pending: list[Job], method: str, estimate: tuple[float, float | None]) -> list[Job]:
    """``pending`` with ``method``'s jobs at ``estimate`` (peak, evaluation memory; queue order kept); a change is
    printed."""
    peak_gb, eval_gb = estimate
    old = {(j.peak_gb, j.eval_gb) for j in pending if j.method == method}
    if old and old != {(peak_gb, eval_gb)}:
        print(f"[jobs] {method}: estimate {'/'.join(_gb(*o) for o in sorted(old, key=str))} -> "
              f"{_gb(peak_gb, eval_gb)} (measured)", flush=True)
    return [Job(j.method, j.seed, peak_gb, eval_gb) if j.method == method else j for j in pending]


def _gb(peak_gb: float, eval_gb: float | None) -> str:
    return f"{peak_gb:g} GB" + ("" if eval_gb is None else f" ({eval_gb:g} GB evaluating)")


def memory_gb(jobs: Sequence[Job], engine_gb: float) -> float:
    """Estimated memory of ``jobs`` running together with one evaluation engine at a time: the sum of their peaks
    plus the most the engine adds, ``max(0, max_j(engine_gb + eval_j - peak_j))`` (while a job's engine runs, that
    job's worker is at its evaluation memory ``eval_j``; an unmeasured ``eval_j`` is taken as its peak, so the
    engine counts whole). ``engine_gb = 0``: no engines, the sum of the peaks."""
    total = sum(j.peak_gb for j in jobs)
    if engine_gb <= 0 or not jobs:
        return total
    extra = max(engine_gb + (j.peak_gb if j.eval_gb is None else j.eval_gb) - j.peak_gb for j in jobs)
    return total + max(0.0, extra)


def _fits(running: Sequence[Job], job: Job, budget_gb: float | None, engine_gb: float) -> bool:
    """Whether ``job`` fits the budget beside ``running`` (:func:`memory_gb`)."""
    return budget_gb is None or memory_gb([*running, job], engine_gb) <= budget_gb + 1e-9


def run_jobs(argv: Sequence[str], jobs: Sequence[Job], *, slots: int, budget_gb: float | None, engine_gb: float,
             out: str, script: str, bind_vllm: bool = False, poll_s: float = 5.0,
             popen: Callable = subprocess.Popen,
             reestimate: Callable[[str], tuple[float, float | None]] | None = None,
             done: Iterable[tuple[str, int]] = ()) -> None:
    """Run ``jobs`` (:func:`plan_jobs`) by :func:`startable`, each ``script`` with ``argv`` plus ``--methods <m>
    --seeds <s> --extra_seeds --jobs 1 --no_plots --queue_job`` (one run; no report: this invocation writes it),
    logging to ``<out>/logs/jobs/<method>_seed<s>.log`` (appended, each start marked by a ``[jobs] <UTC time>``
    line).

    ``bind_vllm``: a job's evaluation engine binds its threads to the CPU of its slot (``VLLM_CPU_OMP_THREADS_BIND``,
    unless set). A job that starts on an empty machine with nothing startable beside it gets every slot's core
    (``--num_threads <slots>`` and an engine bound to CPUs ``0-<slots - 1>``): nothing can start beside it until it
    ends, since the queue is first in, first out and estimates change only when a job ends (a job over the budget,
    :func:`runs_alone`; one whose queue head does not fit beside it; the queue's last job). A failed job stops new
    starts; the others finish, then the invocation stops with the failed logs named (finished runs are reused when
    the command is run again).
    ``reestimate(method)``: the method's estimates (peak, evaluation memory) after one of its jobs finished (its new
    measurements, :func:`measured_peaks`); its pending jobs take them.
    ``done``: ``(method, seed)`` of runs finished before this invocation and left out of ``jobs`` (the caller's reuse
    check): they count as finished, so a method whose first seed is among them starts its other seeds side by side
    (:func:`startable`'s first-job rule waits only for a job that may still tune)."""
    log_dir = os.path.join(out, "logs", "jobs")
    os.makedirs(log_dir, exist_ok=True)
    pending, running, finished, failed = list(jobs), {}, set(done), []
    alone = [j for j in jobs if runs_alone(j, budget_gb, engine_gb, [k for k in jobs if k is not j])]
    if alone:
        print(f"[jobs] {', '.join(sorted({j.method for j in alone}))}: no other job fits beside them in the "
              f"{budget_gb:.1f} GB budget: run with nothing beside them", flush=True)
    while pending or running:
        for job, (_slot, log, proc) in list(running.items()):
            rc = proc.poll()
            if rc is not None:
                del running[job]
                finished.add((job.method, job.seed))
                if rc != 0:
                    failed.append((job, log, rc))
                elif reestimate is not None:
                    pending = _reestimated(pending, job.method, reestimate(job.method))
        if not failed:
            starting = startable(pending, list(running), finished, slots=slots, budget_gb=budget_gb,
                                 engine_gb=engine_gb)
            # alone until it ends (nothing else startable now, and nothing ends to change that): every slot's core
            # for its torch threads and its engine
            alone_now = not running and len(starting) == 1
            for job in starting:
                pending.remove(job)
                slot = min(set(range(slots)) - {s for s, _, _ in running.values()})
                log = os.path.join(log_dir, f"{job.method}_seed{job.seed}.log")
                threads = min(slots, os.cpu_count() or 1) if alone_now else 1
                env = dict(os.environ)
                if bind_vllm and "VLLM_CPU_OMP_THREADS_BIND" not in env:
                    env["VLLM_CPU_OMP_THREADS_BIND"] = (f"0-{threads - 1}" if threads > 1
                                                        else str(slot % (os.cpu_count() or 1)))
                cmd = [sys.executable, script, *argv, "--methods", job.method, "--seeds", str(job.seed),
                       "--extra_seeds", *(["--num_threads", str(threads)] if threads > 1 else []), "--jobs", "1",
                       "--no_plots", "--queue_job"]
                print(f"[jobs] {job.method} seed {job.seed} (slot {slot}, ~{_gb(job.peak_gb, job.eval_gb)}"
                      f"{f', alone: {threads} threads' if threads > 1 else ''}; log {log})", flush=True)
                with open(log, "a", encoding="utf-8") as f:
                    # the log is appended to by every invocation that runs (or reuses) this job: mark where one starts
                    f.write(f"[jobs] {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC: {job.method} seed "
                            f"{job.seed} started (slot {slot}, {threads} thread(s))\n")
                    f.flush()
                    running[job] = (slot, log, popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env))
        elif not running:
            break
        if running:
            time.sleep(poll_s)
    if failed:
        raise SystemExit("; ".join(f"{j.method} seed {j.seed} exited with {rc} (see {log})" for j, log, rc in failed)
                         + ": finished runs are reused when the command is run again")
