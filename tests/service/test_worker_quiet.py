"""A worker's log holds the job's output, not the start-up notices of libraries it imports:
torchao's optional kernels that do not load here and torch's pytree deprecation notices
(seen in every rank's log once transformers and torchao are installed). Without
`quiet_libraries` the log below holds both."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys
from pathlib import Path
from raytrain.train.worker_logs import captured_output
with captured_output(Path(sys.argv[1]), rank=0, header="test"):
    import logging
    import torchao.float8  # noqa: F401
    logging.getLogger("torchao").error("a real torchao error")
    print("the job's own line")
"""


def test_library_notices_stay_out_of_a_ranks_log_and_their_errors_do_not(
        tmp_path: Path) -> None:
    pytest.importorskip("torchao")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "rank-0.log").read_text()
    assert "the job's own line" in log and "a real torchao error" in log
    assert "Failed to load" not in log and "Enum subclass" not in log, log
