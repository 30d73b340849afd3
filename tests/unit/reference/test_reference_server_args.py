"""Command line: SGLang's flag names, SGLang's speculative rules, exit status 2 on bad input."""

from __future__ import annotations

import logging

import pytest

from serving.reference.config import PRESETS, resolve_draft_layers
from serving.reference.server_args import ServerArgs, parse_args


def parse(*argv: str) -> ServerArgs:
    return parse_args(["--model-path", "ref-tiny", *argv], cuda_available=False, cuda_device_count=0)


def test_defaults_match_sglang() -> None:
    args = parse()
    assert (args.host, args.port, args.tp_size, args.device) == ("127.0.0.1", 30000, 1, "cpu")
    assert not args.speculative
    assert args.max_running_requests == PRESETS["ref-tiny"].default_max_running_requests
    assert args.context_length == PRESETS["ref-tiny"].context_length
    assert args.random_seed == PRESETS["ref-tiny"].seed
    assert args.decode_log_interval == 40


def test_sglang_flag_names_and_aliases() -> None:
    args = parse(
        "--tp-size", "2", "--host", "0.0.0.0", "--port", "1234", "--enable-metrics", "--disable-custom-all-reduce",
        "--max-running-requests", "7", "--context-length", "512", "--random-seed", "9", "--log-level", "warning",
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "ref-tiny-draft",
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6",
        "--mem-fraction-static", "0.8", "--disable-cuda-graph",
    )
    assert args.tp_size == 2 and args.host == "0.0.0.0" and args.port == 1234
    assert args.enable_metrics and args.disable_custom_all_reduce
    assert (args.max_running_requests, args.context_length, args.random_seed) == (7, 512, 9)
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (3, 2, 6)
    info = args.to_dict()
    assert info["mem_fraction_static"] == 0.8 and info["disable_cuda_graph"] is True
    assert info["disable_custom_all_reduce"] is True
    assert parse("--tp-size", "2").tp_size == parse("--tensor-parallel-size", "2").tp_size == 2
    assert parse("--speculative-algorithm", "EAGLE3", "--speculative-draft-model", "ref-tiny-draft",
                 ).speculative_draft_model_path == "ref-tiny-draft"


