"""The release tier: layout, packaging, provider info, docs, compose and benchmark hygiene; no service."""

from tests.support.tiers import refusing

globals().update(refusing("tests/release"))
