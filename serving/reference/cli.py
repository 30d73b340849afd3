"""``python -m serving.reference``: parse SGLang's flags, configure logging, run the server.

Node rank 0 (``--node-rank 0``, the default) runs the server (``serving.reference.server``); a node
of rank >= 1 of an engine across ``--nnodes`` runs its ranks and a health server only
(``serving.reference.follower``), as SGLang does.

Exit status: 0 after SIGTERM/SIGINT, 1 when the server fails (port taken, a worker died, a fault
switch), 2 for a bad command line or fault switch (the message names the flag or variable).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Optional, Sequence

__all__ = ["main"]

logger = logging.getLogger("serving.reference")


def _log_level(argv: Sequence[str]) -> str:
    for i, arg in enumerate(argv):
        if arg == "--log-level" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--log-level="):
            return arg.split("=", 1)[1]
    return "info"


def configure_logging(level: str) -> None:
    """SGLang-like log lines on stderr, configured once by the CLI."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stderr,
        force=True,
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the reference engine; returns the process exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    configure_logging(_log_level(argv))

    from serving.reference.faults import parse_faults
    from serving.reference.server_args import parse_args

    args = parse_args(argv)  # exits 2 on a bad command line
    try:
        faults = parse_faults()
    except ValueError as exc:
        logger.error("bad fault switch: %s", exc)
        return 2
    logger.info("server args: %s", args.to_dict())
    if faults.any:
        logger.warning("fault switches active: %s", faults)
    if faults.crash_on_start:
        logger.error("fault crash_on_start: exiting with status 1 before serving")
        return 1
    if faults.crash_on_start_speculative and args.speculative:
        logger.error("fault crash_on_start@speculative: torch.OutOfMemoryError: CUDA out of memory while capturing "
                     "the draft's CUDA graphs (a stand-in for a systematic start failure); exiting with status 1")
        return 1

    from serving.reference.tp_worker import set_process_name

    set_process_name("ref::server")
    if args.node_rank > 0:
        from serving.reference.follower import serve_follower

        return asyncio.run(serve_follower(args, faults=faults))
    from serving.reference.server import serve

    return asyncio.run(serve(args, faults=faults))
