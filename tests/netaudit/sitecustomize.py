"""Records every connection a Python process makes to an address beyond this machine.

The integration session puts this folder on PYTHONPATH before it starts Ray, so every process
of the local cluster (raylet-started workers, Serve replicas, the job manager, Ray Train's
workers) runs it at start-up. A `socket.connect` (or UDP `sendto`) to an address that is not
loopback, not one of this machine's own addresses and not its DNS resolver is appended to the
file named by RAYTRAIN_NET_AUDIT_LOG, tagged with who made it; the test then asserts that
there is none.

Ray's dashboard process would ask 169.254.169.254 which cloud it runs on, once at cluster
start, whatever the settings (ray/_common/usage/usage_lib.py, get_cluster_config_to_report);
a cluster raytrain starts holds that probe at home (raytrain/serve/adaptors/ray_probe.py). A
connection
from Ray's usage code is tagged `ray-usage-probe`.
"""

import ipaddress
import os
import sys
import traceback

_LOG = os.environ.get("RAYTRAIN_NET_AUDIT_LOG")
_ALLOWED = {a for a in os.environ.get("RAYTRAIN_NET_AUDIT_ALLOW", "").split(",") if a}


def _beyond_this_machine(host: object) -> bool:
    try:
        address = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return False  # a path (AF_UNIX) or a name: the resolver's answer is checked instead
    return not (address.is_loopback or address.is_unspecified or str(address) in _ALLOWED)


def _audit(event: str, args: tuple) -> None:
    if event not in ("socket.connect", "socket.sendto"):
        return
    address = args[1]
    if isinstance(address, tuple) and address and _beyond_this_machine(address[0]):
        stack = traceback.extract_stack()
        who = "ray-usage-probe" if any(
            frame.filename.endswith("ray/_common/usage/usage_lib.py") for frame in stack) \
            else "other"
        where = " < ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in stack[-8:-1])
        with open(_LOG, "a") as log:
            log.write(f"{who} {os.getpid()} {' '.join(sys.argv)[:100]!r} {event} {address} "
                      f"from {where}\n")


if _LOG:
    sys.addaudithook(_audit)
