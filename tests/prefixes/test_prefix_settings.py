"""A prefix setting is one field (issue 41): ``prefix_<name>`` reaches the registry config's field ``<name>`` by its
name alone, and a setting with no such field stops the start instead of being dropped."""

from __future__ import annotations

import dataclasses

import pytest

from ragcache.errors import ConfigError
from ragcache.prefixes import settings as prefix_settings
from ragcache.prefixes.config import PrefixRegistryConfig
from ragcache.settings import Settings
from ragcache.settings.sections import Prefixes


def test_every_prefix_setting_lands_in_the_registry_config_under_its_name(tmp_path):
    config = prefix_settings.registry_config(Settings(data_dir=tmp_path))
    for name, value in Settings(data_dir=tmp_path).prefixes.model_dump().items():
        if name in prefix_settings.DERIVED:
            continue
        field = prefix_settings.RENAMED.get(name, name.removeprefix("prefix_"))
        assert getattr(config, field) == (tuple(value) if isinstance(value, list) else value), name
    assert {f.name for f in dataclasses.fields(PrefixRegistryConfig)} >= {"kv_events", "tenant_targets"}
    assert set(Prefixes.model_fields) >= prefix_settings.DERIVED | set(prefix_settings.RENAMED)


def test_a_value_given_as_a_setting_is_the_configs(tmp_path):
    settings = Settings(data_dir=tmp_path, prefix_warm_budget_per_minute=77, prefix_max_per_tenant=5,
                        prefix_warm_max_running=2, prefix_vllm_endpoints=["http://vllm-1:8000"])
    config = prefix_settings.registry_config(settings)
    assert (config.warm_budget_per_minute, config.max_prefixes_per_tenant, config.warm_max_running) == (77, 5, 2)
    assert config.endpoints == ("http://vllm-1:8000",)
    assert config.file_path == tmp_path / "prefixes.json"


def test_a_setting_without_a_config_field_stops_the_start(tmp_path, monkeypatch):
    monkeypatch.setitem(prefix_settings.RENAMED, "prefix_lease_ttl_s", "lease_seconds")
    with pytest.raises(ConfigError, match="setting prefix_lease_ttl_s has no field 'lease_seconds'"):
        prefix_settings.registry_config(Settings(data_dir=tmp_path))
