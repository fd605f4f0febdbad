"""The example shop's own pytest-django suite passes, against the test redis-server."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

from tests.example.conftest import PROJECT_DIR, PYTHON, project_env
from tests.servers import RedisServer


def test_the_shops_own_test_suite_passes(redis_server: RedisServer, tmp_path: Path) -> None:
    env = project_env(
        REDIS_URL=redis_server.url.rsplit("/", 1)[0] + "/3",
        SHOP_DATA_DIR=str(tmp_path),
        SHOP_NAMESPACE=f"shop-test-{uuid.uuid4().hex[:8]}",
    )
    done = subprocess.run(
        [PYTHON, "-m", "pytest", "-q"],
        cwd=PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )

    assert done.returncode == 0, f"the shop's tests failed:\n{done.stdout}\n{done.stderr}"
    assert " passed" in done.stdout and " failed" not in done.stdout
