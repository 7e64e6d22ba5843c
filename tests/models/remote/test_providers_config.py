"""Remote models as configured: parsing, refusals that name the field, the space, and the key kept secret."""

from __future__ import annotations

import json
import logging

import pytest

from ragcache.errors import ConfigError
from ragcache.models.remote import OpenAIEncoder, RemoteModel, endpoint_identity, load_models, open_remote_encoder, remote_space
from ragcache.models.remote.http import plan_requests
from ragcache.models.remote.tokens import estimate_tokens

BASE = dict(name="m", provider="openai", base_url="https://api.example.com/v1", upstream_model="emb-1", dimensions=8)
SECRET = "sk-test-0123456789abcdef"


def test_models_come_from_json_text_and_a_toml_file(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text('[[models]]\nname = "b"\nprovider = "tei"\nbase_url = "http://tei:8080"\nupstream_model = "x"\ndimensions = 4\n')
    models = load_models(json.dumps({"models": [BASE]}), path)
    assert [(m.name, m.provider) for m in models] == [("m", "openai"), ("b", "tei")]


@pytest.mark.parametrize(
    "change, words",
    [
        ({"provider": "cohere"}, "provider"),
        ({"base_url": "ftp://x"}, "base_url"),
        ({"base_url": "https://user:pw@api.example.com"}, "must not hold credentials"),
        ({"dimensions": 0}, "dimensions"),
        ({"colour": "red"}, "unknown fields"),
        ({"prompt_name": "q"}, "TEI option"),
        ({"api_key_env": "A", "api_key_file": "/f"}, "not both"),
        ({"max_retries": 11}, "max_retries"),
    ],
)
def test_a_bad_entry_is_refused_naming_what_to_fix(change, words):
    with pytest.raises(ConfigError, match=words):
        load_models(json.dumps({"models": [{**BASE, **change}]}), None)


def test_names_must_be_unique():
    with pytest.raises(ConfigError, match="unique"):
        load_models(json.dumps({"models": [BASE, BASE]}), None)


def test_the_endpoint_identity_has_no_credentials_and_an_explicit_port():
    assert endpoint_identity("https://api.example.com/v1/") == "https://api.example.com:443/v1"
    assert endpoint_identity("http://u:p@h:81/x?key=1#f") == "http://h:81/x"


def test_what_changes_the_vector_changes_the_space_and_the_client_name_does_not():
    space = remote_space(RemoteModel(**BASE))
    assert (space.provider, space.endpoint, space.model, space.dim) == ("openai", "https://api.example.com:443/v1", "emb-1", 8)
    assert remote_space(RemoteModel(**{**BASE, "name": "renamed"})) == space
    for change in [{"base_url": "https://other.example.com/v1"}, {"revision": "2"}, {"normalize": True},
                   {"prompt": "q: "}, {"dimensions": 4}, {"provider": "ollama"}, {"upstream_model": "emb-2"}]:
        assert remote_space(RemoteModel(**{**BASE, **change})).space_id != space.space_id, change
    # Two deployments the operator declares one endpoint share their entries.
    one = remote_space(RemoteModel(**{**BASE, "endpoint_id": "openai"}))
    assert remote_space(RemoteModel(**{**BASE, "base_url": "https://proxy.internal/v1", "endpoint_id": "openai"})) == one


def test_the_key_is_read_from_the_named_variable_or_file_and_never_shown(tmp_path, caplog):
    encoder = open_remote_encoder(RemoteModel(**BASE, api_key_env="UPSTREAM_KEY"), {"UPSTREAM_KEY": SECRET})
    key_file = tmp_path / "key"
    key_file.write_text(SECRET + "\n")
    from_file = open_remote_encoder(RemoteModel(**BASE, api_key_file=str(key_file)), {})
    try:
        with caplog.at_level(logging.DEBUG):
            shown = [repr(encoder), str(encoder.stats()), repr(encoder._api_key), str(from_file._api_key), repr(vars(encoder))]
        assert all(SECRET not in text for text in shown + [caplog.text])
        assert from_file._api_key.header() == f"Bearer {SECRET}"
    finally:
        encoder.close()
        from_file.close()
    with pytest.raises(ConfigError, match="UPSTREAM_KEY") as refused:
        open_remote_encoder(RemoteModel(**BASE, api_key_env="UPSTREAM_KEY"), {})
    assert SECRET not in str(refused.value)


def test_requests_respect_both_the_input_and_the_token_limit():
    assert plan_requests([1] * 5, max_inputs=2, max_tokens=100) == [range(0, 2), range(2, 4), range(4, 5)]
    assert plan_requests([60, 60, 30, 200, 1], max_inputs=10, max_tokens=100) == [range(0, 1), range(1, 3), range(3, 4), range(4, 5)]
    assert plan_requests([], max_inputs=2, max_tokens=10) == []


def test_the_token_estimate_is_half_the_utf8_bytes_plus_special_tokens():
    assert estimate_tokens("") == 2
    assert estimate_tokens("abcd") == 4
    assert estimate_tokens("日本") == 3 + 2  # 6 bytes


def test_the_encoder_takes_what_fills_every_slot():
    encoder = OpenAIEncoder(RemoteModel(**BASE, max_inputs=16, concurrency=3))
    try:
        assert encoder.capabilities.max_batch == 48 and str(encoder.device) == "cpu"
    finally:
        encoder.close()


def test_waiting_for_a_busy_connection_times_out_without_opening_the_breaker():
    import threading

    import httpx

    from ragcache.errors import UpstreamTimeoutError

    entered, release = threading.Event(), threading.Event()

    def upstream(request: httpx.Request) -> httpx.Response:
        entered.set()
        release.wait(10)  # holds the one connection until the second call has given up
        texts = json.loads(request.content)["input"]
        return httpx.Response(200, json={"data": [{"index": i, "embedding": [0.5] * 8} for i in range(len(texts))]})

    model = RemoteModel(**{**BASE, "concurrency": 1, "timeout_s": 0.5})
    encoder = OpenAIEncoder(model, transport=httpx.MockTransport(upstream))
    outcomes: list = []

    def first_call() -> None:
        try:
            outcomes.append(encoder.encode(["first"]))
        except UpstreamTimeoutError as exc:  # it outlived its own deadline holding the connection: expected
            outcomes.append(exc)

    first = threading.Thread(target=first_call)
    try:
        first.start()
        assert entered.wait(10)
        with pytest.raises(UpstreamTimeoutError, match="connections busy"):
            encoder.encode(["second"])
        assert encoder.stats().up and encoder.stats().errors == {"timeout": 1}  # counted, breaker still closed
    finally:
        release.set()
        first.join(10)
        encoder.close()
    assert len(outcomes) == 1
