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


@data.command("clicks")
@click.argument("folder", default=".", type=click.Path(file_okay=False))
@click.option("--records", default=200_000, show_default=True, type=click.IntRange(min=1_000))
@click.option("--users", default=1_000_000, show_default=True, type=click.IntRange(min=1))
@click.option("--items", default=200_000, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True, type=int)
def data_clicks(folder: str, records: int, users: int, items: int, seed: int) -> None:
    """Write a generated click table into FOLDER: clicks.jsonl (user_id, item_id, three dense
    features, clicked), clicks.schema.json (the user and the item as ID features) and
    clicks.best.json (the generator's settings and the best logloss and AUC any model can reach
    on the last tenth, from the clicks' true probabilities)."""
    from pipeline.train.evaluation import roc_auc
    from producers.datasets.click_stream import click_schema
    from producers.datasets.clicks import ClickModel

    Path(folder).mkdir(parents=True, exist_ok=True)
    model = ClickModel(users=users, items=items, seed=seed)
    click.echo(model.write_jsonl(Path(folder) / "clicks.jsonl", records, auc=roc_auc))
    schema = Path(folder) / "clicks.schema.json"
    schema.write_text(click_schema(model).to_json() + "\n")
    click.echo(schema)


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
