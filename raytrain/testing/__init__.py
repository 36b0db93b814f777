"""Fakes and local servers that the tests and the benchmarks share.

What a benchmark measures has to run on the same harness as the test that checks it (the
recording fake of Ray, the fake RunPod and its pods, moto's S3 on a port, a real `mlflow
server`, the fake cluster behind `ray up`), and the benchmarks import no tests, so the harness
lives here, in the package, as `transformers.testing_utils` and `torch.testing` do. Nothing in
the service imports it; its test-only dependencies (moto, asyncssh, mlflow) are imported by the
module that needs them and come with the `test` extra. Helpers only the tests use stay in
tests/support/.
"""
