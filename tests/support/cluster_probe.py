"""Answer each line read on stdin with the alive nodes of a Ray cluster, as one JSON line:
`python -m tests.support.cluster_probe ADDRESS`. A separate process, so a test can look
at a second cluster while its own runs; a lasting one, so that each look costs a GCS query
rather than a Python start and a Ray connection (seconds of both cores each).
"""

from __future__ import annotations

import json
import logging
import sys

import ray

if __name__ == "__main__":
    ray.init(address=sys.argv[1], logging_level=logging.ERROR, log_to_driver=False)
    for _ in sys.stdin:
        nodes = [{"id": n["NodeID"], "resources": n["Resources"]}
                 for n in ray.nodes() if n["Alive"]]
        sys.stdout.write("NODES " + json.dumps(nodes) + "\n")
        sys.stdout.flush()
