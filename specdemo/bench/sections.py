"""The sections that put us beside others: the paper's experiment (with OpenVINO GenAI in the same
loop), transformers and llama.cpp; the GGUF's fidelity, where a target call's time goes. Each returns the figures the
report reads (schema.Figures); settings.REGISTRY names every section's runner."""

from __future__ import annotations

import gc

from specdemo.bench import llamacpp, nodes, peers, stats
from specdemo.bench.harness import Context, genai_compile, log_progress, measure, our_lane, peer_lane
from specdemo.bench.schema import Agreement, FidelitySection, Figures, LlamaCpp, Nodes, Paper, Skipped
from specdemo.bench.table import GENAI_DEFAULTS, Lane, Run
from specdemo.decoding.drafters import with_counterpart
from specdemo.host import memory
from specdemo.learning import builtin, tune
from specdemo.learning.disk import size
from specdemo.learning.race import PIECE
from specdemo.models import kernels, sources
from specdemo.models.chat import encode_example
from specdemo.models.loading import describe_compile
from specdemo.names import AUTOREGRESSIVE, SPECULATIVE
from specdemo.results import fidelity
from specdemo.results.parting import first_difference


def run_paper(ctx: Context) -> Paper:
    """Autoregressive vs speculative at the paper's N, with GenAI's pipelines in the same loop (their times, speedups and
    ratios: the table's); where our loops' time goes at the longest N, from their rounds, which the table does not keep.
    Then, if asked, a shorter pass with GenAI on its own compile defaults instead of ours (setting GENAI_DEFAULTS)."""
    generation, k = ctx.generation, ctx.k
    ours_ar = our_lane("ours autoregressive", ctx.engine, AUTOREGRESSIVE, generation)
    ours = [ours_ar, our_lane("ours speculative", ctx.engine, SPECULATIVE, generation, baseline=ours_ar)]
    genai_ar = ctx.genai_lane("GenAI autoregressive", "plain")
    lanes = ours + [genai_ar, ctx.genai_lane("GenAI speculative", SPECULATIVE, baseline=genai_ar)]
    instructions = ctx.code_instructions()
    for n in sorted(ctx.bench.paper_tokens):  # the longest last: its runs' rounds give the time shares
        ctx.log(f"paper: N={n}, K={k}, {len(lanes)} lanes")
        runs = ctx.keep(measure(lanes, instructions, ctx.prompts(instructions), n, ctx.bench, ctx.log))
    # GenAI's precision of the target, then the draft, where it is not ours (ours on specdemo's kernels), else None
    theirs = [None if peer.settings.precision == mine.settings.precision else peer.settings.precision
              for peer, mine in ((ctx.genai_target(), ctx.engine.target), (ctx.genai_draft(), ctx.engine.draft))]
    shares = {lane.kind: stats.time_shares(stats.lane_runs(runs, lane)) for lane in ours}
    figures = Paper(k, ctx.k_label(peers=True), generation.k_policy.rule,
                    genai_compile(ctx.genai_target(), ctx.genai_draft()), *theirs, shares)
    if ctx.bench.genai_defaults_instructions:
        n = max(ctx.bench.paper_tokens)
        # Let the pipelines above go before two more copies of the target load: the runs hold their lanes, the lanes
        # their pipelines' generate, the context the pipelines themselves (kept, they held 9.2 GiB at this pass).
        del lanes, genai_ar, runs
        ctx.drop_genai()
        genai_ar = ctx.genai_lane("GenAI autoregressive (its defaults)", "plain (defaults)")
        lanes = ours + [genai_ar, ctx.genai_lane("GenAI speculative (its defaults)", "speculative (defaults)", baseline=genai_ar)]
        instructions = ctx.code_instructions(ctx.bench.genai_defaults_instructions)
        ctx.log(f"paper: GenAI on its own compile defaults, N={n}")
        ctx.keep(measure(lanes, instructions, ctx.prompts(instructions), n, ctx.bench, ctx.log), GENAI_DEFAULTS)
    return figures


