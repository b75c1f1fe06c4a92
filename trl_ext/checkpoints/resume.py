"""Resume that never lies: the configuration a checkpoint was written with, checkpoint validity, atomic writes.

* :func:`config_fingerprint` -- the fields that change what training means, recorded in every ``trl_ext_state.pt``;
  :func:`check_config_changes` compares them on resume and refuses a difference unless the config lists the field
  in ``resume_config_changes`` (then it is applied and logged; :data:`FROZEN_ON_RESUME` fields cannot be accepted,
  the restored optimizer state would silently keep the old value);
* :func:`checkpoint_problem` -- why a ``checkpoint-N`` folder cannot be resumed from (every file it needs is
  parsed: trainer state JSON, extension state, optimizer/scheduler/RNG files, model or adapter weights), and
  :func:`last_valid_checkpoint` -- the newest one without a problem, skipping the others with a warning;
* :func:`atomic_torch_save` and :func:`write_failure` -- trl_ext's own files written through a temporary file and a
  rename, with an error that names the path and says when the disk is full.

Nothing here imports TRL; the trainer calls it from :mod:`trl_ext.trainers.base` (:func:`run_identity`,
:func:`check_resumed_config`, :func:`resolve_resume_checkpoint`). Behaviour per field: ``docs/bad_input.md``
("Resume").
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import struct
import warnings
import zipfile
from dataclasses import fields
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["FINGERPRINT_TRL_FIELDS", "FROZEN_ON_RESUME", "IDENTITY_FIELDS", "config_fingerprint",
           "fingerprint_field_names", "check_config_changes", "apply_learning_rate_change", "checkpoint_problem",
           "last_valid_checkpoint", "atomic_torch_save", "write_failure", "check_output_dir_writable", "run_identity",
           "check_resumed_config", "resolve_resume_checkpoint"]

#: TRL / transformers fields that change what a training step means (the rest -- logging, saving, hub, dataloader
#: and reporting options, ``max_steps`` / ``num_train_epochs`` -- may change on resume freely).
FINGERPRINT_TRL_FIELDS = (
    "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio", "optim",
    "optim_args", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
    "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "generation_batch_size",
    "steps_per_generation", "num_iterations", "max_completion_length", "temperature", "top_p", "top_k", "min_p",
    "repetition_penalty", "loss_type", "scale_rewards", "beta", "epsilon", "epsilon_high", "delta",
    "importance_sampling_level", "reward_weights", "multi_objective_aggregation", "mask_truncated_completions",
    "top_entropy_quantile", "seed",
)

#: Fields whose new value the restored optimizer state would overwrite (``torch.optim.Optimizer.load_state_dict``
#: restores every param-group hyper-parameter): a change is refused even when listed in ``resume_config_changes``.
FROZEN_ON_RESUME = frozenset({"optim", "optim_args", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
                              "pair_head_lr"})

#: Entries that describe the run rather than a config field (filled by the trainer's ``ext_config_identity``).
IDENTITY_FIELDS = ("model", "adapter", "reward_funcs", "num_processes", "value_prior", "value_table_sha256")

#: trl_ext config fields that only change what is logged or how the run is operated.
_NOT_FINGERPRINTED = frozenset({
    "log_shut_gate", "gate_success_threshold", "gate_atol", "log_rollout_metadata", "keyed_sampling_log",
    "resume_config_changes", "save_on_preemption", "preemption_exit_code", "v05_check_buffer_sync",
    "pair_summary_last_k", "basis_strict_table_check", "basis_allow_sampling_mismatch",
})


def _trl_ext_fields(config_cls: type) -> list[str]:
    """Dataclass fields declared by trl_ext classes in ``config_cls``'s MRO (ExtGRPOConfig and the method configs)."""
    own = set()
    for cls in config_cls.__mro__:
        if cls.__module__.split(".")[0] == "trl_ext":
            own |= set(getattr(cls, "__annotations__", {}))
    return [f.name for f in fields(config_cls) if f.name in own and f.name not in _NOT_FINGERPRINTED]


def fingerprint_field_names(config_cls: type) -> set[str]:
    """Every name ``resume_config_changes`` may list for a config of class ``config_cls``."""
    return set(FINGERPRINT_TRL_FIELDS) | set(_trl_ext_fields(config_cls)) | set(IDENTITY_FIELDS)


