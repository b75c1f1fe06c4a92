"""Replay logged keyed rollouts and diff two checkpoints on the same keys.

"Measurement Discipline for RLVR", "1. The sampler's noise should be addressable": with keyed noise a rollout
is replayed from three logged numbers (key, sample index, checkpoint), and two model states driven by the same
noise emit identical tokens until the models themselves disagree; the first differing token says where, and
the logit margins there say by how much.

Records are the JSON lines :class:`~trl_ext.generation.keyed_sampler.KeyedSampler` writes to
``<output_dir>/rollouts/rank<r>.jsonl`` (fields: ``key``, ``sample_index``, ``position_offset``, ``prompt_ids``,
``completion_ids``, ``sampler``, ``step``, ``checkpoint``, ``call``...).

Exactness. Replay regenerates the logits, so it is byte-identical whenever the model computes the same logits
as at logging time: always with the same weights at the same batch shape on a deterministic backend
(:func:`regenerate_batch` with ``records`` of one logged ``call`` in order). Replaying a row alone
(:func:`regenerate`) changes the batch shape; on CPU the tiny test model still replays exactly (tested), while
GPU kernels whose reduction order depends on batch size or padded length can move logits by an ulp, which flips
a token only when two candidates' keyed scores are within that ulp. Keying removes the sampler's randomness
from the question; what remains is that bounded numerical effect.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from trl_ext._io import read_jsonl, resolve_jsonl
from trl_ext.measurement.keyed_sampling import (
    KeyedGumbelLogitsProcessor,
    SamplerSettings,
    keyed_generate,
    keyed_gumbel,
)

__all__ = [
    "CheckpointDiff",
    "check_model_matches_log",
    "diff_checkpoints",
    "load_rollout_log",
    "regenerate",
    "regenerate_batch",
    "select_records",
]

_REQUIRED = ("key", "sample_index", "prompt_ids", "completion_ids", "sampler")


def _check_record(rec: dict, where: str) -> None:
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: a rollout record must be a JSON object, got {type(rec).__name__}")
    if rec.get("backend") == "vllm":
        raise ValueError(
            f"{where}: this rollout was sampled by vLLM with a per-request seed (request_seed="
            f"{rec.get('request_seed')}); trl-ext replay regenerates with transformers and its keyed Gumbel noise, "
            "so it cannot reproduce vLLM rollouts (see docs/replay.md). Replay it with vLLM and the logged seed."
        )
    missing = [k for k in _REQUIRED if k not in rec]
    if missing:
        raise ValueError(
            f"{where}: rollout record lacks field(s) {missing}; expected a log written by KeyedSampler "
            f"(fields {list(_REQUIRED)})"
        )
    if not rec["prompt_ids"]:
        raise ValueError(f"{where}: prompt_ids is empty")


def load_rollout_log(path: str | os.PathLike) -> list[dict]:
    """Read a keyed rollout log (JSON lines).

    Parameters
    ----------
    path : str or PathLike
        ``<output_dir>/rollouts/rank<r>.jsonl`` (read by :func:`trl_ext._io.read_jsonl`: a ``.gz`` file is gunzipped,
        blank lines are skipped, every other line must be a JSON object).

    Returns
    -------
    list of dict
        One record per non-blank line, in file order.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        On a line that is not a JSON object or lacks a required field (the line number is given), an unreadable
        file, or an empty log.
    """
    path = resolve_jsonl(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"rollout log {path!r} not found; it is written to <output_dir>/rollouts/rank<r>.jsonl")
    records = []
    for n, rec in read_jsonl(path, numbered=True):
        _check_record(rec, f"{path}:{n}")
        records.append(rec)
    if not records:
        raise ValueError(f"rollout log {path!r} holds no records")
    return records


def _parse_key(key) -> int:
    if isinstance(key, bool):
        raise TypeError("key must be an int or a decimal/0x-hex string")
    if isinstance(key, int):
        return key
    if isinstance(key, str):
        try:
            return int(key.strip(), 0)
        except ValueError:
            raise ValueError(f"key {key!r} is not a decimal or 0x-hex integer") from None
    raise TypeError(f"key must be an int or a decimal/0x-hex string, got {type(key).__name__}")


def select_records(records: Sequence[dict], key=None, sample_index: int | None = None) -> list[dict]:
    """Records with the given key (and sample index); all records when ``key`` is None.

    Raises
    ------
    KeyError
        If nothing matches: the message gives the number of records and distinct keys in the log and the
        closest logged keys (by decimal spelling), or the sample indices logged for that key.
    """
    if key is None:
        out = [r for r in records if sample_index is None or r["sample_index"] == sample_index]
        if not out:
            idx = sorted({r["sample_index"] for r in records})
            raise KeyError(f"no record has sample_index={sample_index}; logged sample indices: {idx}")
        return out
    k = _parse_key(key)
    same_key = [r for r in records if int(r["key"]) == k]
    if not same_key:
        keys = sorted({str(int(r["key"])) for r in records})
        close = difflib.get_close_matches(str(k), keys, n=5, cutoff=0.3)
        raise KeyError(
            f"key {k} is not in the log ({len(records)} records, {len(keys)} distinct keys). "
            f"Closest logged keys: {close or keys[:5]}"
        )
    out = [r for r in same_key if sample_index is None or r["sample_index"] == sample_index]
    if not out:
        idx = sorted({r["sample_index"] for r in same_key})
        raise KeyError(f"key {k} has no sample_index={sample_index}; logged sample indices for it: {idx}")
    return out


def _path_parts(name: str) -> list[str]:
    return [p for p in os.path.normpath(name.strip()).replace("\\", "/").split("/") if p not in ("", ".")]


def _same_model(logged: str, candidates: Sequence[str]) -> bool:
    """Whether the logged model name/path plausibly names one of ``candidates`` (the --model path, the loaded
    model's ``config._name_or_path``): equal after normalisation, the same directory on disk, one path (of two or
    more parts) a trailing part of the other (``out/checkpoint-20`` vs ``/abs/out/checkpoint-20``), or a hub id
    ``org/name`` vs a local folder named ``name`` (not for ``checkpoint-<n>`` folders, which every run has)."""
    lp = _path_parts(logged)
    for cand in candidates:
        if not cand:
            continue
        cp = _path_parts(cand)
        if not lp or not cp:
            continue
        if lp == cp:
            return True
        if os.path.exists(logged) and os.path.exists(cand):
            try:
                if os.path.samefile(logged, cand):
                    return True
            except OSError:
                pass
        short, long_ = (lp, cp) if len(lp) <= len(cp) else (cp, lp)
        if len(short) >= 2 and long_[-len(short):] == short:
            return True
        hub_like = (len(lp) == 2 and not os.path.isabs(logged) and not logged.startswith(".")
                    and not os.path.exists(logged) and not re.fullmatch(r"checkpoint-\d+", lp[-1]))
        if hub_like and cp[-1] == lp[-1]:
            return True
    return False


def _vocab_width(model) -> int | None:
    emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if emb is not None and getattr(emb, "weight", None) is not None:
        return int(emb.weight.shape[0])
    v = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(v) if isinstance(v, int) else None


def _model_eos_ids(model) -> set[int]:
    out: set[int] = set()
    for cfg in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        e = getattr(cfg, "eos_token_id", None)
        out.update([int(e)] if isinstance(e, int) else [int(x) for x in (e or []) if isinstance(x, int)])
    return out


def check_model_matches_log(records: Sequence[dict], model, model_path: str | os.PathLike | None = None) -> list[str]:
    """Check that ``model`` is plausibly the checkpoint that generated ``records`` before replaying them.

    What a keyed rollout log stores about its model (``KeyedSampler``): ``checkpoint`` -- the weights that
    generated the rollout (``<output_dir>/checkpoint-<step>``, or at step 0 the start model's ``_name_or_path``) --
    and ``model`` (the start model's ``_name_or_path``), plus the token ids and the sampler's pad/EOS ids. No weight
    fingerprint is logged, so the checks are:

    1. **vocabulary** (an error): a logged token id the model's output layer cannot produce means another model
       family; replaying would fail inside the embedding lookup.
    2. **name** (a warning): ``record["checkpoint"]`` (else ``record["model"]``) against ``model_path`` and
       ``model.config._name_or_path`` (see :func:`_same_model`). A log that names no model (an in-memory model
       without ``_name_or_path``) cannot be checked; that is said too. Records from several checkpoints (several
       steps) cannot all be replayed by one model: also a warning.
    3. **special tokens** (a warning): none of the model's EOS ids is among the logged sampler's EOS ids.

    A name mismatch is only a warning: a copied or renamed checkpoint is the same model. Replay mode itself is the
    decisive check (byte-identical or not).

    Parameters
    ----------
    records : sequence of dict
        Rollout records (:func:`load_rollout_log`, :func:`select_records`).
    model : transformers.PreTrainedModel
    model_path : str or PathLike, optional
        The path or id the model was loaded from (what the user passed).

    Returns
    -------
    list of str
        Warnings (empty when everything matches).

    Raises
    ------
    ValueError
        If a logged token id is outside the model's vocabulary.
    """
    warnings_: list[str] = []
    width = _vocab_width(model)
    if width is not None:
        top = max((max(r["prompt_ids"] + list(r["completion_ids"]) or [0]) for r in records), default=0)
        if top >= width:
            raise ValueError(
                f"the log holds token id {top} but this model's vocabulary has {width} entries: it was written by "
                "another model (family); pass the checkpoint that generated it (the records' 'checkpoint' field)."
            )
    given = os.fspath(model_path) if model_path is not None else None
    name = getattr(getattr(model, "config", None), "_name_or_path", None) or None
    candidates = [c for c in (given, name) if c]
    logged = {}
    for r in records:
        who = r.get("checkpoint") or r.get("model")
        logged.setdefault(who, []).append(r.get("step"))
    named = {k: v for k, v in logged.items() if k}
    if None in logged:
        warnings_.append(
            f"{len(logged[None])} selected record(s) name no model (their 'checkpoint' and 'model' fields are null: the "
            "trainer's model had no config._name_or_path), so trl-ext cannot check that --model is the checkpoint "
            "that generated them."
        )
    if len(named) > 1:
        desc = "; ".join(f"{k!r} (step {sorted(set(v))[0]}{'...' if len(set(v)) > 1 else ''})" for k, v in named.items())
        warnings_.append(
            f"the selected records were generated by {len(named)} different checkpoints ({desc}); one --model can "
            "reproduce only one of them. Select one step with --step."
        )
    shown = given or name or "the given model"
    for who, steps in named.items():
        if candidates and _same_model(who, candidates):
            continue
        where = "" if os.path.exists(who) else " (that path does not exist here; a checkpoint directory exists only if the trainer saved at that step)"
        warnings_.append(
            f"the log says {len(steps)} selected record(s) (step {sorted(set(steps))}) were generated by {who!r}"
            f"{where}, but --model is {shown!r}"
            + (f" (config._name_or_path {name!r})" if name and name != given else "")
            + ": a different model will not reproduce them. Pass the logged checkpoint (ignore this if it is a copy "
            "of the same weights)."
        )
    logged_eos = {int(e) for r in records for e in (r.get("sampler") or {}).get("eos_token_ids") or []}
    model_eos = _model_eos_ids(model)
    if logged_eos and model_eos and not (logged_eos & model_eos):
        warnings_.append(
            f"the log's sampler stopped at EOS ids {sorted(logged_eos)} but this model's EOS ids are {sorted(model_eos)}: "
            "probably another model or tokenizer."
        )
    return warnings_


def _settings(rec: dict) -> SamplerSettings:
    return SamplerSettings.from_dict(rec["sampler"])


def _model_device(model) -> torch.device:
    return next(model.parameters()).device


class _eval_mode:
    """Run a model in eval mode (dropout off) and restore its mode afterwards."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.was_training = self.model.training
        self.model.eval()
        return self.model

    def __exit__(self, *exc):
        self.model.train(self.was_training)
        return False


def regenerate_batch(model, records: Sequence[dict], *, pad_to_multiple_of: int | None = None) -> list[list[int]]:
    """Regenerate several logged rollouts in ONE ``generate`` call, in the given order.

    Pass the records of one logged ``call`` (same ``record["call"]["id"]``, ordered by ``call.row``) to
    reproduce the exact batch shape of logging time.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        The checkpoint the records were generated with (``record["checkpoint"]``). Run in eval mode.
    records : sequence of dict
        Rollout records sharing one :class:`SamplerSettings`.
    pad_to_multiple_of : int, optional
        TRL's ``pad_to_multiple_of`` if it was set at logging time.

    Returns
    -------
    list of list of int
        Regenerated completion ids per record (EOS-truncated like the log).

    Raises
    ------
    ValueError
        On an empty list, malformed records, or records with differing sampler settings.
    """
    if len(records) == 0:
        raise ValueError("no records to regenerate")
    for i, r in enumerate(records):
        _check_record(r, f"record {i}")
    settings = _settings(records[0])
    for i, r in enumerate(records[1:], 1):
        if r["sampler"] != records[0]["sampler"]:
            raise ValueError(f"record {i} has different sampler settings from record 0; regenerate them separately")
    with _eval_mode(model):
        return keyed_generate(
            model,
            [r["prompt_ids"] for r in records],
            [int(r["key"]) for r in records],
            [int(r["sample_index"]) for r in records],
            settings,
            position_offsets=[int(r.get("position_offset", 0)) for r in records],
            pad_to_multiple_of=pad_to_multiple_of,
        )


def regenerate(model, tokenizer, record: dict, *, pad_to_multiple_of: int | None = None) -> list[int]:
    """Reproduce one logged rollout from its key, sample index and prompt under ``model``.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        The checkpoint the record was generated with.
    tokenizer : PreTrainedTokenizerBase or None
        Unused for generation (the record holds token ids and pad/eos ids); accepted for API symmetry with
        :func:`diff_checkpoints` and may be ``None``.
    record : dict
        One rollout record (:func:`load_rollout_log`).
    pad_to_multiple_of : int, optional
        See :func:`regenerate_batch`.

    Returns
    -------
    list of int
        The regenerated completion ids; equal to ``record["completion_ids"]`` when the replay is exact.
    """
    return regenerate_batch(model, [record], pad_to_multiple_of=pad_to_multiple_of)[0]


@dataclass
class CheckpointDiff:
    """Where two checkpoints first decide differently on one keyed rollout.

    Attributes
    ----------
    key, sample_index : int
        The rollout's key.
    completion_a, completion_b : list of int
        Regenerated completions under model A and model B.
    first_divergence : int or None
        First generated position where the tokens differ (``None``: identical). If one completion is a strict
        prefix of the other (possible only with different length caps), the shorter length.
    token_a, token_b : int or None
        The tokens A and B chose there (``None`` where that side has no token).
    text_a, text_b : str or None
        Their decoded forms (when a tokenizer is given).
    logit_margin_a : float or None
        ``z_A[token_a] - z_A[token_b]``: raw logits of model A at the divergence, given the shared prefix
        (how strongly A prefers its own token over B's choice).
    logit_margin_b : float or None
        ``z_B[token_b] - z_B[token_a]``: the same for model B (positive: B prefers its own choice).
    gumbel_gap : float or None
        ``g[token_a] - g[token_b]``, the keyed noise both models saw there.
    race_margin_a : float or None
        ``s_A[token_a] - s_A[token_b]`` with ``s = warp(z) + g`` the keyed race of
        :class:`~trl_ext.measurement.keyed_sampling.KeyedGumbelLogitsProcessor` (repetition penalty, temperature,
        top-k/top-p/min-p, then the noise) under model A: ``>= 0`` because A chose ``token_a``; ``inf`` when A's
        filters removed ``token_b``. Without filters or penalty it equals ``logit_margin_a / T + gumbel_gap``.
    race_margin_b : float or None
        ``s_B[token_b] - s_B[token_a]`` under model B (``>= 0``).
    temperature : float
        ``T`` of the sampler.
    a_matches_log : bool or None
        Whether A's regeneration equals the logged completion (a check that A is the logging checkpoint).
    """

    key: int
    sample_index: int
    completion_a: list[int]
    completion_b: list[int]
    first_divergence: int | None
    token_a: int | None
    token_b: int | None
    text_a: str | None
    text_b: str | None
    logit_margin_a: float | None
    logit_margin_b: float | None
    gumbel_gap: float | None
    race_margin_a: float | None
    race_margin_b: float | None
    temperature: float
    a_matches_log: bool | None

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


def _first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for t, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return t
    if len(a) != len(b):
        return min(len(a), len(b))
    return None


@torch.no_grad()
def _next_logits(model, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids], dtype=torch.long, device=_model_device(model))
    return model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, -1].double().cpu()


