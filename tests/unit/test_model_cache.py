"""The models' cache: a build gets into place whole or not at all."""

import pytest

from gpustack_dspark.devstack.model_cache import build_once


def ready(path):
    return (path / "done").exists()


def test_a_build_lands_whole_and_is_not_run_again(tmp_path):
    runs = []

    def build(out):
        runs.append(out)
        out.mkdir()
        (out / "done").write_text("1")

    dest = tmp_path / "cache" / "model-abc"
    assert build_once(dest, build, ready) == dest and ready(dest)
    assert build_once(dest, build, ready) == dest and len(runs) == 1
    assert [p.name for p in dest.parent.iterdir()] == ["model-abc"]  # no scratch left


def test_a_failed_build_leaves_nothing(tmp_path):
    def build(out):
        out.mkdir()
        (out / "half").write_text("x")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError, match="conversion failed"):
        build_once(tmp_path / "model-abc", build, ready)
    assert list(tmp_path.iterdir()) == []


def test_a_build_another_process_finished_meanwhile_is_taken(tmp_path):
    dest = tmp_path / "model-abc"

    def build(out):  # while this one builds, another process renames its build into place
        dest.mkdir()
        (dest / "done").write_text("theirs")
        out.mkdir()
        (out / "done").write_text("ours")
        (out / "extra").write_text("x")  # a non-empty folder: the rename fails

    assert build_once(dest, build, ready) == dest and (dest / "done").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["model-abc"]
