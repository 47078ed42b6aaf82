"""Doors to chat platforms (Telegram, Discord) on the answer service."""
