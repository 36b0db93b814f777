"""Parallel training on one DeviceMesh: pipeline, tensor (+ sequence), FSDP2 / DDP, compression.

Everything here is PyTorch's own machinery (DeviceMesh, DTensor `parallelize_module`, FSDP2
`fully_shard`, `torch.distributed.pipelining`, DDP and its communication hooks); raytrain
supplies the plan for its GPT, the order of application, and the two things torch lacks: a
gradient-norm clip that spans pipeline ranks and a top-k compression hook with error feedback.
"""
