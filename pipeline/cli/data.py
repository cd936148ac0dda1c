"""`streamtrain data`: fetching the datasets where there is internet."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.base import cli


@cli.group()
def data() -> None:
    """Datasets: fetch them where there is internet; copy out the samples that ship with
    streamtrain."""


@data.command("sample")
@click.argument("name", type=click.Choice(["penguins"]))
@click.argument("folder", default=".", type=click.Path(file_okay=False))
def data_sample(name: str, folder: str) -> None:
    """Copy a sample table into FOLDER (penguins: 344 rows, CC0; its PROVENANCE.md says whence)."""
    import shutil

    from producers.datasets.table import SAMPLES

    Path(folder).mkdir(parents=True, exist_ok=True)
    click.echo(shutil.copy(SAMPLES / name / f"{name}.csv", Path(folder) / f"{name}.csv"))


@data.command("fetch")
@click.argument("dataset", type=click.Choice(["mnist", "higgs"]))
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    help="Where to put HIGGS (default: the data folder).",
)
def data_fetch(dataset: str, data_dir: str | None) -> None:
    """Download DATASET once (MNIST into the cache, HIGGS.csv.gz into the data folder)."""
    if dataset == "mnist":
        from producers.datasets import mnist

        click.echo(mnist.fetch())
    else:
        from producers.datasets import higgs

        click.echo(higgs.fetch(Path(data_dir) if data_dir else None))
