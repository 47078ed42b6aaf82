"""EmbeddingGemma through ONNX Runtime (``embedder.backend: onnx``, the default for kind gemma):
the same vectors as torch's (a cosine of 0.9999998 at the least over 1,200 chunks of the notes),
1.2–1.3 times the chunks a second on a quiet 2-core machine and 5 times on a busy one, a question
in 0.65–0.7 times torch's time (docs/performance.md).

- **Exported once, beside the model**: the first load exports the model's transformer to ONNX
  (optimum-onnx, the way sentence-transformers' ``backend="onnx"`` does; ~50 s with its check,
  5.7 GB of memory at the peak and 1.2 GB on disk for EmbeddingGemma-300M) into ``<model folder>-onnx`` (``<state_dir>/models/embeddinggemma-300m-onnx``
  for the fetched model), with the model folder's small files (prompts, pooling, dense layers,
  tokenizer). The model folder itself is never written.
- **Whole or not at all**: the export is written aside (``…-onnx.exporting``), checked against
  torch on a question and a passage, marked with the weights it came from, then moved into place;
  a stop at any moment leaves the old export or none. One process exports at a time (a lock file
  beside it): another waits and then loads what the first made.
- **Made again** when the weights it came from change (another fetch, another model put in the
  folder): the mark names them (the fetch's checked SHA-256, the weights file's size and time).
- The pooling, the two dense layers and the normalisation run in torch as before (a few
  microseconds a text); ONNX Runtime runs the 24 layers, on ``embedder.threads`` threads.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import warnings
from importlib import util as import_util
from pathlib import Path

import numpy as np

from rag.errors import ModelMissing, UserError

log = logging.getLogger(__name__)

MARK = ".exported"
ONNX_FILE = "onnx/model.onnx"
WEIGHTS = "model.safetensors"
# the packages the backend needs beyond the torch backend's (all in the [gemma] extra)
PACKAGES = {"onnxruntime": "onnxruntime", "onnx": "onnx", "optimum.onnxruntime": "optimum-onnx"}
INSTALL = "pip install 'leanote-rag[gemma]'"
# what the export is checked on: it must give torch's vectors
PROBE = ("红烧肉要炖多久才软", "git rebase -i 把最近三个提交合成一个，再强制推送到远端分支")
LEAST_COSINE = 0.999


def export_folder(model: Path) -> Path:
    """Where the export of the model folder ``model`` goes: beside it."""
    model = Path(model)
    return model.with_name(f"{model.name}-onnx")


def require_packages() -> None:
    """A clear error when a package the backend needs is not installed."""
    missing = []
    for module, package in PACKAGES.items():
        try:
            found = import_util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing, or a module set to None
            found = False
        if not found:
            missing.append(package)
    if missing:
        raise UserError(f"embedder.backend onnx needs {', '.join(missing)} (in the [gemma] extra): {INSTALL}; "
                        f"or set embedder.backend: torch")


def weights_mark(model: Path, weights_id: str) -> str:
    """The weights an export comes from: their id (the fetch's checked SHA-256, or the folder's
    name) and the weights file's size and time (a file replaced under the same name)."""
    try:
        st = (Path(model) / WEIGHTS).stat()
    except OSError:
        raise ModelMissing(f"{model} has no {WEIGHTS}: fetch the model again (`leanote-rag models fetch gemma`)") from None
    return f"{weights_id}\n{st.st_size}\n{st.st_mtime_ns}\n"


def ready(model: Path, weights_id: str) -> Path:
    """The export of ``model``, made now if it is missing or from other weights (module docstring)."""
    require_packages()
    model = Path(model)
    target = export_folder(model)
    want = weights_mark(model, weights_id)
    if _current(target, want):
        return target
    lock_path = target.parent / f".{target.name}.lock"
    try:
        fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o600)
    except OSError as err:
        raise UserError(f"cannot export the model to ONNX beside {model} ({err}): make {target.parent} writable, "
                        f"or set embedder.backend: torch") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process exporting: its export is waited for, then used
        if not _current(target, want):
            _export(model, target, want)
    finally:
        os.close(fd)
    return target


