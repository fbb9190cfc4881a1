"""The `llmctl` command line: the app, its global flags, and `main()`, which turns every way a
command can end into an exit code (docs/design.md §3): 0 ok; 1 the run failed; 2 usage error (one
line, no traceback); 128+n on signal n (130 on Ctrl-C); 141 when the reader of stdout went away.
A full or failing disk (ENOSPC, EFBIG, EDQUOT, EIO) is exit 1 with one line.

The commands live in one module per family and each only parses, builds its config, calls one
stage function and renders (`render.py`). What they show goes to stderr, except the artifact
itself (`-o -`), the inspect / lineage / report views, and `--json` summaries, on stdout.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import Annotated, Optional

import typer

from llmctl import __version__
from llmctl.cli import annotate, data, decontam, embed, filter, inspect, plan, pref, report, rl, serve, tokenize, train
from llmctl.cli import eval as evaluate
from llmctl.cli.options import G, Json, Quiet
from llmctl.artifacts.atomic import disk_error
from llmctl.cli.console import err
from llmctl.errors import Interrupted, StageFailed, UsageError

app = typer.Typer(
    name="llmctl",
    help="From raw web crawl to a trained, evaluated, RL-tuned model: one command per stage.\n\n"
    "Stages read and write artifacts (directories with a manifest.json) or Arrow streams when a "
    "path is '-', so they chain in shell pipes and Makefiles.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
# --help lists the commands in the order they are added here.
for family in (inspect, data, embed, annotate, train, pref, plan, decontam, evaluate, rl, serve, report):
    app.add_typer(family.app)
app.add_typer(filter.filter_app, name="filter")
app.add_typer(tokenize.tokenize_app, name="tokenize")
app.add_typer(evaluate.eval_app, name="eval")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"llmctl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    quiet: Quiet = False,
    json_: Json = False,
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")] = None,
) -> None:
    G.quiet, G.json = quiet, json_


# typer vendors its own click; its parser errors all derive from the base of BadParameter.
_ClickUsageError = typer.BadParameter.__mro__[1]


def _fail(code: int, message: str) -> None:
    err.print(f"llmctl: error: {message}", markup=False, highlight=False, soft_wrap=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    # What is imported by now lives until exit: frozen, it is not walked again by the full
    # collections that typer's and the stages' imports would trigger (15-35 ms a command).
    gc.freeze()
    command = typer.main.get_command(app)
    try:
        rc = command.main(args=argv, prog_name="llmctl", standalone_mode=False)
        if rc == 130:  # typer turns Ctrl-C into a returned exit code instead of raising it
            _fail(130, "interrupted")
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except _ClickUsageError as e:  # bad flags or arguments, found by the parser
        if type(e).__name__ == "NoArgsIsHelpError":
            err.print(e.format_message(), markup=False, highlight=False)
            sys.exit(2)
        _fail(2, (e.format_message().splitlines() or ["bad usage"])[0])
    except UsageError as e:
        _fail(2, str(e))
    except StageFailed as e:
        _fail(1, str(e))
    except BrokenPipeError:
        # The reader went away (`| head`): like a Unix tool, stop quietly with SIGPIPE's status.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(141)
    except Interrupted as e:
        _fail(128 + e.signum, str(e))
    except (KeyboardInterrupt, typer.Abort):  # before Exception: click's Abort is a RuntimeError
        _fail(130, "interrupted")
    except Exception as e:  # a full or failing disk is a failed run, said in one line
        failed = disk_error(e)
        if failed is None:
            raise
        _fail(1, str(failed))


if __name__ == "__main__":
    main()