def _json_value(value: Any) -> Any:
    """A JSON-comparable form of a config value (enums by value, callables and objects by name)."""
    if hasattr(value, "value") and type(value).__module__ != "builtins":  # enums (lr_scheduler_type, optim)
        value = value.value
    return json.loads(json.dumps(value, sort_keys=True, default=lambda o: getattr(o, "__name__", repr(o))))


def config_fingerprint(args: Any, identity: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``args`` that change what training means, plus the run's ``identity`` entries.

    Parameters
    ----------
    args : GRPOConfig
        The trainer's config (any trl_ext config class).
    identity : dict
        :data:`IDENTITY_FIELDS` entries from the trainer (model and adapter identity, reward function names,
        number of processes, value table hash); ``None`` values are kept (they compare too).

    Returns
    -------
    dict
        JSON-safe ``{name: value}``; saved as JSON text in ``trl_ext_state.pt``.
    """
    names = [n for n in FINGERPRINT_TRL_FIELDS if hasattr(args, n)] + _trl_ext_fields(type(args))
    out = {n: _json_value(getattr(args, n)) for n in names}
    out.update({k: _json_value(v) for k, v in identity.items()})
    return out


def check_config_changes(saved: dict[str, Any] | None, current: dict[str, Any], accepted: list[str],
                         checkpoint: str) -> dict[str, tuple[Any, Any]]:
    """Compare the fingerprint a checkpoint recorded with the resuming run's; refuse what was not accepted.

    Parameters
    ----------
    saved : dict or None
        The checkpoint's fingerprint (``None``: a checkpoint written before fingerprints, or by plain TRL; a warning
        says that nothing can be checked).
    current : dict
        :func:`config_fingerprint` of the resuming run.
    accepted : list of str
        ``resume_config_changes``: fields allowed to differ.
    checkpoint : str
        The folder (for the messages).

    Returns
    -------
    dict
        ``{field: (old, new)}`` of the accepted differences (the caller applies and logs them).

    Raises
    ------
    ValueError
        When a field differs and is not accepted, or a :data:`FROZEN_ON_RESUME` field differs; the message lists
        old and new values and the one-line way to accept them.
    """
    if saved is None:
        warnings.warn(f"{checkpoint} records no configuration (written by plain TRL or an earlier trl_ext): changed "
                      "settings cannot be checked on this resume.", stacklevel=3)
        return {}
    diffs = {k: (saved[k], current[k]) for k in sorted(set(saved) & set(current)) if saved[k] != current[k]}
    frozen = {k: v for k, v in diffs.items() if k in FROZEN_ON_RESUME}
    refused = {k: v for k, v in diffs.items() if k not in accepted and k not in frozen}
    if not frozen and not refused:
        return diffs

    def lines(d):
        return "\n".join(f"  {k}: {old!r} (checkpoint) -> {new!r} (now)" for k, (old, new) in d.items())

    parts = [f"Resuming from {checkpoint} with a configuration that differs from the one it was written with."]
    if refused:
        names = sorted(refused)
        parts.append(f"Refused (not listed in resume_config_changes):\n{lines(refused)}\nTo apply the new values "
                     f"from the resumed step, set resume_config_changes={names!r} (command line: "
                     f"--resume_config_changes {' '.join(names)}); to resume as before, restore the old values.")
    if frozen:
        parts.append(f"Cannot change on resume (the restored optimizer state keeps the old value):\n{lines(frozen)}\n"
                     "Restore the old values, or start a new run (a new output_dir) from the checkpoint's weights.")
    raise ValueError("\n".join(parts))


def apply_learning_rate_change(optimizer: Any, scheduler: Any, old: float, new: float) -> None:
    """Rescale a restored optimizer and scheduler from learning rate ``old`` to ``new`` (both restored from the
    checkpoint would otherwise keep ``old``: ``Optimizer.load_state_dict`` restores each group's ``lr`` and
    ``LRScheduler.load_state_dict`` its ``base_lrs``).

    Every param group's current ``lr``, ``initial_lr`` and the scheduler's ``base_lrs`` / last logged rate are
    multiplied by ``new / old``, so the schedule continues from the resumed step at the new peak rate and a
    trainer-specific factor (PAIR's ``sqrt(pair_budget_ratio)``) is kept.
    """
    if not (old and new) or old == new:
        return
    ratio = float(new) / float(old)
    for group in getattr(optimizer, "param_groups", []):
        group["lr"] = group["lr"] * ratio
        if "initial_lr" in group:
            group["initial_lr"] = group["initial_lr"] * ratio
    sched = getattr(scheduler, "scheduler", scheduler)  # accelerate's AcceleratedScheduler wraps the torch one
    if sched is not None and hasattr(sched, "base_lrs"):
        sched.base_lrs = [lr * ratio for lr in sched.base_lrs]
        if hasattr(sched, "_last_lr"):
            sched._last_lr = [g["lr"] for g in optimizer.param_groups]


def run_identity(model: Any, reward_func_names: list[str], num_processes: int, strategy: Any) -> dict[str, Any]:
    """The :data:`IDENTITY_FIELDS` of a run: the model (``name_or_path``) and adapter (PEFT type, rank, alpha,
    dropout, target modules), the reward function names, the number of processes, V0.5's value-prior class and the
    value table's row hash (BASIS's table or V0.5's table prior; ``content_hash`` is computed once and cached on the
    table)."""
    adapter = None
    peft = getattr(model, "peft_config", None)
    if isinstance(peft, dict):
        keep = ("peft_type", "r", "lora_alpha", "lora_dropout", "target_modules", "modules_to_save")
        adapter = {}
        for name, cfg in sorted(peft.items()):
            d = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(vars(cfg))
            adapter[name] = {k: (sorted(d[k]) if isinstance(d.get(k), set | list | tuple) else d.get(k))
                             for k in keep if k in d}
    out = {"model": getattr(getattr(model, "config", None), "_name_or_path", None), "adapter": adapter,
           "reward_funcs": list(reward_func_names), "num_processes": int(num_processes)}
    prior = getattr(strategy, "prior", None)
    if prior is not None:
        out["value_prior"] = type(prior).__name__
    table = getattr(strategy, "table", None) or getattr(prior, "table", None)
    if table is not None and hasattr(table, "content_hash"):
        if getattr(table, "_trl_ext_rows_sha256", None) is None:
            table._trl_ext_rows_sha256 = table.content_hash
        out["value_table_sha256"] = table._trl_ext_rows_sha256
    return out


def check_resumed_config(state: Any, current: dict[str, Any], args: Any, optimizer: Any, scheduler: Any,
                         checkpoint: str, global_step: int) -> dict[str, tuple[Any, Any]]:
    """:func:`check_config_changes` on a loaded ``trl_ext_state.pt``, then the accepted changes applied (the learning
    rate rescaled in the restored optimizer and scheduler) and logged. Returns the accepted ``{field: (old, new)}``."""
    saved = state.get("config_fingerprint") if isinstance(state, dict) else None
    saved = json.loads(saved) if saved else None
    route = getattr(args, "method_route", None)
    if saved and route and (saved.get("advantage_estimator"), saved.get("rollout_strategy")) == ("grpo", None):
        # a method config's checkpoint written before method configs carried their route in these two fields
        # (they read "grpo" / None and meant the method's): the same run
        saved = {**saved, "advantage_estimator": route[0], "rollout_strategy": route[1]}
    accepted = check_config_changes(saved, current, list(args.resume_config_changes), checkpoint)
    if "learning_rate" in accepted:
        apply_learning_rate_change(optimizer, scheduler, *accepted["learning_rate"])
    if accepted:
        lines = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in accepted.items())
        logger.warning("Resuming from %s with accepted configuration changes (resume_config_changes): %s; they apply "
                       "from step %d on.", checkpoint, lines, global_step + 1)
    return accepted


def resolve_resume_checkpoint(value: Any, output_dir: str, prefix: str = "checkpoint") -> Any:
    """``Trainer.train``'s ``resume_from_checkpoint`` with every checkpoint checked before use: ``True`` -> the newest
    valid folder (:func:`last_valid_checkpoint`); a path with a :func:`checkpoint_problem` -> ``ValueError`` naming the
    file; anything else unchanged."""
    if value is True:
        return last_valid_checkpoint(output_dir, prefix)
    if isinstance(value, str | os.PathLike):
        path = os.fspath(value)
        problem = checkpoint_problem(path) if os.path.isdir(path) else "it is not a directory"
        if problem:
            raise ValueError(f"Cannot resume from {path}: {problem}. Pass another checkpoint, or "
                             "resume_from_checkpoint=True for the newest complete one.")
    return value


# ---------------------------------------------------------------------------------------------- checkpoint validity
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors",
                 "adapter_model.bin", "pytorch_model.bin", "pytorch_model.bin.index.json")
_SMALL = 64 * 2**20  # torch zip files below this size are CRC-checked in full; larger ones structurally


def _torch_file_problem(path: str) -> str | None:
    """Why a ``torch.save`` file (a zip archive) is unreadable, or ``None``; cheap for large files (the zip's
    central directory, at the end, is what a truncated write loses)."""
    try:
        with zipfile.ZipFile(path) as z:
            if os.path.getsize(path) <= _SMALL:
                bad = z.testzip()
                if bad is not None:
                    return f"{os.path.basename(path)} is damaged (bad CRC in {bad})"
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        return f"{os.path.basename(path)} is truncated or not a torch file ({type(e).__name__}: {e})"
    return None


def _safetensors_problem(path: str) -> str | None:
    """Why a safetensors file is unreadable: its header must parse and its size match the tensors it declares."""
    name = os.path.basename(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{name} is truncated ({size} bytes)"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return f"{name} is truncated (header of {n} bytes, file of {size})"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        return f"{name} has an unreadable header ({type(e).__name__}: {e})"
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if size != 8 + n + end:
        return f"{name} is truncated or damaged ({size} bytes, its header declares {8 + n + end})"
    return None


def checkpoint_problem(folder: str) -> str | None:
    """Why ``folder`` (a ``checkpoint-N`` directory) cannot be resumed from, or ``None`` when every file it needs
    parses: ``trainer_state.json`` (JSON), ``trl_ext_state.pt`` when present (loads), every other ``*.pt`` /
    ``*.pth`` / ``*.bin`` torch file (zip structure; CRC too below 64 MiB), every ``*.safetensors`` file (header
    and size), an index's shards, model or adapter weights and optimizer state present (DeepSpeed's
    ``global_step*`` and FSDP's sharded folders are accepted as they are)."""
    import torch

    names = set(os.listdir(folder))
    state = os.path.join(folder, "trainer_state.json")
    if "trainer_state.json" not in names:
        return "no trainer_state.json (a save was interrupted)"
    try:
        with open(state, encoding="utf-8") as f:
            json.load(f)
    except (OSError, ValueError) as e:
        return (f"trainer_state.json does not parse ({type(e).__name__}: {e}; {os.path.getsize(state)} bytes): "
                "cut by a full disk or a crash during the save")
    sharded = any(n.startswith(("global_step", "pytorch_model_fsdp", "optimizer_")) for n in names)
    if not sharded and not any(n in names for n in _WEIGHT_FILES) \
            and not any(re.match(r"model-\d+-of-\d+\.safetensors$", n) for n in names):
        return "no model or adapter weights (model.safetensors / adapter_model.safetensors)"
    if not sharded and not any(n.startswith("optimizer.") for n in names):
        return "no optimizer state (optimizer.pt): resuming would restart the optimizer"
    for name in sorted(names):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        if name == "trl_ext_state.pt":
            try:
                torch.load(path, map_location="cpu", weights_only=True)
            except Exception as e:  # noqa: BLE001 - any failure to load makes the checkpoint unusable
                return f"trl_ext_state.pt does not load ({type(e).__name__}: {str(e)[:200]})"
        elif name.endswith((".pt", ".pth", ".bin")):
            problem = _torch_file_problem(path)
            if problem:
                return problem
        elif name.endswith(".safetensors"):
            problem = _safetensors_problem(path)
            if problem:
                return problem
        elif name.endswith(".index.json"):
            try:
                with open(path, encoding="utf-8") as f:
                    shards = set(json.load(f)["weight_map"].values())
            except (OSError, ValueError, KeyError, AttributeError) as e:
                return f"{name} does not parse ({type(e).__name__}: {e})"
            missing = sorted(s for s in shards if s not in names)
            if missing:
                return f"{name} names missing shard(s) {missing}"
    return None


