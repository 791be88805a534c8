"""The ``terminus-env`` command line: a thin argparse layer over the package's modules.

Each sub-command imports its module only when it runs, so ``terminus-env --help``
stays fast and a missing optional extra only breaks the command that needs it. The commands built here on the
floors below live beside it: ``check`` (``tasks check`` and ``tasks list``), ``image_prune`` (``images prune``),
``evaluate`` (``eval``) and ``tiny_model`` (``python -m terminus_env.cli.tiny_model``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from terminus_env import __version__
from terminus_env.errors import TerminusError
from terminus_env.utils.former_names import add_former_name


def _cmd_images_base(args: argparse.Namespace) -> int:
    from terminus_env.sandbox.images import ensure_base_image

    tag = ensure_base_image(force=args.force)
    print(tag)
    return 0


def _cmd_images_prune(args: argparse.Namespace) -> int:
    from terminus_env.cli.image_prune import prune_images

    return prune_images(args.folders, dry_run=args.dry_run)


def _cmd_gc(args: argparse.Namespace) -> int:
    from terminus_env.sandbox.reaper import reap

    removed = reap(include_live_owners=args.all)
    print(f"removed {removed} container(s)")
    return 0


def _cmd_tasks_check(args: argparse.Namespace) -> int:
    from terminus_env.cli.check import run_check

    return run_check(args.folder, concurrency=args.concurrency, names=args.name or None, audit=args.audit)


def _cmd_tasks_audit(args: argparse.Namespace) -> int:
    from terminus_env.audit.play import run_audit

    return run_audit(args.folder, concurrency=args.concurrency, names=args.name or None, output=args.report,
                     exploits=args.exploit)


def _cmd_tasks_list(args: argparse.Namespace) -> int:
    from terminus_env.cli.check import print_task_table

    print_task_table(args.folder)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from terminus_env.serving.launcher import main as serve_main

    return serve_main(args.serve_args)


def _cmd_eval(args: argparse.Namespace) -> int:
    from terminus_env.cli.evaluate import main as eval_main

    return eval_main(args)


def _cmd_view(args: argparse.Namespace) -> int:
    from terminus_env.viewer.command import main as view_main

    return view_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="terminus-env", description="Terminal tasks for RL and evaluation of LLM agents (the Terminus 2 protocol)."
    )
    parser.add_argument("--version", action="version", version=f"terminus-env {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    images = sub.add_parser("images", help="build the local images tasks run in")
    images_sub = images.add_subparsers(dest="images_command", required=True)
    base = images_sub.add_parser("base", help="build (or reuse) the local Debian base image")
    base.add_argument("--force", action="store_true", help="rebuild even if the image exists")
    base.set_defaults(func=_cmd_images_base)
    prune = images_sub.add_parser(
        "prune", help="remove task images that no task in the folders needs (old tags, deleted tasks)"
    )
    prune.add_argument("folders", nargs="*", type=Path, help="folders of tasks (default: the shipped suite)")
    prune.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    prune.set_defaults(func=_cmd_images_prune)

    gc = sub.add_parser("gc", help="remove sandbox containers whose owner process is gone")
    gc.add_argument("--all", action="store_true", help="also remove containers of live owners")
    gc.set_defaults(func=_cmd_gc)

    tasks = sub.add_parser("tasks", help="inspect and validate task suites")
    tasks_sub = tasks.add_subparsers(dest="tasks_command", required=True)
    check = tasks_sub.add_parser("check", help="oracle earns 1, doing nothing 0 (also in train mode), every task")
    check.add_argument("folder", nargs="?", type=Path, help="a folder of tasks (default: the shipped suite)")
    check.add_argument("--concurrency", "-j", type=int, default=4, help="tasks checked at once")
    add_former_name(check, "--jobs", new_name="--concurrency", dest="concurrency", type=int)
    check.add_argument("--name", action="append", help="check only this task (repeatable)")
    check.add_argument("--audit", type=Path, metavar="REPORT", help="show what this `tasks audit` report found")
    check.set_defaults(func=_cmd_tasks_check)
    audit = tasks_sub.add_parser(
        "audit", help="play generic exploits against every task: which verifiers pass without the task solved"
    )
    audit.add_argument("folder", nargs="?", type=Path, help="a folder of tasks (default: the shipped suite)")
    audit.add_argument("--concurrency", "-j", type=int, default=4, help="episodes played at once")
    add_former_name(audit, "--jobs", new_name="--concurrency", dest="concurrency", type=int)
    audit.add_argument("--name", action="append", help="audit only this task (repeatable)")
    audit.add_argument("--report", type=Path, metavar="FILE", help="write the report as JSON here")
    add_former_name(audit, "--output", "-o", new_name="--report", dest="report", type=Path)
    audit.add_argument("--exploit", action="append", help="play only this exploit, beside the control (repeatable)")
    audit.set_defaults(func=_cmd_tasks_audit)
    listing = tasks_sub.add_parser("list", help="print the suite: name, category, difficulty")
    listing.add_argument("folder", nargs="?", type=Path, help="a folder of tasks (default: the shipped suite)")
    listing.set_defaults(func=_cmd_tasks_list)

    serve = sub.add_parser(
        "serve",
        help="start N vLLM data-parallel replicas (needs the 'vllm' extra)",
        add_help=False,
    )
    serve.add_argument("serve_args", nargs=argparse.REMAINDER)
    serve.set_defaults(func=_cmd_serve)

    evaluate = sub.add_parser("eval", help="evaluate a model on a task suite (lenient by default)")
    _add_eval_arguments(evaluate)
    evaluate.set_defaults(func=_cmd_eval)

    view = sub.add_parser(
        "view", help="a job, a training run or one trial as static HTML pages that open offline",
        description="Write the page of RUN: a job (a Harbor job folder or an eval run file: the score, a table of the "
        "tasks, how the trials ended, with a page per trial), a training run (its step log), or one trial (a trial "
        "folder, or --trial). A job's or training run's page has its figures as JSON beside it (PAGE.summary.json).",
    )  # fmt: skip
    view.add_argument(
        "run", type=Path, metavar="RUN", help="a Harbor job folder, one of its trial folders, an eval run file, or a "
        "training run's step log",
    )  # fmt: skip
    view.add_argument("--trial", help="write only this trial's page (its folder name, e.g. hello-world__0)")
    view.add_argument(
        "--page", type=Path, metavar="PAGE.html",
        help="the page to write (default: job.html in a job folder, RUN.html beside a file, trajectory.html in a "
        "trial's folder); a job's trial pages then go in the folder PAGE.trials beside it",
    )  # fmt: skip
    add_former_name(view, "--output", new_name="--page", dest="page", type=Path)
    view.set_defaults(func=_cmd_view)
    return parser


def _add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", nargs="?", type=Path, help="a folder of tasks (default: the shipped suite)")
    parser.add_argument("--base-url", action="append", help="an OpenAI-compatible server (repeatable, one per replica)")
    parser.add_argument("--model", help="model name sent to the server")
    parser.add_argument("--oracle", action="store_true", help="reply with each task's solution instead of a model")
    parser.add_argument("--sim", type=int, metavar="N", help="serve the oracle from N simulated vLLM replicas")
    parser.add_argument(
        "--flaky-oracle", type=int, metavar="SEED",
        help="a scripted policy that solves some tasks some of the time (seeded), to see the statistics at work",
    )  # fmt: skip
    parser.add_argument("--name", action="append", help="evaluate only this task (repeatable)")
    parser.add_argument("--trials", type=int, default=1, help="rollouts per task (k of pass@k)")
    parser.add_argument("--concurrency", "-j", type=int, default=4, help="rollouts in flight at once")
    parser.add_argument(
        "--ray", metavar="ADDRESS",
        help="run the sandboxes on the nodes of this Ray cluster (what ray.init(address=...) takes, e.g. auto or "
        "HEAD:6379); nodes offer slots with the resource terminus_sandbox_host; needs the 'ray' extra",
    )  # fmt: skip
    parser.add_argument(
        "--max-turns", type=int, help="end an episode after this many turns (default: none; the task's time limit does)"
    )
    parser.add_argument("--max-turn-tokens", type=int, default=16384, help="tokens per reply (at most the context)")
    parser.add_argument("--strict", action="store_true", help="strict format and truncation, as in training")
    parser.add_argument("--temperature", type=float, help="sampling temperature (default: none sent)")
    parser.add_argument("--top-p", type=float, help="nucleus sampling's p (default: none sent)")
    parser.add_argument(
        "--sampling", action="append", metavar="KEY=VALUE",
        help="another sampling parameter sent with every request, its value as JSON (top_k=20, seed=1); repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--no-summarize", action="store_true",
        help="do not summarize a conversation that nears the context; it then ends the episode (context_limit)",
    )  # fmt: skip
    parser.add_argument(
        "--summarize-threshold", type=int, default=8000, metavar="TOKENS",
        help="summarize before a turn when fewer tokens stay free (default 8000, at most half the context; 0: only "
        "when the server refuses a request for its length)",
    )  # fmt: skip
    parser.add_argument(
        "--context-window", type=int, metavar="TOKENS",
        help="the model's context, for servers that do not report max_model_len in /v1/models (vLLM does)",
    )  # fmt: skip
    parser.add_argument(
        "--run-file", type=Path, metavar="FILE",
        help="where every rollout is appended as it ends (default: runs/eval-<UTC time>.jsonl)",
    )  # fmt: skip
    add_former_name(parser, "--output", new_name="--run-file", dest="run_file", type=Path)
    parser.add_argument(
        "--resume", action="store_true", help="continue the run in --run-file, skipping the rollouts it already holds"
    )
    parser.add_argument(
        "--audit-report", type=Path, metavar="FILE",
        help="a report of `terminus-env tasks audit`: the tasks it found hackable are left out, or marked (--hackable)",
    )  # fmt: skip
    parser.add_argument(
        "--hackable", choices=("skip", "mark"), default="skip",
        help="with --audit-report: leave the hackable tasks out (skip, the default) or play them and mark their rows",
    )  # fmt: skip
    parser.add_argument(
        "--jobs-dir", type=Path, default=Path("jobs"),
        help="where the run is also written in Harbor's job layout, as JOBS_DIR/<run file's name>/ (default: jobs)",
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["serve"]:  # argparse's REMAINDER drops a leading --option, so hand the rest over whole
            return _cmd_serve(argparse.Namespace(serve_args=argv[1:]))
        args = build_parser().parse_args(argv)
        if getattr(args, "folder", ...) is None:
            from terminus_env.tasks import shipped_tasks_dir

            args.folder = shipped_tasks_dir()
        return int(args.func(args) or 0)
    except TerminusError as exc:  # meant for the user: the message says what to do, no traceback needed
        print(f"terminus-env: {exc}", file=sys.stderr)
        return 2

