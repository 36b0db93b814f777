"""The hardware catalog: GPU kinds, links and node shapes, as versioned data.

Figures are public specifications (dense, i.e. without 2:4 sparsity) except the `cpu` entry,
which is this project's CI machine as measured by benchmarks/calibrate_cpu.py. Bandwidths are
per direction, per GPU, in bytes/s; `efficiency` is the fraction of a link's bandwidth that
NCCL-style ring collectives reach in practice (bus bandwidth over link bandwidth), and
`latency_s` the fixed cost of one collective on it (of each of its ring's steps on gloo,
whose steps do not overlap: `latency_per_step`).

Where a GPU's link is PCIe without peer-to-peer (RTX 4090: the driver does not allow P2P
between 4090s), GPU-to-GPU traffic is staged through host memory: half the PCIe bandwidth at
best and several times the latency. That is what makes tensor parallelism across 4090s slow,
and the planner sees it through the link, not through a special case.

    shape = NODE_SHAPES["h100-sxm-8"]
    shape.gpu.bf16_flops, shape.intra.bandwidth, shape.inter.bandwidth

The catalog is a value, read-only: GPUS, LINKS and NODE_SHAPES never change at runtime, and
`CATALOG` holds them for the planner. A machine's measured CPU profile (`raytrain calibrate`)
is a new Catalog, `CATALOG.with_cpu_profile(figures, ...)`, that the caller passes on.

Node shapes are the machines as sold: p4d and p4de have 400 Gbit/s of EFA per 8 A100s, p5
and p5e 3,200 Gbit/s per 8 H100s or H200s, a DGX one InfiniBand port per GPU (HDR 200 Gbit/s
on the A100, NDR 400 on the H100). The GPU clouds' shapes are their offers'
(raytrain/catalog/offers.yaml); a cluster of one's own is described in a shape file
(`raytrain plan --shape-file`, raytrain.spec.plans.ShapeSpec).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

CATALOG_VERSION = "2026-12-06"  # RunPod spot nodes join no cluster (spot_joins_cluster)

TB = 1e12
GB = 1e9
GiB = 2**30


@dataclass(frozen=True)
class GPUKind:
    name: str
    bf16_flops: float  # dense tensor-core FLOP/s
    fp32_flops: float  # non-tensor FP32 FLOP/s
    memory_bytes: float
    memory_bandwidth: float  # bytes/s
    # Fraction of dense peak a whole training step reaches: the CPU's compute rate (its
    # profile is measured end to end), and on GPUs only the rate assumed for a model whose
    # dimensions are unknown (raytrain.core.throughput); calibrated where a measurement
    # exists, see `calibration`.
    achievable: float = 0.40
    calibration: str = "default for GPUs without a calibration run: 0.40 of peak"
    # The best dense matmul rate a benchmark reaches, over peak (stas00/ml-engineering's
    # maximum achievable matmul FLOPS table); raytrain.core.kernels times each matmul from
    # it and its shape. None: the step's FLOPs run at `achievable` (the CPU, measured end to
    # end). 0.80 where no figure is published.
    gemm_efficiency: float | None = 0.80
    sms: int = 0  # streaming multiprocessors (a matmul's tiles run in waves of this many)
    # Dense FP8 tensor-core FLOP/s with fp32 accumulation (what float8 training's scaled
    # matmuls use); 0: no FP8 tensor cores, so no `precision: fp8`.
    fp8_flops: float = 0.0
    # GPUs run collectives on their own streams beside compute; a CPU rank with one thread
    # runs both on the same core, one after the other.
    overlaps_communication: bool = True
    # Fixed costs that do not shrink with the work: framework dispatch per transformer block
    # per microbatch (forward and backward), the extra of DTensor's tensor-parallel block, and
    # of one FSDP unit. At GPU training sizes kernels run asynchronously behind them and they
    # are taken as 0; on CPU they are measured (benchmarks/calibrate_cpu.py).
    block_overhead_s: float = 0.0
    tp_block_overhead_s: float = 0.0
    fsdp_unit_overhead_s: float = 0.0
    # Fixed cost per optimizer step (the optimizer's and clipping's dispatch, the loss's
    # all-reduce, the loop's checks), measured by `raytrain calibrate` as the service runs
    # jobs; 0 until then.
    step_overhead_s: float = 0.0
    # Memory a training process takes beyond its tensors: on a GPU the CUDA context, NCCL's
    # buffers and the caching allocator's slack; on CPU the code and buffers the process
    # pulls in once it trains (gloo, lazily loaded kernels, the allocator's cache), measured.
    runtime_reserve_bytes: float = 1.5 * GiB
    # Bytes per second a rank writes when it copies into freshly allocated buffers, as FSDP2
    # does around every collective (copy-in, copy-out, the gradients' chunk-cat). None: half
    # the memory bandwidth (a copy reads each byte and writes it). Measured on CPU, where
    # every fresh buffer of FSDP's size is new pages from the kernel.
    staging_bandwidth: float | None = None

    def flops(self, precision: str) -> float:
        return self.fp32_flops if precision == "fp32" else self.bf16_flops

    @property
    def copy_bandwidth(self) -> float:
        return self.staging_bandwidth or self.memory_bandwidth / 2


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth: float  # bytes/s per direction per GPU
    latency_s: float
    efficiency: float = 0.75
    # Cost of a reduce-scatter over an all-gather of the same size: 1 where the backend has
    # one (NCCL); gloo has none and torch falls back to an all-reduce.
    reduce_scatter_factor: float = 1.0
    # Whether each of a ring's n - 1 steps pays the latency: gloo's do (measured on CPU);
    # NCCL pipelines its rings and trees, so a collective pays about one.
    latency_per_step: bool = False


@dataclass(frozen=True)
class NodeShape:
    name: str
    gpu: GPUKind
    gpus_per_node: int
    intra: Link  # between GPUs of one node
    inter: Link  # between nodes, per GPU (the node's network shared by its GPUs)


MiB = 2**20
# Device memory is what the device reports (nvidia-smi's total, which CUDA's own total
# matches), not the marketed "80 GB" (80e9 bytes, 7% less than an H100 reports): 81,559 MiB
# on an H100, 81,920 and 40,960 on A100s, 46,068 on an L40S, 15,360 on a T4 (Modal's
# table, modal-labs/modal-client#2797), 24,564 on an RTX 4090, 143,771 on an H200. What the
# CUDA context, NCCL and the allocator keep of it is GPUKind.runtime_reserve_bytes.
GPUS: Mapping[str, GPUKind] = MappingProxyType({
    # FP8 with fp32 accumulation (NVIDIA's Ada whitepaper, H100 and L40S datasheets, dense):
    # the RTX 4090 runs it at its bf16 rate (165.2), the L40S at 733, H100 and H200 at 1,979.
    "rtx4090": GPUKind("rtx4090", 165 * TB, 82.6 * TB, 24_564 * MiB, 1.008 * TB, sms=128,
                       fp8_flops=165 * TB),
    "l40s": GPUKind("l40s", 362 * TB, 91.6 * TB, 46_068 * MiB, 0.864 * TB, sms=142,
                    fp8_flops=733 * TB),
    "a100-80gb-sxm": GPUKind("a100-80gb-sxm", 312 * TB, 19.5 * TB, 81_920 * MiB, 2.039 * TB,
                               gemm_efficiency=0.859, sms=108),
    "a100-40gb-sxm": GPUKind("a100-40gb-sxm", 312 * TB, 19.5 * TB, 40_960 * MiB, 1.555 * TB,
                               gemm_efficiency=0.859, sms=108),
    # `achievable` on GPUs: only for models whose dimensions are unknown (a whole step's
    # share of peak, H100's from torchtitan's Llama 3.1 8B run on 8 H100s, eager, bf16).
    "h100-sxm": GPUKind("h100-sxm", 989 * TB, 67 * TB, 81_559 * MiB, 3.35 * TB,
                        achievable=0.364,
                        calibration="torchtitan Llama 3.1 8B, 8x H100, FSDP, eager",
                        gemm_efficiency=0.801, sms=132, fp8_flops=1979 * TB),
    "h100-pcie": GPUKind("h100-pcie", 756 * TB, 51 * TB, 81_559 * MiB, 2.0 * TB,
                         achievable=0.364,
                         calibration="as h100-sxm", gemm_efficiency=0.801, sms=114,
                         fp8_flops=1513 * TB),
    "h200": GPUKind("h200", 989 * TB, 67 * TB, 143_771 * MiB, 4.8 * TB, achievable=0.364,
                    calibration="as h100-sxm", gemm_efficiency=0.801, sms=132,
                    fp8_flops=1979 * TB),
    # The GPUs of the spot fleets whose preemption traces the simulator replays (p3, g4dn).
    "v100-16gb": GPUKind("v100-16gb", 125 * TB, 15.7 * TB, 16 * GB, 0.9 * TB, sms=80),
    "t4": GPUKind("t4", 65 * TB, 8.1 * TB, 15_360 * MiB, 0.32 * TB, sms=40),
    # This machine: one thread per rank; FLOP/s and fixed costs of fp32 training steps of the
    # benchmark GPT and a tiny one (so `achievable` is 1), memory bandwidth (fused AdamW) and
    # the rate of copies into fresh buffers with every core busy, by benchmarks/calibrate_cpu.py
    # (the run recorded in BENCHMARKS.md).
    "cpu": GPUKind("cpu", 64.1e9, 64.1e9, 8 * GiB, 24.7 * GB, achievable=1.0,
                   gemm_efficiency=None,
                   calibration="benchmarks/calibrate_cpu.py on the CI machine, 2026-12-01",
                   overlaps_communication=False, block_overhead_s=1.52e-3,
                   tp_block_overhead_s=10.8e-3, fsdp_unit_overhead_s=0.69e-3,
                   runtime_reserve_bytes=22 * 2**20, staging_bandwidth=1.44 * GB),
})


def fp8_kinds(gpus: Mapping[str, GPUKind] = GPUS) -> list[str]:
    """The GPU kinds with FP8 tensor cores (precision 'fp8' trains on these), by name."""
    return sorted(name for name, gpu in gpus.items() if gpu.fp8_flops > 0)

LINKS: Mapping[str, Link] = MappingProxyType({
    "nvlink4": Link("nvlink4", 450 * GB, 10e-6),
    "nvlink3": Link("nvlink3", 300 * GB, 10e-6),
    "pcie5-p2p": Link("pcie5-p2p", 50 * GB, 15e-6),
    "pcie4-p2p": Link("pcie4-p2p", 25 * GB, 15e-6),
    # Through host memory: each transfer crosses PCIe twice.
    "pcie4-no-p2p": Link("pcie4-no-p2p", 10 * GB, 60e-6, efficiency=0.6),
    "efa-3200": Link("efa-3200", 3200e9 / 8 / 8, 30e-6),  # p5: 3,200 Gbit/s per 8 GPUs
    "efa-400": Link("efa-400", 400e9 / 8 / 8, 30e-6),  # p4d/p4de: 4 x 100 Gbit/s per 8 GPUs
    # DGX A100 and H100: one InfiniBand port per GPU (HDR 200 and NDR 400 Gbit/s).
    "ib-200-per-gpu": Link("ib-200-per-gpu", 200e9 / 8, 20e-6),
    "ib-400-per-gpu": Link("ib-400-per-gpu", 400e9 / 8, 20e-6),
    "rdma-400-per-gpu": Link("rdma-400-per-gpu", 400e9 / 8, 30e-6),
    "eth-100": Link("eth-100", 100e9 / 8 / 8, 50e-6, efficiency=0.6),  # 100 Gbit/s per 8 GPUs
    "eth-25": Link("eth-25", 25e9 / 8 / 8, 80e-6, efficiency=0.6),
    "eth-10-1gpu": Link("eth-10-1gpu", 10e9 / 8, 80e-6, efficiency=0.6),  # p3.2xlarge
    "eth-25-1gpu": Link("eth-25-1gpu", 25e9 / 8, 80e-6, efficiency=0.6),  # g4dn.xlarge
    # gloo between processes on this machine, measured by benchmarks/calibrate_cpu.py (the
    # run recorded in BENCHMARKS.md; ten runs ranged 0.72-1.02 GB/s, 0.33-1.24 ms, 1.5-2.3x).
    "gloo-local": Link("gloo-local", 0.96 * GB, 1.14e-3, efficiency=1.0,
                       reduce_scatter_factor=2.13, latency_per_step=True),
    # The same between twice as many processes as cores (4 ranks on 2 cores), measured the
    # same way: a rank waiting on gloo leaves its core to another, so it is neither the
    # 2-process figure nor half of it.
    "gloo-local-shared": Link("gloo-local-shared", 0.59 * GB, 1.27e-3, efficiency=1.0,
                              reduce_scatter_factor=1.79, latency_per_step=True),
})

NODE_SHAPES: Mapping[str, NodeShape] = MappingProxyType({
    "h100-sxm-8": NodeShape("h100-sxm-8", GPUS["h100-sxm"], 8, LINKS["nvlink4"],
                            LINKS["efa-3200"]),
    "h200-8": NodeShape("h200-8", GPUS["h200"], 8, LINKS["nvlink4"], LINKS["efa-3200"]),
    "h100-pcie-8": NodeShape("h100-pcie-8", GPUS["h100-pcie"], 8, LINKS["pcie5-p2p"],
                             LINKS["eth-100"]),
    "a100-80gb-sxm-8": NodeShape("a100-80gb-sxm-8", GPUS["a100-80gb-sxm"], 8, LINKS["nvlink3"],
                                 LINKS["efa-400"]),
    # Named machines (`raytrain plan --shape`): AWS's GPU instances and NVIDIA's DGX systems.
    "p4d": NodeShape("p4d", GPUS["a100-40gb-sxm"], 8, LINKS["nvlink3"], LINKS["efa-400"]),
    "p4de": NodeShape("p4de", GPUS["a100-80gb-sxm"], 8, LINKS["nvlink3"], LINKS["efa-400"]),
    "p5": NodeShape("p5", GPUS["h100-sxm"], 8, LINKS["nvlink4"], LINKS["efa-3200"]),
    "p5e": NodeShape("p5e", GPUS["h200"], 8, LINKS["nvlink4"], LINKS["efa-3200"]),
    "dgx-a100": NodeShape("dgx-a100", GPUS["a100-80gb-sxm"], 8, LINKS["nvlink3"],
                          LINKS["ib-200-per-gpu"]),
    "dgx-h100": NodeShape("dgx-h100", GPUS["h100-sxm"], 8, LINKS["nvlink4"],
                          LINKS["ib-400-per-gpu"]),
    "l40s-8": NodeShape("l40s-8", GPUS["l40s"], 8, LINKS["pcie4-p2p"], LINKS["eth-100"]),
    "rtx4090-8": NodeShape("rtx4090-8", GPUS["rtx4090"], 8, LINKS["pcie4-no-p2p"],
                           LINKS["eth-25"]),
    "v100-16gb-1": NodeShape("v100-16gb-1", GPUS["v100-16gb"], 1, LINKS["pcie4-p2p"],
                             LINKS["eth-10-1gpu"]),
    "t4-1": NodeShape("t4-1", GPUS["t4"], 1, LINKS["pcie4-p2p"], LINKS["eth-25-1gpu"]),
    "cpu-local": NodeShape("cpu-local", GPUS["cpu"], 64, LINKS["gloo-local"],
                           LINKS["gloo-local"]),
})

# The usual node shape of each GPU kind, for planning by GPU kind alone.
DEFAULT_SHAPE = {
    "h100-sxm": "h100-sxm-8",
    "h200": "h200-8",
    "h100-pcie": "h100-pcie-8",
    "a100-80gb-sxm": "a100-80gb-sxm-8",
    "a100-40gb-sxm": "p4d",
    "l40s": "l40s-8",
    "rtx4090": "rtx4090-8",
    "v100-16gb": "v100-16gb-1",
    "t4": "t4-1",
    "cpu": "cpu-local",
}


def network_link(gbps: float, gpus_per_node: int, rdma: bool) -> Link:
    """The between-node link of a node with a `gbps` network shared by its GPUs; RDMA
    (EFA, InfiniBand) has lower latency and reaches more of its bandwidth than TCP."""
    per_gpu = gbps * 1e9 / 8 / max(1, gpus_per_node)
    if rdma:
        return Link(f"rdma-{gbps:g}g", per_gpu, 30e-6, efficiency=0.75)
    return Link(f"eth-{gbps:g}g", per_gpu, 60e-6, efficiency=0.6)


def node_shape(gpu_kind: str) -> NodeShape:
    """The shipped catalog's default node shape for a GPU kind (Catalog.node_shape)."""
    return CATALOG.node_shape(gpu_kind)


