"""Print the alive nodes of a Ray cluster as JSON: `python -m tests.integration.cluster_probe
ADDRESS`. A separate process, so a test can look at a second cluster while its own runs."""

from __future__ import annotations

import json
import logging
import sys

import ray

if __name__ == "__main__":
    ray.init(address=sys.argv[1], logging_level=logging.ERROR, log_to_driver=False)
    nodes = [{"id": n["NodeID"], "resources": n["Resources"]} for n in ray.nodes() if n["Alive"]]
    sys.stdout.write(json.dumps(nodes) + "\n")
