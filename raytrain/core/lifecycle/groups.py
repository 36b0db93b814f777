"""What an elastic run's replica groups do to a job (raytrain.core.lifecycle.step dispatches
GroupChanged here): a group leaving on a notice, dying, healing or joining; the preemption it
records, the survivors' stall, the replacements bought at once (a Replace effect), and the
race of a group's own "leaving" against a survivor's "gone". The other events are
handlers.py's.
"""

from __future__ import annotations

from raytrain.core.lifecycle.events import GroupChanged
from raytrain.core.lifecycle.values import Change, Replace, sampled
from raytrain.spec import GroupStatus, JobStatus, PreemptionRecord


def group_changed(c: Change, event: GroupChanged) -> None:
    """A replica group of an elastic run left, died, healed or joined (GroupChanged)."""
    run, job = c.run, c.job
    if run is None or event.attempt != run.attempt or job.state.is_terminal or \
            not 0 <= event.group < len(job.groups):
        return
    old = job.groups[event.group]
    if event.state == "gone" and old.state == "gone" and event.stall_s is not None:
        _survivors_account(c, event)
        return
    if old.state == event.state and (not event.nodes or sorted(event.nodes) == old.nodes):
        return  # told again (every group reports what it sees): one record is enough
    if event.state == "leaving" and old.state == "gone":
        _noticed_late(c, event.group, frozenset(event.nodes or old.nodes))
        return
    job.groups[event.group] = GroupStatus(
        index=event.group, state=event.state,
        nodes=sorted(event.nodes or old.nodes), since=c.now)
    if event.nodes:
        c.set_run(group_nodes={**run.group_nodes, event.group: event.nodes})
    if event.stall_s is not None:
        job.costs.group_stall_s = sampled(job.costs.group_stall_s, event.stall_s, mean=True)
    if event.state == "leaving":
        c.set_run(noticed_nodes=run.noticed_nodes | frozenset(event.nodes or old.nodes))
    elif event.state == "gone" and old.state != "gone":
        survivors = sum(1 for g in job.groups if g.state == "training")
        record = PreemptionRecord(  # it left on a notice if it said it was leaving
            time=c.now, notice=event.notice or old.state == "leaving", group=event.group,
            survivors=survivors,
            reached_step=event.step, checkpoint_step=None, lost_steps=event.redone_steps,
            stall_s=event.stall_s, before=run.describe)
        job.preemptions += 1
        job.preemption_log.append(record)
        job.lost_steps += event.redone_steps
        c.emit("preemption", record.model_dump(mode="json"))
    # Every replacement bought at once: on a notice, and on a loss the survivors report
    # within seconds (the runner starts the lost group's fit again only once Ray has found
    # the old one dead). A replacement that heals holds its node through its worker group.
    c.effects.append(_replacements(job))
    if event.state == "training" and old.state in ("gone", "healing"):
        for i in range(len(job.preemption_log) - 1, -1, -1):
            record = job.preemption_log[i]
            if record.group == event.group and record.replaced_after_s is None:
                replaced = record.model_copy(update={"replaced_after_s": c.now - record.time})
                job.preemption_log[i] = replaced
                job.costs.replace_s = sampled(job.costs.replace_s, c.now - record.time,
                                               mean=True)
                break
    c.emit("group", job.groups[event.group].model_dump(mode="json"))
    c.save = True


def _replacements(job: JobStatus) -> Replace:
    """The job's node request for its groups leaving (their nodes still up) and lost."""
    def nodes(state: str) -> int:
        return sum(max(1, len(g.nodes)) for g in job.groups if g.state == state)
    return Replace(leaving=nodes("leaving"), lost=nodes("gone"))


def _survivors_account(c: Change, event: GroupChanged) -> None:
    """A survivor's report of a group the runner already recorded gone (its fit ended on its
    notice before the survivors' quorum missed it): the survivors' stall, once."""
    log, i = c.job.preemption_log, _latest(c.job.preemption_log, event.group)
    if i is not None and log[i].stall_s is None and event.stall_s is not None:
        log[i] = log[i].model_copy(update={"stall_s": event.stall_s})
        c.job.costs.group_stall_s = sampled(c.job.costs.group_stall_s, event.stall_s,
                                             mean=True)
        c.save = True


def _noticed_late(c: Change, group: int, nodes: frozenset[str]) -> None:
    """A group's "leaving" came after a survivor reported it gone (the two reports race from
    different processes): it left on its notice. Its preemption says so, and its
    replacement is bought as on any notice."""
    if c.run is not None:
        c.set_run(noticed_nodes=c.run.noticed_nodes | nodes)
    log, i = c.job.preemption_log, _latest(c.job.preemption_log, group)
    if i is not None and not log[i].notice:
        log[i] = log[i].model_copy(update={"notice": True})
        c.save = True
    replace = _replacements(c.job)  # its node is still up (its notice came): leaving
    c.effects.append(Replace(leaving=replace.leaving + 1, lost=max(0, replace.lost - 1)))


def _latest(log: list[PreemptionRecord], group: int) -> int | None:
    """Where in the log the group's latest preemption is, if it has one."""
    return next((i for i in range(len(log) - 1, -1, -1) if log[i].group == group), None)
