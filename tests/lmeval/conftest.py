from __future__ import annotations

from pathlib import Path

import pytest
from lm_eval_fixtures import render


@pytest.fixture(scope="session")
def lm_eval_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return render(tmp_path_factory.mktemp("lm-eval") / "fixtures")
