"""When the night stops spending starts (``night_stop``): an engine contract breach, a probe that fails
SGLang's own default chain, or budget.max_same_failures trials failing the same way."""

from __future__ import annotations

from orchestrator.spec import SweepSpec
from orchestrator.sweep.execution.night_stop import failure_signature, night_stop, probe_words
from orchestrator.sweep.records.results import TrialRecord

OOM = ("engine exited with code 1 before it became healthy (pid {pid}, port {port}); log tail: "
       "[2026-12-07 01:{minute}:03 TP3] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB "
       "while capturing CUDA graph bs=48")


def record(number: int, *, kind: str = "search", status: str = "failed", reason: str | None = "launch_failed",
           message: str = "", label: str = "steps=3 topk=1 draft=4") -> TrialRecord:
    return TrialRecord(trial_id=f"t{number}", number=number, kind=kind, label=label, params={},  # type: ignore[arg-type]
                       status=status, reason=reason, message=message)  # type: ignore[arg-type]


def oom(number: int) -> TrialRecord:
    return record(number, message=OOM.format(pid=1000 + number, port=30000 + number, minute=10 + number))


def test_a_signature_takes_out_numbers_not_words() -> None:
    assert failure_signature("launch_failed", OOM.format(pid=1, port=2, minute=3)) == failure_signature(
        "launch_failed", OOM.format(pid=99, port=31337, minute=59))
    assert failure_signature("launch_failed", "CUDA out of memory") != failure_signature("launch_failed", "NCCL error")
    assert failure_signature("a", "x") != failure_signature("b", "x")
    with_command = ("exited with code 1; log tail:\n$ python -m sglang.launch_server {flags}\nserver args: {flags}\n"
                    "Traceback (most recent call last):\nCUDA out of memory")
    assert failure_signature("launch_failed", with_command.format(flags="--speculative-num-steps 3")) == \
        failure_signature("launch_failed", with_command.format(flags="None"))  # SGLang's auto choice sets none


def test_k_failures_the_same_way_stop_the_search_with_a_diagnosis() -> None:
    records = [record(1, kind="baseline_plain", status="ok", reason=None), oom(2), oom(3)]
    assert night_stop(records, max_same_failures=3) is None
    stop = night_stop([*records, oom(4)], max_same_failures=3)
    assert stop is not None and stop.kind == "repeated_failure" and stop.trials == (2, 3, 4)
    assert stop.diagnosis.startswith("3 trials failed the same way (2, 3, 4; budget.max_same_failures 3): "
                                     "launch_failed: engine exited with code 1")
    assert "CUDA out of memory" in stop.diagnosis and "--resume" in stop.diagnosis
    assert stop.error() is None  # exit 1 with the morning files, not a spec error


def test_failures_that_say_nothing_of_the_next_trial_do_not_count() -> None:
    same = [record(n, status="interrupted", reason="interrupted", message="killed") for n in range(1, 6)]
    same += [record(n, status="infeasible", reason="slo_violated", message="SLO") for n in range(6, 10)]
    assert night_stop(same, max_same_failures=2) is None
    different = [record(1, message="CUDA out of memory"), record(2, reason="not_healthy", message="CUDA out of memory")]
    assert night_stop(different, max_same_failures=2) is None


def test_a_probe_failure_on_sglangs_default_chain_stops_before_more_starts() -> None:
    default = record(2, kind="baseline_auto", reason="probe_mismatch", label="SGLang auto (= steps 3 topk 1 draft 4)",
                     message="3 of 8 prompts differ: prompt 2 at token 5 (gap 0.71 nats)")
    stop = night_stop([record(1, kind="baseline_plain", status="ok", reason=None), default], max_same_failures=3,
                      probe_thresholds="rule near_tie, max_logprob_gap 0.5 nats, max_flip_rate 0.25")
    assert stop is not None and stop.kind == "probe_on_default" and stop.trials == (2,)
    assert "SGLang's own default speculative configuration (trial 2" in stop.diagnosis
    assert "(rule near_tie, max_logprob_gap 0.5 nats, max_flip_rate 0.25)" in stop.diagnosis
    assert "gap 0.71 nats" in stop.diagnosis and "benchmark.probe" not in stop.diagnosis  # the spec's own fields
    assert "probe.max_logprob_gap / probe.max_flip_rate in the spec, or set probe.rule: exact" in stop.diagnosis
    searched = record(3, reason="probe_mismatch", message="differs")  # a searched chain failing is that chain's own
    assert night_stop([searched], max_same_failures=3) is None


def test_an_engine_contract_breach_stops_at_once_with_exit_2() -> None:
    broken = record(2, reason="engine_contract", message="the engine does not answer what a measurement needs: x")
    stop = night_stop([oom(1), broken], max_same_failures=3)
    assert stop is not None and stop.kind == "engine_contract" and stop.error() is not None
    assert str(stop.error()).startswith("trial 2 (steps=3 topk=1 draft=4): the engine does not answer")


def test_the_diagnosis_quotes_the_specs_probe_thresholds() -> None:
    spec = SweepSpec.from_dict({"name": "t", "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft"},
                                "probe": {"max_logprob_gap": 0.8}})
    assert probe_words(spec) == "rule near_tie, max_logprob_gap 0.8 nats, max_flip_rate 0.25"
    exact = SweepSpec.from_dict({"name": "t", "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft"},
                                 "probe": {"rule": "exact"}})
    assert probe_words(exact) == "rule exact: token for token"
