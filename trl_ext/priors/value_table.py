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

import asyncio
import hashlib
import inspect
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .table_format import ValueTable, ValueTableRow, ValueTableWriter, load_value_table, prompt_key

__all__ = [
    "DEFAULT_REWARD_RANGE",
    "VALUE_TABLE_SEED_VERSION",
    "build_value_table",
    "reward_func_name",
    "value_table_seed",
]

#: Reward range assumed when none is declared: binary {0, 1} verifiers.
DEFAULT_REWARD_RANGE: tuple[float, float] = (0.0, 1.0)
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


def reward_func_name(func: Any) -> str:
    """Name recorded for a reward function, as TRL's ``GRPOTrainer`` names it (``__name__``; a
    ``functools.partial`` uses the wrapped function's name; other callables their class name)."""
    inner = getattr(func, "func", None)  # functools.partial
    for f in (func, inner):
        name = getattr(f, "__name__", None)
        if isinstance(name, str) and name:
            return name
    return type(func).__name__


# ------------------------------------------------------------------------------------------------- helpers
def _import_vllm():
    """The ``vllm`` module, or None if it is not installed (tests replace this function with a stand-in)."""
    try:
        import vllm  # type: ignore[import-not-found]
    except ImportError:
        return None
    return vllm


def _is_conversation(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, Mapping) for m in prompt)


def _check_prompt(prompt: Any, index: int, column: str) -> None:
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"dataset row {index}: column {column!r} is an empty string; every prompt needs text.")
        return
    if _is_conversation(prompt) and prompt:
        for m in prompt:
            if "role" not in m or "content" not in m:
                raise ValueError(f"dataset row {index}: every message needs 'role' and 'content', got {dict(m)!r:.120}")
        return
    raise ValueError(
        f"dataset row {index}: column {column!r} must be a non-empty str or a list of message dicts, "
        f"got {type(prompt).__name__}: {prompt!r:.80}"
    )


def _check_prompt_rows(rows: list[dict], prompt_column: str, *, empty: str, hint: str) -> None:
    """The dataset check shared by value tables and ``trl-ext gate``: at least one row, and every row has a valid
    prompt (:func:`_check_prompt`) in ``prompt_column``.

    ``empty`` ends the message for an empty dataset (why it cannot be), ``hint`` the one for a missing column (how to
    name the prompt column in the caller's interface). Raises ``ValueError``.
    """
    if not rows:
        raise ValueError(f"the dataset is empty; {empty}.")
    if prompt_column not in rows[0]:
        raise ValueError(f"the dataset has no {prompt_column!r} column (columns: {sorted(rows[0])}); {hint}.")
    for i, r in enumerate(rows):
        if prompt_column not in r:
            raise ValueError(f"dataset row {i} has no {prompt_column!r} column.")
        _check_prompt(r[prompt_column], i, prompt_column)


def _dataset_rows(dataset: Any, prompt_column: str) -> list[dict]:
    """Rows of a ``datasets.Dataset``, a list of dicts or a dict of columns, as a list of dicts."""
    if isinstance(dataset, Mapping):  # dict of columns
        cols = {k: list(v) for k, v in dataset.items()}
        lengths = {k: len(v) for k, v in cols.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"dataset columns have different lengths: {lengths}")
        n = next(iter(lengths.values()), 0)
        rows = [{k: v[i] for k, v in cols.items()} for i in range(n)]
    elif hasattr(dataset, "column_names") and hasattr(dataset, "__getitem__"):  # datasets.Dataset
        rows = [dict(r) for r in dataset]
    elif isinstance(dataset, Sequence) and not isinstance(dataset, str | bytes):
        rows = list(dataset)
        for i, r in enumerate(rows):
            if not isinstance(r, Mapping):
                raise TypeError(f"dataset row {i} is a {type(r).__name__}; pass dict rows, a dict of columns or a "
                                "datasets.Dataset.")
        rows = [dict(r) for r in rows]
    else:
        raise TypeError(f"dataset must be a datasets.Dataset, a list of dict rows or a dict of columns, got "
                        f"{type(dataset).__name__}.")
    _check_prompt_rows(rows, prompt_column, empty="a value table needs at least one prompt",
                       hint="pass prompt_column=<the prompt column>")
    return rows


