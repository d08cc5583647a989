"""The GPUStack seam (gpustack_seam/): every row found on the installed GPUStack 2.3.0, a
lifted or reshaped name reported by name, the version gate first, one patch mark."""

from gpustack_dspark import gpustack_seam as gs, plugin, versions
from gpustack_dspark.gpustack_seam import shapes
from gpustack_dspark.gpustack_seam.shapes import Shape


def test_every_shape_is_there_on_the_supported_gpustack():
    assert gs.problems(*gs.SHAPES) == []


def test_each_need_is_a_plugin_feature_and_each_row_is_needed_or_devstack():
    assert set(gs.NEEDS) <= {f.name for f in plugin.build_features(dict, dict)}
    needed = {name for names in gs.NEEDS.values() for name in names}
    assert needed <= set(gs.SHAPES)


def test_a_lifted_name_and_a_changed_signature_are_named(monkeypatch):
    monkeypatch.setitem(shapes.SHAPES, "Model", Shape("gpustack.schemas.models", "Modle"))
    monkeypatch.setitem(shapes.SHAPES, "flatten_to_argv", Shape("gpustack.utils.command", "flatten_to_argv",
                                                                ("parameters", "sep")))
    monkeypatch.setitem(shapes.SHAPES, "db", Shape("gpustack.server.dbx"))
    found = gs.problems("Model", "flatten_to_argv", "db", "async_session")
    assert found[0] == "gpustack.schemas.models.Modle is missing"
    assert found[1] == "gpustack.utils.command.flatten_to_argv takes ['parameters'], expected ['parameters', 'sep']"
    assert found[2].startswith("gpustack.server.dbx is not importable: ")
    assert len(found) == 3
    try:
        gs.require_feature("console")
    except gs.SeamMismatch as e:
        assert "gpustack.schemas.models.Modle is missing" in str(e)
    else:
        raise AssertionError("the console needs Model")
    gs.require_feature("vllm_resource_fit")  # a feature that does not need it stays on


def test_an_unsupported_gpustack_makes_every_name_a_problem_with_the_version_reason(monkeypatch):
    monkeypatch.setattr(versions, "installed_gpustack_version", lambda: "2.2.0")
    assert gs.problems("Model", "openai") == ["GPUStack 2.2.0 is not the supported GPUStack 2.3.0"]


def test_one_patch_mark():
    def original():
        """GPUStack's."""

    def ours():
        pass

    wrapped = gs.wrap(original, ours)
    assert gs.is_patched(wrapped) and gs.unwrap(wrapped) is original and wrapped.__doc__ == "GPUStack's."
    assert not gs.is_patched(original) and gs.unwrap(original) is original