def run_transformers(ctx: Context) -> Figures | Skipped:
    """transformers generate() and assisted generation beside ours, same prompts, same K."""
    missing = [m for m in (ctx.engine.target, ctx.engine.draft) if peers.hf_weights_missing(m.settings.source)]
    if missing:  # say what it costs on disk before writing it
        need = sum(m.describe().parameters * 4 for m in missing)
        ctx.log(f"transformers runs on float32 copies of the weights: about {size(need)} more under "
                f"{sources.specdemo_home() / 'bench' / 'hf'} (python -m specdemo clean --remove bench frees it)")
    target_hf = peers.hf_weights(ctx.settings.target.source, log_progress(ctx.log, "dequantizing target"))
    draft_hf = peers.hf_weights(ctx.settings.draft.source, log_progress(ctx.log, "dequantizing draft"))
    if target_hf is None or draft_hf is None:
        return Skipped("transformers needs the Hugging Face weights: use preset models or local Hugging Face folders")
    ctx.log(f"loading transformers models (float32) from {target_hf.parent}, in a process of their own")
    pair = peers.PeerProcess(peers.TransformersPair, target_hf, draft_hf)
    generation, k, n = ctx.generation, ctx.k, min(ctx.bench.transformers_tokens, ctx.generation.max_new_tokens)
    ours_ar = our_lane("ours autoregressive", ctx.engine, AUTOREGRESSIVE, generation)
    ours_spec = our_lane("ours speculative", ctx.engine, SPECULATIVE, generation, baseline=ours_ar)
    hf_ar = peer_lane(Lane("transformers autoregressive", "transformers", AUTOREGRESSIVE), pair.generate, eos_ids=ctx.engine.eos_ids)
    assisted = Lane("transformers assisted", "transformers", SPECULATIVE, baseline=hf_ar, reference=hf_ar, k=k,
                    k_policy="fixed", drafter=with_counterpart("draft").name)
    hf_spec = peer_lane(assisted, pair.generate, eos_ids=ctx.engine.eos_ids, k=k)
    lanes = [ours_ar, ours_spec, hf_ar, hf_spec]
    instructions = ctx.code_instructions(ctx.bench.transformers_instructions)
    ctx.log(f"transformers: N={n}, K={k}, {len(instructions)} instructions")
    ctx.keep(measure(lanes, instructions, ctx.prompts(instructions), n, ctx.bench, ctx.log))  # the report reads the table
    pair.close()
    return Figures()  # its lanes, their K and N: the table's


def run_llamacpp(ctx: Context) -> LlamaCpp | Skipped:
    """llama.cpp (llama-cpp-python) on the GGUF files our IRs are converted from: autoregressive, prompt lookup and
    draft model at the same K, beside our autoregressive and speculative loops; skipped in one line without it."""
    if skipped := llamacpp.missing():
        ctx.log(skipped)
        return Skipped(skipped)
    target = llamacpp.gguf_path(ctx.settings.target.source, log_progress(ctx.log, "target GGUF"))
    if target is None:
        return Skipped("llama.cpp: skipped (it runs GGUF files: use a preset target or a local .gguf file)")
    draft = llamacpp.gguf_path(ctx.settings.draft.source, log_progress(ctx.log, "draft GGUF"))
    peer = peers.PeerProcess(llamacpp.LlamaCppPeer, target, draft, about=("threads", "version", "system_info"))
    generation, k, eos_ids = ctx.generation, ctx.k, ctx.engine.eos_ids
    gguf = " + ".join(path.name for path in (target, draft) if path)
    ours_ar = our_lane("ours autoregressive", ctx.engine, AUTOREGRESSIVE, generation)
    lanes = [ours_ar, our_lane("ours speculative", ctx.engine, SPECULATIVE, generation, baseline=ours_ar)]
    cpp_ar = peer_lane(Lane("llama.cpp autoregressive", "llamacpp", AUTOREGRESSIVE, models=target.name), peer.generate,
                       eos_ids=eos_ids)
    lanes.append(cpp_ar)
    if llamacpp.tool("llama-bench"):  # llama.cpp as its own tool times it, beside its bindings on each instruction
        lanes.append(peer_lane(Lane("llama-bench (pp, tg)", "llamacpp", AUTOREGRESSIVE, models=target.name),
                               llamacpp.bench_output, model=target, threads=peer.threads))
    for kind, label in (("lookup", "llama.cpp prompt lookup"), ("draft", "llama.cpp draft model")):
        drafting = with_counterpart(kind)
        if drafting.needs_model and draft is None:
            continue  # a draft that is no GGUF: llama.cpp cannot run it
        lane = Lane(label, "llamacpp", SPECULATIVE, baseline=cpp_ar, reference=cpp_ar, k=k, k_policy="fixed",
                    drafter=drafting.name, models=gguf if drafting.needs_model else target.name)
        lanes.append(peer_lane(lane, peer.generate, eos_ids=eos_ids, drafter=drafting.name, k=k,
                               ngram=generation.lookup_ngram))
    n, instructions = ctx.sweep_tokens, ctx.code_instructions()
    ctx.log(f"llama.cpp {peer.version}: N={n}, K={k}, {peer.threads} threads, {len(instructions)} instructions")
    prompts = ctx.prompts(instructions)
    runs = ctx.keep(measure(lanes, instructions, prompts, n, ctx.bench, ctx.log))
    peer.close()
    ctx.keep(speculative_simple_runs(ctx, target, draft, prompts, n, peer.threads, cpp_ar))
    weights = {"target": ctx.engine.target.settings.precision, "draft": ctx.engine.draft.settings.precision}
    # which of our kernels' paths ran (SPECDEMO_KERNEL_ISA may hold one below the CPU's widest), beside llama.cpp's
    ours = set(kernels.ON_KERNELS) & set(weights.values())
    ours_isa = kernels.isa() if ours and kernels.unavailable() is None else None
    return LlamaCpp(k, ctx.k_label(), n, peer.threads, peer.version, peer.system_info, ours_isa, weights,
                    text_agreement(runs, ours_ar, cpp_ar))  # the lanes' figures: the report's, from the table


