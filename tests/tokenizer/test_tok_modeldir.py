"""ModelDir confinement: every file read from a model directory resolves inside the allowed
roots; a symlink out is refused whatever it points at; an HF hub cache's snapshot-to-blob
links keep working (issue 18, finding 1)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from smg_trio.errors import ModelPathError
from smg_trio.tokenizer import Tokenizer
from smg_trio.tokenizer.eos import resolve_eos
from smg_trio.tokenizer.modeldir import MODEL_FILES, ModelDir

SECRET = "{{ 'TOP-SECRET-7f3a: root only' }}"


@pytest.fixture
def layout(tmp_path: Path, tiny_model_dir: Path) -> tuple[Path, Path, Path]:
    """``(root, model, secret)``: a model copied into an allowed root, and a secret file
    outside it."""
    root = tmp_path / "models"
    model = root / "m"
    shutil.copytree(tiny_model_dir, model)
    secret = tmp_path / "secret.jinja"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    return root, model, secret


def test_confined_dir_loads_like_an_unconfined_one(layout: tuple[Path, Path, Path]) -> None:
    root, model, _ = layout
    confined = Tokenizer.from_dir(ModelDir(model, [str(root)]))
    plain = Tokenizer.from_dir(model)
    assert confined.encode("Hello, world!") == plain.encode("Hello, world!")
    assert confined.chat_templates.keys() == plain.chat_templates.keys()
    assert resolve_eos(ModelDir(model, [str(root)]), confined) == resolve_eos(model, plain)


@pytest.mark.parametrize("name", ["chat_template.jinja", "tokenizer_config.json", "tokenizer.json"])
def test_a_file_linked_out_of_the_roots_is_refused(
    layout: tuple[Path, Path, Path], name: str
) -> None:
    root, model, secret = layout
    (model / name).unlink(missing_ok=True)
    (model / name).symlink_to(secret)
    with pytest.raises(ModelPathError) as err:
        Tokenizer.from_dir(ModelDir(model, [str(root)]))
    assert err.value.param == "model_path"
    assert name in err.value.message
    assert "TOP-SECRET" not in err.value.message
    assert str(secret) not in err.value.message
    # unconfined (library use), the link is followed as before
    if name == "chat_template.jinja":
        assert "TOP-SECRET" in Tokenizer.from_dir(model).chat_templates["default"].source


@pytest.mark.parametrize("name", ["config.json", "generation_config.json"])
def test_eos_files_linked_out_are_refused(layout: tuple[Path, Path, Path], name: str) -> None:
    root, model, secret = layout
    (model / name).unlink(missing_ok=True)
    (model / name).symlink_to(secret)
    with pytest.raises(ModelPathError, match=name):
        resolve_eos(ModelDir(model, [str(root)]))


def test_same_error_whether_the_outside_target_exists_or_not(
    layout: tuple[Path, Path, Path],
) -> None:
    root, model, secret = layout
    messages = []
    for target in (secret, secret.with_name("missing"), Path("/etc/shadow")):
        link = model / "chat_template.jinja"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        with pytest.raises(ModelPathError) as err:
            ModelDir(model, [str(root)]).check_files()
        messages.append(err.value.message)
    assert len(set(messages)) == 1


def test_a_model_dir_linked_out_of_the_roots_is_refused(
    layout: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    root, model, _ = layout
    outside = tmp_path / "outside"
    model.rename(outside)
    (root / "m").symlink_to(outside, target_is_directory=True)
    for target in (root / "m", tmp_path / "nowhere", Path("/etc")):
        with pytest.raises(ModelPathError, match="outside the allowed model directories"):
            ModelDir(target, [str(root)])


def test_links_inside_the_roots_are_followed(layout: tuple[Path, Path, Path]) -> None:
    root, model, _ = layout
    shared = root / "shared-template.jinja"
    shared.write_text("{{ messages[0]['content'] }}")
    (model / "chat_template.jinja").symlink_to(shared)
    tok = Tokenizer.from_dir(ModelDir(model, [str(root)]))
    assert tok.chat_templates["default"].source == "{{ messages[0]['content'] }}"


def _fake_hub(hub: Path, source: Path, repo: str = "models--org--tiny") -> Path:
    """The huggingface_hub cache layout: blobs named by hash, snapshot files linking to them
    with relative ``../../blobs/<hash>`` links."""
    blobs = hub / repo / "blobs"
    snapshot = hub / repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (hub / repo / "refs").mkdir()
    (hub / repo / "refs" / "main").write_text("0123abcd")
    for f in source.iterdir():
        data = f.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        os.symlink(f"../../blobs/{digest}", snapshot / f.name)
    return snapshot


def test_hf_cache_snapshot_links_keep_working(tmp_path: Path, tiny_model_dir: Path) -> None:
    hub = tmp_path / "hub"
    snapshot = _fake_hub(hub, tiny_model_dir)
    assert (snapshot / "tokenizer.json").is_symlink()
    tok = Tokenizer.from_dir(ModelDir(snapshot, [str(hub)]))
    assert tok.encode("Hello") == Tokenizer.from_dir(tiny_model_dir).encode("Hello")
    ModelDir(snapshot, [str(hub)]).check_files()
    # a snapshot link that leaves the cache is refused like any other
    secret = tmp_path / "secret.jinja"
    secret.write_text(SECRET)
    (snapshot / "chat_template.jinja").symlink_to(secret)
    with pytest.raises(ModelPathError, match=r"chat_template\.jinja"):
        Tokenizer.from_dir(ModelDir(snapshot, [str(hub)]))


def test_every_model_file_is_checked(layout: tuple[Path, Path, Path]) -> None:
    root, model, secret = layout
    for name in MODEL_FILES:
        link = model / name
        original = model / f"{name}.orig"
        if link.exists():
            link.rename(original)
        link.symlink_to(secret)
        with pytest.raises(ModelPathError, match=name):
            ModelDir(model, [str(root)]).check_files()
        link.unlink()
        if original.exists():
            original.rename(link)
