"""Command line: `python -m specdemo {prepare,generate,tune,show,bench,clean}`.

A thin layer: argparse builds one RunSettings, the engine does the work, this file prints. Errors a
user can fix are printed as one line (exit status 2), never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from specdemo import bench, errors, strict_json
from specdemo.bench import FULL, QUICK, SECTIONS
from specdemo.decoding import drafters
from specdemo.decoding.drafters import STRATEGIES
from specdemo.host import compat, memory
from specdemo.cli import tune_command
from specdemo.learning import disk
from specdemo.learning.profile import machine_profile
from specdemo.models import kernels, sources
from specdemo.results import runfile
from specdemo.settings import (AUTO, CONFIGURATIONS, FAITHFUL, KPolicy, DEFAULT_DRAFT,
                               DEFAULT_TARGET, DRAFT_PRECISION, MAX_PROMPT_TOKENS, PRECISIONS, GenerationSettings,
                               ModelSettings, RunSettings)

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specdemo", description="Speculative decoding on OpenVINO, measured.")
    commands = parser.add_subparsers(dest="command", required=True)

    prepare = commands.add_parser("prepare", help="assemble and convert the models once (shows progress)")
    _add_model_flags(prepare)

    generate = commands.add_parser("generate", help="run autoregressive and speculative generation on one instruction")
    generate.add_argument("instruction", help="what to ask the model")
    _add_model_flags(generate)
    _add_generation_flags(generate)
    generate.add_argument("--json", action="store_true", help="print the run as one JSON object instead of text")
    generate.add_argument("--save", default=None, metavar="FILE", help="also write the run to FILE as JSON (show it again "
                          "with `python -m specdemo show FILE`)")
    generate.add_argument("--max-prompt-tokens", type=int, default=MAX_PROMPT_TOKENS,
                          help=f"refuse longer prompts (default {MAX_PROMPT_TOKENS:,}, as in the page); 0 allows up to the model's context")

    tune = commands.add_parser("tune", help="choose the compile settings of both models for this machine, by measurement")
    _add_model_flags(tune)
    tune.add_argument("--draft-plan", action="store_true", help="only the draft plan (~2 min), under the compile settings "
                      "tune chose: after the draft's other precision was prepared")
    tune.add_argument("--target-only", action="store_true", help="search the target alone when this machine's draft is "
                      "tuned and planned already (another configuration's target, e.g. --configuration fastest)")
    tune.add_argument("--forget", action="store_true", help="forget what tune chose on this machine (compile settings "
                      "and draft plan): every compile goes back to the defaults; costs and history are kept")

    show = commands.add_parser("show", help="render saved runs again, several side by side (from generate --save or the page)")
    show.add_argument("files", nargs="+", help="JSON files of saved runs")

    clean = commands.add_parser("clean", help="list what specdemo keeps on disk, and remove what can go")
    clean.add_argument("--remove", default="", help="comma-separated kinds to delete: compiled, bench, other-models, "
                       "old-versions, scratch (the default pair and the measurements are never removed)")

    bench = commands.add_parser("bench", help="median autoregressive vs speculative time on code instructions")
    _add_model_flags(bench)
    _add_generation_flags(bench, max_new_tokens=100)
    _add_benchmark_flags(bench)
    return parser


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configuration", default="faithful", choices=list(CONFIGURATIONS),
                        help="faithful (a full-fidelity target, INT8 or the GGUF's own blocks, whichever steps faster "
                             "here; the default) or fastest (INT4 target: faster, another model's text)")
    parser.add_argument("--target", default=DEFAULT_TARGET.source, help="preset, HF model id, local folder or .gguf file")
    parser.add_argument("--draft", default=DEFAULT_DRAFT.source, help="preset, HF model id, local folder or .gguf file")
    parser.add_argument("--target-precision", default=None, choices=PRECISIONS + (FAITHFUL,),
                        help="overrides the configuration's (faithful: the full-fidelity layout that steps fastest on "
                             "this machine, chosen by `tune`; until it has, the GGUF's own blocks: gguf-native where specdemo's kernels "
                             "were built, else gguf-mixed)")
    parser.add_argument("--draft-precision", default=None, choices=PRECISIONS + (AUTO,),
                        help="overrides the configuration's (auto: the draft plan `tune` chose for this machine; "
                             "until there is one, the GGUF's own blocks: gguf-native where specdemo's kernels were "
                             f"built, else gguf-mixed, or {DRAFT_PRECISION} once prepared where the plugin has an 8-bit "
                             "unit specdemo's kernels lack, AMX)")
    parser.add_argument("--device", default="CPU", help="OpenVINO device of the target (and of the draft unless --draft-device)")
    parser.add_argument("--draft-device", default=None, help="OpenVINO device of the draft model")
    parser.add_argument("--kv-cache-precision", default="", help="OpenVINO KV_CACHE_PRECISION for both models (u8, f16, bf16, f32)")


def _add_generation_flags(parser: argparse.ArgumentParser, max_new_tokens: int = 128) -> None:
    defaults = GenerationSettings()
    parser.add_argument("--k", type=_k_value, default="auto",
                        help="draft tokens per round, or auto (default): the planner picks K from this machine's measured costs")
    parser.add_argument("--remeasure", action="store_true", help="measure this machine's call costs again instead of using the cached ones")
    parser.add_argument("--adaptive", action="store_true", help="adapt K: longer after a fully accepted round, shorter after a rejection")
    parser.add_argument("--drafter", default=defaults.drafter, choices=list(STRATEGIES))
    parser.add_argument("--draft-p-min", type=float, default=None, metavar="P",
                        help="the confidence stop: end a round's drafting once the draft's confidence in its drafts falls "
                             "below P (0 turns it off; default: this machine's break-even under auto K, off otherwise)")
    parser.add_argument("--temperature", type=float, default=defaults.temperature, help="0 is greedy")
    parser.add_argument("--top-p", type=float, default=defaults.top_p)
    parser.add_argument("--top-k", type=int, default=defaults.top_k)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=max_new_tokens)


def _add_benchmark_flags(parser: argparse.ArgumentParser) -> None:
    """The bench command's own flags (model and generation flags are shared with generate)."""
    parser.add_argument("--quick", action="store_true", help="a couple of minutes: default pair only, 2 instructions, short outputs")
    parser.add_argument("--only", default="", help=f"comma-separated sections to run, of: {', '.join(SECTIONS)}")
    parser.add_argument("--repeats", type=int, default=1, help="passes over the instructions after the warm-up")
    parser.add_argument("--problems", type=int, default=None,
                        help="HumanEval problems of --only humaneval (the first N; default 50, as OpenVINO's notebook)")
    parser.add_argument("--out", default="bench-results", help="folder for benchmarks.md, benchmarks.json and the plots")
    parser.add_argument("--json", action="store_true", help="also print the results as JSON on stdout")


