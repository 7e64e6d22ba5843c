import pydantic
import pytest

from ragcache.errors import ConfigError
from ragcache.settings import Settings


def test_environment_variables_with_the_prefix(monkeypatch):
    monkeypatch.setenv("RAGCACHE_L1_BYTES", "4096")
    monkeypatch.setenv("RAGCACHE_REDIS_URL", "off")
    settings = Settings.load()
    assert settings.l1_bytes == 4096 and not settings.l2_enabled


def test_file_values_and_environment_over_file(tmp_path, monkeypatch):
    path = tmp_path / "ragcache.env"
    path.write_text("RAGCACHE_DTYPE=float16\nRAGCACHE_MILVUS_URI=off\nRAGCACHE_MAX_BATCH=7\n")
    monkeypatch.setenv("RAGCACHE_MAX_BATCH", "9")
    settings = Settings.load(path)
    assert (settings.dtype, settings.resolved_milvus_uri, settings.max_batch) == ("float16", None, 9)


def test_defaults_are_the_embedded_ones(tmp_path):
    settings = Settings(data_dir=tmp_path)
    assert settings.redis_url is None and settings.l2_enabled
    assert settings.resolved_milvus_uri == str(tmp_path / "milvus.db")
    assert settings.models == ["sentence-transformers/all-MiniLM-L6-v2"]


@pytest.mark.parametrize("field, value", [("redis_url", "localhost:6379"), ("dtype", "int8"), ("l1_bytes", 0), ("unknown", 1)])
def test_bad_settings_are_rejected(field, value):
    with pytest.raises(pydantic.ValidationError):
        Settings(**{field: value})


def test_missing_settings_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        Settings.load(tmp_path / "nope.env")
