"""The fault switches a sweep arms for chosen trials, the corrupted all-reduce, and secrets in logs."""

from __future__ import annotations

import pytest

from serving.redaction import REDACTED
from serving.reference.faults import CorruptedAllReduce, EnvCondition, Faults, parse_faults
from serving.reference.tp_worker import env_line, visible_env

from helpers.reference_core import PROMPTS, greedy_requests, make_models, run_tp


def test_die_after_tokens_with_a_condition_applies_only_where_it_holds() -> None:
    faults = parse_faults("die_after_tokens:1500@NCCL_ALGO=Tree")
    assert faults.die_after_tokens == 1500 and faults.die_after_tokens_when == EnvCondition("NCCL_ALGO", "Tree")
    assert faults.tokens_before_death({"NCCL_ALGO": "Tree"}) == 1500
    assert faults.tokens_before_death({"NCCL_ALGO": "Ring"}) is None
    assert faults.tokens_before_death({}) is None
    assert parse_faults("die_after_tokens:40").tokens_before_death({}) == 40
    assert str(faults) == "die_after_tokens:1500@NCCL_ALGO=Tree"


def test_corrupt_allreduce_when_and_combinations() -> None:
    faults = parse_faults("corrupt_allreduce_when:NCCL_PROTO=LL128; die_after_tokens:5@NCCL_ALGO=Tree;late_env:A,B")
    assert faults.corrupt_allreduce_when == EnvCondition("NCCL_PROTO", "LL128")
    assert faults.corrupt_allreduce_when.holds({"NCCL_PROTO": "LL128"})
    assert not faults.corrupt_allreduce_when.holds({"NCCL_PROTO": "Simple"})
    assert faults.die_after_tokens == 5 and faults.late_env == ("A", "B")
    assert str(faults) == "die_after_tokens:5@NCCL_ALGO=Tree; late_env:A,B; corrupt_allreduce_when:NCCL_PROTO=LL128"
    assert parse_faults("corrupt_allreduce_when:X=").corrupt_allreduce_when == EnvCondition("X", "")
    assert parse_faults("corrupt_allreduce_when:X=a=b").corrupt_allreduce_when == EnvCondition("X", "a=b")


def test_corruption_share_and_verify_perturbation_parse_and_spell_back() -> None:
    faults = parse_faults("corrupt_allreduce_when:NCCL_PROTO=LL128@share=0.11;perturb_verify:0.0039")
    assert faults.corrupt_allreduce_when == EnvCondition("NCCL_PROTO", "LL128") and faults.corruption_share == 0.11
    assert faults.perturb_verify == 0.0039
    assert str(faults) == "corrupt_allreduce_when:NCCL_PROTO=LL128@share=0.11; perturb_verify:0.0039"
    assert parse_faults("corrupt_allreduce_when:A=b").corruption_share == 0.25  # a quarter, as before
    dropped = parse_faults("drop_field:spec_verify_ct, avg_spec_accept_length")
    assert dropped.drop_fields == ("spec_verify_ct", "avg_spec_accept_length")
    assert str(dropped) == "drop_field:spec_verify_ct,avg_spec_accept_length"


