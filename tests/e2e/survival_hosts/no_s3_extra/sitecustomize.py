"""A triggerer host installed without the ``s3`` extra (tests/e2e/test_triggerer_survives_e2e.py).

Loaded at interpreter start from PYTHONPATH: aiobotocore cannot be found in this process, as on
a host where ``pip install airflow-deferrable-kit`` ran without ``[s3]``.
"""

from __future__ import annotations

import sys
from typing import Any

HIDDEN = "aiobotocore"


class _Hide:
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == HIDDEN or name.startswith(HIDDEN + "."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, _Hide())
