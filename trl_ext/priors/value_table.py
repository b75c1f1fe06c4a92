"""Build the offline reference-policy value table that BASIS (and :class:`~trl_ext.priors.TablePrior`) reads.

BASIS ("BASIS: Batchwise Advantage Estimation from Single-Rollout Information Sharing for LLM Reasoning", May 2026)
starts every training step from an *offline* value estimate per prompt (Section 4, "Offline value estimation"):
sample rollouts from the frozen reference policy :math:`\\pi_{\\mathrm{ref}}`, score them with the same verifier as
online training, and plug the empirical averages into the closed-form KL-tilted value of Proposition 2 (Eq. 2)

.. math:: \\widehat V_\\beta(x) = \\frac{\\tfrac1n\\sum_{k=1}^n r_k e^{r_k/\\beta}}{\\tfrac1n\\sum_{k=1}^n e^{r_k/\\beta}},

which needs the per-sample rewards :math:`r_1..r_n` for non-binary rewards and reduces to
:math:`\\hat p e^{1/\\beta} / (1 - \\hat p + \\hat p e^{1/\\beta})` with :math:`\\hat p` = mean reward for binary
{0, 1} rewards (Appendix 10, "Offline value-table generation"; the paper uses ``n = 64`` for Qwen3-4B and
``n = 32`` for Qwen2.5-Math-7B and recommends ``n in {32, 64}``). The table stores, per prompt, ``n``, the mean
reward, the per-sample rewards and the reward range, in the format of :mod:`trl_ext.priors.table_format`.

The entry point is :func:`build_value_table`; the ``trl-ext build-value-table`` command wraps it
(:mod:`trl_ext.priors.value_table_cli`). See ``docs/value_tables.md``.

Keys
----
A row is keyed by :func:`~trl_ext.priors.table_format.prompt_key` of the prompt (first 16 hex characters of the
SHA-256 of the prompt text, or of the canonical JSON of a conversation), so any trainer can find it from the
prompt alone. The row's ``question_id`` is the dataset's ``question_id`` column when there is one, else the
dataset row index (an ``int``); it is informative only (lookups use the prompt key and verify the stored prompt).

Determinism
-----------
Every prompt gets its own sampling key ``value_table_seed(seed, prompt_key)`` (a 63-bit BLAKE2b hash), so its
samples do not depend on which other prompts share its batch, on ``batch_size`` or on where an interrupted build
was resumed:

- ``sampler="keyed"`` (transformers default): each token is drawn by a Gumbel-max race whose noise is a pure
  function of (prompt key, sample index, position, token) -- :mod:`trl_ext.measurement.keyed_sampling`. The law
  is exactly that of ``generate(do_sample=True)`` (Gumbel-max trick), prompts are batched with left padding, and
  the result is independent of the batch up to floating-point differences of the logits under different padding
  (a flip needs a near-tie of two perturbed logits; it has not been observed on the testbed).
- ``sampler="multinomial"``: plain ``generate(do_sample=True)``; each prompt is generated on its own (its
  ``num_samples`` copies form the batch, so there is no padding) after ``torch.manual_seed(key)`` in a forked RNG.
  Independent of the other prompts; also independent of ``batch_size`` as long as ``num_samples <= batch_size``.
- vLLM: one ``SamplingParams(n=num_samples, seed=key, ...)`` per prompt (vLLM gives every seeded request its own
  generator; reproducible on the same engine, GPU and vLLM version).
"""


from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..measurement import offline_sampling
from ..measurement.offline_sampling import (
    eos_ids,
    generate_keyed,
    generate_multinomial,
    generate_vllm_requests,
    prompt_token_ids,
    render_prompts,
    reward_func_name,
    score_completions,
)
from .table_format import ValueTable, ValueTableRow, ValueTableWriter, load_value_table, prompt_key  # noqa: F401
from .value_table_inputs import (
    DEFAULT_REWARD_RANGE,
    check_build_settings,
    check_range,
    check_reward_funcs,
    distinct_prompts,
)
from .value_table_sampling import Progress, prepare_model

__all__ = [
    "DEFAULT_REWARD_RANGE",
    "VALUE_TABLE_SEED_VERSION",
    "build_value_table",
    "chat_template_sha256",
    "reward_func_name",
    "value_table_seed",
]