def _check_reward_funcs(reward_funcs: Any, reward_weights: Any) -> tuple[list[Callable], list[float]]:
    if callable(reward_funcs):
        reward_funcs = [reward_funcs]
    if not isinstance(reward_funcs, Sequence) or isinstance(reward_funcs, str) or not reward_funcs:
        raise ValueError("reward_funcs must be a reward function or a non-empty list of them "
                         "(TRL signature f(prompts, completions, **columns) -> list[float | None]).")
    funcs = list(reward_funcs)
    for f in funcs:
        if isinstance(f, str):
            raise TypeError(f"reward function {f!r} is a string; load reward models yourself and pass a callable "
                            "f(prompts, completions, **columns) (reward-model ids are not supported by the builder).")
        if not callable(f):
            raise TypeError(f"reward function {f!r} is not callable.")
        try:
            import torch.nn as nn

            if isinstance(f, nn.Module):
                raise TypeError(f"reward function {type(f).__name__} is a torch Module (a reward model); wrap it in a "
                                "function f(prompts, completions, **columns) -> list[float] to use it here.")
        except ImportError:  # pragma: no cover - torch is a dependency
            pass
    if reward_weights is None:
        weights = [1.0] * len(funcs)
    else:
        weights = list(reward_weights)
        if len(weights) != len(funcs):
            raise ValueError(f"reward_weights has {len(weights)} entries but there are {len(funcs)} reward functions.")
        for w in weights:
            if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w):
                raise ValueError(f"reward_weights must be finite numbers, got {reward_weights!r}.")
        weights = [float(w) for w in weights]
    return funcs, weights


def _check_range(reward_range: Any) -> tuple[float, float]:
    if reward_range is None:
        return DEFAULT_REWARD_RANGE
    try:
        low, high = (float(v) for v in reward_range)
    except (TypeError, ValueError) as e:
        raise ValueError(f"reward_range must be a pair (low, high), got {reward_range!r}.") from e
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"reward_range must be finite with low < high, got {reward_range!r}.")
    return low, high


def _noop(*args, **kwargs) -> None:
    return None


def _call_reward(func: Callable, **kwargs) -> list:
    out = func(**kwargs)  # an async function returns a coroutine, awaited below
    if inspect.isawaitable(out):
        return asyncio.run(_await(out))
    return out


async def _await(x):
    return await x


def _score(
    funcs: Sequence[Callable],
    weights: Sequence[float],
    prompts: list,
    completions: list,
    completion_ids: list[list[int]],
    columns: dict[str, list],
) -> list[float]:
    """Weighted reward per completion, TRL style: ``nansum_f(w_f * r_f)``; NaN only when every function gives
    None/NaN (TRL's "unscorable" rows). Raises on a wrong output length or a non-numeric reward."""
    from transformers import TrainerState

    n = len(completions)
    per_func = []
    for f in funcs:
        name = reward_func_name(f)
        try:
            out = _call_reward(f, prompts=prompts, completions=completions, completion_ids=completion_ids,
                               trainer_state=TrainerState(), log_extra=_noop, log_metric=_noop, **columns)
        except TypeError as e:
            raise TypeError(f"reward function {name!r} failed: {e}. Reward functions are called like TRL does: "
                            "f(prompts=, completions=, completion_ids=, trainer_state=, log_extra=, log_metric=, "
                            "**dataset_columns); give it **kwargs.") from e
        try:
            out = list(out)
        except TypeError as e:
            raise ValueError(f"reward function {name!r} returned {type(out).__name__}, expected a list.") from e
        if len(out) != n:
            raise ValueError(f"reward function {name!r} returned {len(out)} rewards for {n} completions; it must "
                             "return one reward per completion.")
        vals = []
        for v in out:
            if v is None:
                vals.append(math.nan)
                continue
            try:
                vals.append(float(v))
            except (TypeError, ValueError) as e:
                raise ValueError(f"reward function {name!r} returned a non-numeric reward {v!r}.") from e
        per_func.append(vals)
    combined = []
    for j in range(n):
        terms = [w * col[j] for w, col in zip(weights, per_func) if not math.isnan(col[j])]
        combined.append(math.fsum(terms) if terms else math.nan)
    return combined


