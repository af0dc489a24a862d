"""The `datapipe` command: run recipes, inspect their output, list recipes, train tokenizers.

Exit codes: 0 done; 1 the run finished but its accounting does not balance (records in +
created != written + rejected); 2 the command could not start: a recipe that is invalid or
cannot run here (RecipeError), a cluster that does not answer (RunError), a missing file; or
a source none of whose inputs the workers could open (RunError); 3 the disk the run writes to is
full (one line naming the path and the bytes wanted; the run's temporaries are removed, what it
committed kept for a rerun); 130 interrupted (Ctrl-C). Every message says what to do.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from datapipe.pipeline.recipe import RecipeError, RunError, load_recipe

console = Console(stderr=True)
REPO_RECIPES = Path(__file__).resolve().parent.parent / "recipes"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (RecipeError, RunError, FileNotFoundError) as err:
        console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/yellow]: what was committed is kept; run the same command again to "
                      "resume (it does only the missing work), or add --restart to start over")
        return 130


EXAMPLES = """examples:
  datapipe run recipes/demo.yaml   # the whole pipeline in miniature; its last line names out/demo/report.html
  datapipe inspect out/demo --sample 0
  datapipe COMMAND --help          # a command's options, with an example"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="datapipe", description=__doc__, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    run = command(commands, "run", "run a recipe: sources -> stages -> packed shards, then out/<name>/report.html",
                  "datapipe run recipes/demo.yaml\n  datapipe run recipes/quickstart.yaml --out out/qs "
                  "--set phases.main.seq_len=4096")
    run.add_argument("recipe", help="a recipe YAML file, e.g. recipes/demo.yaml")
    run.add_argument("--out", help="output folder: a path or any fsspec URL, e.g. s3://bucket/run (default: out/<name>)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a recipe field, e.g. --set phases.main.seq_len=4096 (repeatable)")
    run.add_argument("--ray-address", help="join this Ray cluster (default: RAY_ADDRESS, else local Ray)")
    run.add_argument("--restart", action="store_true",
                     help="start over instead of resuming; a finished run in --out is replaced once the new one is done")
    run.add_argument("--no-report", action="store_true", help="skip writing report.html at the end")
    run.set_defaults(handler=cmd_run)

    inspect = command(commands, "inspect", "summarize a run's output folder in the terminal",
                      "datapipe inspect out/demo\n  datapipe inspect out/demo --sample 3   # draw packed sample 3")
    inspect.add_argument("out_dir", type=Path)
    inspect.add_argument("--samples", type=int, default=2, help="decoded samples to show per phase")
    inspect.add_argument("--sample", type=int, default=None, metavar="N",
                         help="draw only the N-th packed sample of the first phase (--phase picks another), "
                              "with its document boundaries, padding, loss mask and media spans")
    inspect.add_argument("--phase", default=None, help="the phase --sample reads (default: the first)")
    inspect.set_defaults(handler=cmd_inspect)

    report = command(commands, "report", "rebuild OUT_DIR/report.html from a finished run's files",
                     "datapipe report out/demo   # then open out/demo/report.html in a browser")
    report.add_argument("out_dir", type=Path)
    report.set_defaults(handler=cmd_report)

    recipes = command(commands, "recipes", "list recipes, one line each", "datapipe recipes --dir recipes")
    recipes.add_argument("--dir", type=Path, default=None, help="folder of recipes (default: ./recipes)")
    recipes.set_defaults(handler=cmd_recipes)

    tokenizer = command(commands, "tokenizer", "tokenizer tools", "datapipe tokenizer train --help")
    tokenizer_commands = tokenizer.add_subparsers(required=True, metavar="ACTION")
    train = command(tokenizer_commands, "train", "train a byte-level BPE tokenizer",
                    "datapipe tokenizer train recipes/quickstart.yaml --vocab-size 8192 --out out/tok")
    train.add_argument("inputs", nargs="+", help="a recipe YAML (its sources are read) or text/JSONL files")
    train.add_argument("--vocab-size", type=int, required=True)
    train.add_argument("--out", type=Path, required=True, help="folder for tokenizer.json and tokenizer.tiktoken")
    train.add_argument("--min-frequency", type=int, default=2, help="merge only pairs seen at least this often")
    train.set_defaults(handler=cmd_tokenizer_train)
    export = command(tokenizer_commands, "export", "write the tiktoken ranks file beside a tokenizer.json",
                     "datapipe tokenizer export out/tok/tokenizer.json")
    export.add_argument("tokenizer_json", type=Path)
    export.set_defaults(handler=cmd_tokenizer_export)
    return parser


