"""The one home of configuration: environment variables prefixed ``RAGCACHE_``, optionally a file.

Read once at start-up and passed down; nothing below this reads ``os.environ``. A settings file uses the
same names, in dotenv form (``RAGCACHE_L1_BYTES=1073741824``); real environment variables override it.

Options are read in sections (``settings.levels.redis_url``, ``settings.access.api_key``; :mod:`.sections`) and
written by their flat names, the same everywhere: ``RAGCACHE_REDIS_URL`` in the environment or a settings file,
``Settings(redis_url=...)``, ``Settings.load(path, redis_url=...)`` and ``settings.replace(redis_url=...)`` in code.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from copy import copy
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, create_model, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from ragcache.errors import ConfigError
from ragcache.settings.checks import invalid_settings_message, unknown_variables
from ragcache.settings.files import load_file, load_json
from ragcache.settings.sections import (
    MAX_BATCH_CEILING,
    Access,
    Compute,
    Drift,
    Knowledge,
    Levels,
    Prefixes,
    Rerank,
    Service,
    Space,
)

__all__ = [
    "MAX_BATCH_CEILING",
    "Access",
    "Compute",
    "Drift",
    "Knowledge",
    "Levels",
    "Prefixes",
    "Rerank",
    "Service",
    "Settings",
    "Space",
    "load_file",
    "load_json",
]

# hide_input_in_errors: an error about the whole input would print every value, secrets too; a section's own
# errors still show the one value they are about.
_CONFIG = SettingsConfigDict(env_prefix="RAGCACHE_", extra="forbid", frozen=True, hide_input_in_errors=True)


class Settings(BaseSettings):
    """Every option, in sections. Build it with flat names (``Settings(redis_url="off")``), read it by section."""

    model_config = _CONFIG

    space: Space = Field(default_factory=Space)
    levels: Levels = Field(default_factory=Levels)
    compute: Compute = Field(default_factory=Compute)
    knowledge: Knowledge = Field(default_factory=Knowledge)
    rerank: Rerank = Field(default_factory=Rerank)
    drift: Drift = Field(default_factory=Drift)
    prefixes: Prefixes = Field(default_factory=Prefixes)
    service: Service = Field(default_factory=Service)
    access: Access = Field(default_factory=Access)

    def __init__(self, **options: Any) -> None:
        # Declared only to tell type checkers that options go by flat name (the fields are the sections).
        super().__init__(**options)

    @classmethod
    def options(cls) -> dict[str, tuple[str, FieldInfo]]:
        """Every option by its flat name: the section holding it and its field, in declaration order."""
        return dict(_OPTIONS)

    @classmethod
    def load(cls, path: str | Path | None = None, **overrides: Any) -> Settings:
        """Settings from the environment, optionally a dotenv-style file under it, and explicit overrides. A value
        that does not validate is a one-line ``ConfigError`` naming its variable; a ``RAGCACHE_*`` variable that
        names no option is logged as a warning, with the nearest option's name."""
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"settings file {path} does not exist")
        _warn_unknown_variables()
        try:
            return cls(_env_file=path, **overrides)
        except ValidationError as exc:
            raise ConfigError(invalid_settings_message(exc, _OPTIONS)) from exc

    def flat(self) -> dict[str, Any]:
        """Every option's value by its flat name (the environment variable's, without the prefix)."""
        return {name: getattr(getattr(self, section), name) for name, (section, _) in _OPTIONS.items()}

    def replace(self, **changes: Any) -> Settings:
        """These settings with some options changed, by flat name, validated; the environment is not read again."""
        return type(self).model_validate({**self.flat(), **changes})

    @model_validator(mode="before")
    @classmethod
    def _into_sections(cls, values: Any) -> Any:
        # Sources and keywords give flat names; each goes to its section. An unknown name stays at the top, where
        # extra="forbid" refuses it, and so does a whole section: options are written one way, by name.
        if not isinstance(values, dict):
            return values
        sections: dict[str, dict[str, Any]] = {section: {} for section in cls.model_fields}
        rest = {}
        for name, value in values.items():
            if name in _OPTIONS:
                sections[_OPTIONS[name][0]][name] = value
            elif name in sections:
                raise ValueError(f"give the options of {name!r} by their own names, e.g. Settings(redis_url=...)")
            else:
                rest[name] = value
        return {**sections, **rest}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # pydantic-settings looks a nested model up as RAGCACHE_LEVELS or RAGCACHE_LEVELS__X, never by a flat name:
        # the environment and the file are read against a flat model of every option instead, then sorted as above.
        assert isinstance(dotenv_settings, DotEnvSettingsSource)
        env_file = dotenv_settings.env_file
        return (
            init_settings,
            EnvSettingsSource(_FlatOptions),
            DotEnvSettingsSource(_FlatOptions, env_file=env_file, env_file_encoding=dotenv_settings.env_file_encoding),
        )


def _options(sections: dict[str, FieldInfo]) -> dict[str, tuple[str, FieldInfo]]:
    options: dict[str, tuple[str, FieldInfo]] = {}
    for section, field in sections.items():
        model: type[BaseModel] = field.annotation  # type: ignore[assignment]
        for name, option in model.model_fields.items():
            if name in options or name in sections:
                raise TypeError(f"option {name!r} of {section!r} is declared twice: an environment name must be unique")
            options[name] = (section, option)
    return options


log = logging.getLogger(__name__)
_named_unknown: set[str] = set()  # each unknown variable is named once per process, however often settings load


def _warn_unknown_variables() -> None:
    # A worker process (uvicorn's --workers, spawned by multiprocessing) inherits the environment its parent checked
    # and named already: saying it again once per worker is noise.
    if multiprocessing.parent_process() is not None:
        return
    for line in unknown_variables(os.environ, _OPTIONS):
        if line not in _named_unknown:
            _named_unknown.add(line)
            log.warning("%s", line)


class _FlatBase(BaseSettings):
    model_config = _CONFIG


_OPTIONS = _options(Settings.model_fields)
# Read only by the sources above, never validated: the sections validate what they read.
_FlatOptions: type[BaseSettings] = create_model(  # type: ignore[call-overload]
    "_FlatOptions", __base__=_FlatBase, **{name: (option.annotation, copy(option)) for name, (_, option) in _OPTIONS.items()}
)