def with_cpu_share(shape: NodeShape, cpus_per_device: float, shared: Link) -> NodeShape:
    """A CPU node shape whose ranks each get `cpus_per_device` cores (4 ranks on 2 cores:
    0.5 each), their compute scaled accordingly and gloo as measured between that many ranks
    (`shared`, two per core: a catalog's `gloo-local-shared`, Catalog.cpu_share; other shares
    scale from it). GPU shapes are returned unchanged."""
    if shape.gpu.name != "cpu" or cpus_per_device >= 1:
        return shape
    # Compute, the fixed costs and memory copies (CPU work too) stretch by the share.
    gpu = replace(shape.gpu, bf16_flops=shape.gpu.bf16_flops * cpus_per_device,
                  fp32_flops=shape.gpu.fp32_flops * cpus_per_device,
                  block_overhead_s=shape.gpu.block_overhead_s / cpus_per_device,
                  tp_block_overhead_s=shape.gpu.tp_block_overhead_s / cpus_per_device,
                  fsdp_unit_overhead_s=shape.gpu.fsdp_unit_overhead_s / cpus_per_device,
                  step_overhead_s=shape.gpu.step_overhead_s / cpus_per_device,
                  memory_bandwidth=shape.gpu.memory_bandwidth * cpus_per_device,
                  staging_bandwidth=shape.gpu.copy_bandwidth * cpus_per_device)
    factor = cpus_per_device * 2  # 1 at the measured two ranks per core
    link = replace(shared, bandwidth=shared.bandwidth * factor,
                   latency_s=shared.latency_s / factor)
    return replace(shape, gpu=gpu, intra=link, inter=link)


