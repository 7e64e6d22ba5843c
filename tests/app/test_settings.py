import pydantic
import pytest

from ragcache.errors import ConfigError
from ragcache.settings import Settings


def test_environment_variables_with_the_prefix(monkeypatch):
    monkeypatch.setenv("RAGCACHE_L1_BYTES", "4096")
    monkeypatch.setenv("RAGCACHE_REDIS_URL", "off")
    settings = Settings.load()
    assert settings.levels.l1_bytes == 4096 and not settings.levels.l2_enabled


def test_file_values_and_environment_over_file(tmp_path, monkeypatch):
    path = tmp_path / "ragcache.env"
    path.write_text("RAGCACHE_DTYPE=float16\nRAGCACHE_MILVUS_URI=off\nRAGCACHE_MAX_BATCH=7\n")
    monkeypatch.setenv("RAGCACHE_MAX_BATCH", "9")
    settings = Settings.load(path)
    assert (settings.space.dtype, settings.levels.resolved_milvus_uri, settings.service.max_batch) == ("float16", None, 9)


def test_defaults_are_the_embedded_ones(tmp_path):
    settings = Settings(data_dir=tmp_path)
    assert settings.levels.redis_url is None and settings.levels.l2_enabled
    assert settings.levels.resolved_milvus_uri == str(tmp_path / "milvus.db")
    assert settings.space.models == ["sentence-transformers/all-MiniLM-L6-v2"]


@pytest.mark.parametrize("field, value", [("redis_url", "localhost:6379"), ("dtype", "int8"), ("l1_bytes", 0), ("unknown", 1)])
def test_bad_settings_are_rejected(field, value):
    with pytest.raises(pydantic.ValidationError):
        Settings(**{field: value})


def test_missing_settings_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        Settings.load(tmp_path / "nope.env")


def test_every_option_sits_in_one_section_under_its_environment_name(monkeypatch):
    options = Settings.options()
    assert len(options) == 103 and options["redis_url"][0] == "levels" and options["api_key"][0] == "access"
    monkeypatch.setenv("RAGCACHE_API_KEY", "k")
    monkeypatch.setenv("RAGCACHE_PREFIX_VLLM_ENDPOINTS", '["http://a:8000"]')
    monkeypatch.setenv("RAGCACHE_RERANK_API", "cohere")
    settings = Settings.load()
    assert settings.access.api_key == "k" and settings.prefixes.prefix_vllm_endpoints == ["http://a:8000"]
    assert settings.rerank.rerank_api == "cohere"
    # Each option read back by its flat name gives the same settings: one vocabulary for writing them.
    assert Settings(**settings.flat()) == settings and set(settings.flat()) == set(options)


def test_options_are_given_by_name_never_as_a_section():
    with pytest.raises(pydantic.ValidationError, match="by their own names"):
        Settings(levels={"l1_bytes": 1})


def test_an_unknown_name_in_a_settings_file_is_refused(tmp_path):
    path = tmp_path / "ragcache.env"
    path.write_text("RAGCACHE_L1_BYTE=5\n")
    with pytest.raises(ConfigError, match=r"RAGCACHE_L1_BYTE is not a ragcache setting \(in the settings file\); did you mean "
                                          "RAGCACHE_L1_BYTES"):
        Settings.load(path)


def test_replace_validates_and_keeps_the_rest():
    settings = Settings(redis_url="off", l1_bytes=4096)
    changed = settings.replace(milvus_uri="off")
    assert (changed.levels.redis_url, changed.levels.l1_bytes, changed.levels.resolved_milvus_uri) == ("off", 4096, None)
    with pytest.raises(pydantic.ValidationError):
        settings.replace(l1_bytes=0)


def test_settings_are_frozen_and_show_no_secret():
    settings = Settings(api_key="s3cret-key", rerank_api_key="s3cret-rerank", milvus_password="s3cret-pw",
                        redis_url="redis://:s3cret-url@h:6379")
    with pytest.raises(pydantic.ValidationError):
        settings.levels.l1_bytes = 1  # type: ignore[misc]
    shown = repr(settings) + str(settings)
    assert "s3cret" not in shown and "redis://***@h:6379" in shown
    with pytest.raises(pydantic.ValidationError) as refused:
        Settings(api_key="s3cret-key", l1_bytes=0, unknown=1)
    assert "s3cret" not in str(refused.value) and "levels.l1_bytes" in str(refused.value)
