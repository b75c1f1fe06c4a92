"""Model cards of trl_ext trainers: the method's name, paper and tags, plus a ``trl_ext run details`` section.

TRL 1.16 writes a card from three class attributes of the trainer (set only through
:func:`trl_ext.trainers._trl_compat.set_card_attributes`); it has no public way to add text to the card, so trainers
that record what a run depended on get a ``create_model_card`` override that calls TRL's and then writes one section
into ``<output_dir>/README.md``. Trainers declare their card with :func:`set_model_card_info` (or the
:func:`model_card_info` decorator).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from . import _trl_compat as compat
from .state import EXT_STATE_FILE

__all__ = ["TRL_EXT_TAG", "MODEL_CARD_SECTION", "paper_info", "set_model_card_info", "model_card_info",
           "model_card_info_of", "model_card_details", "write_model_card_details"]

TRL_EXT_TAG = "trl-ext"
"""Tag every trl_ext trainer adds to the model card (and to the model's tags)."""

MODEL_CARD_SECTION = "## trl_ext run details"
"""Heading of the section trl_ext appends to TRL's model card."""


def paper_info(*, title: str, year: int, bibtex_key: str, authors: Sequence[str] | None = None,
               arxiv_id: str | None = None) -> dict:
    """A method paper in TRL's ``_paper`` format: ``{"title", "id", "citation"}`` (``citation`` is BibTeX).

    ``arxiv_id`` (``YYMM.NNNNN``) makes TRL's card link the paper page; without it the card names the method and
    cites the paper by title only. ``authors`` as written in the paper (surnames are fine).
    """
    lines = [f"@misc{{{bibtex_key},", f"    title        = {{{{{title}}}}},"]
    if authors:
        lines.append(f"    author       = {{{' and '.join(authors)}}},")
    lines.append(f"    year         = {int(year)},")
    if arxiv_id:
        lines += [f"    eprint       = {{{arxiv_id}}},", "    archivePrefix = {arXiv},"]
    lines.append("}")
    return {"title": title, "id": arxiv_id, "citation": "\n".join(lines)}


def set_model_card_info(cls: type, *, name: str | None = None, tags: Sequence[str] | None = None,
                        paper: dict | None = None, details: Sequence[Any] = ()) -> type:
    """Set the model card of trainer class ``cls`` through TRL's class-level mechanism; returns ``cls``.

    Parameters
    ----------
    name : str, optional
        Method name TRL writes as "This model was trained with <name>" (``cls._name``); unset: inherited.
    tags : sequence of str, optional
        The card's tags (``cls._tag_names``), in order, duplicates dropped; unset: inherited.
    paper : dict, optional
        The method paper (``cls._paper``), e.g. from :func:`paper_info`; unset: inherited.
    details : sequence
        What a run of this class depends on, written into a ``trl_ext run details`` section of the card. Each item
        is a config field name (the card records ``args.<name>``) or a callable ``trainer -> dict`` (entries are
        recorded as ``key: value``). When given, ``cls`` gets a ``create_model_card`` that calls TRL's and then
        writes the section (:func:`write_model_card_details`; subclasses inherit both).

    Usable as a one-line statement after a class definition, or as a decorator through :func:`model_card_info`.
    """
    if paper is not None:
        missing = {"title", "citation"} - set(paper)
        if missing:
            raise ValueError(f"set_model_card_info: paper needs {sorted(missing)} (use paper_info(...)).")
    compat.set_card_attributes(cls, name=name, tags=tags, paper=paper)
    if details:
        for item in details:
            if not (isinstance(item, str) or callable(item)):
                raise TypeError(f"set_model_card_info: a details item must be a config field name or a callable "
                                f"trainer -> dict, got {type(item).__name__}.")
        cls.model_card_details_items = tuple(details)
        if "create_model_card" not in vars(cls):
            cls.create_model_card = _create_model_card_with_details(cls)
    return cls


def model_card_info(**kwargs):
    """Class-decorator form of :func:`set_model_card_info` (same keyword arguments)."""

    def apply(cls: type) -> type:
        return set_model_card_info(cls, **kwargs)

    return apply


def model_card_info_of(cls_or_trainer: Any) -> dict:
    """The model-card settings TRL will use for a trainer class or instance: ``name``, ``tags``, ``paper``."""
    cls = cls_or_trainer if isinstance(cls_or_trainer, type) else type(cls_or_trainer)
    return compat.card_attributes(cls)


def _format_card_value(value: Any) -> str:
    if isinstance(value, float):
        value = f"{value:.6g}"
    elif isinstance(value, dict | list | tuple):
        import json

        value = json.dumps(value, sort_keys=True, default=str)
    text = str(value)
    return text if len(text) <= 400 else text[:397] + "..."


def model_card_details(trainer: Any) -> dict[str, str]:
    """The entries of the ``trl_ext run details`` section for ``trainer``, in order.

    Always: the trainer class, trl_ext and TRL versions, the rollout strategy's description and where the extension
    state is saved; then the ``details`` items of every class in the trainer's MRO, base classes first (config fields
    as ``args.<name>``, callables' entries as returned).
    """
    import trl

    import trl_ext

    cls = type(trainer)
    out = {
        "trainer": f"{cls.__module__}.{cls.__qualname__}",
        "versions": f"trl_ext {trl_ext.__version__}, TRL {trl.__version__}",
    }
    strategy = getattr(trainer, "rollout_strategy", None)
    if strategy is not None:
        from .rollouts import strategy_description

        out["rollout strategy"] = strategy_description(strategy, trainer.rollout_api)[0]
    out["extension state"] = (f"`{EXT_STATE_FILE}` in every `checkpoint-*` folder (restored by "
                              "`train(resume_from_checkpoint=...)`)")
    seen: set[int] = set()
    for klass in reversed(cls.__mro__):
        for item in vars(klass).get("model_card_details_items", ()):
            if id(item) in seen:
                continue
            seen.add(id(item))
            if isinstance(item, str):
                out[f"args.{item}"] = _format_card_value(getattr(trainer.args, item))
            else:
                for key, value in dict(item(trainer)).items():
                    out[str(key)] = _format_card_value(value)
    return out


def write_model_card_details(trainer: Any, readme_path: str | None = None) -> str | None:
    """Write the ``trl_ext run details`` section into the card TRL wrote (``<output_dir>/README.md``).

    Replaces an existing section (a nested ``create_model_card`` call writes the same content again), else inserts it
    before TRL's ``## Citations`` (or appends it). Only on the world's main process, like TRL's own card; returns the
    path written, or ``None`` when nothing was written (other processes, or no card).
    """
    if not trainer.is_world_process_zero():
        return None
    path = readme_path or os.path.join(trainer.args.output_dir, "README.md")
    if not os.path.exists(path):
        return None
    info = model_card_info_of(trainer)
    title = info["paper"].get("title")
    arxiv = info["paper"].get("id")
    ref = f" (*{title}*{f', arXiv:{arxiv}' if arxiv else ''})" if title else ""
    lines = [MODEL_CARD_SECTION, "", f"Trained with **{info['name']}**{ref} by `trl_ext` on top of TRL's "
             "`GRPOTrainer`. What the run depended on:", ""]
    lines += [f"- **{key}**: {value}" for key, value in model_card_details(trainer).items()]
    section = "\n".join(lines) + "\n\n"
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.find(MODEL_CARD_SECTION)
    if start >= 0:
        end = text.find("\n## ", start + len(MODEL_CARD_SECTION))
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    else:
        anchor = text.find("## Citations")
        text = text[:anchor] + section + text[anchor:] if anchor >= 0 else text.rstrip("\n") + "\n\n" + section
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def _create_model_card_with_details(owner: type):
    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None,
                          tags: str | list[str] | None = None):
        """TRL's model card (method name, paper, tags) plus the ``trl_ext run details`` section
        (:func:`trl_ext.trainers.model_card.write_model_card_details`)."""
        super(owner, self).create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        write_model_card_details(self)

    create_model_card.__qualname__ = f"{owner.__qualname__}.create_model_card"
    create_model_card.__module__ = owner.__module__
    return create_model_card


set_model_card_info(compat.TRLGlue, tags=[*compat.trl_grpo_tags(), TRL_EXT_TAG])
