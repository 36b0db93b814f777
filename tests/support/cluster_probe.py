"""Answer each line read on stdin with the alive nodes of a Ray cluster, as one JSON line:
`python -m tests.support.cluster_probe ADDRESS`. A separate process, so a test can look
at a second cluster while its own runs; a lasting one, so that each look costs a GCS query
rather than a Python start (seconds of both cores each).

It asks the GCS directly (`GcsClient`), not through `ray.init`: a driver would register a
job with the cluster and attach to one of its raylets, and a driver attached to a node the
test then takes, or one whose raylet is slow to hear of a lost node, answered nothing for
minutes. Each query has its own timeout, so a slow GCS gives an error line, not silence.
"""

from __future__ import annotations

import json
import sys

from ray._raylet import GcsClient

if __name__ == "__main__":
    client = GcsClient(address=sys.argv[1])
    for _ in sys.stdin:
        try:
            infos = client.get_all_node_info(timeout=20)
        except Exception as error:  # noqa: BLE001 - the asking side retries; say why
            sys.stdout.write("ERROR " + repr(error).replace("\n", " ") + "\n")
        else:
            nodes = [{"id": node_id.hex(), "resources": dict(info.resources_total)}
                     for node_id, info in infos.items() if info.state == 0]  # 0: ALIVE
            sys.stdout.write("NODES " + json.dumps(nodes) + "\n")
        sys.stdout.flush()
