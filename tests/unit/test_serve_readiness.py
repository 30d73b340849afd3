"""``spectune serve``'s readiness output: the line, and the note under it that the reference
engine's text is gibberish by design (a newcomer's first completion otherwise reads as a broken
server)."""

from __future__ import annotations

from serving.serve.runner import REFERENCE_TEXT_NOTE, Readiness


def _ready(engine_kind: str) -> Readiness:
    audit = {"ok": True, "startup": {"processes": [{"role": "engine"}, {"role": "tp_worker"}],
                                     "expected": {"NCCL_ALGO": "Ring"}}}
    return Readiness(url="http://127.0.0.1:8000", model="ref-tiny", audit=audit, replicas="1 replica",
                     ingress="haproxy", api_key_required=True, engine_kind=engine_kind)


def test_the_reference_engine_is_said_to_write_gibberish_by_design() -> None:
    ready = _ready("reference")
    assert ready.note() == REFERENCE_TEXT_NOTE
    assert "random" in REFERENCE_TEXT_NOTE and "gibberish by design" in REFERENCE_TEXT_NOTE
    assert REFERENCE_TEXT_NOTE.count(". ") == 0, "one short sentence"


def test_sglang_gets_no_note() -> None:
    assert _ready("sglang").note() is None


def test_the_line_names_url_key_and_audit() -> None:
    assert _ready("reference").line() == (
        "serving ref-tiny at http://127.0.0.1:8000/v1 (1 replica, haproxy ingress, API key required); env audit "
        "passed (2 processes, 1 TP workers carry NCCL_ALGO); audit: http://127.0.0.1:8000/spectune/audit")