# ---------------------------------------------------------------------------------------------- generation
def _resolve_backend(model: Any, use_vllm: Any) -> tuple[str, Any]:
    """Return ``("vllm", vllm_module)`` or ``("transformers", None)`` following ``use_vllm``."""
    if use_vllm not in ("auto", True, False):
        raise ValueError(f"use_vllm must be 'auto', True or False, got {use_vllm!r}.")
    if use_vllm is False:
        return "transformers", None
    vllm = _import_vllm()
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


def _render_prompts(prompts: list, tokenizer: Any) -> list[str]:
    """Text fed to vLLM: plain prompts as is, conversations through the tokenizer's chat template."""
    out = []
    for p in prompts:
        if isinstance(p, str):
            out.append(p)
        else:
            if tokenizer is None:
                raise ValueError("conversational prompts need a tokenizer with a chat template.")
            out.append(tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True))
    return out


def _prompt_token_ids(prompts: list, tokenizer: Any) -> list[list[int]]:
    """Prompt token ids exactly as TRL's ``_tokenize_prompts`` builds them (text: ``tokenizer(text=...)``;
    conversations: ``apply_chat_template(add_generation_prompt=True)``)."""
    ids: list[list[int]] = []
    for p in prompts:
        if isinstance(p, str):
            ids.append(list(tokenizer(text=[p])["input_ids"][0]))
        else:
            t = tokenizer.apply_chat_template(conversation=[p], add_generation_prompt=True, tokenize=True,
                                              return_dict=True)
            ids.append(list(t["input_ids"][0]))
    for p, i in zip(prompts, ids):
        if not i:
            raise ValueError(f"prompt {p!r:.60} tokenizes to zero tokens.")
    return ids


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    eos: list[int] = []
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for e in ([gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])) + [tokenizer.eos_token_id]:
        if e is not None and int(e) not in eos:
            eos.append(int(e))
    return eos


def _generate_keyed(model, prompt_ids, keys, num_samples, batch_size, settings) -> list[list[list[int]]]:
    from trl_ext.measurement.keyed_sampling import keyed_generate

    flat = [(i, s) for i in range(len(prompt_ids)) for s in range(num_samples)]
    out: list[list[list[int]]] = [[None] * num_samples for _ in prompt_ids]  # type: ignore[list-item]
    for start in range(0, len(flat), batch_size):
        chunk = flat[start : start + batch_size]
        comps = keyed_generate(model, [prompt_ids[i] for i, _ in chunk], [keys[i] for i, _ in chunk],
                               [s for _, s in chunk], settings)
        for (i, s), c in zip(chunk, comps):
            out[i][s] = c
    return out


def _generate_multinomial(model, prompt_ids, keys, num_samples, batch_size, *, temperature, top_p,
                          max_new_tokens, eos, pad) -> list[list[list[int]]]:
    import torch
    from transformers import GenerationConfig

    from trl_ext.measurement.keyed_sampling import truncate_at_eos

    cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature, top_p=top_p,
                           top_k=0, min_p=None, repetition_penalty=1.0, num_beams=1, pad_token_id=pad,
                           eos_token_id=eos, disable_compile=True)
    device = next(model.parameters()).device
    out = []
    for ids, key in zip(prompt_ids, keys):
        comps: list[list[int]] = []
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(key)
            for start in range(0, num_samples, batch_size):
                m = min(batch_size, num_samples - start)
                inp = torch.tensor([ids] * m, dtype=torch.long, device=device)
                gen = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), generation_config=cfg)
                comps.extend(truncate_at_eos(gen[:, inp.shape[1] :].cpu(), eos))
        out.append(comps)
    return out


def _generate_vllm(llm, vllm, texts, keys, num_samples, *, temperature, top_p, max_new_tokens):
    params = [vllm.SamplingParams(n=num_samples, seed=int(k), temperature=temperature, top_p=top_p,
                                  max_tokens=max_new_tokens) for k in keys]
    outputs = llm.generate(texts, params, use_tqdm=False)
    if len(outputs) != len(texts):
        raise RuntimeError(f"vLLM returned {len(outputs)} results for {len(texts)} prompts.")
    result = []
    for o in outputs:
        comps = list(o.outputs)
        if len(comps) != num_samples:
            raise RuntimeError(f"vLLM returned {len(comps)} samples for a prompt, expected n={num_samples}.")
        result.append([(list(c.token_ids), c.text) for c in comps])
    return result