def last_valid_checkpoint(output_dir: str, prefix: str = "checkpoint") -> str:
    """The newest ``{prefix}-N`` folder of ``output_dir`` without a :func:`checkpoint_problem`; each newer one is
    skipped with a warning naming the file and the reason.

    Raises
    ------
    ValueError
        When no folder qualifies (listing the ones skipped and why).
    """
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)$")
    found = []
    if os.path.isdir(output_dir):
        for name in os.listdir(output_dir):
            m = pattern.match(name)
            if m and os.path.isdir(os.path.join(output_dir, name)):
                found.append((int(m.group(1)), os.path.join(output_dir, name)))
    skipped = []
    for _, path in sorted(found, reverse=True):
        problem = checkpoint_problem(path)
        if problem is None:
            if skipped:
                warnings.warn("Skipping unusable checkpoint folder(s): " + "; ".join(f"{p}: {why}" for p, why in skipped)
                              + f". Resuming from {path}. Delete the skipped folders to silence this warning.",
                              stacklevel=3)
            return path
        skipped.append((path, problem))
    raise ValueError(f"No complete checkpoint (a {prefix}-N folder whose files all parse) found in {output_dir}"
                     + ("; skipped: " + "; ".join(f"{p}: {why}" for p, why in skipped) if skipped else "") + ".")


