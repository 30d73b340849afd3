"""The engine contract on hand-written answers shaped as SGLang 0.5.23 sends them after one short
request on a fresh engine: every item present passes; each one missing, renamed or mistyped is named
with what was sent instead, as a problem (nothing could be measured without it: the sweep stops) or
as a blind reader (the night goes on, flagged)."""

from __future__ import annotations

import copy

import pytest

from serving.engine.contract import check_engine_contract, contract_request

SERVER_INFO = {
    "model_path": "moonshotai/Kimi-K2.5", "tp_size": 8, "device": "cuda", "disable_custom_all_reduce": False,
    "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
    # after one short request: no avg_spec_accept_length yet (SGLang folds every 40 decode batches)
    "internal_states": [{"last_gen_throughput": 0.0, "num_running_reqs": 0}],
}
SPEC_REPLY = {"text": "Paris.", "output_ids": [12366, 13, 198],
              "meta_info": {"prompt_tokens": 7, "completion_tokens": 3, "finish_reason": {"type": "length"},
                            "spec_verify_ct": 2, "spec_correct_drafts_histogram": [1, 0, 1, 0]}}
PLAIN_REPLY = {"text": "Paris", "output_ids": [12366],
               "meta_info": {"prompt_tokens": 2, "completion_tokens": 1,
                             "input_token_logprobs": [[None, 791, None], [-1.2, 6864, None]],
                             "output_top_logprobs": [[[-0.1, 12366, None], [-2.6, 279, None]]]}}
LOG = "\n".join(f"[2026-12-05 10:00:0{r} TP{r}] Load weight end." for r in range(8))
NCCL = "node1:4242:4242 [0] NCCL INFO NCCL_ALGO set by environment to Ring."


def check(*, info=SERVER_INFO, reply=SPEC_REPLY, log=LOG, speculative=True, tp=8, nccl=False):
    return check_engine_contract(server_info=info, generate_reply=reply, log_text=log, speculative=speculative,
                                 tp_size=tp, nccl_info=nccl)


def test_sglang_shaped_answers_pass() -> None:
    assert check().ok and not check().blind and check(reply=[SPEC_REPLY]).ok  # SGLang may wrap one reply in a list
    assert check(reply=PLAIN_REPLY, speculative=False).ok
    assert check(log=LOG + "\n" + NCCL, nccl=True).ok and not check(log=LOG + "\n" + NCCL, nccl=True).blind
    assert check(info={**SERVER_INFO, "device": "cpu"}, nccl=True).blind == []  # gloo on a CPU: no NCCL lines
    assert len(check().checked) == 13


def test_a_fresh_engine_needs_no_server_accept_length() -> None:
    """SGLang 0.5.23 adds avg_spec_accept_length only once spec_total_num_forward_ct > 0
    (scheduler_components/internal_state.py l.123-125, l.247), folded every decode_log_interval
    decode batches (metrics_reporter.py l.934, l.999-1000): never after one short request. The
    contract asks nothing of it."""
    result = check()
    assert result.ok and result.blind == []
    assert not any("avg_spec_accept_length" in item for item in result.checked)


@pytest.mark.parametrize(("path", "where"), [
    (("meta_info", "spec_verify_ct"), "/generate meta_info.spec_verify_ct"),
    (("meta_info", "completion_tokens"), "/generate meta_info.completion_tokens"),
    (("output_ids",), "/generate output_ids"),
])
def test_a_field_a_measurement_needs_is_a_problem(path: tuple[str, ...], where: str) -> None:
    reply = copy.deepcopy(SPEC_REPLY)
    target = reply
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    result = check(reply=reply)
    assert not result.ok and len(result.problems) == 1 and result.blind == []
    assert result.problems[0].startswith(f"{where}: expected ") and "got absent" in result.problems[0]
    assert where in result.summary()