def _k_value(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"K must be a whole number or auto, got {text!r}") from None


def settings_from(args: argparse.Namespace) -> RunSettings:
    """One RunSettings from parsed flags. Raises ValueError with a user-facing message."""
    base_target, base_draft = CONFIGURATIONS[args.configuration]
    target = ModelSettings(args.target, args.target_precision or base_target.precision, args.device, args.kv_cache_precision)
    draft = ModelSettings(args.draft, args.draft_precision or base_draft.precision, args.draft_device or args.device,
                          args.kv_cache_precision)
    generation = GenerationSettings()
    if hasattr(args, "k"):
        generation = drafters.checked(GenerationSettings(
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            k_policy=k_policy(args.k, args.adaptive),
            drafter=args.drafter,
            draft_p_min=args.draft_p_min,
        ))
    return RunSettings(target, draft, generation)


def k_policy(k: str | int, adaptive: bool) -> KPolicy:
    """--k auto (or a number) and --adaptive as one KPolicy: --adaptive starts from --k's number (4 under auto)."""
    start = KPolicy.k if k == "auto" else int(k)
    if adaptive:
        return KPolicy.adaptive(start)
    return KPolicy.auto() if k == "auto" else KPolicy.fixed(start)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "clean":
            return _clean(args)
        if args.command == "show":
            return _show(args)
        settings = settings_from(args)
        _check_devices(settings)
        if args.command == "prepare":
            return _prepare(settings)
        kernels.say_once_if_unavailable()  # tune, generate and bench then run the plugin's kernels only
        if args.command == "tune":
            if args.forget:
                return tune_command.forget_tune()
            compat.keep_torch_out()  # tokenizers need no torch: 0.3 GiB less beside the compiles (conversion is a child)
            if args.draft_plan:
                return tune_command.plan_draft(settings)
            return tune_command.tune_machine(settings, again=not args.target_only)
        if args.command == "generate":
            compat.keep_torch_out()  # generating needs no torch; conversion, if any, runs in a child process
            from specdemo.cli.terminal import generate

            return generate(args, settings)
        return _bench(args, settings)
    except (ValueError, sources.ModelSourceError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except memory.Short as error:  # waited for memory and gave up: not an error, a step for later
        print(f"skipped: {error}", file=sys.stderr)
        return memory.SKIPPED
    except RuntimeError as error:  # OpenVINO refused a compile or a call: one sentence, not its C++ source lines
        if not (errors.is_openvino(error) or isinstance(error, errors.GenAIError)):
            raise
        print(f"error: {errors.describe(error)}", file=sys.stderr)
        return 1
    except OSError as error:  # the disk (full, read-only, a permission): one sentence with what to do
        print(f"error: {errors.disk_sentence(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def benchmark_settings(args: argparse.Namespace):
    """BenchSettings from the bench command's flags. Raises ValueError with a message for users."""
    from dataclasses import replace

    preset = QUICK if args.quick else FULL
    asked = {s.strip() for s in args.only.split(",") if s.strip()}
    # In the order of SECTIONS; unknown names go last, for BenchSettings to refuse.
    sections = tuple(s for s in SECTIONS if s in asked) + tuple(sorted(asked - set(SECTIONS)))
    problems = {} if args.problems is None else {"humaneval_problems": args.problems}
    return replace(preset, repeats=args.repeats, sections=sections or preset.sections, **problems)


def _bench(args: argparse.Namespace, settings: RunSettings) -> int:
    measure = benchmark_settings(args)  # refused flags and settings end here, before the models load
    bench.check_generation(settings.generation)
    started = time.perf_counter()
    stream = sys.stderr if args.json else sys.stdout

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.0f} s] {message}", file=stream, flush=True)

    results = bench.run(settings, measure, Path(args.out), log, command="python -m specdemo " + " ".join(sys.argv[1:]))
    if args.json:
        print(strict_json.dumps(results, indent=2, default=str))
    return 0


