"""Every test process (and the ranks, pods and Ray workers it starts, which inherit its
environment) keeps bucket data's disk cache in a folder of this session, never the user's
~/.cache: a test that counts the bytes a rank fetches starts from an empty cache."""

from __future__ import annotations

import os
import tempfile

os.environ["RAYTRAIN_DATA_CACHE"] = tempfile.mkdtemp(prefix="raytrain-data-cache-")
