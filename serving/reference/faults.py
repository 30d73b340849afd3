"""Fault switches of the reference engine, read from ``SPECTUNE_REFERENCE_FAULT``.

They exist so the code that launches engines (spectune's EngineProcess, the sweep, Serve) can
test its failure paths against a real server. Switches go through the environment, not flags, so
the command line stays exactly SGLang's. Several may be combined with ``;``.

* ``crash_on_start``: exit 1 before binding the port.
* ``hang_on_start``: bind the port and spawn the workers, then never become healthy
  (``/health`` and ``/health_generate`` answer 503 until the process is stopped).
* ``die_after_tokens:N``: the HTTP (server) process exits hard (``os._exit(1)``, no cleanup) as
  soon as it has received N generated tokens in total; the workers die with it.
* ``late_env:NAME[,NAME...]``: the named variables are popped from ``os.environ`` while the TP
  workers are spawned and restored afterwards, so the server process has them and the workers do
  not (the bug of setting NCCL_* after the engine started).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from serving.environ import ENV

__all__ = ["Faults", "parse_faults"]


@dataclasses.dataclass(frozen=True)
class Faults:
    crash_on_start: bool = False
    hang_on_start: bool = False
    die_after_tokens: Optional[int] = None
    late_env: tuple[str, ...] = ()

    @property
    def any(self) -> bool:
        return self != Faults()


def parse_faults(value: Optional[str] = None) -> Faults:
    """Parse the switch (``SPECTUNE_REFERENCE_FAULT`` unless ``value`` is given).

    Raises:
        ValueError: an unknown switch or a bad argument, naming the variable and the value.
    """
    raw = ENV.SPECTUNE_REFERENCE_FAULT.get() if value is None else value
    name = ENV.SPECTUNE_REFERENCE_FAULT.name
    fields: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in raw.split(";"))):
        key, _, arg = item.partition(":")
        if key in ("crash_on_start", "hang_on_start") and not arg:
            fields[key] = True
        elif key == "die_after_tokens":
            if not arg.isdigit() or int(arg) < 1:
                raise ValueError(f"{name}: die_after_tokens needs a positive integer (die_after_tokens:N), got {item!r}")
            fields[key] = int(arg)
        elif key == "late_env":
            names = tuple(n.strip() for n in arg.split(",") if n.strip())
            if not names:
                raise ValueError(f"{name}: late_env needs variable names (late_env:NAME[,NAME...]), got {item!r}")
            fields[key] = names
        else:
            raise ValueError(
                f"{name}={raw!r}: unknown fault {item!r}; use crash_on_start, hang_on_start, "
                "die_after_tokens:N or late_env:NAME[,NAME...] (';' combines several)"
            )
    return Faults(**fields)  # type: ignore[arg-type]