def command(commands, name: str, summary: str, example: str) -> argparse.ArgumentParser:
    """A subcommand whose --help ends with an example."""
    return commands.add_parser(name, help=summary, description=summary, epilog=f"example:\n  {example}",
                               formatter_class=argparse.RawDescriptionHelpFormatter)


def cmd_run(args: argparse.Namespace) -> int:
    from datapipe.pipeline.report import summary_table
    from datapipe.pipeline.runner import disconnect, run_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    out = args.out or str(Path("out") / recipe.name)
    try:
        stats = run_recipe(recipe, out, args.ray_address, console, restart=args.restart)
    except Exception as err:  # noqa: BLE001 - only a full disk is handled here; anything else is re-raised
        full = disk_full_in(err)
        if full is None:
            raise
        return report_disk_full(full, out)
    disconnect()  # the Ray it started stops now, not at exit: Ray's exit hook first sleeps 0.5 s for log lines
    console.print(summary_table(stats, f"{recipe.name} -> {out}"))
    if not args.no_report and Path(out).is_dir() and not report_is_current(Path(out)):  # `datapipe report` for others
        write_run_report(Path(out))
    if not stats["balanced"]:
        console.print(f"[red]error:[/red] the accounting does not balance (records in + created != written + "
                      f"rejected): a stage lost or duplicated records. {out}/stats.json has the counts per "
                      "stage; the shards are written but do not trust them until the stage is fixed", highlight=False)
        return 1
    return 0


def disk_full_in(err: BaseException | None) -> OSError | None:
    """The full-disk error behind a failure, if one is: a DiskFull or an ENOSPC/EDQUOT OSError, found
    through Ray's wrappers (a task's error is its `cause`) and Python's chained exceptions."""
    from datapipe.storage import NO_SPACE, DiskFull

    for _ in range(64):  # a chain is a few links deep; the bound stops a cycle
        if err is None:
            return None
        inner = getattr(err, "cause", None)  # ray.exceptions.RayTaskError: the task's own exception
        if isinstance(inner, BaseException):
            err = inner
        elif isinstance(err, DiskFull) or (isinstance(err, OSError) and err.errno in NO_SPACE):
            return err
        else:
            err = err.__cause__ or err.__context__
    return None


def report_disk_full(err: OSError, out: str) -> int:
    """One line: the full path and the bytes wanted (a DiskFull says them); the run's temporaries removed."""
    from datapipe.storage import DiskFull, disk_full, remove_temporaries

    full = err if isinstance(err, DiskFull) else disk_full(err, err.filename or out, None)
    stop_ray()  # the run's other tasks fail the same way: stopped before they write more, their errors unprinted
    removed = remove_temporaries(out)
    console.print(f"[red]error:[/red] {escape(str(full))}; {removed} temporary files of the run removed, its "
                  f"committed work kept in {escape(out)} (unfinished: no run.json) for that rerun",
                  highlight=False, soft_wrap=True)
    return 3


def stop_ray() -> None:
    """Disconnect from Ray (a local cluster stops) if the run started it, without printing the errors
    of tasks nobody waits for any more (Ray prints each as an "Unhandled error" when it arrives)."""
    os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
    runner = sys.modules.get("datapipe.pipeline.runner")  # imported by the run, which is what started Ray
    if runner is not None:
        runner.disconnect()
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def report_is_current(out: Path) -> bool:
    """The run's report is there and newer than its stats: a finished run run again stays untouched."""
    report, stats = out / "report.html", out / "stats.json"
    return report.exists() and stats.exists() and report.stat().st_mtime_ns >= stats.stat().st_mtime_ns


