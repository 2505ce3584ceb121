"""The user docs build with MkDocs in strict mode, and the README links only to pages that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests import REPO

ROOT = REPO


def test_docs_build_strictly(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "sensors" / "datetime" / "index.html").exists()


def test_readme_links_point_at_existing_files() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(((?!https?://)[^)#]+)", readme)
    assert targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert missing == []