def _race(rec: dict, settings: SamplerSettings, prefix: list[int], logits: torch.Tensor, t: int) -> torch.Tensor:
    """The keyed race ``warp(z) + g`` at generated position ``t`` for one row, float64, shape (V,)."""
    ids = torch.tensor([prefix], dtype=torch.long)
    z = logits.float()[None, :]
    if settings.repetition_penalty != 1.0:
        z = RepetitionPenaltyLogitsProcessor(settings.repetition_penalty)(ids, z)
    n_prompt = len(prefix) - t
    proc = KeyedGumbelLogitsProcessor.from_settings(
        [int(rec["key"])], [int(rec["sample_index"])], settings, prompt_length=n_prompt,
        position_offsets=[int(rec.get("position_offset", 0))],
    )  # fmt: skip
    return proc.keyed_scores(ids, z)[0].double()


def _decode(tokenizer, tok):
    if tokenizer is None or tok is None:
        return None
    return tokenizer.decode([tok])


def diff_checkpoints(
    model_a,
    model_b,
    tokenizer,
    records: Iterable[dict],
    *,
    batch_size: int = 1,
    pad_to_multiple_of: int | None = None,
) -> list[CheckpointDiff]:
    """Regenerate the same keys under two checkpoints and report the first diverging token of each.

    Parameters
    ----------
    model_a, model_b : transformers.PreTrainedModel
        The two checkpoints (same tokenizer and vocabulary width). Both run in eval mode.
    tokenizer : PreTrainedTokenizerBase or None
        Used only to decode the two diverging tokens.
    records : iterable of dict
        Rollout records (:func:`load_rollout_log` / :func:`select_records`).
    batch_size : int, default 1
        Records regenerated per ``generate`` call (1 = each alone, the batch-shape-free setting).
    pad_to_multiple_of : int, optional
        See :func:`regenerate_batch`.

    Returns
    -------
    list of CheckpointDiff
        One per record, in order. Margins come from one full forward pass of each model over
        ``prompt + shared prefix`` (no KV cache), in float64.

    Raises
    ------
    ValueError
        If the models' output widths differ, ``batch_size < 1``, or a record is malformed.
    """
    records = list(records)
    if not records:
        raise ValueError("no records to diff")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    va = model_a.get_output_embeddings().weight.shape[0]
    vb = model_b.get_output_embeddings().weight.shape[0]
    if va != vb:
        raise ValueError(f"the checkpoints have different vocabulary widths ({va} vs {vb}); they cannot share keys")
    comp_a, comp_b = [], []
    for s in range(0, len(records), batch_size):
        chunk = records[s : s + batch_size]
        comp_a += regenerate_batch(model_a, chunk, pad_to_multiple_of=pad_to_multiple_of)
        comp_b += regenerate_batch(model_b, chunk, pad_to_multiple_of=pad_to_multiple_of)
    out = []
    for rec, ca, cb in zip(records, comp_a, comp_b):
        settings = _settings(rec)
        t = _first_divergence(ca, cb)
        ta = tb = None
        ma = mb = gap = ra = rb = None
        if t is not None:
            ta = ca[t] if t < len(ca) else None
            tb = cb[t] if t < len(cb) else None
            if ta is not None and tb is not None:
                prefix = list(rec["prompt_ids"]) + ca[:t]
                with _eval_mode(model_a):
                    za = _next_logits(model_a, prefix)
                with _eval_mode(model_b):
                    zb = _next_logits(model_b, prefix)
                g = keyed_gumbel(
                    [int(rec["key"])], [int(rec["sample_index"])], [int(rec.get("position_offset", 0)) + t], za.numel()
                )[0]
                ma = float(za[ta] - za[tb])
                mb = float(zb[tb] - zb[ta])
                gap = float(g[ta] - g[tb])
                sa = _race(rec, settings, prefix, za, t)
                sb = _race(rec, settings, prefix, zb, t)
                ra = float(sa[ta] - sa[tb])
                rb = float(sb[tb] - sb[ta])
        out.append(
            CheckpointDiff(
                key=int(rec["key"]),
                sample_index=int(rec["sample_index"]),
                completion_a=ca,
                completion_b=cb,
                first_divergence=t,
                token_a=ta,
                token_b=tb,
                text_a=_decode(tokenizer, ta),
                text_b=_decode(tokenizer, tb),
                logit_margin_a=ma,
                logit_margin_b=mb,
                gumbel_gap=gap,
                race_margin_a=ra,
                race_margin_b=rb,
                temperature=settings.temperature,
                a_matches_log=ca == list(rec["completion_ids"]),
            )
        )
    return out