def write_run_report(out: Path) -> None:
    """The report at the end of a run: a failure here costs the page, never the finished run."""
    from datapipe.report.page import write_report

    try:
        console.print(f"report: [bold]{write_report(out)}[/bold] (open it in a browser)", highlight=False)
    except Exception as err:  # noqa: BLE001 - the shards are written; say so and how to retry
        console.print(f"[yellow]warning:[/yellow] the run is done but its report failed ({type(err).__name__}: "
                      f"{escape(str(err))}); rebuild it with `datapipe report {out}`", highlight=False)


def cmd_inspect(args: argparse.Namespace) -> int:
    from datapipe.pipeline.inspect import inspect_run, show_sample

    if args.sample is not None:
        show_sample(args.out_dir, args.sample, args.phase, console)
    else:
        inspect_run(args.out_dir, args.samples, console)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from datapipe.report.page import write_report
    from datapipe.report.samples import ReportError

    try:
        console.print(f"wrote {write_report(args.out_dir)}", highlight=False)
    except ReportError as err:
        console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
        return 2
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    """One line a recipe: its description, or its first problem. Validation only: what a recipe needs
    from this machine (its files, its tokenizer) is checked by `datapipe run`, where it matters."""
    folder = args.dir or (Path("recipes") if Path("recipes").is_dir() else REPO_RECIPES)
    for path in sorted(folder.glob("*.yaml")):
        try:
            description = escape(load_recipe(path).description or "(no description)")
        except RecipeError as err:
            more = f" (+{len(err.problems) - 1} more)" if len(err.problems) > 1 else ""
            description = f"[red]invalid:[/red] {escape(err.problems[0].removeprefix(f'{path}: '))}{more}"
        console.print(f"[bold]{escape(str(path))}[/bold]  {description}", highlight=False)
    return 0


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    from tokenizer.bpe import save_tokenizer, train_tokenizer
    from tokenizer.fast import ranks_path

    texts = iter_training_texts(args.inputs)
    try:
        tokenizer = train_tokenizer(texts, args.vocab_size, args.min_frequency)
    except ValueError as err:  # a vocabulary too small for the reserved block
        console.print(f"[red]error:[/red] {err}", highlight=False, soft_wrap=True)
        return 2
    path = save_tokenizer(tokenizer, args.out)
    console.print(f"wrote {path} ({tokenizer.get_vocab_size():,} tokens) and its tiktoken ranks {ranks_path(path)}")
    return 0


def cmd_tokenizer_export(args: argparse.Namespace) -> int:
    from tokenizer.fast import export_ranks

    try:
        console.print(f"wrote {export_ranks(args.tokenizer_json)}")
    except ValueError as err:  # not a byte-level BPE tokenizer.json
        console.print(f"[red]error:[/red] {args.tokenizer_json}: {err}", highlight=False, soft_wrap=True)
        return 2
    return 0


def iter_training_texts(inputs: list[str]):
    from datapipe.pipeline.check import list_inputs
    from datapipe.pipeline.inputs import iter_recipe_documents
    from datapipe.pipeline.recipe import TabularSource
    from datapipe.readers.tabular import read_jsonl
    from datapipe.schema import MEDIA_PLACEHOLDER
    from datapipe.storage import is_url, open_input

    for name in inputs:
        if name.endswith((".yaml", ".yml")):
            recipe = load_recipe(name)
            docs = iter_recipe_documents(recipe, list_inputs(recipe))
        elif ".jsonl" in name:
            docs = read_jsonl(TabularSource(name="train", type="jsonl", paths=[name]), name)
        elif is_url(name):  # a text file on object storage or a web server
            with open_input(name) as stream:
                yield stream.read().decode("utf-8", errors="replace")
            continue
        else:
            yield Path(name).read_text(encoding="utf-8", errors="replace")
            continue
        # Placeholders become media spans, never text: train on the text around them.
        yield from (doc["text"].replace(MEDIA_PLACEHOLDER, "\n") for doc in docs if not doc["reject"])


if __name__ == "__main__":
    sys.exit(main())
