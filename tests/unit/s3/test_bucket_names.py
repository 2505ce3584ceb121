"""Bucket names S3 refuses are refused when the DAG is parsed, naming the argument and the rule."""

from __future__ import annotations

import pytest

from airflow_deferrable_kit.sensors.s3 import S3KeySensor
from airflow_deferrable_kit.triggers.s3 import S3KeyTrigger

# (bucket name, the rule it breaks, as the message words it)
REFUSED = [
    ("bucket..name", "no two adjacent dots"),
    ("192.168.5.4", "not formatted as an IP address"),
    ("a" * 64, "3 to 63 characters"),
    ("ab", "3 to 63 characters"),
    ("Daily-Exports", "only lowercase letters, digits, dots and hyphens"),
    ("daily_exports", "only lowercase letters, digits, dots and hyphens"),
    ("-exports", "starting and ending with a letter or digit"),
    ("exports-", "starting and ending with a letter or digit"),
    (".exports", "starting and ending with a letter or digit"),
    ("exports.", "starting and ending with a letter or digit"),
    ("xn--exports", "not starting with xn--"),
    ("sthree-exports", "not starting with xn--, sthree-"),
    ("amzn-s3-demo-bucket", "amzn-s3-demo-"),
    ("exports.mrap", "not ending with .mrap"),
]

#: Names S3 answers object requests for: plain ones, and the aliases and directory buckets that
#: stand where a bucket name goes (refusing them would refuse a wait that works).
ACCEPTED = [
    "abc",
    "a" * 63,
    "daily-exports.eu-west-1",
    "10.0.0.exports",
    "my-access-point-hrzrlukc5m36ft7okagglf3gmwluquse1b-s3alias",
    "my-olap-sjfvjjxxsdl2q5w43sbhkbpn5bbnquse1a--ol-s3",
    "exports--usw2-az1--x-s3",
]


@pytest.mark.parametrize(("bucket", "rule"), REFUSED, ids=[name[:20] for name, _ in REFUSED])
def test_a_bucket_name_s3_refuses_is_refused_at_parse_naming_the_argument_and_the_rule(bucket: str, rule: str) -> None:
    for arguments, argument in (
        ({"bucket_name": bucket, "bucket_key": "orders/x.csv"}, "bucket_name"),
        ({"bucket_key": f"s3://{bucket}/orders/x.csv"}, "bucket_key"),
        ({"bucket_key": ["s3://exports/a.csv", f"s3://{bucket}/b.csv"]}, "bucket_key"),
    ):
        for build in (S3KeyTrigger, lambda **kw: S3KeySensor(task_id="wait", **kw)):
            with pytest.raises(ValueError) as caught:
                build(**arguments)
            message = str(caught.value)
            assert message.startswith(f"{argument} must name a valid S3 bucket ("), message
            assert rule in message, message
            assert message.count(repr(bucket)) == 1, message


@pytest.mark.parametrize("bucket", ACCEPTED, ids=[name[:20] for name in ACCEPTED])
def test_names_s3_answers_for_are_accepted(bucket: str) -> None:
    assert S3KeySensor(task_id="wait", bucket_name=bucket, bucket_key="k").build_trigger(None).bucket_name == bucket
    assert S3KeyTrigger(bucket_key=f"s3://{bucket}/k").bucket_key == f"s3://{bucket}/k"
