"""The doors ``serve`` opens come from the config: ``doors:`` lists them (each listed one on, the
others off, whatever their sections say), else each chat door whose section says
``enabled: true``, as configs written before ``doors:`` say it."""

from __future__ import annotations

import pytest

from bot.serve import DOORS, services
from rag.errors import ConfigError

from conftest import make_settings


def test_doors_lists_the_chat_doors_serve_opens(tmp_path):
    settings = make_settings(tmp_path, doors=["discord"], telegram={"enabled": True})
    assert (settings.telegram.enabled, settings.discord.enabled, settings.open_doors) == (False, True, ["discord"])
    assert services(settings)[:-1] == [DOORS["discord"]]
    both = make_settings(tmp_path, doors=["discord", "telegram"])
    assert both.open_doors == ["discord", "telegram"] and services(both)[:-1] == [DOORS["discord"], DOORS["telegram"]]
    assert services(make_settings(tmp_path, doors=[]))[:-1] == []


def test_without_doors_the_enabled_sections_say_it(tmp_path):
    settings = make_settings(tmp_path, telegram={"enabled": True})
    assert settings.doors is None and settings.open_doors == ["telegram"]
    assert services(settings)[:-1] == [DOORS["telegram"]]
    assert make_settings(tmp_path).open_doors == []


@pytest.mark.parametrize("doors, says", [(["web"], "'web' is no door (the doors are telegram, discord)"),
                                         (["telegram", "telegram"], "listed twice")])
def test_a_door_that_is_none_is_refused(tmp_path, doors, says):
    with pytest.raises(ConfigError, match="doors") as err:
        make_settings(tmp_path, doors=doors)
    assert says in str(err.value)


def test_a_door_listed_is_checked_as_its_section_says(tmp_path):
    with pytest.raises(ConfigError, match="allow_dms"):
        make_settings(tmp_path, doors=["discord"], discord={"allow_dms": True, "guild_ids": [1]})
