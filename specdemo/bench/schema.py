"""The results of a bench run (benchmarks.json), and how the report, the plots and the targets find
lanes in them: by the lanes' typed fields, never by their labels.

Top level:
    schema (table.SCHEMA), table [every section's runs: table.row, read back by table.load], command, started (ISO time), seconds, machine (machine.describe()), load_average_end,
    bench (BenchSettings), run_settings (RunSettings), models {target, draft: LoadedModel.describe()},
    costs (CostModel.to_dict()), warm_up_s, plan (Plan), sections {name: section}, targets [target],
    skipped_for_memory [section names the memory bound left no room for] (absent when none),
    tune (Profile.tune_record(): file, trials [the last tune's Trial dicts], draft_plan {precision, head_tokens, options,
    planned_at} or null; {} when the machine was not tuned).

A lane's fields (Lane.fields() in table.py), wherever a lane is described:
    framework  "specdemo" | "genai" | "transformers" | "llamacpp"
    kind       "autoregressive" | "speculative"
    baseline   label of the autoregressive lane a speculative lane's speedup is over (null otherwise)
    reference  label of the lane whose token ids it should reproduce (null: the section's first lane)
    k          draft tokens per round (null when autoregressive or auto K); k_policy "fixed" | "adaptive" | "auto"
    drafter    "model" | "prompt-lookup" (null when autoregressive); models  what it runs, with precisions

A spread is stats.Spread: {median, min, max, mean, std, n}. The table's rows (table.row) carry each run's lane by its
label and fields, its section, its setting (the section's pass: "", or GENAI_DEFAULTS) and its times; a section's
lanes, their times, speedups and ratios of decode rates are queries over its rows (stats.section).

Every section has seconds and load_average_end, and:
    paper         k, k_label, k_policy (its rule), genai_compile (target / draft: GenAI's compile properties; differs:
                  where they are not ours), genai_target, genai_draft (the precision GenAI's model ran at where ours ran
                  specdemo's kernels, else null), time_shares {kind: {component: share}} (our lanes at the longest N)
    transformers  k, max_new_tokens, dtype (its lanes, their times and ratios: the table's rows); or skipped
    fidelity      examples, candidates [results.fidelity.Fidelity's fields]; or skipped
    nodes         tokens_per_call [1, K + 1], gguf_read_bytes (per token, or null without a GGUF), targets
                  [nodes.TargetNodes: its fields, a group a NodeGroup's and its gb_per_s]
    llamacpp      k, k_label, max_new_tokens, threads, version, system_info (llama.cpp's CPU features), kernels_isa
                  (our kernels' path where a lane ran gguf-native, else null), weights {role: precision}, text_agreement
                  [{instruction, same_tokens, of}] (its lanes, llama-bench's and llama-speculative-simple's rows too: the
                  table); or skipped (a sentence: llama_cpp not installed, or models that are no GGUF)
    k, vocab, lookup, precision, kv
                  max_new_tokens, rows (precision, kv: k, k_label; lookup: k): a row per speculative lane, its label
                  and what the table does not hold of it: k (stats.counterfactual_figures), vocab (head_tokens,
                  rows_kept, draft_step_costed_s), precision (target, draft, draft_bytes), kv (kv_cache_precision).
                  Each lane's figures are the table's (stats.sweep_rows)
    watching      instruction, max_new_tokens, repeats, idle_s, browser_cpu [{idle_s, run_s, run_wall_s}] (its runs: the
                  table's, their setting the mode that ran them: "CLI", "page API", "page in Chromium")
    gating        max_new_tokens, curves {name: CostModel}, rows [gating.Row's fields] (opt-in)
    humaneval     humaneval.HumanEval's fields (each lane by its label and fields: HumanEval.to_json); or skipped
    memory        max_new_tokens, autoregressive and speculative: memory.Peaks's fields (bytes, and tokens)

A target: id, target (a sentence), where, goal, sense ("≤" | "≥"), unit ("ratio" | "share"), measured, met, gap.
"""

from __future__ import annotations

from specdemo.names import AUTOREGRESSIVE, SPECULATIVE

# (framework, kind) of the lanes the report names.
OURS_AR = ("specdemo", AUTOREGRESSIVE)
OURS_SPEC = ("specdemo", SPECULATIVE)
GENAI_AR = ("genai", AUTOREGRESSIVE)
GENAI_SPEC = ("genai", SPECULATIVE)
HF_SPEC = ("transformers", SPECULATIVE)
GENAI_DEFAULTS = "GenAI's defaults"  # Run.setting of the paper's pass with GenAI on its own compile defaults