@pytest.mark.parametrize("flag", ["--tp", "--speculative-algo", "--cuda-graph-bs", "--cuda-graph-max-bs"])
def test_names_sglang_lacks_exit_2(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    # SGLang 0.5.23 registers none of these (serving/data/sglang_server_flags.json): a command line
    # the reference engine took with them would fail on SGLang, at launch on a GPU node.
    with pytest.raises(SystemExit) as info:
        parse(flag, "2")
    assert info.value.code == 2
    assert f"unrecognized arguments: {flag}" in capsys.readouterr().err


def test_unknown_flag_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse("--no-such-flag", "1")
    assert info.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"], "unset: --speculative-eagle-topk"),
        (["--speculative-algorithm", "NGRAM"], "not supported"),
        (["--speculative-num-steps", "3"], "without --speculative-algorithm"),
        (["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "2", "--speculative-eagle-topk", "2",
          "--speculative-num-draft-tokens", "8"], "use at most 7"),
        (["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "ref-small-draft"], "does not belong"),
        (["--tp-size", "3"], "does not divide"),
        (["--device", "cuda"], "no CUDA device"),
        (["--max-running-requests", "0"], "--max-running-requests"),
        (["--dtype", "int8"], "--dtype"),
    ],
)
def test_bad_values_exit_2_naming_the_flag(argv, needle, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, needle",
    [
        # a value that used to reach the workers and fail there, after the port was bound
        (["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "1000000000000000000000000000000",
          "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"],
         "--speculative-num-steps must be an integer in [1, 16], got 1000000000000000000000000000000"),
        (["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "100000",
          "--speculative-num-draft-tokens", "4"], "--speculative-eagle-topk must be an integer in [1, 16]"),
        (["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
          "--speculative-num-draft-tokens", "-3"], "--speculative-num-draft-tokens must be an integer in [2, 64]"),
        # beyond the rotary table: a long request would fail in the worker with an IndexError
        (["--context-length", "6000"], "--context-length must be an integer in [2, 4096], got 6000"),
        (["--context-length", "1"], "--context-length must be an integer in [2, 4096], got 1"),
        (["--port", "70000"], "--port must be an integer in [1, 65535], got 70000"),
        (["--port", "0"], "--port must be an integer in [1, 65535], got 0"),
        (["--tp-size", "0"], "--tp-size must be an integer in [1, 1024], got 0"),
        (["--max-running-requests", "100000000000"], "--max-running-requests must be an integer in [1, 65536]"),
        (["--max-prefill-tokens", "0"], "--max-prefill-tokens must be an integer in [1, 1073741824], got 0"),
        (["--decode-log-interval", "0"], "--decode-log-interval must be an integer in [1, 1073741824], got 0"),
        (["--random-seed", str(2**64)], "--random-seed must be an integer in [-9223372036854775808, 18446744073709551615]"),
        (["--mem-fraction-static", "nan"], "--mem-fraction-static must be a finite number, got nan"),
        (["--mem-fraction-static", "1.5"], "--mem-fraction-static must be in (0, 1], got 1.5"),
        (["--page-size", "0"], "--page-size must be an integer in [1, 65536], got 0"),
        (["--dist-init-addr", "localhost"], "--dist-init-addr must be host:port"),
        (["--dist-init-addr", "127.0.0.1:99999"], "--dist-init-addr must be host:port with a port in [1, 65535]"),
    ],
)
def test_out_of_range_numbers_exit_2_naming_the_flag_and_range(argv, needle, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert needle in captured.err
    assert captured.out == "", "argparse's convention: usage and error on stderr, nothing on stdout"


def test_bounds_themselves_are_accepted() -> None:
    args = parse("--context-length", "4096", "--port", "65535", "--random-seed", str(2**64 - 1),
                 "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "16", "--speculative-eagle-topk", "16",
                 "--speculative-num-draft-tokens", "64", "--dist-init-addr", "127.0.0.1:29500")
    assert (args.context_length, args.port, args.random_seed) == (4096, 65535, 2**64 - 1)
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (16, 16, 64)


def test_unknown_model_lists_presets(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--model-path", "meta-llama/Llama-3-8B"], cuda_available=False, cuda_device_count=0)
    err = capsys.readouterr().err
    assert "ref-tiny" in err and "ref-gpu-comm" in err


def test_auto_choice_and_48_cap_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        args = parse("--speculative-algorithm", "EAGLE3")
    assert args.speculative
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (
        PRESETS["ref-tiny"].auto_speculative
    )
    assert args.max_running_requests == 48
    assert args.speculative_draft_model_path == "ref-tiny-draft"
    text = caplog.text
    assert "auto-chose" in text and "Max running requests is reset to 48" in text
    assert "speculative_draft_model_path" in text
    assert parse("--speculative-algorithm", "EAGLE3", "--max-running-requests", "100").max_running_requests == 100


def test_topk_1_forces_chain_length_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        args = parse("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "5",
                     "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3")
    assert args.speculative_num_draft_tokens == 6
    assert "speculative_num_draft_tokens is adjusted" in caplog.text


def test_no_warning_for_a_chain_that_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    """The chain adjustment is logged only for a triple that is then accepted."""
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit):
        parse("--speculative-algorithm", "EAGLE", "--speculative-num-steps", "65",
              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3")
    assert "adjusted" not in caplog.text


def test_speculative_none_means_off() -> None:
    assert not parse("--speculative-algorithm", "NONE").speculative


def test_draft_path_spellings() -> None:
    preset = PRESETS["ref-tiny"]
    assert resolve_draft_layers(draft_path="ref-tiny", preset=preset) == preset.draft_layers
    assert resolve_draft_layers(draft_path="ref-tiny-draft", preset=preset) == preset.draft_layers
    assert resolve_draft_layers(draft_path="ref-tiny-draft-L3", preset=preset) == 3
    with pytest.raises(ValueError, match="after 1 to 7 layers"):
        resolve_draft_layers(draft_path="ref-tiny-draft-L8", preset=preset)


# ------------------------------------------------------------------ one engine across nodes (issue 31)
def test_node_flags_default_as_sglang_and_place_ranks_as_sglang() -> None:
    """SGLang 0.5.23 (srt/arg_groups/fields/parallel.py): --nnodes 1, --node-rank 0, no
    --dist-init-addr; node r runs TP ranks [tp/N * r, tp/N * (r + 1)) (engine.py _calculate_rank_ranges)."""
    args = parse()
    assert (args.nnodes, args.node_rank, args.dist_init_addr) == (1, 0, None)
    assert list(args.node_tp_ranks) == [0] and list(parse("--tp-size", "4").node_tp_ranks) == [0, 1, 2, 3]
    spread = [parse("--tp-size", "4", "--nnodes", "2", "--node-rank", str(r), "--dist-init-addr", "10.0.0.1:5000")
              for r in (0, 1)]
    assert [list(a.node_tp_ranks) for a in spread] == [[0, 1], [2, 3]]
    assert all(a.ranks_per_node == 2 and a.tp_size == 4 for a in spread)
    info = spread[1].to_dict()
    assert (info["nnodes"], info["node_rank"], info["dist_init_addr"]) == (2, 1, "10.0.0.1:5000")


def test_what_spectunes_command_builder_renders_is_taken_and_the_sglang_alias_too() -> None:
    """serving/engine/command.py renders ``--nnodes N --node-rank R --dist-init-addr host:port``."""
    from serving.engine.command import render_flags

    argv = render_flags({"tp_size": 2, "nnodes": 2, "node_rank": 1, "dist_init_addr": "127.0.0.1:29500"})
    assert argv == ["--tp-size", "2", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "127.0.0.1:29500"]
    args = parse(*argv)
    assert (args.nnodes, args.node_rank, args.dist_init_addr) == (2, 1, "127.0.0.1:29500")
    assert parse("--tp-size", "2", "--nnodes", "2", "--nccl-init-addr", "h:1").dist_init_addr == "h:1"


def test_node_flags_help_is_sglangs() -> None:
    from serving.reference.server_args import build_parser

    helps = {a.dest: a.help for a in build_parser()._actions}  # noqa: SLF001
    assert helps["nnodes"] == "The number of nodes." and helps["node_rank"] == "The node rank."
    assert helps["dist_init_addr"] == "The host address for initializing distributed backend (e.g., `192.168.0.2:25000`)."


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--tp-size", "2", "--nnodes", "4"], "--tp-size 2 is not divisible by --nnodes 4: tp_size must be divisible by number of nodes"),
        (["--tp-size", "2", "--nnodes", "2", "--node-rank", "2"], "--node-rank must be an integer in [0, 1] (a node of --nnodes 2), got 2"),
        (["--node-rank", "-1"], "--node-rank must be an integer in [0, 0] (a node of --nnodes 1), got -1"),
        (["--node-rank", "1"], "--node-rank must be an integer in [0, 0]"),
        (["--nnodes", "0"], "--nnodes must be an integer in [1, 1024], got 0"),
        (["--tp-size", "2", "--nnodes", "2", "--nccl-init-addr", "nohost"], "--dist-init-addr must be host:port"),
    ],
)
def test_bad_node_flags_exit_2_naming_the_flag(argv, needle, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2
    assert needle in capsys.readouterr().err


def test_nnodes_without_dist_init_addr_is_taken_as_sglang_takes_it_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """SGLang 0.5.23 does not require --dist-init-addr: each node then meets at its own host's free
    port (distributed/bootstrap.py _resolve_dist_init_method) and the nodes never meet."""
    with caplog.at_level(logging.WARNING, logger="serving.reference.server_args"):
        args = parse("--tp-size", "2", "--nnodes", "2", "--node-rank", "1")
    assert args.dist_init_addr is None
    assert "--nnodes 2 without --dist-init-addr" in caplog.text and "never meet" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="serving.reference.server_args"):
        parse("--tp-size", "2")
    assert "dist-init-addr" not in caplog.text


def test_gpus_needed_are_counted_per_node(capsys: pytest.CaptureFixture[str]) -> None:
    """Each node needs only its own ranks' GPUs (rank k uses device k % (tp_size / nnodes))."""
    def refused(*argv: str, gpus: int) -> str:
        with pytest.raises(SystemExit):
            parse_args(["--model-path", "ref-tiny", "--device", "cuda", "--reference-gpu-kind", "sm90-nvlink", *argv],
                       cuda_available=True, cuda_device_count=gpus)
        return capsys.readouterr().err

    assert "--tp-size 4 needs 4 GPUs but 2 are visible" in refused("--tp-size", "4", gpus=2)
    assert "--tp-size 4 needs 2 GPUs on each of --nnodes 2 but 1 are visible" in refused(
        "--tp-size", "4", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "h:1", gpus=1)