def _check_devices(settings: RunSettings) -> None:
    import openvino as ov

    available = ov.Core().available_devices
    for model in (settings.target, settings.draft):
        if model.device.split(".")[0].split(":")[0] not in {d.split(".")[0] for d in available} | {"AUTO", "HETERO", "MULTI"}:
            raise ValueError(f"device {model.device!r} is not available; OpenVINO lists {', '.join(available)}")


def _clean(args: argparse.Namespace) -> int:
    items = disk.inventory()
    home = sources.specdemo_home()
    if not items:
        print(f"{home} holds nothing of specdemo's")
        return 0
    kinds = {kind.strip() for kind in args.remove.split(",") if kind.strip()}
    gone = disk.remove(items, kinds) if kinds else []
    print(f"{home}: {disk.size(sum(item.bytes for item in items))} in all")
    for item in items:
        state = "removed" if item in gone else item.kind
        print(f"  {disk.size(item.bytes):>11}  {state:<15} {item.path.relative_to(home)}  ({item.what})")
    if gone:
        print(f"freed {disk.size(sum(item.bytes for item in gone))}")
    else:
        removable = sorted({item.kind for item in items} & set(disk.KINDS))
        if removable:
            print(f"to free space: python -m specdemo clean --remove {','.join(removable)}")
    return 0


def _prepare(settings: RunSettings) -> int:
    target, draft = map(machine_profile().resolve_precision, (settings.target, settings.draft))
    sources.convert_beside(draft, target, None)  # both at once where memory allows
    for model in (target, draft):
        folder = sources.prepare(model)
        print(f"{model.source} ({model.precision}): {folder}")
    return 0


def _show(args: argparse.Namespace) -> int:
    runs = [runfile.load(Path(name)) for name in args.files]
    print(runfile.compare(runs, list(args.files)))
    return 0
