"""A rank's pipeline schedules: the layout's own (`layout.microbatches` micro-batches a
step), and one for each other count a step feeds it. A replica group's share of a step
changes when another group leaves or joins (raytrain.core.elastic.share_of_step: the
survivors take a lost group's micro-batches as more accumulation), so a group holding a
whole pipeline runs 3 micro-batches a step, then 6, then 3 again. torch's schedules are
built for one count, and a stage sizes its buffers by its schedule's first step, so each
count gets stages and a schedule of its own, built the first time that count comes and kept:
the stages wrap the same modules, whose gradients they accumulate alike.

Written here because torch.distributed.pipelining builds a schedule for one micro-batch
count and leaves a count that varies to its caller.

    part = gpt_stage(model, stage, num_stages)     # the built-in GPT cut to one stage
    pipeline = Pipeline(runners, stage_ids, layout, device, pp_group, loss_fn)
    pipeline(4).step(tokens, target=..., losses=...)   # the schedule for 4 micro-batches
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from raytrain.models.gpt import GPT
from raytrain.spec.layout import Layout, stage_layers

# torch.distributed.pipelining imports torch._dynamo (0.7 s a process here): only a pipelined
# layout pays for it, not every data-parallel worker's start.
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
             "interleaved_1f1b": "ScheduleInterleaved1F1B"}


class Pipeline:
    def __init__(self, runners: list[nn.Module], stage_ids: list[int], layout: Layout,
                 device: torch.device, group: dist.ProcessGroup,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.runners, self.stage_ids, self.layout = runners, stage_ids, layout
        self.device, self.group, self.loss_fn = device, group, loss_fn
        self._built: dict[int, Any] = {}
        self(layout.microbatches)  # the layout's own, at once: a bad layout fails at build

    def __call__(self, microbatches: int) -> Any:
        """The schedule that runs `microbatches` micro-batches a step."""
        if microbatches not in self._built:
            from torch.distributed import pipelining

            stages = [pipelining.PipelineStage(runner, stage, self.layout.num_stages,
                                               self.device, group=self.group)
                      for runner, stage in zip(self.runners, self.stage_ids)]
            interleaved = self.layout.schedule == "interleaved_1f1b"
            schedule_cls = getattr(pipelining, SCHEDULES[self.layout.schedule])
            self._built[microbatches] = schedule_cls(
                stages if interleaved else stages[0], n_microbatches=microbatches,
                loss_fn=self.loss_fn)
        return self._built[microbatches]


def gpt_stage(model: GPT, stage: int, num_stages: int) -> GPT:
    """Cut `model` (usually on the meta device) down to stage `stage` of `num_stages`, in place.

    Layer names stay those of the whole model, so checkpoints line up across layouts."""
    keep = {str(i) for i in stage_layers(model.config.num_layers, num_stages)[stage]}
    for name in list(model.layers.keys()):
        if name not in keep:
            del model.layers[name]
    if stage > 0:
        model.tok_embeddings = None
        model.pos_embeddings = None
    if stage < num_stages - 1:
        model.norm = None
        model.output = None
    return model
