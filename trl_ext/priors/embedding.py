"""An in-context value prior in the spirit of V0: frozen embeddings + a head fitted on the context at query time.

V0 ("V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts", arXiv:2603.10848, "The V0 Value Model:
Architecture and Training") is a frozen embedding backbone, a trained query adapter and a TabPFN in-context head.
:class:`EmbeddingInContextPrior` keeps the frozen backbone and the in-context head but needs no pre-training: the
head (:mod:`trl_ext.priors.heads`) is fitted on the context set :math:`C_\\pi` sampled from the
:class:`~trl_ext.priors.SupportBuffer` each step (Workflow Step 1) and calibrated on it (leave-one-out /
cross-validated log-loss), so it shrinks to the context success rate when the embeddings carry no signal. Its output
:math:`p` becomes :math:`V = 2p - 1` for the fusion of Eq. 6-9.
"""

from __future__ import annotations

import copy as _copy
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .base import Prompt, ValuePrior, prompt_text
from .heads import InContextHead, KernelHead, LogisticHead, TabPFNHead, jeffreys_mean
from .table_format import prompt_key

__all__ = ["EmbeddingInContextPrior", "hf_mean_pool_embedder", "model_footprint"]

_HEADS = ("kernel", "logistic", "tabpfn")


def model_footprint(model: Any) -> dict:
    """Memory held by ``model``: ``{"parameters": n, "bytes": b}``.

    Counts every distinct parameter storage once (tied weights are one storage) and adds the buffers' bytes; this is
    what a :func:`copy.deepcopy` of the model allocates.
    """
    seen: set[int] = set()
    n_params = n_bytes = 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        n_params += p.numel()
        n_bytes += p.numel() * p.element_size()
    for b in model.buffers():
        if b.data_ptr() not in seen:
            seen.add(b.data_ptr())
            n_bytes += b.numel() * b.element_size()
    return {"parameters": int(n_params), "bytes": int(n_bytes)}


def _detach_forward_patches(copy_: Any, original: Any) -> list[str]:
    """Drop instance-level ``forward`` patches of ``copy_`` that still call into ``original``.

    :func:`copy.deepcopy` rebinds a patched bound method to the copy but not the closure of its function: TRL 1.16's
    fused LM head (``trl.trainer.utils.add_fused_lm_head``) stores ``model.forward = MethodType(_fused_forward,
    model)`` whose closure holds the *original* model's bound ``forward``, so a deep copy of a policy the trainer has
    patched silently runs the live policy. Such patches (a closure cell holding a method bound to a module of
    ``original``) are removed from the copy, which falls back to its class's ``forward``. Returns the names of the
    modules fixed.
    """
    import types

    originals = {id(m) for m in original.modules()}
    fixed = []
    for name, m in copy_.named_modules():
        f = m.__dict__.get("forward")
        if not isinstance(f, types.MethodType):
            continue
        cells = f.__func__.__closure__ or ()
        for cell in cells:
            try:
                v = cell.cell_contents
            except ValueError:  # empty cell
                continue
            if isinstance(v, types.MethodType) and id(v.__self__) in originals:
                del m.__dict__["forward"]
                fixed.append(name or "<root>")
                break
    return fixed


