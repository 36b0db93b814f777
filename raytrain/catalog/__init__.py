"""Everything raytrain knows about hardware and prices, as versioned data shipped in the
package, under one version (hardware.CATALOG_VERSION):

- hardware.py: GPU kinds, links and node shapes (public specifications; the `cpu` kind as
  measured by benchmarks/calibrate_cpu.py);
- offers.yaml: the instance offers with their on-demand and spot prices and interruption
  bands, refreshed from AWS by raytrain.cloud.aws;
- shapes.py: an offer's node shape, interruption rates from published bands, and
  `usd_for`, the one price of capacity over time;
- policies/ and spot-traces/: the named autoscaling policies and recorded spot histories;
- files.py: reading all of the above (and the refreshed offer cache) from any install.

`raytrain.spec` validates against hardware.py only; the file readers build spec values, so
this package's __init__ imports nothing and either side can import its modules.
"""
