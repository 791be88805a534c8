"""``python -m terminus_env.serving.sim serve --port P ...``: run a simulated vLLM server until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys

from terminus_env.serving.sim.config import SimConfig, parse_curve
from terminus_env.serving.sim.replies import ReplySource, ScriptedReplies, default_reply, load_reply_source
from terminus_env.serving.sim.server import ServerConfig, SimServer
from terminus_env.serving.sim.tokenizer import ChatTokenizer, TemplateTokenizer


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m terminus_env.serving.sim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve vLLM's HTTP API from simulated engines")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, required=True, help="0 picks a free port (printed on start)")
    serve.add_argument("--model", default="sim", help="the model name the server answers to")
    serve.add_argument("--engines", type=int, default=1, help="data-parallel engines behind this port")
    engine = serve.add_argument_group("engine", "engine arguments and the step-time model (see SimConfig)")
    for field in dataclasses.fields(SimConfig):  # one flag per setting, so a calibration can be replayed
        flag = "--" + field.name.replace("_", "-")
        if isinstance(field.default, bool):
            engine.add_argument(flag, dest=field.name, action=argparse.BooleanOptionalAction, default=field.default)
        elif isinstance(field.default, tuple):  # a Curve, written x:y,x:y
            engine.add_argument(flag, dest=field.name, type=parse_curve, default=field.default)
        else:
            engine.add_argument(flag, dest=field.name, type=type(field.default), default=field.default)
    serve.add_argument(
        "--time-scale", type=float, default=1.0, help="real seconds per simulated second (0: as fast as possible)"
    )
    serve.add_argument(
        "--weight-sync", action="store_true", help="serve vLLM's weight-update endpoints (pause, collective_rpc, ...)"
    )
    serve.add_argument(
        "--crash-on",
        metavar="TEXT",
        help="a request whose last message holds TEXT kills its engine (HTTP 500 to every request it holds, /health "
        "503 from then on), as a request that crashes vLLM's engine core does",
    )
    serve.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="a Hugging Face tokenizer folder with a chat template (needs transformers): prompts and replies get the "
        "ids a real server of that model returns, instead of toy ids up to 151,000 that no small vocabulary holds",
    )
    replies = serve.add_mutually_exclusive_group()
    replies.add_argument("--replies", metavar="FILE", help="scripted replies, JSON lines (see ScriptedReplies)")
    replies.add_argument("--reply-source", metavar="MODULE:CALLABLE", help="a callable (messages) -> reply text")
    return parser


def _reply_source(args: argparse.Namespace) -> ReplySource:
    if args.replies:
        return ScriptedReplies.from_file(args.replies)
    if args.reply_source:
        return load_reply_source(args.reply_source)
    return default_reply


def _tokenizer(path: str | None) -> ChatTokenizer | None:
    if path is None:
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ValueError("--tokenizer needs transformers: pip install transformers") from exc
    return TemplateTokenizer(AutoTokenizer.from_pretrained(path))


async def _serve(
    config: ServerConfig, replies: ReplySource, host: str, port: int, tokenizer: ChatTokenizer | None
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = SimServer(config, replies, tokenizer=tokenizer)
    await server.start(host, port)
    print(f"serving {config.model!r} on {server.url} ({config.engines} engine(s))", flush=True)
    try:
        await stop.wait()
    finally:
        await server.aclose()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        engine = SimConfig(**{field.name: getattr(args, field.name) for field in dataclasses.fields(SimConfig)})
        config = ServerConfig(
            model=args.model,
            engines=args.engines,
            engine=engine,
            time_scale=args.time_scale,
            weight_sync=args.weight_sync,
            crash_on=args.crash_on,
        )
        replies = _reply_source(args)
        tokenizer = _tokenizer(args.tokenizer)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve(config, replies, args.host, args.port, tokenizer))
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
