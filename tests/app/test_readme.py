"""The configuration reference (docs/configuration.md) is the settings object's, and every file README.md points to
exists."""

from __future__ import annotations

import re
from pathlib import Path

from ragcache.settings import Settings
from ragcache_cli.cli import main
from ragcache_cli.config_docs import BEGIN_MARKER, END_MARKER, env_name, markdown_table, replace_section, section_of

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
LOCAL_PATH = re.compile(r"(?<![\w/.])((?:docs|docker|notebooks)/[\w./-]+\.(?:md|yaml|ipynb)|[A-Z]+\.md)\b")


def test_readme_reference_is_generated_from_settings():
    # On failure: run `ragcache config --readme docs/configuration.md` and commit the result.
    assert section_of(CONFIGURATION.read_text(encoding="utf-8")) == markdown_table()


def test_reference_has_a_described_row_for_every_setting():
    table = markdown_table()
    rows = table.splitlines()[2:]
    assert len(rows) == len(Settings.options())
    for (name, (section, field)), row in zip(Settings.options().items(), rows):
        assert row.startswith(f"| `{env_name(name)}` | `{section}` |")
        assert field.description, f"{name} has no description: the reference would say nothing about it"
    assert "| `RAGCACHE_L1_BYTES` | `levels` | int (> 0) | `268435456` | L1 slab budget in bytes |" in rows
    assert "| `RAGCACHE_REDIS_URL` | `levels` | str, or unset | unset |" in table
    assert "| `RAGCACHE_DTYPE` | `space` | one of `float32`, `float16`, `bfloat16` | `float32` |" in table


def test_config_markdown_prints_the_table(capsys):
    assert main(["config", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown_table()


def test_config_readme_rewrites_only_the_section(tmp_path, capsys):
    stale = f"# title\n\nbefore\n{BEGIN_MARKER}\n| old | table |\n{END_MARKER}\nafter\n"
    path = tmp_path / "README.md"
    path.write_text(stale)
    assert main(["config", "--readme", str(path)]) == 0
    assert "regenerated" in capsys.readouterr().out
    text = path.read_text()
    assert text == replace_section(stale, markdown_table())
    assert text.startswith("# title\n\nbefore\n") and text.endswith(f"{END_MARKER}\nafter\n")
    assert section_of(text) == markdown_table()


def test_config_readme_without_markers_is_an_error(tmp_path, capsys):
    path = tmp_path / "README.md"
    path.write_text("# no markers here\n")
    assert main(["config", "--readme", str(path)]) == 1
    assert "no section between" in capsys.readouterr().err
    assert path.read_text() == "# no markers here\n"


def test_effective_settings_read_back_from_a_file(tmp_path, capsys):
    settings_file = tmp_path / "ragcache.env"
    settings_file.write_text("RAGCACHE_L1_BYTES=1048576\nRAGCACHE_REDIS_URL=off\nRAGCACHE_EXTRA_MODELS=[\"m2\"]\n")
    assert main(["config", "--config", str(settings_file)]) == 0
    printed = capsys.readouterr().out
    assert "RAGCACHE_L1_BYTES=1048576" in printed and "# RAGCACHE_MODEL_REVISION is unset" in printed
    # What `ragcache config` prints is a settings file that gives the same settings back.
    round_trip = tmp_path / "printed.env"
    round_trip.write_text(printed)
    assert Settings.load(round_trip) == Settings.load(settings_file)


def test_config_masks_secrets(tmp_path, capsys):
    settings_file = tmp_path / "ragcache.env"
    settings_file.write_text("RAGCACHE_API_KEY=very-secret-key\n")
    assert main(["config", "--config", str(settings_file)]) == 0
    printed = capsys.readouterr().out
    assert "very-secret-key" not in printed and "RAGCACHE_API_KEY=********" in printed


def test_files_the_readme_points_to_exist():
    mentioned = set(LOCAL_PATH.findall(README.read_text(encoding="utf-8")))
    assert {"docs/replicas.md", "docs/capacity.md", "docker/README.md", "notebooks/cache_levels.ipynb"} <= mentioned
    missing = sorted(path for path in mentioned if not (ROOT / path).is_file())
    assert not missing, f"README points to files that do not exist: {missing}"