def hf_mean_pool_embedder(
    model: Any,
    tokenizer: Any,
    batch_size: int = 32,
    max_length: int = 512,
    *,
    device: Any = None,
    copy: bool = True,
    context: Callable[[], Any] | None = None,
    pad_to_multiple_of: int = 32,
) -> Callable[[list[str]], np.ndarray]:
    """Build ``embed(texts) -> (n, d)`` from a Hugging Face causal LM: mean of the last hidden states over tokens.

    **Batch invariance.** A text's embedding depends on the text only, never on the other texts of the call (so a
    prompt gets bitwise the same vector whatever batch, order, cache state or number of processes it is embedded in;
    this is what makes V0.5 runs bit-identical after a resume and across process counts). Each text is right-padded
    to a width that depends on its own token count ``L`` only -- ``ceil(L / pad_to_multiple_of) *
    pad_to_multiple_of`` -- texts of the same width are grouped, and **every forward pass has exactly
    ``batch_size`` rows** (a short chunk is filled with copies of one of its rows, whose outputs are discarded). Every
    forward that computes a given text therefore has the same shape, and a text's row only sees itself (attention
    mask, right padding, positions ``0..L-1``). ``batch_size=1`` embeds each text alone without any padding.

    The model is frozen: with ``copy=True`` (default) a deep copy is taken first, so passing the policy that is about
    to be trained gives a frozen snapshot of the *starting* policy (the copy's parameters are set to
    ``requires_grad=False``, it is put in eval mode, and instance-level ``forward`` patches that would still call the
    original model -- e.g. TRL's fused LM head -- are dropped from the copy, see :func:`_detach_forward_patches`).
    The copy costs the model's memory again; its size is in ``embed.backbone["parameters"]`` /
    ``embed.backbone["bytes"]``. With ``copy=False`` the model is used as is, without changing its parameters:
    every call runs under ``torch.inference_mode`` with the model (and all its submodules) temporarily in eval mode,
    their training flags restored afterwards -- for a model that is frozen already, or with ``context`` for one whose
    frozen part can be selected (a PEFT model's base weights: ``context=peft_model.disable_adapter``).

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Anything returning ``hidden_states`` with ``output_hidden_states=True`` (causal LMs, encoders, PEFT models).
    tokenizer : transformers tokenizer
        Used without its padding side or pad token: sequences are padded manually (pad id: ``pad_token_id``, else
        ``eos_token_id``, else 0; padded positions are masked out).
    batch_size : int >= 1
        Rows of every forward pass (see batch invariance above).
    max_length : int >= 1
        Longer prompts are truncated to their first ``max_length`` tokens.
    device : torch.device or str, optional
        Default: the device of the model's first parameter at call time.
    copy : bool
        Deep-copy the model before freezing it (False: embed with ``model`` itself, see above).
    context : callable, optional
        Zero-argument callable returning a context manager entered around every forward pass, e.g.
        ``peft_model.disable_adapter`` to embed with the frozen base weights of a LoRA policy without copying them.
    pad_to_multiple_of : int >= 1
        Width granularity of the padding (ignored with ``batch_size=1``).

    Returns
    -------
    callable
        ``embed(texts: list[str]) -> numpy.ndarray`` of shape ``(len(texts), hidden_size)``, float32, in input order.
        Attribute ``embed.backbone``: ``{"model": the module used, "copied": bool, "parameters": int, "bytes": int}``
        (``parameters`` / ``bytes`` of the copy, 0 when nothing was copied).

    Raises
    ------
    ValueError
        Bad ``batch_size`` / ``max_length`` / ``pad_to_multiple_of``; (from ``embed``) a text that tokenizes to zero
        tokens.
    """
    _check_embedder_args(batch_size, max_length, pad_to_multiple_of, context)
    frozen, backbone = _frozen_backbone(model, copy, device)
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0

    def embed(texts: list[str]) -> np.ndarray:
        return _embed_texts(frozen, tokenizer, texts, batch_size=batch_size, max_length=max_length, device=device,
                            copy=copy, context=context, pad_to_multiple_of=pad_to_multiple_of, pad_id=pad_id)

    embed.backbone = backbone
    return embed


