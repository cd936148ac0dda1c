"""The `streamtrain` command: broker, produce, run, serve, predict, the Spark cluster,
dashboards, data, schema.

One module per concept, each adding its commands to the group in
:mod:`~pipeline.cli.base`. A :class:`StreamtrainError` becomes one line on stderr and exit
status 2; no traceback.
"""

from __future__ import annotations

import sys

import click
import pydantic

from pipeline.cli import cluster as _cluster
from pipeline.cli import dashboards as _dashboards
from pipeline.cli import data as _data
from pipeline.cli import kafka as _kafka
from pipeline.cli import schema as _schema
from pipeline.cli import serve as _serve
from pipeline.cli import train as _train
from pipeline.cli.base import cli
from pipeline.errors import StreamtrainError

_COMMANDS = (
    _cluster,
    _dashboards,
    _data,
    _kafka,
    _schema,
    _serve,
    _train,
)  # imported for the commands they add to `cli`


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning streamtrain errors into one line and exit 2."""
    try:
        cli.main(args=argv, prog_name="streamtrain", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except StreamtrainError as e:
        click.echo(f"streamtrain: error: {e}", err=True)
        sys.exit(2)
    except pydantic.ValidationError as e:  # a setting from the environment (pipeline.config)
        first = e.errors()[0]
        name = "STREAMTRAIN_" + "_".join(str(part) for part in first["loc"]).upper()
        click.echo(
            f"streamtrain: error: Expected {name}: {first['msg'].lower()}. Received: "
            f"{first.get('input')!r}. Set it so, or unset it for the default.",
            err=True,
        )
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


__all__ = ["cli", "main"]