@pytest.mark.parametrize(("path", "where"), [
    (("meta_info", "spec_correct_drafts_histogram"), "/generate meta_info.spec_correct_drafts_histogram"),
    (("meta_info", "prompt_tokens"), "/generate meta_info.prompt_tokens"),
])
def test_a_field_only_a_blind_reader_uses_is_a_warning(path: tuple[str, ...], where: str) -> None:
    reply = copy.deepcopy(SPEC_REPLY)
    del reply[path[0]][path[1]]
    result = check(reply=reply)
    assert result.ok and len(result.blind) == 1 and result.blind[0].startswith(f"{where}: expected ")
    assert where in result.summary()


def test_a_renamed_field_shows_its_new_name() -> None:
    reply = copy.deepcopy(SPEC_REPLY)
    reply["meta_info"]["spec_verify_count"] = reply["meta_info"].pop("spec_verify_ct")
    (problem,) = check(reply=reply).problems
    assert problem.startswith("/generate meta_info.spec_verify_ct: expected a positive integer (verify cycles), "
                              "got absent")
    assert "nearest: spec_verify_count" in problem


def test_mistyped_values_are_quoted() -> None:
    reply = copy.deepcopy(SPEC_REPLY)
    reply["meta_info"]["spec_verify_ct"] = "2"
    (problem,) = check(reply=reply).problems
    assert problem == '/generate meta_info.spec_verify_ct: expected a positive integer (verify cycles), got "2"'
    info = {**SERVER_INFO, "speculative_eagle_topk": None}
    assert check(info=info).ok and check(info=info).blind == [
        "/server_info speculative_eagle_topk: expected an integer (the resolved server arg), got null"]


def test_server_args_nested_in_internal_states_count() -> None:
    """Older SGLang repeated the server args in internal_states[0] only; the harness reads both."""
    info = {"internal_states": [{k: v for k, v in SERVER_INFO.items() if k != "internal_states"}]}
    assert check(info=info).ok and not check(info=info).blind


def test_the_baselines_logprobs_are_read_by_the_probe_alone() -> None:
    """Without them the probe compares token for token (stricter): a blind reader, not a stop."""
    reply = copy.deepcopy(PLAIN_REPLY)
    reply["meta_info"]["output_top_logprobs"] = [[{"logprob": -0.1, "token_id": 12366}]]  # another shape
    result = check(reply=reply, speculative=False)
    (blind,) = result.blind
    assert result.ok and blind.startswith("/generate meta_info.output_top_logprobs (top_logprobs_num 5): expected a "
                                          "list per output token of (logprob, token_id, text) triples, got [[{")
    del reply["meta_info"]["input_token_logprobs"]
    assert len(check(reply=reply, speculative=False).blind) == 2


def test_no_server_info_and_no_reply() -> None:
    result = check(info=None, reply=None)
    assert result.blind[0] == "GET /server_info: expected a JSON object, got absent"
    assert result.problems[0] == "POST /generate: expected a JSON object, got absent"


def test_log_lines_every_rank_and_nccls_own_are_blind_readers() -> None:
    result = check(log="\n".join(LOG.splitlines()[:6]))
    (blind,) = result.blind
    assert result.ok and blind == ("engine log: a '[... TPn]' line from every rank: expected lines from ranks 0-7, got "
                                   '"none from ranks 6, 7 (ranks seen: [0, 1, 2, 3, 4, 5])"')
    (blind,) = check(nccl=True).blind
    assert blind.startswith("engine log: NCCL's 'host:pid:tid [dev] NCCL INFO' lines (NCCL_DEBUG=INFO)")
    assert check(tp=1, log="").ok and len(check(tp=1, log="").checked) == 11  # no all-reduce: no rank lines


def test_the_contract_request_asks_the_baseline_for_the_probes_logprobs() -> None:
    assert contract_request(speculative=False)["top_logprobs_num"] == 5
    assert contract_request(speculative=False)["logprob_start_len"] == 0
    assert "return_logprob" not in contract_request(speculative=True)  # never asked of a speculative engine
