"""The tests of airflow-deferrable-kit, in tiers: unit/, integration/, e2e/, release/ (docs/development.md)."""

from pathlib import Path

#: The repository root (what `pip install -e .` installs, where docs/ and dags/ live).
REPO = Path(__file__).resolve().parent.parent