# What a measured CPU profile (`raytrain calibrate`) may set.
# What each cloud says before it takes a spot node back: (seconds of notice, the share of
# preemptions that come with one, the source). The share is what a job can count on to
# checkpoint before the node goes; the rest lose the work since the last checkpoint.
# - AWS: an interruption notice two minutes ahead, "emitted on a best effort basis" (EC2 User
#   Guide, Spot Instance interruption notices). AWS publishes no share; 0.9 is an assumption.
# - GCP: Spot and preemptible VMs get a 30 s preemption notice (Compute Engine docs), also
#   best effort; 0.9 assumed likewise.
# - RunPod: interruptible pods are stopped with no notice.
CLOUD_NOTICES: dict[str, tuple[float, float, str]] = {
    "aws": (120.0, 0.9, "AWS: 2 minutes, best effort (EC2 docs); share assumed"),
    "gcp": (30.0, 0.9, "GCP: 30 s, best effort (Compute Engine docs); share assumed"),
    "runpod": (0.0, 0.0, "RunPod: interruptible pods get no notice"),
}
NO_NOTICE = (0.0, 0.0, "no notice known for this provider")


CPU_PROFILE_FIELDS = ("fp32_flops", "block_overhead_s", "step_overhead_s")


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: one value per process
class Catalog:
    """The hardware the planner prices, by name: GPU kinds and node shapes. The module's
    CATALOG is the shipped one; a measured CPU profile makes another (with_cpu_profile)."""

    gpus: Mapping[str, GPUKind]
    shapes: Mapping[str, NodeShape]
    links: Mapping[str, Link] = field(default_factory=lambda: LINKS)

    def node_shape(self, gpu_kind: str) -> NodeShape:
        """The default node shape for a GPU kind; KeyError names the kinds there are."""
        if gpu_kind not in DEFAULT_SHAPE:
            raise KeyError(f"unknown GPU kind {gpu_kind!r}; known: {', '.join(DEFAULT_SHAPE)}")
        return self.shapes[DEFAULT_SHAPE[gpu_kind]]

    def cpu_share(self, shape: NodeShape, cpus_per_device: float) -> NodeShape:
        """with_cpu_share with this catalog's gloo between ranks that share cores."""
        return with_cpu_share(shape, cpus_per_device, self.links["gloo-local-shared"])

    def with_cpu_profile(self, figures: Mapping[str, float], calibration: str) -> Catalog:
        """This catalog with this machine's measured CPU figures (of CPU_PROFILE_FIELDS, as
        raytrain.spec.files.load_cpu_profile checks a stored profile) for its `cpu` kind."""
        cpu = self.gpus["cpu"]
        cpu = replace(cpu, **figures,  # type: ignore[arg-type]  # floats only
                      bf16_flops=figures.get("fp32_flops", cpu.fp32_flops),
                      calibration=calibration)
        return Catalog(MappingProxyType({**self.gpus, "cpu": cpu}),
                       MappingProxyType({**self.shapes, "cpu-local": replace(
                           self.shapes["cpu-local"], gpu=cpu)}), self.links)


CATALOG = Catalog(GPUS, NODE_SHAPES)
