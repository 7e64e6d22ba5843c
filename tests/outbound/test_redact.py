"""Credentials never shown: URIs redacted wherever they are printed, logged, returned or put in errors."""

from __future__ import annotations

import pytest

from ragcache.errors import ConfigError
from ragcache.observe.redact import redact_text, redact_url
from ragcache.settings import Settings
from ragcache.storage.stores import open_milvus
from ragcache_cli.config_docs import effective_env_lines


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@cache:6379/0", "redis://***@cache:6379/0"),
        ("rediss://app:s3cret@cache:6380", "rediss://***@cache:6380"),
        ("http://root:s3cret@milvus:19530", "http://***@milvus:19530"),
        ("redis://a:s3cret@n1:7000,redis://b:s3cret@n2:7001", "redis://***@n1:7000,redis://***@n2:7001"),
        ("https://milvus:443/?token=s3cret&db_name=kb", "https://milvus:443/?token=***&db_name=kb"),
        ("redis://cache:6379?password=s3cret", "redis://cache:6379?password=***"),
        ("data/milvus.db", "data/milvus.db"),
        ("http://127.0.0.1:19530", "http://127.0.0.1:19530"),
    ],
)
def test_redact_url_keeps_the_address_and_hides_every_credential(url, shown):
    assert redact_url(url) == shown


def test_redact_text_hides_the_uri_and_its_password_inside_a_longer_message():
    url = "redis://:s3cretpw@cache:6379"
    text = f"cannot connect to {url}: AUTH s3cretpw refused"
    assert redact_text(text, url) == "cannot connect to redis://***@cache:6379: AUTH *** refused"


def test_settings_repr_and_the_printed_configuration_show_no_credential():
    settings = Settings(redis_url="redis://:s3cret1@cache:6379", milvus_uri="http://root:s3cret2@milvus:19530",
                        milvus_user="root", milvus_password="s3cret3", milvus_token="s3cret4")
    shown = [repr(settings), str(settings), *effective_env_lines(settings)]
    assert not any(secret in text for text in shown for secret in ("s3cret1", "s3cret2", "s3cret3", "s3cret4"))
    assert "RAGCACHE_MILVUS_URI=http://***@milvus:19530" in shown
    assert "RAGCACHE_MILVUS_PASSWORD=********" in shown


def test_a_bad_milvus_uri_is_refused_without_showing_its_password():
    with pytest.raises(ConfigError) as info:
        open_milvus("ftp://root:s3cret@milvus:19530")
    assert "s3cret" not in str(info.value) and "***" in str(info.value)