def speculative_simple_runs(ctx: Context, target, draft, prompts: list[list[int]], n: int, threads: int,
                            cpp_ar: Lane) -> list[Run]:
    """llama-speculative-simple, where it is built (llamacpp.tool), in its own process on each instruction's prompt
    text (after one short warm-up run). (llama-bench runs as a lane of the section, beside the bindings.)"""
    runs = []
    if draft is not None and llamacpp.tool("llama-speculative-simple"):
        lane = Lane("llama-speculative-simple", "llamacpp", SPECULATIVE, baseline=cpp_ar, k=ctx.k, k_policy="fixed",
                    drafter=with_counterpart("draft").name, models=f"{target.name} + {draft.name}")
        texts = [ctx.engine.tokenizer.decode(ids) for ids in prompts]
        llamacpp.speculative_simple(target, draft, texts[0], ctx.bench.warmup_tokens, ctx.k, threads)
        for i, text in enumerate(texts):
            out = llamacpp.speculative_simple(target, draft, text, n, ctx.k, threads)
            ctx.log(f"  llama-speculative-simple [{i + 1}/{len(texts)}]: {out.tokens} tokens, {out.decode_s:.2f} s")
            # its tokens are not compared (it prints text): same_as_reference False says nothing was checked
            runs.append(Run(lane, i, 0, n, out.prefill_s + out.decode_s, out.tokens, out.prefill_s, False,
                            proposed=out.proposed, accepted=out.accepted))
    return runs


def text_agreement(runs: list[Run], ours: Lane, theirs: Lane) -> list[Agreement]:
    """Per instruction (first pass), how far our greedy text follows llama.cpp's: the tokens both wrote before they
    part, of how many (equal when they never part)."""
    mine, peer = ({r.instruction: r.ids for r in stats.lane_runs(runs, lane) if r.repeat == 0}
                  for lane in (ours, theirs))
    return [Agreement(i, first_difference(mine[i], peer[i]), min(len(mine[i]), len(peer[i])))
            for i in sorted(mine.keys() & peer.keys())]


def run_fidelity(ctx: Context) -> FidelitySection | Skipped:
    """Each target precision, under the compile settings it runs with here, against the GGUF it came from
    (specdemo/results/fidelity.py): top-1 agreement and mean |logit error| on the built-in answers."""
    if llamacpp.gguf_path(ctx.settings.target.source) is None:
        return Skipped("fidelity: skipped (its reference is the target's GGUF: use a preset or a local .gguf file)")
    examples = [encode_example(ctx.engine.tokenizer, e) for e in builtin.code_answers()]
    ctx.log("fidelity: the reference (the GGUF's own blocks, f32, no dynamic quantization)")
    reference = tune.compile_model(fidelity.reference_settings(ctx.settings.target))
    logits = fidelity.reference_logits(reference, examples, PIECE)
    del reference  # one compile alive at a time: the reference's logits are kept instead (memory.py's bound)
    gc.collect()
    rows = []
    for settings in ctx.target_settings():
        ctx.log(f"fidelity: the target at {settings.precision}")
        if not memory.wait_for(memory.compile_need(sources.weights_bytes(settings)),
                               f"compiling the target at {settings.precision}", ctx.log):
            continue  # left out, said in a line: the other precisions are still measured
        model = tune.compile_model(settings)
        positions, agreement, error = fidelity.compare(logits, model, examples, PIECE)
        del model
        gc.collect()
        rows.append(fidelity.Fidelity(settings.precision, describe_compile(settings), positions, agreement, error))
        ctx.log(f"fidelity: {settings.precision}: {agreement:.1%} of the GGUF's greedy choices, mean |logit error| {error:.3f}")
    return FidelitySection(len(examples), rows)


def run_nodes(ctx: Context) -> Nodes:
    """Where a target call's time goes (nodes.py): each target precision compiled as it runs here, with the plugin's
    per-node counters, one token a call and K + 1 (a verify call), against the bytes of weights each group reads."""
    prompt = ctx.prompts(ctx.code_instructions(1))[0]
    tokens = (1, ctx.k + 1)
    targets = []
    for settings in ctx.target_settings():
        ctx.log(f"nodes: the target at {settings.precision}")
        targets.append(nodes.profile_target(settings, prompt, tokens, ctx.log))
    path = llamacpp.gguf_path(ctx.settings.target.source)
    return Nodes(list(tokens), nodes.gguf_read_bytes(path) if path else None, targets)
