"""Sweep spec data for the validation tests: one valid spec, a way to break one field of it,
and the broken specs every front door must refuse naming the field (``SweepSpec`` and the CLI)."""

from __future__ import annotations

import copy

__all__ = ["BASE", "BROKEN", "with_"]

BASE = {
    "name": "t",
    "engine": {
        "kind": "sglang",
        "model_path": "org/model",
        "draft_model_path": "org/draft",
        "tp_size": 2,
    },
    "search": {
        "speculative": {"num_steps": [1, 3], "eagle_topk": [1, 2], "num_draft_tokens": {"low": 2, "high": 8}},
        "nccl_env": {"NCCL_ALGO": [None, "Ring"]},
    },
}


def with_(path: str, value) -> dict:
    """BASE with the dotted ``path`` set to ``value`` (``...`` deletes it)."""
    data = copy.deepcopy(BASE)
    *parents, leaf = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    if value is ...:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return data


BROKEN = [
    # (what is broken, spec, field that must be named, words the message must contain)
    ("unknown top-level key", with_("budgte", {"num_trials": 3}), "budgte", "did you mean 'budget'"),
    ("unknown engine key", with_("engine.modle_path", "x"), "engine.modle_path", "did you mean 'model_path'"),
    ("wrong type", with_("engine.tp_size", "eight"), "engine.tp_size", "integer"),
    ("bad engine kind", with_("engine.kind", "vllm"), "engine.kind", "sglang"),
    ("NCCL value outside NCCL's set", with_("search.nccl_env", {"NCCL_ALGO": [None, "Rnig"]}),
     "search.nccl_env.NCCL_ALGO", "Ring"),
    ("unknown NCCL variable", with_("search.nccl_env", {"NCCL_ALOG": [None, "Ring"]}),
     "search.nccl_env.NCCL_ALOG", "unknown NCCL variable"),
    ("dangerous protocol not allowed", with_("search.nccl_env", {"NCCL_PROTO": [None, "LL128"]}),
     "search.nccl_env.NCCL_PROTO", "allow_dangerous"),
    ("dangerous buffer size not allowed", with_("search.nccl_env", {"NCCL_BUFFSIZE": [None, 8388608]}),
     "search.nccl_env.NCCL_BUFFSIZE", "hangs"),
    ("NVLS algorithm not allowed", with_("search.nccl_env", {"NCCL_ALGO": [None, "NVLS"]}),
     "search.nccl_env.NCCL_ALGO", "NVLink multicast"),
    ("SGLang-managed variable in the env space", with_("search.nccl_env", {"NCCL_CUMEM_ENABLE": [None, "1"]}),
     "search.nccl_env.NCCL_CUMEM_ENABLE", "enable-symm-mem"),
    ("SGLang-managed variable in fixed env", with_("engine.env", {"NCCL_NVLS_ENABLE": "1"}),
     "engine.env.NCCL_NVLS_ENABLE", "enable-nccl-nvls"),
    ("NVLS through an exclusion list", with_("search.nccl_env", {"NCCL_PROTO": [None, "^LL,Simple"]}),
     "search.nccl_env.NCCL_PROTO", "LL128"),
    ("NVLS engine flag not allowed", with_("engine.extra_args", {"enable_nccl_nvls": True}),
     "engine.extra_args.enable_nccl_nvls", "allow_dangerous"),
    ("symmetric memory (NVLS) not allowed", with_("engine.extra_args", {"enable-symm-mem": True}),
     "engine.extra_args.enable_symm_mem", "NVLink multicast"),
    ("Ray-managed variable in fixed env", with_("engine.env", {"CUDA_VISIBLE_DEVICES": "0,1"}),
     "engine.env.CUDA_VISIBLE_DEVICES", "Ray assigns"),
    ("NCCL space without the default", with_("search.nccl_env", {"NCCL_ALGO": ["Ring", "Tree"]}),
     "search.nccl_env.NCCL_ALGO", "default"),
    ("a searched variable that is no NCCL variable", with_("search.nccl_env", {"OMP_NUM_THREADS": [None, "4"]}),
     "search.nccl_env", "'OMP_NUM_THREADS' is not an NCCL variable"),
    ("an empty name in an NCCL preset", with_("search", {"nccl_presets": [{}, {"": 0}]}),
     "search.nccl_presets.1", "'' is not an NCCL variable"),
    ("every searched triple overflows the tree: SGLang's own choice alone is no search",
     with_("search.speculative", {"num_steps": [1], "eagle_topk": [2], "num_draft_tokens": [8, 16], "include_auto": True}),
     "search.speculative", "only SGLang's own choice"),
    ("tree cannot hold the draft tokens", with_("search.speculative", {"num_steps": 1, "eagle_topk": 2, "num_draft_tokens": 8}),
     "search.speculative", "num_draft_tokens - 1 <= topk"),
    ("draft tokens missing for a tree", with_("search.speculative", {"num_steps": 2, "eagle_topk": [1, 4]}),
     "search.speculative", "num_draft_tokens is required"),
    ("range upside down", with_("search.speculative", {"num_steps": {"low": 5, "high": 2}}),
     "search.speculative.num_steps", "below low"),
    ("speculation off but searched", with_("engine.speculative_algorithm", None),
     "search.speculative", "speculative_algorithm is null"),
    ("draft model missing", with_("engine.draft_model_path", ...), "engine", "needs draft_model_path"),
    ("managed flag in extra_args", with_("engine.extra_args", {"speculative-num-steps": 3}),
     "engine.extra_args.speculative_num_steps", "search.speculative"),
    ("objective metric unknown", with_("objective", {"metric": "throughput"}), "objective.metric", "output_tok_per_s"),
    ("objective direction backwards", with_("objective", {"metric": "ttft_ms_p99", "mode": "max"}),
     "objective", "mode: min"),
    ("objective concurrency not measured", with_("objective", {"concurrency": 3}), "objective.concurrency", "[1, 8]"),
    ("random prompts for tuning", with_("benchmark", {"dataset": "random"}), "benchmark.dataset",
     "allow_random_prompts"),
    ("sharegpt without a file", with_("benchmark", {"dataset": "sharegpt"}), "benchmark.dataset", "dataset_path"),
    ("too few GPUs", with_("resources", {"gpus_per_trial": 1}), "resources.gpus_per_trial", "tp_size=2"),
    ("NCCL space on one rank", with_("engine.tp_size", 1), "search.nccl_env", "tp_size > 1"),
    ("negative repetitions", with_("benchmark", {"repetitions": 0}), "benchmark.repetitions", "expected an integer in [1, 100]"),
    ("bad name", with_("name", "my sweep!"), "name", "pattern"),
    # strict types: YAML's true / "8" / 7 are not silently read as 1 / 8 / "7"
    ("boolean for an integer", with_("engine.tp_size", True), "engine.tp_size",
     "got true (a boolean); expected an integer"),
    ("string for an integer", with_("engine.tp_size", "8"), "engine.tp_size",
     "got '8' (a string); expected an integer in [1, 64], e.g. 8"),
    ("boolean for a number", with_("budget", {"trial_timeout_s": True}), "budget.trial_timeout_s",
     "got true (a boolean); expected a number"),
    ("string for a number", with_("budget", {"trial_timeout_s": "60"}), "budget.trial_timeout_s",
     "got '60' (a string); expected a number"),
    ("number for a string", with_("engine.model_path", 7), "engine.model_path",
     "got 7 (an integer); expected a string"),
    ("number for a boolean", with_("search.speculative.include_auto", 1), "search.speculative.include_auto",
     "got 1 (an integer); expected true or false"),
    ("boolean for an NCCL value", with_("search.nccl_env", {"NCCL_ALGO": [None, True]}),
     "search.nccl_env.NCCL_ALGO.1", "a string, an integer or null"),
    ("boolean for a dimension", with_("search.speculative.num_steps", True), "search.speculative.num_steps",
     "a number, a list of numbers or {low, high}"),
    ("NaN timeout", with_("budget", {"trial_timeout_s": float("nan")}), "budget.trial_timeout_s", "finite number"),
    ("infinite time limit", with_("budget", {"time_limit_s": float("inf")}), "budget.time_limit_s", "finite number"),
    # absurd numbers: refused with the allowed range
    ("absurd num_steps", with_("search.speculative.num_steps", [10**30]), "search.speculative.num_steps",
     "outside [1, 16]"),
    ("absurd range end", with_("search.speculative.num_steps", {"low": 1, "high": 10**30}),
     "search.speculative.num_steps", "is outside [1, 16]"),
    ("absurd top-k", with_("search.speculative.eagle_topk", 17), "search.speculative.eagle_topk", "outside [1, 16]"),
    ("absurd draft tokens", with_("search.speculative.num_draft_tokens", [4, 65]),
     "search.speculative.num_draft_tokens", "outside [2, 64]"),
    ("one draft token", with_("search.speculative.num_draft_tokens", 1), "search.speculative.num_draft_tokens",
     "outside [2, 64]"),
    ("list longer than allowed", with_("search.speculative.num_steps", [1] * 1025), "search.speculative.num_steps",
     "at most 1024"),
    ("absurd timeout", with_("budget", {"trial_timeout_s": 1e12}), "budget.trial_timeout_s",
     "expected a number in (0, 2592000]"),
    ("absurd parallel trials", with_("budget", {"max_concurrent_trials": 10**30}), "budget.max_concurrent_trials",
     "expected an integer in [1, 1024]"),
    ("absurd GPUs", with_("resources", {"gpus_per_trial": 10**30}), "resources.gpus_per_trial",
     "expected an integer in [0, 1024] or null"),
    ("absurd objective concurrency", with_("objective", {"concurrency": 10**30}), "objective.concurrency",
     "expected an integer in [1, 10000] or null"),
    ("absurd tp size", with_("engine.tp_size", 10**30), "engine.tp_size", "expected an integer in [1, 64]"),
    # a space too large to sweep: refused, counted without listing it
    ("NCCL space too large",
     with_("search.nccl_env", {name: [None, *range(1, 65)] for name in
                               ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS")}),
     "search", "at most 1,000,000 are allowed"),
]
