"""Character-level tokenizer for the offline testbed.

Built locally with the ``tokenizers`` library (a ``WordLevel`` model whose pre-tokenizer isolates every
character, and a ``Fuse`` decoder so decoding does not insert spaces), wrapped in
:class:`transformers.PreTrainedTokenizerFast`. It saves and reloads with :class:`transformers.AutoTokenizer`;
nothing is downloaded.
"""

from __future__ import annotations

__all__ = ["SPECIAL_TOKENS", "TASK_CHARS", "build_tokenizer"]

#: Special tokens, in id order: ``<pad>`` = 0, ``<eos>`` = 1, ``<unk>`` = 2.
SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<eos>", "<unk>")

#: Every character any testbed task writes: digits, ``+`` and ``=`` (addition), and ``>``, ``,``, ``|``
#: (the substitution task's ``d>e`` mapping list, separator and query).
TASK_CHARS: str = "0123456789+=>,|"


def build_tokenizer(extra_chars: str = ""):
    """Build the character-level testbed tokenizer.

    Parameters
    ----------
    extra_chars : str, optional
        Characters to add to the vocabulary after :data:`TASK_CHARS` (duplicates are ignored, order is kept,
        so the same ``extra_chars`` always gives the same ids).

    Returns
    -------
    transformers.PreTrainedTokenizerFast
        One token per character. ``pad_token_id == 0``, ``eos_token_id == 1``, ``unk_token_id == 2``;
        characters outside the vocabulary encode to ``<unk>``. No BOS/EOS is added by ``__call__``.
        ``decode`` concatenates characters (no spaces). Left padding (what batched generation needs).

    Raises
    ------
    TypeError
        If ``extra_chars`` is not a string.
    ValueError
        If ``extra_chars`` contains whitespace-only control characters that cannot round-trip, i.e.
        ``"\\n"``, ``"\\r"`` or ``"\\t"``.
    """
    if not isinstance(extra_chars, str):
        raise TypeError(f"extra_chars must be a str of characters to add, got {type(extra_chars).__name__}")
    bad = sorted({c for c in extra_chars if c in "\n\r\t"})
    if bad:
        raise ValueError(f"extra_chars may not contain control whitespace {bad!r}; remove them")

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in TASK_CHARS + extra_chars:
        if ch not in vocab:
            vocab[ch] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=256,
    )
    return tok