def _current(target: Path, want: str) -> bool:
    try:
        return (target / MARK).read_text() == want and (target / ONNX_FILE).is_file()
    except OSError:
        return False


def _export(model: Path, target: Path, want: str) -> None:
    aside = target.parent / f"{target.name}.exporting"
    shutil.rmtree(aside, ignore_errors=True)  # what a stopped export left
    size = (model / WEIGHTS).stat().st_size
    free = shutil.disk_usage(target.parent).free
    if free < size * 1.2 + 64 * 2**20:
        raise UserError(f"not enough free disk in {target.parent} for the model's ONNX export: "
                        f"{size * 1.2 / 10**9:.1f} GB needed, {free / 10**9:.1f} GB free; free some, "
                        f"or set embedder.backend: torch")
    log.info("exporting %s to ONNX into %s (once: about a minute, %.1f GB on disk)",
             model, target, size / 10**9)
    from optimum.exporters.onnx import main_export

    try:
        reference = _vectors(_torch_model(model))  # first, so that torch's copy is gone while exporting
        # the model folder's small files: prompts, pooling, dense layers, tokenizer, its config.json as it is
        shutil.copytree(model, aside, ignore=lambda where, names: [n for n in names if n.startswith(".") or n.endswith(
            ".ipynb") or (n == WEIGHTS and Path(where) == model)])
        with warnings.catch_warnings():  # the tracer's notes on constants: the export is checked below instead
            warnings.simplefilter("ignore")
            main_export(model_name_or_path=str(model), output=aside / Path(ONNX_FILE).parent,
                        task="feature-extraction", library_name="transformers", do_validation=False,
                        no_post_process=True, local_files_only=True)
        if not (aside / ONNX_FILE).is_file():
            raise UserError(f"the ONNX export of {model} wrote no {ONNX_FILE}")
        _check(model, reference, _vectors(load(aside, threads=1)))
        (aside / MARK).write_text(want)
    except BaseException as err:
        shutil.rmtree(aside, ignore_errors=True)
        if isinstance(err, Exception) and not isinstance(err, UserError):
            raise UserError(f"exporting {model} to ONNX failed ({type(err).__name__}: {err}); set "
                            f"embedder.backend: torch") from err
        raise
    if target.exists():
        shutil.rmtree(target)  # from other weights
    os.replace(aside, target)
    log.info("the ONNX export of %s is in %s", model, target)


def _torch_model(model: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model), device="cpu", local_files_only=True)


def _vectors(st_model) -> dict[str, np.ndarray]:
    return {prompt: st_model.encode(list(PROBE), prompt_name=prompt, normalize_embeddings=True, convert_to_numpy=True,
                                    show_progress_bar=False) for prompt in ("query", "document")}


def _check(model: Path, reference: dict[str, np.ndarray], exported: dict[str, np.ndarray]) -> None:
    """The export gives torch's vectors, on a question and a passage, or it is not used."""
    least = min(float(np.min(np.sum(reference[p] * exported[p], axis=1))) for p in reference)
    if least < LEAST_COSINE:
        raise UserError(f"the ONNX export of {model} does not give the model's vectors (a cosine of {least:.4f} "
                        f"to torch's): set embedder.backend: torch")


def loaded(model: Path, weights_id: str, threads: int):
    """The model of the folder ``model`` through ONNX Runtime, exported first if need be."""
    export = ready(model, weights_id)
    try:
        return load(export, threads)
    except Exception as err:  # ONNX Runtime's own errors for a file it cannot read
        raise ModelMissing(f"cannot load the ONNX export in {export} ({type(err).__name__}: {err}): delete that "
                           f"folder (the next load exports the model again), or set embedder.backend: torch") from None


def load(export: Path, threads: int):
    """The sentence-transformers model of an export: ONNX Runtime on ``threads`` threads."""
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return SentenceTransformer(str(export), device="cpu", local_files_only=True, backend="onnx",
                               model_kwargs={"file_name": ONNX_FILE, "provider": "CPUExecutionProvider",
                                             "session_options": options})
