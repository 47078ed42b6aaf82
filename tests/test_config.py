from pathlib import Path

import pytest

from rag import config as config_mod
from rag.errors import ConfigError

from conftest import REPO


def load_text(tmp_path: Path, text: str) -> config_mod.Settings:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return config_mod.load(path)


def test_repository_config_is_valid_and_points_at_the_sample_notes():
    settings = config_mod.load(REPO / "config.yaml")
    assert settings.source.kind == "files"
    assert settings.source.path == REPO / "examples" / "notes"
    assert settings.state_dir == REPO / "data"
    assert settings.embedder.kind == "use"
    assert settings.qdrant.kind == "edge"


def test_issue_keys_work(tmp_path):
    settings = load_text(
        tmp_path,
        """
leanote:
  base_url: http://127.0.0.1:9000/
source:
  kind: leanote_api
  accounts:
    - email: one@example.com
      password_env: LEANOTE_PASSWORD_ONE
state_dir: data
""",
    )
    assert settings.leanote.base_url == "http://127.0.0.1:9000"  # trailing slash dropped
    assert settings.source.accounts[0].password_env == "LEANOTE_PASSWORD_ONE"
    assert settings.state_dir == tmp_path / "data"


def test_misspelt_key_names_its_path_and_suggests_the_right_one(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_text(tmp_path, "source: {kind: files, path: x}\nretrieval:\n  top_kk: 5\n")
    assert "retrieval.top_kk: unknown key" in str(err.value)
    assert "did you mean retrieval.top_k" in str(err.value)


def test_unknown_key_inside_a_list_names_its_index(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_text(
            tmp_path,
            "source:\n  kind: leanote_api\n  accounts:\n    - email: a@b.c\n      password: secret\n",
        )
    message = str(err.value)
    assert "source.accounts[0].password: unknown key" in message
    assert "source.accounts[0].password_env: required" in message


def test_a_budget_that_leaves_the_answer_no_time_is_refused_naming_both_keys(tmp_path):
    """answer.first_token_budget as long as ollama.timeout: every answer would be cut short
    while it is written."""
    with pytest.raises(ConfigError) as err:
        load_text(tmp_path, "source: {kind: files, path: x}\nanswer: {first_token_budget: 120}\n")
    assert "config.yaml: answer.first_token_budget (120 s) must be shorter than ollama.timeout (120 s)" in str(err.value)
    ok = load_text(tmp_path, "source: {kind: files, path: x}\nanswer: {first_token_budget: 120}\nollama: {timeout: 240}\n")
    assert ok.answer.first_token_budget == 120
    assert load_text(tmp_path, "source: {kind: files, path: x}\nanswer: {first_token_budget: 120}\n"
                               "ollama: {enabled: false}\n").ollama.enabled is False


def test_written_questions_turned_on_are_searched_unless_their_weight_says_otherwise(tmp_path):
    """memory.questions on or auto without retrieval.questions_weight: they are searched at the
    measured weight (a user who turns them on should not also have to find the weight)."""
    def weight(text: str) -> float:
        return load_text(tmp_path, "source: {kind: files, path: x}\n" + text).retrieval.questions_weight

    assert weight("") == 0 and weight("memory: {questions: off}\n") == 0
    assert weight("memory: {questions: auto}\n") == config_mod.QUESTIONS_WEIGHT == 0.25
    assert weight("memory: {questions: on}\nretrieval: {questions_weight: 0}\n") == 0
    assert weight("memory: {questions: on}\nretrieval: {questions_weight: 0.3}\n") == 0.3
    assert config_mod.load(REPO / "config.yaml").retrieval.questions_weight == 0  # the shipped config: off


def test_bad_values_are_reported_with_their_path(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_text(tmp_path, "source: {kind: files, path: x}\nretrieval: {top_k: 0}\nembedder: {kind: bert}\n")
    message = str(err.value)
    assert "retrieval.top_k" in message
    assert "embedder.kind" in message


def test_files_source_needs_a_path(tmp_path):
    with pytest.raises(ConfigError, match="source.path is required"):
        load_text(tmp_path, "source: {kind: files}\n")


def test_chunk_sizes_must_be_ordered(tmp_path):
    with pytest.raises(ConfigError, match="min_size must be below"):
        load_text(tmp_path, "source: {kind: files, path: x}\nchunking: {min_size: 700, max_size: 600}\n")


def test_relative_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    sub = tmp_path / "etc"
    sub.mkdir()
    (sub / "c.yaml").write_text("source: {kind: files, path: notes}\nstate_dir: ../var\n")
    monkeypatch.chdir(REPO)
    settings = config_mod.load(sub / "c.yaml")
    assert settings.source.path == sub / "notes"
    assert settings.state_dir.resolve() == (tmp_path / "var").resolve()


def test_config_location_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(config_mod.CONFIG_ENV, raising=False)
    assert config_mod.locate(None) == Path("config.yaml")
    monkeypatch.setenv(config_mod.CONFIG_ENV, "/etc/leanote-rag/config.yaml")
    assert config_mod.locate(None) == Path("/etc/leanote-rag/config.yaml")
    assert config_mod.locate("mine.yaml") == Path("mine.yaml")


def test_missing_file_says_how_to_fix(tmp_path):
    with pytest.raises(ConfigError, match="--config PATH"):
        config_mod.load(tmp_path / "nope.yaml")


def test_invalid_yaml_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_text(tmp_path, "source: [unclosed\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_text(tmp_path, "- a\n- b\n")


def test_secret_comes_from_the_named_variable(monkeypatch):
    monkeypatch.setenv("LR_TEST_SECRET", "s3cret")
    assert config_mod.secret("LR_TEST_SECRET", "source.accounts[0].password_env") == "s3cret"
    monkeypatch.delenv("LR_TEST_SECRET")
    with pytest.raises(ConfigError, match=r"LR_TEST_SECRET \(named by source.accounts\[0\].password_env\) is not set"):
        config_mod.secret("LR_TEST_SECRET", "source.accounts[0].password_env")


def test_qdrant_url_selects_the_server_backend(tmp_path):
    settings = load_text(tmp_path, "source: {kind: files, path: x}\nqdrant: {url: 'http://q:6333'}\n")
    assert settings.qdrant.kind == "server"
    with pytest.raises(ConfigError, match="needs qdrant.url"):
        load_text(tmp_path, "source: {kind: files, path: x}\nqdrant: {backend: server}\n")


def test_unquoted_on_and_off_mean_the_words(tmp_path):
    """YAML reads an unquoted on/off as true/false; the log and the docs write them unquoted."""
    settings = load_text(tmp_path, "source: {kind: files, path: notes}\nmemory:\n  llm: on\nretrieval:\n  expand: off\n")
    assert settings.memory.llm == "on" and settings.retrieval.expand == "off"
    settings = load_text(tmp_path, "source: {kind: files, path: notes}\nmemory: {llm: off}\nretrieval: {expand: yes}\n")
    assert settings.memory.llm == "off" and settings.retrieval.expand == "on"
    with pytest.raises(ConfigError, match="memory.llm"):
        load_text(tmp_path, "source: {kind: files, path: notes}\nmemory: {llm: sometimes}\n")


def _models(annotation):
    """The config models an annotation holds (a section, or the items of a list of them)."""
    from pydantic import BaseModel

    found = []
    for a in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(a, type) and issubclass(a, BaseModel):
            found.append(a)
        else:
            found += [b for b in getattr(a, "__args__", ()) if isinstance(b, type) and issubclass(b, BaseModel)]
    return list(dict.fromkeys(found))


def test_the_repositorys_config_lists_every_option():
    """config.yaml says it lists every option: each key of every section (and of the items of
    its lists) is in its section there, set or in a comment."""
    import re

    text = (REPO / "config.yaml").read_text(encoding="utf-8")
    lines = [re.sub(r"^(\s*)#\s?", r"\1", line) for line in text.splitlines()]  # comments read as keys too
    sections: dict[str, str] = {}
    current = None
    for line in lines:
        top = re.match(r"^([a-z_0-9]+):", line)
        if top:
            current = top.group(1)
            sections.setdefault(current, "")
        if current:
            sections[current] += line + "\n"
    missing = []
    for name, field in config_mod.Settings.model_fields.items():
        if field.exclude:
            continue
        if name not in sections:
            missing.append(name)
            continue
        for model in _models(field.annotation):
            for key in model.model_fields:
                if not re.search(rf"^[\s-]*(?:- )?{key}:|[{{,]\s*{key}:", sections[name], re.M):
                    missing.append(f"{name}.{key}")
    assert missing == [], f"config.yaml does not list: {', '.join(missing)}"


def test_discord_dms_with_guild_commands_are_refused_naming_both_keys_and_the_fix(tmp_path):
    """Commands registered in servers (guild_ids) never show in a direct message: allow_dms
    would be a promise the bot cannot keep."""
    with pytest.raises(ConfigError) as err:
        load_text(tmp_path, "source: {kind: files, path: x}\n"
                            "discord: {enabled: true, guild_ids: [333333333333333333], allow_dms: true}\n")
    message = str(err.value)
    assert "discord.allow_dms: true cannot work with discord.guild_ids" in message
    assert "Remove discord.guild_ids" in message and "or set discord.allow_dms: false" in message
    # either alone is fine, and so is a bot that is off
    for discord in ("{enabled: true, guild_ids: [333333333333333333]}", "{enabled: true, allow_dms: true}",
                    "{enabled: false, guild_ids: [333333333333333333], allow_dms: true}"):
        load_text(tmp_path, f"source: {{kind: files, path: x}}\ndiscord: {discord}\n")
