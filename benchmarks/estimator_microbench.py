"""Per-step cost of the estimator math: ``python benchmarks/estimator_microbench.py [--repeats 50] [--output PATH]``.

Times (median over ``--repeats`` runs after a warm-up) of

* BASIS ``calibrate_beta`` on 512 prompts (one rollout each) over the full default grid (230 betas);
* PAIR ``pair_design`` for G = 16 (SLSQP, <= 50 iterations);
* OSLA bookkeeping for 512 prompts: one fusion over ragged groups (k in 4..16), the need-more test, the next
  counts, the global-stop check, and the final V0.5 advantages;

and, measured in the same run, a numpy reference op (sorting 8192 float64 values) so the numbers can be compared
across machines as a ratio. Targets (median, one core): 5 ms for ``calibrate_beta`` (it runs every BASIS step over
the whole grid), 10 ms for the others (``TARGETS_MS``). Modules that are not available are skipped with a message.
Writes JSON (default ``benchmarks/results/estimator_microbench.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

DEFAULT_TARGET_MS = 10.0
TARGETS_MS = {"basis_calibrate_beta_512_full_grid": 5.0}
"""Per-entry median targets in ms (entries not listed: ``DEFAULT_TARGET_MS``)."""


def _time(fn, repeats: int) -> dict[str, float]:
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return {"median_ms": statistics.median(ts) * 1e3, "min_ms": min(ts) * 1e3, "repeats": repeats}


def bench(repeats: int = 50, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out: dict = {"python": sys.version.split()[0], "numpy": np.__version__, "machine": platform.machine(),
                 "threads_env": os.environ.get("OMP_NUM_THREADS"), "results": {}}
    ref_x = rng.random(8192)
    out["reference_numpy_sort_8192"] = _time(lambda: np.sort(ref_x), repeats)
    ref = out["reference_numpy_sort_8192"]["median_ms"]

    def record(name: str, fn) -> None:
        r = _time(fn, repeats)
        r["ratio_to_reference"] = r["median_ms"] / ref
        r["target_ms"] = TARGETS_MS.get(name, DEFAULT_TARGET_MS)
        r["under_target"] = r["median_ms"] <= r["target_ms"]
        out["results"][name] = r

    # --- BASIS
    try:
        from trl_ext.estimators import calibrate_beta

        p_hat = rng.beta(1.0, 1.0, size=512)
        rewards = (rng.random(512) < np.clip(p_hat + rng.normal(0, 0.1, 512), 0, 1)).astype(np.float64)
        record("basis_calibrate_beta_512_full_grid", lambda: calibrate_beta(rewards, p_hat))
    except Exception as exc:  # module missing or API mismatch: skip, say why
        out["results"]["basis_calibrate_beta_512_full_grid"] = {"skipped": repr(exc)}

    # --- PAIR
    try:
        from trl_ext.estimators import pair_design

        p16 = rng.uniform(0.05, 0.95, size=16)
        c16 = rng.uniform(50, 500, size=16)
        record("pair_design_G16", lambda: pair_design(p16, c16, 0.5 * c16.sum()))
    except Exception as exc:
        out["results"]["pair_design_G16"] = {"skipped": repr(exc)}

    # --- OSLA bookkeeping
    try:
        from trl_ext.estimators import (
            fused_advantages_batch,
            osla_need_more,
            osla_next_counts,
            osla_should_stop,
            shrinkage_fusion_batch,
        )

        n = 512
        k = rng.choice(np.arange(4, 17, 2), size=n)
        ids = np.repeat(np.arange(n), k)
        r = np.where(rng.random(ids.size) < 0.5, 1.0, -1.0)
        priors = rng.uniform(-1, 1, size=n)

        def osla_step():
            fr = shrinkage_fusion_batch(r, ids, priors)
            need = osla_need_more(fr.k, fr.bias2, 0.0039)
            osla_next_counts(fr.k, fr.bias2, 0.0039)
            osla_should_stop(need)
            fused_advantages_batch(r, ids, priors=priors)

        record("osla_bookkeeping_512", osla_step)
        out["results"]["osla_bookkeeping_512"]["n_rollouts"] = int(ids.size)
    except Exception as exc:
        out["results"]["osla_bookkeeping_512"] = {"skipped": repr(exc)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=os.path.join("benchmarks", "results", "estimator_microbench.json"))
    args = parser.parse_args(argv)
    res = bench(args.repeats, args.seed)
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(res, f, indent=2)
    print(f"reference numpy sort(8192): {res['reference_numpy_sort_8192']['median_ms']:.3f} ms")
    for name, r in res["results"].items():
        if "skipped" in r:
            print(f"{name:<40} SKIPPED ({r['skipped']})")
        else:
            print(f"{name:<40} median {r['median_ms']:8.3f} ms  (x{r['ratio_to_reference']:.1f} reference)  "
                  f"{'OK' if r['under_target'] else 'OVER'} (target {r['target_ms']:g} ms)")
    print(f"-> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
