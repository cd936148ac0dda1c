"""`streamtrain data`: fetching the datasets where there is internet."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.base import cli


@cli.group()
def data() -> None:
    """Datasets: fetch them where there is internet."""


@data.command("fetch")
@click.argument("dataset", type=click.Choice(["mnist", "higgs"]))
@click.option("--data-dir", type=click.Path(file_okay=False), help="Where to put HIGGS (default: the data folder).")
def data_fetch(dataset: str, data_dir: str | None) -> None:
    """Download DATASET once (MNIST into the cache, HIGGS.csv.gz into the data folder)."""
    if dataset == "mnist":
        from producers.datasets import mnist

        click.echo(mnist.fetch())
    else:
        from producers.datasets import higgs

        click.echo(higgs.fetch(Path(data_dir) if data_dir else None))
