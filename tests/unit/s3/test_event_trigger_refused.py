"""A task never defers to an event trigger: it would run for ever instead of ending the wait."""

from __future__ import annotations

from typing import Any, NoReturn

import pytest
from airflow.sdk import Context

from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.testing import make_context
from airflow_deferrable_kit.triggers.s3_events import S3KeyEventTrigger


def test_a_sensor_class_with_an_event_trigger_class_is_refused_where_it_is_defined() -> None:
    with pytest.raises(TypeError, match=r"EventWaitSensor: trigger_class=S3KeyEventTrigger is an event trigger"):

        class EventWaitSensor(S3KeySensor):
            trigger_class = S3KeyEventTrigger


def test_deferring_to_an_event_trigger_is_refused_naming_the_wait_trigger_to_use() -> None:
    class HandRolled(S3KeySensor):
        """A platform team's sensor deferring by hand, as Airflow's own operators do."""

        def execute(self, context: Context) -> NoReturn:
            self.defer(
                trigger=S3KeyEventTrigger(bucket_key=self.bucket_key, aws_conn_id=self.aws_conn_id),
                method_name="execute_complete",
            )

    task: Any = HandRolled(task_id="by_hand", bucket_key="s3://adk-bucket/in/*.csv", wildcard_match=True)
    with pytest.raises(TypeError, match=r"trigger=S3KeyEventTrigger is an event trigger.*S3KeyTrigger rather than"):
        task.execute(make_context(task))
