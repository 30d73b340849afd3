"""The engine contract on hand-written answers shaped as SGLang 0.5.23 sends them: every relied-on
item present passes; each one missing, renamed or mistyped is named with what was sent instead."""

from __future__ import annotations

import copy

import pytest

from serving.engine.contract import check_engine_contract, contract_request

SERVER_INFO = {
    "model_path": "moonshotai/Kimi-K2.5", "tp_size": 8, "device": "cuda", "disable_custom_all_reduce": False,
    "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
    "internal_states": [{"avg_spec_accept_length": 2.71, "last_gen_throughput": 41.0}],
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
    assert check().ok and check(reply=[SPEC_REPLY]).ok  # SGLang may wrap one reply in a list
    assert check(reply=PLAIN_REPLY, speculative=False).ok
    assert check(log=LOG + "\n" + NCCL, nccl=True).ok
    assert check(info={**SERVER_INFO, "device": "cpu"}, nccl=True).ok  # gloo on a CPU: no NCCL lines to ask for
    assert len(check().checked) == 15


@pytest.mark.parametrize(("path", "where"), [
    (("meta_info", "spec_verify_ct"), "/generate meta_info.spec_verify_ct"),
    (("meta_info", "spec_correct_drafts_histogram"), "/generate meta_info.spec_correct_drafts_histogram"),
    (("meta_info", "completion_tokens"), "/generate meta_info.completion_tokens"),
    (("output_ids",), "/generate output_ids"),
])
def test_a_missing_reply_field_is_named(path: tuple[str, ...], where: str) -> None:
    reply = copy.deepcopy(SPEC_REPLY)
    target = reply
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    result = check(reply=reply)
    assert not result.ok and len(result.problems) == 1
    assert result.problems[0].startswith(f"{where}: expected ") and "got absent" in result.problems[0]
    assert where in result.summary()


def test_a_renamed_field_shows_its_new_name() -> None:
    info = copy.deepcopy(SERVER_INFO)
    info["internal_states"][0]["avg_spec_accept_len"] = info["internal_states"][0].pop("avg_spec_accept_length")
    (problem,) = check(info=info).problems
    assert problem.startswith("/server_info internal_states[0].avg_spec_accept_length: expected a number, got absent")
    assert "nearest: avg_spec_accept_len" in problem


def test_mistyped_values_are_quoted() -> None:
    reply = copy.deepcopy(SPEC_REPLY)
    reply["meta_info"]["spec_verify_ct"] = "2"
    (problem,) = check(reply=reply).problems
    assert problem == '/generate meta_info.spec_verify_ct: expected a positive integer (verify cycles), got "2"'
    info = {**SERVER_INFO, "speculative_eagle_topk": None}
    assert check(info=info).problems == ["/server_info speculative_eagle_topk: expected an integer (the resolved "
                                         "server arg), got null"]


def test_server_args_nested_in_internal_states_count() -> None:
    """Older SGLang repeated the server args in internal_states[0] only; the harness reads both."""
    info = {"internal_states": [{**{k: v for k, v in SERVER_INFO.items() if k != "internal_states"},
                                 "avg_spec_accept_length": 2.0}]}
    assert check(info=info).ok


def test_the_baselines_logprobs_are_part_of_the_contract() -> None:
    reply = copy.deepcopy(PLAIN_REPLY)
    reply["meta_info"]["output_top_logprobs"] = [[{"logprob": -0.1, "token_id": 12366}]]  # another shape
    (problem,) = check(reply=reply, speculative=False).problems
    assert problem.startswith("/generate meta_info.output_top_logprobs (top_logprobs_num 5): expected a list per "
                              "output token of (logprob, token_id, text) triples, got [[{")
    del reply["meta_info"]["input_token_logprobs"]
    assert len(check(reply=reply, speculative=False).problems) == 2


def test_no_server_info_and_no_reply() -> None:
    result = check(info=None, reply=None)
    assert result.problems[0] == "GET /server_info: expected a JSON object, got absent"
    assert "POST /generate: expected a JSON object, got absent" in result.problems


def test_log_lines_every_rank_and_nccls_own() -> None:
    (problem,) = check(log="\n".join(LOG.splitlines()[:6])).problems
    assert problem == ("engine log: a '[... TPn]' line from every rank: expected lines from ranks 0-7, got "
                       '"none from ranks 6, 7 (ranks seen: [0, 1, 2, 3, 4, 5])"')
    (problem,) = check(nccl=True).problems
    assert problem.startswith("engine log: NCCL's 'host:pid:tid [dev] NCCL INFO' lines (NCCL_DEBUG=INFO)")
    assert check(tp=1, log="").ok and len(check(tp=1, log="").checked) == 13  # no all-reduce: no rank lines


def test_the_contract_request_asks_the_baseline_for_the_probes_logprobs() -> None:
    assert contract_request(speculative=False)["top_logprobs_num"] == 5
    assert contract_request(speculative=False)["logprob_start_len"] == 0
    assert "return_logprob" not in contract_request(speculative=True)  # never asked of a speculative engine
