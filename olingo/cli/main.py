"""The `olingo` command: one subcommand per stage, each driven by a strict YAML config.

`main` parses the command line (`olingo.cli.parser`), runs the subcommand's handler
(`olingo.cli.commands`) and turns a stop or a user error into one line on stderr and an exit status.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import traceback
from pathlib import Path

from olingo.cli.commands import print_on_master
from olingo.cli.parser import HELP_EXAMPLES, STAGE_SUMMARIES, build_parser, config_class
from olingo.config import packaged_config
from olingo.errors import OlingoError, ResumeError, RunIOError
from olingo.threads import apply as apply_threads
from olingo.threads import prepare as prepare_threads
from olingo.trainer.interrupt import TrainingInterrupted, handle_stop_signals

# What callers and tests import from here; the parser's tables and `packaged_config` live elsewhere.
__all__ = ["HELP_EXAMPLES", "STAGE_SUMMARIES", "build_parser", "config_class", "main", "packaged_config", "setup_logging"]


def setup_logging() -> None:
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def _debug_requested(argv: list[str]) -> tuple[list[str], bool]:
    """`--debug` anywhere on the line (or OLINGO_DEBUG=1): keep tracebacks of user errors."""
    debug = os.environ.get("OLINGO_DEBUG", "") not in ("", "0")
    return [a for a in argv if a != "--debug"], debug or "--debug" in argv


STAGE_COMMANDS = ("sft", "rm", "ppo", "grpo", "dpo", "orpo", "kto")  # the commands a run.resume=last continues
TORCH_COMMANDS = (*STAGE_COMMANDS, "demo", "experiment", "eval")  # the commands that compute with torch (olingo.threads)


def _resume_hint(args: argparse.Namespace, argv: list[str], checkpoint: Path | None) -> str:
    """"; resume with: <the run's own command line, run.resume=last, its environment>" for a
    stage command (see `olingo.cli.resume_hint`); for others, where the run directory is."""
    from olingo.cli.resume_hint import resume_command

    if args.command in STAGE_COMMANDS:
        return f"; resume with: {resume_command(argv)}"
    if checkpoint is None:
        return ""
    return f"; its run directory is {checkpoint.parent.parent} (config.yaml there; continue it with run.resume=last)"


def main(argv: list[str] | None = None) -> int:
    """Run one olingo command; user errors end in one line on stderr and exit status 2."""
    argv, debug = _debug_requested(sys.argv[1:] if argv is None else list(argv))
    if argv[:1] == ["eval"]:  # its options may follow its MODEL arguments
        from olingo.cli.eval import options_first

        argv = options_first(argv)
    threads = prepare_threads(argv)  # before parsing: a stage's parser imports torch, which reads the wait policy once
    args = build_parser().parse_args(argv)
    setup_logging()
    if args.command in TORCH_COMMANDS:
        apply_threads(threads)
    with handle_stop_signals():
        try:
            return args.handler(args)
        except TrainingInterrupted as stop:
            print_on_master(f"olingo: {stop}{_resume_hint(args, argv, stop.checkpoint) if stop.checkpoint else ''}")
            return 128 + stop.signum
        except KeyboardInterrupt as err:
            signum = err.args[0] if err.args and isinstance(err.args[0], int) else int(signal.SIGINT)
            print_on_master(
                f"olingo: stopped by {signal.Signals(signum).name}; nothing after the last complete checkpoint "
                f"was kept (checkpoints are written atomically){_resume_hint(args, argv, None)}"
            )
            return 128 + signum
        except OlingoError as err:
            if debug:
                traceback.print_exc()
            # A run that could not write, or was given a wrong checkpoint, goes on with run.resume=last.
            hint = _resume_hint(args, argv, None) if isinstance(err, (ResumeError, RunIOError)) else ""
            print_on_master(f"olingo: {err}{hint}")
            return 2


if __name__ == "__main__":
    sys.exit(main())
