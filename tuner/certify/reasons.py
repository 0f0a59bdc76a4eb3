"""Why a config or a seat was refused: the reasons stored with every refusal, each with
what it means. Plain data, imported by the store, the status rules and the CLI's help."""

REFUSAL_REASONS = {
    "smem_over_budget": "estimated shared memory over the profile's budget (never launched)",
    "stages_over_max": "num_stages over the profile's pipelining.max_num_stages (never launched)",
    "no_tma": "TMA loads on a device without a TMA unit (never launched)",
    "not_applicable": "the config's schedule cannot help at the seat's shapes, e.g. split-K over a short K (never launched)",
    "equivalent": "same compiled code as another candidate on this profile (never launched)",
    "out_of_resources": "the compiler or driver reported too few resources",
    "compile_error": "failed to compile",
    "launch_error": "failed to launch or run",
    "crash": "killed the worker process (illegal address, trap, abort)",
    "timeout": "ran past the profile's candidate_timeout_s",
    "wrong_answer": "error against the fp64 oracle over the profile's tolerance",
    "non_finite": "NaN or Inf where the oracle is finite",
    "unwritten_output": "left output elements unwritten (still poisoned)",
    "imprecise": "error far above the most accurate candidate's on the same inputs",
    "nondeterministic": "two launches on the same inputs differ bit for bit (not allowed by the kernel)",
    "dtype_unscreenable": "the profile cannot screen this dtype (the whole seat)",
    "prepare_error": "the seat's inputs or fp64 oracle could not be made (the whole seat)",
    "all_refused": "every candidate was refused (the whole seat)",
    "worker_lost": "the worker was killed from outside (out of memory, kill -9) or died preparing "
                   "the seat: not judged; the next census tries again",
}
# Failures that are not the candidate's or the seat's own: never final.
TRANSIENT_REASONS = frozenset({"worker_lost"})