#: Version tag of :func:`value_table_seed` (stored in the table header).
VALUE_TABLE_SEED_VERSION = "trl_ext.value_table_seed/v1"
_MAX63 = 2**63 - 1
# Metadata that must agree between an existing table and a resumed build (besides the writer's model /
# reward_funcs / seed).
_RESUME_KEYS = (
    "n_samples",
    "temperature",
    "top_p",
    "max_new_tokens",
    "reward_range",
    "reward_weights",
    "backend",
    "sampler",
    "prompt_column",
    "seed_derivation",
)


def value_table_seed(seed: int, key: str) -> int:
    """Per-prompt sampling key: ``BLAKE2b-64(["trl_ext.value_table_seed/v1", seed, key]) mod 2**63``.

    Parameters
    ----------
    seed : int
        The build seed (``>= 0``).
    key : str
        The prompt's :func:`~trl_ext.priors.table_format.prompt_key`.

    Returns
    -------
    int
        In ``[0, 2**63 - 1]``: the request key of the keyed sampler, the ``torch.manual_seed`` of the multinomial
        sampler and the vLLM ``SamplingParams.seed``. Identical on every machine and Python version.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty str (a prompt_key), got {key!r}")
    payload = json.dumps([VALUE_TABLE_SEED_VERSION, seed, key], separators=(",", ":"))
    return int.from_bytes(hashlib.blake2b(payload.encode("utf-8"), digest_size=8).digest(), "big") & _MAX63


# ------------------------------------------------------------------------------------------------- backend
def _resolve_backend(model: Any, use_vllm: Any) -> tuple[str, Any]:
    """Return ``("vllm", vllm_module)`` or ``("transformers", None)`` following ``use_vllm``."""
    if use_vllm not in ("auto", True, False):
        raise ValueError(f"use_vllm must be 'auto', True or False, got {use_vllm!r}.")
    if use_vllm is False:
        return "transformers", None
    vllm = offline_sampling.import_vllm()  # looked up at call time: tests replace it
    if vllm is not None and isinstance(model, vllm.LLM):
        return "vllm", vllm
    if use_vllm is True:
        if vllm is None:
            raise ImportError("use_vllm=True but vllm is not installed; `pip install vllm` (GPU) or pass "
                              "use_vllm='auto'/False to generate with transformers.")
        if not isinstance(model, str | os.PathLike):
            raise TypeError("use_vllm=True needs a vllm.LLM instance or a model path/id as `model`, got "
                            f"{type(model).__name__}.")
        return "vllm", vllm
    # auto: a path with vllm installed and a GPU available
    if vllm is not None and isinstance(model, str | os.PathLike):
        try:
            import torch

            if torch.cuda.is_available():
                return "vllm", vllm
        except ImportError:  # pragma: no cover
            pass
    return "transformers", None


# ----------------------------------------------------------------------------------------------- builder
def build_value_table(
    model: Any, tokenizer: Any, dataset: Any, reward_funcs: Callable | Sequence[Callable],
    output_path: str | os.PathLike, *, num_samples: int = 32, max_new_tokens: int = 256, temperature: float = 1.0,
    top_p: float = 1.0, batch_size: int = 64, seed: int = 0, prompt_column: str = "prompt", resume: bool = True,
    reward_weights: Sequence[float] | None = None, reward_range: tuple[float, float] | None = None,
    use_vllm: bool | str = "auto", sampler: str = "keyed", max_prompts: int | None = None, model_id: str | None = None,
    metadata: Mapping[str, Any] | None = None, device: str | None = None, progress: bool = True,
) -> ValueTable:
    """Sample ``num_samples`` reference completions per prompt, score them and write a value table.

    The offline step of BASIS (module docstring): draw :math:`y_{i,1..n} \\sim \\pi_{\\mathrm{ref}}(\\cdot|x_i)`,
    score them with the training reward functions, store ``n``, the mean, the rewards (the non-binary
    :math:`\\widehat V_\\beta` of Eq. 2 needs them) and the reward range; one row per prompt, flushed per chunk.

    Parameters
    ----------
    model : transformers.PreTrainedModel, vllm.LLM, or str
        The frozen reference policy (training's initial policy). A path is loaded with ``AutoModelForCausalLM.
        from_pretrained(local_files_only=True)`` or handed to ``vllm.LLM``; eval mode during the build, then restored.
    tokenizer : PreTrainedTokenizerBase or None
        Tokenizes prompts, decodes completions (``batch_decode(skip_special_tokens=True)``, as TRL). None: loaded
        from a model path, or ``vllm.LLM.get_tokenizer()``.
    dataset : datasets.Dataset, list of dict, or dict of columns
        ``prompt_column`` holds a str or a conversation (list of ``{"role", "content"}``); every other column goes to
        the reward functions as a keyword argument (repeated per sample), as TRL's ``_calculate_rewards`` does.
    reward_funcs : callable or list of callables
        TRL reward functions ``f(prompts, completions, completion_ids, trainer_state, log_extra, log_metric,
        **columns) -> list[float | None]`` (async ones awaited; a fresh ``TrainerState()``, no-op loggers; None = NaN).
    output_path : str or PathLike
        JSON Lines table (:mod:`trl_ext.priors.table_format`).
    num_samples, max_new_tokens, temperature, top_p : int, int, float, float
        Samples per prompt ``n`` (default 32; paper 32 or 64), completion cap (default 256: use training's
        ``max_completion_length``), temperature > 0 (default 1.0, as the paper), nucleus filter in (0, 1] (top-k off).
    batch_size : int, default 64
        transformers: sequences per ``generate`` call, prompts in chunks of ``max(1, batch_size // num_samples)``,
        each chunk scored and written together. vLLM: prompts per chunk.
    seed : int, default 0
        Prompt ``x`` is sampled with key :func:`value_table_seed` ``(seed, prompt_key(x))``.
    prompt_column : str, default "prompt"
    resume : bool, default True
        Continue ``output_path`` (skip its prompts, repair a truncated last line); its header must agree on model,
        reward functions, seed, sampling settings, reward range/weights, backend and sampler (else ``ValueError``).
        False: an existing file raises ``FileExistsError``.
    reward_weights : sequence of float, optional
        One per reward function (TRL's ``reward_weights``); default all 1.
    reward_range : (low, high), optional
        Declared range of the weighted reward, stored in every row (:class:`TablePrior` maps the mean to [0, 1] with
        it); default ``(0.0, 1.0)``. A finite reward outside it raises ``ValueError``.
    use_vllm : {"auto", True, False}
        "auto": vLLM for a ``vllm.LLM``, or for a path with vLLM installed and CUDA available; True: vLLM or
        ``ImportError``; False: transformers.
    sampler : {"keyed", "multinomial"}
        transformers sampler (module docstring); ignored with vLLM.
    max_prompts : int, optional
        Stop after this many *new* rows (a partial build; call again to continue).
    model_id, metadata, device, progress
        Header model id (default: the path or ``model.config._name_or_path``; trainers compare it with theirs);
        extra header fields (a given ``"created"`` is kept: two builds are then byte-identical); where to load a
        model path (default CUDA if available); a tqdm bar, else a stderr line every ~10% (default True).

    Returns
    -------
    ValueTable
        The whole table re-read from ``output_path``, earlier runs' rows included; in-memory ``metadata
        ["build_stats"]`` counts ``n_written``, ``n_already_done``, ``n_duplicate_prompts``, ``n_nan_samples``,
        ``stopped_early``, ``complete``. Only a build that covered every prompt marks the file complete (row count and
        ``ValueTable.content_hash`` in its header); otherwise it stays ``in_progress``, refused by ``load_value_table``
        until the same call is run again.

    Raises
    ------
    ValueError
        Bad settings, an empty dataset, a missing/empty/ill-typed prompt, one prompt twice with different reward
        columns, a reward function returning the wrong number of values or non-numbers, a non-finite or out-of-range
        reward, a prompt whose every sample is NaN, or resuming a table built with other settings.
    TypeError
        Uncallable reward functions, reward models (``nn.Module``: wrap them), an unsupported dataset type.
    ImportError, FileExistsError
        ``use_vllm=True`` without vLLM; ``resume=False`` with an existing ``output_path``.
    Notes
    -----
    A sample is NaN when every reward function returns None/NaN (TRL's "unscorable" rows): excluded from ``rewards``/
    ``mean_reward``/``n``, counted in ``extra["n_nan"]``/``["n_generated"]``. Duplicate prompts (same key and other
    columns) are sampled once; the repeats are counted and warned about.
    """
    job, md, unique_idx, n_dup, was_training = _plan_build(
        model, tokenizer, dataset, reward_funcs, num_samples=num_samples, max_new_tokens=max_new_tokens,
        temperature=temperature, top_p=top_p, batch_size=batch_size, seed=seed, prompt_column=prompt_column,
        reward_weights=reward_weights, reward_range=reward_range, use_vllm=use_vllm, sampler=sampler,
        max_prompts=max_prompts, model_id=model_id, metadata=metadata, device=device)
    stats, finished = _write_rows(job, output_path, md, resume=resume, unique_idx=unique_idx, n_dup=n_dup,
                                  max_prompts=max_prompts, progress=progress, was_training=was_training)
    if stats["n_nan_samples"]:
        warnings.warn(f"{stats['n_nan_samples']} samples got no reward (None/NaN from every reward function); they "
                      "are excluded from the means and counted in the rows' extra['n_nan'].", UserWarning,
                      stacklevel=2)
    table = load_value_table(output_path, allow_incomplete=not finished)
    stats["complete"] = finished
    table.metadata["build_stats"] = stats
    return table


# ----------------------------------------------------------------------------------------- builder helpers
def _plan_build(model, tokenizer, dataset, reward_funcs, *, num_samples, max_new_tokens, temperature, top_p,
                batch_size, seed, prompt_column, reward_weights, reward_range, use_vllm, sampler, max_prompts,
                model_id, metadata, device) -> tuple[_ChunkSampler, dict, list[int], int, bool | None]:
    """Check everything :func:`build_value_table` was given, pick the backend, load the model: ``(sampler of the
    chunks, header metadata, first row of each distinct prompt, repeated rows, the model's train mode before)``."""
    check_build_settings(num_samples=num_samples, max_new_tokens=max_new_tokens, batch_size=batch_size,
                         temperature=temperature, top_p=top_p, seed=seed, sampler=sampler, max_prompts=max_prompts)
    funcs, weights = check_reward_funcs(reward_funcs, reward_weights)
    low, high = check_range(reward_range)
    rows = offline_sampling.dataset_rows(dataset, prompt_column, empty="a value table needs at least one prompt",
                                         hint="pass prompt_column=<the prompt column>")
    backend, vllm = _resolve_backend(model, use_vllm)
    keys, unique_idx, n_dup = distinct_prompts(rows, prompt_column)
    if n_dup:
        warnings.warn(f"{n_dup} dataset rows repeat an earlier prompt; each distinct prompt is sampled once.",
                      UserWarning, stacklevel=3)
    model, tokenizer, llm, mid, was_training = prepare_model(model, tokenizer, backend, vllm, model_id=model_id,
                                                            seed=seed, device=device)
    if tokenizer is None and any(not isinstance(rows[i][prompt_column], str) for i in unique_idx):
        raise ValueError("conversational prompts need a tokenizer (chat template); pass tokenizer=.")
    md = _table_metadata(metadata, model_id=mid, seed=seed, funcs=funcs, weights=weights, reward_range=(low, high),
                         num_samples=num_samples, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                         backend=backend, sampler=sampler, prompt_column=prompt_column)
    if any(not isinstance(rows[i][prompt_column], str) for i in unique_idx):  # the template shapes chat prompts
        tok = tokenizer if tokenizer is not None else (llm.get_tokenizer() if llm is not None else None)
        md["chat_template_sha256"] = chat_template_sha256(tok)
    job = _ChunkSampler(rows=rows, keys=keys, prompt_column=prompt_column, funcs=funcs, weights=weights, low=low,
                        high=high, num_samples=num_samples, temperature=float(temperature), top_p=float(top_p),
                        max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed, sampler=sampler,
                        backend=backend, vllm=vllm, llm=llm, model=model, tokenizer=tokenizer)
    return job, md, unique_idx, n_dup, was_training


def _write_rows(job: _ChunkSampler, output_path: str | os.PathLike, md: dict, *, resume: bool, unique_idx: list[int],
                n_dup: int, max_prompts: int | None, progress: bool, was_training: bool | None) -> tuple[dict, bool]:
    """Open the table (resuming it), sample, score and append the prompts it lacks chunk by chunk, and close it:
    complete only when every prompt is in it. Returns ``(build_stats, finished)``; restores the model's train mode."""
    writer = ValueTableWriter(output_path, md, resume=resume)
    stats = {"n_written": 0, "n_already_done": 0, "n_duplicate_prompts": n_dup, "n_nan_samples": 0,
             "stopped_early": False}
    finished = False  # every prompt of the dataset is in the table: only then is it marked complete
    try:
        _check_resume(writer, md, output_path)
        todo = [i for i in unique_idx if job.keys[i] not in writer.done_keys]
        stats["n_already_done"] = len(unique_idx) - len(todo)
        if max_prompts is not None and len(todo) > max_prompts:
            todo = todo[:max_prompts]
            stats["stopped_early"] = True
        chunk = job.batch_size if job.backend == "vllm" else max(1, job.batch_size // job.num_samples)
        job.prepare()
        bar = Progress(len(todo), progress)
        try:
            for start in range(0, len(todo), chunk):
                new_rows, n_nan = job.rows_for(todo[start : start + chunk])
                stats["n_nan_samples"] += n_nan
                for row in new_rows:  # write only once the whole chunk is scored
                    writer.write(row)
                stats["n_written"] += len(new_rows)
                bar.update(len(new_rows))
        finally:
            bar.close()
        finished = not stats["stopped_early"]
    finally:
        # An error, an interruption or max_prompts leaves the table "in_progress" (refused by load_value_table until
        # a re-run finishes it); a finished build records its row count and content hash in the header.
        writer.close(complete=finished)
        if was_training:
            job.model.train()
    return stats, finished


def chat_template_sha256(tokenizer) -> str | None:
    """SHA-256 of a tokenizer's chat template (``None`` without one): the table records it for conversational
    prompts, and BASIS compares it with the training tokenizer's."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _table_metadata(metadata: Mapping[str, Any] | None, *, model_id: str, seed: int, funcs: Sequence[Callable],
                    weights: list[float], reward_range: tuple[float, float], num_samples: int, temperature: float,
                    top_p: float, max_new_tokens: int, backend: str, sampler: str, prompt_column: str) -> dict:
    """The header metadata of a build: the caller's ``metadata`` updated with every setting that decides the rows."""
    low, high = reward_range
    md: dict[str, Any] = dict(metadata or {})
    md.update(
        model=str(model_id),
        seed=seed,
        reward_funcs=[reward_func_name(f) for f in funcs],
        reward_weights=weights,
        reward_range=[low, high],
        n_samples=num_samples,
        temperature=float(temperature),
        top_p=float(top_p),
        max_new_tokens=max_new_tokens,
        backend=backend,
        sampler=sampler if backend == "transformers" else "vllm-seeded",
        prompt_column=prompt_column,
        key="prompt_key: first 16 hex of sha256(prompt text | canonical JSON of messages)",
        question_id="dataset column 'question_id' if present, else the dataset row index",
        seed_derivation=VALUE_TABLE_SEED_VERSION,
    )
    if backend == "transformers" and sampler == "keyed":
        from trl_ext.measurement.keyed_sampling import HASH_VERSION

        md["noise_hash"] = HASH_VERSION
    return md


def _check_resume(writer: ValueTableWriter, md: Mapping[str, Any], output_path: str | os.PathLike) -> None:
    """``ValueError`` when the table being resumed was built with other settings (:data:`_RESUME_KEYS`)."""
    mismatched = [f"{k}: table has {writer.metadata[k]!r}, this build uses {md[k]!r}"
                  for k in _RESUME_KEYS if k in writer.metadata and writer.metadata[k] != md[k]]
    if mismatched:
        raise ValueError(f"{os.fspath(output_path)}: cannot resume, the existing table was built with other "
                         f"settings ({'; '.join(mismatched)}); use a new output path.")


@dataclass
class _ChunkSampler:
    """Samples, scores and turns into table rows one chunk of prompts of a build (its checked settings)."""

    rows: list[dict]
    keys: list[str]
    prompt_column: str
    funcs: list[Callable]
    weights: list[float]
    low: float
    high: float
    num_samples: int
    temperature: float
    top_p: float
    max_new_tokens: int
    batch_size: int
    seed: int
    sampler: str
    backend: str
    vllm: Any
    llm: Any
    model: Any
    tokenizer: Any

    def __post_init__(self):
        self.pad = self.eos = self.settings = None

    def prepare(self) -> None:
        """transformers: the pad and eos ids (``ValueError`` without an eos token) and the keyed sampler's
        settings."""
        if self.backend != "transformers":
            return
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.eos = eos_ids(self.model, tok)
        if pad is None or not self.eos:
            raise ValueError("the tokenizer needs an eos token (and a pad token, else eos is used for padding).")
        self.pad = int(pad)
        if self.sampler == "keyed":
            from trl_ext.measurement.keyed_sampling import SamplerSettings

            self.settings = SamplerSettings(temperature=self.temperature, top_p=self.top_p,
                                            max_new_tokens=self.max_new_tokens, eos_token_ids=self.eos,
                                            pad_token_id=self.pad)

    def rows_for(self, idx: list[int]) -> tuple[list[ValueTableRow], int]:
        """The table rows of dataset rows ``idx`` and their number of NaN samples."""
        prompts, texts, comp_ids = self.generate(idx)
        rewards = self.score(idx, prompts, texts, comp_ids)
        n = self.num_samples
        new_rows, n_nan = [], 0
        for a, i in enumerate(idx):
            row, nan_i = self.table_row(i, rewards[a * n : (a + 1) * n])
            new_rows.append(row)
            n_nan += nan_i
        return new_rows, n_nan

    def generate(self, idx: list[int]) -> tuple[list, list[list[str]], list[list[list[int]]]]:
        """``(prompts, texts, completion ids)``: ``num_samples`` completions of every prompt of ``idx``."""
        prompts = [self.rows[i][self.prompt_column] for i in idx]
        seeds = [value_table_seed(self.seed, self.keys[i]) for i in idx]
        if self.backend == "vllm":
            gen = generate_vllm_requests(self.llm, self.vllm, render_prompts(prompts, self.tokenizer), seeds,
                                         self.num_samples, temperature=self.temperature, top_p=self.top_p,
                                         max_new_tokens=self.max_new_tokens)
            comp_ids = [[ids for ids, _ in g] for g in gen]
            if self.tokenizer is not None:
                texts = [self.tokenizer.batch_decode(c, skip_special_tokens=True) for c in comp_ids]
            else:
                texts = [[t for _, t in g] for g in gen]
            return prompts, texts, comp_ids
        import torch

        p_ids = prompt_token_ids(prompts, self.tokenizer)
        with torch.no_grad():
            if self.sampler == "keyed":
                comp_ids = generate_keyed(self.model, p_ids, seeds, self.num_samples, self.batch_size, self.settings)
            else:
                comp_ids = generate_multinomial(self.model, p_ids, seeds, self.num_samples, self.batch_size,
                                                temperature=self.temperature, top_p=self.top_p,
                                                max_new_tokens=self.max_new_tokens, eos=self.eos, pad=self.pad)
        texts = [self.tokenizer.batch_decode(c, skip_special_tokens=True) for c in comp_ids]
        return prompts, texts, comp_ids

    def score(self, idx: list[int], prompts: list, texts: list[list[str]], comp_ids: list) -> list[float]:
        """The weighted reward of every completion, in TRL's layout (every prompt repeated ``num_samples`` times)."""
        flat_prompts, flat_comps, flat_ids = [], [], []
        columns: dict[str, list] = {}
        other = [c for c in self.rows[idx[0]] if c not in (self.prompt_column, "completion", "completion_ids")]
        for c in other:
            columns[c] = []
        for i, p, t, ci in zip(idx, prompts, texts, comp_ids):
            for s in range(self.num_samples):
                flat_prompts.append(p)
                flat_comps.append(t[s] if isinstance(p, str) else [{"role": "assistant", "content": t[s]}])
                flat_ids.append(list(ci[s]))
                for c in other:
                    columns[c].append(self.rows[i].get(c))
        return score_completions(self.funcs, self.weights, flat_prompts, flat_comps, flat_ids, columns)

    def table_row(self, i: int, r: list[float]) -> tuple[ValueTableRow, int]:
        """The row of dataset row ``i`` from its samples' rewards ``r``, and its number of NaN samples."""
        low, high, num_samples = self.low, self.high, self.num_samples
        finite = [v for v in r if not math.isnan(v)]
        n_nan = num_samples - len(finite)
        prompt = self.rows[i][self.prompt_column]
        if not finite:
            raise ValueError(f"every one of the {num_samples} samples of prompt {str(prompt)[:60]!r} "
                             f"(dataset row {i}) got a NaN/None reward from every reward function; at "
                             "least one sample must be scorable. Check the reward functions and the "
                             "dataset columns they need.")
        bad = [v for v in finite if not (low <= v <= high)]
        if bad:
            raise ValueError(f"prompt {str(prompt)[:60]!r} (dataset row {i}): reward {bad[0]!r} lies "
                             f"outside the declared reward_range [{low}, {high}]; declare the true range "
                             "(reward_range=(low, high) / --reward_range) or fix the reward function.")
        qid = self.rows[i]["question_id"] if "question_id" in self.rows[i] else i
        extra = {"n_nan": n_nan, "n_generated": num_samples} if n_nan else None
        return ValueTableRow.from_rewards(prompt, finite, (low, high), key=self.keys[i], question_id=qid,
                                          extra=extra), n_nan
