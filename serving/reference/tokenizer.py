"""Byte-level tokenizer and the trivial chat template of the reference engine.

Token ids 0..255 are the bytes of the UTF-8 text; a few special tokens follow the bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Sequence

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "NUM_BYTE_TOKENS",
    "SPECIAL_TOKENS",
    "ByteTokenizer",
    "IncrementalDecoder",
    "render_chat",
]

NUM_BYTE_TOKENS = 256
BOS_ID = 256
EOS_ID = 257
SYSTEM_ID = 258
USER_ID = 259
ASSISTANT_ID = 260
END_OF_TURN_ID = 261

SPECIAL_TOKENS: Mapping[int, str] = {
    BOS_ID: "<|bos|>",
    EOS_ID: "<|eos|>",
    SYSTEM_ID: "<|system|>",
    USER_ID: "<|user|>",
    ASSISTANT_ID: "<|assistant|>",
    END_OF_TURN_ID: "<|end|>",
}
_ROLE_IDS = {"system": SYSTEM_ID, "user": USER_ID, "assistant": ASSISTANT_ID}


@dataclasses.dataclass(frozen=True)
class ByteTokenizer:
    """UTF-8 bytes as tokens, plus the special tokens above.

    Attributes:
        vocab_size: The model's vocabulary (>= 262); ids past the special tokens exist in the
            model's output layer but decode to nothing.
    """

    vocab_size: int

    bos_token_id: int = BOS_ID
    eos_token_id: int = EOS_ID

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        """Text -> ids: an optional BOS, then one id per UTF-8 byte."""
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """Ids -> text; invalid UTF-8 (a cut multi-byte character) becomes U+FFFD."""
        out = bytearray()
        for token in ids:
            if 0 <= token < NUM_BYTE_TOKENS:
                out.append(token)
            elif not skip_special_tokens and token in SPECIAL_TOKENS:
                out.extend(SPECIAL_TOKENS[token].encode("utf-8"))
        return out.decode("utf-8", errors="replace")

    def check_ids(self, ids: Sequence[object], *, field: str) -> list[int]:
        """Validate client-supplied ids; the error names the field and the first bad value."""
        clean = []
        for index, token in enumerate(ids):
            if isinstance(token, bool) or not isinstance(token, int):
                raise ValueError(f"{field}[{index}] must be an integer token id, got {token!r}")
            if not 0 <= token < self.vocab_size:
                raise ValueError(
                    f"{field}[{index}]={token} is outside the vocabulary [0, {self.vocab_size})"
                )
            clean.append(token)
        return clean


class IncrementalDecoder:
    """Turns a growing list of ids into text deltas, holding back unfinished UTF-8 sequences."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self.text = ""

    def push(self, ids: Iterable[int], *, final: bool = False) -> str:
        """Add ids; return the newly complete text (and everything left over if ``final``)."""
        for token in ids:
            if 0 <= token < NUM_BYTE_TOKENS:
                self._pending.append(token)
        cut = len(self._pending) if final else _complete_prefix_length(self._pending)
        delta = bytes(self._pending[:cut]).decode("utf-8", errors="replace")
        del self._pending[:cut]
        self.text += delta
        return delta


def _complete_prefix_length(buf: bytearray) -> int:
    """Length of the longest prefix of ``buf`` that does not end inside a UTF-8 sequence."""
    n = len(buf)
    # Look back at most 3 bytes for the start of an unfinished multi-byte sequence.
    for back in range(1, min(4, n) + 1):
        byte = buf[n - back]
        if byte & 0b1100_0000 == 0b1000_0000:  # continuation byte: keep looking
            continue
        if byte & 0b1000_0000 == 0:  # ASCII: complete
            return n
        need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
        return n if back >= need else n - back
    return n


def render_chat(messages: Sequence[Mapping[str, object]], *, add_generation_prompt: bool = True) -> list[int]:
    """The trivial chat template: ``BOS (<|role|> content <|end|>)* <|assistant|>``.

    ``content`` may be a string or OpenAI's list of ``{"type": "text", "text": ...}`` parts.

    Raises:
        ValueError: a message has an unknown role or non-text content (the message names which).
    """
    ids = [BOS_ID]
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{index}] must be an object, got {type(message).__name__}")
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLE_IDS:
            raise ValueError(
                f"messages[{index}].role={role!r} is not supported; use one of {sorted(_ROLE_IDS)}"
            )
        content = message.get("content")
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        elif isinstance(content, list):
            parts = []
            for part_index, part in enumerate(content):
                if not isinstance(part, Mapping) or part.get("type") != "text":
                    raise ValueError(
                        f"messages[{index}].content[{part_index}] must be a text part "
                        f"({{'type': 'text', 'text': ...}}); the reference engine has no other modalities"
                    )
                parts.append(str(part.get("text", "")))
            text = "".join(parts)
        else:
            raise ValueError(f"messages[{index}].content must be a string or a list of text parts")
        ids.append(_ROLE_IDS[str(role)])
        ids.extend(text.encode("utf-8"))
        ids.append(END_OF_TURN_ID)
    if add_generation_prompt:
        ids.append(ASSISTANT_ID)
    return ids
