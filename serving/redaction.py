"""The one rule for secret-looking environment variables (stdlib only), used wherever spectune
prints or logs a variable's value."""

from __future__ import annotations

import re
from typing import Mapping, Optional

__all__ = ["REDACTED", "is_secret", "redact", "redacted_env"]

_SECRET_NAME = re.compile(r"(TOKEN(?!IZER)|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL|AUTH)", re.I)
"""Names that hold secrets: HF_TOKEN, OPENAI_API_KEY, *PASSWORD*, NCCL_IB_SECRET_KEY, ... but not
TOKENIZERS_PARALLELISM or --tokenizer-path (a tokenizer is not a token)."""
REDACTED = "<redacted>"


def is_secret(name: str) -> bool:
    """Whether a variable called ``name`` looks like it holds a secret."""
    return bool(_SECRET_NAME.search(name))


def redact(name: str, value: Optional[str]) -> Optional[str]:
    """``value``, or a placeholder if ``name`` looks like it holds a secret."""
    if value is None:
        return None
    return REDACTED if is_secret(name) else value


def redacted_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with every secret-looking value replaced by the placeholder."""
    return {name: REDACTED if is_secret(name) else value for name, value in env.items()}
