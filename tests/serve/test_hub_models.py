"""Hugging Face model ids (issue 16, item 4): ``--model org/name``, ``--model-path org/name``
and ``POST /workers`` ids resolve to a snapshot in a hub cache laid out in a temp dir (no
network: HF_HUB_OFFLINE=1); revisions are respected; a missing id is a usage error saying how
to fetch it; a SentencePiece-only model is refused with what to do."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import trio

from smg_trio import cli
from smg_trio.errors import ValidationError
from smg_trio.serve import GatewayConfig, _confinement, _launch_plan
from smg_trio.serve.config import EngineLaunchConfig
from smg_trio.tokenizer.hub import is_hub_id, resolve_hub_model
from smg_trio.worker.confine import WorkerConfinement
from smg_trio.worker.manager import WorkerManager, WorkerSpec

REPO = "acme/tiny-chat"
MAIN = "a" * 40
V2 = "b" * 40


def _snapshot(hub: Path, repo: str, commit: str, src: Path, *, sentencepiece: bool = False) -> Path:
    """One snapshot as huggingface_hub lays it out: the files are links to blobs."""
    root = hub / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    (root / "blobs").mkdir(exist_ok=True)
    names = ["config.json", "tokenizer_config.json"]
    names += [] if sentencepiece else ["tokenizer.json"]
    for name in names:
        blob = root / "blobs" / f"{commit[:8]}-{name}"
        shutil.copy(src / name, blob)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    if sentencepiece:
        (snap / "tokenizer.model").write_bytes(b"\x0a\x00")
    return snap


@pytest.fixture
def hub(tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_HOME in a temp dir with REPO at main (MAIN) and at tag v2 (V2); offline."""
    for key in list(os.environ):
        if key.startswith(("SMG_TRIO_", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "hf" / "hub"
    _snapshot(cache, REPO, MAIN, model_dir)
    _snapshot(cache, REPO, V2, model_dir)
    refs = cache / f"models--{REPO.replace('/', '--')}" / "refs"
    refs.mkdir()
    (refs / "main").write_text(MAIN)
    (refs / "v2").write_text(V2)
    _snapshot(cache, "acme/spm-only", MAIN, model_dir, sentencepiece=True)
    (cache / "models--acme--spm-only" / "refs").mkdir()
    (cache / "models--acme--spm-only" / "refs" / "main").write_text(MAIN)
    return cache


def _config(argv: list[str], engine_args: list[str] | None = None) -> GatewayConfig:
    parser = cli._parser()
    args = parser.parse_args(argv)
    cli._apply_env_and_file(parser, args, argv)
    config = cli._config_from_args(args, engine_args or [])
    assert isinstance(config, GatewayConfig)
    return config


def test_hub_id_spelling() -> None:
    assert is_hub_id("Qwen/Qwen3-8B")
    assert is_hub_id("acme/tiny.chat_v1")
    for text in ("/abs/path", "./rel", "gpt2", "a/b/c", "org/../x", "org/-x", "or--g/x", "~/m"):
        assert not is_hub_id(text), text


def test_resolves_in_the_cache_with_revisions(hub: Path) -> None:
    main = resolve_hub_model(REPO)
    assert (main.path, main.commit) == (str(hub / "models--acme--tiny-chat/snapshots" / MAIN), MAIN)
    assert resolve_hub_model(REPO, "v2").commit == V2
    assert resolve_hub_model(REPO, V2).commit == V2


def test_serve_model_id_gives_engine_the_id_and_commit(hub: Path) -> None:
    config = _config(["serve", "--backend", "vllm", "--model", REPO, "--revision", "v2"])
    assert config.model_path == str(hub / "models--acme--tiny-chat/snapshots" / V2)
    assert config.served_model_name == REPO
    eng = config.engines
    assert isinstance(eng, EngineLaunchConfig)
    assert eng.model == REPO
    assert eng.engine_args[-2:] == ("--revision", V2)
    argv = _launch_plan(config)[0][1].argv
    assert argv[argv.index("serve") + 1] == REPO
    assert argv[argv.index("--revision") + 1] == V2
    # the hub id never becomes a model root of its own (it would be ./acme/tiny-chat)
    roots = _confinement(config).model_dirs
    assert not any(r.endswith("acme/tiny-chat") for r in roots), roots


def test_tokenizer_revision_and_default_revision(hub: Path) -> None:
    config = _config(["serve", "--backend", "vllm", "--model", REPO])
    assert config.model_path is not None
    assert config.model_path.endswith(MAIN)
    assert config.engines is not None
    assert config.engines.engine_args == ("--revision", MAIN)
    config = _config(
        ["serve", "--backend", "vllm", "--model", REPO, "--tokenizer-revision", "v2",
         "--served-model-name", "chat"]
    )  # fmt: skip
    assert config.model_path is not None
    assert config.model_path.endswith(V2)
    assert config.served_model_name == "chat"
    assert config.engines is not None
    assert config.engines.engine_args == ("--tokenizer-revision", V2)


def test_launch_model_path_id(hub: Path) -> None:
    config = _config(["launch", "--model-path", REPO])
    assert config.model_path is not None
    assert config.model_path.endswith(MAIN)
    assert config.served_model_name == REPO


def test_missing_id_offline_is_a_usage_error(hub: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _config(["serve", "--backend", "vllm", "--model", "acme/absent", "--revision", "v9"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "acme/absent" in err
    assert "HF_HUB_OFFLINE" in err
    assert "hf download acme/absent --revision v9" in err
    with pytest.raises(SystemExit):
        _config(["serve", "--backend", "vllm", "--model", REPO, "--revision", "v9"])
    assert "'v9'" in capsys.readouterr().err


def test_revision_after_dashes_is_refused(hub: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _config(["serve", "--backend", "vllm", "--model", REPO], ["--revision", "v2"])
    assert "give --revision before '--'" in capsys.readouterr().err


def test_sentencepiece_only_is_refused_with_what_to_do(hub: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        _config(["serve", "--backend", "vllm", "--model", "acme/spm-only"])
    message = str(exc.value.code)
    assert "SentencePiece tokenizer.model" in message
    assert "save_pretrained" in message
    assert "hf download" in message


async def test_post_workers_ids_resolve_in_the_cache(hub: Path, tmp_path: Path) -> None:
    conf = WorkerConfinement(socket_dirs=(str(tmp_path),), model_dirs=(str(hub),))
    url = f"ipc://{tmp_path}/w"
    async with trio.open_nursery() as nursery:
        manager = WorkerManager(nursery, confinement=conf)
        spec = await manager.check_spec(WorkerSpec(url=url, model_path=REPO))
        assert spec.model_path == str(hub / "models--acme--tiny-chat/snapshots" / MAIN)
        assert spec.model_id == REPO
        spec = await manager.check_spec(WorkerSpec(url=url, model_id=REPO))
        assert spec.model_path is not None
        assert spec.model_path.endswith(MAIN)
        named = await manager.check_spec(WorkerSpec(url=url, model_path=REPO, model_id="x"))
        assert named.model_id == "x"
        with pytest.raises(ValidationError) as err:
            await manager.check_spec(WorkerSpec(url=url, model_path="acme/absent"))
        assert err.value.param == "model_path"
        assert "hf download acme/absent" in err.value.message
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    "bad", ["../../../etc", "/etc/passwd", "v2/../main", ".hidden", "a b", "x" * 257, "v2\n"]
)
async def test_post_workers_revision_picks_the_snapshot_and_is_checked(
    hub: Path, tmp_path: Path, bad: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``revision`` on a worker spec picks that snapshot of the id (a tag here), and is
    spent once resolved. huggingface_hub joins a revision onto its cache path
    (``refs/<revision>``), so one that is not spelled like a branch, tag or commit is a 400
    before it is used; so is a revision with a local directory, or with a model_id alone
    that joins a served model (its tokenizer is loaded already)."""
    conf = WorkerConfinement(socket_dirs=(str(tmp_path),), model_dirs=(str(hub), str(tmp_path)))
    url = f"ipc://{tmp_path}/w"
    async with trio.open_nursery() as nursery:
        manager = WorkerManager(nursery, confinement=conf)
        spec = await manager.check_spec(WorkerSpec(url=url, model_path=REPO, revision="v2"))
        assert spec.model_path == str(hub / "models--acme--tiny-chat/snapshots" / V2)
        assert spec.revision is None
        spec = await manager.check_spec(WorkerSpec(url=url, model_id=REPO, revision=MAIN))
        assert spec.model_path is not None
        assert spec.model_path.endswith(MAIN)
        # a PR ref and a nested branch are files under folders of refs/: the folders are no
        # revision (huggingface_hub opened them as ref files: IsADirectoryError, a 500)
        refs = hub / "models--acme--tiny-chat" / "refs"
        (refs / "refs" / "pr").mkdir(parents=True)
        (refs / "refs" / "pr" / "1").write_text(V2)
        (refs / "feature").mkdir()
        (refs / "feature" / "x").write_text(MAIN)
        for revision, commit in [("refs/pr/1", V2), ("feature/x", MAIN)]:
            spec = await manager.check_spec(WorkerSpec(url=url, model_id=REPO, revision=revision))
            assert spec.model_path is not None
            assert spec.model_path.endswith(commit)
        for absent in ("v3", "refs", "refs/pr", "feature"):
            with pytest.raises(ValidationError) as err:
                await manager.check_spec(WorkerSpec(url=url, model_path=REPO, revision=absent))
            assert err.value.param == "model_path"
            assert f"{absent!r} is not in the Hugging Face cache" in err.value.message
        with pytest.raises(ValidationError) as err:
            await manager.check_spec(WorkerSpec(url=url, model_path=REPO, revision=bad))
        assert err.value.param == "revision"
        local = tmp_path / "local"
        local.mkdir()
        with pytest.raises(ValidationError) as err:
            await manager.check_spec(WorkerSpec(url=url, model_path=str(local), revision="v2"))
        assert err.value.param == "revision"
        monkeypatch.setattr(manager, "get_model", lambda model_id: object())  # it is served
        with pytest.raises(ValidationError) as err:
            await manager.check_spec(WorkerSpec(url=url, model_id="served", revision="v2"))
        assert err.value.param == "revision"
        nursery.cancel_scope.cancel()


async def test_post_workers_400s_keep_the_hub_cache_path_in_the_log(
    hub: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An id not in the cache is a 400 that says so without naming the cache's path (a
    client learns nothing of the gateway's filesystem); the log names it (issue 28, item 8)."""
    conf = WorkerConfinement(socket_dirs=(str(tmp_path),), model_dirs=(str(hub), str(tmp_path)))
    caplog.set_level(logging.WARNING, logger="smg_trio.worker.spec")
    async with trio.open_nursery() as nursery:
        manager = WorkerManager(nursery, confinement=conf)
        for spec in (
            WorkerSpec(url=f"ipc://{tmp_path}/w", model_path="acme/absent"),
            WorkerSpec(url=f"ipc://{tmp_path}/w", model_id=REPO, revision="v9"),
        ):
            with pytest.raises(ValidationError) as err:
                await manager.check_spec(spec)
            assert "is not in the Hugging Face cache" in err.value.message
            assert str(hub) not in err.value.message
            assert str(tmp_path) not in err.value.message
        nursery.cancel_scope.cancel()
    assert f"Hugging Face cache ({hub})" in caplog.text


def test_main_with_an_id_not_cached_exits_2_before_launch(
    hub: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:  # main() installs its own handler on the captured stderr: put the old ones back
        with pytest.raises(SystemExit) as exc:
            cli.main(["serve", "--backend", "vllm", "--model", "Qwen/Qwen2.5-0.5B"])
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Qwen/Qwen2.5-0.5B" in err
    assert "hf download Qwen/Qwen2.5-0.5B" in err
    assert "Traceback" not in err