def _check_embedder_args(batch_size, max_length, pad_to_multiple_of, context) -> None:
    """The settings of :func:`hf_mean_pool_embedder` (``ValueError`` / ``TypeError`` naming the bad one)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"hf_mean_pool_embedder: batch_size must be an int >= 1, got {batch_size!r}.")
    if not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"hf_mean_pool_embedder: max_length must be an int >= 1, got {max_length!r}.")
    if not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1:
        raise ValueError(f"hf_mean_pool_embedder: pad_to_multiple_of must be an int >= 1, got {pad_to_multiple_of!r}.")
    if context is not None and not callable(context):
        raise TypeError("hf_mean_pool_embedder: context must be a zero-argument callable returning a context manager.")


def _frozen_backbone(model: Any, copy: bool, device: Any) -> tuple[Any, dict]:
    """The module that embeds (a frozen deep copy, or ``model`` itself) and the ``embed.backbone`` record."""
    if copy:
        frozen = _copy.deepcopy(model)
        _detach_forward_patches(frozen, model)
        frozen.eval()
        for p in frozen.parameters():
            p.requires_grad_(False)
        if device is not None:
            frozen.to(device)
        return frozen, {"model": frozen, "copied": True, **model_footprint(frozen)}
    return model, {"model": model, "copied": False, "parameters": 0, "bytes": 0}


def _pad_width(n: int, batch_size: int, pad_to_multiple_of: int) -> int:
    """The padded width of a text of ``n`` tokens: its own count rounded up (``n`` itself with ``batch_size=1``)."""
    return n if batch_size == 1 else -(-n // pad_to_multiple_of) * pad_to_multiple_of


def _forward_chunk(frozen, rows: list[list[int]], w: int, dev, *, batch_size: int, pad_id: int, context) -> np.ndarray:
    """Mean-pooled last hidden states of ``rows`` (token ids) right-padded to width ``w``, in one forward pass of
    exactly ``batch_size`` rows (a short chunk is filled with copies of its first row, whose outputs are dropped)."""
    import contextlib

    import torch

    n_real = len(rows)
    rows = rows + [rows[0]] * (batch_size - n_real) if batch_size > 1 else rows
    inp = torch.full((len(rows), w), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), w), dtype=torch.long)
    for r, t in enumerate(rows):
        inp[r, : len(t)] = torch.tensor(t, dtype=torch.long)
        mask[r, : len(t)] = 1
    inp, mask = inp.to(dev), mask.to(dev)
    ctx = context() if context is not None else contextlib.nullcontext()
    with ctx:
        hs = frozen(input_ids=inp, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
    m = mask.unsqueeze(-1).to(hs.dtype)
    return ((hs * m).sum(1) / m.sum(1)).float().cpu().numpy()[:n_real]


def _embed_texts(frozen, tokenizer, texts, *, batch_size: int, max_length: int, device, copy: bool, context,
                 pad_to_multiple_of: int, pad_id: int) -> np.ndarray:
    """The ``embed(texts)`` of :func:`hf_mean_pool_embedder`: texts bucketed by padded width, each bucket embedded in
    forward passes of ``batch_size`` rows under ``torch.inference_mode`` (with ``copy=False`` the modules' training
    flags are restored afterwards)."""
    import torch

    if isinstance(texts, str):
        raise TypeError("embed expects a list of strings, not a single string.")
    texts = list(texts)
    if not texts:
        raise ValueError("embed: no texts given.")
    ids = tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length)["input_ids"]
    empty = [i for i, t in enumerate(ids) if len(t) == 0]
    if empty:
        raise ValueError(f"embed: texts at positions {empty[:5]} tokenize to zero tokens; give non-empty prompts.")
    dev = device if device is not None else next(frozen.parameters()).device
    buckets: dict[int, list[int]] = {}
    for i, t in enumerate(ids):
        buckets.setdefault(_pad_width(len(t), batch_size, pad_to_multiple_of), []).append(i)
    out: list[np.ndarray | None] = [None] * len(texts)
    modes = None if copy else [(m, m.training) for m in frozen.modules()]
    try:
        if modes is not None:
            frozen.eval()
        with torch.inference_mode():
            for w in sorted(buckets):
                idx = buckets[w]
                for s in range(0, len(idx), batch_size):
                    part = idx[s : s + batch_size]
                    pooled = _forward_chunk(frozen, [ids[i] for i in part], w, dev, batch_size=batch_size,
                                            pad_id=pad_id, context=context)
                    for r, i in enumerate(part):
                        out[i] = pooled[r]
    finally:
        if modes is not None:
            for m, was in modes:
                m.training = was
    return np.stack(out).astype(np.float32)


class EmbeddingInContextPrior(ValuePrior):
    """Frozen prompt embeddings + an in-context probabilistic head fitted on the context at query time.

    Parameters
    ----------
    embed_fn : callable
        ``embed(list[str]) -> array (n, d)``; e.g. :func:`hf_mean_pool_embedder` or any sentence-embedding model.
    head : {"kernel", "logistic", "tabpfn"} or InContextHead
        ``"kernel"`` (default): :class:`~trl_ext.priors.heads.KernelHead`; ``"logistic"``:
        :class:`~trl_ext.priors.heads.LogisticHead`; ``"tabpfn"``: :class:`~trl_ext.priors.heads.TabPFNHead`
        (needs the ``tabpfn`` package and ``tabpfn_model_path``; never downloads). An instance is used as is.
    head_kwargs : dict, optional
        Options of the head class (e.g. ``{"kernel": "rbf"}``, ``{"l2_grid": [1.0]}``,
        ``{"model_path": ...}``).
    tabpfn_model_path : str, optional
        Shortcut for ``head_kwargs["model_path"]`` with ``head="tabpfn"``.
    empty_context_probability : float in [0, 1]
        Returned for every target when the context is empty (cold start); default 0.5 (``V = 0``).
    min_context : int >= 2
        With ``0 < N < min_context`` context pairs, or when all context outcomes are equal (a degenerate context,
        nothing to discriminate), every target gets the context's Beta(1/2, 1/2) posterior mean
        :math:`(\\sum y + 1/2)/(N + 1)` (see :func:`~trl_ext.priors.heads.jeffreys_mean`), without embedding.
    cache_size : int >= 0
        Bounded LRU cache of embeddings keyed by prompt (0 disables caching).
    text_fn : callable, optional
        Prompt -> text fed to ``embed_fn``; default :func:`~trl_ext.priors.base.prompt_text` (conversations are
        rendered as ``role: content`` lines).

    Attributes
    ----------
    last_info : dict
        ``{"mode": "empty" | "degenerate" | "head", "n_context": N, **head.last_fit}`` of the last call.
    cache_hits, cache_misses : int
    """

    def __init__(
        self,
        embed_fn: Callable[[list[str]], Any],
        *,
        head: str | InContextHead = "kernel",
        head_kwargs: dict | None = None,
        tabpfn_model_path: str | None = None,
        empty_context_probability: float = 0.5,
        min_context: int = 4,
        cache_size: int = 8192,
        text_fn: Callable[[Prompt], str] = prompt_text,
    ):
        if not callable(embed_fn):
            raise TypeError(f"EmbeddingInContextPrior: embed_fn must be callable, got {type(embed_fn).__name__}.")
        if not (np.isfinite(empty_context_probability) and 0.0 <= empty_context_probability <= 1.0):
            raise ValueError(
                f"EmbeddingInContextPrior: empty_context_probability must be in [0, 1], got {empty_context_probability}."
            )
        if not isinstance(min_context, int) or min_context < 2:
            raise ValueError(f"EmbeddingInContextPrior: min_context must be an int >= 2, got {min_context!r}.")
        if not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"EmbeddingInContextPrior: cache_size must be an int >= 0, got {cache_size!r}.")
        kw = dict(head_kwargs or {})
        if isinstance(head, InContextHead):
            if kw or tabpfn_model_path:
                raise ValueError("EmbeddingInContextPrior: head_kwargs/tabpfn_model_path only apply to a head name.")
            self.head = head
        elif head == "kernel":
            self.head = KernelHead(**kw)
        elif head == "logistic":
            self.head = LogisticHead(**kw)
        elif head == "tabpfn":
            if tabpfn_model_path is not None:
                kw.setdefault("model_path", tabpfn_model_path)
            self.head = TabPFNHead(**kw)
        else:
            raise ValueError(f"EmbeddingInContextPrior: head must be one of {_HEADS} or an InContextHead, got {head!r}.")
        self.embed_fn = embed_fn
        self.empty_context_probability = float(empty_context_probability)
        self.min_context = min_context
        self.cache_size = cache_size
        self.text_fn = text_fn
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._dim: int | None = None
        self.cache_hits = 0
        self.cache_misses = 0
        self.last_info: dict = {}
        self.name = f"EmbeddingInContextPrior(head={self.head.name})"

    def embed(self, prompts: Sequence[Prompt]) -> np.ndarray:
        """Embeddings ``(len(prompts), d)`` float64, through the LRU cache; ``embed_fn`` is called once for the
        misses (deduplicated).

        Raises
        ------
        ValueError
            If ``embed_fn`` returns the wrong shape, NaN/inf, or a dimension that differs from earlier calls.
        """
        texts = [self.text_fn(p) for p in prompts]
        keys = [prompt_key(t, 32) for t in texts]
        found: dict[str, np.ndarray] = {}
        todo: dict[str, str] = {}
        for k, t in zip(keys, texts):
            if k in found or k in todo:
                continue
            if k in self._cache:
                self._cache.move_to_end(k)
                found[k] = self._cache[k]
                self.cache_hits += 1
            else:
                todo[k] = t
        if todo:
            self.cache_misses += len(todo)
            raw = self.embed_fn(list(todo.values()))
            if hasattr(raw, "detach"):
                raw = raw.detach().float().cpu().numpy()
            E = np.asarray(raw, dtype=np.float64)
            if E.ndim != 2 or E.shape[0] != len(todo):
                raise ValueError(f"{self.name}: embed_fn returned shape {E.shape}; expected ({len(todo)}, d).")
            if not np.all(np.isfinite(E)):
                raise ValueError(f"{self.name}: embed_fn returned NaN/inf embeddings; check the embedding model.")
            if self._dim is not None and E.shape[1] != self._dim:
                raise ValueError(f"{self.name}: embed_fn returned dimension {E.shape[1]}, earlier calls gave {self._dim}.")
            self._dim = E.shape[1]
            for k, e in zip(todo, E):
                found[k] = e
                if self.cache_size:
                    self._cache[k] = e
                    if len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
        return np.stack([found[k] for k in keys])

    def _predict(self, target_prompts, context_prompts, context_outcomes):
        n, m = len(context_prompts), len(target_prompts)
        if n == 0:
            self.last_info = {"mode": "empty", "n_context": 0}
            return np.full(m, self.empty_context_probability)
        if n < self.min_context or np.ptp(context_outcomes) == 0:
            self.last_info = {"mode": "degenerate", "n_context": n}
            return np.full(m, jeffreys_mean(context_outcomes))
        E = self.embed(list(context_prompts) + list(target_prompts))
        p = self.head.fit_predict(E[:n], context_outcomes, E[n:])
        self.last_info = {"mode": "head", "n_context": n, **self.head.last_fit}
        return p

    def clear_cache(self) -> None:
        self._cache.clear()
