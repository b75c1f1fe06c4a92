"""A value table checked against the training setup before BASIS trains on it: loaded from a path or taken as given (:func:`resolve_value_table`), one
reward range (:func:`common_reward_range`), sampled under the training settings (:func:`check_table_sampling`) and
covering the training prompts (:func:`check_table_coverage`). Gong et al., "BASIS: Batchwise Advantage Estimation
from Single-Rollout Information Sharing for LLM Reasoning" (May 2026), Appendix 10 (offline value estimation)."""

from __future__ import annotations

import os
import warnings

from .table_format import ValueTable, load_value_table

__all__ = ["check_table_coverage", "check_table_sampling", "common_reward_range", "resolve_value_table"]


def check_table_sampling(table, args, allow: bool = False, tokenizer=None) -> None:
    """Refuse a table sampled under other settings than training samples with: the header's ``temperature``,
    ``top_p``, ``max_new_tokens`` and ``chat_template_sha256`` against ``temperature``, ``top_p``,
    ``max_completion_length`` and the training tokenizer's chat template (p_hat is
    the reference policy's success rate *under those settings*; another temperature or cap is another value).
    Settings the header does not record (in-memory or hand-made tables) are not checked. ``allow`` (the
    documented override, ``basis_allow_sampling_mismatch``) turns the refusal into a warning."""
    md = table.metadata
    want = {"temperature": ("temperature", float(args.temperature)),
            "top_p": ("top_p", 1.0 if args.top_p is None else float(args.top_p)),
            "max_new_tokens": ("max_completion_length", args.max_completion_length)}
    bad = [f"{key}={md[key]!r} in the table vs {name}={value!r} in training" for key, (name, value) in want.items()
           if md.get(key) is not None and value is not None and md[key] != value]
    if md.get("chat_template_sha256") is not None and tokenizer is not None:
        from .value_table import chat_template_sha256

        have = chat_template_sha256(tokenizer)
        if have != md["chat_template_sha256"]:
            bad.append(f"chat template sha256 {md['chat_template_sha256'][:12]}... in the table vs "
                       f"{(have or 'none')[:12]}... of the training tokenizer")
    if not bad:
        return
    msg = (f"The value table was sampled under other settings than this training run: {'; '.join(bad)}. Its "
           "p_hat values are success rates under the table's settings. Rebuild it with the training settings "
           "(`trl-ext build-value-table ... --training_config <your config>` or --temperature / --top_p / "
           "--max_new_tokens; examples/scripts/basis.py --build_value_table uses the run's own), or set "
           "basis_allow_sampling_mismatch=True to use it deliberately.")
    if not allow:
        raise ValueError(msg)
    warnings.warn(msg, UserWarning, stacklevel=3)


def check_table_coverage(table, dataset, max_missing_fraction: float) -> None:
    """Refuse a table that covers none of ``dataset``'s prompts; warn when more than ``max_missing_fraction``
    of them are missing (training would stop at the first batch above the limit). Iterable or custom
    datasets are checked batch by batch instead."""
    from datasets import Dataset

    if not isinstance(dataset, Dataset) or "prompt" not in dataset.column_names or len(dataset) == 0:
        return
    prompts = dataset["prompt"]
    n_missing = sum(table.lookup(p) is None for p in prompts)  # also detects key collisions
    if n_missing == len(prompts):
        raise ValueError(
            f"The value table ({len(table)} rows) covers none of the {len(prompts)} training prompts: "
            "it was built for another dataset or prompt format. Rebuild it with `trl-ext build-value-table` on "
            "this train_dataset."
        )
    frac = n_missing / len(prompts)
    if frac > max_missing_fraction and getattr(table, "legacy_format", False):
        # a trl_ext 0.1 table records no row count: a file cut on a row boundary reads as a shorter table
        raise ValueError(
            f"{n_missing} of {len(prompts)} training prompts ({frac:.1%}) are missing from the value table, more "
            f"than basis_max_missing_fraction={max_missing_fraction}. The table is in the trl_ext 0.1 format, "
            "which records no row count, so it was most likely cut short (an interrupted copy or a full disk "
            "leaves whole rows); a cut cannot be told apart from a table for another dataset in this format. "
            "Rebuild it with `trl-ext build-value-table` on this train_dataset (the new format detects a cut), "
            "or raise basis_max_missing_fraction to train with the fallback baseline on the missing prompts."
        )
    if frac > max_missing_fraction:
        warnings.warn(
            f"{n_missing} of {len(prompts)} training prompts ({frac:.1%}) are missing from the value table, more "
            f"than basis_max_missing_fraction={max_missing_fraction}: training stops at the first batch above the "
            "limit. Complete the table (`trl-ext build-value-table` resumes) or raise the limit.",
            UserWarning, stacklevel=3,
        )


def resolve_value_table(spec) -> ValueTable:
    """A :class:`ValueTable` from a table or a path (``ValueError`` / ``FileNotFoundError`` / ``TypeError`` saying
    how to get one)."""
    if spec is None:
        raise ValueError(
            "BASISTrainer needs a value table: set BASISConfig(basis_value_table_path=...) or pass value_table=. Build "
            "one with `trl-ext build-value-table` (reference-policy samples per training prompt, paper Appendix 10)."
        )
    if isinstance(spec, ValueTable):
        table = spec
    elif isinstance(spec, str | os.PathLike):
        if not os.path.exists(spec):
            raise FileNotFoundError(f"value table {os.fspath(spec)!r} does not exist; build it with "
                                    "`trl-ext build-value-table`.")
        table = load_value_table(spec)  # corrupt / partial files raise ValueError with the line number
    else:
        raise TypeError(f"value_table must be a ValueTable or a path, got {type(spec).__name__}.")
    if len(table) == 0:
        raise ValueError("The value table has no rows; build it on the training dataset first.")
    return table


def common_reward_range(table: ValueTable) -> tuple[float, float]:
    """The one ``reward_range`` of every row of ``table`` (``ValueError`` if rows differ)."""
    ranges = {tuple(row.reward_range) for row in table}
    if len(ranges) != 1:
        raise ValueError(f"The value table mixes reward ranges {sorted(ranges)[:4]}; BASIS maps rewards to [0, 1] "
                         "with one range, so rebuild the table with a single reward_range.")
    lo, hi = ranges.pop()
    return float(lo), float(hi)