class _Progress:
    """tqdm when installed, else a line every ~10% (or nothing when disabled)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled, self._bar = total, 0, enabled, None
        self._next_print, self._t0 = 0, time.monotonic()
        if enabled:
            try:
                from tqdm.auto import tqdm

                self._bar = tqdm(total=total, desc="value table", unit="prompt")
            except ImportError:
                pass

    def update(self, k: int) -> None:
        self.done += k
        if self._bar is not None:
            self._bar.update(k)
        elif self.enabled and (self.done >= self._next_print or self.done == self.total):
            dt = time.monotonic() - self._t0
            print(f"value table: {self.done}/{self.total} prompts ({dt:.0f}s)", file=sys.stderr, flush=True)
            self._next_print = self.done + max(1, self.total // 10)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


# ----------------------------------------------------------------------------------------------- builder
def build_value_table(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    reward_funcs: Callable | Sequence[Callable],
    output_path: str | os.PathLike,
    *,
    num_samples: int = 32,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    top_p: float = 1.0,
    batch_size: int = 64,
    seed: int = 0,
    prompt_column: str = "prompt",
    resume: bool = True,
    reward_weights: Sequence[float] | None = None,
    reward_range: tuple[float, float] | None = None,
    use_vllm: bool | str = "auto",
    sampler: str = "keyed",
    max_prompts: int | None = None,
    model_id: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    device: str | None = None,
    progress: bool = True,
) -> ValueTable:
    """Sample ``num_samples`` reference completions per prompt, score them and write a value table.

    Implements the offline step of BASIS ("BASIS: Batchwise Advantage Estimation from Single-Rollout Information
    Sharing for LLM Reasoning", May 2026, Section 4 "Offline value estimation", Proposition 2 / Eq. 2, and Appendix
    10 "Offline value-table generation"): for every prompt :math:`x_i` draw
    :math:`y_{i,1..n} \\sim \\pi_{\\mathrm{ref}}(\\cdot|x_i)` from the frozen model, score
    :math:`r_{i,k} = \\sum_f w_f r_f(x_i, y_{i,k})` with the training reward functions and store ``n``,
    :math:`\\hat p_i = \\frac1n\\sum_k r_{i,k}`, the rewards themselves (what the non-binary
    :math:`\\widehat V_\\beta` of Eq. 2 needs) and the reward range. One row per distinct prompt, appended and
    flushed as soon as its batch is scored, so the build is resumable.

    Parameters
    ----------
    model : transformers.PreTrainedModel, vllm.LLM, or str
        The frozen reference policy (the initial policy of training). A ``str``/path is loaded with
        ``AutoModelForCausalLM.from_pretrained(local_files_only=True)``, or handed to ``vllm.LLM`` when vLLM
        is used. The model is put in eval mode for the build and its mode restored afterwards.
    tokenizer : PreTrainedTokenizerBase or None
        Tokenizes prompts and decodes completions (``batch_decode(skip_special_tokens=True)``, as TRL). None:
        loaded from ``model`` when it is a path, or taken from ``vllm.LLM.get_tokenizer()``.
    dataset : datasets.Dataset, list of dict, or dict of columns
        Training prompts. ``prompt_column`` holds a str or a conversation (list of ``{"role", "content"}``);
        every other column is passed to the reward functions as a keyword argument (repeated per sample),
        exactly as TRL's ``GRPOTrainer._calculate_rewards`` does.
    reward_funcs : callable or list of callables
        TRL reward functions ``f(prompts, completions, completion_ids, trainer_state, log_extra, log_metric,
        **columns) -> list[float | None]``; async functions are awaited. ``trainer_state`` is a fresh
        ``transformers.TrainerState()`` (step 0), ``log_extra``/``log_metric`` are no-ops. ``None`` = NaN.
    output_path : str or PathLike
        JSON Lines table (see :mod:`trl_ext.priors.table_format`).
    num_samples : int, default 32
        Reference samples per prompt ``n`` (paper: 32 or 64).
    max_new_tokens : int, default 256
        Completion length cap (use the training ``max_completion_length``).
    temperature : float, default 1.0
        Sampling temperature (> 0); the paper samples the reference at 1.0.
    top_p : float, default 1.0
        Nucleus filter in (0, 1]; top-k is off.
    batch_size : int, default 64
        Sequences (prompt x sample rows) per ``generate`` call with transformers; prompts are processed in chunks
        of ``max(1, batch_size // num_samples)`` and each chunk is scored and written together. With vLLM the
        chunk is ``batch_size`` prompts.
    seed : int, default 0
        Build seed; prompt ``x`` is sampled with key :func:`value_table_seed` ``(seed, prompt_key(x))``.
    prompt_column : str, default "prompt"
    resume : bool, default True
        Continue an existing ``output_path``: prompts already in it are skipped (a truncated last line from a
        killed run is repaired). The existing header must agree on model, reward functions, seed, ``num_samples``,
        sampling settings, reward range/weights, backend and sampler, else ``ValueError``. False: an existing
        file raises ``FileExistsError``.
    reward_weights : sequence of float, optional
        One weight per reward function (TRL's ``reward_weights``); default all 1.
    reward_range : (low, high), optional
        Declared range of the weighted reward, stored in every row (:class:`TablePrior` maps the mean to
        ``[0, 1]`` with it). Default ``(0.0, 1.0)``. A finite reward outside it raises ``ValueError``.
    use_vllm : {"auto", True, False}
        ``"auto"``: vLLM when ``model`` is a ``vllm.LLM``, or a path while vLLM is installed and CUDA is
        available; else transformers. True: vLLM or ``ImportError``. False: transformers.
    sampler : {"keyed", "multinomial"}
        transformers sampler (see the module docstring); ignored with vLLM.
    max_prompts : int, optional
        Stop after writing this many *new* rows (a partial build; call again to continue).
    model_id : str, optional
        Model identifier stored in the header (default: the path, or ``model.config._name_or_path``). Trainers
        compare it with their model to detect a table built for another model.
    metadata : mapping, optional
        Extra header fields (e.g. ``{"dataset": "..."}``); a given ``"created"`` is kept, which makes two builds
        byte-identical.
    device : str, optional
        Where to load a model given by path (default: CUDA if available, else CPU).
    progress : bool, default True
        tqdm bar if installed, else a line to stderr every ~10% of the prompts.

    Returns
    -------
    ValueTable
        The whole table re-read from ``output_path`` (rows of earlier runs included). In-memory
        ``metadata["build_stats"]`` (not written) counts ``n_written``, ``n_already_done``, ``n_duplicate_prompts``,
        ``n_nan_samples``, ``stopped_early`` and ``complete``. Only a build that covered every prompt marks the file
        complete (its header then records the row count and :attr:`~trl_ext.priors.table_format.ValueTable.content_hash`);
        after an error, an interruption or ``max_prompts`` it stays ``in_progress``, which
        :func:`~trl_ext.priors.table_format.load_value_table` refuses until the same call is run again.

    Raises
    ------
    ValueError
        Bad settings (non-positive ``num_samples``/``max_new_tokens``/``batch_size``, ``temperature <= 0``,
        ``top_p`` outside (0, 1], negative seed, unknown sampler), an empty dataset, a missing/empty/ill-typed
        prompt, the same prompt twice with different reward columns, a reward function returning the wrong number
        of values or non-numbers, a non-finite or out-of-range reward, a prompt whose every sample is NaN, or
        resuming a table built with other settings.
    TypeError
        Uncallable reward functions, reward models (``nn.Module``; wrap them), or an unsupported dataset type.
    ImportError
        ``use_vllm=True`` without vLLM.
    FileExistsError
        ``resume=False`` and ``output_path`` exists.

    Notes
    -----
    NaN handling: a sample is NaN when every reward function returned None/NaN for it (TRL's "unscorable" rows).
    Such samples are excluded from ``rewards``/``mean_reward``/``n`` and counted in the row's
    ``extra["n_nan"]`` (and ``extra["n_generated"]``); a prompt with no scorable sample raises. Duplicate prompts
    (same key) with identical other columns are sampled once; the repeats are counted and warned about.
    """
    # ---- validate settings
    for name, val in (("num_samples", num_samples), ("max_new_tokens", max_new_tokens), ("batch_size", batch_size)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name} must be a positive int, got {val!r}.")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not (
            math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r} (reference sampling needs "
                         "randomness; the paper uses 1.0).")
    if isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}.")
    if sampler not in ("keyed", "multinomial"):
        raise ValueError(f"sampler must be 'keyed' or 'multinomial', got {sampler!r}.")
    if max_prompts is not None and (isinstance(max_prompts, bool) or not isinstance(max_prompts, int)
                                    or max_prompts < 0):
        raise ValueError(f"max_prompts must be None or a non-negative int, got {max_prompts!r}.")
    funcs, weights = _check_reward_funcs(reward_funcs, reward_weights)
    low, high = _check_range(reward_range)
    rows = _dataset_rows(dataset, prompt_column)
    backend, vllm = _resolve_backend(model, use_vllm)

    # ---- keys, duplicates
    keys = [prompt_key(r[prompt_column]) for r in rows]
    first_of: dict[str, int] = {}
    unique_idx: list[int] = []
    n_dup = 0
    for i, k in enumerate(keys):
        j = first_of.get(k)
        if j is None:
            first_of[k] = i
            unique_idx.append(i)
            continue
        a = {c: v for c, v in rows[i].items() if c != prompt_column}
        b = {c: v for c, v in rows[j].items() if c != prompt_column}
        a.pop("question_id", None)
        b.pop("question_id", None)
        if a != b:
            raise ValueError(f"dataset rows {j} and {i} have the same prompt ({str(rows[i][prompt_column])[:60]!r}) "
                             "but different reward columns; one prompt can only have one value. Deduplicate the "
                             "dataset or make the prompts distinct.")
        n_dup += 1
    if n_dup:
        warnings.warn(f"{n_dup} dataset rows repeat an earlier prompt; each distinct prompt is sampled once.",
                      UserWarning, stacklevel=2)

    # ---- model / tokenizer
    llm = None
    was_training = None
    if backend == "vllm":
        if isinstance(model, vllm.LLM):
            llm = model
            mid = model_id or str(getattr(getattr(getattr(llm, "llm_engine", None), "model_config", None), "model",
                                          None) or type(llm).__name__)
        else:
            mid = model_id or os.fspath(model)
            llm = vllm.LLM(model=os.fspath(model), seed=seed)
        if tokenizer is None and hasattr(llm, "get_tokenizer"):
            tokenizer = llm.get_tokenizer()
    else:
        import torch

        if isinstance(model, str | os.PathLike):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            mid = model_id or os.fspath(model)
            dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(os.fspath(model), local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(os.fspath(model), local_files_only=True).to(dev)
        else:
            if not (isinstance(model, torch.nn.Module) and hasattr(model, "generate")):
                raise TypeError(f"model must be a transformers causal LM, a vllm.LLM or a path, got "
                                f"{type(model).__name__}.")
            mid = model_id or getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
        if tokenizer is None:
            raise ValueError("tokenizer is None; pass the model's tokenizer (or a model path to load both).")
        was_training = model.training
        model.eval()
    if tokenizer is None and any(not isinstance(rows[i][prompt_column], str) for i in unique_idx):
        raise ValueError("conversational prompts need a tokenizer (chat template); pass tokenizer=.")

    md: dict[str, Any] = dict(metadata or {})
    md.update(
        model=str(mid),
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

    writer = ValueTableWriter(output_path, md, resume=resume)
    stats = {"n_written": 0, "n_already_done": 0, "n_duplicate_prompts": n_dup, "n_nan_samples": 0,
             "stopped_early": False}
    finished = False  # every prompt of the dataset is in the table: only then is it marked complete
    try:
        mismatched = [f"{k}: table has {writer.metadata[k]!r}, this build uses {md[k]!r}"
                      for k in _RESUME_KEYS if k in writer.metadata and writer.metadata[k] != md[k]]
        if mismatched:
            raise ValueError(f"{os.fspath(output_path)}: cannot resume, the existing table was built with other "
                             f"settings ({'; '.join(mismatched)}); use a new output path.")
        todo = [i for i in unique_idx if keys[i] not in writer.done_keys]
        stats["n_already_done"] = len(unique_idx) - len(todo)
        if max_prompts is not None and len(todo) > max_prompts:
            todo = todo[:max_prompts]
            stats["stopped_early"] = True
        chunk = batch_size if backend == "vllm" else max(1, batch_size // num_samples)
        if backend == "transformers":
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            eos = _eos_ids(model, tokenizer)
            if pad is None or not eos:
                raise ValueError("the tokenizer needs an eos token (and a pad token, else eos is used for padding).")
            if sampler == "keyed":
                from trl_ext.measurement.keyed_sampling import SamplerSettings

                settings = SamplerSettings(temperature=float(temperature), top_p=float(top_p),
                                           max_new_tokens=max_new_tokens, eos_token_ids=eos, pad_token_id=int(pad))
        bar = _Progress(len(todo), progress)
        try:
            for start in range(0, len(todo), chunk):
                idx = todo[start : start + chunk]
                prompts = [rows[i][prompt_column] for i in idx]
                seeds = [value_table_seed(seed, keys[i]) for i in idx]
                if backend == "vllm":
                    gen = _generate_vllm(llm, vllm, _render_prompts(prompts, tokenizer), seeds, num_samples,
                                         temperature=float(temperature), top_p=float(top_p),
                                         max_new_tokens=max_new_tokens)
                    comp_ids = [[ids for ids, _ in g] for g in gen]
                    if tokenizer is not None:
                        texts = [tokenizer.batch_decode(c, skip_special_tokens=True) for c in comp_ids]
                    else:
                        texts = [[t for _, t in g] for g in gen]
                else:
                    import torch

                    p_ids = _prompt_token_ids(prompts, tokenizer)
                    with torch.no_grad():
                        if sampler == "keyed":
                            comp_ids = _generate_keyed(model, p_ids, seeds, num_samples, batch_size, settings)
                        else:
                            comp_ids = _generate_multinomial(model, p_ids, seeds, num_samples, batch_size,
                                                             temperature=float(temperature), top_p=float(top_p),
                                                             max_new_tokens=max_new_tokens, eos=eos, pad=int(pad))
                    texts = [tokenizer.batch_decode(c, skip_special_tokens=True) for c in comp_ids]
                # ---- score, TRL layout: every prompt repeated num_samples times
                flat_prompts, flat_comps, flat_ids = [], [], []
                columns: dict[str, list] = {}
                other = [c for c in rows[idx[0]] if c not in (prompt_column, "completion", "completion_ids")]
                for c in other:
                    columns[c] = []
                for i, p, t, ci in zip(idx, prompts, texts, comp_ids):
                    for s in range(num_samples):
                        flat_prompts.append(p)
                        flat_comps.append(t[s] if isinstance(p, str) else [{"role": "assistant", "content": t[s]}])
                        flat_ids.append(list(ci[s]))
                        for c in other:
                            columns[c].append(rows[i].get(c))
                rewards = _score(funcs, weights, flat_prompts, flat_comps, flat_ids, columns)
                new_rows = []
                for a, i in enumerate(idx):
                    r = rewards[a * num_samples : (a + 1) * num_samples]
                    finite = [v for v in r if not math.isnan(v)]
                    n_nan = num_samples - len(finite)
                    prompt = rows[i][prompt_column]
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
                    stats["n_nan_samples"] += n_nan
                    qid = rows[i]["question_id"] if "question_id" in rows[i] else i
                    extra = {"n_nan": n_nan, "n_generated": num_samples} if n_nan else None
                    new_rows.append(ValueTableRow.from_rewards(prompt, finite, (low, high), key=keys[i],
                                                               question_id=qid, extra=extra))
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
            model.train()
    if stats["n_nan_samples"]:
        warnings.warn(f"{stats['n_nan_samples']} samples got no reward (None/NaN from every reward function); they "
                      "are excluded from the means and counted in the rows' extra['n_nan'].", UserWarning,
                      stacklevel=2)
    table = load_value_table(output_path, allow_incomplete=not finished)
    stats["complete"] = finished
    table.metadata["build_stats"] = stats
    return table