def test_verify_perturbation_is_rounding_sized_and_reproducible() -> None:
    import torch

    from serving.reference.faults import perturb_verify_logits

    logits = torch.randn(2, 4, 97, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 10
    key = ([5, 9], [[1, 2, 3, 4], [5, 6, 7, 8]])
    once = perturb_verify_logits(logits, size=2**-8, key=key)
    assert torch.equal(once, perturb_verify_logits(logits, size=2**-8, key=key))  # every rank alike
    assert not torch.equal(once, perturb_verify_logits(logits, size=2**-8, key=([5, 10], key[1])))
    relative = (once / logits - 1).abs()
    assert 0 < float(relative.max()) <= 2**-8


@pytest.mark.parametrize(
    "bad",
    ["drop_field:", "drop_field:,", "perturb_verify:", "perturb_verify:0", "perturb_verify:-1", "perturb_verify:nan", "perturb_verify:x",
     "corrupt_allreduce_when:A=b@share=0", "corrupt_allreduce_when:A=b@share=big",
     "corrupt_allreduce_when:", "corrupt_allreduce_when:NCCL_PROTO", "corrupt_allreduce_when:=LL128",
     "corrupt_allreduce_when:1X=2", "die_after_tokens:5@", "die_after_tokens:5@NCCL_ALGO", "die_after_tokens:x@A=B",
     "die_after_tokens:0@A=B"],
)
def test_bad_conditions_name_the_variable(bad: str) -> None:
    with pytest.raises(ValueError, match="SPECTUNE_REFERENCE_FAULT"):
        parse_faults(bad)


def test_secret_values_in_fault_switches_are_never_printed() -> None:
    faults = parse_faults("corrupt_allreduce_when:NCCL_IB_SECRET_KEY=hunter2;die_after_tokens:3@SPECTUNE_API_TOKEN=t0k")
    for text in (str(faults), repr(faults)):
        assert "hunter2" not in text and "t0k" not in text and REDACTED in text
    with pytest.raises(ValueError) as info:
        parse_faults("explode:SPECTUNE_API_TOKEN=t0k")
    assert "t0k" not in str(info.value)
    assert Faults().tokens_before_death({}) is None and not Faults().any


def test_worker_start_up_env_is_redacted() -> None:
    environ = {"SPECTUNE_API_TOKEN": "t0k", "NCCL_IB_SECRET_KEY": "hunter2", "NCCL_ALGO": "Ring", "HOME": "/h"}
    env = visible_env(environ)
    assert env == {"NCCL_ALGO": "Ring", "NCCL_IB_SECRET_KEY": REDACTED, "SPECTUNE_API_TOKEN": REDACTED}
    line = env_line(environ)
    assert "t0k" not in line and "hunter2" not in line and "NCCL_ALGO=Ring" in line


def test_corrupted_all_reduce_changes_greedy_output_and_keeps_ranks_in_lockstep() -> None:
    """What the correctness probe must catch: same shapes, same counts, other tokens; and both
    ranks still agree (``run_tp`` asserts it), so a real server stays healthy."""
    reqs = greedy_requests(PROMPTS[:6], max_new_tokens=24)
    clean = run_tp(make_models(2), reqs, spec=(3, 1, 4))
    corrupted = run_tp(make_models(2, wrap_comm=CorruptedAllReduce), reqs, spec=(3, 1, 4))
    assert all(len(corrupted[r.rid]) == len(clean[r.rid]) == 24 for r in reqs)
    assert sum(corrupted[r.rid] != clean[r.rid] for r in reqs) == len(reqs)


def test_die_after_steps_is_armed_on_its_node_only() -> None:
    faults = parse_faults("die_after_steps:12@node_rank=1")
    assert (faults.die_after_steps, faults.die_after_steps_node) == (12, 1)
    assert faults.steps_before_death(1) == 12
    assert faults.steps_before_death(0) is None and faults.steps_before_death(2) is None
    assert str(faults) == "die_after_steps:12@node_rank=1"
    everywhere = parse_faults("die_after_steps:3;late_env:A")
    assert [everywhere.steps_before_death(r) for r in (0, 1)] == [3, 3] and everywhere.late_env == ("A",)
    assert Faults().steps_before_death(0) is None


def test_die_after_steps_with_a_variable_is_armed_on_its_node_where_the_variable_holds() -> None:
    faults = parse_faults("die_after_steps:12@node_rank=1@NCCL_ALGO=Tree")
    assert str(faults) == "die_after_steps:12@node_rank=1@NCCL_ALGO=Tree"
    assert faults.steps_before_death(1, {"NCCL_ALGO": "Tree"}) == 12
    assert faults.steps_before_death(1, {"NCCL_ALGO": "Ring"}) is None and faults.steps_before_death(1, {}) is None
    assert faults.steps_before_death(0, {"NCCL_ALGO": "Tree"}) is None


@pytest.mark.parametrize(
    "bad",
    ["die_after_steps:", "die_after_steps:0", "die_after_steps:x", "die_after_steps:3@", "die_after_steps:3@node_rank",
     "die_after_steps:3@node_rank=", "die_after_steps:3@node_rank=-1", "die_after_steps:3@node_rank=1@node_rank=0",
     "die_after_steps:3@A=1@B=2", "die_after_steps:3@node_rank=1@A=1@B=2"],
)
def test_bad_die_after_steps_names_the_variable_and_the_form(bad: str) -> None:
    with pytest.raises(ValueError, match=r"SPECTUNE_REFERENCE_FAULT: die_after_steps needs .*die_after_steps:N\[@node_rank=R\]\[@NAME=VALUE\]"):
        parse_faults(bad)