# ---------------------------------------------------------------------------------------------------- writing files
def _disk_full(exc: BaseException, folder: str) -> tuple[bool, int | None]:
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    full = getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(exc) \
        or "unexpected pos" in str(exc) or (free is not None and free < 2**20)
    return full, free


def write_failure(path: str, exc: BaseException) -> OSError:
    """The ``OSError`` to raise when writing ``path`` failed with ``exc``: it names the path and, when the device
    is full (``ENOSPC``, torch's ``unexpected pos`` from a short write, or under 1 MiB free), says so."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    while folder and not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    full, free = _disk_full(exc, folder)
    if full:
        msg = (f"Could not write {path}: the disk is full ({free if free is not None else '?'} bytes free on the "
               f"device holding {folder}). Free space or point output_dir at another disk; earlier checkpoints are "
               f"intact. ({type(exc).__name__}: {str(exc)[:200]})")
        return OSError(errno.ENOSPC, msg)
    return OSError(getattr(exc, "errno", None) or errno.EIO, f"Could not write {path}: {type(exc).__name__}: {exc}")


def atomic_torch_save(obj: Any, path: str) -> None:
    """``torch.save(obj, path)`` through ``path + '.tmp'`` and a rename: a crash leaves no file or a whole one, and
    a failed write (disk full included) removes the temporary file and raises :func:`write_failure`'s error."""
    import torch

    tmp = path + ".tmp"
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise write_failure(path, e) from e


def check_output_dir_writable(output_dir: str) -> None:
    """Refuse, at construction, an ``output_dir`` that checkpoints could not be written to (read-only, not a
    directory, or an unwritable parent when it does not exist yet) -- instead of failing at the first save, after
    those steps were computed. Creates nothing."""
    path = os.path.abspath(output_dir)
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"output_dir={output_dir!r} exists and is not a directory: checkpoints cannot be written "
                         "there. Pass a directory path.")
    if not os.path.isdir(probe):
        raise ValueError(f"output_dir={output_dir!r} cannot be created: {probe} is not a directory. Pass a "
                         "directory path.")
    import tempfile

    try:  # a real write: os.access says yes to root on a read-only mount's files and to root everywhere
        fd, tmp = tempfile.mkstemp(prefix=".trl_ext_write_check_", dir=probe)
        os.close(fd)
        os.remove(tmp)
    except OSError as e:
        what = "is not writable" if probe == path else f"cannot be created: {probe} is not writable"
        raise ValueError(f"output_dir={output_dir!r} {what} ({e.strerror or e}), so no checkpoint or model could be "
                         "saved. Pass a writable output_dir (or fix the permissions) before training.") from None
