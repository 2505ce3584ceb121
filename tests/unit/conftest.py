"""The unit tier: nothing running (no service, no Airflow process); fast, and run on the floor."""

from tests.support.tiers import refusing

globals().update(refusing("tests/unit"))
